// Shared by the replay kernels: parameters, device errors, validation, shared-memory layouts,
// staging and the fold of committed entries.
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cache/cursors.h"
#include "core/fast_div.h"
#include "core/nonfinite.h"
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

// A batch entry with what validate_tokens read for it: every entry's in ReplayParams::verify_order
// (the chained verify), the flushing ones' also in the flush list. A flush item or a verify
// block then needs one dependent load (this) before its checkpoint and ring loads instead of
// slots[b] -> cursors[slot].
struct ValidatedEntry {
  SlotCursors cursors;  // as validated (no kernel between validation and verify changes them)
  int32_t b;            // batch entry (its inputs, outputs and status words)
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
  int32_t* flush_count;        // 0 before the validate kernel (cleared after each flush_kernel by
                               // the kernel after it: verify_kernel, flush_finalize_kernel)
  int32_t* arrivals;           // [B] verify blocks of each entry done so far (0 between verifies)
  // [B] the chained verify's entries in the order its blocks run (blockIdx.z), set only where
  // verify_kernel follows: those whose blocks wait for flush_kernel last (validate_tokens,
  // order_place and order_arrive); slot -1 where the entry does not take part. A verify block
  // finds its entry's slot, cursors and verdict in one load instead of the slots[b] ->
  // cursors[slot] chain of two and the status words.
  ValidatedEntry* verify_order = nullptr;
  // verify_order holds each entry at its own index b, without a verdict (verify_kernel reads the
  // status words): entry order (verify_order_pays)
  bool verify_in_place = false;
  uint32_t* order_counts;       // [1] entries placed at the front | at the back << 16 (0 between)
  uint32_t* validate_arrivals;  // [B] validate_tokens' arrivals per entry (0 between steps)
  int heads_per_block;          // verify_kernel: heads of one group per block
  // small_step_kernel, small_verify_kernel: each head's rows split over 2^this blocks
  // (small_step_split_log2, small_verify_shape)
  int step_split_log2 = 0;
  // verify: small_verify_kernel serves the step (verify_small_window); validate_tokens then lets
  // it start at once (its own dependent launch: allow_dependent_launch at the top)
  bool small_window = false;
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

// An entry's status words, loaded where the caller wants their trip to memory to start and
// checked (ok()) where it needs the verdict.
struct EntryStatus {
  int4 a, c;
  __device__ static EntryStatus load(const ReplayParams& p, int b) {
    const int4* st = reinterpret_cast<const int4*>(p.status + b * kValidateSplit);
    return EntryStatus{st[0], st[1]};
  }
  __device__ bool ok() const { return (a.x | a.y | a.z | a.w | c.x | c.y | c.z | c.w) == 0; }
};
__device__ __forceinline__ bool slot_ok(const ReplayParams& p, int b) {
  return EntryStatus::load(p, b).ok();
}

// True when one of the values packed in 16 bytes is NaN or Inf (exponent field all ones), by
// core/nonfinite.h: every value of a word at once.
template <typename ActT>
__device__ __forceinline__ bool nonfinite16(const uint4 v, bool f16) {
  const PackedFields f = packed_fields(int(sizeof(ActT)), f16);
  return any_nonfinite(exponent_carries(v.x, f) | exponent_carries(v.y, f) |
                           exponent_carries(v.z, f) | exponent_carries(v.w, f),
                       f);
}

// Eight activations as they are in memory (16 or 32 bytes), converted where they are used: half
// the registers of their fp32 values for 16-bit activations.
template <typename ActT>
struct Act8 {
  uint4 raw[sizeof(ActT) / 2] = {};
  __device__ void load(const ActT* src) {
#pragma unroll
    for (int i = 0; i < int(sizeof(ActT)) / 2; ++i) raw[i] = reinterpret_cast<const uint4*>(src)[i];
  }
  __device__ void get(bool f16, float (&out)[8]) const { convert8_act<ActT>(raw, f16, out); }
  __device__ bool nonfinite(bool f16) const {
    bool bad = false;
#pragma unroll
    for (int i = 0; i < int(sizeof(ActT)) / 2; ++i) bad |= nonfinite16<ActT>(raw[i], f16);
    return bad;
  }
};

// The inputs of batch entry b as the validation scans them: x, B and C of every token as one run
// of 16-byte vectors (x first), and dt.
template <typename ActT>
struct EntryInputs {
  const uint4* x;   // [T H P] activations
  const uint4* B;   // [T G N]
  const uint4* C;   // [T G N]
  const float* dt;  // [T H]
  int64_t x_vectors, b_vectors, vectors, dts;
  __device__ EntryInputs(const ReplayParams& p, int b) {
    const int T = p.tokens;
    const int64_t nx = int64_t(T) * p.H * p.P, nb = int64_t(T) * p.G * p.N;
    dts = int64_t(T) * p.H;
    x_vectors = nx * int64_t(sizeof(ActT)) / 16;
    b_vectors = nb * int64_t(sizeof(ActT)) / 16;
    vectors = x_vectors + 2 * b_vectors;
    x = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + b * nx);
    B = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) + b * nb);
    C = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.C) + b * nb);
    dt = p.dt + b * dts;
  }
  __device__ const uint4* vector(int64_t u) const {
    return u < x_vectors ? x + u
                         : (u < x_vectors + b_vectors ? B + (u - x_vectors)
                                                      : C + (u - x_vectors - b_vectors));
  }
};

