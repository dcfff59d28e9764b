// The CPU ops of the model runner: the reference every other implementation is compared with.
// The arithmetic is exactly what the runner computed before the ops were split out (same loops,
// same order), so CPU results stay bit-for-bit.
#include "model/model_ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/formats.h"
#include "model/mamba2.h"
#include "model/matmul.h"
#include "replayssm/error.h"

#if REPLAYSSM_WITH_CUDA
#include "cuda/model_ops.h"
#endif

namespace replayssm::model {

namespace {

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// out = weight * x / sqrt(mean(x^2) + eps) over `width` elements (Mamba2RMSNorm).
void rms_norm_row(const float* x, const float* weight, int64_t width, float eps, float* out) {
  double sum = 0.0;  // double: wide layers (d_inner 8192+) would lose digits in an fp32 sum
  for (int64_t i = 0; i < width; ++i) sum += double(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(float(sum / double(width)) + eps);
  for (int64_t i = 0; i < width; ++i) out[i] = weight[i] * (x[i] * scale);
}

class CpuModelOps final : public ModelOps {
 public:
  CpuModelOps(const ModelWeights& weights, const RunnerConfig& runner)
      : K_(weights.config.conv_kernel), cd_(weights.config.conv_dim()) {
    conv_.assign(size_t(weights.config.num_layers),
                 std::vector<ConvState>(size_t(runner.num_slots)));
    max_window_ = runner.max_window;
  }

  MemoryKind memory() const override { return MemoryKind::host; }

  void* allocate(size_t bytes) override {
    return ::operator new(bytes ? bytes : 1, std::align_val_t(64));
  }
  void deallocate(void* p) override { ::operator delete(p, std::align_val_t(64)); }
  void to_host(const void* src, size_t bytes, void* host) override {
    if (src != host) std::memcpy(host, src, bytes);
  }
  void from_host(const void* host, size_t bytes, void* dst) override {
    if (dst != host) std::memcpy(dst, host, bytes);
  }

  void embed(const int32_t* tokens, int64_t R, const Matrix& table, float* out) override {
    for (int64_t r = 0; r < R; ++r) table.row_f32(tokens[r], out + r * table.cols);
  }

  void rms_norm(const float* x, int64_t x_stride, int64_t R, int64_t width,
                const std::vector<float>& weight, float eps, float* out) override {
    for (int64_t r = 0; r < R; ++r)
      rms_norm_row(x + r * x_stride, weight.data(), width, eps, out + r * width);
  }

  void matmul(const float* X, int64_t M, const Matrix& W, const std::vector<float>& bias,
              float* Y) override {
    model::matmul(X, M, W, bias.empty() ? nullptr : bias.data(), Y);
  }

  void add(float* acc, const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  }

  void conv_silu(int layer, std::span<const int> slots, int64_t T, const float* proj,
                 int64_t proj_stride, int64_t xbc_offset, const std::vector<float>& conv_w,
                 const std::vector<float>& conv_b, bool commit, float* out) override {
    const int64_t K = K_, K1 = K - 1, cd = cd_, S = int64_t(slots.size());
    seq_.resize(size_t((K1 + T) * cd));  // [K-1 + T, conv_dim], one slot at a time
    for (int64_t s = 0; s < S; ++s) {
      ConvState& cs = conv_[size_t(layer)][size_t(slots[size_t(s)])];
      std::copy(cs.committed.begin(), cs.committed.end(), seq_.begin());
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(seq_.data() + (K1 + t) * cd, proj + (s * T + t) * proj_stride + xbc_offset,
                    size_t(cd) * sizeof(float));
      float* xbc = out + s * T * cd;  // [T, conv_dim] of this slot
#pragma omp parallel for schedule(static) if (T * cd > 16384)
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t ch = 0; ch < cd; ++ch) {
          float acc = conv_b[size_t(ch)];
          for (int64_t i = 0; i < K; ++i)
            acc += conv_w[size_t(ch * K + i)] * seq_[size_t((t + i) * cd + ch)];
          xbc[t * cd + ch] = silu(acc);
        }
      }
      if (commit) {
        std::copy(seq_.end() - K1 * cd, seq_.end(), cs.committed.begin());
      } else {
        std::copy(seq_.begin() + K1 * cd, seq_.end(), cs.pending.begin());
        cs.pending_count = int(T);
      }
    }
  }

