// Kernels of the CUDA replay cache (SPEC sections 3-5). A row (h, p) of N elements is held by
// N/8 consecutive lanes, 8 elements each (RowMap), and a thread keeps several rows so that their
// checkpoint loads are all in flight together.
//
// verify (window W, committed c, running sums L_k = delta_0 + ... + delta_k), launches in order:
//   validate_tokens  open, nothing pending, finite inputs; lists the entries that flush (c + W > L)
//   flush            S = fold(decode(rec), entries 0..c-1) in fp32, encoded; the window then
//                    starts at logical 0 of an empty ring (c' = 0)
//   verify           for j = 0..W-1 at logical position i = c' + j:
//                      y_j = exp(A L_i) * scale * sum_n R[p,n] C_j[n]   (R: read checkpoint values)
//                          + sum_{k <= i} delta_k exp(A (L_i - L_k)) (B_k . C_j) x_k[p] + D x_j[p]
//                    the window's ring x, delta and B, and (the last block of each entry) the
//                    cursors
// Decode steps (W = 1) of small batches whose verify blocks hold one head each run as one launch
// of verify (VerifyVariant::one_launch): each block validates its entry and folds its own head
// where the entry flushes. An explicit flush runs validate_slots (lists the slots to fold), flush
// and flush_finalize. In the 8/4-bit read modes R are code values (exact in bf16) and C_j is
// rounded to bf16 (BF16 readout rule); products are exact in fp32 and summed in fp32.
#pragma once

#include "cache/cursors.h"
#include "core/fast_div.h"
#include "cuda/replay_codec.cuh"

namespace replayssm::cuda {

inline constexpr int kMaxWindow = 8;      // W <= 8 (the readout reduces 8 values per butterfly)
inline constexpr int kMaxHistory = 32;    // L <= 32
inline constexpr int kStepThreads = 256;  // prefill and state kernels
inline constexpr int kStepRows = 4;       // rows per thread and pass

// Error codes of the device error word (docs/cuda.md).
enum DeviceErrorCode : int32_t {
  kErrNone = 0,
  kErrSlotClosed = 1,      // operation on a slot that is not open
  kErrNonFiniteInput = 2,  // NaN/Inf in x, B, C or dt
  kErrCommitRange = 3,     // accepted outside 1..pending
  kErrPending = 4,         // verify / prefill while the last verify is not committed
};

struct DeviceError {
  int32_t code;  // first error since the last check
  int32_t slot;
  int32_t value;  // offending value (accepted count, ...)
  int32_t count;  // errors since the last check
};

struct DeviceStats {
  unsigned long long flushes;
  unsigned long long saturated;
  unsigned long long checkpoint_writes;
  unsigned long long nonfinite;
};

__device__ __forceinline__ void raise_error(DeviceError* err, int32_t code, int32_t slot,
                                            int32_t value) {
  if (atomicCAS(&err->code, 0, code) == 0) {
    err->slot = slot;
    err->value = value;
  }
  atomicAdd(&err->count, 1);
}

// A batch entry with what validate_tokens read for it: every entry's in ReplayParams::entries
// (the chained verify), the flushing ones' also in the flush list. A flush item or a verify
// block then needs one dependent load (this) before its checkpoint and ring loads instead of
// slots[b] -> cursors[slot].
struct ValidatedEntry {
  SlotCursors cursors;  // as validated (no kernel between validation and verify changes them)
  int32_t b;            // batch entry (its status words)
  int32_t slot;
};

struct ReplayParams {
  SlotGeometry geo;
  SlotCursors* cursors;  // [num_slots]
  int32_t* status;       // [B, kValidateSplit] all 0 = this entry takes part
  DeviceError* error;
  DeviceStats* stats;
  const int32_t* slots;  // [B]
  int batch;
  int tokens;       // W (verify) or T (prefill); 0 for an explicit flush
  const void* x;    // [B, T, H, P] activation dtype
  const void* B;    // [B, T, G, N] activation dtype
  const void* C;    // [B, T, G, N] activation dtype
  const float* dt;  // [B, T, H]
  void* y;          // [B, T, H, P] y_dtype
  DType y_dtype;
  bool list_flushes;   // verify: validate_tokens lists the entries that flush
  bool commit_window;  // verify: commit the whole window too (decode: verify W = 1 + commit 1)
  bool act_f16;        // 16-bit activations are fp16 (else bf16)
  int H, P, N, G, L;
  int lanes_per_row;       // N / 8
  FastDiv by_heads;        // item / H: the batch entry of a flush item (entry, head)
  FastDiv by_group_heads;  // h / (H / G): the group of head h
  U32x2 key;
  PhiloxKeys10 keys10;  // philox_keys10(key)
  int sr_bits, philox_rounds;
  HeadParams head;
  ValidatedEntry* flush_list;  // [B] entries that flush (listed by the validate kernels)
  int32_t* flush_count;        // 0 before the validate kernel (flush_kernel's last block clears it)
  int32_t* flush_done;         // flush_kernel blocks finished so far (0 between launches)
  int32_t* arrivals;           // [B] verify blocks of each entry done so far (0 between verifies)
  // [B] validate_tokens: each validated entry's slot and cursors, so that a chained verify block
  // finds them in one load instead of the slots[b] -> cursors[slot] chain of two
  ValidatedEntry* entries;
  int heads_per_block;  // verify_kernel: heads of one group per block
  // state / import: one slot, fp32 [H, P, N] buffer, `at` entries folded
  float* dense;
  int at;
};

__device__ __forceinline__ SrContext make_sr(const ReplayParams& p, const SlotCursors& c) {
  return SrContext{p.key, c.request_id, c.flush_index, p.sr_bits, p.philox_rounds, p.keys10};
}

// Per batch entry, kValidateSplit status words (one per validating block): the entry takes part
// in the operation when all are 0.
inline constexpr int kValidateSplit = 8;

__device__ __forceinline__ bool slot_ok(const ReplayParams& p, int b) {
  const int4* st = reinterpret_cast<const int4*>(p.status + b * kValidateSplit);
  const int4 a = st[0], c = st[1];
  return (a.x | a.y | a.z | a.w | c.x | c.y | c.z | c.w) == 0;
}

// True when one of the values packed in 16 bytes is NaN or Inf (exponent field all ones).
template <typename ActT>
__device__ __forceinline__ bool nonfinite16(const uint4 v, bool f16) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(ActT) == 4) {
      bad |= (w[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint32_t m = f16 ? 0x7c00u : 0x7f80u;
      bad |= (w[i] & m) == m || ((w[i] >> 16) & m) == m;
    }
  }
  return bad;
}

// Whether this thread's share of batch entry b's inputs (x, B, C and dt of every token) holds a
// NaN or Inf: the 16-byte vectors first, first + stride, ..., then the dt values likewise.
template <typename ActT>
__device__ __forceinline__ bool entry_has_nonfinite(const ReplayParams& p, int b, int64_t first,
                                                    int64_t stride) {
  const int T = p.tokens;
  const int64_t nx = int64_t(T) * p.H * p.P, nb = int64_t(T) * p.G * p.N, nd = int64_t(T) * p.H;
  const int64_t ux = nx * int64_t(sizeof(ActT)) / 16, ub = nb * int64_t(sizeof(ActT)) / 16;
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + b * nx);
  const uint4* Bm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) + b * nb);
  const uint4* Cm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.C) + b * nb);
  const float* dt = p.dt + b * nd;
  const int64_t total = ux + 2 * ub;
  bool bad = false;
#pragma unroll 8  // several of a thread's loads in flight together
  for (int64_t u = first; u < total; u += stride) {
    const uint4 v = u < ux ? x[u] : (u < ux + ub ? Bm[u - ux] : Cm[u - ux - ub]);
    bad |= nonfinite16<ActT>(v, p.act_f16);
  }
  for (int64_t i = first; i < nd; i += stride) bad |= !isfinite(dt[i]);
  return bad;
}

// The checks of validate_tokens_kernel made by a verify block for its own entry (one-launch
// step): open, nothing pending, finite inputs. Every block of the entry reaches the same answer;
// the one with `report` raises the error. Uniform over the block.
template <typename ActT>
__device__ bool entry_valid(const ReplayParams& p, int b, int slot, bool report) {
  const SlotCursors cur = p.cursors[slot];
  if (!cur.live || cur.pending != 0) {
    if (report && threadIdx.x == 0)
      raise_error(p.error, cur.live ? kErrPending : kErrSlotClosed, slot, cur.pending);
    return false;
  }
  const bool bad = __syncthreads_or(entry_has_nonfinite<ActT>(p, b, threadIdx.x, blockDim.x));
  if (bad && report && threadIdx.x == 0) raise_error(p.error, kErrNonFiniteInput, slot, 0);
  return !bad;
}

// Shared memory of verify_kernel (one per (slot, group) block), carved from one dynamic buffer;
// `windows` = W rounded up as the kernel is specialised (1, 4 or 8), `heads` = heads per block,
// `mma`: the tensor-core readout of the 8/4-bit read modes (its B fragments).
struct StepSmem {
  float* B;    // [L, N]         entries the readout sees: committed, then the window
  float* C;    // [windows, N]
  float* Cr;   // [windows, N]   C rounded to bf16 in the 8/4-bit read modes (else == C)
  float* dot;  // [windows, L]   B_k . C_j (k <= c + j, else 0)
  // Per head, for the tensor-core readout at W > 1, two buffers (head parity): the next head's
  // are formed while the current one's are read.
  float* w;    // [2, windows, L]  w_jk (+ D when k = i)
  float* dec;  // [2, windows]     exp(A L_i)
  // W = 1: the weights of every head of the block, formed once before the readout.
  float* head_delta;  // [heads, L]  delta_k of each head
  float* head_w;      // [heads, L]  w_k (+ D when k = i)
  float* head_dec;    // [heads]     exp(A L_i)
  // Tensor-core readout: B fragments of the window's C (build_c_fragments).
  float* c_unscale;  // [8]           undoes C_j's fp16 scaling and the decoder's own factor
  uint2* c_frag;     // [N / 16, 32]  k-step s, lane

  __host__ __device__ static size_t head_floats(int L, int windows, int heads) {
    return windows == 1 ? size_t(heads) * (2 * L + 1) : 0;
  }
  __host__ __device__ static size_t bytes(int L, int N, int windows, int heads, bool mma) {
    const size_t floats =
        size_t(L) * N + size_t(windows) * (2 * N + 3 * L + 2) + head_floats(L, windows, heads) + 8;
    const size_t frag_offset = (sizeof(float) * floats + 15) / 16 * 16;
    return frag_offset + (mma ? size_t(N) / 16 * 32 * sizeof(uint2) : 0);  // 16-byte multiple
  }
  __device__ static StepSmem carve(float* base, int L, int N, int windows, int heads) {
    StepSmem s;
    s.B = base;
    s.C = s.B + L * N;
    s.Cr = s.C + windows * N;
    s.dot = s.Cr + windows * N;
    s.w = s.dot + windows * L;
    s.dec = s.w + 2 * windows * L;
    s.head_delta = s.dec + 2 * windows;
    s.head_w = s.head_delta + heads * L;
    s.head_dec = s.head_w + heads * L;
    s.c_unscale = s.head_delta + head_floats(L, windows, heads);  // head_* only at W = 1
    s.c_frag = reinterpret_cast<uint2*>(base + bytes(L, N, windows, heads, false) / sizeof(float));
    return s;
  }
};

