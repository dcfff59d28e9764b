// Small device helpers shared by the CUDA kernels: error checks, 8-element vector loads and stores
// of the activation / state types, the dt processing of SPEC section 2, and warp reductions over
// the lanes that hold one state row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/formats.h"
#include "replayssm/error.h"
#include "replayssm/types.h"

#define RSSM_CUDA_CHECK(expr)                                                                     \
  do {                                                                                            \
    const cudaError_t rssm_status_ = (expr);                                                      \
    if (rssm_status_ != cudaSuccess)                                                              \
      ::replayssm::fail("CUDA error '", cudaGetErrorString(rssm_status_), "' at ", __FILE__, ":", \
                        __LINE__, " in ", #expr);                                                 \
  } while (0)

namespace replayssm::cuda {

// Largest number of heads whose per-head scalars travel inside a kernel's parameter struct.
inline constexpr int kMaxHeads = 512;

// Per-head scalars of one layer, passed by value (graph capture needs no device allocation).
struct HeadParams {
  float A[kMaxHeads];        // -exp(A_log)
  float dt_bias[kMaxHeads];  // added to the raw dt before softplus
  float D[kMaxHeads];        // skip connection
  float dt_min;
  float dt_max;
};

HeadParams make_head_params(const SsmShape& shape, const LayerParams& params);

// delta = softplus(dt + dt_bias), softplus(u) = u for u > 20, then clamp to [dt_min, dt_max].
__device__ __forceinline__ float process_dt(float dt, float bias, float dt_min, float dt_max) {
  const float u = dt + bias;
  float delta = u > 20.f ? u : log1pf(expf(u));
  delta = fmaxf(delta, dt_min);
  delta = fminf(delta, dt_max);
  return delta;
}

// One head's scalars, for the kernels of small batches, which load them at their start, with
// their first round of loads: they are kernel parameters (no grid writes them, so
// small_verify_kernel loads them before its wait for the previous grid), and an indexed parameter
// misses the constant cache of an SM that runs no other block of the head, a round trip that the
// step's chain would otherwise wait for where it first uses each of them.
struct HeadScalars {
  float A, dt_bias, D, dt_min, dt_max;
  __device__ static HeadScalars load(const HeadParams& head, int h) {
    HeadScalars s{head.A[h], head.dt_bias[h], head.D[h], head.dt_min, head.dt_max};
    // Opaque from here, so loaded here and held in registers: the compiler would otherwise load
    // an invariant parameter where it is first used.
    asm volatile("" : "+f"(s.A), "+f"(s.dt_bias), "+f"(s.D), "+f"(s.dt_min), "+f"(s.dt_max));
    return s;
  }
  __device__ float delta(float dt) const { return process_dt(dt, dt_bias, dt_min, dt_max); }
};

// exp(min(arg, 0)): every decay of SPEC section 3 has a non-positive exponent in exact arithmetic.
__device__ __forceinline__ float decay(float arg) { return expf(fminf(arg, 0.f)); }

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}

// Eight 16-bit values (T: __half or __nv_bfloat16) from their 16-byte vector.
template <typename T>
__device__ __forceinline__ void convert8(const uint4& raw, float (&out)[8]) {
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = to_f32<T>(h[i]);
}

// Eight consecutive elements, 16-byte aligned for 2-byte types and 32-byte for fp32.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    convert8<T>(*reinterpret_cast<const uint4*>(p), out);
  }
}

// Activations of the replay cache: fp32, or 16-bit storage that is bf16 or fp16 by a runtime flag
// (one instantiation for both 16-bit types).
template <typename ActT>
__device__ __forceinline__ float act_f32(ActT v, bool f16) {
  if constexpr (sizeof(ActT) == 4) {
    return v;
  } else {
    return f16 ? __half2float(__ushort_as_half(v)) : __uint_as_float(uint32_t(v) << 16);
  }
}

