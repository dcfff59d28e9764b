#include "model/matmul.h"

#include <algorithm>
#include <vector>

#include "core/formats.h"

namespace replayssm::model {

namespace {

constexpr int kLanes = 16;

// Fixed-order dot product: lane l sums elements k = l (mod 16); lanes are reduced pairwise.
inline float dot_f32(const float* __restrict a, const float* __restrict b, int64_t K) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += a[k + l] * b[k + l];
  }
  for (int l = 0; k < K; ++k, ++l) acc[l] += a[k] * b[k];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// Output rows per task: big enough to amortise the bf16 widening of W rows over the M tokens.
constexpr int64_t kRowBlock = 16;
// Tokens per pass over a block of W rows, so the X rows stay in cache during a long prefill.
constexpr int64_t kTokenBlock = 64;
// Multiply-adds below which the product runs on the calling thread.
constexpr int64_t kParallelMacs = int64_t(1) << 22;

// One block of output columns [n0, n0 + rows) for all M tokens. Compiled twice (AVX2 + FMA and
// baseline x86-64) and picked once per process at load time, so every call on a machine uses
// the same instructions and the per-token results stay independent of M.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=haswell", "default")))
#endif
void block_product(const float* X /*[M, K]*/, int64_t M, const float* wrows /*[rows, K]*/,
                   const uint16_t* wbf16 /*[rows, K] or null*/, float* wbuf /*[rows, K]*/,
                   int64_t rows, int64_t K, const float* bias /*[rows] or null*/,
                   float* Y /*[M, N] at column 0 of the block*/, int64_t N) {
  if (wbf16) {  // bf16 rows widened once per call, shared by the M tokens
    for (int64_t i = 0; i < rows * K; ++i) wbuf[i] = bf16_to_f32(wbf16[i]);
    wrows = wbuf;
  }
  for (int64_t m0 = 0; m0 < M; m0 += kTokenBlock) {
    const int64_t m1 = std::min(M, m0 + kTokenBlock);
    for (int64_t r = 0; r < rows; ++r) {
      const float* w = wrows + r * K;
      const float b = bias ? bias[r] : 0.0f;
      for (int64_t m = m0; m < m1; ++m) Y[m * N + r] = dot_f32(X + m * K, w, K) + b;
    }
  }
}

}  // namespace

void matmul(const float* X, int64_t M, const Matrix& W, const float* bias, float* Y) {
  const int64_t N = W.rows, K = W.cols;
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  const bool widen = W.type == Matrix::Type::bf16;
  // Threads only pay off above a few MFLOP: a decode step of a small model is over before a
  // thread team wakes up, and on a loaded machine spinning teams cost far more than they save.
  const bool threaded = double(M) * double(N) * double(K) >= double(kParallelMacs);
#pragma omp parallel if (threaded)
  {
    std::vector<float> wbuf(widen ? size_t(kRowBlock * K) : 0);  // widened rows of the block
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * kRowBlock, n1 = std::min(N, n0 + kRowBlock);
      block_product(X, M, widen ? nullptr : W.f32() + n0 * K, widen ? W.bf16() + n0 * K : nullptr,
                    wbuf.data(), n1 - n0, K, bias ? bias + n0 : nullptr, Y + n0, N);
    }
  }
}

}  // namespace replayssm::model
