#include "model/synthetic.h"

#include <chrono>
#include <cmath>
#include <random>

#include "core/acceptance.h"
#include "core/formats.h"
#include "core/splitmix.h"
#include "replayssm/error.h"

namespace replayssm::model {

namespace {

// Uniform in [-1, 1) for element i of tensor `tensor`.
inline float unit(uint64_t seed, uint64_t tensor, uint64_t i) {
  return float(
      double(splitmix64(seed ^ splitmix64(tensor * 0x100000001B3ull + i)) >> 11) * 0x1.0p-52 - 1.0);
}

// Uniform with the given standard deviation (half-width std * sqrt(3)).
Matrix random_matrix(int64_t rows, int64_t cols, float std, uint64_t seed, uint64_t tensor) {
  Matrix m;
  m.type = Matrix::Type::bf16;
  m.rows = rows;
  m.cols = cols;
  m.bytes.resize(size_t(rows * cols) * 2);
  uint16_t* out = reinterpret_cast<uint16_t*>(m.bytes.data());
  const float a = std * std::sqrt(3.0f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * cols; ++i)
    out[i] = f32_to_bf16(a * unit(seed, tensor, uint64_t(i)));
  return m;
}

std::vector<float> random_vector(int64_t n, float lo, float hi, uint64_t seed, uint64_t tensor) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = lo + (hi - lo) * 0.5f * (1.0f + unit(seed, tensor, uint64_t(i)));
  return v;
}

}  // namespace

ModelConfig config_for_preset(const ModelPreset& preset, int vocab_size) {
  ModelConfig c;
  c.vocab_size = vocab_size;
  c.num_heads = preset.shape.nheads;
  c.head_dim = preset.shape.headdim;
  c.state_size = preset.shape.dstate;
  c.n_groups = preset.shape.ngroups;
  c.num_layers = preset.layers;
  c.hidden_size = c.num_heads * c.head_dim / 2;
  c.expand = 2.0f;
  c.conv_kernel = 4;
  c.validate();
  return c;
}

ModelWeights random_weights(const ModelConfig& c, uint64_t seed) {
  c.validate();
  ModelWeights w;
  w.config = c;
  const int64_t d = c.hidden_size, di = c.d_inner(), cd = c.conv_dim(), H = c.num_heads,
                K = c.conv_kernel;
  uint64_t tensor = 0;
  w.embeddings = random_matrix(c.vocab_size, d, 1.0f, seed, ++tensor);
  w.lm_head = random_matrix(c.vocab_size, d, 1.0f / std::sqrt(float(d)), seed, ++tensor);
  w.norm_f.assign(size_t(d), 1.0f);
  w.layers.resize(size_t(c.num_layers));
  for (LayerWeights& l : w.layers) {
    l.norm.assign(size_t(d), 1.0f);
    l.in_proj = random_matrix(c.in_proj_size(), d, 1.0f / std::sqrt(float(d)), seed, ++tensor);
    l.conv_w = random_vector(cd * K, -0.5f, 0.5f, seed, ++tensor);
    l.conv_b.assign(size_t(cd), 0.0f);
    l.A_log = random_vector(H, 0.0f, std::log(16.0f), seed, ++tensor);
    std::vector<float> u = random_vector(H, std::log(1e-3f), std::log(1e-1f), seed, ++tensor);
    for (float& x : u) x = std::log(std::expm1(std::exp(x)));  // softplus^-1 of dt
    l.dt_bias = u;
    l.D.assign(size_t(H), 1.0f);
    l.gated_norm.assign(size_t(di), 1.0f);
    l.out_proj =
        random_matrix(d, di, 1.0f / std::sqrt(float(di * 2 * c.num_layers)), seed, ++tensor);
  }
  return w;
}

SyntheticResult run_synthetic(Mamba2Model& model, const SyntheticOptions& o) {
  check(o.prompt_tokens >= 1 && o.new_tokens >= 1, "synthetic run: prompt and new tokens must ",
        "be >= 1");
  check(o.window >= 1 && o.window <= model.runner_config().max_window, "synthetic run: window ",
        o.window, " is outside 1..", model.runner_config().max_window);
  SyntheticResult r;
  r.accept_probability = o.window > 1 ? acceptance_for_mean(o.mean_accepted_length, o.window) : 0;
  std::mt19937_64 rng(o.seed);
  const int V = model.vocab_size();
  auto token = [&] { return int32_t(rng() % uint64_t(V)); };
  auto uniform = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
  for (auto& t : prompt) t = token();

  using clock = std::chrono::steady_clock;
  const int slot = model.open(o.seed);
  std::vector<float> logits;
  const auto t0 = clock::now();
  model.prefill(slot, prompt, logits);
  const auto t1 = clock::now();
  const uint64_t flushes0 = model.flushes_per_layer();
  std::vector<int32_t> window;
  while (r.generated < o.new_tokens) {
    const int W = std::min(o.window, o.new_tokens - r.generated);
    window.resize(size_t(W));
    for (auto& t : window) t = token();
    model.verify(slot, window, logits);
    int k = 1;
    while (k < W && uniform() < r.accept_probability) ++k;
    model.commit(slot, k);
    r.generated += k;
    ++r.steps;
  }
  const auto t2 = clock::now();
  model.release(slot);
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  r.flushes = model.flushes_per_layer() - flushes0;
  return r;
}

}  // namespace replayssm::model