// Shared memory of a fold (flush, prefill, state): the committed entries of one head.
struct FoldSmem {
  float* B;   // [L, N]
  float* x;   // [L, P]
  float* w;   // [L]  delta_k exp(A (L_{m-1} - L_k)) (delta_k while staging)
  float* d0;  // [1]  exp(A L_{m-1})

  static size_t bytes(int L, int N, int P) { return sizeof(float) * (size_t(L) * (N + P + 1) + 4); }
  __device__ static FoldSmem carve(float* base, int L, int N, int P) {
    FoldSmem f;
    f.B = base;
    f.x = f.B + L * N;
    f.w = f.x + L * P;
    f.d0 = f.w + L;
    return f;
  }
};

// One group of rows to copy into shared memory as fp32: `rows` rows of n elements (n % 8 == 0),
// row k at src + (ring ? phys(k) : k) * stride; with `rounded`, a bf16-rounded copy goes there too
// (the C of the BF16 readout rule).
template <typename ActT>
struct StageSegment {
  float* dst;
  const ActT* src;
  int64_t stride;
  int rows, n;
  bool ring;
  float* rounded;
};

// Copies every segment in one pass of 8-element vector loads, two per thread in flight.
// kPow2Rows: every segment's n is a power of two (dstate), so a vector's row is a shift.
template <typename ActT, bool kRound, bool kPow2Rows, int kSegments>
__device__ __forceinline__ void stage_segments(const StageSegment<ActT> (&seg)[kSegments],
                                               const SlotCursors& cur, int L, bool f16) {
  int start[kSegments + 1];
  start[0] = 0;
#pragma unroll
  for (int s = 0; s < kSegments; ++s) start[s + 1] = start[s] + seg[s].rows * (seg[s].n / 8);
  const int total = start[kSegments];
  for (int u0 = threadIdx.x; u0 < total; u0 += 2 * blockDim.x) {
    float v[2][8];
    float* dst[2] = {nullptr, nullptr};
    float* rounded[2] = {nullptr, nullptr};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int u = u0 + q * blockDim.x;
      if (u >= total) continue;
      // Select the segment with compile-time indices only (a runtime index into `seg` would
      // put it in local memory).
      StageSegment<ActT> sg = seg[0];
      int first = 0;
#pragma unroll
      for (int t = 1; t < kSegments; ++t)
        if (u >= start[t]) sg = seg[t], first = start[t];
      const int per_row = sg.n / 8;
      const int k = kPow2Rows ? (u - first) >> (__ffs(per_row) - 1) : (u - first) / per_row;
      const int c = (u - first) - k * per_row;
      const int row = sg.ring ? ((cur.origin + k) & (L - 1)) : k;
      load8_act(sg.src + int64_t(row) * sg.stride + 8 * c, f16, v[q]);
      dst[q] = sg.dst + k * sg.n + 8 * c;
      if (sg.rounded) rounded[q] = sg.rounded + k * sg.n + 8 * c;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (dst[q] == nullptr) continue;
      store8_f32(dst[q], v[q]);
      if (rounded[q] == nullptr) continue;
      float r[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = kRound ? bf16_to_f32(f32_to_bf16(v[q][i])) : v[q][i];
      store8_f32(rounded[q], r);
    }
  }
}

// Loads the committed entries 0..count-1 of head h (group g) for a fold in closed form:
//   S = exp(A L_{m-1}) S0 + sum_{k<m} delta_k exp(A (L_{m-1} - L_k)) x_k B_k^T   (m = count)
// (the CPU reference's order: scale the decoded row, then add the entries in logical order).
// Ends with a barrier; the weights are ready after the caller's next one.
template <typename ActT>
__device__ __forceinline__ void stage_fold(const ReplayParams& p, const SlotSections& sec,
                                           const SlotCursors& cur, int count, int h, int g,
                                           const FoldSmem& f) {
  const StageSegment<ActT> seg[2] = {{f.B, static_cast<const ActT*>(sec.ring_B) + int64_t(g) * p.N,
                                      int64_t(p.G) * p.N, count, p.N, true, nullptr},
                                     {f.x, static_cast<const ActT*>(sec.ring_x) + int64_t(h) * p.P,
                                      int64_t(p.H) * p.P, count, p.P, true, nullptr}};
  stage_segments<ActT, false, false>(seg, cur, p.L, p.act_f16);
  for (int k = threadIdx.x; k < count; k += blockDim.x)
    f.w[k] = sec.ring_delta[ring_index(cur, k, p.L) * p.H + h];
  __syncthreads();
  // Thread k forms the weight of entry k (count <= L <= 32 < blockDim.x); every thread sums the
  // deltas in logical order, the CPU reference's order.
  const int k = threadIdx.x;
  float total = 0.f, upto = 0.f;
  for (int q = 0; q < count; ++q) {
    total += f.w[q];
    if (q == k) upto = total;
  }
  const float dk = k < count ? f.w[k] : 0.f;
  __syncthreads();
  const float A = p.head.A[h];
  if (k < count) f.w[k] = dk * decay(A * (total - upto));
  if (k == 0) *f.d0 = decay(A * total);
}

// The fold of stage_fold for one 8-element chunk (columns n0..n0+7) of each of R rows:
//   s = d0 s; then s += (w_k x_k[p]) B_k for k = 0..count-1, in logical order.
// The 8 columns of B_k are read from shared memory once per entry for all R rows.
template <int R>
__device__ __forceinline__ void fold_rows(float (&s)[R][8], const FoldSmem& f, int count,
                                          const int (&prow)[R], int n0, int N, int P) {
  const float d0 = *f.d0;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 8; ++i) s[r][i] *= d0;
  // Pointers advanced per entry (the indexed form recomputed every address per entry and row).
  const float* bk = f.B + n0;
  const float* xk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xk[r] = f.x + prow[r];
  for (int k = 0; k < count; ++k, bk += N) {
    const float4 b0 = *reinterpret_cast<const float4*>(bk);
    const float4 b1 = *reinterpret_cast<const float4*>(bk + 4);
    const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    const float wk = f.w[k];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float wx = wk * *xk[r];
      xk[r] += P;
#pragma unroll
      for (int i = 0; i < 8; ++i) s[r][i] += wx * bv[i];
    }
  }
}

// NaN -> 0 and +-Inf -> +-FLT_MAX before an encode, as the CPU reference does; returns the count.
__device__ __forceinline__ int sanitize8(float (&s)[8]) {
  // v * 0 is NaN exactly when v is NaN or +-Inf: one FMA per element finds out whether any of the
  // 8 needs fixing, and the per-element fix-up below is skipped in the common all-finite case.
  float probe = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) probe = fmaf(s[i], 0.f, probe);
  if (!isnan(probe)) return 0;
  int bad = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (isfinite(s[i])) continue;
    ++bad;
    s[i] = isnan(s[i]) ? 0.f : copysignf(3.402823466e38f, s[i]);
  }
  return bad;
}

// Counts of an encode pass (fp16-saturated elements, non-finite fold values) into the stats.
__device__ __forceinline__ void add_encode_stats(const ReplayParams& p, int saturated,
                                                 int nonfinite) {
  if (saturated) atomicAdd(&p.stats->saturated, (unsigned long long)saturated);
  if (nonfinite) atomicAdd(&p.stats->nonfinite, (unsigned long long)nonfinite);
}

// Thread mapping of the row kernels: a row (h, p) of N elements is held by N/8 consecutive lanes,
// 8 elements each; a block covers rows_per_pass rows per pass and keeps `rows` passes (a row
// group) in registers so that all their loads are in flight together.
struct RowMap {
  int lanes, lane_in_row, n0, rows_per_pass, rows_per_group;
  __device__ RowMap(int lanes_per_row, int rows)
      : lanes(lanes_per_row),
        lane_in_row(threadIdx.x % lanes_per_row),
        n0(8 * lane_in_row),
        rows_per_pass(blockDim.x / lanes_per_row),
        rows_per_group(rows_per_pass * rows) {}
  __device__ int row(int base, int r) const {
    return base + r * rows_per_pass + threadIdx.x / lanes;
  }
};

// Issues the loads of one row group of head h (recurrence or read checkpoint). Rows past P load
// row P - 1 again: they compute on a duplicate and are never stored.
template <Mode kMode, int R>
__device__ __forceinline__ void load_group(const SlotSections& sec, const RowMap& m, int h, int P,
                                           int N, int base, bool rec, RawChunk (&raw)[R],
                                           int (&prow)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    prow[r] = m.row(base, r);
    load_raw8<kMode>(sec, int64_t(h) * P + min(prow[r], P - 1), m.n0, N, rec, raw[r]);
  }
}

// ---- flush -------------------------------------------------------------------------------------
// S = fold(decode(rec), committed entries 0..c-1) in fp32, encoded into every checkpoint of the
// mode. A streaming pass over the recurrence checkpoint of each flushing slot, one (slot, head)
// item per block at a time, its next row group's loads in flight while the current one is folded
// and encoded. The verify kernel that follows reads the new read checkpoint like any other; a
// one-launch verify (small batches) runs flush_head for its block's heads itself.
inline constexpr int kFlushThreads = 128;
// Rows per thread and pass in the flush, and the blocks per SM its registers aim at. The separate
// modes (two encoders, the SR's Philox) fit 2 rows in 80 registers without spills, so 6 blocks
// stay resident; with 4 rows they needed 96 registers plus 200 bytes of spills at 5 blocks. The
// A/B on the H200 (bench/results/2026-11-30-h200-session5.md): separate-fp8 W=8 batch 64
// 303.1 -> 296.2 us, 256: 1078.6 -> 1039.4; separate-nvfp4 417.9 -> 395.8; shared-fp8, whose
// 4 rows fit, got slower with 2 (225.8 -> 229.2) and keeps 4. fp16-sr (the SR alone) spilled
// 108 bytes at 4 rows once the Philox round keys came from the parameters, and takes 2 as well.
// Aiming at 4 blocks per SM (128 registers, no spills, 2 or 4 rows) was slower in every mode
// measured: the kernel is instruction-bound and 16 warps per SM issue less than 24 (separate-fp8
// W=8 batch 64 200.2 -> 204.0 / 202.1 us, separate-nvfp4 259.4 -> 273.1 / 276.3;
// bench/results/2026-11-30-h200-session8.md). That was in lockstep, where every slot flushes in
// the same step. With the slots' flush phases spread, as in service, a W = 1 step flushes a few
// entries whose items fit in one round, and the step waits for one item's chain of row groups:
// separate-fp8 at 4 rows and 4 blocks (two row groups per item instead of four) took W = 1 batch 64
// from 69.4 to 61.6 us and was even elsewhere (W = 8 186.6 / 186.7, lockstep W = 1 55.5 / 55.2);
// separate-nvfp4, whose second encoder is heavier, gained at W = 1 batch 64 (88.9 -> 79.6) but
// lost at W = 8 (242.4 -> 263.1) and batch 256 (267.7 -> 274.1) and keeps 2 rows
// (bench/results/2026-11-30-h200-session12.md). fp16-sr was not measured and keeps 2.
constexpr int flush_rows(Mode mode) {
  return mode == Mode::separate_fp8 ? 4 : uses_stochastic_rounding(mode) ? 2 : kStepRows;
}
constexpr int flush_min_blocks(Mode mode) {
  return mode == Mode::separate_fp8 ? 4 : uses_stochastic_rounding(mode) ? 6 : 5;
}

