// The flush: fold the committed entries into the checkpoint and encode it (SPEC 4, 5).
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/flush_mma.cuh"
#include "cuda/replay_common.cuh"

namespace replayssm::cuda {

// ---- flush -------------------------------------------------------------------------------------
// S = fold(decode(rec), committed entries 0..c-1) in fp32, encoded into every checkpoint of the
// mode. A streaming pass over the recurrence checkpoint of each flushing slot, one (slot, head)
// item per block at a time, its next row group's loads in flight while the current one is folded
// and encoded. The verify kernel that follows reads the new read checkpoint like any other; a
// one-launch step (small_step_kernel, small batches) runs flush_head for its block's head itself.
inline constexpr int kFlushThreads = 128;
static_assert(kFoldMmaWarps * 32 == kFlushThreads, "flush_head_mma strides its tiles by the warps");
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
// So separate-nvfp4 has a second shape, separate-fp8's (kOneRound), which the launcher takes for
// steps whose items stay whole and fit in one round of its grid (flush_fits_one_round; session
// 17's A/B of the fixed shape, after the lighter e2m1 codecs: W = 1 batch 64 56.9 -> 51.9 us,
// W = 8 batch 64 205.7 -> 211.4, W = 1 batch 256 173.4 -> 181.0). Only the whole-head form
// takes it (replay_launch.cuh has the numbers). separate-fp8 given the same two shapes (2 rows at
// 6 blocks wherever its items take more than one round) lost 1.5-5.1% wherever they differ (H200
// session 39: batch 256 W = 8 434.2 -> 440.8 us, batch 16 W = 1 22.0 -> 23.1) and keeps 4 rows.
constexpr bool has_one_round_flush(Mode mode) { return mode == Mode::separate_nvfp4; }
constexpr int flush_rows(Mode mode, bool one_round = false) {
  const bool four = mode == Mode::separate_fp8 || (one_round && has_one_round_flush(mode));
  return four ? 4 : uses_stochastic_rounding(mode) ? 2 : kStepRows;
}
constexpr int flush_min_blocks(Mode mode, bool one_round = false) {
  const bool four = mode == Mode::separate_fp8 || (one_round && has_one_round_flush(mode));
  return four ? 4 : uses_stochastic_rounding(mode) ? 6 : 5;
}

// The entries expected to flush in a step of `batch` slots and `tokens` tokens each: batch x
// tokens / L rounded up, as many as the rings fill in a step once the slots' phases spread; an
// explicit flush (tokens = 0) flushes all `batch`.
inline int64_t flush_expected_entries(int batch, int tokens, int L) {
  return tokens == 0 ? batch : (int64_t(batch) * tokens + L - 1) / L;
}
// Whether a flush launch takes flush_kernel's chunked form: when the expected entries give at
// most half as many (entry, head) items as the grid has blocks. Whether separate-nvfp4's whole-head
// form takes its one-round shape: when they fit in one round of that shape's grid. Only
// performance choices: every form flushes any count.
inline bool flush_splits_rows(int batch, int tokens, int L, int H, int grid) {
  return 2 * flush_expected_entries(batch, tokens, L) * H <= grid;
}
inline bool flush_fits_one_round(int batch, int tokens, int L, int H, int grid) {
  return flush_expected_entries(batch, tokens, L) * H <= grid;
}
// The whole-head flush's grid: no more blocks than the step's (entry, head) items (batch x H) nor
// than are resident (`resident`, all that fit). separate-fp8's autoregressive steps (one token per
// slot) take at most 2 blocks per SM, not the 4 that fit, so that the chained verify's blocks (124
// registers each) find room on every SM from the start and read the checkpoints while the flush
// (instruction-bound: 0.55 issued per scheduler, session 62's ncu) computes, at the cost of a
// longer flush. H100, session 64 (bench/results/2026-12-07-h100-session64.md, against main's
// program in the same calls): W = 1 batch 64 48.2 -> 47.4 us, batch 256 174.5 -> 169.7. Session
// 62 (-h100-session62.md, the cap as a knob) found it the one cell that gains: not at W = 8, where
// the flush is most of the step (+25%), nor separate-nvfp4 (its one-round shape needs the full
// grid: +14%), nor shared-fp8 (+4.5% at batch 64).
inline int flush_whole_head_grid(Mode mode, int batch, int tokens, int H, int resident,
                                 int sm_count) {
  const int cap =
      mode == Mode::separate_fp8 && tokens == 1 ? std::min(resident, 2 * sm_count) : resident;
  return int(std::min<int64_t>(int64_t(batch) * H, cap));
}

// kShortSr: the caller knows r <= kSrByteMaxBits (8: encode8_f16_sr's short form only, a byte of
// a draw per element) and N % 16 == 0, so that the two lanes of a draw group share its draws
// (paired_row_draws).
// check_b >= 0: the item comes from the flush list and is skipped (after its first loads and the
// staging of its fold's operands, so that their latency and the status words' overlap) unless
// entry check_b is valid.
// kChunked: the item is chunk `chunk` of `chunks` shares of the head's row groups (flush_kernel);
// otherwise the whole head (the arguments are ignored, and the loop keeps its registers).
// kFlushKernel: flush_kernel's items (the default) may take the leaner forms of the fold
// (FoldForm) and of the NaN check (sanitize_by_amax); the one-launch kernels (small_step_kernel,
// small_verify_kernel), at their register bounds, pass false and keep the plain ones (with them,
// their fp32-activation kernels spilled up to 16 bytes more, ptxas).
// held (small_verify_kernel): the fold's operands the block holds (stage_fold) and the first row
// group of the recurrence checkpoint, loaded by the caller (load_group, rec) before it knew
// whether the step may write; with kChunked, x of the chunk's rows only.
template <Mode kMode, typename ActT, int kRows = flush_rows(kMode), bool kShortSr = false,
          bool kChunked = false, bool kFlushKernel = true>
__device__ __forceinline__ void flush_head(const ReplayParams& p, int slot, const SlotCursors& cur,
                                           int h, float* smem, int check_b = -1, int chunk = 0,
                                           int chunks = 1, const FoldOperands<ActT>* held = nullptr,
                                           const RawChunk* held_raw = nullptr) {
  const int N = p.N, P = p.P;
  const SlotSections sec = slot_sections(p.geo, slot);
  const RowMap rm(p.lanes_per_row, kRows);
  const int groups = (P + rm.rows_per_group - 1) / rm.rows_per_group;
  const int row_begin = kChunked ? chunk * groups / chunks * rm.rows_per_group : 0;
  const int row_end = kChunked ? min(P, (chunk + 1) * groups / chunks * rm.rows_per_group) : P;
  // Rows of the staged x (f.x_staged): the held ones, else the head's.
  const int x_first = held ? held->x_first : 0, x_rows = held ? held->x_rows : P;
  RawChunk raw[kRows];
  int prow[kRows];
  if (held_raw) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) raw[r] = held_raw[r], prow[r] = rm.row(row_begin, r);
  } else {
    load_group<kMode>(sec, rm, h, P, N, row_begin, true, raw, prow);
  }
  // The verdict is needed before the first store to the checkpoint, not before the staging of
  // the fold's operands (shared memory only; a listed entry's cursors are a live slot's): its
  // loads, the staging's and the first row group's share one trip to memory.
  const EntryStatus status = check_b >= 0 ? EntryStatus::load(p, check_b) : EntryStatus{};
  const FoldSmem f = FoldSmem::carve(smem, p.L, N, P);
  // The fold's form (FoldForm): the products in the separate modes' whole-head flush items, in
  // pairs in separate-fp8's (4 rows). A chunk would form the products of every row of its head
  // for its share of them, with a barrier more in a chain that the step waits for; the one-launch
  // kernels and the other modes keep x and the weights as well.
  constexpr FoldForm kForm = !kFlushKernel || kChunked || !is_separate(kMode)
                                 ? FoldForm::x_and_weights
                             : kMode == Mode::separate_fp8 && kRows == 4 ? FoldForm::product_pairs
                                                                         : FoldForm::products;
  stage_fold<ActT, kForm>(p, sec, cur, cur.committed, h, int(p.by_group_heads.div(h)), held, f);
  if (!status.ok()) return;  // uniform over the block
  __syncthreads();
  const SrContext sr = make_sr(p, cur);
  // Where a thread has 4 rows or more (128 registers), the row amaxes and random draws of all
  // its rows are formed side by side before the rows' encodes (EncodePrep); at 2 rows and 80
  // registers the draws taken first spilled (H200 session 36), and so did separate-nvfp4's
  // one-round shape at 4 rows and 128 (24 bytes; its encode holds more).
  // Elsewhere each row is sanitized just before its encode: the rows sanitized together first (one
  // probe) held more registers, and the 2-row kernels at 80 spilled up to 24 bytes.
  constexpr bool kPrepFirst = kRows >= 4 && kMode != Mode::separate_nvfp4 &&
                              (is_separate(kMode) || is_shared_quantized(kMode));
  // Elsewhere in the modes with row scales, each row's lane amax is taken before its encode,
  // which needs it, and tells whether the row needs sanitize8's fix-up (sanitize_by_amax).
  constexpr bool kAmaxFirst =
      kFlushKernel && !kPrepFirst && (is_separate(kMode) || is_shared_quantized(kMode));
  int saturated = 0, nonfinite = 0;
  for (int base = row_begin; base < row_end; base += rm.rows_per_group) {
    float v[kRows][8];
    int row[kRows];
    int clamped[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      decode_raw8<kMode>(raw[r], true, v[r]);
      row[r] = prow[r];
      clamped[r] = min(row[r], P - 1);
    }
    if (base + rm.rows_per_group < row_end)
      load_group<kMode>(sec, rm, h, P, N, base + rm.rows_per_group, true, raw, prow);
    int xrow[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) xrow[r] = clamped[r] - x_first;
    fold_rows<kForm>(v, f, cur.committed, xrow, rm.n0, N, x_rows);
    int bad[kRows];
    float lane_amax[kRows];
    if constexpr (kPrepFirst) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) lane_amax[r] = lane_amax8(v[r]);
      sanitize_rows(v, lane_amax, bad);
    }
    int erow[kRows];  // the rows' indices in the checkpoint, h P + p
