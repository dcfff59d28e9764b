// The replay cache on the CPU reference backend against SPEC section 7 (items 1-4 and 8) and
// the test list. Every test draws fresh random inputs from a fixed seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "replayssm/cache.h"
#include "replayssm/error.h"
#include "ssm_test_util.h"

namespace replayssm {
namespace {

using testing::commit;
using testing::flush;
using testing::Fp64Recurrence;
using testing::prefill;
using testing::random_params;
using testing::random_tokens;
using testing::rel_l2;
using testing::token_slice;
using testing::Tokens;
using testing::verify;

const SsmShape kSmall{4, 8, 16, 2};

CacheConfig config_for(Mode mode, int slots = 2, DType act = DType::f32) {
  CacheConfig c;
  c.mode = mode;
  c.num_slots = slots;
  c.activation_dtype = act;
  c.seed = 1234;
  return c;
}

// SPEC 7.1: fp32 replay equals the FP64 per-token recurrence, autoregressive and speculative.
TEST(Fp32Replay, MatchesFp64RecurrenceOver240Steps) {
  for (int max_w : {1, 8}) {
    std::mt19937_64 rng(100 + max_w);
    const SsmShape s = kSmall;
    const LayerParams params = random_params(s, rng);
    ReplayCache cache(s, params, config_for(Mode::fp32, 1));
    cache.open(0, 7);
    Fp64Recurrence ref(s, params);
    std::uniform_int_distribution<int> wdist(1, max_w);
    const int per_token = s.nheads * s.headdim;
    int steps = 0;
    double worst = 0.0;
    while (steps < 240) {
      const int W = wdist(rng);
      Tokens tk = random_tokens(s, DType::f32, 1, W, rng);
      const std::vector<float> y = verify(cache, {0}, tk);
      const int k = std::uniform_int_distribution<int>(1, W)(rng);
      // Only the accepted prefix reaches the oracle; a rejected draft's output is checked against
      // a copy of the oracle that does see it.
      Fp64Recurrence draft = ref;
      for (int j = 0; j < W; ++j) {
        const std::vector<double> y_ref = draft.step(tk, 0, j);
        worst = std::max(worst, rel_l2(token_slice(y, j, per_token), y_ref));
        if (j < k) ref.step(tk, 0, j);
      }
      commit(cache, {0}, {k});
      steps += k;
      EXPECT_LT(rel_l2(cache.state(0), ref.S), 1e-5) << "state after " << steps << " steps";
    }
    EXPECT_LT(worst, 1e-5) << "max_window " << max_w;
    EXPECT_GE(cache.stats().flushes, 10u);
  }
}

// SPEC 7.2: verify(W) then commit(k) equals k sequential decodes, in every mode, for every W and
// every k (with an explicit flush at the same point when the window forces one).
TEST(VerifyCommit, EqualsSequentialDecodesInEveryMode) {
  for (Mode mode : kAllModes) {
    std::mt19937_64 rng(200 + int(mode));
    const SsmShape s = kSmall;
    const LayerParams params = random_params(s, rng);
    for (int W = 1; W <= 8; ++W) {
      for (int k = 1; k <= W; ++k) {
        ReplayCache cache(s, params, config_for(mode, 2, DType::bf16));
        cache.open(0, 99);
        // Warm up to a random fill level with a prefill and a few decodes.
        Tokens pre = random_tokens(s, DType::bf16, 1, 5, rng);
        prefill(cache, {0}, pre);
        const int warm = std::uniform_int_distribution<int>(0, 15)(rng);
        for (int i = 0; i < warm; ++i) {
          Tokens one = random_tokens(s, DType::bf16, 1, 1, rng);
          verify(cache, {0}, one);
          commit(cache, {0}, {1});
        }
        cache.fork(0, 1, 99);  // same request id: same random bits
        Tokens tk = random_tokens(s, DType::bf16, 1, W, rng);
        const bool flushes = cache.cursors(0).committed + W > cache.config().history;
        const std::vector<float> y = verify(cache, {0}, tk);
        commit(cache, {0}, {k});
        if (flushes) flush(cache, {1});
        const int per_token = s.nheads * s.headdim;
        for (int j = 0; j < k; ++j) {
          Tokens one = tk.slice(s, 0, j);
          const std::vector<float> y1 = verify(cache, {1}, one);
          commit(cache, {1}, {1});
          // Same operations in the same order per output element: bit-identical.
          ASSERT_EQ(token_slice(y, j, per_token), y1)
              << mode_name(mode) << " W=" << W << " k=" << k << " j=" << j;
        }
        ASSERT_EQ(cache.export_slot(0), cache.export_slot(1))
            << mode_name(mode) << " W=" << W << " k=" << k;
      }
    }
  }
}

// SPEC 7.3: rejected drafts leave checkpoints and committed ring bit-identical: a window with
// rejected drafts ends in the same bytes as a window that only held the accepted tokens.
TEST(VerifyCommit, RejectedDraftsLeaveNoTrace) {
  for (Mode mode : kAllModes) {
    std::mt19937_64 rng(300 + int(mode));
    const SsmShape s = kSmall;
    const LayerParams params = random_params(s, rng);
    ReplayCache cache(s, params, config_for(mode, 2, DType::bf16));
    cache.open(0, 5);
    cache.fork(0, 1, 5);
    for (int step = 0; step < 40; ++step) {
      Tokens tk = random_tokens(s, DType::bf16, 1, 8, rng);
      const int k = std::uniform_int_distribution<int>(1, 8)(rng);
      Tokens accepted = tk.slice(s, 0, 0, k);
      const bool flushes = cache.cursors(0).committed + 8 > cache.config().history;
      verify(cache, {0}, tk);
      commit(cache, {0}, {k});
      if (flushes) flush(cache, {1});
      verify(cache, {1}, accepted);
      commit(cache, {1}, {k});
      ASSERT_EQ(cache.export_slot(0), cache.export_slot(1)) << mode_name(mode) << " step " << step;
    }
  }
}

// SPEC 7.4: autoregressive decode flushes once every `history` tokens, speculative decode
// exactly when c + W > history; the ring wraps; flushing an empty ring writes nothing.
TEST(FlushCadence, AutoregressiveAndSpeculative) {
  std::mt19937_64 rng(400);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  for (int history : {8, 16, 32}) {
    CacheConfig config = config_for(Mode::separate_fp8, 1);
    config.history = history;
    config.max_window = std::min(8, history / 2);
    ReplayCache cache(s, params, config);
    cache.open(0, 1);
    for (int n = 1; n <= 5 * history + 3; ++n) {
      Tokens one = random_tokens(s, DType::f32, 1, 1, rng);
      verify(cache, {0}, one);
      commit(cache, {0}, {1});
      ASSERT_EQ(cache.stats().flushes, uint64_t((n - 1) / history)) << "after " << n;
      ASSERT_EQ(cache.cursors(0).committed, (n - 1) % history + 1);
    }
  }
  ReplayCache cache(s, params, config_for(Mode::fp16_sr, 1));
  cache.open(0, 1);
  int expected_origin = 0;
  uint64_t expected_flushes = 0;
  for (int step = 0; step < 300; ++step) {
    const int W = std::uniform_int_distribution<int>(1, 8)(rng);
    const SlotCursors before = cache.cursors(0);
    const bool flushes = before.committed + W > 16;
    if (flushes) {
      expected_origin = (expected_origin + before.committed) % 16;
      ++expected_flushes;
    }
    Tokens tk = random_tokens(s, DType::f32, 1, W, rng);
    verify(cache, {0}, tk);
    ASSERT_EQ(cache.stats().flushes, expected_flushes);
    ASSERT_EQ(cache.cursors(0).origin, expected_origin);
    ASSERT_EQ(cache.cursors(0).pending, W);
    commit(cache, {0}, {std::uniform_int_distribution<int>(1, W)(rng)});
  }
  // Empty ring: nothing written, flush index kept.
  flush(cache, {0});
  const std::vector<uint8_t> bytes = cache.export_slot(0);
  const SlotCursors cursors = cache.cursors(0);
  flush(cache, {0});
  EXPECT_EQ(cache.export_slot(0), bytes);
  EXPECT_EQ(cache.cursors(0).flush_index, cursors.flush_index);
}

// state(slot, at) folds the first `at` committed entries: it equals the FP64 oracle at every
// committed position.
TEST(State, FoldsEveryCommittedPrefix) {
  std::mt19937_64 rng(500);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  ReplayCache cache(s, params, config_for(Mode::fp32, 1));
  cache.open(0, 3);
  Fp64Recurrence ref(s, params);
  Tokens pre = random_tokens(s, DType::f32, 1, 6, rng);
  prefill(cache, {0}, pre);
  for (int t = 0; t < 6; ++t) ref.step(pre, 0, t);
  std::vector<std::vector<double>> states{ref.S};
  Tokens tk = random_tokens(s, DType::f32, 1, 8, rng);
  verify(cache, {0}, tk);
  commit(cache, {0}, {8});
  for (int t = 0; t < 8; ++t) {
    ref.step(tk, 0, t);
    states.push_back(ref.S);
  }
  for (int at = 0; at <= 8; ++at) EXPECT_LT(rel_l2(cache.state(0, at), states[at]), 1e-5);
  EXPECT_THROW(cache.state(0, 9), Error);
}

// Prefill in chunks equals the FP64 recurrence; each chunk reaches the checkpoint.
TEST(Prefill, ChunksMatchFp64AndEmptyTheRing) {
  std::mt19937_64 rng(600);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  ReplayCache cache(s, params, config_for(Mode::fp32, 1));
  cache.open(0, 3);
  Fp64Recurrence ref(s, params);
  const int per_token = s.nheads * s.headdim;
  for (int chunk : {1, 7, 33, 1, 2}) {
    Tokens tk = random_tokens(s, DType::f32, 1, chunk, rng);
    const std::vector<float> y = prefill(cache, {0}, tk);
    for (int t = 0; t < chunk; ++t)
      EXPECT_LT(rel_l2(token_slice(y, t, per_token), ref.step(tk, 0, t)), 1e-5);
    EXPECT_EQ(cache.cursors(0).committed, 0);
    EXPECT_LT(rel_l2(cache.state(0), ref.S), 1e-5);
    // A few decodes between chunks: prefill folds them first.
    Tokens one = random_tokens(s, DType::f32, 1, 3, rng);
    const std::vector<float> yv = verify(cache, {0}, one);
    commit(cache, {0}, {3});
    for (int t = 0; t < 3; ++t)
      EXPECT_LT(rel_l2(token_slice(yv, t, per_token), ref.step(one, 0, t)), 1e-5);
  }
}

// Export and import round-trip bit for bit; import_state re-encodes a plain fp32 state.
TEST(ExportImport, RoundTripAndStateImport) {
  std::mt19937_64 rng(700);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  for (Mode mode : kAllModes) {
    ReplayCache cache(s, params, config_for(mode, 3, DType::bf16));
    cache.open(0, 11);
    Tokens pre = random_tokens(s, DType::bf16, 1, 9, rng);
    prefill(cache, {0}, pre);
    Tokens tk = random_tokens(s, DType::bf16, 1, 8, rng);
    verify(cache, {0}, tk);
    commit(cache, {0}, {5});
    const std::vector<uint8_t> bytes = cache.export_slot(0);
    cache.import_slot(1, bytes);
    EXPECT_EQ(cache.export_slot(1), bytes) << mode_name(mode);
    Tokens next = random_tokens(s, DType::bf16, 1, 4, rng);
    EXPECT_EQ(verify(cache, {0}, next), verify(cache, {1}, next)) << mode_name(mode);

    // import_state: the state of a prompt boundary, re-encoded in this cache's mode.
    const std::vector<float> st = cache.state(0, 2);
    cache.import_state(2, 12, st.data());
    EXPECT_EQ(cache.cursors(2).committed, 0);
    // Per-element relative bounds of the recurrence checkpoint's encoding (docs/numerics.md):
    // bf16 2^-8, fp16 (nearest or SR, also the separate modes' carrier) 2^-10, e4m3 2^-4; int8
    // has an absolute bound of amax/254 per row, a few percent of a row's RMS.
    const double tol = mode == Mode::fp32          ? 1e-7
                       : mode == Mode::bf16        ? 0x1p-8
                       : mode == Mode::shared_fp8  ? 0x1p-4
                       : mode == Mode::shared_int8 ? 2e-2
                                                   : 0x1p-10;
    EXPECT_LE(rel_l2(cache.state(2), st), tol) << mode_name(mode);
  }
}

// The checkpoint bytes are only written by a flush: a non-flushing verify leaves them alone.
TEST(VerifyCommit, NonFlushingVerifyWritesNoCheckpoint) {
  std::mt19937_64 rng(800);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  ReplayCache cache(s, params, config_for(Mode::separate_nvfp4, 1));
  cache.open(0, 1);
  Tokens pre = random_tokens(s, DType::f32, 1, 4, rng);
  prefill(cache, {0}, pre);
  const uint64_t writes = cache.stats().checkpoint_writes;
  Tokens tk = random_tokens(s, DType::f32, 1, 8, rng);
  verify(cache, {0}, tk);
  commit(cache, {0}, {8});
  verify(cache, {0}, tk);
  commit(cache, {0}, {8});
  EXPECT_EQ(cache.stats().checkpoint_writes, writes);
  verify(cache, {0}, tk);  // c = 16: this one flushes
  EXPECT_EQ(cache.stats().checkpoint_writes, writes + 1);
}

// decode = verify(W = 1) + commit(1), also with [B, H, P] views (no token dimension).
TEST(Decode, EqualsVerifyOfOneAndCommit) {
  std::mt19937_64 rng(900);
  const SsmShape s = kSmall;
  const LayerParams params = random_params(s, rng);
  ReplayCache cache(s, params, config_for(Mode::separate_fp8, 2));
  cache.open(0, 4);
  cache.fork(0, 1, 4);
  for (int step = 0; step < 40; ++step) {
    Tokens tk = random_tokens(s, DType::f32, 1, 1, rng);
    const std::vector<float> y_verify = verify(cache, {0}, tk);
    commit(cache, {0}, {1});
    std::vector<int32_t> slots{1};
    std::vector<float> y(size_t(s.nheads) * s.headdim, NAN);
    cache.decode(testing::i32_view(slots), host_view(tk.x.data(), DType::f32, {1, 4, 8}),
                 host_view(tk.B.data(), DType::f32, {1, 2, 16}),
                 host_view(tk.C.data(), DType::f32, {1, 2, 16}),
                 host_view(tk.dt.data(), DType::f32, {1, 4}),
                 host_view(y.data(), DType::f32, {1, 4, 8}));
    ASSERT_EQ(y, y_verify) << "step " << step;
  }
  EXPECT_EQ(cache.export_slot(0), cache.export_slot(1));
}

}  // namespace
}  // namespace replayssm