// kShortSr: the caller knows r <= 12 (encode8_f16_sr's short form only).
// check_b >= 0: the item comes from the flush list and is skipped (after its first loads are
// issued, so that their latency and the status words' overlap) unless entry check_b is valid.
template <Mode kMode, typename ActT, int kRows = flush_rows(kMode), bool kShortSr = false>
__device__ __forceinline__ void flush_head(const ReplayParams& p, int slot, const SlotCursors& cur,
                                           int h, float* smem, int check_b = -1) {
  const int N = p.N, P = p.P;
  const SlotSections sec = slot_sections(p.geo, slot);
  const RowMap rm(p.lanes_per_row, kRows);
  RawChunk raw[kRows];
  int prow[kRows];
  load_group<kMode>(sec, rm, h, P, N, 0, true, raw, prow);
  if (check_b >= 0 && !slot_ok(p, check_b)) return;  // uniform over the block
  const FoldSmem f = FoldSmem::carve(smem, p.L, N, P);
  stage_fold<ActT>(p, sec, cur, cur.committed, h, int(p.by_group_heads.div(h)), f);
  __syncthreads();
  const SrContext sr = make_sr(p, cur);
  int saturated = 0, nonfinite = 0;
  for (int base = 0; base < P; base += rm.rows_per_group) {
    float v[kRows][8];
    int row[kRows];
    int clamped[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      decode_raw8<kMode>(raw[r], true, v[r]);
      row[r] = prow[r];
      clamped[r] = min(row[r], P - 1);
    }
    if (base + rm.rows_per_group < P)
      load_group<kMode>(sec, rm, h, P, N, base + rm.rows_per_group, true, raw, prow);
    fold_rows(v, f, cur.committed, clamped, rm.n0, N, P);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int pr = clamped[r];
      const int bad = sanitize8(v[r]);
      float rv[8];
      // Duplicated rows (past P) take part in encode8's row reductions and store nothing.
      encode8<kMode, kShortSr>(sec, int64_t(h) * P + pr, rm.n0, N, rm.lane_in_row, rm.lanes, v[r],
                               sr, rv, &saturated, row[r] < P);
      if (row[r] < P) nonfinite += bad;
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

// The listed flushing entries (validate kernels), (entry, head) items over a fixed grid; the
// barrier between items keeps one item's shared memory from being overwritten by the next.
// kShortSr (stochastic-rounding modes with r <= 12, the default r = 7): see flush_head.
template <Mode kMode, typename ActT, bool kShortSr>
__global__ void __launch_bounds__(kFlushThreads, flush_min_blocks(kMode))
    flush_kernel(const ReplayParams p) {
  wait_for_previous_grid();  // launched dependent on validate_tokens
  extern __shared__ float4 smem_raw[];
  const int items = *p.flush_count * p.H;
  // The chained verify after it may start now: only its blocks of flushing entries wait for this
  // grid (verify_kernel). After an explicit flush the next kernel is a plain launch, which this
  // does not affect.
  allow_dependent_launch();
  // Nothing listed (most steps): every block reads 0, so none needs to count itself to the one
  // that clears the count; the grid then exits without its same-address atomics.
  if (items == 0) return;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int listed = int(p.by_heads.div(item));
    const ValidatedEntry e = p.flush_list[listed];
    flush_head<kMode, ActT, flush_rows(kMode), kShortSr>(p, e.slot, e.cursors, item - listed * p.H,
                                                         reinterpret_cast<float*>(smem_raw), e.b);
    __syncthreads();
  }
  // The last block to finish (every block read the count before it got here) clears the count
  // for the next operation, so no memset node precedes the validate kernel.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.flush_done, 1) == int(gridDim.x) - 1) {
      *p.flush_count = 0;
      *p.flush_done = 0;
    }
  }
}

// ---- verify ------------------------------------------------------------------------------------
// One block per (batch entry, group, chunk of heads_per_block heads of the group), for every slot
// (a flushing slot's block first folds its heads, flush_head; its window starts at logical 0):
//
//   y_j[p] = exp(A L_i) scale_p sum_n R[p,n] Cr_j[n] + sum_{k <= i} w_jk x_k[p] + D x_i[p]
//   w_jk   = delta_k exp(A (L_i - L_k)) (B_k . C_j),         i = c + j,  L_k = delta_0 + ... +
//   delta_k
//
// What the heads of a group share is done once per block: the entries' B and the window's C are
// staged and the products B_k . C_j go to shared memory. The read checkpoint streams through
// shared memory in (head, row chunk) units with cp.async, verify_stages(W) deep, so the bytes in
// flight do not depend on registers (an 8-byte fp8 chunk per lane held in registers leaves the
// memory system idle). The weights w_jk are formed once per block at W = 1 (every head's) and
// once per head at W > 1, in shared memory, except in the FMA readout at W > 1 (below).
// The 8/4-bit read modes read R C_j out on the tensor cores (mma_tile, 16-row tiles) and add the
// ring term per output. The 16/32-bit modes use the FMA readout: lane l of a row owns the
// entries k = l + t * N/8 (t < kEntries), and the ring term joins the checkpoint term in the
// row's one reduction,
//   part_j = exp(A L_i) scale (v . Cr_j)[8 columns] + sum_{own k} (w_jk + D [k == i]) x_k[p],
// with Cr_j in registers (each thread always works on the same 8 columns; reading it from
// shared memory per row would move 32 bytes of shared memory per checkpoint byte at W = 8).
inline constexpr int kVerifyThreads = 128;
static_assert(kVerifyThreads == kFlushThreads, "verify_kernel runs flush_head");
// Stages in flight: at W = 1 two (one unit copied while one is read) leave room for more blocks
// per SM (three measured slower: 67.7 -> 71.2 us, and 57.5 -> 58.1 us at batch 64 with a
// run-time stage count where a one-wave grid left shared memory idle); W > 1 keeps three.
constexpr int verify_stages(int windows) { return windows == 1 ? 2 : 3; }
inline constexpr int kVerifyUnitBytes = 16 * 1024;  // checkpoint bytes per unit, at most

// Shared-memory staging of one unit: `rows` rows of one head's read checkpoint (codes, row
// scales, nvfp4 block scales) and the x entries [L][rows] of those rows. The code rows of the
// tensor-core readout and the x rows are padded by one 16-byte vector: the 8 rows an ldmatrix
// (or 8 lanes) reads then start in different banks. Every part is a whole number of vectors.
struct VerifyStage {
  int rows;         // rows per unit: P, or a divisor of P keeping the codes <= kVerifyUnitBytes
  int code_bytes;   // per row
  int code_pitch;   // bytes from one staged code row to the next
  int scale_bytes;  // per row: 4 in the row-scaled modes, else 0
  int block_bytes;  // per row: N/16 for nvfp4, else 0
  int x_pitch;      // elements per x row
  int act_bytes;
  size_t bytes;  // one stage

  __host__ __device__ static VerifyStage make(Mode mode, int act_bytes, int P, int N, int L) {
    VerifyStage s{};
    s.code_bytes = mode == Mode::fp32                                                    ? 4 * N
                   : (mode == Mode::bf16 || mode == Mode::fp16 || mode == Mode::fp16_sr) ? 2 * N
                   : mode == Mode::separate_nvfp4                                        ? N / 2
                                                                                         : N;
    s.scale_bytes = has_bf16_readout(mode) ? 4 : 0;
    s.block_bytes = mode == Mode::separate_nvfp4 ? N / 16 : 0;
    s.rows = P;
    // The tensor-core readout of the 8/4-bit modes works on 16-row tiles.
    const int granule = has_bf16_readout(mode) ? 16 : 8;
    while (s.rows * s.code_bytes > kVerifyUnitBytes && s.rows % (2 * granule) == 0) s.rows /= 2;
    s.code_pitch = s.code_bytes + (has_bf16_readout(mode) ? 16 : 0);
    s.act_bytes = act_bytes;
    s.x_pitch = s.rows + 16 / act_bytes;
    s.bytes = size_t(s.rows) * (s.code_pitch + s.scale_bytes + s.block_bytes) +
              size_t(L) * s.x_pitch * act_bytes;
    return s;
  }
  // Slot sections viewed on one stage (row indices relative to the unit), for load_raw8.
  __device__ SlotSections view(uint8_t* base) const {
    SlotSections v{};
    v.rec = v.read = base;
    v.rec_scale = v.read_scale = reinterpret_cast<float*>(base + rows * code_pitch);
    v.read_block_scale = base + rows * (code_pitch + scale_bytes);
    v.ring_x = base + rows * (code_pitch + scale_bytes + block_bytes);
    return v;
  }
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// Copies `bytes` (a multiple of 16) with the block's threads, 16 bytes each.
__device__ __forceinline__ void cp_async_block(void* smem, const void* gmem, int bytes) {
  for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    cp_async16(static_cast<uint8_t*>(smem) + 16 * i, static_cast<const uint8_t*>(gmem) + 16 * i);
}

// Entry k of head h as a verify sees it: committed entries from the ring, the window's from the
// inputs.
template <typename ActT>
__device__ __forceinline__ const ActT* entry_x_row(const ReplayParams& p, const SlotSections& sec,
                                                   const SlotCursors& after, int b, int h, int k) {
  const int c = after.committed;
  if (k < c)
    return static_cast<const ActT*>(sec.ring_x) +
           (int64_t(ring_index(after, k, p.L)) * p.H + h) * p.P;
  return static_cast<const ActT*>(p.x) + ((int64_t(b) * p.tokens + k - c) * p.H + h) * p.P;
}
__device__ __forceinline__ float entry_delta(const ReplayParams& p, const SlotSections& sec,
                                             const SlotCursors& after, int b, int h, int k) {
  const int c = after.committed;
  if (k < c) return sec.ring_delta[ring_index(after, k, p.L) * p.H + h];
  if (k < c + p.tokens)
    return process_dt(p.dt[(int64_t(b) * p.tokens + k - c) * p.H + h], p.head.dt_bias[h],
                      p.head.dt_min, p.head.dt_max);
  return 0.f;
}

// Which 16-byte vectors of a unit a thread copies: per_k of them per row (a code row, or one
// entry's x row). When per_k divides the block, thread t always copies vector t % per_k of rows
// t / per_k, t / per_k + k_stride, ... and no division is needed.
struct XCopy {
  int per_k;
  bool tiled;
  int q, k0, k_stride;
  __device__ static XCopy make(int per_k) {
    XCopy x;
    x.per_k = per_k;
    x.tiled = kVerifyThreads % per_k == 0;
    x.q = threadIdx.x % per_k;
    x.k0 = threadIdx.x / per_k;
    x.k_stride = kVerifyThreads / per_k;
    return x;
  }
  template <typename F>  // f(row, vector) for this thread's vectors of rows 0..rows-1
  __device__ __forceinline__ void for_each(int rows, F&& f) const {
    if (tiled) {
      for (int k = k0; k < rows; k += k_stride) f(k, q);
    } else {
      for (int i = threadIdx.x; i < rows * per_k; i += blockDim.x) {
        const int k = i / per_k;
        f(k, i - k * per_k);
      }
    }
  }
};

// Issues the copies of one unit (rows row0.. of head h) into a stage and commits them as a group
// (cc: the code rows' vectors, xc: the x rows').
template <Mode kMode, typename ActT>
__device__ __forceinline__ void issue_unit(const ReplayParams& p, const SlotSections& sec,
                                           const SlotCursors& after, const VerifyStage& vs,
                                           const XCopy& cc, const XCopy& xc, uint8_t* stage, int b,
                                           int h, int row0, int m) {
  const int64_t row = int64_t(h) * p.P + row0;
  const SlotSections v = vs.view(stage);
  constexpr bool kSeparate = is_separate(kMode);
  const uint8_t* codes = static_cast<const uint8_t*>(kSeparate ? sec.read : sec.rec);
  if (vs.code_pitch == vs.code_bytes) {
    cp_async_block(v.rec, codes + row * vs.code_bytes, vs.rows * vs.code_bytes);
  } else {
    const uint8_t* src = codes + row * vs.code_bytes;
    uint8_t* dst = static_cast<uint8_t*>(v.rec);
    cc.for_each(vs.rows, [&](int r, int q) {
      cp_async16(dst + r * vs.code_pitch + 16 * q, src + r * vs.code_bytes + 16 * q);
    });
  }
  if (vs.scale_bytes)
    cp_async_block(v.rec_scale, (kSeparate ? sec.read_scale : sec.rec_scale) + row,
                   vs.rows * vs.scale_bytes);
  if (vs.block_bytes)
    cp_async_block(v.read_block_scale, sec.read_block_scale + row * vs.block_bytes,
                   vs.rows * vs.block_bytes);
  xc.for_each(m, [&](int k, int q) {
    cp_async16(static_cast<uint8_t*>(v.ring_x) + (int64_t(k) * vs.x_pitch * sizeof(ActT)) + 16 * q,
               reinterpret_cast<const uint8_t*>(entry_x_row<ActT>(p, sec, after, b, h, k) + row0) +
                   16 * q);
  });
  cp_async_commit();
}

// The window's B of groups g0 .. g0 + groups - 1 into the ring at logical positions c.. of
// `after` (the cursors after any flush of this step), in 16-byte vectors.
template <typename ActT>
__device__ __forceinline__ void append_window_B(const ReplayParams& p, int b,
                                                const SlotSections& sec, const SlotCursors& after,
                                                int g0, int groups) {
  const int W = p.tokens, per_row = groups * p.N * int(sizeof(ActT)) / 16;
  for (int u = threadIdx.x; u < W * per_row; u += blockDim.x) {
    const int j = u / per_row, i = u - j * per_row;
    const int phys = ring_index(after, after.committed + j, p.L);
    reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_B) + (int64_t(phys) * p.G + g0) * p.N)[i] =
        reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) +
                                       ((int64_t(b) * W + j) * p.G + g0) * p.N)[i];
  }
}

