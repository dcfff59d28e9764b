// The verify's staging: shared-memory stages of the read checkpoint, cp.async copies, the
// window's ring appends and the end of a verify block.
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include <cuda/atomic>

#include "cuda/flush_kernel.cuh"
#include "cuda/replay_common.cuh"

namespace replayssm::cuda {

// ---- verify: staging --------------------------------------------------------------------------
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
// 4 bytes (cp.async.ca: .cg copies 16 bytes only).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// A hint that `bytes` (a multiple of 16) at `gmem` (16-byte aligned) be brought into L2, by the
// calling thread alone (sm_90 bulk prefetch: no completion to wait for).
__device__ __forceinline__ void bulk_prefetch_l2(const void* gmem, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(__cvta_generic_to_global(gmem)),
               "r"(bytes));
#endif
}
// Copies `bytes` (a multiple of 16) with the block's threads, 16 bytes each.
__device__ __forceinline__ void cp_async_block(void* smem, const void* gmem, int bytes) {
  for (int i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    cp_async16(static_cast<uint8_t*>(smem) + 16 * i, static_cast<const uint8_t*>(gmem) + 16 * i);
}

// Copies `rows` rows of `row_bytes` (a multiple of 16) each, the source rows `src_stride` bytes
// apart, into consecutive rows at smem; every 16-byte piece in flight at once.
__device__ __forceinline__ void cp_async_rows(void* smem, const void* gmem, int rows, int row_bytes,
                                              int64_t src_stride) {
  const int per_row = row_bytes / 16;
  for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
    const int r = i / per_row, piece = i - r * per_row;
    cp_async16(static_cast<uint8_t*>(smem) + 16 * i,
               static_cast<const uint8_t*>(gmem) + r * src_stride + 16 * piece);
  }
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
// delta_k of head h (k < c + W, else 0): the ring's of a committed entry, else processed from the
// window entry's dt. In two halves where several loads should be in flight before any is used:
// the raw value (k < c + W) and its processing.
__device__ __forceinline__ float entry_delta_raw(const ReplayParams& p, const SlotSections& sec,
                                                 const SlotCursors& after, int b, int h, int k) {
  const int c = after.committed;
  return k < c ? sec.ring_delta[ring_index(after, k, p.L) * p.H + h]
               : p.dt[(int64_t(b) * p.tokens + k - c) * p.H + h];
}
__device__ __forceinline__ float entry_delta_from_raw(const ReplayParams& p,
                                                      const SlotCursors& after, int h, int k,
                                                      float raw) {
  return k < after.committed ? raw
                             : process_dt(raw, p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
}
__device__ __forceinline__ float entry_delta(const ReplayParams& p, const SlotSections& sec,
                                             const SlotCursors& after, int b, int h, int k) {
  if (k >= after.committed + p.tokens) return 0.f;
  return entry_delta_from_raw(p, after, h, k, entry_delta_raw(p, sec, after, b, h, k));
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
  const uint8_t* codes = readout_codes<kMode>(sec);
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
    cp_async_block(v.rec_scale, readout_scales<kMode>(sec) + row, vs.rows * vs.scale_bytes);
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
// `after` (the cursors after any flush of this step), in 16-byte vectors, from `src` (the window's
// first row there: token j's groups start at src + j * src_stride).
template <typename ActT>
__device__ __forceinline__ void append_window_B_from(const ReplayParams& p, const SlotSections& sec,
                                                     const SlotCursors& after, int g0, int groups,
                                                     const ActT* src, int64_t src_stride) {
  const int W = p.tokens, per_row = groups * p.N * int(sizeof(ActT)) / 16;
  for (int u = threadIdx.x; u < W * per_row; u += blockDim.x) {
    const int j = u / per_row, i = u - j * per_row;
    const int phys = ring_index(after, after.committed + j, p.L);
    reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_B) + (int64_t(phys) * p.G + g0) * p.N)[i] =
        reinterpret_cast<const uint4*>(src + j * src_stride)[i];
  }
}
// The same from the step's input B of batch entry b.
template <typename ActT>
__device__ __forceinline__ void append_window_B(const ReplayParams& p, int b,
                                                const SlotSections& sec, const SlotCursors& after,
                                                int g0, int groups) {
  append_window_B_from<ActT>(
      p, sec, after, g0, groups,
      static_cast<const ActT*>(p.B) + (int64_t(b) * p.tokens * p.G + g0) * p.N, int64_t(p.G) * p.N);
}

// What the last block of an entry that folded in one launch appends to the ring besides the
// window's B (finish_verify): nothing more, or the window's delta of every head, or x too.
enum class WindowAppend { none, delta, x_and_delta };

// The window's delta (and with `x` its x) of every head into the ring at logical positions c..
// of `after` (the cursors after this step's fold), from the step's inputs of batch entry b; delta
// as each head's blocks computed it.
template <typename ActT>
__device__ __forceinline__ void append_window_x_delta(const ReplayParams& p, int b,
                                                      const SlotSections& sec,
                                                      const SlotCursors& after, bool x) {
  const int H = p.H, W = p.tokens;
  auto phys = [&](int j) { return ring_index(after, after.committed + j, p.L); };
  if (x) {
    const int vectors = H * p.P * int(sizeof(ActT)) / 16;  // a token's x [H, P]
    const uint4* const src =
        reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + int64_t(b) * W * H * p.P);
    for (int u = threadIdx.x; u < W * vectors; u += blockDim.x) {
      const int j = u / vectors, i = u - j * vectors;
      reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + int64_t(phys(j)) * H * p.P)[i] =
          src[u];
    }
  }
  for (int u = threadIdx.x; u < W * H; u += blockDim.x) {
    const int j = u / H, h = u - j * H;
    sec.ring_delta[phys(j) * H + h] =
        HeadScalars::load(p.head, h).delta(p.dt[(int64_t(b) * W + j) * H + h]);
  }
}

