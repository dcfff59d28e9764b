// Shared helpers of the model tests: a tiny random Mamba2ForCausalLM written to disk as a Hugging
// Face directory (config.json + model.safetensors), and an FP64 reference forward written from the
// Hugging Face modeling code's equations, independent of the runner (per-token recurrence, whole
// sequence conv with zero left padding, no cache).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/formats.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "replayssm/error.h"

namespace replayssm::testing {

struct TinySpec {
  int vocab = 48, hidden = 16, layers = 2, state = 16, heads = 4, head_dim = 8, groups = 2;
  int conv = 4;
  bool tie = false;
  int norm_groups = 1;
  int d_inner() const { return heads * head_dim; }
  int conv_dim() const { return d_inner() + 2 * groups * state; }
  int proj() const { return d_inner() + conv_dim() + heads; }
};

struct TinyModel {
  TinySpec spec;
  std::map<std::string, std::vector<float>> values;  // every tensor, bf16-representable
  std::map<std::string, std::vector<int64_t>> shapes;
  const std::vector<float>& at(const std::string& name) const { return values.at(name); }
};

inline TinyModel make_tiny_model(const TinySpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  TinyModel m;
  m.spec = spec;
  // Values are rounded to bf16 so that fp32 and bf16 files hold the same numbers.
  auto add = [&](const std::string& name, std::vector<int64_t> shape, auto gen) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& e : v) e = bf16_to_f32(f32_to_bf16(float(gen())));
    m.values[name] = v;
    m.shapes[name] = shape;
  };
  const double win = 1.0 / std::sqrt(double(spec.hidden));
  const double wout = 1.0 / std::sqrt(double(spec.d_inner()));
  add("backbone.embeddings.weight", {spec.vocab, spec.hidden}, [&] { return normal(rng); });
  add("backbone.norm_f.weight", {spec.hidden}, [&] { return 0.8 + 0.4 * u01(rng); });
  if (!spec.tie)
    add("lm_head.weight", {spec.vocab, spec.hidden}, [&] { return normal(rng) * win * 3; });
  for (int l = 0; l < spec.layers; ++l) {
    const std::string p = "backbone.layers." + std::to_string(l) + ".";
    add(p + "norm.weight", {spec.hidden}, [&] { return 0.8 + 0.4 * u01(rng); });
    add(p + "mixer.in_proj.weight", {spec.proj(), spec.hidden}, [&] { return normal(rng) * win; });
    add(p + "mixer.conv1d.weight", {spec.conv_dim(), 1, spec.conv},
        [&] { return normal(rng) * 0.5; });
    add(p + "mixer.conv1d.bias", {spec.conv_dim()}, [&] { return normal(rng) * 0.1; });
    add(p + "mixer.A_log", {spec.heads}, [&] { return std::log(1.0 + 7.0 * u01(rng)); });
    add(p + "mixer.dt_bias", {spec.heads}, [&] {
      const double dt = std::exp(std::log(1e-2) + (std::log(0.3) - std::log(1e-2)) * u01(rng));
      return std::log(std::expm1(dt));
    });
    add(p + "mixer.D", {spec.heads}, [&] { return 0.5 + u01(rng); });
    add(p + "mixer.norm.weight", {spec.d_inner()}, [&] { return 0.8 + 0.4 * u01(rng); });
    add(p + "mixer.out_proj.weight", {spec.hidden, spec.d_inner()},
        [&] { return normal(rng) * wout; });
  }
  return m;
}