// The end of a verify block: the last block of batch entry b to finish (a per-entry arrival
// counter) advances the slot's cursors, so no block of the entry can still read the old ones
// and no separate finalize launch is needed. In one launch, where the entry flushed (its blocks
// folded their heads in this kernel), that whole block also appends the window's B of every
// group: the window's ring positions may be those of committed entries (c + W wraps past the
// ring's end), whose B the other blocks of the group fold until they finish. Uniform over the
// block.
template <typename ActT, bool kOneLaunch>
__device__ __forceinline__ void finish_verify(const ReplayParams& p, int b, int slot,
                                              int blocks_per_entry) {
  __syncthreads();  // every thread of this block is past its reads of the cursors and the ring
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&p.arrivals[b], 1) == blocks_per_entry - 1;
  }
  if constexpr (kOneLaunch) {
    if (!__syncthreads_or(last)) return;
  } else if (!last) {
    return;
  }
  __threadfence();
  SlotCursors cur = p.cursors[slot];
  const bool flush = verify_needs_flush(cur, p.tokens, p.L);
  if (flush) apply_flush(cur, p.L);
  if (kOneLaunch && flush) append_window_B<ActT>(p, b, slot_sections(p.geo, slot), cur, 0, p.G);
  if (threadIdx.x != 0) return;
  p.arrivals[b] = 0;  // ready for the next verify
  apply_verify(cur, p.tokens);
  if (p.commit_window) apply_commit(cur, p.tokens);
  p.cursors[slot] = cur;
  if (flush) {
    atomicAdd(&p.stats->flushes, 1ull);
    atomicAdd(&p.stats->checkpoint_writes, 1ull);
  }
}

// ---- tensor-core readout (the 8/4-bit read modes, every window) ------------------------------
// R C_j for a 16-row tile and the 8 window columns j with mma.sync m16n8k16 in fp16 with fp32
// accumulation. fp16 holds every decoded value exactly: e4m3 and int8 codes as they are, and
// nvfp4's e2m1 x e4m3 block scale at 2^-14 (multiples of 2^-24 below 0.17). C_j, rounded to bf16
// (SPEC 5), goes in at a power-of-two scale 2^s_j that puts its largest magnitude in
// [2^14, 2^15): fp16 then holds every element down to 2^-31 of the largest exactly (a bf16
// value needs 8 significant bits above fp16's 2^-24 step); a smaller one is rounded by at most
// 2^-39 of the largest, far below fp32's rounding of the sum. The products are exact and summed
// in fp32, so only the summation order differs from the CPU reference's readout.
// A dot product is invariant under a permutation of K applied to both operands, so each lane's
// k-slots are mapped to the columns its ldmatrix delivers (kslot_col): lane (g, t) feeds
// k-slots {2t, 2t+1} and {2t+8, 2t+9} of k-step s with 4 consecutive columns of rows g and g+8,
// and its B fragment (the shared-memory c_frag) holds C_g at the same columns.

// First column of k-slots {2t, 2t+1} (half 0) or {2t+8, 2t+9} (half 1) of k-step s, lane t.
// 8-bit codes: an ldmatrix row of 16 bytes is one k-step, lane t gets its columns 4t..4t+3.
// nvfp4: 16 bytes are 32 columns, two k-steps; lane t gets columns 8t..8t+7 of them.
// Direct (DirectReader): lane t loads bytes 16t.. of every 64-byte block of its rows, whose
// register r (4 columns) feeds k-step 4 * block + r.
template <Mode kMode, bool kDirect = false>
__device__ __forceinline__ int kslot_col(int s, int t, int half) {
  if constexpr (kDirect) return 64 * (s / 4) + 16 * t + 4 * (s % 4) + 2 * half;
  if constexpr (kMode == Mode::separate_nvfp4) return 32 * (s / 2) + 8 * t + 4 * (s % 2) + 2 * half;
  return 16 * s + 4 * t + 2 * half;
}

// Factor from the fp16 values of a mode's A fragments to code values (nvfp4's decoder gives
// e2m1 x 2^-14).
template <Mode kMode>
constexpr float kFragUnscale = kMode == Mode::separate_nvfp4 ? kE2m1F16Unscale : 1.f;

// B fragments of the window's C (rounded to bf16, in sm.Cr) into sm.c_frag, and into
// sm.c_unscale[j] what turns column j's fp32 results back to code x C units. Warp 0; the caller
// puts a barrier between this and the readout.
template <Mode kMode, bool kDirect = false>
__device__ __forceinline__ void build_c_fragments(const StepSmem& sm, int N, int W) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4, steps = N / 16;
  const float* c = sm.Cr + g * N;  // window column g (rows of Cr exist for g < W only)
  float amax = 0.f;
  if (g < W)
    for (int s = 0; s < steps; ++s)
      for (int half = 0; half < 2; ++half) {
        const int col = kslot_col<kMode, kDirect>(s, t, half);
        amax = fmaxf(amax, fmaxf(fabsf(c[col]), fabsf(c[col + 1])));
      }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the 4 lanes of column g cover
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));  // all N columns between them
  const int shift = fp16_window_shift(amax);  // amax finite: the inputs were validated
  const float scale = pow2_f32(shift);
  for (int s = 0; s < steps; ++s) {
    uint2 frag = {0u, 0u};
    if (g < W) {
      const int c0 = kslot_col<kMode, kDirect>(s, t, 0), c1 = kslot_col<kMode, kDirect>(s, t, 1);
      const __half2 lo = __floats2half2_rn(c[c0] * scale, c[c0 + 1] * scale);
      const __half2 hi = __floats2half2_rn(c[c1] * scale, c[c1 + 1] * scale);
      frag = {*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
    }
    sm.c_frag[s * 32 + lane] = frag;
  }
  if (t == 0) sm.c_unscale[g] = pow2_f32(-shift) * kFragUnscale<kMode>;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&q)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
               : "r"(smem_addr));
}

// d += A B for one m16n8k16 step (A: 16 x 16 fp16 rows, B: 16 x 8 fp16 columns, d: fp32).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

// d += A B for one m16n8k16 step in bf16 (A: 16 x 16 rows, B: 16 x 8 columns, d: fp32).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&q)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
               : "r"(smem_addr));
}

// Two fp32 values rounded to bf16 (round to nearest even), packed low-first; each value is left
// holding what the rounding dropped (exact in fp32).
__device__ __forceinline__ uint32_t bf16x2_split(float& lo, float& hi) {
  const __nv_bfloat16 a = __float2bfloat16_rn(lo), b = __float2bfloat16_rn(hi);
  lo -= __bfloat162float(a);
  hi -= __bfloat162float(b);
  return uint32_t(__bfloat16_as_ushort(a)) | (uint32_t(__bfloat16_as_ushort(b)) << 16);
}

// The ring term of a 16-row tile at W > 1 on the tensor cores, bf16 activations:
//   d[r][j] += sum_{k < m} x_k[r0 + r] w_jk
// A = the staged x (entry-major rows [k][p], read transposed by ldmatrix: exact in bf16); B = w
// split into three bf16 parts (hi + mid + lo carry an fp32 value's 24 significant bits), so every
// product is exact and only the fp32 summation order differs from the FMA loop's. Lane (g, t)
// gets rows (g, g + 8) x columns (2t, 2t + 1), the layout of mma_tile's d. Entries past m are
// zero in w, and their staged x rows must be finite (verify_kernel zeroes them once). Needs the
// staged x to hold whole 16-entry steps (history a multiple of 16); the whole warp takes part.
template <int kW>
__device__ __forceinline__ void ring_term_mma(const uint16_t* xs, int x_pitch, int r0,
                                              const float* w, int L, int m, float (&d)[4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int k0 = 0; k0 < m; k0 += 16) {
    // ldmatrix.trans: lane l gives the address of entry k0 + (l & 7) (+ 8 for l >= 16), rows
    // r0 (+ 8 for l & 8): matrices (rows 0-7, entries 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
    uint32_t a[4];
    ldmatrix_x4_trans(
        a, static_cast<uint32_t>(__cvta_generic_to_shared(
               xs + (k0 + (lane & 7) + ((lane & 16) >> 1)) * x_pitch + r0 + (lane & 8))));
    // Column j = g of B holds w_jk at k = k0 + 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1).
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + 2 * t + (i & 1) + 4 * (i & 2);
      v[i] = g < kW && k < m ? w[g * L + k] : 0.f;
    }
#pragma unroll
    for (int part = 0; part < 3; ++part) {
      const uint32_t b0 = bf16x2_split(v[0], v[1]), b1 = bf16x2_split(v[2], v[3]);
      mma_bf16_16816(d, a, b0, b1);
    }
  }
}

