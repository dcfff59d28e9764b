// Kernels of the CUDA replay cache (SPEC sections 3-5). One block per (slot, head) for the heavy
// kernels; a row (h, p) of N elements is held by N/8 consecutive lanes, 8 elements each, and a
// thread keeps kRows rows so that its checkpoint loads are all in flight together.
//
// verify (window W, committed c, running sums L_k = delta_0 + ... + delta_k):
//   flush if c + W > L:   S = fold(decode(rec), entries 0..c-1) in fp32,
//                         S <- a_k S + (delta_k x_k) B_k^T  (a_k = exp(delta_k A)), then encode;
//                         the window then starts at logical 0 of an empty ring (c' = 0)
//   for j = 0..W-1 at logical position i = c' + j:
//     y_j = exp(A L_i) * scale * sum_n R[p,n] C_j[n]            (R = read checkpoint values)
//         + sum_{k <= i} delta_k exp(A (L_i - L_k)) (B_k . C_j) x_k[p] + D x_j[p]
//   In the 8/4-bit read modes R are code values (exact in bf16) and C_j is rounded to bf16
//   (BF16 readout rule); products are exact in fp32 and summed in fp32.
// Ring x and delta of the new entries are written by each head's block; ring B (shared by the
// heads of a group) and the cursors by verify_finalize_kernel, a second launch.
#pragma once

#include "cache/cursors.h"
#include "cuda/replay_codec.cuh"

namespace replayssm::cuda {

inline constexpr int kMaxWindow = 8;    // W <= 8 (one value per lane group of row_sum8)
inline constexpr int kMaxHistory = 32;  // L <= 32
inline constexpr int kStepThreads = 256;
// The non-flushing step has little work per block (no checkpoint rows): smaller blocks, more of
// them resident, so the latency of its dependent loads and barriers overlaps across blocks.
inline constexpr int kNonFlushingThreads = 128;
inline constexpr int kStepRows = 4;  // rows per thread and pass

// The 8- and 4-bit read checkpoints use the BF16 readout rule (SPEC 5).
constexpr bool bf16_readout(Mode mode) {
  return mode == Mode::shared_fp8 || mode == Mode::shared_int8 || mode == Mode::separate_fp8 ||
         mode == Mode::separate_nvfp4;
}

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
  bool force_flush;  // explicit flush: fold whatever is committed
  bool act_f16;      // 16-bit activations are fp16 (else bf16)
  int H, P, N, G, L;
  int lanes_per_row;  // N / 8
  U32x2 key;
  int sr_bits, philox_rounds;
  HeadParams head;
  float* readout;       // [B, W, H, P] scale * (R . C_j) of non-flushing slots (readout_kernel)
  int32_t* flush_list;  // [B] batch entries that flush in this step (collect_flushing_kernel)
  int32_t* flush_count;
  // state / import: one slot, fp32 [H, P, N] buffer, `at` entries folded
  float* dense;
  int at;
};

__device__ __forceinline__ SrContext make_sr(const ReplayParams& p, const SlotCursors& c) {
  return SrContext{p.key, c.request_id, c.flush_index, p.sr_bits, p.philox_rounds};
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

// Checks a slot before a token operation: open, nothing pending, finite inputs. Grid
// (B, kValidateSplit): each block scans a share of the entry's x, B, C, dt in 16-byte loads.
template <typename ActT>
__global__ void __launch_bounds__(256) validate_tokens_kernel(const ReplayParams p) {
  const int b = blockIdx.x, part = blockIdx.y;
  int32_t* st = p.status + b * kValidateSplit;
  const int slot = p.slots[b];
  if (slot < 0) {
    if (threadIdx.x == 0) st[part] = 1;  // padding: skipped, not an error
    return;
  }
  const SlotCursors cur = p.cursors[slot];
  if (!cur.live || cur.pending != 0) {
    if (threadIdx.x == 0) {
      st[part] = 1;
      if (part == 0)
        raise_error(p.error, cur.live ? kErrPending : kErrSlotClosed, slot, cur.pending);
    }
    return;
  }
  const int T = p.tokens;
  const int64_t nx = int64_t(T) * p.H * p.P, nb = int64_t(T) * p.G * p.N, nd = int64_t(T) * p.H;
  const int64_t ux = nx * int64_t(sizeof(ActT)) / 16, ub = nb * int64_t(sizeof(ActT)) / 16;
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + b * nx);
  const uint4* Bm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) + b * nb);
  const uint4* Cm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.C) + b * nb);
  const float* dt = p.dt + b * nd;
  const int64_t total = ux + 2 * ub, stride = int64_t(kValidateSplit) * blockDim.x;
  bool local = false;