// The entry's last block to finish a verify: the arrival counter made ready for the next verify,
// then the cursors after this verify (and its commit, for a decode) from `cur` (after any flush).
__device__ __forceinline__ void advance_cursors(const ReplayParams& p, int b, int slot,
                                                SlotCursors cur) {
  p.arrivals[b] = 0;
  apply_verify(cur, p.tokens);
  if (p.commit_window) apply_commit(cur, p.tokens);
  p.cursors[slot] = cur;
}

// The work of an entry's last block once every block of the entry is done with the cursors and
// the ring (finish_verify, finish_arrived_verify): `cur` is the slot's cursors as the step read
// them, flushed here where the step flushed; in one launch the whole block appends what the
// fold left to it (finish_verify says what), then thread 0 advances the cursors and counts the
// flush. Without kOneLaunch only thread 0 need call it.
template <typename ActT, bool kOneLaunch>
__device__ __forceinline__ void finish_entry(const ReplayParams& p, int b, int slot,
                                             SlotCursors cur, WindowAppend append) {
  const bool flush = verify_needs_flush(cur, p.tokens, p.L);
  if (flush) apply_flush(cur, p.L);
  if (kOneLaunch && flush) append_window_B<ActT>(p, b, slot_sections(p.geo, slot), cur, 0, p.G);
  if (kOneLaunch && flush && append != WindowAppend::none)
    append_window_x_delta<ActT>(p, b, slot_sections(p.geo, slot), cur,
                                append == WindowAppend::x_and_delta);
  if (threadIdx.x != 0) return;
  advance_cursors(p, b, slot, cur);
  if (flush) {
    atomicAdd(&p.stats->flushes, 1ull);
    atomicAdd(&p.stats->checkpoint_writes, 1ull);
  }
}

// The end of a block of the one-launch kernels (small_step_kernel, small_verify_kernel) at a step
// that folds: the last block of batch entry b to finish (a per-entry arrival counter) advances
// the slot's cursors, so no block of the entry can still read the old ones and no separate
// finalize launch is needed. Where the entry flushed (its blocks folded their heads in that
// kernel), that whole block also appends the window's B of every group: the window's ring positions
// may be those of committed entries (c + W wraps past the ring's end), whose B the other blocks of
// the group fold until they finish. Uniform over the block.
// `known`: the slot's cursors as every block of the entry read them (so the last block does not
// load them again). `append` (a head's rows split over several blocks): after a fold the last
// block also appends what the other blocks of a head may still read until they finish: the
// window's delta of every head, and x in small_step_kernel (whose folds read the ring's x;
// small_verify_kernel's blocks fold from their own copies of their rows and append those).
template <typename ActT>
__device__ __forceinline__ void finish_verify(const ReplayParams& p, int b, int slot,
                                              int blocks_per_entry, const SlotCursors& known,
                                              WindowAppend append) {
  __syncthreads();  // every thread of this block is past its reads of the cursors and the ring
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&p.arrivals[b], 1) == blocks_per_entry - 1;
  }
  if (!__syncthreads_or(last)) return;
  __threadfence();
  finish_entry<ActT, true>(p, b, slot, known, append);
}

