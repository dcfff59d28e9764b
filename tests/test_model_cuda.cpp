// The model runner's GPU path (docs/model.md "GPU path"): every CUDA op against its CPU op on
// random inputs, full-model logits against the CPU runner, speculative greedy == greedy on the
// GPU. Every suite is named ModelCuda* (label gpu) and skips without a CUDA device.
//
// Tolerances (also in docs/model.md):
// * RMSNorm, gated RMSNorm, conv1d + SiLU: the kernels repeat the CPU's roundings (double sum of
//   squares, no FMA contraction); what differs is CUDA's expf (<= 2 ulp) in SiLU and, rarely, the
//   last bit of the normalisation scale (the double sums run in another order). Bound: 4e-6
//   relative (max_rel_diff: relative above 1, absolute below), a few ulp.
// * Conv history and pending windows, embedding gather, split into x/B/C/dt, residual add: exact
//   (copies, one rounding each: bit-identical).
// * GEMM: fp32 products and sums in another order (cuBLAS tiles / split-K vs the CPU's 16 lanes).
//   Each result's error is at most gamma_K * sum_k |x_k w_k| (gamma_K ~ K u, u = 2^-24) for either
//   order, so two results differ by at most 2 K u sum_k |x_k w_k|: that bound, per element.
// * Full model, fp32 mode: the GEMM differences (~1e-6 relative) through the layers; logits of
//   magnitude ~20 agree to 1e-3 absolute (5e-5 relative), as the CPU-vs-CUDA-SSM test already
//   uses. separate-fp8: a last-bit difference of an fp32 input can move a stochastically rounded
//   or fp8-rounded checkpoint element by one code step (2^-3 relative for e4m3); 5e-2 absolute
//   on the logits, as the existing ModelCuda.LogitsMatchCpu.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/mamba2.h"
#include "model/model_ops.h"
#include "model_test_util.h"
#include "replayssm/cache.h"

namespace replayssm::model {
namespace {

using testing::builtin_weights;
using testing::load_tiny_weights;
using testing::max_rel_diff;

#define SKIP_WITHOUT_GPU() \
  if (!backend_available(BackendKind::cuda)) GTEST_SKIP() << "no CUDA backend or device"

std::vector<float> random_floats(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<float> v(n);
  for (auto& e : v) e = float(normal(rng));
  return v;
}

// A CPU and a CUDA ops for the same weights, and helpers to run an op on both.
struct OpsPair {
  std::shared_ptr<const ModelWeights> w;
  RunnerConfig rc;
  std::unique_ptr<ModelOps> cpu, gpu;
  std::vector<std::unique_ptr<OpsBuffer>> keep;  // device arrays alive until the test ends

