// The host rules that pick each step's kernels and grids (cuda/replay_launch.h), on a device of
// the H200's 132 SMs, for every model preset, batch, window and mode: the invariants the kernels
// rely on (a verify block's heads divide its group's, a split head's rows stay whole row groups,
// a one-launch grid stays the wave it is sized for, five rows per thread only where a head is
// exactly five row passes), and the choices the results files measured for the presets the
// benchmarks use. Host code only: it needs nvcc to compile (the headers hold the kernels) but no
// GPU to run.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/replay_launch.h"
#include "replayssm/presets.h"

namespace replayssm::cuda {
namespace {

constexpr int kSms = 132;  // NVIDIA H200
constexpr Mode kModes[] = {Mode::fp32,         Mode::bf16,          Mode::fp16,
                           Mode::fp16_sr,      Mode::shared_fp8,    Mode::shared_int8,
                           Mode::separate_fp8, Mode::separate_nvfp4};

ReplayParams step_params(const SsmShape& s, int batch, int window, int history = 16) {
  ReplayParams p{};
  p.batch = batch;
  p.tokens = window;
  p.H = s.nheads;
  p.P = s.headdim;
  p.N = s.dstate;
  p.G = s.ngroups;
  p.L = history;
  p.lanes_per_row = s.dstate / 8;
  return p;
}

int heads_per_block(const SsmShape& s, int batch, int window, Mode mode) {
  return verify_heads_per_block(batch, s.nheads, s.ngroups, window, kSms, has_direct_readout(mode));
}

TEST(LaunchRules, InvariantsOverEveryPresetBatchWindowAndMode) {
  for (const ModelPreset& preset : model_presets()) {
    const SsmShape& s = preset.shape;
    for (int batch : {1, 2, 3, 4, 5, 8, 16, 32, 64, 256, 512}) {
      for (int window : {1, 2, 4, 8}) {
        for (Mode mode : kModes) {
          SCOPED_TRACE(::testing::Message() << preset.name << " batch " << batch << " W " << window
                                            << " " << mode_name(mode));
          const ReplayParams p = step_params(s, batch, window);
          const int per_group = s.nheads / s.ngroups;
          const int d = heads_per_block(s, batch, window, mode);
          EXPECT_TRUE(d >= 1 && d <= per_group && per_group % d == 0) << d;
          if (window == 1) {
            const int threads = small_step_threads(p, kSms);
            const int split = small_step_split_log2(p, kSms, mode);
            ASSERT_GE(split, 0);
            if (split > 0) {  // whole row groups of the wide block, one wave at two per SM
              const int group =
                  threads / p.lanes_per_row *
                  std::max(small_step_rows(mode, threads), small_step_fold_rows(mode, threads));
              EXPECT_EQ(threads, kSmallStepWideThreads);
              EXPECT_EQ(p.P % (group << split), 0);
              EXPECT_LE((int64_t(batch) * s.nheads) << split, 2 * kSms);
            }
            if (small_step_five_rows(p, kSms, mode)) {
              EXPECT_EQ(threads, kSmallStepWideThreads);
              EXPECT_EQ(split, 0);
              EXPECT_EQ(p.P, 5 * (kSmallStepWideThreads / p.lanes_per_row));
            }
          } else {
            const bool direct = has_direct_readout(mode);
            const SmallVerifyShape sv = small_verify_shape(p, kSms, mode);
            if (sv.threads > 0) {  // one wave, whole row groups, two to four of them a block
              const int per_sm = kSmallVerifyThreads / sv.threads;
              const int group = kSmallVerifyRows * sv.threads / p.lanes_per_row;
              EXPECT_TRUE(per_sm == 1 || per_sm == 2 || (per_sm == 4 && !direct)) << sv.threads;
              EXPECT_GE(sv.threads, small_verify_min_threads(mode));
              EXPECT_GE(sv.split_log2, 0);
              EXPECT_LE((int64_t(batch) * s.nheads) << sv.split_log2, per_sm * kSms);
              EXPECT_LE(p.P >> sv.split_log2, (per_sm == 1 ? 2 : direct ? 3 : 4) * group);
              if (sv.split_log2 > 0) EXPECT_EQ(p.P % (group << sv.split_log2), 0);
            }
            EXPECT_EQ(verify_small_window(p, kSms, mode), sv.threads > 0);
          }
        }
      }
    }
  }
}

// nemotron-h-8b (128 heads, 16 per group): the verify grid's heads per block
// (bench/results/2026-12-03-h200-session33.md: at W > 1 in the 8/4-bit modes one wave of 512
// blocks from batch 8 on, and two heads per block at batches 5-7, whose one-head blocks would be
// more than one wave (session 34); fp32's FMA readout keeps 4 blocks per SM on every SM).
TEST(LaunchRules, NemotronH8bVerifyHeadsPerBlock) {
  const SsmShape s = find_preset("nemotron-h-8b").shape;
  struct Case {
    int batch, window;
    Mode mode;
    int heads;
  };
  for (const Case& c : {Case{1, 8, Mode::separate_fp8, 1}, Case{4, 8, Mode::separate_fp8, 1},
                        Case{8, 4, Mode::separate_fp8, 2}, Case{8, 8, Mode::shared_fp8, 2},
                        Case{8, 8, Mode::fp32, 1}, Case{16, 8, Mode::separate_nvfp4, 4},
                        Case{16, 8, Mode::fp32, 2}, Case{32, 4, Mode::separate_fp8, 8},
                        Case{64, 8, Mode::separate_fp8, 16}, Case{64, 8, Mode::fp32, 8},
                        Case{256, 8, Mode::separate_fp8, 16}, Case{64, 1, Mode::separate_fp8, 16},
                        Case{8, 1, Mode::separate_fp8, 2}, Case{5, 4, Mode::separate_fp8, 2},
                        Case{7, 8, Mode::separate_nvfp4, 2}, Case{5, 4, Mode::fp32, 1}})
    EXPECT_EQ(heads_per_block(s, c.batch, c.window, c.mode), c.heads)
        << "batch " << c.batch << " W " << c.window << " " << mode_name(c.mode);
}

// A step's carveout (step_carveout) is the least percent of the SM's shared memory that holds
// its need, since the driver rounds a preference up to its next configuration; none without a
// need. H100 / H200: 228 KB per SM; nemotron-h-8b's W = 8 verify needs 4 x (42,080 + 1,024) B.
TEST(LaunchRules, StepCarveoutIsTheLeastPercentThatHoldsTheNeed) {
  constexpr size_t kSmShared = 233472;
  EXPECT_EQ(step_carveout(SmemNeed{kSmShared, 0, 0}), -1);
  EXPECT_EQ(step_carveout(SmemNeed{0, 0, 1000}), -1);
  EXPECT_EQ(step_carveout(SmemNeed{kSmShared, 0, 4 * (42080 + 1024)}), 74);
  EXPECT_EQ(step_carveout(SmemNeed{kSmShared, 0, kSmShared}), 100);
  EXPECT_EQ(step_carveout(SmemNeed{kSmShared, 0, kSmShared + 1}), 100);
  for (size_t need = 1; need <= kSmShared; need += 997) {
    const int percent = step_carveout(SmemNeed{kSmShared, 0, need});
    ASSERT_GE(percent, 1);
    ASSERT_LE(percent, 100);
    EXPECT_GE(size_t(percent) * kSmShared, 100 * need) << need;
    EXPECT_LT(size_t(percent - 1) * kSmShared, 100 * need) << need;
  }
}

// A kernel's need (smem_need) holds the blocks its registers allow only as far as the SM's
// shared memory does: asking for more than fits would only move the carveout to its largest.
TEST(LaunchRules, SmemNeedHoldsTheBlocksThatFit) {
  constexpr size_t kSmShared = 233472;
  EXPECT_EQ(smem_need(4, 42080 + 1024, kSmShared), 4u * (42080 + 1024));
  EXPECT_EQ(smem_need(4, 84000, kSmShared), 2u * 84000);
  EXPECT_EQ(smem_need(4, kSmShared, kSmShared), kSmShared);
  EXPECT_EQ(smem_need(4, kSmShared + 1, kSmShared), 0u);
  EXPECT_EQ(smem_need(0, 1024, kSmShared), 0u);
  EXPECT_EQ(smem_need(4, 0, kSmShared), 0u);
  for (int blocks = 1; blocks <= 16; ++blocks)
    for (size_t bytes = 1024; bytes <= kSmShared; bytes += 4099) {
      const size_t need = smem_need(blocks, bytes, kSmShared);
      ASSERT_LE(need, kSmShared);
      ASSERT_EQ(need % bytes, 0u);
      ASSERT_LE(need / bytes, size_t(blocks));
      // One block more would either exceed the registers' count or the SM's shared memory.
      EXPECT_TRUE(need / bytes == size_t(blocks) || need + bytes > kSmShared)
          << blocks << " " << bytes;
    }
}

// The step's carveout is used where it was measured to gain (step_carveout_pays): not in fp32, not
// at W = 1 in the shared modes, not above W = 4 in separate-nvfp4; everywhere else.
TEST(LaunchRules, StepCarveoutPaysWhereMeasured) {
  for (const Mode mode : kAllModes)
    for (int window = 1; window <= 8; ++window) {
      const bool shared = mode == Mode::shared_fp8 || mode == Mode::shared_int8;
      const bool measured = mode != Mode::fp32 && !(shared && window == 1) &&
                            !(mode == Mode::separate_nvfp4 && window > 4);
      EXPECT_EQ(step_carveout_pays(mode, window), measured) << mode_name(mode) << " W " << window;
    }
}

// The chained verify's placed order is used where it was measured to gain (verify_order_pays):
// every speculative step, and decode steps of more than 64 entries; decode steps of up to 64
// keep entry order.
TEST(LaunchRules, VerifyOrderPaysWhereMeasured) {
  for (int batch : {1, 2, 16, 63, 64, 65, 128, 256, 512})
    for (int window = 1; window <= 8; ++window)
      EXPECT_EQ(verify_order_pays(batch, window), window > 1 || batch > 64)
          << "batch " << batch << " W " << window;
}

// Which one-launch kernel a small batch's step takes, and how its heads split.
TEST(LaunchRules, SmallBatchKernelsOfThePresets) {
  const SsmShape h8b = find_preset("nemotron-h-8b").shape;
  const SsmShape nano = find_preset("nemotron3-nano-4b").shape;
  const SsmShape falcon = find_preset("falcon-h1-7b").shape;
  const Mode m = Mode::separate_fp8;
  // Decode steps: 256-thread blocks while (entry, head) pairs fit one wave at two per SM.
  EXPECT_EQ(small_step_threads(step_params(h8b, 2, 1), kSms), kSmallStepWideThreads);
  EXPECT_EQ(small_step_threads(step_params(h8b, 3, 1), kSms), kSmallStepThreads);
  // nemotron3-nano-4b's 80 rows: five row passes of the wide block at batches 1 and 2.
  EXPECT_TRUE(small_step_five_rows(step_params(nano, 1, 1), kSms, m));
  EXPECT_TRUE(small_step_five_rows(step_params(nano, 2, 1), kSms, m));
  EXPECT_FALSE(small_step_five_rows(step_params(nano, 3, 1), kSms, m));
  EXPECT_FALSE(small_step_five_rows(step_params(h8b, 1, 1), kSms, m));
  // falcon-h1-7b's 24 heads of 128 rows: 4 blocks of 32 rows per head at batches 1 and 2.
  EXPECT_EQ(small_step_split_log2(step_params(falcon, 1, 1), kSms, m), 2);
  EXPECT_EQ(small_step_split_log2(step_params(falcon, 2, 1), kSms, m), 2);
  EXPECT_EQ(small_step_split_log2(step_params(h8b, 1, 1), kSms, m), 0);
  // Speculative verifies in one launch: batch 1 of nemotron-h-8b and nemotron3-nano-4b (a block
  // per head), falcon-h1-7b at batch 1 (4 blocks per head) and 2 (2 blocks); nemotron-h-8b's
  // batch 2 and nemotron3-nano-4b's in 256-thread blocks; batches 3 and 4 of nemotron-h-8b in
  // 128-thread blocks in the 16/32-bit modes only.
  auto sv = [&](const SsmShape& s, int batch, int window, Mode mode) {
    return small_verify_shape(step_params(s, batch, window), kSms, mode);
  };
  auto expect_sv = [&](const SsmShape& s, int batch, int window, Mode mode, int threads,
                       int split) {
    const SmallVerifyShape got = sv(s, batch, window, mode);
    EXPECT_EQ(got.threads, threads)
        << "batch " << batch << " W " << window << " " << mode_name(mode);
    if (threads > 0) EXPECT_EQ(got.split_log2, split) << "batch " << batch;
  };
  expect_sv(h8b, 1, 8, m, 512, 0);
  expect_sv(nano, 1, 4, m, 512, 0);
  expect_sv(h8b, 2, 8, m, 256, 0);
  expect_sv(nano, 2, 8, m, 256, 0);
  expect_sv(h8b, 3, 4, m, 0, 0);
  expect_sv(h8b, 4, 8, Mode::bf16, 128, 0);
  expect_sv(h8b, 5, 8, Mode::bf16, 0, 0);
  expect_sv(falcon, 1, 8, m, 512, 2);
  expect_sv(falcon, 2, 8, m, 512, 1);
  expect_sv(falcon, 3, 8, m, 0, 0);
  expect_sv(falcon, 3, 8, Mode::fp32, 256, 1);
  expect_sv(h8b, 1, 1, m, 0, 0);  // W = 1: small_step
  // Decode steps in one launch up to batch 8, in the 8/4-bit modes too where the head is one row
  // group of the 128-thread block (nemotron-h-8b: 64 rows; not nemotron3-nano-4b's 80).
  auto one_launch = [&](const SsmShape& s, int batch, Mode mode) {
    ReplayParams p = step_params(s, batch, 1);
    p.heads_per_block = heads_per_block(s, batch, 1, mode);
    return verify_in_one_launch(p, mode, kSms);
  };
  EXPECT_TRUE(one_launch(h8b, 8, m));
  EXPECT_TRUE(one_launch(h8b, 5, Mode::separate_nvfp4));
  EXPECT_FALSE(one_launch(h8b, 9, m));
  EXPECT_FALSE(one_launch(nano, 8, m));
  EXPECT_TRUE(one_launch(nano, 8, Mode::bf16));
}

// The whole-head flush's grid (flush_whole_head_grid): never more blocks than the step's (entry,
// head) items or than are resident; separate-fp8's autoregressive steps at most 2 per SM, the
// rest all that fit (bench/results/2026-12-07-h100-session64.md).
TEST(LaunchRules, FlushWholeHeadGrid) {
  const int resident = 4 * kSms;  // separate-fp8's 4 blocks per SM
  for (const ModelPreset& preset : model_presets())
    for (int batch : {1, 2, 4, 16, 64, 256, 512})
      for (int window : {1, 2, 8})
        for (const Mode mode : kModes) {
          const int items = batch * preset.shape.nheads;
          const int grid =
              flush_whole_head_grid(mode, batch, window, preset.shape.nheads, resident, kSms);
          const bool capped = mode == Mode::separate_fp8 && window == 1;
          EXPECT_EQ(grid, std::min(items, capped ? 2 * kSms : resident))
              << preset.name << " batch " << batch << " W " << window << " " << mode_name(mode);
        }
  // nemotron-h-8b (128 heads): batch 64 at W = 1 on 264 blocks, at W = 8 on all 528; batch 1 on
  // its 128 items.
  EXPECT_EQ(flush_whole_head_grid(Mode::separate_fp8, 64, 1, 128, resident, kSms), 264);
  EXPECT_EQ(flush_whole_head_grid(Mode::separate_fp8, 64, 8, 128, resident, kSms), 528);
  EXPECT_EQ(flush_whole_head_grid(Mode::separate_nvfp4, 64, 1, 128, resident, kSms), 528);
  EXPECT_EQ(flush_whole_head_grid(Mode::separate_fp8, 1, 1, 128, resident, kSms), 128);
}

// Which flushes fold on the tensor cores (flush_head_mma): of the presets, the two whose layers
// the GPU tests cover at the rule's shape (64 rows of dstate 128), in separate-fp8 with bf16
// activations, the short stochastic rounding (r <= 8) and history 16; no other mode, activation,
// rounding or history.
TEST(LaunchRules, FlushFoldMmaWhereTested) {
  const auto ok = [](const char* preset, Mode mode = Mode::separate_fp8, int act_bytes = 2,
                     bool act_f16 = false, bool short_sr = true, int history = 16) {
    const SsmShape s = find_preset(preset).shape;
    return flush_fold_mma_ok(mode, act_bytes, act_f16, short_sr, s.headdim, s.dstate, history);
  };
  EXPECT_TRUE(ok("nemotron-h-8b"));
  EXPECT_TRUE(ok("mamba2-2.7b"));
  EXPECT_FALSE(ok("nemotron3-nano-4b"));  // 80 rows: timed, its GPU test not yet run
  EXPECT_FALSE(ok("falcon-h1-7b"));       // dstate 256
  EXPECT_FALSE(ok("nemotron-h-56b"));
  for (const Mode mode : kModes)
    if (mode != Mode::separate_fp8) EXPECT_FALSE(ok("nemotron-h-8b", mode)) << mode_name(mode);
  EXPECT_FALSE(ok("nemotron-h-8b", Mode::separate_fp8, 4));                // fp32 activations
  EXPECT_FALSE(ok("nemotron-h-8b", Mode::separate_fp8, 2, true));          // fp16 activations
  EXPECT_FALSE(ok("nemotron-h-8b", Mode::separate_fp8, 2, false, false));  // r > 8
  EXPECT_FALSE(ok("nemotron-h-8b", Mode::separate_fp8, 2, false, true, 32));
  EXPECT_TRUE(ok("nemotron-h-8b", Mode::separate_fp8, 2, false, true, 8));
}

}  // namespace
}  // namespace replayssm::cuda
