// Definitions of ModeLaunchers (replay_launch.h), included by the per-mode translation units in
// src/cuda/modes/ only.
#pragma once

#include <algorithm>

#include "cuda/replay_launch.h"

namespace replayssm::cuda {

template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    RSSM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// What a launch of `kernel` needs of an SM's shared memory (smem_need, against the device of
// `need`): the blocks per SM its registers and threads allow (the occupancy asked without dynamic
// shared memory) that fit, each with its static and dynamic bytes and the per-block reservation.
template <typename Kernel>
size_t smem_need_per_sm(const SmemNeed& need, Kernel kernel, int block, size_t smem) {
  int by_registers = 0;
  RSSM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_registers, kernel, block, 0));
  cudaFuncAttributes attributes{};
  RSSM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return smem_need(by_registers, attributes.sharedSizeBytes + smem + need.reserved_per_block,
                   need.sm_shared_bytes);
}

// A plain or (lc.dependent) a programmatic dependent launch, in lc.smem_carveout; with lc.plan,
// only its shared-memory need.
template <typename Kernel>
void launch(const LaunchConfig& lc, Kernel kernel, dim3 grid, int block, size_t smem,
            const ReplayParams& p) {
  if (lc.plan) {
    lc.plan->bytes = std::max(lc.plan->bytes, smem_need_per_sm(*lc.plan, kernel, block, smem));
    return;
  }
  if (lc.dependent || lc.smem_carveout >= 0)
    launch_ex(kernel, grid, dim3(block), smem, lc.stream, lc.dependent, lc.smem_carveout, p);
  else
    kernel<<<grid, block, smem, lc.stream>>>(p);
}

template <Mode kMode>
void ModeLaunchers<kMode>::prefill(const ReplayParams& p, const LaunchConfig& lc) {
  with_act(lc, [&]<typename ActT>() {
    allow_dynamic_smem(prefill_kernel<kMode, ActT>, lc.smem_fold);
    prefill_kernel<kMode, ActT><<<p.batch * p.H, kStepThreads, lc.smem_fold, lc.stream>>>(p);
  });
}

// A fixed grid (as many blocks as fit on the device at once) strides over the listed (entry,
// head) items, so the launch does not depend on how many entries flush.
template <Mode kMode>
void ModeLaunchers<kMode>::flush(const ReplayParams& p, const LaunchConfig& lc) {
  with_act(lc, [&]<typename ActT>() {
    constexpr bool kSr = uses_stochastic_rounding(kMode);
    const bool short_sr = kSr && p.sr_bits <= kSrByteMaxBits && p.N % 16 == 0;
    size_flush_grid(lc, flush_kernel<kMode, ActT, false, false>, 0);
    const bool chunked = flush_splits_rows(p.batch, p.tokens, p.L, p.H, lc.flush_grid[0]);
    // separate-nvfp4's one-round shape only where the whole-head form runs and its grid holds
    // every expected item at once: where the items split into row chunks, the own shape's 2 rows
    // per thread give more chunks (H200, session 18: with the one-round shape, nemotron-h-8b
    // batch 16 W = 1 27.5 -> 29.1 us, falcon-h1-7b batch 64 44.0 -> 48.8; batch 64 57.5 -> 52.2).
    bool one_round = false;
    if constexpr (has_one_round_flush(kMode)) {
      size_flush_grid(lc, flush_kernel<kMode, ActT, kSr, false, true>, 1);
      one_round = short_sr && !chunked &&
                  flush_fits_one_round(p.batch, p.tokens, p.L, p.H, lc.flush_grid[1]);
    }
    const int resident = lc.flush_grid[one_round ? 1 : 0];
    // The chunked form splits its items over as many blocks as the device holds (batch 1 to 4
    // with W > 1: 128 items of nemotron-h-8b would otherwise stay whole on a grid of 128 blocks).
    const int grid =
        chunked ? resident
                : flush_whole_head_grid(kMode, p.batch, p.tokens, p.H, resident, lc.sm_count);
    auto run = [&](auto kernel, size_t smem) {
      allow_dynamic_smem(kernel, smem);
      launch(lc, kernel, grid, kFlushThreads, smem, p);
    };
    if constexpr (has_one_round_flush(kMode)) {
      if (one_round) return run(flush_kernel<kMode, ActT, kSr, false, true>, lc.smem_fold);
    }
    // separate-fp8's whole-head items with bf16 activations fold on the tensor cores where
    // flush_fold_mma_ok admits the shape (the fp16 x of p.act_f16 is not exact in bf16).
    if constexpr (kMode == Mode::separate_fp8 && sizeof(ActT) == 2) {
      if (!chunked && flush_fold_mma_ok(kMode, 2, p.act_f16, short_sr, p.P, p.N, p.L))
        return run(flush_kernel<kMode, ActT, true, false, false, true>,
                   flush_fold_mma_smem(p.L, p.N, p.P));
    }
    if (short_sr && chunked)
      run(flush_kernel<kMode, ActT, kSr, true>, lc.smem_fold);
    else if (short_sr)
      run(flush_kernel<kMode, ActT, kSr, false>, lc.smem_fold);
    else if (chunked)
      run(flush_kernel<kMode, ActT, false, true>, lc.smem_fold);
    else
      run(flush_kernel<kMode, ActT, false, false>, lc.smem_fold);
  });
}

