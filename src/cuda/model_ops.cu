// CudaModelOps: the model runner's ops on the GPU (model/model_ops.h). Everything is enqueued on
// the legacy default stream (cuBLAS included), which the CUDA cache backend's blocking stream is
// ordered with, so the layer sequence needs no host synchronisation until the logits come back.
#include <cublas_v2.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "cuda/model_ops.cuh"
#include "cuda/model_ops.h"
#include "model/mamba2.h"

namespace replayssm::cuda {

namespace {

#define RSSM_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                      \
    const cublasStatus_t rssm_cublas_status_ = (expr);                                      \
    if (rssm_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::replayssm::fail("cuBLAS error ", int(rssm_cublas_status_), " (",                    \
                        cublasGetStatusString(rssm_cublas_status_), ") at ", __FILE__, ":", \
                        __LINE__, " in ", #expr);                                           \
  } while (0)

constexpr int kThreads = 256;

// Blocks of a grid-stride loop over n elements (at most a few waves; the loops stride the rest).
unsigned grid_for(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096));
}

void check_launch() { RSSM_CUDA_CHECK(cudaGetLastError()); }

class CudaModelOps final : public model::ModelOps {
 public:
  CudaModelOps(const model::ModelWeights& weights, const model::RunnerConfig& runner)
      : K_(weights.config.conv_kernel),
        cd_(weights.config.conv_dim()),
        max_window_(runner.max_window),
        num_slots_(runner.num_slots) {
    check(K_ >= 1 && K_ <= kMaxConvKernel, "CUDA model ops: conv kernel ", K_, " is outside 1..",
          kMaxConvKernel);
    int devices = 0;
    check(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0,
          "CUDA model ops: no CUDA device");
    RSSM_CUBLAS_CHECK(cublasCreate(&blas_));
    // The legacy default stream (0), like every kernel here. CUBLAS_DEFAULT_MATH with
    // CUBLAS_COMPUTE_32F uses no TF32 (that needs CUBLAS_TF32_TENSOR_OP_MATH or the _FAST_TF32
    // compute types): the GEMMs are fp32 products and sums, like the CPU reference.
    RSSM_CUBLAS_CHECK(cublasSetStream(blas_, 0));
    RSSM_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    // Weights, once, as stored. A tied lm_head is the embeddings object, uploaded once.
    int64_t widest_bf16 = 0;
    auto matrix = [&](const model::Matrix& m) {
      if (m.bytes.empty() || dev_.count(&m)) return;
      dev_[&m] = upload(m.bytes.data(), m.bytes.size());
      if (m.type == model::Matrix::Type::bf16) widest_bf16 = std::max(widest_bf16, m.rows * m.cols);
    };
    auto vec = [&](const std::vector<float>& v) {
      if (!v.empty()) dev_[&v] = upload(v.data(), v.size() * sizeof(float));
    };
    matrix(weights.embeddings);
    matrix(weights.head());
    vec(weights.norm_f);
    for (const model::LayerWeights& lw : weights.layers) {
      vec(lw.norm);
      matrix(lw.in_proj);
      vec(lw.in_bias);
      vec(lw.conv_w);
      vec(lw.conv_b);
      vec(lw.gated_norm);
      matrix(lw.out_proj);
      vec(lw.out_bias);
    }
    if (widest_bf16 > 0) widened_ = static_cast<float*>(allocate(size_t(widest_bf16) * 4));
    // Conv history per layer: committed [slots, K-1, cd] and pending [slots, max_window, cd].
    const size_t L = weights.layers.size();
    hist_.resize(L);
    pend_.resize(L);
    pending_count_.assign(L, std::vector<int>(size_t(num_slots_), 0));
    for (size_t l = 0; l < L; ++l) {
      hist_[l] = static_cast<float*>(allocate(hist_bytes() * size_t(num_slots_)));
      pend_[l] = static_cast<float*>(allocate(pend_bytes() * size_t(num_slots_)));
      RSSM_CUDA_CHECK(cudaMemset(hist_[l], 0, hist_bytes() * size_t(num_slots_)));
      RSSM_CUDA_CHECK(cudaMemset(pend_[l], 0, pend_bytes() * size_t(num_slots_)));
    }
  }

