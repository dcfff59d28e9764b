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
// Mapping: a row (h, p) of N elements is held by N / kElems consecutive lanes, kElems elements
// each: 32 bytes of state, i.e. 8 fp32 or 16 bf16 / fp16 values (8 when a 16-bit row is no
// multiple of 16). A thread keeps kRows rows in registers so that all its loads are in flight at
// once, and a 128-thread block moves 16 KiB whatever the state dtype. With 16 bytes per lane the
// bf16 kernel ran at 61-63% of the copy bandwidth on the H200 and the fp32 one at 88-92%; now
// 90-94% and 94-96% (bench/results/2026-11-30-h200-session7.md). At T > 1 the next token's inputs
// are loaded before the current token's states are written.
#pragma once

#include "cache/checkpoint_codec.h"
#include "core/philox.h"
#include "cuda/cuda_common.cuh"

namespace replayssm::cuda {

// Threads of a standard-decode block (the launcher's block size).
inline constexpr int kStandardThreads = 128;

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
  int lanes_per_row;    // N / kElems
  int rows_per_block;   // (threads / lanes_per_row) * kRows
  int blocks_per_head;  // ceil(P / rows_per_block)
  bool stochastic_rounding;
  int sr_bits, philox_rounds;
  U32x2 key;
  uint32_t step;
  HeadParams head;
  // T > 1 (after head, so that the offsets of the fields above stay those the T == 1 kernels
  // were tuned with): bytes from one token's B and C, x, y, intermediate state to the next one's.
  int64_t token_bytes_bc, token_bytes_x, token_bytes_y, token_bytes_state;
  int batch_base;  // standard_decode_tokens_kernel: the batch entry of blockIdx.z == 0
};

// 16 bytes at dst; kStream: st.global.cs (evict first: T > 1's intermediate states are written once
// and not read again by the kernel). The same bytes either way.
template <bool kStream>
__device__ __forceinline__ void store16(void* dst, uint4 raw) {
  if constexpr (kStream)
    __stcs(reinterpret_cast<uint4*>(dst), raw);
  else
    *reinterpret_cast<uint4*>(dst) = raw;
}

template <typename StateT, bool kStream = false>
__device__ __forceinline__ void store_state8(StateT* dst, const float (&s)[8], bool sr,
                                             const StandardDecodeParams& p, uint64_t element,
                                             uint64_t request, uint32_t flush) {
  if constexpr (sizeof(StateT) == 4) {
    const float4 lo = make_float4(s[0], s[1], s[2], s[3]), hi = make_float4(s[4], s[5], s[6], s[7]);
    store16<kStream>(dst, *reinterpret_cast<const uint4*>(&lo));
    store16<kStream>(dst + 4, *reinterpret_cast<const uint4*>(&hi));
  } else if constexpr (std::is_same_v<StateT, __nv_bfloat16>) {
    // cvt.rn.bf16x2.f32: the same bits as f32_to_bf16 (nearest even) for every finite value.
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(s[2 * i], s[2 * i + 1]);
    store16<kStream>(dst, raw);
  } else {
    if (sr) {
      // element % 8 == 0: the 8 values share one draw or half of one (checkpoint_codec.h).
      const SrContext sr = make_sr_context(p.key, request, flush, p.sr_bits, p.philox_rounds);
      const SrChunk chunk =
          sr_chunk(philox4x32(sr_counter(sr, element), p.key, p.philox_rounds), element, p.sr_bits);
      uint16_t v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = f32_to_f16_sr(s[k], sr_chunk_random(chunk, k), p.sr_bits);
      uint4 raw;
      uint16_t* h = reinterpret_cast<uint16_t*>(&raw);
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = v[k];
      store16<kStream>(dst, raw);
    } else {
      // cvt.rn.f16x2.f32: the same bits as f32_to_f16 (nearest even, overflow to Inf).
      uint4 raw;
      __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(s[2 * i], s[2 * i + 1]);
      store16<kStream>(dst, raw);
    }
  }
}

// The inputs of one token that every lane needs: B and C (its kElems columns), x (its rows), dt.
template <typename ActT, int kElems, int kRows>
struct TokenInputs {
  uint4 B[kElems * sizeof(ActT) / 16], C[kElems * sizeof(ActT) / 16];  // raw, converted on use
  ActT x[kRows];
  float dt;

  __device__ __forceinline__ void load(const StandardDecodeParams& p, int64_t bt, int h, int g,
                                       int n0, const int (&rows)[kRows],
                                       const bool (&valid)[kRows]) {
    const uint4* b = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) +
                                                    (bt * p.ngroups + g) * p.dstate + n0);
    const uint4* c = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.C) +
                                                    (bt * p.ngroups + g) * p.dstate + n0);