  OpsPair(std::shared_ptr<const ModelWeights> weights, int slots = 1, int max_window = 8)
      : w(std::move(weights)) {
    rc.num_slots = slots;
    rc.max_window = max_window;
    cpu = make_cpu_model_ops(*w, rc);
    rc.backend = BackendKind::cuda;
    gpu = make_model_ops(*w, rc);
  }
  // A device copy of host floats [n].
  float* dev(const std::vector<float>& host) {
    keep.push_back(std::make_unique<OpsBuffer>(gpu.get()));
    float* p = keep.back()->of(int64_t(host.size()));
    gpu->from_host(host.data(), host.size() * sizeof(float), p);
    return p;
  }
  void* dev_bytes(size_t bytes) {
    keep.push_back(std::make_unique<OpsBuffer>(gpu.get()));
    return keep.back()->reserve(bytes);
  }
  template <typename T = float>
  std::vector<T> host(const void* p, size_t n) {
    std::vector<T> out(n);
    gpu->to_host(p, n * sizeof(T), out.data());
    return out;
  }
};

TEST(ModelCudaOps, RmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (auto weights : {load_tiny_weights(3, "cuda_norm"), builtin_weights()}) {
    OpsPair ops(weights);
    const int64_t d = weights->config.hidden_size, R = 13, stride = d + 5;
    const float eps = weights->config.layer_norm_epsilon;
    const std::vector<float> x = random_floats(size_t(R * stride), 11, 3.0);
    std::vector<float> want(size_t(R * d));
    ops.cpu->rms_norm(x.data(), stride, R, d, weights->norm_f, eps, want.data());
    float* out = ops.dev(std::vector<float>(size_t(R * d)));
    ops.gpu->rms_norm(ops.dev(x), stride, R, d, weights->norm_f, eps, out);
    const std::vector<float> got = ops.host(out, size_t(R * d));
    EXPECT_LT(max_rel_diff(got.data(), want.data(), got.size()), 4e-6);
  }
}

TEST(ModelCudaOps, GatedRmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto weights = load_tiny_weights(4, "cuda_gated");
  OpsPair ops(weights);
  const LayerWeights& lw = weights->layers[0];
  const int64_t di = weights->config.d_inner(), R = 9, zs = di + 7;
  const std::vector<float> y = random_floats(size_t(R * di), 21, 2.0);
  const std::vector<float> z = random_floats(size_t(R * zs), 22, 2.0);
  for (int groups : {1, 4}) {
    std::vector<float> want(size_t(R * di));
    ops.cpu->gated_rms_norm(y.data(), z.data(), zs, R, di, groups, lw.gated_norm, 1e-5f,
                            want.data());
    float* out = ops.dev(std::vector<float>(size_t(R * di)));
    ops.gpu->gated_rms_norm(ops.dev(y), ops.dev(z), zs, R, di, groups, lw.gated_norm, 1e-5f, out);
    const std::vector<float> got = ops.host(out, size_t(R * di));
    EXPECT_LT(max_rel_diff(got.data(), want.data(), got.size()), 4e-6) << groups << " groups";
  }
}

// Y = X W^T for every matrix kind of the tiny (fp32) and built-in models, 1..70 rows.
TEST(ModelCudaOps, GemmMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (auto weights : {load_tiny_weights(5, "cuda_gemm"), builtin_weights()}) {
    OpsPair ops(weights);
    const LayerWeights& lw = weights->layers.back();
    for (const Matrix* W : {&lw.in_proj, &lw.out_proj, &weights->head()}) {
      for (int64_t M : {1, 3, 8, 13, 70}) {  // the skinny kernel of each M class, and cuBLAS
        const int64_t N = W->rows, K = W->cols;
        const std::vector<float> X = random_floats(size_t(M * K), uint64_t(M * 7 + K), 1.5);
        std::vector<float> want(size_t(M * N));
        ops.cpu->matmul(X.data(), M, *W, {}, want.data());
        float* Y = ops.dev(std::vector<float>(size_t(M * N)));
        ops.gpu->matmul(ops.dev(X), M, *W, {}, Y);
        const std::vector<float> got = ops.host(Y, size_t(M * N));
        std::vector<float> wrow(static_cast<size_t>(K));
        double worst = 0;  // the largest |difference| / bound
        for (int64_t n = 0; n < N; ++n) {
          W->row_f32(n, wrow.data());
          for (int64_t m = 0; m < M; ++m) {
            double abs_sum = 0;
            for (int64_t k = 0; k < K; ++k)
              abs_sum += std::fabs(double(X[size_t(m * K + k)]) * wrow[size_t(k)]);
            const double bound = 2.0 * double(K) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
            const size_t i = size_t(m * N + n);
            worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / bound);
          }
        }
        EXPECT_LE(worst, 1.0) << "matrix " << N << "x" << K << " M " << M;
      }
    }
  }
}

TEST(ModelCudaOps, EmbedSplitAddExact) {
  SKIP_WITHOUT_GPU();
  auto weights = builtin_weights();
  OpsPair ops(weights);
  const ModelConfig& c = weights->config;
  const std::vector<int32_t> tokens = {0, 255, 17, 17, 100};
  const int64_t R = int64_t(tokens.size()), d = c.hidden_size;
  std::vector<float> want(size_t(R * d));
  ops.cpu->embed(tokens.data(), R, weights->embeddings, want.data());
  float* emb = ops.dev(std::vector<float>(size_t(R * d)));
  ops.gpu->embed(tokens.data(), R, weights->embeddings, emb);
  EXPECT_EQ(ops.host(emb, size_t(R * d)), want);

  const std::vector<float> more = random_floats(size_t(R * d), 31);
  ops.cpu->add(want.data(), more.data(), R * d);
  ops.gpu->add(emb, ops.dev(more), R * d);
  EXPECT_EQ(ops.host(emb, size_t(R * d)), want);

  const int64_t di = c.d_inner(), GN = int64_t(c.n_groups) * c.state_size, H = c.num_heads;
  const int64_t cd = di + 2 * GN, ps = cd + H + 3, dt_off = cd + 1;
  const std::vector<float> xbc = random_floats(size_t(R * cd), 32);
  const std::vector<float> proj = random_floats(size_t(R * ps), 33);
  for (DType act : {DType::f32, DType::bf16}) {
    const size_t es = dtype_size(act);
    std::vector<uint8_t> x(size_t(R * di) * es), B(size_t(R * GN) * es), C(B.size());
    std::vector<float> dt(size_t(R * H));
    ops.cpu->split_xbc(xbc.data(), proj.data(), ps, dt_off, R, di, GN, H, act, x.data(), B.data(),
                       C.data(), dt.data());
    void* gx = ops.dev_bytes(x.size());
    void* gB = ops.dev_bytes(B.size());
    void* gC = ops.dev_bytes(C.size());
    float* gdt = ops.dev(dt);
    ops.gpu->split_xbc(ops.dev(xbc), ops.dev(proj), ps, dt_off, R, di, GN, H, act, gx, gB, gC, gdt);
    EXPECT_EQ(ops.host<uint8_t>(gx, x.size()), x) << dtype_name(act);
    EXPECT_EQ(ops.host<uint8_t>(gB, B.size()), B) << dtype_name(act);
    EXPECT_EQ(ops.host<uint8_t>(gC, C.size()), C) << dtype_name(act);
    EXPECT_EQ(ops.host(gdt, dt.size()), dt) << dtype_name(act);
  }
}

// Conv1d + SiLU through prefill (history moves on), verify windows of several slots (history
// kept, pending written), commits of part of a window and a re-verify after a rollback: outputs
// within a few ulp, history and pending windows bit-identical after every step.
TEST(ModelCudaOps, ConvSiluAndHistoryMatchCpu) {
  SKIP_WITHOUT_GPU();
  auto weights = load_tiny_weights(6, "cuda_conv");
  const ModelConfig& c = weights->config;
  const int kSlots = 3, kWindow = 8;
  OpsPair ops(weights, kSlots, kWindow);
  const int64_t cd = c.conv_dim(), ps = cd + 10, off = 4;
  for (int s = 0; s < kSlots; ++s) {
    ops.cpu->conv_reset(s);
    ops.gpu->conv_reset(s);
  }
  uint64_t seed = 40;
  auto step = [&](int layer, std::vector<int> slots, int64_t T, bool commit) {
    const LayerWeights& lw = weights->layers[size_t(layer)];
    const int64_t R = int64_t(slots.size()) * T;
    const std::vector<float> proj = random_floats(size_t(R * ps), ++seed, 2.0);
    std::vector<float> want(size_t(R * cd));
    ops.cpu->conv_silu(layer, slots, T, proj.data(), ps, off, lw.conv_w, lw.conv_b, commit,
                       want.data());
    float* out = ops.dev(std::vector<float>(size_t(R * cd)));
    ops.gpu->conv_silu(layer, slots, T, ops.dev(proj), ps, off, lw.conv_w, lw.conv_b, commit, out);
    const std::vector<float> got = ops.host(out, size_t(R * cd));
    EXPECT_LT(max_rel_diff(got.data(), want.data(), got.size()), 4e-6)
        << "layer " << layer << " T " << T;
  };
  auto same_state = [&](const char* when) {
    for (int l = 0; l < c.num_layers; ++l)
      for (int s = 0; s < kSlots; ++s) {
        const ConvState a = ops.cpu->conv_state(l, s), b = ops.gpu->conv_state(l, s);
        EXPECT_EQ(a.committed, b.committed) << when << " layer " << l << " slot " << s;
        EXPECT_EQ(a.pending, b.pending) << when << " layer " << l << " slot " << s;
        EXPECT_EQ(a.pending_count, b.pending_count) << when << " layer " << l << " slot " << s;
      }
  };
  for (int l = 0; l < c.num_layers; ++l) {
    step(l, {1}, 5, true);  // prefill longer than the history
    step(l, {2}, 2, true);  // prefill shorter than the history (K-1 = 3)
    step(l, {0}, 1, true);
  }
  same_state("prefill");
  for (int l = 0; l < c.num_layers; ++l) step(l, {2, 1, 0}, 4, false);
  same_state("verify");
  const std::vector<int> slots = {2, 1, 0}, accepted = {1, 4, 2};
  ops.cpu->conv_commit(slots, accepted);
  ops.gpu->conv_commit(slots, accepted);
  same_state("commit");
  for (int l = 0; l < c.num_layers; ++l) step(l, {1}, 8, false);  // a full window
  ops.cpu->conv_commit(std::vector<int>{1}, std::vector<int>{1});
  ops.gpu->conv_commit(std::vector<int>{1}, std::vector<int>{1});
  same_state("rollback");
  for (int l = 0; l < c.num_layers; ++l) step(l, {0, 1}, 3, false);
  same_state("second verify");
}

// The whole runner on the GPU against the CPU runner on the built-in model: prefill (all
// logits), verify windows with partial commits, and a batched verify of three slots.
TEST(ModelCuda, FullModelLogitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  auto weights = builtin_weights();
  std::mt19937_64 rng(77);
  const std::vector<int32_t> prompt = testing::random_token_ids(70, 256, rng);
  const std::vector<int32_t> window = testing::random_token_ids(6, 256, rng);
  const std::vector<int32_t> batch = testing::random_token_ids(3 * 4, 256, rng);
  for (Mode mode : {Mode::fp32, Mode::separate_fp8}) {
    std::vector<std::vector<float>> out[2];
    for (BackendKind kind : {BackendKind::cpu, BackendKind::cuda}) {
      RunnerConfig rc;
      rc.mode = mode;
      rc.backend = kind;
      rc.num_slots = 3;
      rc.activation_dtype = mode == Mode::fp32 ? DType::f32 : DType::bf16;
      Mamba2Model model(weights, rc);
      std::vector<std::vector<float>>& o = out[kind == BackendKind::cuda];
      std::vector<float> logits;
      int slots[3];
      for (int s = 0; s < 3; ++s) {
        slots[s] = model.open(uint64_t(10 + s));
        model.prefill(slots[s], std::span(prompt).first(size_t(20 + 25 * s)), logits, true);
        o.push_back(logits);
      }
      for (int step = 0; step < 8; ++step) {  // 8 windows: flushes at history 16 included
        model.verify(slots[0], window, logits);
        o.push_back(logits);
        model.commit(slots[0], 1 + step % 4);
      }
      model.verify_batch(slots, batch, 4, logits);
      o.push_back(logits);
      const int accepted[3] = {4, 1, 2};
      model.commit_batch(slots, accepted);
      model.verify_batch(slots, batch, 4, logits);
      o.push_back(logits);
    }
    const double tol = mode == Mode::fp32 ? 1e-3 : 5e-2;
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t i = 0; i < out[0].size(); ++i) {
      ASSERT_EQ(out[0][i].size(), out[1][i].size());
      double worst = 0;
      for (size_t j = 0; j < out[0][i].size(); ++j)
        worst = std::max(worst, std::fabs(double(out[0][i][j]) - out[1][i][j]));
      EXPECT_LT(worst, tol) << mode_name(mode) << " call " << i;
    }
  }
}