#pragma unroll 4
  for (int64_t u = int64_t(part) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const uint4 v = u < ux ? x[u] : (u < ux + ub ? Bm[u - ux] : Cm[u - ux - ub]);
    local |= nonfinite16<ActT>(v, p.act_f16);
  }
  for (int64_t i = int64_t(part) * blockDim.x + threadIdx.x; i < nd; i += stride)
    local |= !isfinite(dt[i]);
  const int bad = __syncthreads_or(local);
  if (threadIdx.x == 0) {
    st[part] = bad ? 1 : 0;
    if (bad) raise_error(p.error, kErrNonFiniteInput, slot, 0);
  }
}

// Validates every slot of a flush (open) into status.
__global__ void validate_slots_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch) return;
  const int slot = p.slots[b];
  int st = 0;
  if (slot < 0) {
    st = 1;
  } else if (!p.cursors[slot].live) {
    st = 1;
    raise_error(p.error, kErrSlotClosed, slot, 0);
  }
  for (int i = 0; i < kValidateSplit; ++i) p.status[b * kValidateSplit + i] = st;
}

// Shared memory of the step kernel, carved from one dynamic buffer.
struct StepSmem {
  float* fold_B;      // [L, N]   committed entries folded by a flush
  float* fold_x;      // [L, P]
  float* fold_sum;    // [L]      running sums of the folded entries
  float* fold_w;      // [L]      delta_k exp(A (L_{m-1} - L_k))
  float* hist_B;      // [L, N]   entries the readout sees (committed, then the window)
  float* hist_x;      // [L, P]
  float* hist_delta;  // [L]
  float* hist_L;      // [L]      running sums
  float* C;           // [kMaxWindow, N]
  float* Cr;          // [kMaxWindow, N]  C rounded to bf16 in the 8/4-bit read modes (else == C)
  float* w;           // [kMaxWindow, L]  delta_k exp(A (L_i - L_k)) (B_k . C_j)
  float* dec;         // [kMaxWindow]     exp(A L_i)
  float* misc;        // [4]              misc[0] = exp(A L_{m-1}) of the fold

  // F = rows reserved for folded entries: L for the flushing kernel, 0 for the others.
  static size_t bytes(int L, int N, int P, int F) {
    return sizeof(float) *
           (size_t(F) * N + size_t(L) * N + size_t(F) * P + size_t(L) * P + 2 * size_t(F) +
            2 * size_t(L) + 2 * size_t(kMaxWindow) * N + size_t(kMaxWindow) * L + kMaxWindow + 4);
  }
  __device__ static StepSmem carve(float* base, int L, int N, int P, int F) {
    StepSmem s;
    s.fold_B = base;
    s.hist_B = s.fold_B + F * N;
    s.C = s.hist_B + L * N;
    s.Cr = s.C + kMaxWindow * N;
    s.fold_x = s.Cr + kMaxWindow * N;
    s.hist_x = s.fold_x + F * P;
    s.fold_sum = s.hist_x + L * P;
    s.fold_w = s.fold_sum + F;
    s.hist_delta = s.fold_w + F;
    s.hist_L = s.hist_delta + L;
    s.w = s.hist_L + L;
    s.dec = s.w + kMaxWindow * L;
    s.misc = s.dec + kMaxWindow;
    return s;
  }
};

template <typename ActT>
__device__ __forceinline__ void copy_row_to_smem(float* dst, const ActT* src, int n, bool f16) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = act_f32(src[i], f16);
}

// dst[k][i] = ring row of logical entry k (k < count), all loads of the block issued together:
// row k lives at base + phys(k) * stride.
template <typename ActT>
__device__ __forceinline__ void stage_ring_rows(float* dst, const ActT* base, int64_t stride,
                                                const SlotCursors& cur, int count, int n, int L,
                                                bool f16) {
  for (int idx = threadIdx.x; idx < count * n; idx += blockDim.x) {
    const int k = idx / n, i = idx - k * n;
    dst[idx] = act_f32(base[int64_t(ring_index(cur, k, L)) * stride + i], f16);
  }
}

