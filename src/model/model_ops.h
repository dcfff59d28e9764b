// The per-op implementations of the model runner's layer (docs/model.md "GPU path"): the runner
// (model/mamba2.cpp) writes the layer sequence once and calls these ops on arrays that live in the
// ops' memory: host memory for the CPU ops (model_ops.cpp, the reference, bit-for-bit the code the
// runner always ran) and device memory for the CUDA ops (cuda/model_ops.cu, built with CUDA).
//
// Weights are named by the host objects of ModelWeights (a Matrix or a std::vector<float> of the
// runner's weights): the CPU ops read them in place, the CUDA ops look up the device copy they
// uploaded once at construction. Activations are fp32 unless a dtype says otherwise.
//
// Ordering: the CUDA ops enqueue on the legacy default stream, which the CUDA cache backend's
// blocking stream is ordered with, so an op, the SSM and the next op run in program order without
// host synchronisation; to_host waits for everything enqueued before it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/weights.h"
#include "replayssm/types.h"

namespace replayssm::model {

struct RunnerConfig;

struct ConvState {
  std::vector<float> committed;  // [K-1, conv_dim]: inputs of the last K-1 committed tokens
  std::vector<float> pending;    // [max_window, conv_dim]: inputs of the last verify window
  int pending_count = 0;
};

class ModelOps {
 public:
  virtual ~ModelOps() = default;
  virtual MemoryKind memory() const = 0;

  // Raw storage in the ops' memory (uninitialised) and copies between it and the host.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void to_host(const void* src, size_t bytes, void* host) = 0;  // after all queued work
  virtual void from_host(const void* host, size_t bytes, void* dst) = 0;

  // out[r] = table[tokens[r]] widened to fp32 (nn.Embedding). tokens: host, in 0..V-1.
  virtual void embed(const int32_t* tokens /*[R] host*/, int64_t R, const Matrix& table /*[V, d]*/,
                     float* out /*[R, d]*/) = 0;
  // out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps) (Mamba2RMSNorm), sum of squares in double.
  // Row r of x starts at x + r * x_stride; out is dense.
  virtual void rms_norm(const float* x /*[R, width], rows x_stride apart*/, int64_t x_stride,
                        int64_t R, int64_t width, const std::vector<float>& weight /*[width]*/,
                        float eps, float* out /*[R, width]*/) = 0;
  // Y = X W^T (+ bias), W as stored (torch.nn.Linear layout), fp32 products and sums.
  virtual void matmul(const float* X /*[M, K]*/, int64_t M, const Matrix& W /*[N, K]*/,
                      const std::vector<float>& bias /*[N] or empty*/, float* Y /*[M, N]*/) = 0;
  // acc += x (the residual add).
  virtual void add(float* acc /*[n]*/, const float* x /*[n]*/, int64_t n) = 0;
  // Causal depthwise conv1d + SiLU of `layer` for T tokens of each slot (row s * T + t of proj is
  // token t of slots[s]) over [K-1 committed inputs ++ T new inputs]:
  //   out[s*T+t, c] = SiLU(b[c] + sum_{i<K} w[c, i] * seq[t + i, c]).
  // commit (prefill): the history becomes the last K-1 inputs of the sequence; otherwise (verify)
  // the T inputs become the slot's pending window and the history is unchanged.
  virtual void conv_silu(int layer, std::span<const int> slots /*[S]*/, int64_t T,
                         const float* proj /*[S*T, proj_stride]*/, int64_t proj_stride,
                         int64_t xbc_offset, const std::vector<float>& conv_w /*[conv_dim, K]*/,
                         const std::vector<float>& conv_b /*[conv_dim]*/, bool commit,
                         float* out /*[S*T, conv_dim]*/) = 0;
  // Every layer's history of each slot becomes the last K-1 of [history ++ first accepted[s]
  // pending inputs]; the pending windows are dropped.
  virtual void conv_commit(std::span<const int> slots /*[S]*/,
                           std::span<const int> accepted /*[S]*/) = 0;
  virtual void conv_reset(int slot) = 0;  // zero history, no pending window (every layer)
  virtual ConvState conv_state(int layer, int slot) const = 0;  // a host copy
  // Splits xBC [R, conv_dim] into x [R, d_inner], B [R, GN], C [R, GN] in the activation dtype
  // (fp32, or bf16 rounded to nearest even) and copies raw dt [R, H] from proj.
  virtual void split_xbc(const float* xbc /*[R, d_inner + 2 GN]*/, const float* proj,
                         int64_t proj_stride, int64_t dt_offset, int64_t R, int64_t d_inner,
                         int64_t GN, int64_t H, DType act, void* x, void* B, void* C,
                         float* dt) = 0;
  // out = GatedRMSNorm(y * SiLU(z)) (MambaRMSNormGated, norm_before_gate=False): g = y * SiLU(z),
  // then each group of d_inner / groups elements is RMS-normalised (sum in double) and scaled
  // by weight.
  virtual void gated_rms_norm(const float* y /*[R, d_inner]*/,
                              const float* z /*[R, d_inner], rows z_stride apart*/,
                              int64_t z_stride, int64_t R, int64_t d_inner, int groups,
                              const std::vector<float>& weight /*[d_inner]*/, float eps,
                              float* out /*[R, d_inner]*/) = 0;
};

// The ops of runner.backend: CPU, or CUDA (weights uploaded now; throws without CUDA).
std::unique_ptr<ModelOps> make_model_ops(const ModelWeights& weights, const RunnerConfig& runner);
std::unique_ptr<ModelOps> make_cpu_model_ops(const ModelWeights& weights,
                                             const RunnerConfig& runner);

// Storage in an ops' memory, grown on demand (growing discards the contents: every forward writes
// its arrays before reading them).
class OpsBuffer {
 public:
  explicit OpsBuffer(ModelOps* ops = nullptr) : ops_(ops) {}
  ~OpsBuffer() { reset(); }
  OpsBuffer(const OpsBuffer&) = delete;
  OpsBuffer& operator=(const OpsBuffer&) = delete;
  OpsBuffer(OpsBuffer&& o) noexcept : ops_(o.ops_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }

  void bind(ModelOps* ops) {
    reset();
    ops_ = ops;
  }
  void* reserve(size_t bytes) {
    if (bytes > bytes_) {
      reset();
      data_ = ops_->allocate(bytes);
      bytes_ = bytes;
    }
    return data_;
  }
  template <typename T = float>
  T* of(int64_t n) {
    return static_cast<T*>(reserve(size_t(n) * sizeof(T)));
  }
  void* data() const { return data_; }
  void reset() {
    if (data_) ops_->deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  ModelOps* ops_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace replayssm::model