// verify_kernel's shared memory.
inline size_t verify_smem(const LaunchConfig& lc, int L, int N, int windows, int heads, Mode mode) {
  return StepSmem::bytes(L, N, windows, heads, has_bf16_readout(mode)) +
         verify_stages(windows) * lc.verify_stage_bytes;
}

// small_verify_kernel's shared memory: the fold's, then the staging of a window of `windows`
// (x of `rows` rows: the block's share of the head).
inline size_t small_verify_smem(int L, int N, int P, int windows, int act_size, int rows) {
  return small_verify_staging_offset(L, N, P) +
         SmallVerifySmem::bytes(L, N, rows, windows, act_size);
}

// small_step_kernel's shared memory: the most of the fold's and its own (SmallStepSmem and the
// ring's x, RingXStage), which overlay it.
template <typename ActT>
size_t small_step_smem(const LaunchConfig& lc, int L, int P) {
  return std::max(lc.smem_fold, RingXStage::end(L, P, int(sizeof(ActT))));
}

// One block per (entry, group, chunk of p.heads_per_block heads, verify_heads_per_block),
// specialised for the window rounded up to 1, 4 or 8, for the ring entries per lane, and for how
// the step runs (VerifyVariant: verify_direct_ok and verify_direct_fits at
// W <= kDirectMaxWindow, or at W = 5 to 8 where the ring term is on the tensor cores
// (direct_ring_mma_ok), verify_wide, else chained).
// A step in one launch (verify_in_one_launch) is small_step_kernel's instead, and a small
// batch's speculative verify (verify_small_window) small_verify_kernel's.
template <Mode kMode>
void ModeLaunchers<kMode>::verify(const ReplayParams& p, const LaunchConfig& lc) {
  // (chunk, group, entry): the kernel reads its coordinates without dividing, in the linear
  // order of one block per (entry, group, chunk).
  const dim3 blocks(p.H / p.G / p.heads_per_block, p.G, p.batch);
  const bool one_launch = verify_in_one_launch(p, kMode, lc.sm_count);
  auto run_with = [&](auto kernel, size_t smem) {
    allow_dynamic_smem(kernel, smem);
    launch(lc, kernel, blocks, kVerifyThreads, smem, p);
  };
  auto run = [&](auto kernel, int windows) {
    run_with(kernel, verify_smem(lc, p.L, p.N, windows, p.heads_per_block, kMode));
  };
  using V = VerifyVariant;
  with_act(lc, [&]<typename ActT>() {
    if (p.small_window) {  // W > 1: blocks of one head or a split of one after validate_tokens
      const SmallVerifyShape shape = small_verify_shape(p, lc.sm_count, kMode);
      ReplayParams q = p;
      q.step_split_log2 = shape.split_log2;
      auto run_small = [&]<int kThreads>() {
        const size_t smem =
            small_verify_smem(p.L, p.N, p.P, p.tokens, int(sizeof(ActT)), p.P >> q.step_split_log2);
        auto go = [&](auto kernel) {
          allow_dynamic_smem(kernel, smem);
          launch(lc, kernel, dim3((p.H / p.G) << q.step_split_log2, p.G, p.batch), kThreads, smem,
                 q);
        };
        if (q.step_split_log2 > 0) return go(small_verify_kernel<kMode, ActT, true, kThreads>);
        go(small_verify_kernel<kMode, ActT, false, kThreads>);
      };
      if (shape.threads == kSmallVerifyThreads)
        return run_small.template operator()<kSmallVerifyThreads>();
      if (shape.threads == kSmallVerifyThreads / 2)
        return run_small.template operator()<kSmallVerifyThreads / 2>();
      // Compiled only for the modes that take it (small_verify_min_threads).
      if constexpr (small_verify_min_threads(kMode) <= kSmallVerifyThreads / 4)
        if (shape.threads == kSmallVerifyThreads / 4)
          return run_small.template operator()<kSmallVerifyThreads / 4>();
      fail("cuda backend: no small_verify_kernel of ", shape.threads, " threads in mode ",
           mode_name(kMode));
    }
    auto with_window = [&]<int kEntries>() {
      // Every chained step whose shape the direct readout is compiled for takes it.
      auto ring_mma = [&](int windows) {
        return direct_ring_mma_ok(int(sizeof(ActT)), p.act_f16, p.L, windows, kEntries);
      };
      auto run_direct = [&]<int kW>() {
        const size_t smem = verify_direct_smem(p.L, p.N, p.P, p.heads_per_block, kW, ring_mma(kW));
        if (p.N == 128)
          return run_with(verify_kernel<kMode, ActT, kW, kEntries, V::chained_direct, 2>, smem);
        run_with(verify_kernel<kMode, ActT, kW, kEntries, V::chained_direct, 4>, smem);
      };
      auto direct = [&](int windows) {
        return verify_direct_ok(kMode, p.P, p.N) &&
               verify_direct_fits(p.L, p.N, p.P, p.heads_per_block, windows, ring_mma(windows));
      };
      if (one_launch) {  // W = 1 only (verify_in_one_launch): one block per (entry, head)
        const size_t smem = small_step_smem<ActT>(lc, p.L, p.P);
        const int split_log2 = small_step_split_log2(p, lc.sm_count, kMode);
        auto run_step = [&]<int kThreads, bool kSplit,
                            int kRows = small_step_rows(kMode, kThreads)>() {
          const auto kernel = small_step_kernel<kMode, ActT, kEntries, kThreads, kSplit, kRows>;
          allow_dynamic_smem(kernel, smem);
          ReplayParams q = p;
          q.step_split_log2 = kSplit ? split_log2 : 0;
          launch(lc, kernel, dim3((p.H / p.G) << q.step_split_log2, p.G, p.batch), kThreads, smem,
                 q);
        };
        if (split_log2 > 0) return run_step.template operator()<kSmallStepWideThreads, true>();
        if (small_step_five_rows(p, lc.sm_count, kMode))
          return run_step.template operator()<kSmallStepWideThreads, false, 5>();
        if (small_step_threads(p, lc.sm_count) == kSmallStepWideThreads)
          return run_step.template operator()<kSmallStepWideThreads, false>();
        run_step.template operator()<kSmallStepThreads, false>();
      } else if (p.tokens == 1) {
        if constexpr (has_direct_readout(kMode))
          if (direct(1)) return run_direct.template operator()<1>();
        if constexpr (has_bf16_readout(kMode))
          if (verify_wide(p, lc.sm_count))
            return run(verify_kernel<kMode, ActT, 1, kEntries, V::chained_wide>, 1);
        run(verify_kernel<kMode, ActT, 1, kEntries, V::chained>, 1);
      } else if (p.tokens <= 4) {
        static_assert(kDirectMaxWindow == 4, "the direct readout stands in for the kW = 4 one");
        if constexpr (has_direct_readout(kMode))
          if (direct(kDirectMaxWindow)) return run_direct.template operator()<kDirectMaxWindow>();
        run(verify_kernel<kMode, ActT, 4, kEntries, V::chained>, 4);
      } else {  // W > kDirectMaxWindow: direct with the ring term on the tensor cores, or staged
        // Blocks of one head (small batches) keep the staged readout: H200, batch 1 W = 8,
        // shared-fp8 / separate-fp8 / separate-nvfp4 23.3 / 24.2 / 23.9 us staged, 23.8 / 24.8 /
        // 26.2 direct (batch 64: 144.2 / 177.9 / 193.3 -> 122.5 / 153.9 / 185.7).
        if constexpr (has_direct_readout(kMode))
          if (ring_mma(8) && p.heads_per_block > 1 && direct(8))
            return run_direct.template operator()<8>();
        run(verify_kernel<kMode, ActT, 8, kEntries, V::chained>, 8);
      }
    };
    if (lc.entries_per_lane == 1)
      with_window.template operator()<1>();
    else
      with_window.template operator()<2>();
  });
}