// One group of rows to copy into shared memory as fp32: `rows` rows of n elements (n % 8 == 0),
// row k at src + (ring ? phys(k) : k) * stride.
template <typename ActT>
struct StageSegment {
  float* dst;
  const ActT* src;
  int64_t stride;
  int rows, n;
  bool ring;
};
inline constexpr int kStageSegments = 7;

// Copies every segment in one pass of 8-element vector loads, two per thread in flight. The last
// segment is C: with kRoundC its bf16-rounded copy goes to `Cr` as well (else Cr = C).
template <typename ActT, bool kRoundC>
__device__ __forceinline__ void stage_segments(const StageSegment<ActT> (&seg)[kStageSegments],
                                               const SlotCursors& cur, int L, bool f16, float* Cr) {
  int start[kStageSegments + 1];
  start[0] = 0;
#pragma unroll
  for (int s = 0; s < kStageSegments; ++s) start[s + 1] = start[s] + seg[s].rows * (seg[s].n / 8);
  const int total = start[kStageSegments];
  for (int u0 = threadIdx.x; u0 < total; u0 += 2 * blockDim.x) {
    float v[2][8];
    float* dst[2] = {nullptr, nullptr};
    bool isC[2] = {false, false};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int u = u0 + q * blockDim.x;
      if (u >= total) continue;
      // Select the segment with compile-time indices only (a runtime index into `seg` would
      // put it in local memory).
      StageSegment<ActT> sg = seg[0];
      int first = 0;
#pragma unroll
      for (int t = 1; t < kStageSegments; ++t)
        if (u >= start[t]) sg = seg[t], first = start[t], isC[q] = t == kStageSegments - 1;
      const int per_row = sg.n / 8;
      const int k = (u - first) / per_row, c = (u - first) - k * per_row;
      const int row = sg.ring ? ((cur.origin + k) & (L - 1)) : k;
      load8_act(sg.src + int64_t(row) * sg.stride + 8 * c, f16, v[q]);
      dst[q] = sg.dst + k * sg.n + 8 * c;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (dst[q] == nullptr) continue;
      store8_f32(dst[q], v[q]);
      if (isC[q]) {
        float r[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = kRoundC ? bf16_to_f32(f32_to_bf16(v[q][i])) : v[q][i];
        store8_f32(Cr + (dst[q] - seg[kStageSegments - 1].dst), r);
      }
    }
  }
}

// Loads the committed entries 0..count-1 of head h (group g) for a fold in closed form:
//   S = exp(A L_{m-1}) S0 + sum_{k<m} delta_k exp(A (L_{m-1} - L_k)) x_k B_k^T   (m = count)
// (the CPU reference's order: scale the decoded row, then add the entries in logical order).
template <typename ActT>
__device__ __forceinline__ void stage_fold(const ReplayParams& p, const SlotSections& sec,
                                           const SlotCursors& cur, int count, int h, int g,
                                           const StepSmem& sm) {
  const float A = p.head.A[h];
  for (int k = 0; k < count; ++k) {
    const int phys = ring_index(cur, k, p.L);
    copy_row_to_smem(sm.fold_B + k * p.N,
                     static_cast<const ActT*>(sec.ring_B) + (int64_t(phys) * p.G + g) * p.N, p.N,
                     p.act_f16);
    copy_row_to_smem(sm.fold_x + k * p.P,
                     static_cast<const ActT*>(sec.ring_x) + (int64_t(phys) * p.H + h) * p.P, p.P,
                     p.act_f16);
  }
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int k = 0; k < count; ++k) {
      total += sec.ring_delta[ring_index(cur, k, p.L) * p.H + h];
      sm.fold_sum[k] = total;
    }
    for (int k = 0; k < count; ++k)
      sm.fold_w[k] =
          sec.ring_delta[ring_index(cur, k, p.L) * p.H + h] * decay(A * (total - sm.fold_sum[k]));
    sm.misc[0] = decay(A * total);
  }
}

// The fold of stage_fold for one 8-element chunk of row prow.
__device__ __forceinline__ void fold8(float (&s)[8], const StepSmem& sm, int count, int prow,
                                      int n0, int N, int P) {
  const float d0 = sm.misc[0];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] *= d0;
  for (int k = 0; k < count; ++k) {
    const float wx = sm.fold_w[k] * sm.fold_x[k * P + prow];
    const float4 b0 = *reinterpret_cast<const float4*>(sm.fold_B + k * N + n0);
    const float4 b1 = *reinterpret_cast<const float4*>(sm.fold_B + k * N + n0 + 4);
    const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] += wx * bv[i];
  }
}