// The 8 activations of raw (one 16-byte vector of 16-bit values, two of fp32), as load8_act
// converts them: one uniform branch on the 16-bit type.
template <typename ActT>
__device__ __forceinline__ void convert8_act(const uint4 (&raw)[sizeof(ActT) / 2], bool f16,
                                             float (&out)[8]) {
  if constexpr (sizeof(ActT) == 4) {
    const uint32_t w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w,
                           raw[1].x, raw[1].y, raw[1].z, raw[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __uint_as_float(w[i]);
  } else if (f16) {
    convert8<__half>(raw[0], out);
  } else {
    convert8<__nv_bfloat16>(raw[0], out);
  }
}

template <typename ActT>
__device__ __forceinline__ void load8_act(const ActT* p, bool f16, float (&out)[8]) {
  if constexpr (sizeof(ActT) == 4) {
    load8(p, out);
  } else if (f16) {
    load8(reinterpret_cast<const __half*>(p), out);
  } else {
    load8(reinterpret_cast<const __nv_bfloat16*>(p), out);
  }
}

// Eight raw 16-bit codes.
__device__ __forceinline__ void load8_u16(const void* p, uint16_t (&out)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = h[i];
}

__device__ __forceinline__ void store8_u16(void* p, const uint16_t (&v)[8]) {
  uint4 raw;
  uint16_t* h = reinterpret_cast<uint16_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = v[i];
  *reinterpret_cast<uint4*>(p) = raw;
}

// The same 16 bytes as 4 words, code 2i in the low half of word i.
__device__ __forceinline__ void store8_u16(void* p, const uint32_t (&words)[4]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ void store8_f32(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ __forceinline__ float load_scalar(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return __half2float(static_cast<const __half*>(p)[i]);
  }
}

// The converted value of a float as an output element of type YT (fp32, bf16 or fp16).
template <typename YT>
__device__ __forceinline__ YT output_from_f32(float v) {
  if constexpr (std::is_same_v<YT, float>)
    return v;
  else if constexpr (std::is_same_v<YT, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

// f(YT*) with the output type of `dtype`: a loop of stores inside f switches on it once.
template <typename F>
__device__ __forceinline__ void with_output_type(void* y, DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(static_cast<float*>(y));
    case DType::bf16:
      return f(static_cast<__nv_bfloat16*>(y));
    default:
      return f(static_cast<__half*>(y));
  }
}

__device__ __forceinline__ void store_scalar(void* p, DType dtype, int64_t i, float v) {
  with_output_type(p, dtype, [&](auto* y) {
    using YT = std::remove_pointer_t<decltype(y)>;
    y[i] = output_from_f32<YT>(v);
  });
}

// Row reductions over `lanes` (a power of two <= 32) lanes, halving from lanes / 2 down to 1.
// The offsets are unrolled and each step is predicated on lanes (uniform): the same additions in
// the same order as a loop, without its branch per step.
__device__ __forceinline__ float row_sum(float v, int lanes) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    if (o < lanes) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// NaN-sticky max of magnitudes, the rule of formats.h's row_amax (max is order independent).
__device__ __forceinline__ float amax_combine(float m, float a) {
  float r;  // max.NaN: NaN if either is NaN, else the larger (one FMNMX.NAN)
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(a));
  return r;
}
// The amax of each m[r] over the `lanes` lanes of its row, for K rows at once (one exchange of
// every row per level, so that the K chains of shuffles overlap; every lane of the warp takes
// part, whatever its rows' values: no exchange sits behind a branch). The exchanges go up from
// offset 1, so that after the first one pair[r] holds the amax of lanes (lane, lane ^ 1). lanes is
// 8, 16 or 32 (the replay rows: dstate / 8, and cuda_backend.cu admits dstate 64, 128 and 256
// only), so the offsets 1, 2 and 4 are always taken; 8 and 16 go through o & (lanes - 1), o while o
// < lanes and otherwise 0, the lane's own value, which leaves the max as it is. At nemotron-h-8b's
// dstate (16 lanes) that is one idle exchange instead of a uniform compare and branch around each
// of five. The max is order independent (amax_combine).
template <int K>
__device__ __forceinline__ void row_amax(float (&m)[K], int lanes, float (&pair)[K]) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
    for (int r = 0; r < K; ++r)
      m[r] = amax_combine(m[r], __shfl_xor_sync(0xffffffffu, m[r], o < 8 ? o : o & (lanes - 1)));
    if (o == 1)
#pragma unroll
      for (int r = 0; r < K; ++r) pair[r] = m[r];
  }
}