// Speculative greedy decoding on the GPU reproduces plain greedy decoding on the GPU, fp32 mode.
// This relies on a token's logits not depending on how many rows share a GEMM or a verify
// window; cuBLAS may pick different kernels for M = 1 and M = 8, so an exact equality can only
// break at a near-tie of the logits, which the message then shows.
TEST(ModelCuda, SpeculativeGreedyEqualsGreedy) {
  SKIP_WITHOUT_GPU();
  RunnerConfig rc;
  rc.backend = BackendKind::cuda;
  Mamba2Model model(builtin_weights(), rc);
  const std::string code =
      "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, "
      "b):\n";
  const std::vector<int32_t> prompt(code.begin(), code.end());
  GenerateOptions opt;
  opt.max_new_tokens = 160;
  opt.draft_max = 0;
  const std::vector<int32_t> plain = generate(model, prompt, opt, nullptr, nullptr);
  ASSERT_EQ(plain.size(), 160u);
  for (int k : {1, 3, 7}) {
    opt.draft_max = k;
    GenerateStats st;
    const std::vector<int32_t> spec = generate(model, prompt, opt, nullptr, &st);
    EXPECT_EQ(spec, plain) << "draft_max " << k;
    EXPECT_GT(st.accepted, 0) << "draft_max " << k;
  }
}

}  // namespace
}  // namespace replayssm::model
