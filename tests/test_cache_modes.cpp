// Quantized modes against an independent straightforward implementation in the test (SPEC 7.2,
// issue item 6), the standard-decode baseline (item 7), and a soak over every mode (item 5).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "cache/checkpoint_codec.h"
#include "cache/layout.h"
#include "replayssm/cache.h"
#include "replayssm/error.h"
#include "replayssm/standard_decode.h"
#include "ssm_test_util.h"

namespace replayssm {
namespace {

using testing::commit;
using testing::Fp64Recurrence;
using testing::i32_view;
using testing::prefill;
using testing::random_params;
using testing::random_tokens;
using testing::rel_l2;
using testing::Tokens;
using testing::verify;

// The payload of an export (the slot's sections) and its cursors, parsed independently of the
// library's reader: the payload is the bytes between the JSON header and the CRC.
std::vector<uint8_t> payload_of(const std::vector<uint8_t>& file) {
  uint32_t header_len = 0;
  std::memcpy(&header_len, file.data() + 12, 4);
  return std::vector<uint8_t>(file.begin() + 16 + header_len, file.end() - 4);
}

// Issue item 6: decode the read checkpoint from the exported bytes with the format decoders,
// compute y in FP64 from it and the ring, and compare with the cache's readout. The only
// differences allowed are the cache's FP32 arithmetic and the BF16 rounding of C in the 8/4-bit
// read modes: |y - y64| <= 2^-8 * sum_n |s_n C_n| * decay + 1e-5 * scale (docs/numerics.md).
TEST(QuantizedModes, ReadoutMatchesIndependentFp64Implementation) {
  const SsmShape s{4, 8, 32, 2};
  for (Mode mode : kAllModes) {
    std::mt19937_64 rng(900 + int(mode));
    const LayerParams params = random_params(s, rng);
    CacheConfig config;
    config.mode = mode;
    config.num_slots = 1;
    config.activation_dtype = DType::bf16;
    ReplayCache cache(s, params, config);
    cache.open(0, 42);
    Tokens pre = random_tokens(s, DType::bf16, 1, 12, rng);
    prefill(cache, {0}, pre);
    for (int step = 0; step < 30; ++step) {
      const int W = std::uniform_int_distribution<int>(1, 8)(rng);
      if (cache.cursors(0).committed + W > config.history) {
        std::vector<int32_t> slot{0};
        cache.flush(i32_view(slot));
      }
      // Snapshot of checkpoint and ring before the verify (nothing flushes inside it now).
      const std::vector<uint8_t> bytes = payload_of(cache.export_slot(0));
      const SlotCursors cur = cache.cursors(0);
      Tokens tk = random_tokens(s, DType::bf16, 1, W, rng);
      const std::vector<float> y = verify(cache, {0}, tk);
      commit(cache, {0}, {std::uniform_int_distribution<int>(1, W)(rng)});

      const SlotLayout layout = SlotLayout::make(s, config);
      auto sec = [&](SlotLayout::Section x) {
        return layout.size[x] ? const_cast<uint8_t*>(bytes.data()) + layout.offset[x] : nullptr;
      };
      const SlotCheckpoint ck{sec(SlotLayout::rec),
                              reinterpret_cast<float*>(sec(SlotLayout::rec_scale)),
                              sec(SlotLayout::read), sec(SlotLayout::read_block_scale),
                              reinterpret_cast<float*>(sec(SlotLayout::read_scale))};
      const int H = s.nheads, P = s.headdim, N = s.dstate, G = s.ngroups, c = cur.committed;
      for (int h = 0; h < H; ++h) {
        const int g = h / s.heads_per_group();
        const double A = -std::exp(double(params.A_log[h]));
        // Entries 0..c-1 from the snapshot ring, c..c+W-1 from the window (in fp64).
        std::vector<double> deltas, xs, Bs;
        for (int k = 0; k < c + W; ++k) {
          if (k < c) {
            const int phys = (cur.origin + k) & (config.history - 1);
            deltas.push_back(
                reinterpret_cast<const float*>(sec(SlotLayout::ring_delta))[phys * H + h]);
            for (int p = 0; p < P; ++p)
              xs.push_back(bf16_to_f32(reinterpret_cast<const uint16_t*>(
                  sec(SlotLayout::ring_x))[(phys * H + h) * P + p]));
            for (int n = 0; n < N; ++n)
              Bs.push_back(bf16_to_f32(reinterpret_cast<const uint16_t*>(
                  sec(SlotLayout::ring_B))[(phys * G + g) * N + n]));
          } else {
            const int j = k - c;
            deltas.push_back(testing::delta64(tk.dt[j * H + h], params, h));
            for (int p = 0; p < P; ++p) xs.push_back(tk.xf[(j * H + h) * P + p]);
            for (int n = 0; n < N; ++n) Bs.push_back(tk.Bf[(j * G + g) * N + n]);
          }
        }
        std::vector<double> sums(deltas.size());
        double run = 0.0;
        for (size_t k = 0; k < deltas.size(); ++k) sums[k] = run += deltas[k];
        for (int p = 0; p < P; ++p) {
          // Independent decode of the read checkpoint row.
          std::vector<double> srow(N);
          const int row = h * P + p;
          for (int n = 0; n < N; ++n) {
            const size_t e = size_t(row) * N + n;
            switch (mode) {
              case Mode::fp32:
                srow[n] = reinterpret_cast<const float*>(ck.rec)[e];
                break;
              case Mode::bf16:
                srow[n] = bf16_to_f32(reinterpret_cast<const uint16_t*>(ck.rec)[e]);
                break;
              case Mode::fp16:
              case Mode::fp16_sr:
                srow[n] = f16_to_f32(reinterpret_cast<const uint16_t*>(ck.rec)[e]);
                break;
              case Mode::shared_fp8:
                srow[n] = double(e4m3_to_f32(reinterpret_cast<const uint8_t*>(ck.rec)[e])) *
                          ck.rec_scale[row];
                break;
              case Mode::shared_int8:
                srow[n] = double(reinterpret_cast<const int8_t*>(ck.rec)[e]) * ck.rec_scale[row];
                break;
              case Mode::separate_fp8:
                srow[n] = double(e4m3_to_f32(ck.read[e])) * ck.read_scale[row];
                break;
              case Mode::separate_nvfp4: {
                const uint8_t byte = ck.read[e / 2];
                const uint8_t code = (e % 2) ? byte >> 4 : byte & 0xf;
                srow[n] = double(e2m1_to_f32(code)) * e4m3_to_f32(ck.read_block_scale[e / 16]) *
                          ck.read_scale[row];
                break;
              }
            }
          }
          for (int j = 0; j < W; ++j) {
            const int m = c + j;
            double readout = 0.0, magnitude = 0.0;
            for (int n = 0; n < N; ++n) {
              const double cv = tk.Cf[(j * G + g) * N + n];
              readout += srow[n] * cv;
              magnitude += std::abs(srow[n] * cv);
            }
            const double dec = std::exp(A * sums[m]);
            double y64 = dec * readout;
            double ring_mag = 0.0;
            for (int k = 0; k <= m; ++k) {
              double bc = 0.0;
              for (int n = 0; n < N; ++n) bc += Bs[size_t(k) * N + n] * tk.Cf[(j * G + g) * N + n];
              const double term =
                  deltas[k] * std::exp(A * (sums[m] - sums[k])) * bc * xs[size_t(k) * P + p];
              y64 += term;
              ring_mag += std::abs(term);
            }
            y64 += params.D[h] * xs[size_t(m) * P + p];
            const double bound = (has_bf16_readout(mode) ? 0x1p-8 : 0.0) * magnitude * dec +
                                 1e-5 * (magnitude * dec + ring_mag + std::abs(y64));
            const double got = y[(size_t(j) * H + h) * P + p];
            ASSERT_LE(std::abs(got - y64), bound + 1e-30)
                << mode_name(mode) << " step " << step << " h " << h << " p " << p << " j " << j;
          }
        }
      }
    }
  }
}

// Issue item 6, second half: after each flush of a separate mode the carrier equals SR of the
// FP32 fold and the read copy equals the nearest encoding of the same values.
// Both layouts of the random bits (SPEC 6, checkpoint_codec.h): r = 7 takes a byte of a draw per
// element, r = 11 16 bits.
TEST(QuantizedModes, SeparateFlushEncodesCarrierAndReadCopyFromOneFold) {
  const SsmShape s{4, 8, 32, 2};
  for (const auto& [mode, r_bits] :
       {std::pair{Mode::separate_fp8, 7}, {Mode::separate_nvfp4, 7}, {Mode::separate_fp8, 11}}) {
    std::mt19937_64 rng(1000 + int(mode) + r_bits);
    const LayerParams params = random_params(s, rng);
    CacheConfig config;
    config.mode = mode;
    config.num_slots = 1;
    config.sr_bits = r_bits;
    config.seed = 0xABCDEF0123ull;
    config.layer = 3;
    ReplayCache cache(s, params, config);
    cache.open(0, 0x100000007ull);
    const SlotLayout layout = SlotLayout::make(s, config);
    for (int flush = 0; flush < 6; ++flush) {
      for (int i = 0; i < 3; ++i) {
        Tokens tk = random_tokens(s, DType::bf16, 1, 4, rng);
        verify(cache, {0}, tk);
        commit(cache, {0}, {4});
      }
      const std::vector<float> fold = cache.state(0);  // the FP32 fold a flush computes
      const uint32_t flush_index = cache.cursors(0).flush_index;
      std::vector<int32_t> slot{0};
      cache.flush(i32_view(slot));
      const std::vector<uint8_t> bytes = payload_of(cache.export_slot(0));
      const int N = s.dstate;
      const U32x2 key{{uint32_t(config.seed), uint32_t(config.seed >> 32) ^ 3u}};
      for (int row = 0; row < s.nheads * s.headdim; ++row) {
        const float* v = fold.data() + size_t(row) * N;
        for (int n = 0; n < N; ++n) {
          const uint64_t e = uint64_t(row) * N + n;
          // r <= 8: counter (e / 16, flush, request), byte e % 16 of the draw; else counter
          // (e / 8, ...), 16 bits per element.
          const bool bytes8 = r_bits <= 8;
          const uint32_t group = uint32_t(bytes8 ? e >> 4 : e >> 3);
          const U32x4 r = philox4x32(U32x4{{group, flush_index, 7u, 1u}}, key, 10);
          const uint32_t field = bytes8 ? (r.v[(e & 15) >> 2] >> (8 * (e & 3))) & 0xffu
                                        : (r.v[(e & 7) >> 1] >> (16 * (e & 1))) & 0xffffu;
          const uint16_t want = f32_to_f16_sr(v[n], field, r_bits);
          uint16_t got;
          std::memcpy(&got, bytes.data() + layout.offset[SlotLayout::rec] + 2 * e, 2);
          ASSERT_EQ(got, want) << mode_name(mode) << " r " << r_bits << " row " << row << " n "
                               << n;
        }
        std::vector<uint8_t> codes(N), block_scales(N / 16);
        float scale;
        if (mode == Mode::separate_fp8) {
          scale = encode_row_e4m3(v, N, codes.data());
          ASSERT_EQ(
              0, std::memcmp(codes.data(),
                             bytes.data() + layout.offset[SlotLayout::read] + size_t(row) * N, N));
        } else {
          scale = encode_row_nvfp4(v, N, codes.data(), block_scales.data());
          ASSERT_EQ(
              0, std::memcmp(codes.data(),
                             bytes.data() + layout.offset[SlotLayout::read] + size_t(row) * N / 2,
                             N / 2));
          ASSERT_EQ(0, std::memcmp(block_scales.data(),
                                   bytes.data() + layout.offset[SlotLayout::read_block_scale] +
                                       size_t(row) * N / 16,
                                   N / 16));
        }
        float stored;
        std::memcpy(&stored, bytes.data() + layout.offset[SlotLayout::read_scale] + 4 * row, 4);
        ASSERT_EQ(stored, scale);
      }
    }
  }
}

// The chunk form of the random bits that the CUDA encoders take (SrChunk: 16-bit fields, from a
// draw's half with r <= 8 or the whole draw) gives every element the field sr_random gives it,
// for every r, both halves of a byte-layout group and counters past 2^32 elements; the group
// (Philox counter word 0) is element / 16 for r <= 8 and element / 8 above.
TEST(StochasticRoundingBits, ChunkFormGivesEachElementItsField) {
  std::mt19937 rng(77);
  for (int r = 1; r <= 13; ++r) {
    const SrContext sr = make_sr_context(U32x2{{rng(), rng()}}, 5, 2, r, 10);
    const uint32_t mask = (1u << r) - 1u;
    for (uint64_t e : {uint64_t(0), uint64_t(8), uint64_t(16), uint64_t(24), uint64_t(4096 + 8),
                       (uint64_t(1) << 33) + 8, uint64_t(rng()) * 8}) {
      const U32x4 draw = sr_draw(sr, e);
      EXPECT_EQ(sr_counter(sr, e).v[0], uint32_t(e / (r <= 8 ? 16 : 8))) << "r " << r;
      const SrChunk chunk = sr_chunk(draw, e, r);
      for (int k = 0; k < 8; ++k) {
        // The element's own field, read straight from the draw as the layout defines it.
        const uint64_t i = (e + uint64_t(k)) % (r <= 8 ? 16 : 8);
        const uint32_t field =
            r <= 8 ? draw.v[i / 4] >> (8 * (i % 4)) : draw.v[i / 2] >> (16 * (i % 2));
        EXPECT_EQ(sr_random(draw, e + uint64_t(k), r) & mask, field & mask) << "r " << r;
        EXPECT_EQ(sr_chunk_random(chunk, k) & mask, field & mask) << "r " << r << " e " << e;
      }
      // The draw of the group's other chunk is the same draw.
      if (r <= 8) EXPECT_EQ(sr_draw(sr, e ^ 8u).v[1], draw.v[1]) << "r " << r;
    }
  }
}

// Issue item 7: the standard-decode baseline (fp32 state) equals the FP64 recurrence and the
// fp32 replay outputs; the T > 1 intermediate states are the states after each token.
TEST(StandardDecode, MatchesFp64AndReplay) {
  const SsmShape s{4, 8, 16, 2};
  std::mt19937_64 rng(1100);
  const LayerParams params = random_params(s, rng);
  CacheConfig config;
  config.num_slots = 2;
  config.activation_dtype = DType::f32;
  ReplayCache cache(s, params, config);
  cache.open(1, 0);
  std::vector<float> state(2 * size_t(s.state_elements()), 0.0f);
  Fp64Recurrence ref(s, params);
  std::vector<int32_t> slots{1};
  for (int step = 0; step < 50; ++step) {
    Tokens tk = random_tokens(s, DType::f32, 1, 1, rng);
    std::vector<float> y(size_t(s.nheads) * s.headdim, NAN);
    StandardDecodeConfig sd;
    standard_decode(BackendKind::cpu, s, params, sd,
                    host_view(state.data(), DType::f32, {2, s.nheads, s.headdim, s.dstate}),
                    i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                    host_view(y.data(), DType::f32, {1, 1, s.nheads, s.headdim}), nullptr);
    const std::vector<double> y_ref = ref.step(tk, 0, 0);
    ASSERT_LT(rel_l2(y, y_ref), 1e-5);
    const std::vector<float> y_replay = verify(cache, {1}, tk);
    commit(cache, {1}, {1});
    ASSERT_LT(rel_l2(y, y_replay), 1e-5);
  }
  std::vector<float> slot1(state.begin() + s.state_elements(), state.end());
  EXPECT_LT(rel_l2(slot1, ref.S), 1e-5);

  // T = 8 with intermediate states: state untouched, intermediate[t] = state after token t.
  Tokens tk = random_tokens(s, DType::f32, 1, 8, rng);
  std::vector<float> inter(8 * size_t(s.state_elements()), NAN),
      y(8 * size_t(s.nheads) * s.headdim);
  const std::vector<float> before = state;
  TensorView iv = host_view(inter.data(), DType::f32, {1, 8, s.nheads, s.headdim, s.dstate});
  standard_decode(BackendKind::cpu, s, params, StandardDecodeConfig{},
                  host_view(state.data(), DType::f32, {2, s.nheads, s.headdim, s.dstate}),
                  i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                  host_view(y.data(), DType::f32, {1, 8, s.nheads, s.headdim}), &iv);
  EXPECT_EQ(state, before);
  for (int t = 0; t < 8; ++t) {
    ref.step(tk, 0, t);
    std::vector<float> it(inter.begin() + t * s.state_elements(),
                          inter.begin() + (t + 1) * s.state_elements());
    EXPECT_LT(rel_l2(it, ref.S), 1e-5) << "token " << t;
  }
}

// Issue item 5: a 1000-step soak per mode. Several slots at different fill levels, random
// windows with mean accepted length ~4.3 of W = 8, interleaved prefill chunks, forks and
// releases. Outputs stay finite and the fp32 mode tracks the FP64 oracle of every request.
TEST(Soak, ThousandStepsEveryMode) {
  const SsmShape s{4, 8, 16, 2};
  for (Mode mode : kAllModes) {
    std::mt19937_64 rng(1200 + int(mode));
    const LayerParams params = random_params(s, rng);
    CacheConfig config;
    config.mode = mode;
    config.num_slots = 6;
    config.activation_dtype = DType::f32;
    ReplayCache cache(s, params, config);
    std::map<int, Fp64Recurrence> refs;
    uint64_t next_request = 1;
    double worst = 0.0;
    for (int step = 0; step < 1000; ++step) {
      const int action = std::uniform_int_distribution<int>(0, 99)(rng);
      std::vector<int> open_slots, free_slots;
      for (int i = 0; i < config.num_slots; ++i)
        (cache.is_open(i) ? open_slots : free_slots).push_back(i);
      if (open_slots.empty() || (action < 4 && !free_slots.empty())) {
        const int slot = free_slots[0];
        cache.open(slot, next_request++);
        refs.insert_or_assign(slot, Fp64Recurrence(s, params));
        continue;
      }
      if (action < 7 && !free_slots.empty()) {
        const int src = open_slots[rng() % open_slots.size()], dst = free_slots[0];
        cache.fork(src, dst, next_request++);
        refs.insert_or_assign(dst, refs.at(src));
        continue;
      }
      if (action < 9 && open_slots.size() > 1) {
        const int slot = open_slots[rng() % open_slots.size()];
        cache.release(slot);
        refs.erase(slot);
        continue;
      }
      if (action < 14) {
        const int slot = open_slots[rng() % open_slots.size()];
        const int chunk = std::uniform_int_distribution<int>(1, 20)(rng);
        Tokens tk = random_tokens(s, DType::f32, 1, chunk, rng);
        const std::vector<float> y = prefill(cache, {slot}, tk);
        for (int t = 0; t < chunk; ++t) {
          const std::vector<double> y_ref = refs.at(slot).step(tk, 0, t);
          if (mode == Mode::fp32) {
            std::vector<float> yt(y.begin() + t * y_ref.size(), y.begin() + (t + 1) * y_ref.size());
            worst = std::max(worst, rel_l2(yt, y_ref));
          }
        }
        continue;
      }
      // A verify over all open slots plus a padding entry, then a random commit.
      const int W = std::uniform_int_distribution<int>(1, 8)(rng);
      std::vector<int32_t> batch(open_slots.begin(), open_slots.end());
      batch.insert(batch.begin() + rng() % (batch.size() + 1), kPaddingSlot);
      const int B = int(batch.size());
      Tokens tk = random_tokens(s, DType::f32, B, W, rng);
      const std::vector<float> y = verify(cache, batch, tk);
      std::vector<int32_t> accepted(B, 1);
      const size_t per_token = size_t(s.nheads) * s.headdim;
      for (int b = 0; b < B; ++b) {
        if (batch[b] == kPaddingSlot) continue;
        // Geometric acceptance of drafts with p = 0.82: mean accepted length ~4.3 at W = 8.
        int k = 1;
        while (k < W && std::uniform_real_distribution<double>(0, 1)(rng) < 0.82) ++k;
        accepted[b] = k;
        for (int j = 0; j < W; ++j) {
          const float* yj = y.data() + (size_t(b) * W + j) * per_token;
          for (size_t i = 0; i < per_token; ++i) ASSERT_TRUE(std::isfinite(yj[i]));
          if (j < k) {
            const std::vector<double> y_ref = refs.at(batch[b]).step(tk, b, j);
            if (mode == Mode::fp32)
              worst = std::max(worst, rel_l2(std::vector<float>(yj, yj + per_token), y_ref));
          }
        }
      }
      commit(cache, batch, accepted);
    }
    if (mode == Mode::fp32) {
      EXPECT_LT(worst, 1e-5);
      for (auto& [slot, ref] : refs) EXPECT_LT(rel_l2(cache.state(slot), ref.S), 1e-5);
    }
    EXPECT_GT(cache.stats().flushes, 50u) << mode_name(mode);
    EXPECT_EQ(cache.stats().nonfinite, 0u);
  }
}

}  // namespace
}  // namespace replayssm