#pragma unroll
    for (int i = 0; i < int(kElems * sizeof(ActT) / 16); ++i) B[i] = b[i], C[i] = c[i];
    const ActT* xs = static_cast<const ActT*>(p.x) + (bt * p.nheads + h) * p.headdim;
#pragma unroll
    for (int r = 0; r < kRows; ++r) x[r] = valid[r] ? xs[rows[r]] : ActT(0.f);
    dt = p.dt[bt * p.nheads + h];
  }

  // T > 1: B, C and x from pointers that the token loop advances (dt is not used there).
  __device__ __forceinline__ void load(const ActT* b, const ActT* c, const ActT* const (&xs)[kRows],
                                       const bool (&valid)[kRows]) {
#pragma unroll
    for (int i = 0; i < int(kElems * sizeof(ActT) / 16); ++i)
      B[i] = reinterpret_cast<const uint4*>(b)[i], C[i] = reinterpret_cast<const uint4*>(c)[i];
#pragma unroll
    for (int r = 0; r < kRows; ++r) x[r] = valid[r] ? *xs[r] : ActT(0.f);
  }
};

// kElems values from raw 16-byte words of T.
template <typename T, int kElems>
__device__ __forceinline__ void unpack(const uint4* raw, float (&out)[kElems]) {
#pragma unroll
  for (int i = 0; i < kElems / 8; ++i) {
    float v[8];
    load8(reinterpret_cast<const T*>(raw) + 8 * i, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[8 * i + k] = v[k];
  }
}

// y of the thread's kRows rows: skip (D x) plus the sum of the partial dot products acc (one per
// row) over the `lanes` lanes of each row. Four or more lanes per row: recursive halving
// (lanes - 1 shuffles for all kRows sums), one lane per row stores; fewer (small dstate): every
// row by itself, lane 0 stores.
template <int kRows>
__device__ __forceinline__ void store_row_outputs(const StandardDecodeParams& p,
                                                  float (&acc)[kRows], int lane_in_row, int lanes,
                                                  int64_t y_row0, const int (&rows)[kRows],
                                                  const bool (&valid)[kRows],
                                                  const float (&skip)[kRows]) {
  if (lanes >= kRows) {
    const float total = row_sum_values<kRows>(acc, lane_in_row, lanes);
    const int mine = lane_in_row / (lanes / kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r)  // compile-time indices only (registers, no local memory)
      if (r == mine && lane_in_row % (lanes / kRows) == 0 && valid[r])
        store_scalar(p.y, p.y_dtype, y_row0 + rows[r], total + skip[r]);
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float total = row_sum(acc[r], lanes);
      if (lane_in_row == 0 && valid[r])
        store_scalar(p.y, p.y_dtype, y_row0 + rows[r], total + skip[r]);
    }
  }
}

// Eight values from the raw words of type T at raw (16 or 32 bytes). bf16: the bits of
// __bfloat162float by one shift or mask per value (the generic conversion extracts each upper half
// first: two instructions).
template <typename T>
__device__ __forceinline__ void unpack8(const uint4* raw, float (&out)[8]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w[4] = {raw->x, raw->y, raw->z, raw->w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    load8(reinterpret_cast<const T*>(raw), out);
  }
}

// ptr moved on by `bytes`.
template <typename T>
__device__ __forceinline__ void advance(T*& ptr, int64_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  ptr = reinterpret_cast<T*>(reinterpret_cast<Byte*>(ptr) + bytes);
}

// Whether T > 1 takes standard_decode_tokens_kernel: bf16 states only. H200, session 24, against
// standard_decode_kernel's loop in the same call (bench/results/2026-12-01-h200-session24.md): bf16
// T = 4 batch 64 229.9 -> 212.6 us (72.0 -> 77.9% of the copy bandwidth), batch 256 910.7 -> 829.0
// (72.7 -> 79.9%), T = 8 372.4 -> 361.2; but fp32 T = 4 371.4 -> 401.1 (88.6 -> 82.0%) and T = 8
// 694.7 -> 729.2, so fp32 (and fp16, not measured) states keep that loop and their code of before.
template <typename StateT>
constexpr bool standard_uses_token_loop() {
  return std::is_same_v<StateT, __nv_bfloat16>;
}