// NaN -> 0 and +-Inf -> +-FLT_MAX before an encode, as the CPU reference does; returns the count.
__device__ __forceinline__ int sanitize8(float (&s)[8]) {
  int bad = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (isfinite(s[i])) continue;
    ++bad;
    s[i] = isnan(s[i]) ? 0.f : copysignf(3.402823466e38f, s[i]);
  }
  return bad;
}

// The checkpoint readout of the slots that do not flush in this verify, as a pure streaming pass:
//   readout[b][j][h][p] = scale_p * sum_n R[p,n] C_j[n]      (R, scale: read checkpoint values)
// One block of kReadoutThreads per (b, h); a row is held by N/8 lanes (8 elements each, as in
// replay_step_kernel, so the sums are bit-identical), kStepRows rows per thread in flight. The
// checkpoint address depends only on the slot, so its loads start one dependent load after the
// launch; C_j (bf16-rounded in the 8/4-bit read modes) is staged in shared memory meanwhile.
inline constexpr int kReadoutThreads = 128;

template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kReadoutThreads) readout_kernel(const ReplayParams p) {
  __shared__ __align__(16) float Cr[kMaxWindow * 256];  // [W, N], N <= 256
  const int b = blockIdx.x / p.H, h = blockIdx.x % p.H;
  const int W = p.tokens, N = p.N, P = p.P, G = p.G, g = h / (p.H / G);
  const ActT* C = static_cast<const ActT*>(p.C) + (int64_t(b) * W * G + g) * N;
  for (int u = threadIdx.x; u < W * N / 8; u += blockDim.x) {
    const int j = u / (N / 8), n = (u - j * (N / 8)) * 8;
    float v[8];
    load8_act(C + int64_t(j) * G * N + n, p.act_f16, v);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      Cr[j * N + n + i] = bf16_readout(kMode) ? bf16_to_f32(f32_to_bf16(v[i])) : v[i];
  }
  if (!slot_ok(p, b)) return;  // uniform over the block: no barrier is skipped by some threads
  const int slot = p.slots[b];
  const SlotCursors cur = p.cursors[slot];
  if (verify_needs_flush(cur, W, p.L)) return;  // replay_step_kernel<..., true> reads it
  const SlotSections sec = slot_sections(p.geo, slot);
  const int lanes = p.lanes_per_row, lane_in_row = threadIdx.x % lanes, n0 = lane_in_row * 8;
  const int rows_per_pass = blockDim.x / lanes, per_value = lanes / 8;
  __syncthreads();
  for (int base = 0; base < P; base += rows_per_pass * kStepRows) {
    RawChunk raw[kStepRows];
    int prow[kStepRows];
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      prow[r] = base + r * rows_per_pass + threadIdx.x / lanes;
      load_raw8<kMode>(sec, int64_t(h) * P + min(prow[r], P - 1), n0, N, false, raw[r]);
    }
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      float v[8];
      const float scale = decode_raw8<kMode>(raw[r], false, v);
      float part[kMaxWindow];
#pragma unroll
      for (int j = 0; j < kMaxWindow; ++j) {
        if (j >= W) {
          part[j] = 0.f;
          continue;
        }
        const float4 c0 = *reinterpret_cast<const float4*>(Cr + j * N + n0);
        const float4 c1 = *reinterpret_cast<const float4*>(Cr + j * N + n0 + 4);
        part[j] = v[0] * c0.x + v[1] * c0.y + v[2] * c0.z + v[3] * c0.w + v[4] * c1.x +
                  v[5] * c1.y + v[6] * c1.z + v[7] * c1.w;
      }
      const float dotC = row_sum8(part, lane_in_row, lanes);
      const int j = lane_in_row / per_value;
      if (prow[r] < P && j < W && lane_in_row % per_value == 0)
        p.readout[((int64_t(b) * W + j) * p.H + h) * P + prow[r]] = scale * dotC;
    }
  }
}