// Codes 2 and 3 (hi) or 0 and 1 of a register of four 8-bit codes as an fp16 pair.
template <Mode kMode>
__device__ __forceinline__ uint32_t code8x2_f16x2(uint32_t q, bool hi) {
  const uint32_t two = hi ? q >> 16 : q & 0xffffu;
  if constexpr (kMode == Mode::shared_int8) {
    // 0x6400 | (code + 128) is the fp16 1024 + code + 128, exact; subtracting 1152 leaves code.
    const uint32_t biased = __byte_perm(two ^ 0x8080u, 0x64646464u, 0x5140u);
    const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&biased), __float2half2_rn(1152.f));
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  }
}

// An e4m3 code's value (exact in fp16) in both halves of an fp16 pair.
__device__ __forceinline__ __half2 e4m3_half2(uint8_t code) {
  return __half2half2(__ushort_as_half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x));
}

// nvfp4: the two codes of byte `byte` of a register of 8 codes (column 2i in the low nibble of
// byte i), given as its low nibbles `even` = q & 0x0f0f0f0f and high nibbles `odd`, times the
// block scale (the same fp16 twice), at 2^-14 (e2m1x2_to_f16x2_scaled); exact in fp16.
__device__ __forceinline__ uint32_t e2m1_byte_f16x2(uint32_t even, uint32_t odd, int byte,
                                                    __half2 block_scale) {
  // The even column's code to bits 0-3, the odd column's to bits 16-19.
  const uint32_t h = e2m1x2_to_f16x2_scaled(__byte_perm(even, odd, byte | (4 + byte) << 8));
  const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h), block_scale);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += R C for the 16-row tile at row r0 of a staged unit (codes: rows code_pitch bytes apart,
// code_bytes of them used; nvfp4 block scales: block_bytes per row): lane (g, t) ends with rows
// (r0 + g, r0 + g + 8) x window columns (2t, 2t + 1) in (d[0], d[1]), (d[2], d[3]).
template <Mode kMode>
__device__ __forceinline__ void mma_tile(const uint8_t* codes, int code_pitch, int code_bytes,
                                         const uint8_t* block_scales, int block_bytes, int r0,
                                         const uint2* c_frag, float (&d)[4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // ldmatrix.x4 over 32 bytes of the 16 rows: matrix 0 rows 0-7 bytes 0-15, matrix 1 rows 8-15
  // bytes 0-15, matrices 2 and 3 the same rows at bytes 16-31; lane l gives the address of row
  // l % 8 of matrix l / 8 and receives 4 bytes (4t..4t+3) of row g of each matrix.
  const uint32_t base = static_cast<uint32_t>(
      __cvta_generic_to_shared(codes + (r0 + (lane & 7) + (lane & 8)) * code_pitch + (lane & 16)));
  for (int c = 0; c < code_bytes / 32; ++c) {
    uint32_t q[4];  // rows (g, g + 8) at bytes 32c + 4t.. (q0, q1) and 32c + 16 + 4t.. (q2, q3)
    ldmatrix_x4(q, base + 32 * c);
    if constexpr (kMode == Mode::separate_nvfp4) {
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // bytes 16 part + 4t.. = 2 k-steps: 64c + 32 part
        const int block = 4 * c + 2 * part + t / 2;  // columns 64c + 32 part + 8t.. in one block
        const __half2 s_lo = e4m3_half2(block_scales[(r0 + g) * block_bytes + block]);
        const __half2 s_hi = e4m3_half2(block_scales[(r0 + g + 8) * block_bytes + block]);
        const uint32_t lo = q[2 * part], hi = q[2 * part + 1];  // rows g, g + 8
        const uint32_t lo_even = lo & 0x0f0f0f0fu, lo_odd = (lo >> 4) & 0x0f0f0f0fu;
        const uint32_t hi_even = hi & 0x0f0f0f0fu, hi_odd = (hi >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
          mma_f16_16816(d, e2m1_byte_f16x2(lo_even, lo_odd, 2 * kk, s_lo),
                        e2m1_byte_f16x2(hi_even, hi_odd, 2 * kk, s_hi),
                        e2m1_byte_f16x2(lo_even, lo_odd, 2 * kk + 1, s_lo),
                        e2m1_byte_f16x2(hi_even, hi_odd, 2 * kk + 1, s_hi),
                        c_frag[(4 * c + 2 * part + kk) * 32 + lane]);
      }
    } else {
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // one k-step: columns 32c + 16 part..
        const uint32_t lo = q[2 * part], hi = q[2 * part + 1];
        mma_f16_16816(d, code8x2_f16x2<kMode>(lo, false), code8x2_f16x2<kMode>(hi, false),
                      code8x2_f16x2<kMode>(lo, true), code8x2_f16x2<kMode>(hi, true),
                      c_frag[(2 * c + part) * 32 + lane]);
      }
    }
  }
}

// ---- W = 1 tensor-core readout from registers (VerifyVariant::chained_direct) ---------------
// The staged readout above spends most of a unit's instructions on the staging itself (cp.async
// issue, barriers, the ring term per tile: about 270 of 365 per warp and unit, H200 session 10).
// Here each lane loads its own A fragments from global memory: lane (g, t) reads bytes 16t..
// 16t + 15 of every 64-byte block of rows g and g + 8 of a 16-row tile (the 4 lanes of a row
// read 64 contiguous bytes), and k-step 4 * block + r takes register r of those 16 bytes
// (kslot_col<kMode, true>: a permutation of K applied to C's fragments too). A warp walks its
// tiles (tile w, w + 4, ... of the block's rows; heads are consecutive rows of the checkpoint)
// with kDirectDepth 64-column pieces in flight, and needs no barrier. The ring term and the
// per-row factor of the readout are formed before, for all rows of the block at once
// (direct_ring_pass), into shared memory.
inline constexpr int kDirectDepth = 4;      // pieces (16 rows x 64 codes) in flight per warp
inline constexpr int kDirectMinBlocks = 4;  // blocks per SM the registers aim at

// Whether a shape can take VerifyVariant::chained_direct: 8-bit codes (nvfp4 keeps the staged
// readout), 16-row tiles, whole 64-column blocks, a power-of-two number of them per row.
__host__ __device__ constexpr bool verify_direct_ok(Mode mode, int P, int N) {
  return has_bf16_readout(mode) && mode != Mode::separate_nvfp4 && P % 16 == 0 && N % 64 == 0 &&
         ((N / 64) & (N / 64 - 1)) == 0;
}

struct DirectPiece {
  uint4 lo, hi;  // 16 codes of rows g and g + 8 of one tile, one 64-column block
};

// Shared memory of the direct readout, after StepSmem: per row r of the block's heads
//   gain[r] = exp(A L_i) * c_unscale * scale_r,   ring[r] = sum_{k < m} w_k x_k[r]
// so that y[r] = gain[r] * (codes_r . C) + ring[r].
struct DirectSmem {
  float* gain;  // [heads_per_block * P]
  float* ring;  // [heads_per_block * P]
  __host__ __device__ static size_t bytes(int heads, int P) {
    return 2 * size_t(heads) * P * sizeof(float);
  }
  __device__ static DirectSmem carve(uint8_t* base, int heads, int P) {
    DirectSmem d;
    d.gain = reinterpret_cast<float*>(base);
    d.ring = d.gain + heads * P;
    return d;
  }
};

// verify_kernel's shared memory in VerifyVariant::chained_direct: no stages, the rows' gains and
// ring terms instead.
inline size_t verify_direct_smem(int L, int N, int P, int heads) {
  return StepSmem::bytes(L, N, 1, heads, true) + DirectSmem::bytes(heads, P);
}

// The ring term and gains of the block's rows (heads h0.., `rows` = heads_per_block * P of them)
// at W = 1. Rows go in vectors of 8 (of one head, P % 8 == 0); `split` adjacent lanes share a
// vector (as many as the block has threads to spare, a power of two), lane j summing entries
// j, j + split, ... before the lanes add their sums. The window's x (k = c) is read from the
// ring, where this block wrote it before the barrier that precedes the call.
template <Mode kMode, typename ActT>
__device__ __forceinline__ void direct_ring_pass(const ReplayParams& p, const StepSmem& sm,
                                                 const DirectSmem& ds, const SlotSections& sec,
                                                 const SlotCursors& after, int h0, int m) {
  const int P = p.P, L = p.L, vectors = p.heads_per_block * P / 8;
  int split = 1;
  while (split < 32 && 2 * split * vectors <= int(blockDim.x)) split *= 2;
  const int j = threadIdx.x % split, per_pass = blockDim.x / split;
  const int64_t entry_stride = int64_t(p.H) * P;  // ring x [L, H, P]
  const ActT* x0 = static_cast<const ActT*>(sec.ring_x) + int64_t(h0) * P;
  const float* scales = (is_separate(kMode) ? sec.read_scale : sec.rec_scale) + int64_t(h0) * P;
  for (int v0 = 0; v0 < vectors; v0 += per_pass) {  // uniform: every lane reaches the shuffles
    const int v = v0 + threadIdx.x / split, r0 = 8 * v;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (v < vectors) {
      const float* w = sm.head_w + r0 / P * L;
#pragma unroll 8
      for (int k = j; k < m; k += split) {
        float x[8];
        load8_act(x0 + ring_index(after, k, L) * entry_stride + r0, p.act_f16, x);
        const float wk = w[k];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += wk * x[i];
      }
    }
    for (int o = split / 2; o > 0; o /= 2)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if (v < vectors && j == 0) {
      float s[8];
      load8(scales + r0, s);
      const float dec = sm.head_dec[r0 / P] * sm.c_unscale[0];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ds.gain[r0 + i] = dec * s[i];
        ds.ring[r0 + i] = acc[i];
      }
    }
  }
}

// One warp's walk over its tiles: prefetch() issues the first kDirectDepth pieces (before the
// block's prologue), run() reads out every tile and writes y.
template <Mode kMode>
struct DirectReader {
  const uint8_t* lane_codes;  // row g of the block's first tile, byte 16 t
  int N, log2_blocks, pieces, warp;
  DirectPiece buf[kDirectDepth];

