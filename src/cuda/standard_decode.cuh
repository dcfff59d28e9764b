// The standard-decode baseline kernel (SPEC section 1): every token reads and writes the whole
// state.
//
// Per slot b, head h (group g = h / (H/G)) and token t = 0..T-1:
//   delta = softplus(dt[b,t,h] + dt_bias[h]) clamped;  a = exp(delta * A[h])
//   S[p,n] = a * S[p,n] + (delta * x[b,t,h,p]) * B[b,t,g,n]
//   y[b,t,h,p] = sum_n S[p,n] * C[b,t,g,n] + D[h] * x[b,t,h,p]
// T == 1 writes S back in place; T > 1 writes S after token t to intermediate[b,t] and leaves
// `state` unchanged. fp16-sr rounds every written state stochastically (SPEC 6) with counter
// (element + t * H*P*N, step, slot), as the CPU reference; the recurrence itself stays in fp32
// registers.
//
// Mapping: a row (h, p) of N elements is held by N/8 consecutive lanes, 8 elements (16 or 32
// bytes) each; a thread keeps kRows rows in registers so that all its loads are in flight at once.
#pragma once

#include "cache/checkpoint_codec.h"
#include "core/philox.h"
#include "cuda/cuda_common.cuh"

namespace replayssm::cuda {

struct StandardDecodeParams {
  void* state;           // [S, H, P, N] state dtype
  const int32_t* slots;  // [B]
  const void* x;         // [B, T, H, P] activation dtype
  const void* B;         // [B, T, G, N] activation dtype
  const void* C;         // [B, T, G, N] activation dtype
  const float* dt;       // [B, T, H]
  void* y;               // [B, T, H, P] y_dtype
  void* intermediate;    // [B, T, H, P, N] state dtype, or nullptr when T == 1
  DType y_dtype;
  int batch, tokens, nheads, headdim, dstate, ngroups;
  int lanes_per_row;    // N / 8
  int rows_per_block;   // (threads / lanes_per_row) * kRows
  int blocks_per_head;  // ceil(P / rows_per_block)
  bool stochastic_rounding;
  int sr_bits, philox_rounds;
  U32x2 key;
  uint32_t step;
  HeadParams head;
};

template <typename StateT>
__device__ __forceinline__ void store_state8(StateT* dst, const float (&s)[8], bool sr,
                                             const StandardDecodeParams& p, uint64_t element,
                                             uint64_t request, uint32_t flush) {
  if constexpr (sizeof(StateT) == 4) {
    store8_f32(reinterpret_cast<float*>(dst), s);
  } else if constexpr (std::is_same_v<StateT, __nv_bfloat16>) {
    // cvt.rn.bf16x2.f32: the same bits as f32_to_bf16 (nearest even) for every finite value.
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);
    *reinterpret_cast<uint4*>(dst) = raw;
  } else {
    uint16_t v[8];
    if (sr) {
      // element % 8 == 0: the 8 values share one draw (checkpoint_codec.h's layout).
      const SrContext sr = make_sr_context(p.key, request, flush, p.sr_bits, p.philox_rounds);
      const U32x4 draw = philox4x32(sr_counter(sr, element), p.key, p.philox_rounds);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = f32_to_f16_sr(s[k], sr_random(draw, k), p.sr_bits);
      store8_u16(dst, v);
    } else {
      // cvt.rn.f16x2.f32: the same bits as f32_to_f16 (nearest even, overflow to Inf).
      uint4 raw;
      __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(s[2 * i], s[2 * i + 1]);
      *reinterpret_cast<uint4*>(dst) = raw;
    }
  }
}

template <typename StateT, typename ActT, int kRows>
__global__ void __launch_bounds__(128) standard_decode_kernel(const StandardDecodeParams p) {
  const int blk = blockIdx.x;
  const int b = blk / (p.nheads * p.blocks_per_head);
  const int h = (blk / p.blocks_per_head) % p.nheads;
  const int row_block = blk % p.blocks_per_head;
  const int slot = p.slots[b];
  if (slot < 0) return;
  const int g = h / (p.nheads / p.ngroups);
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  static_assert(kRows == 4, "one reduced row per lane group of four");
  const int rows_per_pass = blockDim.x / lanes;
  const int n0 = lane_in_row * 8;
  const int P = p.headdim, N = p.dstate, H = p.nheads, G = p.ngroups, T = p.tokens;

  int rows[kRows];
  bool valid[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] = row_block * p.rows_per_block + r * rows_per_pass + threadIdx.x / lanes;
    valid[r] = rows[r] < P;
  }

  StateT* state = static_cast<StateT*>(p.state) + (int64_t(slot) * H + h) * P * N;
  float s[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (valid[r]) {
      load8(state + int64_t(rows[r]) * N + n0, s[r]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) s[r][i] = 0.f;
    }
  }

  const float A = p.head.A[h], D = p.head.D[h];
  for (int t = 0; t < T; ++t) {
    const int64_t bt = int64_t(b) * T + t;
    const float delta =
        process_dt(p.dt[bt * H + h], p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
    const float a = expf(delta * A);
    float Bv[8], Cv[8];
    load8(static_cast<const ActT*>(p.B) + (bt * G + g) * N + n0, Bv);
    load8(static_cast<const ActT*>(p.C) + (bt * G + g) * N + n0, Cv);
    const ActT* x = static_cast<const ActT*>(p.x) + (bt * H + h) * P;
    float xv[kRows], acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      xv[r] = valid[r] ? to_f32(x[rows[r]]) : 0.f;
      const float dx = delta * xv[r];
      acc[r] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        s[r][i] = a * s[r][i] + dx * Bv[i];
        acc[r] += s[r][i] * Cv[i];
      }
    }
    // Row sums of the kRows accumulators by recursive halving: lane group r / (lanes / kRows)
    // ends with row r's total.
    const float total = row_sum_values<kRows>(acc, lane_in_row, lanes);
    const int mine = lane_in_row / (lanes / kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r)  // compile-time indices only (registers, no local memory)
      if (r == mine && lane_in_row % (lanes / kRows) == 0 && valid[r])
        store_scalar(p.y, p.y_dtype, (bt * H + h) * P + rows[r], total + D * xv[r]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (valid[r]) {
        // SR counter of the CPU reference: element = t * H*P*N + (h*P + p)*N + n, flush = step.
        const uint64_t element = uint64_t(t) * H * P * N + (uint64_t(h) * P + rows[r]) * N + n0;
        StateT* dst = (T == 1) ? state + int64_t(rows[r]) * N + n0
                               : static_cast<StateT*>(p.intermediate) +
                                     ((bt * H + h) * P + rows[r]) * int64_t(N) + n0;
        store_state8<StateT>(dst, s[r], p.stochastic_rounding, p, element, uint64_t(slot), p.step);
      }
    }
  }
}

}  // namespace replayssm::cuda