// verify (tokens = W >= 1) or explicit flush (tokens = 0, force_flush) of batch entry b, head h,
// by one block. kFlushing = true serves the slots that flush (fold, encode and readout from the
// new codes in one pass over the checkpoint; replay_flush_kernel); kFlushing = false the others,
// whose checkpoint readout readout_kernel has already streamed into p.readout, so this only
// stages the ring, appends the window and adds the ring term (no checkpoint bytes, little shared
// memory, many blocks per SM; replay_step_kernel). Entries of the other kind return at once.
template <Mode kMode, typename ActT, bool kFlushing>
__device__ __forceinline__ void replay_step(const ReplayParams& p, const int b, const int h) {
  extern __shared__ float4 smem_raw[];
  if (!slot_ok(p, b)) return;
  const int slot = p.slots[b];
  const SlotCursors cur = p.cursors[slot];
  const int W = p.tokens, L = p.L, N = p.N, P = p.P, H = p.H, G = p.G;
  const int g = h / (H / G);
  if (((p.force_flush && cur.committed > 0) || (W > 0 && verify_needs_flush(cur, W, L))) !=
      kFlushing)
    return;
  constexpr bool flush = kFlushing;
  const int c_fold = flush ? cur.committed : 0;
  const int c_hist = flush ? 0 : cur.committed;
  SlotCursors after = cur;
  if (flush) apply_flush(after, L);
  const SlotSections sec = slot_sections(p.geo, slot);
  const StepSmem sm =
      StepSmem::carve(reinterpret_cast<float*>(smem_raw), L, N, P, kFlushing ? L : 0);
  const float A = p.head.A[h], D = p.head.D[h];
  const int m = c_hist + W;  // entries seen by the readout

  // ---- checkpoint rows of the first row group: their loads are issued before the staging so
  // that their latency overlaps it
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  const int n0 = lane_in_row * 8;
  const int rows_per_pass = blockDim.x / lanes;
  const int rows_per_group = rows_per_pass * kStepRows;
  const int per_value = lanes / 8;  // lanes holding each reduced value of row_sum8
  float v[kStepRows][8];
  float scale[kStepRows];
  int prow[kStepRows];
  RawChunk raw[kStepRows];
  auto load_group = [&](int base) {
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      prow[r] = base + r * rows_per_pass + threadIdx.x / lanes;
      const int pr = min(prow[r], P - 1);  // out-of-range rows compute on a duplicate, unstored
      load_raw8<kMode>(sec, int64_t(h) * P + pr, n0, N, flush, raw[r]);
    }
  };
  if constexpr (kFlushing) load_group(0);

  // ---- stage ring entries and the window's inputs in shared memory: one pass over all rows in
  // 8-element vectors, two per thread in flight
  {
    const ActT* ringB = static_cast<const ActT*>(sec.ring_B) + int64_t(g) * N;
    const ActT* ringX = static_cast<const ActT*>(sec.ring_x) + int64_t(h) * P;
    const ActT* newB = static_cast<const ActT*>(p.B) + (int64_t(b) * W * G + g) * N;
    const ActT* newX = static_cast<const ActT*>(p.x) + (int64_t(b) * W * H + h) * P;
    const ActT* newC = static_cast<const ActT*>(p.C) + (int64_t(b) * W * G + g) * N;
    const StageSegment<ActT> seg[kStageSegments] = {
        {sm.fold_B, ringB, int64_t(G) * N, c_fold, N, true},
        {sm.fold_x, ringX, int64_t(H) * P, c_fold, P, true},
        {sm.hist_B, ringB, int64_t(G) * N, c_hist, N, true},
        {sm.hist_x, ringX, int64_t(H) * P, c_hist, P, true},
        {sm.hist_B + c_hist * N, newB, int64_t(G) * N, W, N, false},
        {sm.hist_x + c_hist * P, newX, int64_t(H) * P, W, P, false},
        {sm.C, newC, int64_t(G) * N, W, N, false}};
    stage_segments<ActT, bf16_readout(kMode)>(seg, cur, L, p.act_f16, sm.Cr);
  }
  for (int j = W + threadIdx.x / 32; j < kMaxWindow; j += blockDim.x / 32)  // zero padding
    for (int n = threadIdx.x % 32; n < N; n += 32) sm.C[j * N + n] = sm.Cr[j * N + n] = 0.f;
  for (int k = threadIdx.x; k < c_fold; k += blockDim.x)
    sm.fold_w[k] = sec.ring_delta[ring_index(cur, k, L) * H + h];  // delta_k for now
  for (int k = threadIdx.x; k < c_hist; k += blockDim.x)
    sm.hist_delta[k] = sec.ring_delta[ring_index(cur, k, L) * H + h];
  for (int j = threadIdx.x; j < W; j += blockDim.x)
    sm.hist_delta[c_hist + j] = process_dt(p.dt[(int64_t(b) * W + j) * H + h], p.head.dt_bias[h],
                                           p.head.dt_min, p.head.dt_max);
  __syncthreads();

  // ---- new ring entries of this head (x, delta); everything they overwrite is staged above
  // (x from the staged fp32 copy: the conversion back to the activation type is exact)
  for (int idx = threadIdx.x; idx < W * P; idx += blockDim.x) {
    const int j = idx / P, i = idx - j * P;
    const int phys = ring_index(after, c_hist + j, L);
    const float v = sm.hist_x[(c_hist + j) * P + i];
    ActT* dst = static_cast<ActT*>(sec.ring_x) + (int64_t(phys) * H + h) * P + i;
    if constexpr (sizeof(ActT) == 4)
      *dst = v;
    else
      *dst = p.act_f16 ? __half_as_ushort(__float2half_rn(v)) : f32_to_bf16(v);
  }
  for (int j = threadIdx.x; j < W; j += blockDim.x)
    sec.ring_delta[ring_index(after, c_hist + j, L) * H + h] = sm.hist_delta[c_hist + j];
  if (threadIdx.x == 0) {
    float run = 0.f;
    for (int k = 0; k < m; ++k) {
      run += sm.hist_delta[k];
      sm.hist_L[k] = run;
    }
    if (flush) {  // fold weights of stage_fold, from the staged deltas
      float total = 0.f;
      for (int k = 0; k < c_fold; ++k) {
        total += sm.fold_w[k];
        sm.fold_sum[k] = total;
      }
      for (int k = 0; k < c_fold; ++k) sm.fold_w[k] *= decay(A * (total - sm.fold_sum[k]));
      sm.misc[0] = decay(A * total);
    }
  }
  __syncthreads();
  // w[j][k] = delta_k exp(A (L_i - L_k)) (B_k . C_j), one warp per (j, k), i = c_hist + j
  {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int pair = warp; pair < W * m; pair += warps) {
      const int j = pair / m, k = pair % m;
      const int i = c_hist + j;
      float dot = 0.f;
      if (k <= i)
        for (int n = lane; n < N; n += 32) dot += sm.hist_B[k * N + n] * sm.C[j * N + n];
      dot = row_sum(dot, 32);
      if (lane == 0)
        sm.w[j * L + k] =
            k <= i ? sm.hist_delta[k] * decay(A * (sm.hist_L[i] - sm.hist_L[k])) * dot : 0.f;
    }
    for (int j = threadIdx.x; j < W; j += blockDim.x) sm.dec[j] = decay(A * sm.hist_L[c_hist + j]);
  }
  __syncthreads();

  if constexpr (!kFlushing) {
    // y_j = exp(A L_i) * readout_j + sum_{k <= i} w[j][k] x_k + D x_i, i = c + j
    for (int idx = threadIdx.x; idx < W * P; idx += blockDim.x) {
      const int j = idx / P, pr = idx - j * P, i = c_hist + j;
      const int64_t out = ((int64_t(b) * W + j) * H + h) * P + pr;
      float acc = sm.dec[j] * p.readout[out];
      for (int k = 0; k <= i; ++k) acc += sm.w[j * L + k] * sm.hist_x[k * P + pr];
      acc += D * sm.hist_x[i * P + pr];
      store_scalar(p.y, p.y_dtype, out, acc);
    }
    return;
  }

  // ---- checkpoint rows: flush (fold + encode) and readout
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rows_per_group) {
    if (base > 0) load_group(base);
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) scale[r] = decode_raw8<kMode>(raw[r], flush, v[r]);
    if constexpr (flush) {
#pragma unroll
      for (int r = 0; r < kStepRows; ++r) {
        const int pr = min(prow[r], P - 1);
        fold8(v[r], sm, c_fold, pr, n0, N, P);
        const bool store = prow[r] < P;
        const int bad = sanitize8(v[r]);
        if (store) nonfinite += bad;
        float rv[8];
        int sat = 0;
        // Out-of-range rows duplicate row P-1 bit for bit, so their stores are harmless; every
        // lane must take part in encode8's row reductions.
        scale[r] =
            encode8<kMode>(sec, int64_t(h) * P + pr, n0, N, lane_in_row, lanes, v[r], sr, rv, &sat);
        if (!store) sat = 0;
        saturated += sat;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[r][i] = rv[i];
      }
    }
    if (W == 0) continue;
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      float part[kMaxWindow];
#pragma unroll
      for (int j = 0; j < kMaxWindow; ++j) {
        if (j >= W) {
          part[j] = 0.f;
          continue;
        }
        const float4 c0 = *reinterpret_cast<const float4*>(sm.Cr + j * N + n0);
        const float4 c1 = *reinterpret_cast<const float4*>(sm.Cr + j * N + n0 + 4);
        part[j] = v[r][0] * c0.x + v[r][1] * c0.y + v[r][2] * c0.z + v[r][3] * c0.w +
                  v[r][4] * c1.x + v[r][5] * c1.y + v[r][6] * c1.z + v[r][7] * c1.w;
      }
      const float dotC = row_sum8(part, lane_in_row, lanes);
      const int j = lane_in_row / per_value;
      if (prow[r] < P && j < W && lane_in_row % per_value == 0) {
        const int i = c_hist + j;
        const int pr = prow[r];
        float acc = sm.dec[j] * (scale[r] * dotC);
        for (int k = 0; k <= i; ++k) acc += sm.w[j * L + k] * sm.hist_x[k * P + pr];
        acc += D * sm.hist_x[i * P + pr];
        store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j) * H + h) * P + pr, acc);
      }
    }
  }
  if (saturated) atomicAdd(&p.stats->saturated, (unsigned long long)saturated);
  if (nonfinite) atomicAdd(&p.stats->nonfinite, (unsigned long long)nonfinite);
}