#pragma unroll
    for (int r = 0; r < kRows; ++r) erow[r] = h * P + clamped[r];
    // With kShortSr the two lanes of a draw group split its draws (paired_row_draws): in
    // prepare_rows where it runs, else before the rows' encodes.
    constexpr bool kPaired = kShortSr && kRows % 2 == 0 && uses_stochastic_rounding(kMode);
    constexpr bool kDrawnFirst = kPaired && !kPrepFirst;  // the draws outside prepare_rows
    EncodePrep prep[kRows];
    if constexpr (kPrepFirst)
      prepare_rows<kMode, kRows, kPaired>(lane_amax, erow, rm.n0, N, rm.lanes, sr, prep);
    SrChunk drawn[kDrawnFirst ? kRows : 1];
    if constexpr (kDrawnFirst) paired_row_draws(erow, rm.n0, N, sr, drawn);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kAmaxFirst) {
        lane_amax[r] = lane_amax8(v[r]);
        bad[r] = sanitize_by_amax(v[r], lane_amax[r]);
      } else if constexpr (!kPrepFirst) {
        bad[r] = sanitize8(v[r]);
      }
      float rv[8];
      // Duplicated rows (past P) take part in encode8's row reductions and store nothing.
      encode8<kMode, kShortSr>(sec, erow[r], rm.n0, N, rm.lane_in_row, rm.lanes, v[r], sr, rv,
                               &saturated, row[r] < P, kPrepFirst ? &prep[r] : nullptr,
                               kAmaxFirst ? &lane_amax[r] : nullptr,
                               kDrawnFirst ? &drawn[r] : nullptr);
      if (row[r] < P) nonfinite += bad[r];
    }
    if constexpr (kPrepFirst && is_separate(kMode)) {  // the carrier's saturation (encode8)
      float bound = 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) bound = row[r] < P ? fmaxf(bound, prep[r].amax) : bound;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (row[r] < P) saturated += count_f16_saturated(v[r], bound);
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

