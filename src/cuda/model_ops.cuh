// The small kernels of the model runner's GPU path (cuda/model_ops.cu). Each mirrors one CPU op of
// model/model_ops.cpp, named next to it, with the same fp32 arithmetic where CUDA allows it:
// products and sums that the CPU does as separate roundings use __fmul_rn / __fadd_rn so nvcc
// does not contract them into FMAs, and the RMS sums are accumulated in double as on the CPU (in
// a different order: the double sum of fp32 squares carries ~1e-16 relative error, far below the
// fp32 rounding of its result, so the normalisation scale almost always has the CPU's bits).
// What differs is expf (CUDA: at most 2 ulp) against glibc's expf inside SiLU.
#pragma once

#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace replayssm::cuda {

inline constexpr int kMaxConvKernel = 8;  // taps kept in registers by the conv kernels
inline constexpr int kNormThreads = 256;  // threads per row of the RMSNorm kernels

__device__ __forceinline__ float silu_f32(float v) { return v / (1.0f + expf(-v)); }

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// Called once per kernel (the shared array is not fenced for reuse).
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) warp_sums[0] = v;
  }
  __syncthreads();
  return warp_sums[0];
}

// CPU: CpuModelOps::embed (Matrix::row_f32). out[r, i] = table[tokens[r], i] as fp32.
template <typename T>
__global__ void embed_kernel(const int32_t* __restrict__ tokens /*[R]*/, int64_t R,
                             const T* __restrict__ table /*[V, d]*/, int64_t d,
                             float* __restrict__ out /*[R, d]*/) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < R * d;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d;
    out[e] = to_f32<T>(table[int64_t(tokens[r]) * d + i]);
  }
}

// CPU: rms_norm_row (Mamba2RMSNorm). One block per row r:
//   sum = sum_i double(x_i)^2;  scale = 1 / sqrtf(float(sum / width) + eps)   (IEEE sqrt, div)
//   out_i = w_i * (x_i * scale)
__global__ void rms_norm_kernel(const float* __restrict__ x /*[R, width], rows x_stride apart*/,
                                int64_t x_stride, int64_t width,
                                const float* __restrict__ weight /*[width]*/, float eps,
                                float* __restrict__ out /*[R, width]*/) {
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  float* o = out + int64_t(blockIdx.x) * width;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += double(xr[i]) * xr[i];
  sum = block_sum(sum);
  const float scale = 1.0f / sqrtf(float(sum / double(width)) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    o[i] = __fmul_rn(weight[i], __fmul_rn(xr[i], scale));
}

// CPU: CpuModelOps::gated_rms_norm (MambaRMSNormGated). One block per (row r, group q) of
// `group` = d_inner / groups elements:
//   g_i = y_i * SiLU(z_i);  then rms_norm_row over the group's g with weight[q * group ..]
// Each thread re-reads only the g values it wrote itself, so no barrier separates the passes.
__global__ void gated_rms_norm_kernel(const float* __restrict__ y /*[R, d_inner]*/,
                                      const float* __restrict__ z /*[R, d_inner], z_stride*/,
                                      int64_t z_stride, int64_t d_inner, int64_t group,
                                      const float* __restrict__ weight /*[d_inner]*/, float eps,
                                      float* __restrict__ out /*[R, d_inner]*/) {
  const int64_t r = blockIdx.x, g0 = int64_t(blockIdx.y) * group;
  const float* yr = y + r * d_inner + g0;
  const float* zr = z + r * z_stride + g0;
  float* o = out + r * d_inner + g0;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float g = __fmul_rn(yr[i], silu_f32(zr[i]));
    o[i] = g;
    sum += double(g) * g;
  }
  sum = block_sum(sum);
  const float scale = 1.0f / sqrtf(float(sum / double(group)) + eps);
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x)
    o[i] = __fmul_rn(weight[g0 + i], __fmul_rn(o[i], scale));
}

// Input j of slot s's conv sequence [K-1 history ++ T new]: history row j, or token j - (K-1).
__device__ __forceinline__ float conv_input(const float* hist /*[K-1, cd] of the slot*/,
                                            const float* proj, int64_t proj_stride,
                                            int64_t xbc_offset, int64_t row0 /*s * T*/, int K1,
                                            int64_t cd, int64_t j, int64_t ch) {
  return j < K1 ? hist[j * cd + ch] : proj[(row0 + j - K1) * proj_stride + xbc_offset + ch];
}