// Whether this thread's share of batch entry b's inputs (x, B, C and dt of every token) holds a
// NaN or Inf: the 16-byte vectors first, first + stride, ..., then the dt values likewise
// (validate_tokens_kernel, whose threads scan a vector or two; small_step_kernel's blocks where
// the entry folds).
template <typename ActT>
__device__ __forceinline__ bool entry_has_nonfinite(const ReplayParams& p, int b, int64_t first,
                                                    int64_t stride) {
  const EntryInputs<ActT> in(p, b);
  bool bad = false;
#pragma unroll 8  // several of a thread's loads in flight together
  for (int64_t u = first; u < in.vectors; u += stride)
    bad |= nonfinite16<ActT>(*in.vector(u), p.act_f16);
  for (int64_t i = first; i < in.dts; i += stride) bad |= !isfinite(in.dt[i]);
  return bad;
}

// The slot checks of validate_tokens_kernel made by a block of a one-launch step for its own
// entry: open, nothing pending (`cur`: the slot's cursors, as every block of the entry reads
// them). The block with `report` raises the error. Uniform over the block.
__device__ __forceinline__ bool slot_takes_step(const ReplayParams& p, int slot,
                                                const SlotCursors& cur, bool report) {
  if (cur.live && cur.pending == 0) return true;
  if (report && threadIdx.x == 0)
    raise_error(p.error, cur.live ? kErrPending : kErrSlotClosed, slot, cur.pending);
  return false;
}

// Shared memory of verify_kernel (one per (slot, group) block), carved from one dynamic buffer;
// `windows` = W rounded up as the kernel is specialised (1, 4 or 8), `heads` = heads per block,
// `mma`: the tensor-core readout of the 8/4-bit read modes (its B fragments).
struct StepSmem {
  // B and C hold the 16-bit activations as they are in the direct readout at W > 1 with 16-bit
  // activations (verify_kernel's kRawStage), in the same space.
  float* B;    // [L, N]         entries the readout sees: committed, then the window
  float* C;    // [windows, N]
  float* Cr;   // [windows, N]   C rounded to bf16 in the 8/4-bit read modes (else == C)
  float* dot;  // [windows, L]   B_k . C_j (k <= c + j, else 0)
  // Per head, for the tensor-core readout at W > 1, two buffers (head parity): the next head's
  // are formed while the current one's are read.
  float* w;    // [2, windows, L]  w_jk (+ D when k = i)
  float* dec;  // [2, windows]     exp(A L_i)
  // W = 1 and the direct readout (all_heads): the weights of every head of the block, formed
  // once before the readout.
  float* head_delta;  // [heads, L]           delta_k of each head
  float* head_w;      // [heads, windows, L]  w_jk (+ D when k = i)
  float* head_dec;    // [heads, windows]     exp(A L_i)
  // Tensor-core readout: B fragments of the window's C (build_c_fragments).
  float* c_unscale;  // [8]           undoes C_j's fp16 scaling and the decoder's own factor
  uint2* c_frag;     // [N / 16, 32]  k-step s, lane