  __device__ void init(const uint8_t* codes /* [H * P, N] */, int h0, int P, int N_, int heads) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    warp = threadIdx.x / 32;
    N = N_;
    log2_blocks = __ffs(N / 64) - 1;
    const int tiles = heads * P / 16;
    const int mine = tiles > warp ? (tiles - warp + warps - 1) / warps : 0;
    pieces = mine << log2_blocks;
    lane_codes = codes + (int64_t(h0) * P + lane / 4) * N + 16 * (lane % 4);
  }
  __device__ __forceinline__ int tile_of(int piece) const {
    return warp + (piece >> log2_blocks) * int(blockDim.x / 32);
  }
  __device__ __forceinline__ void load(DirectPiece& q, int piece) const {
    const int blk = piece & ((1 << log2_blocks) - 1);
    const uint8_t* src = lane_codes + int64_t(tile_of(piece)) * 16 * N + 64 * blk;
    q.lo = __ldcs(reinterpret_cast<const uint4*>(src));
    q.hi = __ldcs(reinterpret_cast<const uint4*>(src + 8 * N));
  }
  __device__ __forceinline__ void prefetch() {
#pragma unroll
    for (int i = 0; i < kDirectDepth; ++i)
      if (i < pieces) load(buf[i], i);
  }
  // y0: index in p.y of row 0 of head h0 (W = 1).
  __device__ __forceinline__ void run(const ReplayParams& p, const uint2* c_frag,
                                      const DirectSmem& ds, int64_t y0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int last_blk = (1 << log2_blocks) - 1;
    float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (g, g + 8) x window columns (2t, 2t + 1)
    for (int base = 0; base < pieces; base += kDirectDepth) {
#pragma unroll
      for (int i = 0; i < kDirectDepth; ++i) {
        const int piece = base + i;
        if (piece >= pieces) break;
        const int blk = piece & last_blk;
        const DirectPiece q = buf[i];
        if (piece + kDirectDepth < pieces) load(buf[i], piece + kDirectDepth);
        const uint32_t lo[4] = {q.lo.x, q.lo.y, q.lo.z, q.lo.w};
        const uint32_t hi[4] = {q.hi.x, q.hi.y, q.hi.z, q.hi.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
          mma_f16_16816(d, code8x2_f16x2<kMode>(lo[r], false), code8x2_f16x2<kMode>(hi[r], false),
                        code8x2_f16x2<kMode>(lo[r], true), code8x2_f16x2<kMode>(hi[r], true),
                        c_frag[(4 * blk + r) * 32 + lane]);
        if (blk == last_blk) {
          if (t == 0) {  // window column 0: d[0] (row g), d[2] (row g + 8)
            const int r = tile_of(piece) * 16 + g;
            store_scalar(p.y, p.y_dtype, y0 + r, ds.gain[r] * d[0] + ds.ring[r]);
            store_scalar(p.y, p.y_dtype, y0 + r + 8, ds.gain[r + 8] * d[2] + ds.ring[r + 8]);
          }
          d[0] = d[1] = d[2] = d[3] = 0.f;
        }
      }
    }
  }
};

// The weights of head h for the tensor-core readout at W > 1, into buffer `buf` of sm.w and
// sm.dec, with no block barrier: lane k holds delta_k (k < m <= 32), every warp forms the running
// sums itself (sequential, the CPU reference's order, so L_k has the same bits in every warp) and
// then the weights of its window columns (two per warp at kW = 8), with i = c + j:
//   w_jk = delta_k exp(A (L_i - L_k)) (B_k . C_j) (+ D when k = i),   dec_j = exp(A L_i)
template <int kW>
__device__ __forceinline__ void form_head_weights(const ReplayParams& p, const StepSmem& sm, int h,
                                                  float delta_k, int c, int m, int buf) {
  constexpr int kPerWarp = kW * 32 / kVerifyThreads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = p.tokens, L = p.L;
  float run = 0.f, Lk = 0.f;
  for (int q = 0; q < m; ++q) {
    run += __shfl_sync(0xffffffffu, delta_k, q);
    if (q == lane) Lk = run;
  }
  const float A = p.head.A[h], D = p.head.D[h];
#pragma unroll
  for (int jj = 0; jj < kPerWarp; ++jj) {
    const int j = warp * kPerWarp + jj, i = c + j;  // i < m <= 32 whenever j < W
    const float Li = __shfl_sync(0xffffffffu, Lk, min(i, 31));
    float w = 0.f;
    if (j < W && lane <= i) w = delta_k * decay(A * (Li - Lk)) * sm.dot[j * L + lane];
    if (j < W && lane == i) w += D;
    if (lane < m) sm.w[(buf * kW + j) * L + lane] = w;
    if (lane == 0) sm.dec[buf * kW + j] = j < W ? decay(A * Li) : 0.f;
  }
}

// How a verify_kernel instantiation runs (the launcher picks one per step, replay_launch.h).
enum class VerifyVariant {
  chained,         // after validate_tokens and flush_kernel
  chained_wide,    // the same for W = 1 on the tensor cores, where the grid is one wave at 4
                   // blocks per SM: registers for 4 blocks instead of 6
  one_launch,      // the whole step in this kernel (validation, fold): small batches
  chained_direct,  // W = 1, 8-bit codes on the tensor cores: A fragments loaded from global
                   // memory into registers (DirectReader), no staging (verify_direct_ok)
};

// Blocks per SM the register allocation of verify_kernel aims at, without spills (nvcc -Xptxas
// -v). The tensor-core path keeps C in shared memory and its stages and fragments leave room
// for 6 blocks at W = 1 (about 37 KB each at nemotron-h-8b's shape; aiming at 8 blocks, i.e. 64
// registers, spilled 8 bytes); the FMA path at W = 1 holds one row of C in 8 registers.
// The wide and one-launch variants aim at 4 at most: 128 registers leave the readout's per-unit
// addressing in registers (the wide variant: H200, W = 1 batch 64, 54.6 -> 50.6 us shared-fp8,
// 61.1 -> 57.2 separate-fp8; at batch 256, several waves, 4 blocks per SM lost 2%), and the fold
// of a one-launch step has registers to spare.
constexpr int verify_min_blocks(Mode mode, int kW, VerifyVariant variant) {
  if (variant == VerifyVariant::chained_direct) return kDirectMinBlocks;
  const int blocks = has_bf16_readout(mode) ? (kW == 1 ? 6 : 4) : kW == 1 ? 8 : 3;
  return variant != VerifyVariant::chained && blocks > 4 ? 4 : blocks;
}

// The flush of a one-launch verify block's heads, 2 rows per thread and pass (the separate
// modes' flush_kernel fits them in 80 registers).
template <Mode kMode, typename ActT>
__device__ __forceinline__ void verify_flush_heads(const ReplayParams& p, int slot,
                                                   const SlotCursors& cur, int h0, float* smem) {
  for (int hh = 0; hh < p.heads_per_block; ++hh) {
    flush_head<kMode, ActT, 2>(p, slot, cur, h0 + hh, smem);
    __syncthreads();  // the next head's fold, or the verify's staging, overwrites shared memory
  }
}

