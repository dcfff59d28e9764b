// Layer shapes of public hybrid and Mamba-2 models (their Mamba layers), for the demo, the
// benchmarks and the capacity planner.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "replayssm/types.h"

namespace replayssm {

struct ModelPreset {
  const char* name;
  SsmShape shape;  // heads, headdim, dstate, groups of one Mamba layer
  int layers;      // number of Mamba layers
  const char* about;
};

std::span<const ModelPreset> model_presets();
const ModelPreset& find_preset(std::string_view name);  // throws Error listing the names
std::string preset_names();                             // "tiny, small, ..."

// Mamba-2-like layer parameters for benchmarks: A_log = log U[1, 16], dt_bias = softplus^-1 of a
// log-uniform delta in [1e-3, 1e-1], D = 1. Deterministic in `seed`.
LayerParams synthetic_layer_params(const SsmShape& shape, uint64_t seed);

}  // namespace replayssm