// Resident blocks per SM that the T > 1 kernel is compiled for (__launch_bounds__; 0: ptxas's
// choice). Left to itself, ptxas gives some of standard_decode_tokens_kernel's loops more registers
// than the loop of standard_decode_kernel had; these keep the blocks they had, without spills: 96
// registers (5 blocks) with 16-bit activations at 16 values per lane, 64 (8) at 8 (dstate 8), 128
// (4) with fp32 activations at 16 (149 by ptxas's choice). fp32 activations at dstate 8 take 80
// by ptxas's choice (72 on the old loop; 7 blocks would spill).
template <typename StateT, typename ActT, int kElems>
constexpr int standard_tokens_min_blocks() {
  if constexpr (!standard_uses_token_loop<StateT>()) return 0;
  if constexpr (sizeof(ActT) == 2) return kElems == 16 ? 5 : 8;
  return kElems == 16 ? 4 : 0;
}

// The token loop of T > 1 for bf16 states, as a kernel of its own. The same fp32 operations per
// element, in the same order, as the T == 1 loop of standard_decode_kernel; what differs is their
// bookkeeping:
// - the grid is (row block, head, batch entry): no divisions of the block index;
// - token 0's B, C, x and the block's dt values are loaded before the slot index, so that their
//   latency overlaps the slot -> state chain of round trips (they do not depend on the slot);
// - each token's inputs, y and intermediate state are reached through pointers formed once and
//   advanced by the launcher's per-token strides; the thread's rows are kThreads * kElems
//   elements apart in a state (a compile-time offset);
// - the decays: lane k of each warp forms delta and exp(delta A) of token t0 + k once for 32
//   tokens, and every token takes its pair by two shuffles (instead of loading dt and evaluating
//   softplus and exp in every thread and token);
// - the lane that stores y of a row, its output pointer and the output type are settled once
//   (the loop is instantiated for each y dtype).
// Its per-token math repeats the loop of standard_decode_kernel on purpose: one shared function
// for both moved register allocation and scheduling in 16 of the 30 kernels, those measured
// included (session 24, wip/std-token-step, not run on a GPU). The same holds for its state-row
// load: as one helper for both kernels it moved the scheduling of 8 of standard_decode_kernel's
// instantiations, the measured fp32 T > 1 and bf16 T = 1 baselines among them (session 26,
// cuobjdump), so the load is written out in each.
// Batch entries p.batch_base + blockIdx.z (the launcher splits batches above the grid's z limit).
template <typename StateT, typename ActT, int kElems, int kRows>
__global__ void __launch_bounds__(kStandardThreads,
                                  standard_tokens_min_blocks<StateT, ActT, kElems>())
    standard_decode_tokens_kernel(const StandardDecodeParams p) {
  constexpr int kThreads = kStandardThreads;
  constexpr int kRowStride = kThreads * kElems;  // rows[r + 1] * N - rows[r] * N
  constexpr int kChunks = kElems * sizeof(StateT) / 16;
  static_assert(kElems % 8 == 0 && (kChunks == 1 || kChunks == 2), "16 or 32 bytes per lane");
  const int row_block = blockIdx.x, h = blockIdx.y, b = p.batch_base + int(blockIdx.z);
  const int P = p.headdim, N = p.dstate, H = p.nheads, T = p.tokens;
  const int g = h / (H / p.ngroups);
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  const int n0 = lane_in_row * kElems;
  const int lane = threadIdx.x % 32;
  const int64_t bt0 = int64_t(b) * T;

  int rows[kRows];
  bool valid[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] = row_block * p.rows_per_block + r * (kThreads / lanes) + threadIdx.x / lanes;
    valid[r] = rows[r] < P;
  }

  // Token 0's inputs and the raw dt of tokens 0..31 first: none depends on the slot.
  const ActT* Bp = static_cast<const ActT*>(p.B) + (bt0 * p.ngroups + g) * N + n0;
  const ActT* Cp = static_cast<const ActT*>(p.C) + (bt0 * p.ngroups + g) * N + n0;
  const ActT* xp[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    xp[r] = static_cast<const ActT*>(p.x) + (bt0 * H + h) * P + (valid[r] ? rows[r] : 0);
  TokenInputs<ActT, kElems, kRows> in;
  in.load(Bp, Cp, xp, valid);
  float dt_lane = lane < T ? p.dt[(bt0 + lane) * H + h] : 0.f;  // of token t0 + lane

  const int slot = p.slots[b];
  if (slot < 0) return;
  const StateT* state = static_cast<const StateT*>(p.state) + (int64_t(slot) * H + h) * P * N;
  float s[kRows][kElems];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (valid[r]) {
      const uint4* src = reinterpret_cast<const uint4*>(state + int64_t(rows[r]) * N + n0);
      uint4 raw[kChunks];
#pragma unroll
      for (int i = 0; i < kChunks; ++i) raw[i] = src[i];
      unpack<StateT, kElems>(raw, s[r]);
    } else {
#pragma unroll
      for (int i = 0; i < kElems; ++i) s[r][i] = 0.f;
    }
  }

  // y: lanes >= kRows: lane_in_row / (lanes / kRows) is the row whose sum the lane ends with
  // (row_sum_values), and the first lane of each such group stores it; fewer lanes: every row's
  // sum is in every lane and lane 0 stores all kRows (rows_per_pass apart).
  const bool halving = lanes >= kRows;
  const int mine = halving ? lane_in_row / (lanes / kRows) : 0;
  bool mine_valid = false;
  int mine_row = rows[0];