// The non-flushing slots: one block per (b, h); blocks of flushing slots exit at once.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads, 4) replay_step_kernel(const ReplayParams p) {
  replay_step<kMode, ActT, false>(p, blockIdx.x / p.H, blockIdx.x % p.H);
}

// Lists the batch entries that flush in this step (p.flush_count zeroed before the launch), so
// the heavy flushing kernel runs over them alone instead of over every (b, h) of the batch.
__global__ void collect_flushing_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch || !slot_ok(p, b)) return;
  const SlotCursors cur = p.cursors[p.slots[b]];
  const bool flushes = (p.force_flush && cur.committed > 0) ||
                       (p.tokens > 0 && verify_needs_flush(cur, p.tokens, p.L));
  if (flushes) p.flush_list[atomicAdd(p.flush_count, 1)] = b;
}

// The flushing slots: a grid of a few blocks per SM strides over the (listed entry, head) items;
// the barrier between items keeps one item's shared memory from being overwritten by the next.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads, 1) replay_flush_kernel(const ReplayParams p) {
  const int items = *p.flush_count * p.H;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    replay_step<kMode, ActT, true>(p, p.flush_list[item / p.H], item % p.H);
    __syncthreads();
  }
}

// Second launch of verify / flush: ring B of the window and the cursors. One block per b.
template <typename ActT>
__global__ void verify_finalize_kernel(const ReplayParams p) {
  const int b = blockIdx.x;
  if (!slot_ok(p, b)) return;
  const int slot = p.slots[b];
  SlotCursors cur = p.cursors[slot];
  const int W = p.tokens, L = p.L;
  const bool flush =
      (p.force_flush && cur.committed > 0) || (W > 0 && verify_needs_flush(cur, W, L));
  SlotCursors after = cur;
  if (flush) apply_flush(after, L);
  const SlotSections sec = slot_sections(p.geo, slot);
  // 16-byte vectors (G * N * sizeof(ActT) is a multiple of 16), all of a thread's in flight.
  const int per_row = p.G * p.N * int(sizeof(ActT)) / 16;
#pragma unroll 4
  for (int u = threadIdx.x; u < W * per_row; u += blockDim.x) {
    const int j = u / per_row, i = u - j * per_row;
    const int phys = ring_index(after, after.committed + j, L);
    reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_B))[int64_t(phys) * per_row + i] =
        reinterpret_cast<const uint4*>(
            static_cast<const ActT*>(p.B))[(int64_t(b) * W + j) * per_row + i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (W > 0) apply_verify(after, W);
    p.cursors[slot] = after;
    if (flush) {
      atomicAdd(&p.stats->flushes, 1ull);
      atomicAdd(&p.stats->checkpoint_writes, 1ull);
    }
  }
}