  void conv_commit(std::span<const int> slots, std::span<const int> accepted) override {
    // The last K-1 inputs of (committed history ++ first `accepted` window inputs).
    const int64_t K1 = K_ - 1, cd = cd_;
    std::vector<float> seq;  // [K-1 + accepted, conv_dim]
    for (auto& layer : conv_) {
      for (size_t s = 0; s < slots.size(); ++s) {
        ConvState& cs = layer[size_t(slots[s])];
        seq.resize(size_t((K1 + accepted[s]) * cd));
        std::copy(cs.committed.begin(), cs.committed.end(), seq.begin());
        std::copy(cs.pending.begin(), cs.pending.begin() + int64_t(accepted[s]) * cd,
                  seq.begin() + K1 * cd);
        std::copy(seq.end() - K1 * cd, seq.end(), cs.committed.begin());
        cs.pending_count = 0;
      }
    }
  }

  void conv_reset(int slot) override {
    for (auto& layer : conv_) {
      ConvState& s = layer[size_t(slot)];
      s.committed.assign(size_t(K_ - 1) * size_t(cd_), 0.0f);
      s.pending.assign(size_t(max_window_) * size_t(cd_), 0.0f);
      s.pending_count = 0;
    }
  }

  ConvState conv_state(int layer, int slot) const override {
    return conv_[size_t(layer)][size_t(slot)];
  }

  void split_xbc(const float* xbc, const float* proj, int64_t proj_stride, int64_t dt_offset,
                 int64_t R, int64_t d_inner, int64_t GN, int64_t H, DType act, void* x, void* B,
                 void* C, float* dt) override {
    const int64_t cd = d_inner + 2 * GN;
    auto put = [act](const float* src, int64_t n, void* dst, int64_t row) {
      if (act == DType::f32) {
        std::memcpy(static_cast<float*>(dst) + row * n, src, size_t(n) * sizeof(float));
        return;
      }
      uint16_t* d = static_cast<uint16_t*>(dst) + row * n;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    };
    for (int64_t r = 0; r < R; ++r) {
      const float* src = xbc + r * cd;
      put(src, d_inner, x, r);
      put(src + d_inner, GN, B, r);
      put(src + d_inner + GN, GN, C, r);
      std::memcpy(dt + r * H, proj + r * proj_stride + dt_offset, size_t(H) * sizeof(float));
    }
  }

  void gated_rms_norm(const float* y, const float* z, int64_t z_stride, int64_t R, int64_t d_inner,
                      int groups, const std::vector<float>& weight, float eps,
                      float* out) override {
    const int64_t group = d_inner / groups;
    for (int64_t r = 0; r < R; ++r) {
      const float* zr = z + r * z_stride;
      float* g = out + r * d_inner;
      for (int64_t i = 0; i < d_inner; ++i) g[i] = y[r * d_inner + i] * silu(zr[i]);
      for (int64_t g0 = 0; g0 < d_inner; g0 += group)
        rms_norm_row(g + g0, weight.data() + g0, group, eps, g + g0);
    }
  }

 private:
  int K_;
  int64_t cd_;
  int max_window_ = 1;
  std::vector<std::vector<ConvState>> conv_;  // [layers][slots]
  std::vector<float> seq_;
};

}  // namespace

std::unique_ptr<ModelOps> make_cpu_model_ops(const ModelWeights& weights,
                                             const RunnerConfig& runner) {
  return std::make_unique<CpuModelOps>(weights, runner);
}

std::unique_ptr<ModelOps> make_model_ops(const ModelWeights& weights, const RunnerConfig& runner) {
  if (runner.backend == BackendKind::cpu) return make_cpu_model_ops(weights, runner);
#if REPLAYSSM_WITH_CUDA
  return cuda::make_cuda_model_ops(weights, runner);
#else
  fail("model runner: this build has no CUDA support (backend cuda)");
#endif
}

}  // namespace replayssm::model