  __host__ __device__ static size_t head_floats(int L, int windows, int heads, bool all_heads) {
    return windows == 1 || all_heads ? size_t(heads) * (L + windows * (L + 1)) : 0;
  }
  __host__ __device__ static size_t bytes(int L, int N, int windows, int heads, bool mma,
                                          bool all_heads = false) {
    const size_t floats = size_t(L) * N + size_t(windows) * (2 * N + 3 * L + 2) +
                          head_floats(L, windows, heads, all_heads) + 8;
    const size_t frag_offset = (sizeof(float) * floats + 15) / 16 * 16;
    return frag_offset + (mma ? size_t(N) / 16 * 32 * sizeof(uint2) : 0);  // 16-byte multiple
  }
  __device__ static StepSmem carve(float* base, int L, int N, int windows, int heads,
                                   bool all_heads = false) {
    StepSmem s;
    s.B = base;
    s.C = s.B + L * N;
    s.Cr = s.C + windows * N;
    s.dot = s.Cr + windows * N;
    s.w = s.dot + windows * L;
    s.dec = s.w + 2 * windows * L;
    s.head_delta = s.dec + 2 * windows;
    s.head_w = s.head_delta + heads * L;
    s.head_dec = s.head_w + heads * windows * L;
    // head_* only at W = 1 and with all_heads
    s.c_unscale = s.head_delta + head_floats(L, windows, heads, all_heads);
    s.c_frag = reinterpret_cast<uint2*>(base + bytes(L, N, windows, heads, false, all_heads) /
                                                   sizeof(float));
    return s;
  }
};

// How a fold reads its entries (stage_fold, fold_rows). x_and_weights: x_k[p] and w_k, multiplied
// by every lane of a row in each of its row groups. products: w_k x_k[p], formed once per (entry,
// row) after the weights, in place. product_pairs: the products in a [P, pitch] copy, a row's
// entries side by side, read two entries at a time. The product forms take one FMUL and one load
// per entry and row out of the fold's loop, but their pass over x runs while the first row
// group's loads are in flight: the separate modes' whole-head flush items take them (flush_head);
// the 96-register flush kernels (shared modes, fp32, bf16) spilled up to 56 bytes more with them,
// and so did small_step_kernel (ptxas).
enum class FoldForm { x_and_weights, products, product_pairs };

// Shared memory of a fold (flush, prefill, state): the committed entries of one head.
// x_staged holds x as the ring's rows arrive, [L, P]; with FoldForm::products, then the products
// w_k x_k[p]. FoldForm::product_pairs puts the products into x, [P, pitch], once the staging's
// barrier has passed: storing the staging's vectors transposed instead held more registers while
// the first row group's loads were in flight (the fp32 mode's flush spilled 60 bytes more).
struct FoldSmem {
  float* B;         // [L, N]
  float* x_staged;  // [L, P]      x_k[p] (products: w_k x_k[p]) at k P + p (k x_rows + p, held)
  float* w;         // [L]         w_k = delta_k exp(A (L_{m-1} - L_k))
  float* delta;     // [L]         delta_k, logical order (staging)
  float* d0;        // [1]         exp(A L_{m-1})
  float* x;         // [P, pitch]  w_k x_k[p] at p pitch + k (product_pairs only)
  // L rounded up to 4, plus 2: even for the 8-byte loads, and 2 mod 4, so that the
  // transposition's stores (16 consecutive rows) fall in distinct banks.
  int pitch;