#pragma unroll
  for (int r = 0; r < kRows; ++r)  // compile-time indices only (registers, no local memory)
    if (r == mine) mine_valid = valid[r], mine_row = rows[r];
  const bool y_lane = halving ? lane_in_row % (lanes / kRows) == 0 && mine_valid : lane_in_row == 0;
  const int y_row_step = kThreads / lanes;  // rows_per_pass

  StateT* ip =
      static_cast<StateT*>(p.intermediate) + ((bt0 * H + h) * P + rows[0]) * int64_t(N) + n0;
  // SR counter of the CPU reference: element = t * H*P*N + (h*P + p)*N + n, flush = step.
  uint64_t element = (uint64_t(h) * P + rows[0]) * N + n0;

  const float A = p.head.A[h], D = p.head.D[h];
  with_output_type(p.y, p.y_dtype, [&](auto* y) {
    using YT = std::remove_pointer_t<decltype(y)>;
    YT* yp = y + (bt0 * H + h) * P + mine_row;
    for (int t0 = 0; t0 < T; t0 += 32) {
      if (t0 > 0) dt_lane = t0 + lane < T ? p.dt[(bt0 + t0 + lane) * H + h] : 0.f;
      float delta_lane = 0.f, a_lane = 0.f;  // of token t0 + lane
      if (t0 + lane < T) {
        delta_lane = process_dt(dt_lane, p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
        a_lane = expf(delta_lane * A);
      }
      const int tokens = min(T - t0, 32);
      for (int k = 0; k < tokens; ++k) {
        const TokenInputs<ActT, kElems, kRows> cur = in;
        if (t0 + k + 1 < T) {  // the next token's inputs, during this token
          advance(Bp, p.token_bytes_bc), advance(Cp, p.token_bytes_bc);
#pragma unroll
          for (int r = 0; r < kRows; ++r) advance(xp[r], p.token_bytes_x);
          in.load(Bp, Cp, xp, valid);
        }
        const float delta = __shfl_sync(0xffffffffu, delta_lane, k);
        const float a = __shfl_sync(0xffffffffu, a_lane, k);
        float dx[kRows], skip[kRows], acc[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float xv = to_f32(cur.x[r]);
          dx[r] = delta * xv;
          skip[r] = D * xv;
          acc[r] = 0.f;
        }
#pragma unroll
        for (int c = 0; c < kElems / 8; ++c) {
          float Bv[8], Cv[8];
          unpack8<ActT>(cur.B + c * 8 * sizeof(ActT) / 16, Bv);
          unpack8<ActT>(cur.C + c * 8 * sizeof(ActT) / 16, Cv);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              float& v = s[r][8 * c + i];
              v = a * v + dx[r] * Bv[i];
              acc[r] += v * Cv[i];
            }
          }
        }
        if (halving) {
          const float total = row_sum_values<kRows>(acc, lane_in_row, lanes);
          float skip_mine = skip[0];
#pragma unroll
          for (int r = 1; r < kRows; ++r)
            if (r == mine) skip_mine = skip[r];
          if (y_lane) *yp = output_from_f32<YT>(total + skip_mine);
        } else {
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float total = row_sum(acc[r], lanes);
            if (lane_in_row == 0 && valid[r])
              yp[r * y_row_step] = output_from_f32<YT>(total + skip[r]);
          }
        }
        advance(yp, p.token_bytes_y);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (valid[r]) {
#pragma unroll
            for (int i = 0; i < kElems / 8; ++i) {
              float v[8];
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] = s[r][8 * i + j];
              store_state8<StateT, true>(ip + r * kRowStride + 8 * i, v, p.stochastic_rounding, p,
                                         element + r * kRowStride + 8 * i, uint64_t(slot), p.step);
            }
          }
        }
        advance(ip, p.token_bytes_state);
        element += p.token_bytes_state / sizeof(StateT);
      }
    }
  });
}