// The listed flushing entries (validate kernels), (entry, head) items over a fixed grid; the
// barrier between items keeps one item's shared memory from being overwritten by the next.
// kChunked (flush_splits_rows): when the (entry, head) pairs are fewer than the grid's blocks
// (the few entries of a spread autoregressive step at small batches, heads as few as
// falcon-h1-7b's 24), each pair is split into row chunks (up to one per row group) so that idle
// blocks take part: a flushing step waits for its longest item's chain of row groups, and a
// chunk's staging of the head's fold operands is small beside its rows. H200 session 17, W = 1
// spread: falcon-h1-7b batch 64 separate-fp8 63.9 -> 42.7 us, batch 16 51.4 -> 25.8;
// nemotron-h-8b batch 16 separate-nvfp4 33.9 -> 27.6. Where nothing is split a kernel holding
// both forms cost 1-5% (nemotron-h-8b batch 64 separate-fp8 49.4 -> 51.7 us), so the launcher
// picks the form and the whole-head one is the code it was before.
// kShortSr (stochastic-rounding modes with r <= 8, the default r = 7, and dstate a multiple of
// 16): see flush_head.
// first: the whole-head form's list entry of item blockIdx.x, loaded with the count. The chunked
// form loads every item's entry itself and ignores it (its caller passes an empty one).
// kFoldMma: the whole-head items fold on the tensor cores (flush_head_mma; flush_fold_mma_ok).
template <Mode kMode, typename ActT, bool kShortSr, bool kChunked, bool kOneRound, bool kFoldMma>
__device__ __forceinline__ void flush_items(const ReplayParams& p, int heads, int chunks,
                                            float* smem, const ValidatedEntry& first) {
  const int items = heads * chunks;
  ValidatedEntry e = first;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int pair = kChunked ? item / chunks : item;  // consecutive blocks: one head's chunks
    const int listed = int(p.by_heads.div(pair));
    if (kChunked || item != int(blockIdx.x)) e = p.flush_list[listed];
    if constexpr (kFoldMma)
      flush_head_mma<ActT>(p, e.slot, e.cursors, pair - listed * p.H, smem, e.b);
    else
      flush_head<kMode, ActT, flush_rows(kMode, kOneRound), kShortSr, kChunked>(
          p, e.slot, e.cursors, pair - listed * p.H, smem, e.b, item - pair * chunks, chunks);
    __syncthreads();
  }
}