// VerifyVariant::one_launch: the whole step in this one kernel, for small batches whose blocks hold
// one head each (launch latency dominates there): each block checks its entry as validate_tokens
// would and folds its own heads where the entry must flush. Otherwise validate_tokens and
// flush_kernel ran before it.
template <Mode kMode, typename ActT, int kW, int kEntries, VerifyVariant kVariant>
__global__ void __launch_bounds__(kVerifyThreads, verify_min_blocks(kMode, kW, kVariant))
    verify_kernel(const ReplayParams p) {
  constexpr bool kOneLaunch = kVariant == VerifyVariant::one_launch;
  constexpr bool kDirect = kVariant == VerifyVariant::chained_direct;
  static_assert(!kDirect || (kW == 1 && has_bf16_readout(kMode) && kMode != Mode::separate_nvfp4),
                "the direct readout is W = 1, 8-bit codes");
  // Launched dependent on the kernel before it. The chained verify overlaps flush_kernel, which
  // writes only the checkpoints of flushing entries (and its own counters): the blocks of those
  // entries wait for it below, the others read nothing it writes; block 0 waits here, so that
  // this grid cannot complete before the flush and whatever follows in the stream sees both.
  if (kOneLaunch || (blockIdx.x | blockIdx.y | blockIdx.z) == 0) wait_for_previous_grid();
  extern __shared__ float4 smem_raw[];
  constexpr int kStages = verify_stages(kW);
  const int H = p.H, P = p.P, N = p.N, G = p.G, L = p.L, W = p.tokens;
  const int chunks = gridDim.x;  // grid (chunks of the group's heads, G, batch)
  const int b = blockIdx.z, g = blockIdx.y;
  const int h0 = g * (H / G) + blockIdx.x * p.heads_per_block;
  int slot;
  SlotCursors after;    // the cursors of this verify (flushed below where the entry must flush)
  bool folded = false;  // one launch: this kernel flushed the entry (then ring B: finish_verify)
  if constexpr (kOneLaunch) {
    slot = p.slots[b];
    if (slot < 0) return;                                                   // padding
    if (!entry_valid<ActT>(p, b, slot, blockIdx.x == 0 && g == 0)) return;  // uniform
    // SPEC 4: the flush comes first. Each block folds and encodes its own heads (no other block
    // reads their checkpoints, ring x or deltas), then reads out the new checkpoints like any
    // other block. Nothing else is live across the fold, which has the registers to itself.
    const SlotCursors before = p.cursors[slot];
    folded = verify_needs_flush(before, W, L);  // then c > 0, since W <= L / 2
    if (folded)
      verify_flush_heads<kMode, ActT>(p, slot, before, h0, reinterpret_cast<float*>(smem_raw));
    after = before;
  } else {
    // Both loads in flight together; the entry is used only when its status words are all 0
    // (padding, closed or pending slots and bad inputs may leave a stale entry behind).
    const ValidatedEntry e = p.entries[b];
    if (!slot_ok(p, b)) return;  // invalid: uniform over the block
    slot = e.slot;
    after = e.cursors;
    // validate_tokens completed before any flush block got past its wait, so the status words
    // and the entry are in place; the checkpoints of a flushing entry are not until the flush is.
    if (verify_needs_flush(after, W, L)) wait_for_previous_grid();
  }
  const SlotSections sec = slot_sections(p.geo, slot);
  if (verify_needs_flush(after, W, L)) apply_flush(after, L);  // flush_kernel or the fold did it
  const int c = after.committed, m = c + W;
  // The 8/4-bit read modes read out on the tensor cores, the others on FFMA with Cr_j in
  // registers.
  constexpr bool kMma = has_bf16_readout(kMode);

  const StepSmem sm =
      StepSmem::carve(reinterpret_cast<float*>(smem_raw), L, N, kW, p.heads_per_block);
  const VerifyStage vs = VerifyStage::make(kMode, sizeof(ActT), P, N, L);
  uint8_t* stages =
      reinterpret_cast<uint8_t*>(smem_raw) + StepSmem::bytes(L, N, kW, p.heads_per_block, kMma);
  const int units_per_head = P / vs.rows, units = p.heads_per_block * units_per_head;
  // Unit u is rows row0.. of head h0 + hh; a head is one unit whenever its codes fit a stage
  // (every preset at 8 bits), and then no division is needed.
  auto unit_head = [&](int u) { return units_per_head == 1 ? u : u / units_per_head; };
  auto unit_row0 = [&](int u) { return units_per_head == 1 ? 0 : u % units_per_head * vs.rows; };
  // The 16-byte vectors of a unit's code rows and x rows.
  const XCopy cc = XCopy::make(vs.code_bytes / 16),
              xc = XCopy::make(vs.rows * int(sizeof(ActT)) / 16);
  // W > 1 on the tensor cores with bf16 activations: the ring term on the tensor cores too
  // (ring_term_mma), which reads whole 16-entry steps of the staged x: rows m.. of every stage are
  // zeroed once (the copies write rows < m only), so that they add 0 x 0.
  const bool ring_mma = kMma && kW > 1 && sizeof(ActT) == 2 && !p.act_f16 && L % 16 == 0;
  if (ring_mma) {
    for (int s = 0; s < kStages; ++s) {
      uint16_t* x0 = reinterpret_cast<uint16_t*>(vs.view(stages + s * vs.bytes).ring_x);
      for (int i = m * vs.x_pitch + int(threadIdx.x); i < L * vs.x_pitch; i += blockDim.x)
        x0[i] = 0;
    }
    __syncthreads();  // before any copy lands in a stage
  }
  auto issue = [&](int u) {
    issue_unit<kMode, ActT>(p, sec, after, vs, cc, xc, stages + (u % kStages) * vs.bytes, b,
                            h0 + unit_head(u), unit_row0(u), m);
  };
  // The direct readout's first pieces are loaded while the block forms its weights.
  DirectReader<kDirect ? kMode : Mode::shared_fp8> direct;
  if constexpr (kDirect) {
    direct.init(static_cast<const uint8_t*>(is_separate(kMode) ? sec.read : sec.rec), h0, P, N,
                p.heads_per_block);
    direct.prefetch();
  } else {
    for (int u = 0; u < kStages - 1; ++u) {
      if (u < units)
        issue(u);
      else
        cp_async_commit();  // empty group: the wait count below stays uniform
    }
  }

  // ---- shared by the heads of the group: B of the entries, C of the window, B_k . C_j
  {
    const StageSegment<ActT> seg[3] = {
        {sm.B, static_cast<const ActT*>(sec.ring_B) + int64_t(g) * N, int64_t(G) * N, c, N, true,
         nullptr},
        {sm.B + c * N, static_cast<const ActT*>(p.B) + (int64_t(b) * W * G + g) * N, int64_t(G) * N,
         W, N, false, nullptr},
        {sm.C, static_cast<const ActT*>(p.C) + (int64_t(b) * W * G + g) * N, int64_t(G) * N, W, N,
         false, sm.Cr}};
    stage_segments<ActT, has_bf16_readout(kMode), true>(seg, after, L, p.act_f16);  // n = N
  }
  // The window's ring x and delta for this block's heads (raw copies: the ring holds the
  // activation dtype). Logical positions c.. are read by no block of this step.
  {
    constexpr int kVec = 16 / sizeof(ActT);  // elements per 16-byte vector
    if constexpr (kW == 1) {
      // The block's heads are one contiguous run of x in the input and in the ring.
      const int phys = ring_index(after, c, L);
      uint4* dst =
          reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + (int64_t(phys) * H + h0) * P);
      const uint4* src =
          reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + (int64_t(b) * H + h0) * P);
      for (int i = threadIdx.x; i < p.heads_per_block * P / kVec; i += blockDim.x) dst[i] = src[i];
      for (int hh = threadIdx.x; hh < p.heads_per_block; hh += blockDim.x)
        sec.ring_delta[phys * H + h0 + hh] = entry_delta(p, sec, after, b, h0 + hh, c);
    } else {
      // One flat loop over (head, token, vector): a loop per token serialised the tokens' loads
      // and stores (H200, W = 8 batch 64 separate-fp8: 196.8 -> 206.8 us).
      const int per_row = P / kVec, total = p.heads_per_block * W * per_row;
      for (int u = threadIdx.x; u < total; u += blockDim.x) {
        const int hh = u / (W * per_row), j = u / per_row % W, i = u % per_row;
        const int h = h0 + hh, phys = ring_index(after, c + j, L);
        reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + (int64_t(phys) * H + h) * P)[i] =
            reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) +
                                           ((int64_t(b) * W + j) * H + h) * P)[i];
      }
      for (int u = threadIdx.x; u < p.heads_per_block * W; u += blockDim.x) {
        const int h = h0 + u / W, j = u % W;
        sec.ring_delta[ring_index(after, c + j, L) * H + h] =
            entry_delta(p, sec, after, b, h, c + j);
      }
    }
    // Ring B of the group, by the group's first block: the other blocks of the group stage only
    // committed entries (logical < c), and flush_kernel has folded what these positions held.
    // After a fold in this kernel, by the entry's last block (finish_verify).
    if (!folded && blockIdx.x == 0) append_window_B<ActT>(p, b, sec, after, g, 1);
  }
  if constexpr (kW == 1) {
    // W = 1: the deltas of every head of the block, loaded with the staging above (the window's
    // come from dt, not from the ring positions written there).
    // (head, entry) pairs as t = hh L + k (L a power of two): no division by m.
    const int log2_L = __ffs(L) - 1;
    for (int t = threadIdx.x; t < p.heads_per_block * L; t += blockDim.x) {
      const int hh = t >> log2_L, k = t & (L - 1);
      if (k < m) sm.head_delta[hh * L + k] = entry_delta(p, sec, after, b, h0 + hh, k);
    }
  }
  __syncthreads();
  {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int j = 0; j < W; ++j)
      for (int k = warp; k < m; k += warps) {
        float d = 0.f;
        if (k <= c + j)
          for (int n = lane; n < N; n += 32) d += sm.B[k * N + n] * sm.C[j * N + n];
        d = row_sum(d, 32);
        if (lane == 0) sm.dot[j * L + k] = d;
      }
  }
  // Tensor-core path at W > 1: lane k of every warp holds delta_k of the next head whose weights
  // are to be formed (loaded a head ahead); the first head's are formed here.
  float delta_ahead = 0.f;
  if constexpr (kMma && kW > 1) {
    const int lane = threadIdx.x % 32;
    const float delta_first = lane < m ? entry_delta(p, sec, after, b, h0, lane) : 0.f;
    if (p.heads_per_block > 1 && lane < m)
      delta_ahead = entry_delta(p, sec, after, b, h0 + 1, lane);
    __syncthreads();  // sm.dot
    form_head_weights<kW>(p, sm, h0, delta_first, c, m, 0);
  }
  if constexpr (kW == 1) {
    // The weights of every head of the block, once: per head and unit each lane would form the
    // running sums of its entries itself, the same work in every row group of lanes.
    __syncthreads();  // sm.dot
    const int hpb = p.heads_per_block;
    const int log2_L = __ffs(L) - 1;
    for (int t = threadIdx.x; t < hpb * L; t += blockDim.x) {
      const int hh = t >> log2_L, k = t & (L - 1), i = c;  // i: the token's logical position
      if (k >= m) continue;
      const float* dl = sm.head_delta + hh * L;
      float run = 0.f, Lk = 0.f, Li = 0.f;
      for (int q = 0; q < m; ++q) {  // sequential, the CPU reference's order
        run += dl[q];
        if (q == k) Lk = run;
        if (q == i) Li = run;
      }
      const float A = p.head.A[h0 + hh];
      float w = dl[k] * decay(A * (Li - Lk)) * sm.dot[k];
      if (k == i) w += p.head.D[h0 + hh];
      sm.head_w[hh * L + k] = w;
      if (k == i) sm.head_dec[hh] = decay(A * Li);
    }
  }
  if constexpr (kDirect) {
    build_c_fragments<kMode, true>(sm, N, W);
    __syncthreads();  // head_w, head_dec, c_frag, c_unscale
    const DirectSmem ds = DirectSmem::carve(stages, p.heads_per_block, P);
    direct_ring_pass<kMode, ActT>(p, sm, ds, sec, after, h0, m);
    __syncthreads();  // gain, ring
    direct.run(p, sm.c_frag, ds, (int64_t(b) * H + h0) * P);
    finish_verify<ActT, false>(p, b, slot, G * chunks);
    return;
  }
  if constexpr (kMma) build_c_fragments<kMode>(sm, N, W);  // read after the loop's barrier
  const RowMap rm(p.lanes_per_row, 1);
  float cr[kMma ? 1 : kW][8];  // the FMA readout's Cr_j (each thread works on 8 columns)
  if constexpr (!kMma) {
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      if (j < W) {
        load8(sm.Cr + j * N + rm.n0, cr[j]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) cr[j][i] = 0.f;
      }
    }
  }

  // One reduction serves kBatch = 8 / kW rows: value q * kW + j is row q's y_j, so a lane
  // reduces 8 values in lanes - 1 shuffles however small W is, and the writers are spread over
  // the lanes (lane_in_row / per_value is the value a lane ends up holding).
  constexpr int kBatch = 8 / kW;
  const int per_value = rm.lanes / 8;
  const int v_out = rm.lane_in_row / per_value, q_out = v_out / kW, j_out = v_out % kW;
  const bool writer = rm.lane_in_row % per_value == 0 && j_out < W;
  float wk[kEntries][kW];  // w_jk (+ D when k = i) of the lane's entries, current head
  float dec[kW];           // exp(A L_i)
  float dl_next[kEntries];
  if constexpr (!kMma && kW > 1) {
#pragma unroll
    for (int t = 0; t < kEntries; ++t)
      dl_next[t] = entry_delta(p, sec, after, b, h0, rm.lane_in_row + t * rm.lanes);
  }
  for (int u = 0; u < units; ++u) {
    __syncthreads();  // the stage issued next was consumed in iteration u - 1 (and sm.dot is set)
    if (u + kStages - 1 < units)
      issue(u + kStages - 1);
    else
      cp_async_commit();
    const int h = h0 + unit_head(u), row0 = unit_row0(u);
    if (kMma && kW > 1 && row0 == 0 && h + 1 < h0 + p.heads_per_block) {
      // The next head's weights into the other buffer (its last reader, head h - 1, finished
      // before the barrier above); this head's were formed one head ago.
      const int lane = threadIdx.x % 32;
      form_head_weights<kW>(p, sm, h + 1, delta_ahead, c, m, (h + 1 - h0) & 1);
      if (h + 2 < h0 + p.heads_per_block && lane < m)
        delta_ahead = entry_delta(p, sec, after, b, h + 2, lane);
    } else if (!kMma && kW == 1 && row0 == 0) {
      const int hh = h - h0;
#pragma unroll
      for (int t = 0; t < kEntries; ++t) {
        const int k = rm.lane_in_row + t * rm.lanes;
        wk[t][0] = k < m ? sm.head_w[hh * L + k] : 0.f;
      }
      dec[0] = sm.head_dec[hh];
    } else if (!kMma && row0 == 0) {
      // Running sums in the CPU reference's order (sequential over k), broadcast from the lanes
      // that own the entries; m is uniform over the block, so every lane takes part.
      const float A = p.head.A[h], D = p.head.D[h];
      float dl[kEntries], Lk[kEntries], Li[kW];
#pragma unroll
      for (int t = 0; t < kEntries; ++t) dl[t] = dl_next[t], Lk[t] = 0.f;
      if (h + 1 < h0 + p.heads_per_block)
#pragma unroll
        for (int t = 0; t < kEntries; ++t)
          dl_next[t] = entry_delta(p, sec, after, b, h + 1, rm.lane_in_row + t * rm.lanes);
#pragma unroll
      for (int j = 0; j < kW; ++j) Li[j] = 0.f;
      float run = 0.f;
#pragma unroll
      for (int t = 0; t < kEntries; ++t) {
        for (int l2 = 0; l2 < rm.lanes && t * rm.lanes + l2 < m; ++l2) {
          const int q = t * rm.lanes + l2;
          run += __shfl_sync(0xffffffffu, dl[t], l2, rm.lanes);
          if (l2 == rm.lane_in_row) Lk[t] = run;
#pragma unroll
          for (int j = 0; j < kW; ++j)
            if (q == c + j) Li[j] = run;
        }
      }
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        dec[j] = j < W ? decay(A * Li[j]) : 0.f;
#pragma unroll
        for (int t = 0; t < kEntries; ++t) {
          const int k = rm.lane_in_row + t * rm.lanes, i = c + j;
          float w = 0.f;
          if (j < W && k <= i) w = dl[t] * decay(A * (Li[j] - Lk[t])) * sm.dot[j * L + k];
          if (j < W && k == i) w += D;
          wk[t][j] = w;
        }
      }
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();  // unit u's bytes, copied by every thread, are in shared memory
    uint8_t* stage = stages + (u % kStages) * vs.bytes;
    const SlotSections view = vs.view(stage);
    const ActT* xs = static_cast<const ActT*>(view.ring_x);
    if constexpr (kMma) {
      const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, tq = threadIdx.x % 4;
      const uint8_t* codes = static_cast<const uint8_t*>(view.rec);
      for (int tile = warp; tile < vs.rows / 16; tile += blockDim.x / 32) {
        const int r_lo = tile * 16 + g, r_hi = r_lo + 8;
        float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (r_lo, r_hi) x windows (2 tq, 2 tq + 1)
        mma_tile<kMode>(codes, vs.code_pitch, vs.code_bytes, view.read_block_scale, vs.block_bytes,
                        tile * 16, sm.c_frag, d);
        if constexpr (kW == 1) {
          // Only window column 0 (lanes tq = 0) is a result. The ring term of rows r_lo and r_hi
          // is spread over the 4 lanes of the row pair: lane tq takes entries tq, tq + 4, ...
          const int hh = h - h0;
          const float* w = sm.head_w + hh * L;
          float ring_lo = 0.f, ring_hi = 0.f;
          for (int k = tq; k < m; k += 4) {
            const float wk = w[k];
            ring_lo += wk * act_f32(xs[k * vs.x_pitch + r_lo], p.act_f16);
            ring_hi += wk * act_f32(xs[k * vs.x_pitch + r_hi], p.act_f16);
          }
          ring_lo += __shfl_xor_sync(0xffffffffu, ring_lo, 1);
          ring_hi += __shfl_xor_sync(0xffffffffu, ring_hi, 1);
          ring_lo += __shfl_xor_sync(0xffffffffu, ring_lo, 2);
          ring_hi += __shfl_xor_sync(0xffffffffu, ring_hi, 2);
          if (tq == 0) {
            const float dec = sm.head_dec[hh] * sm.c_unscale[0];
            const int64_t out = (int64_t(b) * H + h) * P + row0;
            store_scalar(p.y, p.y_dtype, out + r_lo,
                         dec * (view.read_scale[r_lo] * d[0]) + ring_lo);
            store_scalar(p.y, p.y_dtype, out + r_hi,
                         dec * (view.read_scale[r_hi] * d[2]) + ring_hi);
          }
        } else {
          // Values q = (row r_lo, r_hi) x (window 2 tq, 2 tq + 1): each entry's x of the two rows
          // and w of the two windows are read once for the four sums (entries in logical order),
          // or, with bf16 activations, the ring term comes from the tensor cores (whole warp).
          const int j0 = 2 * tq, buf = (h - h0) & 1;  // this head's weights (form_head_weights)
          float ring[4] = {0.f, 0.f, 0.f, 0.f};
          if constexpr (sizeof(ActT) == 2)
            if (ring_mma)
              ring_term_mma<kW>(reinterpret_cast<const uint16_t*>(xs), vs.x_pitch, tile * 16,
                                sm.w + buf * kW * L, L, m, ring);
          if (j0 < kW) {  // else no window column here (the arrays hold kW of them)
            float acc[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int r = q < 2 ? r_lo : r_hi, j = j0 + (q & 1);
              acc[q] =
                  sm.dec[buf * kW + j] * sm.c_unscale[j] * (view.read_scale[r] * d[q]) + ring[q];
            }
            const float* w0 = sm.w + (buf * kW + j0) * L;
            for (int k = 0; !ring_mma && k < m; ++k) {
              const float x_lo = act_f32(xs[k * vs.x_pitch + r_lo], p.act_f16);
              const float x_hi = act_f32(xs[k * vs.x_pitch + r_hi], p.act_f16);
              const float wa = w0[k], wb = w0[L + k];
              acc[0] += wa * x_lo;
              acc[1] += wb * x_lo;
              acc[2] += wa * x_hi;
              acc[3] += wb * x_hi;
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int r = q < 2 ? r_lo : r_hi, j = j0 + (q & 1);
              if (j < W)
                store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j) * H + h) * P + row0 + r, acc[q]);
            }
          }
        }
      }
      continue;
    }
    const int slot_row = threadIdx.x / rm.lanes;  // the thread's row within a pass
    for (int r0 = 0; r0 < vs.rows; r0 += kBatch * rm.rows_per_pass) {
      float part[8];
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        const int rc = min(r0 + q * rm.rows_per_pass + slot_row, vs.rows - 1);
        RawChunk raw;
        load_raw8<kMode>(view, rc, rm.n0, N, false, raw);
        float v[8];
        const float scale = decode_raw8<kMode>(raw, false, v);
        float xk[kEntries];
#pragma unroll
        for (int t = 0; t < kEntries; ++t) {
          const int k = rm.lane_in_row + t * rm.lanes;
          xk[t] = k < m ? act_f32(xs[k * vs.x_pitch + rc], p.act_f16) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) s += v[i] * cr[j][i];
          float acc = dec[j] * scale * s;
#pragma unroll
          for (int t = 0; t < kEntries; ++t) acc += wk[t][j] * xk[t];
          part[q * kW + j] = acc;
        }
      }
      const float y = row_sum_values<8>(part, rm.lane_in_row, rm.lanes);
      const int rr = r0 + q_out * rm.rows_per_pass + slot_row;
      if (writer && rr < vs.rows)
        store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j_out) * H + h) * P + row0 + rr, y);
    }
  }
  finish_verify<ActT, kOneLaunch>(p, b, slot, G * chunks);
}