  __host__ __device__ static int pitch_of(int L) { return (L + 3) / 4 * 4 + 2; }
  __host__ __device__ static size_t x_offset(int L, int N, int P) {  // 16-byte aligned
    return (size_t(L) * (N + P + 2) + 1 + 3) / 4 * 4;
  }
  __host__ __device__ static size_t bytes(int L, int N, int P) {
    return sizeof(float) * (x_offset(L, N, P) + size_t(pitch_of(L)) * P);
  }
  // B, x_staged, w, delta and d0 where the [L, P] fold has always had them (the kernels that do
  // not transpose form no other address); w is 8-byte aligned (L (N + P) is even).
  __device__ static FoldSmem carve(float* base, int L, int N, int P) {
    FoldSmem f;
    f.B = base;
    f.x_staged = f.B + L * N;
    f.w = f.x_staged + L * P;
    f.delta = f.w + L;
    f.d0 = f.delta + L;
    f.x = base + x_offset(L, N, P);
    f.pitch = pitch_of(L);
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

// Copies every segment in one pass of 8-element vector loads, kInFlight per thread in flight:
// each round issues its raw loads before it converts and stores any of them, so a thread waits
// once per round (a fold's operands at history 16 and dstate 128 are 3 vectors per thread of a
// 128-thread block: one round at kInFlight = 4).
// kPow2Rows: every segment's n is a power of two (dstate), so a vector's row is a shift.
template <typename ActT, bool kRound, bool kPow2Rows, int kSegments, int kInFlight = 2>
__device__ __forceinline__ void stage_segments(const StageSegment<ActT> (&seg)[kSegments],
                                               const SlotCursors& cur, int L, bool f16) {
  int start[kSegments + 1];
  start[0] = 0;
#pragma unroll
  for (int s = 0; s < kSegments; ++s) start[s + 1] = start[s] + seg[s].rows * (seg[s].n / 8);
  const int total = start[kSegments];
  for (int u0 = threadIdx.x; u0 < total; u0 += kInFlight * blockDim.x) {
    Act8<ActT> raw[kInFlight];
    float* dst[kInFlight];
    float* rounded[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      dst[q] = rounded[q] = nullptr;
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
      raw[q].load(sg.src + int64_t(row) * sg.stride + 8 * c);
      dst[q] = sg.dst + k * sg.n + 8 * c;
      if (sg.rounded) rounded[q] = sg.rounded + k * sg.n + 8 * c;
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (dst[q] == nullptr) continue;
      float v[8];
      raw[q].get(f16, v);
      store8_f32(dst[q], v);
      if (rounded[q] == nullptr) continue;
      float r[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = kRound ? bf16_to_f32(f32_to_bf16(v[i])) : v[i];
      store8_f32(rounded[q], r);
    }
  }
}

// run = delta[0] + ... + delta[count - 1] and upto = delta[0] + ... + delta[k], summed one after
// another as the CPU reference sums them; the deltas (shared memory) are loaded 8 at a time,
// so that the chain of additions waits for one load in 8.
__device__ __forceinline__ void running_sums(const float* delta, int count, int k, float& run,
                                             float& upto) {
  for (int q0 = 0; q0 < count; q0 += 8) {
    float d[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = q0 + i < count ? delta[q0 + i] : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (q0 + i < count) run += d[i];
      if (q0 + i == k) upto = run;
    }
  }
}

// The committed entries' operands of a fold that a block already holds (small_verify_kernel):
// B and x at every ring position in shared memory, as they are in the ring (ActT), and the
// head's delta at ring position threadIdx.x (threads 0 .. L - 1) in a register. A block that
// folds some of the head's rows (a split head) holds x of those rows only.
template <typename ActT>
struct FoldOperands {
  const ActT* B;  // [L, N] the head's group
  const ActT* x;  // [L, x_rows] the head's rows x_first .. x_first + x_rows - 1
  float delta;    // at ring position threadIdx.x
  int x_first;
  int x_rows;
};

// Loads the committed entries 0..count-1 of head h (group g) for a fold in closed form
// (f.x_staged: [count, x_rows], x_rows = held ? held->x_rows : P, the rows the block holds; with
// FoldForm::product_pairs also f.x: [x_rows, f.pitch]):
//   S = exp(A L_{m-1}) S0 + sum_{k<m} delta_k exp(A (L_{m-1} - L_k)) x_k B_k^T   (m = count)
// (the CPU reference's order: scale the decoded row, then add the entries in logical order),
// from the slot's ring, or from `held` where the block holds them. The deltas' loads are issued
// with the operands', and all of a thread's operand loads at once (one round at history 16,
// dstate 128): a flush item's operands cost one trip to memory, not three.
// Ends with the weights (or the products, kForm) being written: they are ready after the
// caller's next barrier.
template <typename ActT, FoldForm kForm = FoldForm::x_and_weights>
__device__ __forceinline__ void stage_fold(const ReplayParams& p, const SlotSections& sec,
                                           const SlotCursors& cur, int count, int h, int g,
                                           const FoldOperands<ActT>* held, const FoldSmem& f) {
  // Thread t stages the delta of logical entry k_t (count <= L <= 32 < blockDim.x).
  int k_t = -1;
  float delta_t = 0.f;
  if (held) {
    if (int(threadIdx.x) < p.L)
      k_t = (int(threadIdx.x) - cur.origin) & (p.L - 1), delta_t = held->delta;
  } else if (int(threadIdx.x) < count) {
    k_t = threadIdx.x;
    delta_t = sec.ring_delta[ring_index(cur, k_t, p.L) * p.H + h];
  }
  // The held copies are the group's and the head's alone ([L, N], [L, P]); the slot's ring rows
  // hold every group's B and every head's x.
  const int x_rows = held ? held->x_rows : p.P;
  const StageSegment<ActT> seg[2] = {
      {f.B, held ? held->B : static_cast<const ActT*>(sec.ring_B) + int64_t(g) * p.N,
       held ? int64_t(p.N) : int64_t(p.G) * p.N, count, p.N, true, nullptr},
      {f.x_staged, held ? held->x : static_cast<const ActT*>(sec.ring_x) + int64_t(h) * p.P,
       held ? int64_t(held->x_rows) : int64_t(p.H) * p.P, count, x_rows, true, nullptr}};
  // 64 bytes per thread in flight: 4 vectors of 16-bit values, 2 of fp32 (4 spilled up to 136
  // bytes in the fp32-activation flush kernels).
  stage_segments<ActT, false, false, 2, 64 / (8 * int(sizeof(ActT)))>(seg, cur, p.L, p.act_f16);
  if (k_t >= 0 && k_t < count) f.delta[k_t] = delta_t;
  __syncthreads();
  // Thread k forms the weight of entry k; every thread sums the deltas in logical order, the CPU
  // reference's order.
  const int k = threadIdx.x;
  float total = 0.f, upto = 0.f;
  running_sums(f.delta, count, k, total, upto);
  const float A = p.head.A[h];
  if (k < count) f.w[k] = f.delta[k] * decay(A * (total - upto));
  if (k == 0) *f.d0 = decay(A * total);
  if constexpr (kForm == FoldForm::x_and_weights) return;
  __syncthreads();
  // The products w_k x_k[p] (the same fp32 products the x_and_weights fold forms, so the same
  // sums). Thread p takes row p, so that consecutive threads read consecutive words of each
  // entry; the pairs' copy takes two entries per 8-byte store.
  for (int row = threadIdx.x; row < x_rows; row += blockDim.x) {
    float* from = f.x_staged + row;
    if constexpr (kForm == FoldForm::product_pairs) {
      float* to = f.x + row * f.pitch;
      int e = 0;
      for (; e + 2 <= count; e += 2, from += 2 * x_rows)
        *reinterpret_cast<float2*>(to + e) =
            make_float2(f.w[e] * from[0], f.w[e + 1] * from[x_rows]);
      if (e < count) to[e] = f.w[e] * from[0];
    } else {
      for (int e = 0; e < count; ++e, from += x_rows) *from = f.w[e] * *from;
    }
  }
}

// B_k's 8 columns of a chunk from the fold's shared memory ([L, N], 16-byte aligned): two
// 16-byte loads.
__device__ __forceinline__ void load_b8(const float* b, float (&bv)[8]) {
  const float4 b0 = *reinterpret_cast<const float4*>(b);
  const float4 b1 = *reinterpret_cast<const float4*>(b + 4);
  bv[0] = b0.x, bv[1] = b0.y, bv[2] = b0.z, bv[3] = b0.w;
  bv[4] = b1.x, bv[5] = b1.y, bv[6] = b1.z, bv[7] = b1.w;
}

// One entry of the fold for R rows' 8-element chunks: s += wx[r] b, b = B_k's 8 columns and
// wx[r] the row's product w_k x_k[p].
template <int R>
__device__ __forceinline__ void fold_entry(float (&s)[R][8], const float* b, const float (&wx)[R]) {
  float bv[8];
  load_b8(b, bv);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 8; ++i) s[r][i] += wx[r] * bv[i];
}

// The fold of stage_fold for one 8-element chunk (columns n0..n0+7) of each of R rows:
//   s = d0 s; then s += (w_k x_k[p]) B_k for k = 0..count-1, in logical order.
// xrow: the row's index among the staged rows. B_k's 8 columns are two 16-byte loads for all R
// rows; x_k[p] (or the product, kForm) is f.x_staged[k x_stride + xrow]. product_pairs: two
// entries at a time from f.x, each row's two products one 8-byte load. Only separate-fp8's
// whole-head flush takes the pairs: they hold R more registers, and the kernels at their register
// bounds (the 80-register flushes, small_step_kernel, the chunked flushes) spilled with them.
template <FoldForm kForm = FoldForm::x_and_weights, int R>
__device__ __forceinline__ void fold_rows(float (&s)[R][8], const FoldSmem& f, int count,
                                          const int (&xrow)[R], int n0, int N, int x_stride) {
  constexpr bool kPairs = kForm == FoldForm::product_pairs;
  const float d0 = *f.d0;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 8; ++i) s[r][i] *= d0;
  // Pointers advanced per entry (the indexed form recomputed every address per entry and row).
  const float* bk = f.B + n0;
  const float* xk[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xk[r] = kPairs ? f.x + xrow[r] * f.pitch : f.x_staged + xrow[r];
  int k = 0;
  if constexpr (kPairs) {
    for (; k + 2 <= count; k += 2, bk += 2 * N) {
      float wx0[R], wx1[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float2 wx2 = *reinterpret_cast<const float2*>(xk[r]);
        wx0[r] = wx2.x, wx1[r] = wx2.y;
        xk[r] += 2;
      }
      fold_entry(s, bk, wx0);
      fold_entry(s, bk + N, wx1);
    }
  }
  // One entry at a time, each row's product formed (or read) where it is used. Not fold_entry
  // with the R values loaded first: that held more registers in the kernels that fold one entry at
  // a time (shared-fp8's small_step_kernel then spilled 12-20 bytes, ptxas).
  auto one_entry = [&](int entry) {
    float bv[8];
    load_b8(bk, bv);
    const float wk = kForm == FoldForm::x_and_weights ? f.w[entry] : 1.f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float wx = kForm == FoldForm::x_and_weights ? wk * *xk[r] : *xk[r];
      xk[r] += kPairs ? 1 : x_stride;
#pragma unroll
      for (int i = 0; i < 8; ++i) s[r][i] += wx * bv[i];
    }
    bk += N;
  };
  // The compiler unrolls the x_and_weights loop by 4 by itself (told to, the 96-register flush
  // kernels spilled up to 24 bytes more) and the products' by 16, which made the flush kernels a
  // third larger: those are held at 4.
  if constexpr (kPairs) {
    if (k < count) one_entry(k);
  } else if constexpr (kForm == FoldForm::products) {
#pragma unroll 4
    for (; k < count; ++k) one_entry(k);
  } else {
    for (; k < count; ++k) one_entry(k);
  }
}

// v * 0 is NaN exactly when v is NaN or +-Inf: one FMA per element, accumulated into `probe`,
// finds out whether any value needs fixing, so that the per-element fix-up is skipped in the
// common all-finite case.
__device__ __forceinline__ float nonfinite_probe8(const float (&s)[8], float probe = 0.f) {
#pragma unroll
  for (int i = 0; i < 8; ++i) probe = fmaf(s[i], 0.f, probe);
  return probe;
}
// The fix-up: NaN -> 0, +-Inf -> +-FLT_MAX; returns the count.
__device__ __forceinline__ int fix_nonfinite8(float (&s)[8]) {
  int bad = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (isfinite(s[i])) continue;
    ++bad;
    s[i] = isnan(s[i]) ? 0.f : copysignf(3.402823466e38f, s[i]);
  }
  return bad;
}
// NaN -> 0 and +-Inf -> +-FLT_MAX before an encode, as the CPU reference does; returns the count.
__device__ __forceinline__ int sanitize8(float (&s)[8]) {
  return isnan(nonfinite_probe8(s)) ? fix_nonfinite8(s) : 0;
}