template <Mode kMode, typename ActT, bool kShortSr, bool kChunked, bool kOneRound = false,
          bool kFoldMma = false>
__global__ void __launch_bounds__(kFlushThreads, flush_min_blocks(kMode, kOneRound))
    flush_kernel(const ReplayParams p) {
  static_assert(!(kChunked && kOneRound), "the one-round shape is a whole-head form");
  static_assert(!kFoldMma || (kMode == Mode::separate_fp8 && kShortSr && !kChunked && !kOneRound),
                "the tensor-core fold is separate-fp8's whole-head form (flush_fold_mma_ok)");
  wait_for_previous_grid();  // launched dependent on validate_tokens
  extern __shared__ float4 smem_raw[];
  // The whole-head form's first list entry is loaded before the count is known (the list holds
  // p.batch entries; one past the count is never used), so that the count and the entry take
  // one trip to memory instead of two: a spread W = 1 step's flush is one round of items, each
  // block's a chain of such trips before its first row is folded.
  ValidatedEntry first{};
  if constexpr (!kChunked) {
    const int listed = int(p.by_heads.div(blockIdx.x));
    if (listed < p.batch) first = p.flush_list[listed];
  }
  const int heads = *p.flush_count * p.H;
  // The chained verify after it may start now: only its blocks of flushing entries wait for this
  // grid (verify_kernel). After an explicit flush the next kernel is a plain launch, which this
  // does not affect.
  allow_dependent_launch();
  // Nothing listed (most steps): the grid exits at once. The count is cleared for the next
  // operation by whatever waits for this grid (verify_kernel's first block, flush_finalize_kernel),
  // so that no block ends in a fence and an atomic to find the last one.
  if (heads == 0) return;
  float* smem = reinterpret_cast<float*>(smem_raw);
  if constexpr (kChunked) {
    const int rows_per_group = int(blockDim.x) / p.lanes_per_row * flush_rows(kMode);
    const int groups = (p.P + rows_per_group - 1) / rows_per_group;
    const int chunks = max(1, min(groups, int(gridDim.x) / heads));
    flush_items<kMode, ActT, kShortSr, true, false, false>(p, heads, chunks, smem, first);
  } else {
    flush_items<kMode, ActT, kShortSr, false, kOneRound, kFoldMma>(p, heads, 1, smem, first);
  }
}

}  // namespace replayssm::cuda