// CPU: CpuModelOps::conv_silu. Per (s, t, channel c), slot = slots[s]:
//   acc = b[c];  for i in 0..K-1: acc = acc + w[c, i] * seq[t + i, c]   (separate roundings)
//   out[s*T + t, c] = SiLU(acc)
// With write_pending (verify) the T new inputs also go to the slot's pending rows; the history
// itself is moved on by conv_shift_kernel after this kernel (it is read here).
__global__ void conv_silu_kernel(const int32_t* __restrict__ slots /*[S]*/, int64_t S, int64_t T,
                                 int K, int64_t cd, const float* __restrict__ proj,
                                 int64_t proj_stride, int64_t xbc_offset,
                                 const float* __restrict__ w /*[cd, K]*/,
                                 const float* __restrict__ b /*[cd]*/,
                                 const float* __restrict__ hist /*[slots, K-1, cd]*/,
                                 float* __restrict__ pending /*[slots, max_window, cd] or null*/,
                                 int max_window, float* __restrict__ out /*[S*T, cd]*/) {
  const int K1 = K - 1;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < S * T * cd;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = e % cd, t = (e / cd) % T, s = e / (cd * T);
    const int64_t slot = slots[s];
    const float* h = hist + slot * K1 * cd;
    float acc = b[ch];
    for (int i = 0; i < K; ++i)
      acc = __fadd_rn(acc, __fmul_rn(w[ch * K + i], conv_input(h, proj, proj_stride, xbc_offset,
                                                               s * T, K1, cd, t + i, ch)));
    out[e] = silu_f32(acc);
    if (pending)
      pending[(slot * max_window + t) * cd + ch] =
          proj[(s * T + t) * proj_stride + xbc_offset + ch];
  }
}

// CPU: the history update of CpuModelOps::conv_silu (commit) and of conv_commit. Per (s, c):
// the new history row j (j < K-1) is input `shift + j` of the sequence [history ++ new inputs],
// the new inputs being `count` rows: prefill's T tokens from proj (pending == null) or the first
// `accepted[s]` rows of the slot's pending window. All K-1 values are read before any is written
// (the sequence overlaps the history it replaces).
__global__ void conv_shift_kernel(const int32_t* __restrict__ slots /*[S]*/,
                                  const int32_t* __restrict__ accepted /*[S] or null*/, int64_t S,
                                  int64_t T, int K, int64_t cd,
                                  const float* __restrict__ proj /*[S*T, proj_stride] or null*/,
                                  int64_t proj_stride, int64_t xbc_offset,
                                  const float* __restrict__ pending /*[slots, max_window, cd]*/,
                                  int max_window, float* __restrict__ hist /*[slots, K-1, cd]*/) {
  const int K1 = K - 1;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < S * cd;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = e % cd, s = e / cd, slot = slots[s];
    const int64_t shift = accepted ? accepted[s] : T;
    float* h = hist + slot * K1 * cd;
    float v[kMaxConvKernel];
    for (int j = 0; j < K1; ++j) {
      const int64_t i = shift + j;  // sequence index
      if (i < K1)
        v[j] = h[i * cd + ch];
      else if (accepted)
        v[j] = pending[(slot * max_window + i - K1) * cd + ch];
      else
        v[j] = proj[(s * T + i - K1) * proj_stride + xbc_offset + ch];
    }
    for (int j = 0; j < K1; ++j) h[j * cd + ch] = v[j];
  }
}