  ~CudaModelOps() override {
    cudaDeviceSynchronize();
    for (auto& [key, p] : dev_) cudaFree(p);
    for (float* p : hist_) cudaFree(p);
    for (float* p : pend_) cudaFree(p);
    cudaFree(widened_);
    cudaFree(ints_);
    if (blas_) cublasDestroy(blas_);
  }

  MemoryKind memory() const override { return MemoryKind::cuda; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    RSSM_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void to_host(const void* src, size_t bytes, void* host) override {
    // A pageable copy on the legacy stream: waits for every op and SSM launch before it.
    RSSM_CUDA_CHECK(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  }
  void from_host(const void* host, size_t bytes, void* dst) override {
    RSSM_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  }

  void embed(const int32_t* tokens, int64_t R, const model::Matrix& table, float* out) override {
    const int32_t* t = upload_ints(tokens, R, 0);
    const int64_t d = table.cols;
    if (table.type == model::Matrix::Type::bf16)
      embed_kernel<<<grid_for(R * d), kThreads>>>(t, R, dev_bf16(table), d, out);
    else
      embed_kernel<<<grid_for(R * d), kThreads>>>(t, R, dev_f32(table), d, out);
    check_launch();
  }

  void rms_norm(const float* x, int64_t x_stride, int64_t R, int64_t width,
                const std::vector<float>& weight, float eps, float* out) override {
    if (R == 0) return;
    rms_norm_kernel<<<unsigned(R), kNormThreads>>>(x, x_stride, width, dev(weight), eps, out);
    check_launch();
  }

  // Y[M, N] = X[M, K] W[N, K]^T (+ bias). cuBLAS is column-major: the row-major Y [M, N] is the
  // column-major N x M matrix Y^T (ld N), X [M, K] row-major is column-major K x M (X^T, ld K),
  // and W [N, K] row-major is column-major K x N (W^T, ld K). So Y^T = W X^T is
  //   gemm(opA = T on A = W^T-as-stored (K x N, lda K) -> W (N x K),
  //        opB = N on B = X^T (K x M, ldb K), C = Y^T (N x M, ldc N)), m = N, n = M, k = K.
  // cublasGemmEx needs A and B of one type, so bf16 weights are widened (exactly) into a
  // scratch fp32 copy first; products and sums are fp32 (CUBLAS_COMPUTE_32F). Decode-sized
  // products (M <= 16 token rows) of bf16 weights take skinny_matmul_bf16_kernel instead, which
  // reads the weights once as stored (the same fp32 products; sums within the same error bound).
  void matmul(const float* X, int64_t M, const model::Matrix& W, const std::vector<float>& bias,
              float* Y) override {
    const int64_t N = W.rows, K = W.cols;
    if (M == 0 || N == 0) return;
    if (W.type == model::Matrix::Type::bf16 && M <= 16 && K % 8 == 0 &&
        reinterpret_cast<uintptr_t>(X) % 16 == 0) {
      skinny_matmul(X, int(M), W, bias, Y);
      return;
    }
    const float* A = nullptr;
    if (W.type == model::Matrix::Type::bf16) {
      widen_bf16_kernel<<<grid_for(N * K), kThreads>>>(dev_bf16(W), N * K, widened_);
      check_launch();
      A = widened_;
    } else {
      A = dev_f32(W);
    }
    const float one = 1.0f, zero = 0.0f;
    RSSM_CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, A,
                                   CUDA_R_32F, int(K), X, CUDA_R_32F, int(K), &zero, Y, CUDA_R_32F,
                                   int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (!bias.empty()) {
      bias_kernel<<<grid_for(M * N), kThreads>>>(Y, dev(bias), M, N);
      check_launch();
    }
  }

  void skinny_matmul(const float* X, int M, const model::Matrix& W, const std::vector<float>& bias,
                     float* Y) {
    const int64_t N = W.rows, K = W.cols;
    const float* b = bias.empty() ? nullptr : dev(bias);
    auto launch = [&]<int kMaxM, int kRows>() {
      const int64_t rows_per_block = int64_t(kSkinnyWarps) * kRows;
      skinny_matmul_bf16_kernel<kMaxM, kRows>
          <<<unsigned((N + rows_per_block - 1) / rows_per_block), 32 * kSkinnyWarps>>>(
              X, M, dev_bf16(W), N, K, b, Y);
      check_launch();
    };
    if (M == 1)
      launch.template operator()<1, 4>();
    else if (M <= 4)
      launch.template operator()<4, 4>();
    else if (M <= 8)
      launch.template operator()<8, 4>();
    else
      launch.template operator()<16, 2>();  // 2 rows per warp: 2 x 16 partial sums in registers
  }

  void add(float* acc, const float* x, int64_t n) override {
    if (n == 0) return;
    add_kernel<<<grid_for(n), kThreads>>>(acc, x, n);
    check_launch();
  }

  void conv_silu(int layer, std::span<const int> slots, int64_t T, const float* proj,
                 int64_t proj_stride, int64_t xbc_offset, const std::vector<float>& conv_w,
                 const std::vector<float>& conv_b, bool commit, float* out) override {
    const int64_t S = int64_t(slots.size());
    const int32_t* sl = upload_slots(slots);
    float* pending = commit ? nullptr : pend_[size_t(layer)];
    conv_silu_kernel<<<grid_for(S * T * cd_), kThreads>>>(
        sl, S, T, K_, cd_, proj, proj_stride, xbc_offset, dev(conv_w), dev(conv_b),
        hist_[size_t(layer)], pending, max_window_, out);
    check_launch();
    if (commit) {
      conv_shift_kernel<<<grid_for(S * cd_), kThreads>>>(sl, nullptr, S, T, K_, cd_, proj,
                                                         proj_stride, xbc_offset, nullptr,
                                                         max_window_, hist_[size_t(layer)]);
      check_launch();
    } else {
      for (int slot : slots) pending_count_[size_t(layer)][size_t(slot)] = int(T);
    }
  }

  void conv_commit(std::span<const int> slots, std::span<const int> accepted) override {
    const int64_t S = int64_t(slots.size());
    const int32_t* sl = upload_slots(slots);
    const std::vector<int32_t> acc(accepted.begin(), accepted.end());
    const int32_t* ac = upload_ints(acc.data(), S, 2);
    for (size_t l = 0; l < hist_.size(); ++l) {
      conv_shift_kernel<<<grid_for(S * cd_), kThreads>>>(sl, ac, S, 0, K_, cd_, nullptr, 0, 0,
                                                         pend_[l], max_window_, hist_[l]);
      check_launch();
      for (int slot : slots) pending_count_[l][size_t(slot)] = 0;
    }
  }

  void conv_reset(int slot) override {
    for (size_t l = 0; l < hist_.size(); ++l) {
      RSSM_CUDA_CHECK(cudaMemset(reinterpret_cast<uint8_t*>(hist_[l]) + size_t(slot) * hist_bytes(),
                                 0, hist_bytes()));
      RSSM_CUDA_CHECK(cudaMemset(reinterpret_cast<uint8_t*>(pend_[l]) + size_t(slot) * pend_bytes(),
                                 0, pend_bytes()));
      pending_count_[l][size_t(slot)] = 0;
    }
  }

  model::ConvState conv_state(int layer, int slot) const override {
    model::ConvState cs;
    cs.committed.resize(hist_bytes() / sizeof(float));
    cs.pending.resize(pend_bytes() / sizeof(float));
    RSSM_CUDA_CHECK(cudaMemcpy(
        cs.committed.data(),
        reinterpret_cast<const uint8_t*>(hist_[size_t(layer)]) + size_t(slot) * hist_bytes(),
        hist_bytes(), cudaMemcpyDeviceToHost));
    RSSM_CUDA_CHECK(cudaMemcpy(
        cs.pending.data(),
        reinterpret_cast<const uint8_t*>(pend_[size_t(layer)]) + size_t(slot) * pend_bytes(),
        pend_bytes(), cudaMemcpyDeviceToHost));
    cs.pending_count = pending_count_[size_t(layer)][size_t(slot)];
    return cs;
  }

  void split_xbc(const float* xbc, const float* proj, int64_t proj_stride, int64_t dt_offset,
                 int64_t R, int64_t d_inner, int64_t GN, int64_t H, DType act, void* x, void* B,
                 void* C, float* dt) override {
    check(act == DType::f32 || act == DType::bf16, "CUDA model ops: activation dtype ",
          dtype_name(act), " is not fp32 or bf16");
    const int64_t n = R * (d_inner + 2 * GN + H);
    if (n == 0) return;
    split_xbc_kernel<<<grid_for(n), kThreads>>>(xbc, proj, proj_stride, dt_offset, R, d_inner, GN,
                                                H, act, x, B, C, dt);
    check_launch();
  }

  void gated_rms_norm(const float* y, const float* z, int64_t z_stride, int64_t R, int64_t d_inner,
                      int groups, const std::vector<float>& weight, float eps,
                      float* out) override {
    if (R == 0) return;
    const dim3 grid{unsigned(R), unsigned(groups)};
    gated_rms_norm_kernel<<<grid, kNormThreads>>>(y, z, z_stride, d_inner, d_inner / groups,
                                                  dev(weight), eps, out);
    check_launch();
  }

 private:
  size_t hist_bytes() const { return size_t(K_ - 1) * size_t(cd_) * sizeof(float); }
  size_t pend_bytes() const { return size_t(max_window_) * size_t(cd_) * sizeof(float); }

  void* upload(const void* host, size_t bytes) {
    void* p = allocate(bytes);
    from_host(host, bytes, p);
    return p;
  }
  void* lookup(const void* key) const {
    const auto it = dev_.find(key);
    check(it != dev_.end(), "CUDA model ops: a weight that was not uploaded (not part of the ",
          "runner's ModelWeights)");
    return it->second;
  }
  const float* dev(const std::vector<float>& v) const {
    return static_cast<const float*>(lookup(&v));
  }
  const float* dev_f32(const model::Matrix& m) const {
    return static_cast<const float*>(lookup(&m));
  }
  const __nv_bfloat16* dev_bf16(const model::Matrix& m) const {
    return static_cast<const __nv_bfloat16*>(lookup(&m));
  }

  // Small int lists on the device: three regions (0: tokens, 1: slots, 2: accepted counts) of
  // one buffer, grown on demand. The pageable copy waits for earlier work, which may still read the
  // previous list.
  const int32_t* upload_ints(const int32_t* host, int64_t n, int region) {
    if (n > ints_cap_) {
      cudaFree(ints_);
      ints_cap_ = std::max<int64_t>(n, 1024);
      ints_ = static_cast<int32_t*>(allocate(size_t(3 * ints_cap_) * sizeof(int32_t)));
      slots_cached_.clear();
    }
    int32_t* dst = ints_ + region * ints_cap_;
    from_host(host, size_t(n) * sizeof(int32_t), dst);
    return dst;
  }
  // The slot list of region 1 kept across the layers of a forward (re-sent only when it changes).
  const int32_t* upload_slots(std::span<const int> slots) {
    slots_tmp_.assign(slots.begin(), slots.end());
    if (slots_tmp_ != slots_cached_ || int64_t(slots_tmp_.size()) > ints_cap_) {
      upload_ints(slots_tmp_.data(), int64_t(slots_tmp_.size()), 1);
      slots_cached_ = slots_tmp_;
    }
    return ints_ + ints_cap_;
  }

  int K_;
  int64_t cd_;
  int max_window_;
  int num_slots_;
  cublasHandle_t blas_ = nullptr;
  std::unordered_map<const void*, void*> dev_;   // host weight object -> device copy
  float* widened_ = nullptr;                     // [largest bf16 matrix] fp32 scratch
  std::vector<float*> hist_, pend_;              // [layers] device conv history / pending
  std::vector<std::vector<int>> pending_count_;  // [layers][slots]
  int32_t* ints_ = nullptr;                      // [3, ints_cap_]
  int64_t ints_cap_ = 0;
  std::vector<int32_t> slots_cached_, slots_tmp_;
};

}  // namespace

std::unique_ptr<model::ModelOps> make_cuda_model_ops(const model::ModelWeights& weights,
                                                     const model::RunnerConfig& runner) {
  return std::make_unique<CudaModelOps>(weights, runner);
}

}  // namespace replayssm::cuda
