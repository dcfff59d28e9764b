#include "replayssm/presets.h"

#include <cmath>
#include <random>

#include "replayssm/error.h"

namespace replayssm {
namespace {

// heads = expand * d_model / headdim; layer counts are the Mamba layers only.
constexpr ModelPreset kPresets[] = {
    {"tiny", {4, 16, 32, 1}, 2, "smoke test"},
    {"small", {16, 64, 128, 1}, 6, "default: a slice of a Mamba-2 layer stack"},
    {"mamba2-130m", {24, 64, 128, 1}, 24, "Mamba-2 130M"},
    {"mamba2-370m", {32, 64, 128, 1}, 48, "Mamba-2 370M"},
    {"mamba2-2.7b", {80, 64, 128, 1}, 64, "Mamba-2 2.7B"},
    {"codestral-mamba-7b", {128, 64, 128, 8}, 64, "Codestral Mamba 7B"},
    {"nemotron-h-8b", {128, 64, 128, 8}, 24, "Mamba layers of Nemotron-H 8B"},
    {"nemotron3-nano-4b", {96, 80, 128, 8}, 21, "Mamba layers of Nemotron-3 Nano 4B"},
    {"nemotron3-super-120b", {128, 64, 128, 8}, 40, "Mamba layers of Nemotron-3 Super 120B"},
    {"nemotron-h-56b", {256, 64, 256, 8}, 54, "Mamba layers of Nemotron-H 56B"},
    {"granite-4.0-h-small", {128, 64, 128, 1}, 36, "Mamba layers of Granite 4.0 H-Small"},
    {"falcon-h1-7b", {24, 128, 256, 1}, 44, "Mamba layers of Falcon-H1 7B"},
};

}  // namespace

std::span<const ModelPreset> model_presets() { return kPresets; }

std::string preset_names() {
  std::string out;
  for (const ModelPreset& p : kPresets) out += std::string(out.empty() ? "" : ", ") + p.name;
  return out;
}

const ModelPreset& find_preset(std::string_view name) {
  for (const ModelPreset& p : kPresets)
    if (name == p.name) return p;
  fail("unknown model preset '", name, "' (expected one of: ", preset_names(), ")");
}

LayerParams synthetic_layer_params(const SsmShape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  LayerParams p;
  for (int h = 0; h < shape.nheads; ++h) {
    p.A_log.push_back(float(std::log(1.0 + 15.0 * u(rng))));
    const double delta = std::exp(std::log(1e-3) + std::log(100.0) * u(rng));
    p.dt_bias.push_back(float(std::log(std::expm1(delta))));
    p.D.push_back(1.0f);
  }
  return p;
}

}  // namespace replayssm