// CPU: CpuModelOps::split_xbc. Row r: x = xbc[r, 0:d_inner], B = xbc[r, d_inner:+GN],
// C = xbc[r, d_inner+GN:+GN] stored in `act` (fp32, or bf16 round-to-nearest-even as
// f32_to_bf16), dt = proj[r, dt_offset:+H] (fp32).
__global__ void split_xbc_kernel(const float* __restrict__ xbc, const float* __restrict__ proj,
                                 int64_t proj_stride, int64_t dt_offset, int64_t R, int64_t d_inner,
                                 int64_t GN, int64_t H, DType act, void* x, void* B, void* C,
                                 float* __restrict__ dt) {
  const int64_t cd = d_inner + 2 * GN, width = cd + H;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < R * width;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, c = e % width;
    if (c < d_inner)
      store_scalar(x, act, r * d_inner + c, xbc[r * cd + c]);
    else if (c < d_inner + GN)
      store_scalar(B, act, r * GN + c - d_inner, xbc[r * cd + c]);
    else if (c < cd)
      store_scalar(C, act, r * GN + c - d_inner - GN, xbc[r * cd + c]);
    else
      dt[r * H + c - cd] = proj[r * proj_stride + dt_offset + c - cd];
  }
}

// CPU: CpuModelOps::add (residual). acc_i = acc_i + x_i.
__global__ void add_kernel(float* __restrict__ acc, const float* __restrict__ x, int64_t n) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    acc[e] = __fadd_rn(acc[e], x[e]);
}

// CPU: the "+ b" of block_product (matmul.cpp). Y[m, n] = Y[m, n] + bias[n].
__global__ void bias_kernel(float* __restrict__ Y /*[M, N]*/, const float* __restrict__ bias,
                            int64_t M, int64_t N) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < M * N;
       e += int64_t(gridDim.x) * blockDim.x)
    Y[e] = __fadd_rn(Y[e], bias[e % N]);
}

// CPU: the bf16 widening of block_product. out_i = float(w_i) (exact).
__global__ void widen_bf16_kernel(const __nv_bfloat16* __restrict__ w, int64_t n,
                                  float* __restrict__ out) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    out[e] = __bfloat162float(w[e]);
}

// Y[M, N] = X[M, K] W[N, K]^T (+ bias) for a few token rows (M <= kMaxM), bf16 W read as
// stored: decode is a matrix-vector product whose cost is the weight bytes, so W is streamed
// once at 2 bytes per element (the cuBLAS path must widen bf16 W to fp32 first: 10 bytes per
// element moved instead of 2). Each warp owns kRows consecutive output rows; lane l takes the
// 8-element chunks k = 8 l, 8 l + 256, ... of those rows and of every X row (X is small and
// L1/L2-resident; it is read once per kRows weight rows), keeps kRows x kMaxM fp32 partial sums
// and reduces them over the warp at the end.
//   y[m, n] = sum_k float(w[n, k]) * x[m, k]     (fp32 products; the sum in another order than
//                                                 the CPU's, within its fp32 error bound)
// then + bias[n] rounded once (__fadd_rn), as bias_kernel does. K % 8 == 0 and 16-byte aligned
// rows of X and W (checked by the caller).
inline constexpr int kSkinnyWarps = 8;

template <int kMaxM, int kRows>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_matmul_bf16_kernel(const float* __restrict__ X /*[M, K]*/, int M,
                              const __nv_bfloat16* __restrict__ W /*[N, K]*/, int64_t N, int64_t K,
                              const float* __restrict__ bias /*[N] or null*/,
                              float* __restrict__ Y /*[M, N]*/) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kSkinnyWarps + (threadIdx.x >> 5)) * kRows;
  if (row0 >= N) return;  // whole warps leave together
  float acc[kRows][kMaxM];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) acc[r][m] = 0.f;
  for (int64_t k = 8 * lane; k < K; k += 256) {
    float w[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t n = min(row0 + r, N - 1);  // rows past N compute on a duplicate, never stored
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(W + n * K + k));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[r][2 * i] = __uint_as_float(words[i] << 16);  // bf16 -> fp32 is a shift (exact)
        w[r][2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
    }
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m >= M) break;
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(X + int64_t(m) * K + k));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(X + int64_t(m) * K + k + 4));
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][m] = fmaf(w[r][i], xv[i], acc[r][m]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < kMaxM; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t n = row0 + r;
    if (n >= N) break;
#pragma unroll
    for (int m = 0; m < kMaxM; ++m)
      if (m < M) Y[int64_t(m) * N + n] = bias ? __fadd_rn(acc[r][m], bias[n]) : acc[r][m];
  }
}

}  // namespace replayssm::cuda