// commit: accepted [B] on the device; invalid counts raise an error and leave the slot as is.
__global__ void commit_kernel(SlotCursors* cursors, const int32_t* slots, const int32_t* accepted,
                              int batch, DeviceError* error) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const int slot = slots[b];
  if (slot < 0) return;
  SlotCursors cur = cursors[slot];
  if (!cur.live) {
    raise_error(error, kErrSlotClosed, slot, 0);
    return;
  }
  const int k = accepted[b];
  if (!commit_is_valid(cur, k)) {
    raise_error(error, kErrCommitRange, slot, k);
    return;
  }
  apply_commit(cur, k);
  cursors[slot] = cur;
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
  const StepSmem sm = StepSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P, p.L);
  stage_fold<ActT>(p, sec, cur, cur.committed, h, g, sm);
  __syncthreads();
  const float A = p.head.A[h], D = p.head.D[h];
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  const int n0 = lane_in_row * 8;
  const int rows_per_pass = blockDim.x / lanes;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rows_per_pass * kStepRows) {
    float v[kStepRows][8];
    int prow[kStepRows];
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      prow[r] = base + r * rows_per_pass + threadIdx.x / lanes;
      const int pr = min(prow[r], P - 1);
      load_rec8<kMode>(sec, int64_t(h) * P + pr, n0, N, v[r]);
      fold8(v[r], sm, cur.committed, pr, n0, N, P);
    }
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
      int sat = 0;
      // Duplicated out-of-range rows write the same values as row P-1: harmless.
      encode8<kMode>(sec, int64_t(h) * P + pr, n0, N, lane_in_row, lanes, v[r], sr, rv, &sat);
      if (prow[r] < P) saturated += sat;
    }
  }
  if (saturated) atomicAdd(&p.stats->saturated, (unsigned long long)saturated);
  if (nonfinite) atomicAdd(&p.stats->nonfinite, (unsigned long long)nonfinite);
}

