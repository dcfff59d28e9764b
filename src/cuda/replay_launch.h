// Host launchers of the replay kernels that are specialised per checkpoint mode. Each mode's
// instantiations are compiled in their own translation unit (src/cuda/modes/<mode>.cu, which
// includes replay_launch.cuh), so the eight modes build in parallel; cuda_backend.cu only calls
// these functions.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/replay_kernels.cuh"

namespace replayssm::cuda {

// What a step's launches need of an SM's shared memory: as many of each kernel's blocks as its
// registers and threads allow and the SM's shared memory holds (smem_need, below). The device's
// two figures are the backend's, queried once; the planned launches raise `bytes`.
struct SmemNeed {
  size_t sm_shared_bytes = 0;     // an SM's shared memory at the largest carveout
  size_t reserved_per_block = 0;  // the driver's shared memory of each resident block
  size_t bytes = 0;               // the most over the planned launches
};

// What the launchers need to know about the backend beyond ReplayParams.
struct LaunchConfig {
  cudaStream_t stream;
  int sm_count;
  int entries_per_lane;       // ring entries per lane of a row in verify_kernel (1 or 2)
  bool act_f32;               // activations in fp32 (else bf16 / fp16, told apart by act_f16)
  size_t smem_fold;           // flush, prefill, dense
  size_t verify_stage_bytes;  // verify_kernel's checkpoint staging, one stage
  int* flush_grid;            // [2] cached grids of flush_kernel's shapes, 0 until first sized
  bool dependent = false;     // flush / verify: programmatic dependent launch on the kernel
                              // before them in the stream (cuda_common.cuh)
  // The preferred shared-memory carveout of the launches (percent of the SM's largest, as
  // cudaFuncAttributePreferredSharedMemoryCarveout takes it), or -1: the driver's choice. A
  // step's flush and verify share one (step_carveout).
  int smem_carveout = -1;
  // Non-null: the launchers launch nothing and keep here the most their kernels would need of an
  // SM's shared memory (SmemNeed), so that a step's carveout is known before its first launch.
  SmemNeed* plan = nullptr;
};

// The shared memory of a kernel's resident blocks: as many as its registers and threads allow
// (`blocks_by_registers`) and the SM's shared memory at its largest carveout holds, of
// `block_bytes` each (static, dynamic and the per-block reservation). The driver, left to itself,
// picks the least configuration that holds them; a count by registers alone that does not fit
// asked for the whole 228 KB and took L1 away for nothing (nemotron-h-56b W = 8 batch 64, H100,
// session 55: separate-fp8 +4.5% against the driver's choice, -1.7% with the cap;
// bench/results/2026-12-06-h100-session55.md).
inline size_t smem_need(int blocks_by_registers, size_t block_bytes, size_t sm_shared_bytes) {
  if (blocks_by_registers <= 0 || block_bytes == 0) return 0;
  const size_t fit = std::min(size_t(blocks_by_registers), sm_shared_bytes / block_bytes);
  return fit * block_bytes;
}

// A step's flush and verify overlap (programmatic dependent launch): an SM holds blocks of both
// only while they run in one shared-memory configuration. Left to the driver, the flush ran in
// the 132 KB configuration and nemotron-h-8b's W = 8 verify (42 KB x 4 blocks) in the 196 KB
// one, so each SM drained its flush blocks before taking verify blocks. The step's carveout: the
// larger need of the two, in percent of the SM's shared memory, rounded up (the driver rounds a
// preference up to the next configuration it has, and two kernels launched with one preference
// share SMs, eager or in a graph: tests/test_carveout_driver.cu, session 56). H100, against the
// driver's choice in the same call (sessions 54-55, bench/results/2026-12-06-h100-session55.md),
// batch 64: nemotron-h-8b separate-fp8 / shared-fp8 W = 4 -5.0 / -5.6%, W = 8 -3.0 to -4.2 / -2.7
// to -3.2%, batch 256 W = 4 -3.0 / -3.4%; W = 8 separate-fp8 nemotron3-nano-4b -2.8%, mamba2-2.7b
// -3.8%, falcon-h1-7b -1.2%, nemotron-h-56b -1.7%; W = 1 level except nemotron-h-56b (separate-fp8
// -2.1%, separate-nvfp4 -7.0%).
inline int step_carveout(const SmemNeed& need) {
  if (need.bytes == 0 || need.sm_shared_bytes == 0) return -1;
  const size_t percent = (100 * need.bytes + need.sm_shared_bytes - 1) / need.sm_shared_bytes;
  return int(std::min<size_t>(percent, 100));
}

// Where the step's carveout is used: in the modes and windows measured to gain by it, against
// the driver's choice in the same call (H100, batch 64 unless said; sessions 55-56,
// bench/results/2026-12-06-h100-session55.md and -session56.md). Left to the driver:
// - fp32: nemotron-h-8b W = 4 / 8 +1.3 / +1.1% (W = 1 -0.4%).
// - shared-fp8 and shared-int8 at W = 1, which never gained: nemotron-h-56b +5.4 / +3.1%, the
//   other presets -0.3 to +0.9% (at W = 4 / 8 they gained: nemotron-h-8b -5.6 / -3.2% shared-fp8,
//   -5.8 / -1.7 to -3.2% shared-int8; nemotron-h-56b W = 4 shared-int8 -7.4%).
// - separate-nvfp4 above W = 4: its W = 8 steps never gained and lost up to 4.2%
//   (nemotron3-nano-4b +3.6 to +4.2% in two calls, nemotron-h-56b +1.1%, nemotron-h-8b -0.1 to
//   +1.2%, mamba2-2.7b +0.6%, falcon-h1-7b -0.6%; W = 5-7 not measured); W = 4 gained (-2.7%).
// The rest gained or stayed level: separate-fp8 (nemotron-h-8b W = 4 / 8 -5.0 / -3.0 to -4.2%,
// nemotron-h-56b W = 1 -2.1%), bf16 / fp16 / fp16-sr (nemotron-h-8b W = 1 -4.7 / -4.9 / -2.9 to
// -3.3%, W = 4 -0.7 to -1.4%, W = 8 -1.3 to +0.1%; mamba2-2.7b W = 1 -10.6 / - / -9.7%;
// nemotron-h-56b W = 1 -2.7 / - / -2.8%, W = 4 +0.9 / - / 0.0%; falcon-h1-7b level).
constexpr bool step_carveout_pays(Mode mode, int window) {
  switch (mode) {
    case Mode::fp32:
      return false;
    case Mode::shared_fp8:
    case Mode::shared_int8:
      return window > 1;
    case Mode::separate_nvfp4:
      return window <= 4;
    default:  // bf16, fp16, fp16-sr, separate-fp8
      return true;
  }
}

// Heads of a group per verify block: as many as keep >= 4 blocks per SM, >= 2 at W = 1, where
// the per-block work (staging, B_k . C_j, the weights) is a large part of the time: a group's 16
// heads in one block took nemotron-h-8b at batch 64 from 67.7 to 61.1 us (separate-fp8; H200,
// bench/results/2026-11-30-h200-session6.md). In the modes read out on the tensor cores
// (has_direct_readout) a grid of 4 blocks per SM on 7/8 of the SMs counts as 4 per SM at W > 1:
// 512 blocks on the H200's 132 SMs (one wave of 4 on 128 of them) run once where 1024 ran as two
// waves of one block's chain (session 33, nemotron-h-8b, against the former rule in the same
// call: batch 8, 2 heads per block instead of 1, W = 4 / 8 -18 to -22% / -19 to -25% in the three
// 8/4-bit modes; batch 16, 4 instead of 2, -10 to -18% / -9 to -15%; batch 32 -4 to -12%; batch
// 64 -0.7 to -6%, separate-fp8 W = 8 +0.6%; bench/results/2026-12-03-h200-session33.md). The fp32
// mode lost 4-14% with it at batch 16 and 32 (its FMA readout walks the block's heads one after
// another) and keeps 4 per SM. At W = 1 the tensor-core modes keep 2 per SM: aiming at 4 (batch
// 64: 8 heads per block instead of 16) lost 5.6-12.6% at batch 64 and 25-33% at batch 16 (H200
// session 39, bench/results/2026-12-04-h200-session39.md).
inline int verify_heads_per_block(int batch, int H, int G, int tokens, int sm_count,
                                  bool direct_readout) {
  const int per_group = H / G;
  const int64_t full = (tokens == 1 ? 2 : 4) * int64_t(sm_count);
  const int64_t min_blocks = tokens > 1 && direct_readout ? (full * 7 + 7) / 8 : full;
  for (int d = per_group; d > 1; --d)
    if (per_group % d == 0 && int64_t(batch) * H / d >= min_blocks) return d;
  // Fewer blocks than that: one head per block, unless those blocks would be more than one wave
  // of 4 per SM in the direct-readout modes at W > 1, which then take the fewest heads per block
  // that make one wave (session 34, against one head per block in the same call: nemotron-h-8b
  // batches 5-7 W = 4 -12.5 to -22%, W = 8 -18.5 to -27%; mamba2-2.7b batches 7-8 -7 to -26%;
  // nemotron3-nano-4b batches 6 and 8 -8 to -26%; bench/results/2026-12-04-h200-session34.md).
  if (tokens > 1 && direct_readout && int64_t(batch) * H > full)
    for (int d = 2; d <= per_group; ++d)
      if (per_group % d == 0 && int64_t(batch) * H / d <= full) return d;
  return 1;
}

// The block size of a step in one launch (small_step_kernel): 256 threads where its (entry,
// head) blocks fit one wave at two blocks per SM, else 128.
inline int small_step_threads(const ReplayParams& p, int sm_count) {
  return int64_t(p.batch) * p.H <= 2 * int64_t(sm_count) ? kSmallStepWideThreads
                                                         : kSmallStepThreads;
}

// Rows of one row group of small_step_kernel's block of `threads`: the readout's and the fold's,
// whichever is larger.
inline int small_step_group_rows(const ReplayParams& p, int threads, Mode mode) {
  return threads / p.lanes_per_row *
         std::max(small_step_rows(mode, threads), small_step_fold_rows(mode, threads));
}

// Autoregressive steps (W = 1) of small batches whose verify blocks would hold one head each run
// as one launch of small_step_kernel (no validate_tokens, no flush_kernel before it): there a
// step is bound by the latency of its chain of kernels and round trips (H200, separate-fp8 batch
// 1: one node fewer, the flush inside the verify, took a step from 14.5 to 12.7 us in
// verify_kernel; small_step_kernel, session 27, 9.7 -> 8.5 us). With several heads per block a
// flushing entry's blocks would fold their heads one after another while flush_kernel spreads them
// over the GPU (batch 64: 61.0 -> 73.3 us), so larger batches keep three launches (windows above
// 1: small_verify_kernel or three launches). Up to kOneLaunchMaxBatch the one launch also serves
// steps whose verify blocks would hold two heads: in the 16/32-bit modes, whose chained readout
// has no tensor-core form (nemotron-h-8b batch 5-8, 1024 blocks at batch 8: H200, session 28, fp32
// batch 5 22.8 -> 14.4 us, batch 8 26.6 -> 19.2, bf16 15.9 -> 13.5 and 18.2 -> 17.1), and in the
// 8/4-bit modes where the head is one row group of the kernel's block, so that its loads go out
// together (session 34, against the direct readout in the same call: nemotron-h-8b batch 5 -14
// to -16%, 6 -8 to -12%, 8 -1 to -5%; mamba2-2.7b batch 8 -9 to -16%; nemotron3-nano-4b, whose 80
// rows are two groups of the 128-thread block's 64, lost 7-20% at batch 8 and keeps the direct
// readout; bench/results/2026-12-04-h200-session34.md).
inline constexpr int kOneLaunchMaxBatch = 8;
inline bool verify_in_one_launch(const ReplayParams& p, Mode mode, int sm_count) {
  if (p.tokens != 1 || p.batch > kOneLaunchMaxBatch) return false;
  if (p.heads_per_block == 1 || !has_direct_readout(mode)) return true;
  return p.P <= small_step_group_rows(p, small_step_threads(p, sm_count), mode);
}

// How many times (log2, at most kSmallStepMaxSplitLog2) a head of P rows halves over blocks
// whose rows stay whole groups of `group` rows, while `pairs` (entry, head) pairs times the
// blocks per head stay within max_blocks (small_step_kernel, small_verify_kernel).
inline int head_split_log2(int P, int group, int64_t pairs, int64_t max_blocks) {
  int s = 0;
  while (s < kSmallStepMaxSplitLog2 && (pairs << (s + 1)) <= max_blocks &&
         P % (group << (s + 1)) == 0)
    ++s;
  return s;
}

// A step in one launch with few heads of many rows (falcon-h1-7b: 24 heads of 128 rows, four
// row groups of the 256-thread block at dstate 256) splits each head's rows over 2, 4 or 8
// blocks (the log2 of which this returns; 0: one block per head): each block then reads and
// walks a quarter of the rows in one round, where one block per head left 108 of 132 SMs idle
// and took its row groups one after another. Splits while the blocks still fit one wave at two
// per SM and each block's rows stay whole row groups of both the readout and the fold (the fold
// of a split head takes its row chunks, flush_head's kChunked form).
inline int small_step_split_log2(const ReplayParams& p, int sm_count, Mode mode) {
  if (small_step_threads(p, sm_count) != kSmallStepWideThreads) return 0;
  const int group = small_step_group_rows(p, kSmallStepWideThreads, mode);
  return head_split_log2(p.P, group, int64_t(p.batch) * p.H, 2 * int64_t(sm_count));
}

// A head of exactly 5 row passes of the wide block (nemotron3-nano-4b: 80 rows at 16 lanes per
// row, 16 rows per pass) takes 5 rows per thread, so that its rows are one row group whose loads
// go out together, where 4 rows made two groups (64 rows, then 16 in a group of 64) and the
// second group's loads a round trip of their own after the first group's readout.
inline bool small_step_five_rows(const ReplayParams& p, int sm_count, Mode mode) {
  return small_step_threads(p, sm_count) == kSmallStepWideThreads &&
         small_step_split_log2(p, sm_count, mode) == 0 &&
         p.P == 5 * (kSmallStepWideThreads / p.lanes_per_row);
}

// Speculative verifies (W > 1) of small batches run as validate_tokens and one launch of
// small_verify_kernel (a block per entry and head, folding its own head where the entry flushes)
// instead of validate_tokens, flush_kernel and verify_kernel: there the step is a chain of
// launches and dependent round trips. The block size is the largest whose (entry, head) blocks
// fit one wave: 512 threads at one block per SM (H200, batch 1, against the three launches,
// session 28: nemotron-h-8b W = 4 15.8-17.4 -> 10.3-10.8 us and W = 8 18.1-21.1 -> 12.5-13.8 in
// every mode; mamba2-2.7b separate-fp8 15.6 / 18.1 -> 10.3 / 12.3; nemotron3-nano-4b, headdim 80
// in two row groups, 16.7 / 19.9 -> 12.5 / 16.5), else 256 at two per SM or 128 at four, with the
// same registers per thread and more rows each (session 34, against the three launches in the
// same call, bench/results/2026-12-04-h200-session34.md: 256 threads at batch 2, nemotron-h-8b
// W = 4 -28 to -32% in every mode measured, W = 8 -18 to -27%; nemotron3-nano-4b -21 to -31% /
// -11 to -25%; mamba2-2.7b at batches 2 and 3 -17 to -30%. 128 threads at batches 3-6 took the
// 16/32-bit modes 4-38% down (nemotron-h-8b fp32 batch 4 W = 4 29.9 -> 18.5 us), whose chained
// readout has no tensor-core form, but the 8/4-bit modes up to 15% up at W = 8 (8 rows per
// thread), so those stop at 256 threads).
constexpr int small_verify_min_threads(Mode mode) {
  return has_direct_readout(mode) ? kSmallVerifyThreads / 2 : kSmallVerifyThreads / 4;
}
// A block holds at most two row groups (kSmallVerifyRows rows per thread each) at 512 threads,
// where a block per SM has no other block's warps to hide its chains behind; three at 256 in the
// 8/4-bit modes (nemotron3-nano-4b's 80 rows) and four otherwise (falcon-h1-7b at batch 3 in four
// groups: bf16 -27 to -30%, separate-nvfp4 +2 / +24%).
constexpr int small_verify_max_groups(int threads, Mode mode) {
  return threads == kSmallVerifyThreads ? 2 : has_direct_readout(mode) ? 3 : 4;
}
// Heads of several whole row groups split over 2, 4 or 8 blocks as long as the blocks stay one
// wave (falcon-h1-7b: 4 blocks of one row group per head at batch 1, 2 of two at batch 2).
// threads = 0: the step takes the three launches.
struct SmallVerifyShape {
  int threads = 0;      // kSmallVerifyThreads, or a half or a quarter of it
  int split_log2 = -1;  // blocks per head, log2
};
inline SmallVerifyShape small_verify_shape(const ReplayParams& p, int sm_count, Mode mode) {
  if (p.tokens == 1) return {};
  const int64_t pairs = int64_t(p.batch) * p.H;
  for (int threads = kSmallVerifyThreads; threads >= small_verify_min_threads(mode); threads /= 2) {
    const int64_t capacity = int64_t(kSmallVerifyThreads / threads) * sm_count;  // one wave
    const int group = kSmallVerifyRows * threads / p.lanes_per_row;              // rows
    const int s = head_split_log2(p.P, group, pairs, capacity);
    if ((pairs << s) <= capacity && (p.P >> s) <= small_verify_max_groups(threads, mode) * group)
      return {threads, s};
  }
  return {};
}
inline bool verify_small_window(const ReplayParams& p, int sm_count, Mode mode) {
  return small_verify_shape(p, sm_count, mode).threads > 0;
}

// Whether a chained verify takes its entries in validate_tokens' order, those that flush last
// (ReplayParams::verify_order; slot_kernels.cuh, order_place): every step but decode steps of up
// to 64 entries, which keep entry order. H200, session 70 (separate-fp8, two rounds against entry
// order): batch 256 -2.7% at W = 1, -0.9 / -1.1% at W = 4, -3.7 / -3.8% at W = 8; batch 64 +1.1 /
// +1.3% at W = 1 (about 0.5 us: few verify blocks wait there, and the placing's atomics come
// before the flush), +0.3 / +0.4% at W = 4, -0.5 / -1.0% at W = 8. H100, session 72 (this rule
// against the order everywhere): batch 64 W = 1 -1.3 / -1.4% separate-fp8, -0.8 / -1.3% shared-fp8,
// -0.9 / -0.7% separate-nvfp4; batch 256 level.
inline bool verify_order_pays(int batch, int tokens) { return tokens > 1 || batch > 64; }

// Decode steps (W = 1) on the tensor cores whose verify grid is one wave at 4 blocks per SM
// (nemotron-h-8b: batch 16 to 64) take VerifyVariant::chained_wide: registers for 4 blocks
// instead of 6 (H200: batch 64 separate-fp8 61.1 -> 57.2 us). Larger grids run several waves,
// where 6 blocks per SM did better (batch 256: 201.9 vs 205.5 us).
// Where the shape allows it (verify_direct_ok: codes on the tensor cores, N = 128 or 256), every
// chained step of W <= kDirectMaxWindow, and of W = 5 to 8 where the ring term is on the tensor
// cores and the blocks hold several heads (replay_launch.cuh), reads its checkpoints with
// VerifyVariant::chained_direct instead (if its block's shared memory fits kDirectMaxSmem), one
// wave or several (H200, spread phases, separate-fp8 / shared-fp8 against chained_wide: batch 64
// 60.0 -> 59.1 / 54.9 -> 51.5 us, session 14; with the tile-by-tile walk of session 15, 49.4 /
// 41.2, and at batch 256 against chained 198.7 -> 171.6 / 175.0 -> 147.0;
// bench/results/2026-11-30-h200-session15.md).
inline constexpr int kWideBlocksPerSm = 4;
inline bool verify_wide(const ReplayParams& p, int sm_count) {
  return p.tokens == 1 && int64_t(p.batch) * p.H / p.heads_per_block <= kWideBlocksPerSm * sm_count;
}

// Loads a kernel's module now (CUDA loads modules lazily, at a kernel's first launch).
template <typename Kernel>
void load_kernel(Kernel kernel) {
  cudaFuncAttributes attributes{};
  RSSM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
}

template <Mode kMode>
struct ModeLaunchers {
  // validate_tokens, then the fold, per-token fp32 recurrence and encode of every entry.
  static void prefill(const ReplayParams& p, const LaunchConfig& lc);
  // The entries the validate kernel listed: fold + encode (flush_kernel).
  static void flush(const ReplayParams& p, const LaunchConfig& lc);
  // Every entry: readout, ring term, y, ring x/delta/B append, cursors (verify_kernel), with
  // p.heads_per_block = verify_heads_per_block(...); in one launch (verify_in_one_launch:
  // small_step_kernel, a block per entry and head) also the validation and the flush.
  static void verify(const ReplayParams& p, const LaunchConfig& lc);
  // state(slot, at) into p.dense, or (encode) p.dense into the slot's checkpoints.
  static void dense(const ReplayParams& p, const LaunchConfig& lc, int slot, bool encode);
  // Once, when the cache is created: loads every kernel the mode can launch (CUDA loads modules
  // lazily, at a kernel's first launch, which would otherwise land in the first steps), sets their
  // shared-memory limits and sizes the flush grid, so the first step costs what the others do.
  // max_heads: the most heads one verify block serves (the heads of a group).
  static void prepare(const LaunchConfig& lc, int L, int N, int P, int max_heads);
};

extern template struct ModeLaunchers<Mode::fp32>;
extern template struct ModeLaunchers<Mode::bf16>;
extern template struct ModeLaunchers<Mode::fp16>;
extern template struct ModeLaunchers<Mode::fp16_sr>;
extern template struct ModeLaunchers<Mode::shared_fp8>;
extern template struct ModeLaunchers<Mode::shared_int8>;
extern template struct ModeLaunchers<Mode::separate_fp8>;
extern template struct ModeLaunchers<Mode::separate_nvfp4>;

// Calls f.template operator()<ActT>() for the activation type of the launch.
template <typename F>
void with_act(const LaunchConfig& lc, F&& f) {
  if (lc.act_f32)
    f.template operator()<float>();
  else
    f.template operator()<uint16_t>();  // bf16 or fp16, told apart by ReplayParams::act_f16
}

// Calls f.template operator()<kMode>() for the runtime mode.
template <typename F>
void with_mode(Mode mode, F&& f) {
  switch (mode) {
    case Mode::fp32:
      return f.template operator()<Mode::fp32>();
    case Mode::bf16:
      return f.template operator()<Mode::bf16>();
    case Mode::fp16:
      return f.template operator()<Mode::fp16>();
    case Mode::fp16_sr:
      return f.template operator()<Mode::fp16_sr>();
    case Mode::shared_fp8:
      return f.template operator()<Mode::shared_fp8>();
    case Mode::shared_int8:
      return f.template operator()<Mode::shared_int8>();
    case Mode::separate_fp8:
      return f.template operator()<Mode::separate_fp8>();
    case Mode::separate_nvfp4:
      return f.template operator()<Mode::separate_nvfp4>();
  }
}

}  // namespace replayssm::cuda