// One halving exchange of row_sum_values per level, Half pairs at a time, by template
// recursion: for 16 values the loop over levels was left rolled and the array put in local memory
// (a 64-byte stack frame in small_verify_kernel).
template <int K, int Half>
__device__ __forceinline__ void halve_values(float (&v)[K], int lane_in_row, int o) {
  const bool upper = (lane_in_row & o) != 0;
#pragma unroll
  for (int i = 0; i < Half; ++i) {
    const float send = upper ? v[i] : v[i + Half];
    const float keep = upper ? v[i + Half] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
  }
  if constexpr (Half > 1) halve_values<K, Half / 2>(v, lane_in_row, o >> 1);
}

// Reduces K per-lane values (K = 1, 2, 4, 8 or 16) over the `lanes` (>= K, a power of two)
// lanes of a row by recursive halving: each exchange sends half of the remaining values to the
// partner lane, so the K sums take lanes - 1 shuffles instead of K log2(lanes). Returns the full
// sum of value index lane_in_row / (lanes / K).
template <int K>
__device__ __forceinline__ float row_sum_values(float (&v)[K], int lane_in_row, int lanes) {
  int o = lanes >> 1;
  if constexpr (K >= 16) {
    halve_values<K, K / 2>(v, lane_in_row, o);
    o >>= __builtin_ctz(K);
  } else {
#pragma unroll
    for (int half = K / 2; half >= 1; half /= 2) {
      const bool upper = (lane_in_row & o) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
      }
      o >>= 1;
    }
  }
  float s = v[0];
  for (; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Five per-lane values over the `lanes` (>= 4, a power of two) lanes of a row (a head of 5 row
// passes, nemotron3-nano-4b's 80 rows at 16 lanes per row): the first four by recursive halving,
// whose sum of value lane_in_row / (lanes / 4) is returned, the fifth by a plain reduction into
// `fifth` (every lane): lanes + 3 shuffles, where two groups of 4 took 2 (lanes - 1).
__device__ __forceinline__ float row_sum_values(float (&v)[5], int lane_in_row, int lanes,
                                                float& fifth) {
  float four[4] = {v[0], v[1], v[2], v[3]};
  fifth = v[4];
  for (int o = lanes >> 1; o > 0; o >>= 1) fifth += __shfl_xor_sync(0xffffffffu, fifth, o);
  return row_sum_values<4>(four, lane_in_row, lanes);
}

// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may be
// scheduled while the kernel before it in the stream is still running, which hides the launch
// latency of a chain of small kernels (a decode step at batch 1). Such a kernel calls
// wait_for_previous_grid() before it touches memory: that returns once the previous grid has
// completed and its writes are visible, so results are those of a plain launch. After a plain
// launch, or before sm_90, it returns at once.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the kernel launched dependent on this one start before this grid completes (once every
// block has called it or exited); it still waits in wait_for_previous_grid() for what it reads.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A launch by cudaLaunchKernelEx: `dependent`, a programmatic dependent launch (above); a
// `carveout` of 0..100, this launch's preferred shared-memory carveout in percent of the largest
// (cudaLaunchAttributePreferredSharedMemoryCarveout: for this launch only, where the function
// attribute would stay with the kernel), -1 the driver's choice.
template <typename... KernelArgs, typename... Args>
void launch_ex(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
               cudaStream_t stream, bool dependent, int carveout, Args... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned count = 0;
  if (dependent) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (carveout >= 0) {
    attrs[count].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[count++].val.sharedMemCarveout = unsigned(carveout);
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  RSSM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, KernelArgs(args)...));
}

template <typename... KernelArgs, typename... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args... args) {
  launch_ex(kernel, grid, block, smem, stream, true, -1, args...);
}

// d += A B for one m16n8k16 step in bf16 (A: 16 x 16 rows, B: 16 x 8 columns, d: fp32).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values rounded to bf16 (round to nearest even), packed low-first; each value is left
// holding what the rounding dropped (exact in fp32).
__device__ __forceinline__ uint32_t bf16x2_split(float& lo, float& hi) {
  const __nv_bfloat16 a = __float2bfloat16_rn(lo), b = __float2bfloat16_rn(hi);
  lo -= __bfloat162float(a);
  hi -= __bfloat162float(b);
  return uint32_t(__bfloat16_as_ushort(a)) | (uint32_t(__bfloat16_as_ushort(b)) << 16);
}

}  // namespace replayssm::cuda
