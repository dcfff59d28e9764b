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

// A plain or (lc.dependent) a programmatic dependent launch.
template <typename Kernel>
void launch(const LaunchConfig& lc, Kernel kernel, int grid, int block, size_t smem,
            const ReplayParams& p) {
  if (lc.dependent)
    launch_dependent(kernel, dim3(grid), dim3(block), smem, lc.stream, p);
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
    auto kernel = flush_kernel<kMode, ActT>;
    allow_dynamic_smem(kernel, lc.smem_fold);
    size_flush_grid(lc, kernel);
    launch(lc, kernel, std::min(p.batch * p.H, *lc.flush_grid), kFlushThreads, lc.smem_fold, p);
  });
}

// One block per (entry, group, chunk of heads), specialised for the window rounded up to 1, 4 or
// 8 and for the ring entries per lane. A block serves as many heads of its group as keeps >= 4
// blocks per SM, >= 2 at W = 1: there the per-block work (staging, B_k . C_j, the weights) is a
// large part of the time, and a group's 16 heads in one block took nemotron-h-8b at batch 64
// from 67.7 to 61.1 us (separate-fp8; H200, bench/results/2026-11-30-h200-session6.md).
template <Mode kMode>
void ModeLaunchers<kMode>::verify(ReplayParams p, const LaunchConfig& lc) {
  const int per_group = p.H / p.G;
  const int min_blocks = (p.tokens == 1 ? 2 : 4) * lc.sm_count;
  p.heads_per_block = 1;
  for (int d = per_group; d > 1; --d)
    if (per_group % d == 0 && int64_t(p.batch) * p.H / d >= min_blocks) {
      p.heads_per_block = d;
      break;
    }
  const int blocks = p.batch * p.H / p.heads_per_block;
  auto run = [&](auto kernel, int windows) {
    const size_t smem =
        StepSmem::bytes(p.L, p.N, windows, p.heads_per_block, has_bf16_readout(kMode)) +
        verify_stages(windows) * lc.verify_stage_bytes;
    allow_dynamic_smem(kernel, smem);
    launch(lc, kernel, blocks, kVerifyThreads, smem, p);
  };
  with_act(lc, [&]<typename ActT>() {
    auto with_window = [&]<int kEntries>() {
      if (p.tokens == 1)
        run(verify_kernel<kMode, ActT, 1, kEntries>, 1);
      else if (p.tokens <= 4)
        run(verify_kernel<kMode, ActT, 4, kEntries>, 4);
      else
        run(verify_kernel<kMode, ActT, 8, kEntries>, 8);
    };
    if (lc.entries_per_lane == 1)
      with_window.template operator()<1>();
    else
      with_window.template operator()<2>();
  });
}

// The flush grid: as many blocks as are resident on the device at once.
template <typename Kernel>
void size_flush_grid(const LaunchConfig& lc, Kernel kernel) {
  if (*lc.flush_grid != 0) return;
  int per_sm = 0;
  RSSM_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kFlushThreads, lc.smem_fold));
  *lc.flush_grid = std::max(1, per_sm) * lc.sm_count;
}

template <typename Kernel>
void load_kernel(Kernel kernel, size_t smem) {
  load_kernel(kernel);
  allow_dynamic_smem(kernel, smem);
}

template <Mode kMode>
void ModeLaunchers<kMode>::prepare(const LaunchConfig& lc, int L, int N, int max_heads) {
  with_act(lc, [&]<typename ActT>() {
    load_kernel(prefill_kernel<kMode, ActT>, lc.smem_fold);
    load_kernel(dense_kernel<kMode, ActT>, lc.smem_fold);
    load_kernel(flush_kernel<kMode, ActT>, lc.smem_fold);
    size_flush_grid(lc, flush_kernel<kMode, ActT>);
    auto verify_kernels = [&]<int kEntries>() {
      load_kernel(verify_kernel<kMode, ActT, 1, kEntries>,
                  StepSmem::bytes(L, N, 1, max_heads, has_bf16_readout(kMode)) +
                      verify_stages(1) * lc.verify_stage_bytes);
      load_kernel(verify_kernel<kMode, ActT, 4, kEntries>,
                  StepSmem::bytes(L, N, 4, max_heads, has_bf16_readout(kMode)) +
                      verify_stages(4) * lc.verify_stage_bytes);
      load_kernel(verify_kernel<kMode, ActT, 8, kEntries>,
                  StepSmem::bytes(L, N, 8, max_heads, has_bf16_readout(kMode)) +
                      verify_stages(8) * lc.verify_stage_bytes);
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