inline std::string tiny_config_json(const TinySpec& s) {
  // Bare Infinity, as Python's json.dump writes float('inf').
  std::string j =
      "{\n  \"architectures\": [\"Mamba2ForCausalLM\"],\n  \"model_type\": \"mamba2\",\n";
  j += "  \"vocab_size\": " + std::to_string(s.vocab) + ",\n";
  j += "  \"hidden_size\": " + std::to_string(s.hidden) + ",\n";
  j += "  \"num_hidden_layers\": " + std::to_string(s.layers) + ",\n";
  j += "  \"state_size\": " + std::to_string(s.state) + ",\n";
  j += "  \"num_heads\": " + std::to_string(s.heads) + ",\n";
  j += "  \"head_dim\": " + std::to_string(s.head_dim) + ",\n";
  j += "  \"n_groups\": " + std::to_string(s.groups) + ",\n";
  j += "  \"conv_kernel\": " + std::to_string(s.conv) + ",\n";
  j += "  \"expand\": 2,\n  \"layer_norm_epsilon\": 1e-05,\n  \"use_bias\": false,\n";
  j += "  \"use_conv_bias\": true,\n  \"time_step_limit\": [0.0, Infinity],\n";
  if (s.norm_groups != 1)
    j += "  \"replayssm_norm_groups\": " + std::to_string(s.norm_groups) + ",\n";
  j += std::string("  \"tie_word_embeddings\": ") + (s.tie ? "true" : "false") + "\n}\n";
  return j;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline io::StTensor to_tensor(const std::vector<float>& v, const std::vector<int64_t>& shape,
                              bool bf16) {
  if (!bf16) return io::make_f32(shape, v);
  io::StTensor t;
  t.dtype = io::StDType::BF16;
  t.shape = shape;
  t.data.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = f32_to_bf16(v[i]);
    t.data[2 * i] = uint8_t(b & 0xff);
    t.data[2 * i + 1] = uint8_t(b >> 8);
  }
  return t;
}

// Writes config.json and model.safetensors under dir (created).
inline void write_tiny_model(const TinyModel& m, const std::string& dir, bool bf16) {
  std::filesystem::create_directories(dir);
  write_text(dir + "/config.json", tiny_config_json(m.spec));
  io::StFile file;
  file.metadata["format"] = "pt";
  for (const auto& [name, v] : m.values) file.tensors[name] = to_tensor(v, m.shapes.at(name), bf16);
  io::write_safetensors(dir + "/model.safetensors", file);
}