// After prefill: the committed entries are folded and the checkpoint written.
__global__ void prefill_finalize_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch || !slot_ok(p, b)) return;
  const int slot = p.slots[b];
  SlotCursors cur = p.cursors[slot];
  cur.origin = (cur.origin + cur.committed) & (p.L - 1);
  cur.committed = 0;
  cur.pending = 0;
  cur.flush_index += 1;
  p.cursors[slot] = cur;
  atomicAdd(&p.stats->checkpoint_writes, 1ull);
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
  const StepSmem sm = StepSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P, p.L);
  const int at = encode ? 0 : p.at;
  if (!encode) stage_fold<ActT>(p, sec, cur, at, h, h / (H / G), sm);
  __syncthreads();
  const int lanes = p.lanes_per_row;
  const int lane_in_row = threadIdx.x % lanes;
  const int n0 = lane_in_row * 8;
  const int rows_per_pass = blockDim.x / lanes;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rows_per_pass) {
    const int prow = base + threadIdx.x / lanes;
    const int pr = min(prow, P - 1);
    const int64_t row = int64_t(h) * P + pr;
    float v[8];
    if (encode) {
      load8(p.dense + row * N + n0, v);
      const int bad = sanitize8(v);
      if (prow < P) nonfinite += bad;
      float rv[8];
      int sat = 0;
      encode8<kMode>(sec, row, n0, N, lane_in_row, lanes, v, sr, rv, &sat);
      if (prow < P) saturated += sat;
    } else {
      load_rec8<kMode>(sec, row, n0, N, v);
      fold8(v, sm, at, pr, n0, N, P);
      if (prow < P) store8_f32(p.dense + row * N + n0, v);
    }
  }
  if (saturated) atomicAdd(&p.stats->saturated, (unsigned long long)saturated);
  if (nonfinite) atomicAdd(&p.stats->nonfinite, (unsigned long long)nonfinite);
}

// Sets one slot's cursors (open, release, fork) without a host round trip.
__global__ void set_cursors_kernel(SlotCursors* cursors, int slot, SlotCursors value) {
  cursors[slot] = value;
}

// fork: dst's cursors = src's with a new request id.
__global__ void fork_cursors_kernel(SlotCursors* cursors, int src, int dst, uint64_t request_id) {
  SlotCursors c = cursors[src];
  c.request_id = request_id;
  c.pending = 0;
  cursors[dst] = c;
}

}  // namespace replayssm::cuda