// The arrival of a block of small_step_kernel or small_verify_kernel at a step that does not
// fold: the cursors are then the only memory that the entry's last block writes and the entry's
// blocks read, so a block may arrive as soon as all its threads hold them (the caller's barrier
// is between their loads and this). Thread 0 takes the ticket; the atomic's round trip overlaps
// the rest of the step instead of ending it (finish_verify: a fence and an atomic after the
// readout).
// A relaxed atomic: the one order it must keep is every block's read of the cursors before the
// last block's write of them, and that write depends on every block's arrival, each of which
// follows (through the caller's barrier, whose reduction consumes them) its block's cursor values:
// a read that saw the write would be a self-satisfying cycle of dependencies, which the PTX memory
// model's no-thin-air axiom excludes. A release (fence and atomic) would hold thread 0 at once for
// the fence; an acq_rel one did (H200, session 29's phase clocks: 1400-1500 cycles before B_k . C).
// `refused` (small_step_kernel): this block found a NaN or Inf in its share of the entry's inputs;
// the arrival then adds kArrivalRefused as well, so that the last block sees it.
// Above any entry's block count: kMaxHeads heads of small_step_kernel or small_verify_kernel,
// each split over up to 2^kSmallStepMaxSplitLog2 blocks, every one of which may arrive refused
// without overflow.
inline constexpr int kSmallStepMaxSplitLog2 = 3;
inline constexpr int32_t kArrivalRefused = 1 << 16;
static_assert((kMaxHeads << kSmallStepMaxSplitLog2) < kArrivalRefused &&
              int64_t(kMaxHeads << kSmallStepMaxSplitLog2) * (1 + kArrivalRefused) < (1ll << 31));
__device__ __forceinline__ int early_arrival(const ReplayParams& p, int b, bool refused = false) {
  if (threadIdx.x != 0) return 0;
  ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> arrivals(p.arrivals[b]);
  return arrivals.fetch_add(refused ? 1 + kArrivalRefused : 1, ::cuda::memory_order_relaxed);
}

// The end of such a block: the last to arrive advances the cursors (`known`: as every block read
// them; no flush in this step), or, where a block of the entry (`refused`: this one) found its
// inputs not finite, leaves them as they were and raises the error, once per entry.
__device__ __forceinline__ void finish_early_arrival(const ReplayParams& p, int b, int slot,
                                                     int blocks_per_entry, const SlotCursors& known,
                                                     int ticket, bool refused = false) {
  if (threadIdx.x != 0 || ticket % kArrivalRefused != blocks_per_entry - 1) return;
  if (refused || ticket >= kArrivalRefused) {
    p.arrivals[b] = 0;
    raise_error(p.error, kErrNonFiniteInput, slot, 0);
    return;
  }
  advance_cursors(p, b, slot, known);
}

// The end of a chained verify block that arrived early (early_arrival, after its last read of
// the ring): the entry's last block to arrive finishes the entry from `validated`, the entry's
// copy made by validate_tokens (no kernel of the step writes the slot's cursors before this).
template <typename ActT>
__device__ __forceinline__ void finish_arrived_verify(const ReplayParams& p, int b, int slot,
                                                      int blocks_per_entry,
                                                      const SlotCursors& validated, int ticket) {
  if (threadIdx.x != 0 || ticket != blocks_per_entry - 1) return;
  finish_entry<ActT, false>(p, b, slot, validated, WindowAppend::none);
}

// The end of a chained verify block that reads the ring until its end (the ring term on the
// tensor cores, W > 1, and the staged readout): the entry's first block finishes the entry from
// the entry's copy placed by validate_tokens (ReplayParams::verify_order, this block's). No block
// of verify_kernel or flush_kernel reads the slot's cursors, and the next step's validate_tokens
// waits for this grid to complete, so one block may write them at any point: no arrival counter,
// barrier, fence or atomic round trip at the end of every block. The copy is loaded again here
// rather than held from the block's start, whose registers the 64- and 80-register kernels need
// (held, they spilled 16-40 bytes).
template <typename ActT>
__device__ __forceinline__ void finish_chained_verify(const ReplayParams& p, int b, int slot) {
  if ((threadIdx.x | blockIdx.x | blockIdx.y) != 0) return;
  finish_entry<ActT, false>(p, b, slot, p.verify_order[blockIdx.z].cursors, WindowAppend::none);
}

}  // namespace replayssm::cuda