// FP64 reference: logits [T, V] for every position of `tokens`, from an empty state.
inline std::vector<double> reference_logits(const TinyModel& m,
                                            const std::vector<int32_t>& tokens) {
  const TinySpec& s = m.spec;
  const int64_t T = int64_t(tokens.size()), d = s.hidden, H = s.heads, P = s.head_dim, N = s.state,
                G = s.groups, K = s.conv, DI = s.d_inner(), CD = s.conv_dim(), R = s.proj(),
                V = s.vocab;
  const double eps = 1e-5;
  auto rms = [&](const double* x, const float* w, int64_t n, double* out) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double scale = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = double(w[i]) * x[i] * scale;
  };
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  const auto& emb = m.at("backbone.embeddings.weight");
  std::vector<double> resid(size_t(T * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) resid[size_t(t * d + i)] = emb[size_t(tokens[t] * d + i)];
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "backbone.layers." + std::to_string(l) + ".";
    const auto& norm = m.at(p + "norm.weight");
    const auto& win = m.at(p + "mixer.in_proj.weight");
    const auto& cw = m.at(p + "mixer.conv1d.weight");
    const auto& cb = m.at(p + "mixer.conv1d.bias");
    const auto& A_log = m.at(p + "mixer.A_log");
    const auto& dt_bias = m.at(p + "mixer.dt_bias");
    const auto& Dp = m.at(p + "mixer.D");
    const auto& gn = m.at(p + "mixer.norm.weight");
    const auto& wout = m.at(p + "mixer.out_proj.weight");
    std::vector<double> proj(size_t(T * R)), h(static_cast<size_t>(d));
    for (int64_t t = 0; t < T; ++t) {
      rms(&resid[size_t(t * d)], norm.data(), d, h.data());
      for (int64_t r = 0; r < R; ++r) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i) acc += double(win[size_t(r * d + i)]) * h[size_t(i)];
        proj[size_t(t * R + r)] = acc;
      }
    }
    // conv over xBC with K-1 zeros of left padding
    std::vector<double> xbc(size_t(T * CD));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < CD; ++c) {
        double acc = cb[size_t(c)];
        for (int64_t i = 0; i < K; ++i) {
          const int64_t src = t - (K - 1) + i;
          if (src >= 0) acc += double(cw[size_t(c * K + i)]) * proj[size_t(src * R + DI + c)];
        }
        xbc[size_t(t * CD + c)] = silu(acc);
      }
    std::vector<double> S(size_t(H * P * N), 0.0), y(size_t(T * DI));
    for (int64_t t = 0; t < T; ++t) {
      const double* x = &xbc[size_t(t * CD)];
      const double* B = x + DI;
      const double* C = B + G * N;
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t g = hh / (H / G);
        const double u = proj[size_t(t * R + DI + CD + hh)] + dt_bias[size_t(hh)];
        const double delta = u > 20 ? u : std::log1p(std::exp(u));
        const double a = std::exp(-std::exp(double(A_log[size_t(hh)])) * delta);
        for (int64_t pp = 0; pp < P; ++pp) {
          double out = 0;
          for (int64_t n = 0; n < N; ++n) {
            double& st = S[size_t((hh * P + pp) * N + n)];
            st = a * st + delta * x[hh * P + pp] * B[g * N + n];
            out += st * C[g * N + n];
          }
          y[size_t(t * DI + hh * P + pp)] = out + double(Dp[size_t(hh)]) * x[hh * P + pp];
        }
      }
    }
    std::vector<double> gbuf(static_cast<size_t>(DI)), gnorm(static_cast<size_t>(DI));
    const int64_t group = DI / s.norm_groups;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < DI; ++i)
        gbuf[size_t(i)] = y[size_t(t * DI + i)] * silu(proj[size_t(t * R + i)]);
      for (int64_t g0 = 0; g0 < DI; g0 += group)
        rms(&gbuf[size_t(g0)], gn.data() + g0, group, &gnorm[size_t(g0)]);
      for (int64_t o = 0; o < d; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < DI; ++i) acc += double(wout[size_t(o * DI + i)]) * gnorm[size_t(i)];
        resid[size_t(t * d + o)] += acc;
      }
    }
  }
  const auto& head = s.tie ? emb : m.at("lm_head.weight");
  const auto& nf = m.at("backbone.norm_f.weight");
  std::vector<double> logits(size_t(T * V)), h(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    rms(&resid[size_t(t * d)], nf.data(), d, h.data());
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t i = 0; i < d; ++i) acc += double(head[size_t(v * d + i)]) * h[size_t(i)];
      logits[size_t(t * V + v)] = acc;
    }
  }
  return logits;
}

// The tiny model written to a temporary folder and loaded back through the real loader; `tag`
// keeps the folders of concurrently running tests apart.
inline std::shared_ptr<const model::ModelWeights> load_tiny_weights(uint64_t seed,
                                                                    const std::string& tag) {
  const TinyModel m = make_tiny_model(TinySpec{}, seed);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("replayssm_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
  write_tiny_model(m, dir.string(), false);
  auto w = std::make_shared<const model::ModelWeights>(model::load_model(dir.string()));
  std::filesystem::remove_all(dir);
  return w;
}

// The worst |got - want| / max(1, |want|) over n elements: relative for values above 1,
// absolute below (logits near 0 carry no relative meaning).
inline double max_rel_diff(const float* got, const float* want, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) /
                                std::max(1.0, std::fabs(double(want[i]))));
  return worst;
}

// Runs f, expects replayssm::Error, returns its message (a test failure when nothing is thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> random_token_ids(int n, int vocab, std::mt19937_64& rng) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = int32_t(rng() % uint64_t(vocab));
  return t;
}

#ifdef REPLAYSSM_SOURCE_DIR
// The committed built-in model, loaded once per test process.
inline std::shared_ptr<const model::ModelWeights> builtin_weights() {
  static auto w = std::make_shared<const model::ModelWeights>(
      model::load_model(std::string(REPLAYSSM_SOURCE_DIR) + "/models/mamba2-byte-2.7m"));
  return w;
}
#endif

}  // namespace replayssm::testing