// sanitize8 found out by the lane amaxes (lane_amax8, NaN-sticky), which the encodes need anyway:
// a NaN or an Inf leaves its chunk's amax above FLT_MAX, so the common all-finite case costs a
// compare, not nonfinite_probe8's FMA per element. Where one is found (rare), the chunk is fixed
// (sanitize8 probes it again) and its amax taken again.
__device__ __forceinline__ bool finite_amax(float lane_amax) {
  return lane_amax <= 3.402823466e38f;
}
__device__ __forceinline__ int resanitize(float (&v)[8], float& lane_amax) {
  const int bad = sanitize8(v);
  lane_amax = lane_amax8(v);
  return bad;
}
// One chunk.
__device__ __forceinline__ int sanitize_by_amax(float (&v)[8], float& lane_amax) {
  return finite_amax(lane_amax) ? 0 : resanitize(v, lane_amax);
}
// K chunks, with one compare for all of them; past it every row is fixed. A row whose own amax is
// finite then probes itself for nothing, but with a per-row test there (sanitize_by_amax) ptxas
// spilled 8 bytes in shared-fp8's small_step_kernel, and with fix_nonfinite8 alone instead of the
// probe about 200 bytes in separate-fp8's flush kernels of the long stochastic rounding (r = 13).
template <int K>
__device__ __forceinline__ void sanitize_rows(float (&v)[K][8], float (&lane_amax)[K],
                                              int (&bad)[K]) {
  bool finite = true;
#pragma unroll
  for (int r = 0; r < K; ++r) bad[r] = 0, finite = finite && finite_amax(lane_amax[r]);
  if (!finite)
#pragma unroll
    for (int r = 0; r < K; ++r) bad[r] = resanitize(v[r], lane_amax[r]);
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

}  // namespace replayssm::cuda