// kOneToken: T == 1 known at compile time, so nothing lives across tokens (bf16 state, 16 values
// per lane and row: 124 registers instead of 168, 4 resident blocks per SM instead of 3). T > 1
// with a bf16 state takes standard_decode_tokens_kernel instead.
template <typename StateT, typename ActT, int kElems, int kRows, bool kOneToken>
__global__ void __launch_bounds__(kStandardThreads, 0)
    standard_decode_kernel(const StandardDecodeParams p) {
  static_assert(kOneToken || !standard_uses_token_loop<StateT>(), "standard_decode_tokens_kernel");
  constexpr int kChunks = kElems * sizeof(StateT) / 16;  // 16-byte words of state per lane and row
  static_assert(kElems % 8 == 0 && (kChunks == 1 || kChunks == 2), "16 or 32 bytes per lane");
  const int blk = blockIdx.x;
  const int b = blk / (p.nheads * p.blocks_per_head);
  const int h = (blk / p.blocks_per_head) % p.nheads;
  const int row_block = blk % p.blocks_per_head;
  const int slot = p.slots[b];
  if (slot < 0) return;
  const int g = h / (p.nheads / p.ngroups);
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  const int rows_per_pass = blockDim.x / lanes;
  const int n0 = lane_in_row * kElems;
  const int P = p.headdim, N = p.dstate, H = p.nheads, T = kOneToken ? 1 : p.tokens;

  int rows[kRows];
  bool valid[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    rows[r] = row_block * p.rows_per_block + r * rows_per_pass + threadIdx.x / lanes;
    valid[r] = rows[r] < P;
  }

  StateT* state = static_cast<StateT*>(p.state) + (int64_t(slot) * H + h) * P * N;
  float s[kRows][kElems];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (valid[r]) {
      const uint4* src = reinterpret_cast<const uint4*>(state + int64_t(rows[r]) * N + n0);
      uint4 raw[kChunks];
#pragma unroll
      for (int i = 0; i < kChunks; ++i) raw[i] = src[i];
      unpack<StateT, kElems>(raw, s[r]);
    } else {
#pragma unroll
      for (int i = 0; i < kElems; ++i) s[r][i] = 0.f;
    }
  }

  const float A = p.head.A[h], D = p.head.D[h];
  TokenInputs<ActT, kElems, kRows> in;
  in.load(p, int64_t(b) * T, h, g, n0, rows, valid);
  for (int t = 0; t < T; ++t) {
    const int64_t bt = int64_t(b) * T + t;
    const TokenInputs<ActT, kElems, kRows> cur = in;
    if (!kOneToken && t + 1 < T) in.load(p, bt + 1, h, g, n0, rows, valid);  // during this token
    const float delta = process_dt(cur.dt, p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
    const float a = expf(delta * A);
    float dx[kRows], skip[kRows], acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float xv = to_f32(cur.x[r]);
      dx[r] = delta * xv;
      skip[r] = D * xv;
      acc[r] = 0.f;
    }
    // Eight columns at a time: B and C are converted from their raw words as they are used.
#pragma unroll
    for (int c = 0; c < kElems / 8; ++c) {
      float Bv[8], Cv[8];
      load8(reinterpret_cast<const ActT*>(cur.B) + 8 * c, Bv);
      load8(reinterpret_cast<const ActT*>(cur.C) + 8 * c, Cv);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float& v = s[r][8 * c + i];
          v = a * v + dx[r] * Bv[i];
          acc[r] += v * Cv[i];
        }
      }
    }
    store_row_outputs<kRows>(p, acc, lane_in_row, lanes, (bt * H + h) * P, rows, valid, skip);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (valid[r]) {
        StateT* dst = (T == 1) ? state + int64_t(rows[r]) * N + n0
                               : static_cast<StateT*>(p.intermediate) +
                                     ((bt * H + h) * P + rows[r]) * int64_t(N) + n0;
#pragma unroll
        for (int i = 0; i < kElems / 8; ++i) {
          // SR counter of the CPU reference: element = t * H*P*N + (h*P + p)*N + n, flush = step.
          const uint64_t element =
              uint64_t(t) * H * P * N + (uint64_t(h) * P + rows[r]) * N + n0 + 8 * i;
          float v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = s[r][8 * i + k];
          store_state8<StateT>(dst + 8 * i, v, p.stochastic_rounding, p, element, uint64_t(slot),
                               p.step);
        }
      }
    }
  }
}

}  // namespace replayssm::cuda