// prefill: fold the committed entries, run the T tokens through the fp32 recurrence (y for each),
// encode the result. One block per (b, h); the cursors are advanced by prefill_finalize_kernel.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads) prefill_kernel(const ReplayParams p) {
  extern __shared__ float4 smem_raw[];
  const int b = blockIdx.x / p.H, h = blockIdx.x % p.H;
  if (!slot_ok(p, b)) return;
  const int slot = p.slots[b];
  const SlotCursors cur = p.cursors[slot];
  const int T = p.tokens, N = p.N, P = p.P, H = p.H, G = p.G;
  const int g = h / (H / G);
  const SlotSections sec = slot_sections(p.geo, slot);
  const FoldSmem f = FoldSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P);
  stage_fold<ActT>(p, sec, cur, cur.committed, h, g, f);
  __syncthreads();
  const float A = p.head.A[h], D = p.head.D[h];
  const RowMap rm(p.lanes_per_row, kStepRows);
  const int lanes = rm.lanes, lane_in_row = rm.lane_in_row, n0 = rm.n0;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rm.rows_per_group) {
    float v[kStepRows][8];
    int prow[kStepRows], clamped[kStepRows];
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      prow[r] = rm.row(base, r);
      clamped[r] = min(prow[r], P - 1);
      load_rec8<kMode>(sec, int64_t(h) * P + clamped[r], n0, N, v[r]);
    }
    fold_rows(v, f, cur.committed, clamped, n0, N, P);
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t(b) * T + t;
      const float delta =
          process_dt(p.dt[bt * H + h], p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
      const float a = expf(delta * A);
      float Bv[8], Cv[8];
      load8_act(static_cast<const ActT*>(p.B) + (bt * G + g) * N + n0, p.act_f16, Bv);
      load8_act(static_cast<const ActT*>(p.C) + (bt * G + g) * N + n0, p.act_f16, Cv);
      const ActT* x = static_cast<const ActT*>(p.x) + (bt * H + h) * P;
#pragma unroll
      for (int r = 0; r < kStepRows; ++r) {
        const int pr = min(prow[r], P - 1);
        const float xv = act_f32(x[pr], p.act_f16);
        const float dx = delta * xv;
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v[r][i] = a * v[r][i] + dx * Bv[i];
          acc += v[r][i] * Cv[i];
        }
        acc = row_sum(acc, lanes);
        if (prow[r] < P && lane_in_row == 0)
          store_scalar(p.y, p.y_dtype, (bt * H + h) * P + pr, acc + D * xv);
      }
    }
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      const int pr = min(prow[r], P - 1);
      const int bad = sanitize8(v[r]);
      if (prow[r] < P) nonfinite += bad;
      float rv[8];
      // A duplicated row (past P) loaded row P - 1 while another warp may already have stored
      // its new values there: it must not store (a second update of that row).
      encode8<kMode>(sec, int64_t(h) * P + pr, n0, N, lane_in_row, lanes, v[r], sr, rv, &saturated,
                     prow[r] < P);
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

// state(slot, at): dense [H, P, N] fp32 = fold(decode(rec), entries 0..at-1). Block per head.
// import (encode = true): encodes dense into the slot's checkpoint(s) instead.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads)
    dense_kernel(const ReplayParams p, int slot, bool encode) {
  extern __shared__ float4 smem_raw[];
  const int h = blockIdx.x;
  const SlotCursors cur = p.cursors[slot];
  const int N = p.N, P = p.P, H = p.H, G = p.G;
  const SlotSections sec = slot_sections(p.geo, slot);
  const FoldSmem f = FoldSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P);
  const int at = encode ? 0 : p.at;
  if (!encode) stage_fold<ActT>(p, sec, cur, at, h, h / (H / G), f);
  __syncthreads();
  const RowMap rm(p.lanes_per_row, 1);
  const int lanes = rm.lanes, lane_in_row = rm.lane_in_row, n0 = rm.n0;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rm.rows_per_pass) {
    const int prow = rm.row(base, 0);
    const int pr = min(prow, P - 1);
    const int64_t row = int64_t(h) * P + pr;
    if (encode) {
      float v[8];
      load8(p.dense + row * N + n0, v);
      const int bad = sanitize8(v);
      if (prow < P) nonfinite += bad;
      float rv[8];
      encode8<kMode>(sec, row, n0, N, lane_in_row, lanes, v, sr, rv, &saturated, prow < P);
    } else {
      float one[1][8];
      load_rec8<kMode>(sec, row, n0, N, one[0]);
      const int rows[1] = {pr};
      fold_rows(one, f, at, rows, n0, N, P);
      if (prow < P) store8_f32(p.dense + row * N + n0, one[0]);
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

}  // namespace replayssm::cuda