// The flush grid of a shape (0: the mode's own, 1: separate-nvfp4's one-round shape): as many
// blocks as are resident on the device at once.
template <typename Kernel>
void size_flush_grid(const LaunchConfig& lc, Kernel kernel, int shape) {
  if (lc.flush_grid[shape] != 0) return;
  int per_sm = 0;
  RSSM_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kFlushThreads, lc.smem_fold));
  lc.flush_grid[shape] = std::max(1, per_sm) * lc.sm_count;
}

template <typename Kernel>
void load_kernel(Kernel kernel, size_t smem) {
  load_kernel(kernel);
  allow_dynamic_smem(kernel, smem);
}

template <Mode kMode>
void ModeLaunchers<kMode>::prepare(const LaunchConfig& lc, int L, int N, int P, int max_heads) {
  with_act(lc, [&]<typename ActT>() {
    load_kernel(prefill_kernel<kMode, ActT>, lc.smem_fold);
    load_kernel(dense_kernel<kMode, ActT>, lc.smem_fold);
    load_kernel(flush_kernel<kMode, ActT, false, false>, lc.smem_fold);
    load_kernel(flush_kernel<kMode, ActT, false, true>, lc.smem_fold);
    size_flush_grid(lc, flush_kernel<kMode, ActT, false, false>, 0);
    if constexpr (uses_stochastic_rounding(kMode)) {
      load_kernel(flush_kernel<kMode, ActT, true, false>, lc.smem_fold);
      load_kernel(flush_kernel<kMode, ActT, true, true>, lc.smem_fold);
    }
    if constexpr (kMode == Mode::separate_fp8 && sizeof(ActT) == 2)
      if (flush_fold_mma_ok(kMode, 2, false, true, P, N, L))
        load_kernel(flush_kernel<kMode, ActT, true, false, false, true>,
                    flush_fold_mma_smem(L, N, P));
    if constexpr (has_one_round_flush(kMode)) {
      load_kernel(flush_kernel<kMode, ActT, true, false, true>, lc.smem_fold);
      size_flush_grid(lc, flush_kernel<kMode, ActT, true, false, true>, 1);
    }
    // The largest window a cache may verify is L / 2 (SPEC 4).
    const size_t smem_small = small_verify_smem(L, N, P, L / 2, int(sizeof(ActT)), P);
    for (const auto kernel :
         {small_verify_kernel<kMode, ActT>, small_verify_kernel<kMode, ActT, true>,
          small_verify_kernel<kMode, ActT, false, kSmallVerifyThreads / 2>,
          small_verify_kernel<kMode, ActT, true, kSmallVerifyThreads / 2>})
      load_kernel(kernel, smem_small);
    if constexpr (small_verify_min_threads(kMode) <= kSmallVerifyThreads / 4)
      for (const auto kernel : {small_verify_kernel<kMode, ActT, false, kSmallVerifyThreads / 4>,
                                small_verify_kernel<kMode, ActT, true, kSmallVerifyThreads / 4>})
        load_kernel(kernel, smem_small);
    auto verify_kernels = [&]<int kEntries>() {
      using V = VerifyVariant;
      for (const auto kernel :
           {small_step_kernel<kMode, ActT, kEntries, kSmallStepThreads>,
            small_step_kernel<kMode, ActT, kEntries, kSmallStepWideThreads>,
            small_step_kernel<kMode, ActT, kEntries, kSmallStepWideThreads, true>,
            small_step_kernel<kMode, ActT, kEntries, kSmallStepWideThreads, false, 5>})
        load_kernel(kernel, small_step_smem<ActT>(lc, L, P));
      load_kernel(verify_kernel<kMode, ActT, 1, kEntries, V::chained>,
                  verify_smem(lc, L, N, 1, max_heads, kMode));
      if constexpr (has_bf16_readout(kMode))
        load_kernel(verify_kernel<kMode, ActT, 1, kEntries, V::chained_wide>,
                    verify_smem(lc, L, N, 1, max_heads, kMode));
      auto load_direct = [&]<int kW>() {  // the largest block a launch may take (fits)
        const size_t smem =
            std::min(verify_direct_smem_any(L, N, P, max_heads, kW), kDirectMaxSmem);
        if (N == 128)
          load_kernel(verify_kernel<kMode, ActT, kW, kEntries, V::chained_direct, 2>, smem);
        else
          load_kernel(verify_kernel<kMode, ActT, kW, kEntries, V::chained_direct, 4>, smem);
      };
      if constexpr (has_direct_readout(kMode))
        if (verify_direct_ok(kMode, P, N)) {
          load_direct.template operator()<1>();
          load_direct.template operator()<kDirectMaxWindow>();
          if (direct_ring_mma_ok(int(sizeof(ActT)), false, L, 8, kEntries))
            load_direct.template operator()<8>();
        }
      load_kernel(verify_kernel<kMode, ActT, 4, kEntries, V::chained>,
                  verify_smem(lc, L, N, 4, max_heads, kMode));
      load_kernel(verify_kernel<kMode, ActT, 8, kEntries, V::chained>,
                  verify_smem(lc, L, N, 8, max_heads, kMode));
    };
    if (lc.entries_per_lane == 1)
      verify_kernels.template operator()<1>();
    else
      verify_kernels.template operator()<2>();
  });
}

template <Mode kMode>
void ModeLaunchers<kMode>::dense(const ReplayParams& p, const LaunchConfig& lc, int slot,
                                 bool encode) {
  with_act(lc, [&]<typename ActT>() {
    allow_dynamic_smem(dense_kernel<kMode, ActT>, lc.smem_fold);
    dense_kernel<kMode, ActT><<<p.H, kStepThreads, lc.smem_fold, lc.stream>>>(p, slot, encode);
  });
}

}  // namespace replayssm::cuda
