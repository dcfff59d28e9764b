// Codec tests: exhaustive decode/re-encode, every rounding tie, saturation and special values,
// the stochastic-rounding bias bound, and the error bounds of the row-scaled codecs. Expected
// values come from formulas evaluated in double here, never from the code under test.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/formats.h"
#include "core/nonfinite.h"
#include "core/philox.h"

namespace replayssm {
namespace {

bool is_nan(float x) { return std::isnan(x); }
float from_bits(uint32_t u) { return bits_f32(u); }

// Reference decoders from sign / exponent / mantissa.
double ref_f16(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(m, -24);
  } else {
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return s ? -v : v;
}
double ref_bf16(uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
  double v;
  if (e == 255) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(m, -133);  // m/128 * 2^-126
  } else {
    v = std::ldexp(1.0 + m / 128.0, e - 127);
  }
  return s ? -v : v;
}
double ref_e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  double v;
  if (e == 15 && m == 7) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(m, -9);
  } else {
    v = std::ldexp(1.0 + m / 8.0, e - 7);
  }
  return s ? -v : v;
}
double ref_e2m1(uint8_t c) {
  const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
  const double v = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -v : v;
}

// Deterministic stream of 32-bit words from Philox (fixed key).
struct Rng {
  uint32_t key0;
  uint32_t n = 0;
  uint32_t buf[4] = {};
  int left = 0;
  explicit Rng(uint32_t seed) : key0(seed) {}
  uint32_t next() {
    if (left == 0) {
      const U32x4 r = philox4x32(U32x4{{n++, 0x5eed, 0, 0}}, U32x2{{key0, 0x1234}});
      std::memcpy(buf, r.v, sizeof(buf));
      left = 4;
    }
    return buf[--left];
  }
  double uniform() { return (next() >> 8) * 0x1p-24; }  // [0, 1)
  // sign * 2^(uniform exponent in [lo, hi)) * (1 + random mantissa), exact in fp32
  float log_uniform(int lo, int hi) {
    const int e = lo + static_cast<int>(next() % static_cast<uint32_t>(hi - lo));
    const float m = 1.f + (next() & 0x7fffff) * 0x1p-23f;
    const float v = std::ldexp(m, e);
    return (next() & 1) ? -v : v;
  }
};

// ---------------------------------------------------------------------------------------------
// Exhaustive decode / re-encode.

// The packed NaN / Inf test of the device's input validation (core/nonfinite.h) against
// std::isfinite of the decoded values: every bf16 and fp16 pattern in either half of a word, next
// to a finite, an infinite and a NaN neighbour, and every fp32 exponent with both signs and
// mantissas at the edges and in between.
TEST(PackedNonfinite, MatchesIsfiniteOfEveryValue) {
  for (const bool f16 : {false, true}) {
    const PackedFields f = packed_fields(2, f16);
    auto decode = [&](uint32_t h) {
      return f16 ? f16_to_f32(uint16_t(h)) : bf16_to_f32(uint16_t(h));
    };
    const uint32_t inf = f16 ? 0x7c00u : 0x7f80u;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      for (const uint32_t other : {0x0000u, 0x3c01u, 0x8001u, inf, inf | 1u, 0xffffu}) {
        const bool expect = !std::isfinite(decode(h)) || !std::isfinite(decode(other));
        ASSERT_EQ(any_nonfinite(exponent_carries(h | other << 16, f), f), expect)
            << (f16 ? "fp16 " : "bf16 ") << std::hex << h << " low, " << other << " high";
        ASSERT_EQ(any_nonfinite(exponent_carries(other | h << 16, f), f), expect)
            << (f16 ? "fp16 " : "bf16 ") << std::hex << h << " high, " << other << " low";
      }
    }
  }
  const PackedFields f = packed_fields(4, false);
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t exponent = 0; exponent < 256; ++exponent)
      for (const uint32_t mantissa : {0u, 1u, 0x2aaaaau, 0x400000u, 0x555555u, 0x7fffffu}) {
        const uint32_t word = sign << 31 | exponent << 23 | mantissa;
        ASSERT_EQ(any_nonfinite(exponent_carries(word, f), f), !std::isfinite(from_bits(word)))
            << std::hex << word;
      }
  // Several words ORed before the one test, as the device does per 16-byte vector.
  const PackedFields b = packed_fields(2, false);
  EXPECT_FALSE(
      any_nonfinite(exponent_carries(0x7f7f7f7fu, b) | exponent_carries(0xff7f0000u, b), b));
  EXPECT_TRUE(
      any_nonfinite(exponent_carries(0x7f7f7f7fu, b) | exponent_carries(0x7f800000u, b), b));
}

TEST(Fp16, AllPatternsDecodeAndReencode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const double want = ref_f16(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(is_nan(f)) << std::hex << h;
      const uint16_t back = f32_to_f16(f);
      ASSERT_TRUE(std::isnan(ref_f16(back))) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000);
      if (h & 0x200) {
        ASSERT_EQ(back, h);  // quiet NaNs keep their payload
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(Bf16, AllPatternsDecodeAndReencode) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    const double want = ref_bf16(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(is_nan(f));
      const uint16_t back = f32_to_bf16(f);
      ASSERT_TRUE(std::isnan(ref_bf16(back)));
      ASSERT_EQ(back & 0x8000, b & 0x8000);
      if (b & 0x40) {
        ASSERT_EQ(back, b);
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << b;
    ASSERT_EQ(f32_to_bf16(f), b) << std::hex << b;
  }
}

TEST(E4m3, AllCodesDecodeToFormulaAndReencode) {
  int nans = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = e4m3_to_f32(static_cast<uint8_t>(c));
    const double want = ref_e4m3(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(is_nan(f));
      EXPECT_EQ(f32_to_e4m3(f), c);  // 0x7f and 0xff: sign kept
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), want) << c;
    EXPECT_EQ(std::signbit(f), c >= 128);
    EXPECT_EQ(f32_to_e4m3(f), c) << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
}

TEST(E2m1, AllCodesDecodeToFormulaAndReencode) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t c = 0; c < 16; ++c) {
    const float f = e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(f), ref_e2m1(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(std::fabs(ref_e2m1(static_cast<uint8_t>(c))), mags[c & 7]);
    EXPECT_EQ(std::signbit(f), c >= 8);
    EXPECT_EQ(f32_to_e2m1(f), c) << c;
  }
  // Only the low nibble is a code.
  EXPECT_EQ(e2m1_to_f32(0xf7), 6.f);
}

// The e4m3-byte decoder of the GPU readout (hardware e4m3 conversion): every code at every byte
// position of both nibble forms, beside random neighbours, bit for bit (signed zeros too); and
// its products with every finite e4m3 block scale are exact in fp16, so the readout's fp16
// multiply and the 2^6 applied later give e2m1 x block scale exactly.
TEST(E2m1, CodesAsScaledE4m3BytesMatchTheDecoder) {
  Rng rng(41);
  for (int pos = 0; pos < 4; ++pos)
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t noise = rng.next() & ~(0xffu << (8 * pos));
      const uint32_t packed = noise | (byte << (8 * pos));
      const uint8_t even = uint8_t(e2m1x4_even_to_e4m3x4_scaled(packed) >> (8 * pos));
      const uint8_t odd = uint8_t(e2m1x4_odd_to_e4m3x4_scaled(packed) >> (8 * pos));
      const uint8_t codes[2] = {uint8_t(byte & 0xfu), uint8_t(byte >> 4)};
      const uint8_t got[2] = {even, odd};
      for (int i = 0; i < 2; ++i) {
        const float v = e4m3_to_f32(got[i]);
        ASSERT_EQ(f32_bits(v * kE2m1E4m3Unscale), f32_bits(e2m1_to_f32(codes[i])))
            << "byte " << byte << " position " << pos << " nibble " << i;
        for (uint32_t s = 0; s < 0x7f; ++s) {
          const float d = e4m3_to_f32(uint8_t(s));
          const float product = v * d;  // what the fp16 multiply must hold exactly
          ASSERT_EQ(f32_bits(f16_to_f32(f32_to_f16(product))), f32_bits(product)) << byte << s;
          ASSERT_EQ(f32_bits(product * kE2m1E4m3Unscale), f32_bits(e2m1_to_f32(codes[i]) * d));
        }
      }
    }
}

// f32_to_e2m1 (rounding by one fp32 addition at the binade's step) against the thresholds between
// the 8 magnitudes, ties to the even index: every float of magnitude 2^-3 .. 2^4 (all 7 ties, the
// binade edges and saturation), both signs, and 4096 mantissas of every other exponent.
TEST(E2m1, EncoderMatchesThresholdsOnEveryFloatThatRounds) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  auto reference = [&](float x) -> uint32_t {
    if (std::isnan(x)) return 0;
    const double a = std::fabs(double(x));
    uint32_t i = 0;
    while (i < 7) {
      const double mid = (mags[i] + mags[i + 1]) / 2;
      if (a < mid || (a == mid && i % 2 == 0)) break;
      ++i;
    }
    return (std::signbit(x) ? 0x8u : 0u) | i;
  };
  int64_t checked = 0;
  auto check = [&](uint32_t bits) {
    const float x = from_bits(bits);
    const uint32_t got = f32_to_e2m1(x), want = reference(x);
    if (got != want) {
      ADD_FAILURE() << "x = " << x << " (bits " << std::hex << bits << "): " << got << " vs "
                    << want;
      return false;
    }
    ++checked;
    return true;
  };
  for (uint32_t bits = 0x3e000000u; bits < 0x41800000u; ++bits)  // [2^-3, 2^4)
    if (!check(bits) || !check(bits | 0x80000000u)) return;
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m = 0; m < 4096; ++m) {
      const uint32_t bits = (e << 23) | (m * 2047u % 0x800000u);
      if (!check(bits) || !check(bits | 0x80000000u)) return;
    }
  EXPECT_GT(checked, int64_t(2) * 7 * (1 << 23));
}

// The GPU flush's e2m1 encoder (rounding to a scaled value, e4m3 conversion, codes from the
// byte's bit fields) against f32_to_e2m1 over the same floats as above but NaN: the scaled value
// must convert to e4m3 exactly and give f32_to_e2m1's code back, at every byte position.
TEST(E2m1, EncoderByWayOfE4m3MatchesTheEncoder) {
  int64_t checked = 0;
  auto check = [&](uint32_t bits) {
    const float x = from_bits(bits);
    const float scaled = f32_to_e2m1_scaled(x);
    const uint8_t byte = f32_to_e4m3(scaled);
    const int pos = int(bits % 4);
    const uint32_t code = e4m3x4_scaled_to_e2m1x4(uint32_t(byte) << (8 * pos)) >> (8 * pos);
    if (f32_bits(e4m3_to_f32(byte)) != f32_bits(scaled) || code != f32_to_e2m1(x)) {
      ADD_FAILURE() << "x = " << x << " (bits " << std::hex << bits << "): scaled " << scaled
                    << " byte " << uint32_t(byte) << " code " << code << " vs "
                    << uint32_t(f32_to_e2m1(x));
      return false;
    }
    ++checked;
    return true;
  };
  for (uint32_t bits = 0x3e000000u; bits < 0x41800000u; ++bits)  // [2^-3, 2^4)
    if (!check(bits) || !check(bits | 0x80000000u)) return;
  for (uint32_t e = 0; e < 255; ++e)  // exponent 255 is Inf (checked below) and NaN
    for (uint32_t m = 0; m < 4096; ++m) {
      const uint32_t bits = (e << 23) | (m * 2047u % 0x800000u);
      if (!check(bits) || !check(bits | 0x80000000u)) return;
    }
  if (!check(0x7f800000u) || !check(0xff800000u)) return;
  EXPECT_GT(checked, int64_t(2) * 7 * (1 << 23));
}

// e2m1x4_pair_pack puts element i of the two code words (elements 0-3 and 4-7, one code in the
// low nibble of each byte) into nibble i.
TEST(E2m1, PairPackPutsElementIInNibbleI) {
  Rng rng(43);
  for (int t = 0; t < 100000; ++t) {
    uint32_t codes[8], lo = 0, hi = 0, want = 0;
    for (int i = 0; i < 8; ++i) {
      codes[i] = rng.next() & 0xfu;
      want |= codes[i] << (4 * i);
    }
    for (int i = 0; i < 4; ++i) lo |= codes[i] << (8 * i), hi |= codes[4 + i] << (8 * i);
    ASSERT_EQ(e2m1x4_pair_pack(lo, hi), want) << std::hex << lo << " " << hi;
  }
}

// detail::div_rn_by (the GPU encoders' division by a constant: one product and two FMAs) against
// the division it replaces, for the encoders' divisors: equal wherever the quotient is a normal
// number. Every significand of the binades around the lowest such x, of 2^0 and of the top binade,
// and 4096 significands of every other binade (the method's error depends on the significands
// alone while every value stays normal). Below, where the quotient is subnormal, the nvfp4
// encoder relies only on x < 2^-125 giving a quotient of 6 no larger than 2^-126.
TEST(DivRnBy, MatchesDivisionWhereverTheQuotientIsNormal) {
  struct Divisor {
    float y, r;
  };
  const Divisor divisors[] = {{kE2m1Max, kInvE2m1Max},
                              {kE4m3Max, kInvE4m3Max},
                              {kE4m3Max * kE2m1Max, kInvNvfp4Global},
                              {kInt8Max, kInvInt8Max}};
  for (const Divisor& d : divisors) {
    ASSERT_EQ(f32_bits(d.r), f32_bits(1.f / d.y)) << d.y;  // RN(1 / y)
    int64_t checked = 0;
    auto check = [&](uint32_t bits) {
      const float x = from_bits(bits);
      if (double(x) / double(d.y) < 0x1p-126) return true;  // subnormal quotient
      const float got = detail::div_rn_by(x, d.y, d.r), want = x / d.y;
      if (f32_bits(got) != f32_bits(want)) {
        ADD_FAILURE() << "x = " << x << " (bits " << std::hex << bits << ") / " << d.y << ": "
                      << got << " vs " << want;
        return false;
      }
      ++checked;
      return true;
    };
    // The binade of the smallest x with a normal quotient, the two around it, 2^0 and the top.
    const uint32_t low = f32_bits(d.y * 0x1p-126f) >> 23;
    for (const uint32_t e : {low - 1, low, low + 1, 127u, 254u})
      for (uint32_t m = 0; m < 0x800000u; ++m)
        if (!check((e << 23) | m)) return;
    for (uint32_t e = 0; e < 255; ++e)
      for (uint32_t m = 0; m < 4096; ++m)
        if (!check((e << 23) | (m * 2047u % 0x800000u))) return;
    EXPECT_GT(checked, int64_t(3) * (1 << 23)) << d.y;
  }
  for (uint32_t bits = 0; bits < 0x01000000u; ++bits) {  // x < 2^-125
    const float q = detail::div_rn_by(from_bits(bits), kE2m1Max, kInvE2m1Max);
    ASSERT_TRUE(q >= 0.f && q <= 0x1p-126f) << std::hex << bits;
  }
}

// The CUDA flush's divisions from an approximate reciprocal (detail::rcp_approx: MUFU.RCP on the
// device, at most 1 ulp from 1 / y; RN(1 / y) here). Each is checked with every reciprocal within
// kRcpSlack ulps of RN(1 / y), so that it holds for whatever value the device's MUFU.RCP gives.
constexpr int kRcpSlack = 2;
float ulps_from(float x, int k) { return from_bits(f32_bits(x) + uint32_t(k)); }  // x > 0 normal

// k = g / d of encode8_nvfp4: d a positive finite e4m3 value (the block scale), g = RN(2688 /
// amax) of a live row (2^-100 <= amax <= FLT_MAX). d's significand is one of 1 + m / 8 (the
// subnormals' too), and wherever the values stay normal the result depends only on the
// significands of g and d and on the reciprocal's offset: so every significand of g against each
// of the 8, every reciprocal of the window (and ones 120 ulps off, inside the method's margin);
// then every d at every binade of g's range, 1024 significands each, and 65536 at its ends.
TEST(DivRnByE4m3, MatchesDivisionForEveryBlockScale) {
  const float g_lo = 2688.f / 0x1.fffffep127f, g_hi = 2688.f / 0x1p-100f;
  const uint32_t e_lo = f32_bits(g_lo) >> 23, e_hi = f32_bits(g_hi) >> 23;
  ASSERT_EQ(e_lo, 127u - 117u);
  ASSERT_EQ(e_hi, 127u + 111u);
  int64_t checked = 0;
  auto check = [&](float g, float d, float r) {
    const float got = detail::div_rn_by(g, d, r), want = g / d;
    if (f32_bits(got) != f32_bits(want)) {
      ADD_FAILURE() << std::hexfloat << g << " / " << d << " with r = " << r << ": " << got
                    << " vs " << want;
      return false;
    }
    ++checked;
    return true;
  };
  for (uint32_t m = 0; m < 8; ++m) {
    const float d = 1.f + float(m) / 8.f, r = 1.f / d;
    for (int o = -kRcpSlack; o <= kRcpSlack; ++o)
      for (uint32_t s = 0; s < 0x800000u; ++s)
        if (!check(from_bits(0x3f800000u | s), d, ulps_from(r, o))) return;
    for (const int o : {-120, -60, 60, 120}) {
      ASSERT_LT(std::fabs(double(ulps_from(r, o)) * d - 1.0), 0x1p-16);  // the stated margin
      for (uint32_t s = 0; s < 0x800000u; s += 127)
        if (!check(from_bits(0x3f800000u | s), d, ulps_from(r, o))) return;
    }
  }
  int live_scales = 0;
  for (uint32_t code = 1; code < 0x7f; ++code) {
    const float d = e4m3_to_f32(uint8_t(code)), r = 1.f / d;
    ++live_scales;
    for (uint32_t e = e_lo; e <= e_hi; ++e) {
      const bool end = e <= e_lo + 1 || e == e_hi;
      const uint32_t step = end ? 128u : 8191u;
      for (uint32_t s = 0; s < 0x800000u; s += step)
        for (int o = -kRcpSlack; o <= kRcpSlack; o += (end ? kRcpSlack : 1))
          if (!check(from_bits((e << 23) | s), d, ulps_from(r, o))) return;
    }
    // The device's helper as the host compiles it (the exact reciprocal).
    for (const float g : {g_lo, g_hi, 1.f, 0x1.fffffep0f})
      ASSERT_EQ(f32_bits(detail::div_rn_by_e4m3(g, d)), f32_bits(g / d)) << code;
  }
  EXPECT_EQ(live_scales, 126);
  EXPECT_GT(checked, int64_t(40) * (1 << 23));
}

// RN(k / amax) by live_row_factor, for each numerator the encoders use: 2688 (nvfp4's global factor
// g, encode8_nvfp4), 448 and 127 (the 8-bit rows' factor, encode8_row8bit). Live rows have
// 2^-100 <= amax <= FLT_MAX. Every significand of a divisor in [1, 2) with every starting
// reciprocal of the window (the result depends on these alone while every value stays normal),
// every significand of the extreme binades of amax, and 4096 of every binade between.
class LiveRowFactor : public ::testing::TestWithParam<float> {};

TEST_P(LiveRowFactor, MatchesDivisionForEveryLiveAmax) {
  const float k = GetParam();
  const float k_scaled = k * kLiveRowFactorScale;  // what live_row_factor divides
  ASSERT_EQ(k_scaled, k / 16384.f);
  int64_t checked = 0;
  auto check = [&](float amax, int o) {
    const float b = amax * kLiveRowFactorScale;
    const float got = detail::div_rn_refined(k_scaled, b, ulps_from(1.f / b, o));
    const float want = k / amax;
    if (f32_bits(got) != f32_bits(want)) {
      ADD_FAILURE() << std::hexfloat << "k " << k << " amax " << amax << " r0 offset " << o << ": "
                    << got << " vs " << want;
      return false;
    }
    ++checked;
    return true;
  };
  const uint32_t lo = 127u - 100u, hi = 254u;
  for (uint32_t e = lo; e <= hi; ++e) {
    const bool full = e == lo || e == 127u + 14u || e >= hi - 1;  // 2^14: divisor in [1, 2)
    for (uint32_t s = 0; s < 0x800000u; s += full ? 1u : 2047u)
      for (int o = -kRcpSlack - 1; o <= kRcpSlack + 1; ++o)
        if (!check(from_bits((e << 23) | s), o)) return;
  }
  for (const float amax : {0x1p-100f, 0x1.fffffep127f, 1.f, 3.f})
    ASSERT_EQ(f32_bits(live_row_factor(k, amax)), f32_bits(k / amax)) << amax;
  EXPECT_GT(checked, int64_t(20) * (1 << 23));
}

INSTANTIATE_TEST_SUITE_P(EncoderNumerators, LiveRowFactor,
                         ::testing::Values(kE4m3Max* kE2m1Max, kE4m3Max, kInt8Max));

TEST(NvfpGlobalFactor, IsTheLiveRowFactorOf2688) {
  for (const float amax : {0x1p-100f, 0x1.fffffep127f, 1.f, 3.f})
    EXPECT_EQ(f32_bits(nvfp4_global_factor(amax)), f32_bits(2688.f / amax)) << amax;
}

// ---------------------------------------------------------------------------------------------
// Round-to-nearest-even on every tie between adjacent positive finite values (and mirrored).

// Checks the midpoint of codes lo and lo+1 (values va < vb, both exact in fp32 along with the
// midpoint), and the floats just beside it. `enc` maps float to code.
template <typename Enc>
void check_tie(Enc enc, uint32_t lo, double va, double vb, uint32_t sign_bit) {
  const float mid = static_cast<float>((va + vb) / 2);
  ASSERT_EQ(static_cast<double>(mid), (va + vb) / 2);
  const uint32_t even = (lo & 1) ? lo + 1 : lo;
  for (int s = 0; s < 2; ++s) {
    const float m = s ? -mid : mid;
    const uint32_t sb = s ? sign_bit : 0;
    ASSERT_EQ(enc(m), even | sb) << "tie at " << m;
    ASSERT_EQ(enc(std::nextafter(m, s ? -INFINITY : INFINITY)), (lo + 1) | sb) << m;
    ASSERT_EQ(enc(std::nextafter(m, 0.f)), lo | sb) << m;
  }
}

TEST(E4m3, EveryTieGoesToEven) {
  auto enc = [](float x) { return static_cast<uint32_t>(f32_to_e4m3(x)); };
  for (uint32_t c = 0; c < 0x7e; ++c) check_tie(enc, c, ref_e4m3(c), ref_e4m3(c + 1), 0x80);
}

TEST(E4m3, SaturationSpecialsAndZero) {
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7e);  // would-be tie with 480
  EXPECT_EQ(f32_to_e4m3(479.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-NAN), 0xff);
  EXPECT_EQ(f32_to_e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: tie to even zero
  EXPECT_EQ(f32_to_e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(0x1p-149f), 0x00);                     // fp32 subnormal
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0x1p-6f, 0.f)), 0x08);  // rounds up into the normals
}

TEST(E2m1, EveryTieGoesToEven) {
  auto enc = [](float x) { return static_cast<uint32_t>(f32_to_e2m1(x)); };
  for (uint32_t c = 0; c < 7; ++c) check_tie(enc, c, ref_e2m1(c), ref_e2m1(c + 1), 0x8);
  // The brief's table, spelled out.
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const float want[7] = {0.f, 1.f, 1.f, 2.f, 2.f, 4.f, 4.f};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(ties[i])), want[i]);
}

TEST(E2m1, SaturationSpecialsAndZero) {
  EXPECT_EQ(f32_to_e2m1(6.f), 0x7);
  EXPECT_EQ(f32_to_e2m1(7.f), 0x7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 0x7);
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xf);
  EXPECT_EQ(f32_to_e2m1(NAN), 0x0);
  EXPECT_EQ(f32_to_e2m1(-NAN), 0x0);
  EXPECT_EQ(f32_to_e2m1(0.f), 0x0);
  EXPECT_EQ(f32_to_e2m1(-0.f), 0x8);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);
}

TEST(Fp16, EveryTieGoesToEven) {
  auto enc = [](float x) { return static_cast<uint32_t>(f32_to_f16(x)); };
  // All adjacent positive finite pairs: subnormal, normal and binade boundaries.
  for (uint32_t h = 0; h < 0x7bff; ++h) check_tie(enc, h, ref_f16(h), ref_f16(h + 1), 0x8000);
}

TEST(Fp16, OverflowSpecialsAndZero) {
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // tie between 65504 and 2^16 goes to the even 2^16
  EXPECT_EQ(f32_to_f16(-65520.f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // half the smallest subnormal: ties to zero
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0x1p-26f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-149f), 0x0000);
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);             // 1.5 subnormal ulps -> 2 (even)
  const uint16_t n = f32_to_f16(from_bits(0x7f800001));  // signalling NaN becomes quiet
  EXPECT_EQ(n & 0x7e00, 0x7e00);
  EXPECT_EQ(f32_to_f16(-NAN) & 0x8000, 0x8000);
}

TEST(Bf16, EveryTieGoesToEven) {
  auto enc = [](float x) { return static_cast<uint32_t>(f32_to_bf16(x)); };
  for (uint32_t b = 0; b < 0x7f7f; ++b) check_tie(enc, b, ref_bf16(b), ref_bf16(b + 1), 0x8000);
  // The tie above the largest finite value is the (even) Inf.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000)), 0x7f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001)) & 0x7fc0, 0x7fc0);  // quieted, still NaN
  EXPECT_EQ(f32_to_bf16(from_bits(0xff800001)) & 0x8000, 0x8000);
}

TEST(Int8, RoundsNearestEvenClampsAndZeroesNan) {
  for (int k = -130; k <= 130; ++k) {
    const float t = k + 0.5f;  // every tie
    const int even = (k % 2 == 0) ? k : k + 1;
    const int clamp = even > 127 ? 127 : (even < -127 ? -127 : even);
    EXPECT_EQ(f32_to_int8(t), clamp) << t;
    const float up = std::nextafter(t, INFINITY), dn = std::nextafter(t, -INFINITY);
    EXPECT_EQ(f32_to_int8(up), std::min(127, std::max(-127, k + 1))) << up;
    EXPECT_EQ(f32_to_int8(dn), std::min(127, std::max(-127, k))) << dn;
  }
  EXPECT_EQ(f32_to_int8(127.f), 127);
  EXPECT_EQ(f32_to_int8(-128.f), -127);  // -128 is never produced
  EXPECT_EQ(f32_to_int8(1e30f), 127);
  EXPECT_EQ(f32_to_int8(INFINITY), 127);
  EXPECT_EQ(f32_to_int8(-INFINITY), -127);
  EXPECT_EQ(f32_to_int8(NAN), 0);
  EXPECT_EQ(f32_to_int8(-0.f), 0);
  EXPECT_EQ(f32_to_int8(0x1p-149f), 0);
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((rng.uniform() - 0.5) * 300.0);
    const double r = std::nearbyint(static_cast<double>(x));  // default mode: nearest-even
    EXPECT_EQ(f32_to_int8(x), static_cast<int>(std::min(127.0, std::max(-127.0, r)))) << x;
  }
}

// ---------------------------------------------------------------------------------------------
// Stochastic rounding.

// Exact decomposition of |x| (finite, <= 65504) into the fp16 value below it and the fraction
// of an ulp above it, in double.
struct SrRef {
  double lo, ulp, frac;
};
SrRef sr_ref(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double ulp = (a < 0x1p-14) ? 0x1p-24 : std::ldexp(1.0, e - 11);
  const double lo = std::floor(a / ulp) * ulp;
  return {lo, ulp, (a - lo) / ulp};
}

// Values covering normal, subnormal and below-min-subnormal results, random fractions, plus
// hand-picked fractions that sit on or next to the random-bit grid.
std::vector<float> sr_inputs() {
  std::vector<float> xs = {1.0f,
                           1.0f + 0x1p-23f,
                           1.0f + 0x1p-11f,
                           1.0f + 0x1p-11f + 0x1p-23f,
                           1.5f + 0x1p-12f,
                           0x1p-14f,
                           0x1.fffffep-15f,
                           0x1p-24f,
                           0x1p-25f,
                           0x1.8p-25f,
                           0x1p-30f,
                           0x1p-40f,
                           0x1p-149f,
                           65504.f,
                           65503.f,
                           3.14159f,
                           -2.71828f,
                           0x1.0000fep-20f,
                           0x1.7ffffep-24f};
  Rng rng(11);
  for (int i = 0; i < 300; ++i) xs.push_back(rng.log_uniform(-15, 16));   // normal results
  for (int i = 0; i < 150; ++i) xs.push_back(rng.log_uniform(-24, -14));  // subnormal results
  for (int i = 0; i < 50; ++i) xs.push_back(rng.log_uniform(-45, -24));   // below min subnormal
  return xs;
}

// For every one of the 2^r random values, the result is one of the two neighbours, and exactly
// floor(frac * 2^r + 1/2) of them round up (the half-LSB rule).
TEST(StochasticRounding, ExhaustiveOverRandomBits) {
  for (int r : {1, 4, 7, 13}) {
    for (float x : sr_inputs()) {
      const SrRef ref = sr_ref(x);
      const double want_up = std::floor(ref.frac * std::ldexp(1.0, r) + 0.5);
      uint32_t ups = 0;
      for (uint32_t R = 0; R < (1u << r); ++R) {
        const uint32_t noise = 0xdead0000u << r;  // bits above r must be ignored
        bool sat = false;
        const uint16_t h = f32_to_f16_sr(x, R | noise, r, &sat);
        ASSERT_FALSE(sat);
        ASSERT_EQ((h & 0x8000) != 0, std::signbit(x));
        const double y = std::fabs(ref_f16(h));
        if (y == ref.lo + ref.ulp && ref.frac != 0) {
          ++ups;
        } else {
          ASSERT_EQ(y, ref.lo) << "x=" << x << " r=" << r << " R=" << R;
        }
      }
      ASSERT_EQ(ups, want_up) << "x=" << x << " r=" << r << " frac=" << ref.frac;
    }
  }
}

// Mean of many Philox-driven draws equals x within the 2^-(r+1) ulp bias bound plus 4 sigma.
TEST(StochasticRounding, MeanIsUnbiasedWithinBound) {
  constexpr int kDraws = 1 << 16;
  const double fracs[] = {0.0, 0.001, 0.1, 0.25, 0.3, 0.5, 0.61, 0.75, 0.9, 0.999};
  const double bases[] = {1.0, 1000.0, 0x1p-14, 0x1p-20, 0x1p-27, 0x1p-33};  // fp16 lo values
  int checked = 0;
  for (int r : {1, 4, 7, 13}) {
    for (double base : bases) {
      const double ulp = sr_ref(static_cast<float>(base)).ulp;
      for (double f : fracs) {
        const float x = static_cast<float>(base + f * ulp);  // fp32 grid: frac may move slightly
        const SrRef ref = sr_ref(x);
        double sum = 0;
        int ups = 0;
        for (uint32_t i = 0; i < kDraws; ++i) {
          const U32x4 rnd = philox4x32(U32x4{{i, 0, 0, 0}}, U32x2{{2024u + r, 7u}});
          const double y = ref_f16(f32_to_f16_sr(x, rnd.v[0], r));
          sum += y;
          ups += (y > ref.lo);
        }
        const double mean = sum / kDraws;
        const double p = std::floor(ref.frac * std::ldexp(1.0, r) + 0.5) / std::ldexp(1.0, r);
        const double sigma = ref.ulp * std::sqrt(p * (1 - p) / kDraws);
        const double bound = std::ldexp(ref.ulp, -(r + 1)) + 4 * sigma + 1e-12 * ref.ulp;
        EXPECT_NEAR(mean, static_cast<double>(x), bound) << "x=" << x << " r=" << r;
        const double p_up = static_cast<double>(ups) / kDraws;
        EXPECT_NEAR(p_up, ref.frac, std::ldexp(1.0, -(r + 1)) + 4 * sigma / ref.ulp + 1e-12)
            << "x=" << x << " r=" << r;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 6 * 10);
}

// fp32 -> fp16 bits, truncating toward zero and saturating at +-65504 (Inf included), as
// cvt.rz.satfinite does for non-NaN input.
uint16_t f16_truncate_saturate(float v) {
  const uint32_t u = f32_bits(v);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x477fe000u) return sign | 0x7bffu;  // >= 65504
  if (a >= 0x38800000u) return static_cast<uint16_t>(sign | ((a >> 13) - (112u << 10)));  // normal
  return static_cast<uint16_t>(sign |
                               static_cast<uint32_t>(std::fabs(v) * 0x1p24f));  // exact scale
}

// The CUDA flush's floating-point short form (formats.h f16_sr_ulp) on the host. The caller has
// set FE_TOWARDZERO for the addition; the FMA is exact in any mode.
uint16_t f16_sr_float_form(float x, uint32_t random, int r) {
  const float ulp = f16_sr_ulp(x);
  volatile float vx = x;
  volatile float va = std::copysign(std::fma(ulp, f16_sr_fraction(random, r), -ulp), x);
  return f16_truncate_saturate(vx + va);
}

// Rounds toward zero while it lives, then restores the rounding mode it found.
struct RoundTowardZero {
  const int before = std::fegetround();
  RoundTowardZero() { std::fesetround(FE_TOWARDZERO); }
  ~RoundTowardZero() { std::fesetround(before); }
};

// The short form of the CUDA flush's encoders (r <= 12, no NaN; f16_sr_ulp, in floating point)
// gives the reference's bits (test_device_codecs runs the device's own over the same grid). Every
// fp32 magnitude class that matters is covered: each exponent from fp32 subnormals to above
// fp16's range with every 13-bit discarded field (the bits the rounding reads), plus strided
// sweeps of the full magnitude range, each against several random words and every r.
TEST(StochasticRounding, ShortFormMatchesReference) {
  Rng rng(29);
  uint64_t checked = 0;
  const RoundTowardZero toward_zero;
  ASSERT_EQ(std::fegetround(), FE_TOWARDZERO);
  auto check = [&](uint32_t a, uint32_t random) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = bits_f32(a | sign);
      for (int r = 1; r <= 12; ++r) {
        const uint16_t want = f32_to_f16_sr(x, random, r);
        const uint16_t got = f16_sr_float_form(x, random, r);
        ASSERT_EQ(got, want) << "x bits " << std::hex << (a | sign) << " random " << random
                             << std::dec << " r " << r;
        ++checked;
      }
    }
  };
  for (uint32_t e = 0; e <= 0x90; ++e)  // 2^-127 (subnormal fp32) .. 2^17, Inf excluded
    for (uint32_t field = 0; field < (1u << 13); field += 1 + (e % 3)) {
      const uint32_t high = rng.next() & 0x7fe000u;  // random upper mantissa bits
      check((e << 23) | high | field, rng.next());
    }
  for (uint32_t a = 0; a < 0x7f800000u; a += 0x3fffdu) check(a, rng.next());
  check(0x7f800000u, rng.next());  // Inf saturates
  // Subnormal results whose exact |x| + A falls just short of a multiple of 2^-24 (A = (R + 1/2)
  // 2^-r 2^-24, k 2^-24 - A exact): the sum's own fp32 grid is finer than |x|'s only here, and an
  // addition that rounded to nearest instead of toward zero would carry into the next fp16 value.
  for (int r = 1; r <= 12; ++r)
    for (uint32_t R : {0u, 1u, (1u << r) - 1u, uint32_t(rng.next()) & ((1u << r) - 1u)})
      for (uint32_t k : {1u, 2u, 3u, 1023u, 1024u}) {
        const float target = float(k) * 0x1p-24f - std::ldexp(2.f * float(R) + 1.f, -r - 25);
        for (uint32_t below = 1; below <= 3; ++below) check(f32_bits(target) - below, R);
      }
  for (uint32_t R = 0; R < 4096; ++R) {  // every random value at the edges of each range
    for (uint32_t a : {0x00000000u, 0x00000001u, 0x33000000u, 0x337fffffu, 0x387fffffu, 0x38800000u,
                       0x38801fffu, 0x477fe000u, 0x477fe001u, 0x477fffffu})
      check(a, R);
  }
  EXPECT_GT(checked, 10'000'000u);
}

TEST(StochasticRounding, DeterministicAndSignSymmetric) {
  const std::vector<float> xs = sr_inputs();
  std::vector<uint16_t> a, b, c;
  for (size_t i = 0; i < xs.size(); ++i) {
    const U32x2 key{{99, 3}};
    const U32x4 ctr{{static_cast<uint32_t>(i), 5, 6, 0}};
    const uint32_t r1 = philox4x32(ctr, key).v[0];
    const uint32_t r2 = philox4x32(ctr, key).v[0];
    a.push_back(f32_to_f16_sr(xs[i], r1, 7));
    b.push_back(f32_to_f16_sr(xs[i], r2, 7));
    c.push_back(
        f32_to_f16_sr(xs[i], philox4x32(U32x4{{static_cast<uint32_t>(i), 5, 7, 0}}, key).v[0], 7));
    for (int r : {1, 4, 7, 13}) {
      EXPECT_EQ(f32_to_f16_sr(-xs[i], r1, r), f32_to_f16_sr(xs[i], r1, r) ^ 0x8000) << xs[i];
    }
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);  // another counter gives other bits (the inputs have non-zero fractions)
}

TEST(StochasticRounding, SaturationNanAndExactValues) {
  bool sat = false;
  EXPECT_EQ(f32_to_f16_sr(65504.f, 0xffffffffu, 13, &sat), 0x7bff);
  EXPECT_FALSE(sat);
  EXPECT_EQ(f32_to_f16_sr(std::nextafter(65504.f, INFINITY), 0, 7, &sat), 0x7bff);
  EXPECT_TRUE(sat);
  sat = false;
  EXPECT_EQ(f32_to_f16_sr(-1e9f, 0, 7, &sat), 0xfbff);
  EXPECT_TRUE(sat);
  EXPECT_EQ(f32_to_f16_sr(1.f, 0, 7, &sat), 0x3c00);
  EXPECT_TRUE(sat);  // never cleared by the function
  sat = false;
  EXPECT_EQ(f32_to_f16_sr(INFINITY, 0, 7, &sat), 0x7bff);
  EXPECT_TRUE(sat);
  sat = false;
  EXPECT_EQ(f32_to_f16_sr(-INFINITY, 0, 7, &sat), 0xfbff);
  EXPECT_TRUE(sat);
  EXPECT_EQ(f32_to_f16_sr(1e9f, 0, 7), 0x7bff);  // null flag pointer is fine
  sat = false;
  const uint16_t n = f32_to_f16_sr(NAN, 0x1234, 7, &sat);
  EXPECT_TRUE(std::isnan(ref_f16(n)));
  EXPECT_EQ(n & 0x8000, 0);
  EXPECT_TRUE(std::isnan(ref_f16(f32_to_f16_sr(-NAN, 0, 7))));
  EXPECT_EQ(f32_to_f16_sr(-NAN, 0, 7) & 0x8000, 0x8000);
  EXPECT_FALSE(sat);
  // Exactly representable values never move, whatever the random bits.
  for (uint32_t R : {0u, 1u, 0x7fu, 0x1fffu, 0xffffffffu}) {
    EXPECT_EQ(f32_to_f16_sr(0.f, R, 13), 0x0000);
    EXPECT_EQ(f32_to_f16_sr(-0.f, R, 13), 0x8000);
    EXPECT_EQ(f32_to_f16_sr(0x1p-24f, R, 13), 0x0001);
    EXPECT_EQ(f32_to_f16_sr(-1.5f, R, 1), 0xbe00);
  }
  // Below the smallest subnormal: 0 or 2^-24. 2^-25 is half an ulp: with r = 1, R = 1 rounds up
  // (1/2 + 1/2 + 1/4 >= 1), R = 0 down (1/2 + 0 + 1/4 < 1).
  EXPECT_EQ(f32_to_f16_sr(0x1p-25f, 1, 1), 0x0001);
  EXPECT_EQ(f32_to_f16_sr(0x1p-25f, 0, 1), 0x0000);
}

// ---------------------------------------------------------------------------------------------
// Row-scaled codecs.

std::vector<float> random_row(Rng& rng, int n, int lo_exp, int hi_exp) {
  std::vector<float> row(n);
  for (float& v : row) v = rng.log_uniform(lo_exp, hi_exp);
  return row;
}

double max_abs(const std::vector<float>& v, int begin, int end) {
  double m = 0;
  for (int i = begin; i < end; ++i) m = std::max(m, std::fabs(static_cast<double>(v[i])));
  return m;
}

// Bound: with y = |x| * 448 / amax, the e4m3 code is within half a step of y: 2^-4 * y for
// normal codes (3 mantissa bits), 2^-10 for subnormal ones; back in x units that is multiplied
// by amax / 448. A relative 1e-6 covers the fp32 roundings of inv, the product and the decode.
// The fp16 window of the tensor-core readout (formats.h fp16_window_shift): for a largest
// magnitude amax of every bf16 exponent, every finite bf16 value v with |v| <= amax is exact in
// fp16 at the scale 2^s when |v| >= 2^-31 amax, and otherwise off by at most 2^-25 (scaled).
TEST(Fp16Window, HoldsBf16ValuesExactlyDownTo2PowMinus31OfTheLargest) {
  size_t exact = 0, rounded = 0;
  for (int e = -133; e <= 127; ++e) {
    for (uint32_t mant : {0x00u, 0x35u, 0x7fu}) {  // amax = (1 + mant / 128) * 2^e
      const float amax = e >= -126 ? bits_f32((uint32_t(127 + e) << 23) | (mant << 16))
                                   : std::ldexp(float(0x80 | mant) / 128.f, e);
      if (amax == 0.f) continue;
      const int s = fp16_window_shift(amax);
      ASSERT_GE(s, -126);
      ASSERT_LE(s, 126);
      const float top = amax * pow2_f32(s);
      ASSERT_LT(top, 32768.f) << "amax " << amax;
      if (s < 126) {  // else clamped: lower, which only adds room
        ASSERT_GE(top, 16384.f) << "amax " << amax;
      }
      for (uint32_t bits = 0; bits < 0x7f80u; ++bits) {  // every finite positive bf16 (and 0)
        const float v = bf16_to_f32(uint16_t(bits));
        if (v > amax) break;                             // the patterns are ordered by magnitude
        const double scaled = std::ldexp(double(v), s);  // exact in double
        const float h = f16_to_f32(f32_to_f16(v * pow2_f32(s)));  // as the kernel forms it
        if (v >= std::ldexp(amax, -31)) {
          ASSERT_EQ(double(h), scaled) << "amax " << amax << " v " << v;
          ++exact;
        } else {  // includes values whose fp32 product underflows
          ASSERT_LE(std::fabs(double(h) - scaled), std::ldexp(1.0, -25))
              << "amax " << amax << " v " << v;
          ++rounded;
        }
      }
    }
  }
  EXPECT_GT(exact, 1000000u);
  EXPECT_GT(rounded, 100000u);  // the rounded branch was exercised
}

TEST(RowE4m3, RoundTripErrorWithinHalfStep) {
  Rng rng(21);
  double worst_ratio = 0;
  for (int n = 16; n <= 256; n += 16) {
    for (int rep = 0; rep < 8; ++rep) {
      const int e0 = static_cast<int>(rng.next() % 40) - 20;
      const std::vector<float> row = random_row(rng, n, e0 - 12, e0);
      std::vector<uint8_t> codes(n, 0xaa);
      std::vector<float> out(n);
      const float scale = encode_row_e4m3(row.data(), n, codes.data());
      const double amax = max_abs(row, 0, n);
      EXPECT_NEAR(scale, amax / 448, amax / 448 * 1e-7);
      decode_row_e4m3(codes.data(), scale, n, out.data());
      for (int i = 0; i < n; ++i) {
        const double x = row[i], y = std::fabs(x) * 448 / amax;
        const double half = std::max(y * 0x1p-4, 0x1p-10) * amax / 448;
        const double err = std::fabs(out[i] - x);
        ASSERT_LE(err, half * (1 + 1e-6) + std::fabs(x) * 1e-6) << "n=" << n << " i=" << i;
        ASSERT_EQ(std::signbit(out[i]), std::signbit(row[i]));
        worst_ratio = std::max(worst_ratio, err / half);
      }
    }
  }
  EXPECT_GT(worst_ratio, 0.5);  // the bound is not vacuous: errors come close to it
}

TEST(RowInt8, RoundTripErrorWithinHalfStep) {
  Rng rng(22);
  double worst_ratio = 0;
  for (int n = 16; n <= 256; n += 16) {
    for (int rep = 0; rep < 8; ++rep) {
      const int e0 = static_cast<int>(rng.next() % 40) - 20;
      const std::vector<float> row = random_row(rng, n, e0 - 8, e0);
      std::vector<int8_t> codes(n, 99);
      std::vector<float> out(n);
      const float scale = encode_row_int8(row.data(), n, codes.data());
      const double amax = max_abs(row, 0, n);
      EXPECT_NEAR(scale, amax / 127, amax / 127 * 1e-7);
      decode_row_int8(codes.data(), scale, n, out.data());
      const double half = 0.5 * amax / 127;  // half an integer step, in x units
      for (int i = 0; i < n; ++i) {
        const double err = std::fabs(out[i] - static_cast<double>(row[i]));
        ASSERT_LE(err, half * (1 + 1e-6) + std::fabs(row[i]) * 1e-6);
        ASSERT_GE(codes[i], -127);
        worst_ratio = std::max(worst_ratio, err / half);
      }
    }
  }
  EXPECT_GT(worst_ratio, 0.9);
}

TEST(RowCodecs, ZeroTinyNanAndInfRows) {
  const int n = 32;
  std::vector<float> zero(n, 0.f);
  zero[3] = -0.f;
  std::vector<uint8_t> c8(n, 0xaa), packed(n / 2, 0xaa), bs(n / 16, 0xaa);
  std::vector<int8_t> i8(n, 99);
  EXPECT_EQ(encode_row_e4m3(zero.data(), n, c8.data()), 0.f);
  EXPECT_EQ(encode_row_int8(zero.data(), n, i8.data()), 0.f);
  EXPECT_EQ(encode_row_nvfp4(zero.data(), n, packed.data(), bs.data()), 0.f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(c8[i], 0);
  for (int i = 0; i < n; ++i) EXPECT_EQ(i8[i], 0);
  for (uint8_t p : packed) EXPECT_EQ(p, 0);
  for (uint8_t b : bs) EXPECT_EQ(b, 0);
  std::vector<float> out(n, 1.f);
  decode_row_e4m3(c8.data(), 0.f, n, out.data());
  for (float v : out) EXPECT_EQ(v, 0.f);

  // Below kMinRowAmax a row is stored as zero (keeps 448/amax finite).
  std::vector<float> tiny(n, 0x1p-110f);
  tiny[0] = 0.f;
  c8.assign(n, 0xaa);
  EXPECT_EQ(encode_row_e4m3(tiny.data(), n, c8.data()), 0.f);
  for (uint8_t c : c8) EXPECT_EQ(c, 0);
  std::vector<float> small(n, 0x1p-99f);
  small[0] = 0.f;
  EXPECT_GT(encode_row_e4m3(small.data(), n, c8.data()), 0.f);
  EXPECT_EQ(c8[0], 0);  // a zero element stays zero (no 0 * Inf)
  EXPECT_EQ(c8[1], 0x7e);

  // Non-finite input is visible in the returned scale.
  std::vector<float> bad(n, 1.f);
  bad[5] = NAN;
  EXPECT_TRUE(std::isnan(encode_row_e4m3(bad.data(), n, c8.data())));
  EXPECT_TRUE(std::isnan(encode_row_int8(bad.data(), n, i8.data())));
  EXPECT_TRUE(std::isnan(encode_row_nvfp4(bad.data(), n, packed.data(), bs.data())));
  bad[5] = INFINITY;
  EXPECT_TRUE(std::isinf(encode_row_e4m3(bad.data(), n, c8.data())));
  EXPECT_TRUE(std::isinf(encode_row_int8(bad.data(), n, i8.data())));
  EXPECT_TRUE(std::isinf(encode_row_nvfp4(bad.data(), n, packed.data(), bs.data())));
}

// Half a step of e2m1 around y (steps 0.5 up to 2, 1 up to 4, 2 up to 6); past 6 the code
// saturates and the error is y - 6.
double e2m1_half_step(double y) {
  const double half = y <= 2 ? 0.25 : (y <= 4 ? 0.5 : 1.0);
  return std::max(half, y - 6);
}

// Bound: per block the decoded scale d = e4m3(bs) and y = |x| * g / d with g = 2688 / amax;
// |decoded - x| <= halfstep(y) * d * row_scale (relative 1e-5 slack for the fp32 roundings).
// With a normal block scale (d >= 2^-6) the e4m3 rounding of the scale is within 2^-4, so
// y <= 6 * (1 + 2^-4) and no element is off by more than one e2m1 unit of d * row_scale.
TEST(RowNvfp4, RoundTripErrorWithinHalfStep) {
  Rng rng(23);
  int normal_blocks = 0;
  for (int n = 16; n <= 256; n += 16) {
    for (int rep = 0; rep < 8; ++rep) {
      const int e0 = static_cast<int>(rng.next() % 40) - 20;
      std::vector<float> row = random_row(rng, n, e0 - 6, e0);
      // Give blocks different magnitudes so block scales spread over the e4m3 range.
      for (int b = 0; b < n / 16; ++b) {
        const float f = std::ldexp(1.f, -static_cast<int>(rng.next() % 12));
        for (int j = 0; j < 16; ++j) row[16 * b + j] *= f;
      }
      std::vector<uint8_t> packed(n / 2), bs(n / 16);
      std::vector<float> out(n);
      const float row_scale = encode_row_nvfp4(row.data(), n, packed.data(), bs.data());
      const double amax = max_abs(row, 0, n);
      EXPECT_NEAR(row_scale, amax / 2688, amax / 2688 * 1e-7);
      decode_row_nvfp4(packed.data(), bs.data(), row_scale, n, out.data());
      const double g = 2688 / amax;
      for (int b = 0; b < n / 16; ++b) {
        const double d = e4m3_to_f32(bs[b]);
        // The block scale is the nearest e4m3 value of bamax / 6 * g.
        const double s = max_abs(row, 16 * b, 16 * b + 16) / 6 * g;
        EXPECT_LE(std::fabs(d - s), std::max(s * 0x1p-4, 0x1p-10) * (1 + 1e-5) + s * 1e-6);
        if (d >= 0x1p-6) ++normal_blocks;
        for (int i = 16 * b; i < 16 * b + 16; ++i) {
          const double x = row[i];
          const double err = std::fabs(out[i] - x);
          if (d == 0) {
            ASSERT_EQ(out[i], 0.f);
            continue;
          }
          const double y = std::fabs(x) * g / d;
          ASSERT_LE(err, e2m1_half_step(y) * d * row_scale * (1 + 1e-5) + std::fabs(x) * 1e-6)
              << "n=" << n << " i=" << i;
          if (d >= 0x1p-6) {
            ASSERT_LE(err, 1.0 * d * row_scale * (1 + 1e-5));
          }
        }
      }
    }
  }
  EXPECT_GT(normal_blocks, 100);
}

TEST(RowNvfp4, PackingAndExactValues) {
  // amax 6 gives g = 448; a block with amax 6 has scale 448 (code 0x7e) and factor k = 1, so
  // each element's code is e2m1 of the element itself.
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  std::vector<float> row(32);
  for (int i = 0; i < 16; ++i) row[i] = (i & 8) ? -mags[i & 7] : mags[i & 7];
  for (int i = 16; i < 32; ++i) row[i] = mags[(i * 5) & 7] * 0.5f;  // block amax 3
  row[17] = 3.f;
  std::vector<uint8_t> packed(16), bs(2);
  const float rs = encode_row_nvfp4(row.data(), 32, packed.data(), bs.data());
  EXPECT_EQ(rs, 6.f / 2688.f);
  EXPECT_EQ(bs[0], 0x7e);
  EXPECT_EQ(e4m3_to_f32(bs[1]), 224.f);  // 3 / 6 * 448
  for (int j = 0; j < 8; ++j) {
    // even element in the low nibble
    EXPECT_EQ(packed[j], (2 * j) | ((2 * j + 1) << 4)) << j;
  }
  std::vector<float> out(32);
  decode_row_nvfp4(packed.data(), bs.data(), rs, 32, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(out[i], row[i], 1e-6) << i;
  // Block 1: k = 448 / 224 = 2, so each element maps to the code of twice its value.
  for (int j = 8; j < 16; ++j) {
    EXPECT_EQ(packed[j] & 0xf, f32_to_e2m1(row[2 * j] * 2.f)) << j;
    EXPECT_EQ(packed[j] >> 4, f32_to_e2m1(row[2 * j + 1] * 2.f)) << j;
  }
}

TEST(RowNvfp4, ZeroBlockAndUnderflowingBlockDecodeToZero) {
  std::vector<float> row(64);
  for (int i = 0; i < 16; ++i) row[i] = 1e6f * (1 + i / 16.f);  // huge block
  for (int i = 16; i < 32; ++i) row[i] = 0.f;                   // zero block
  for (int i = 32; i < 48; ++i) row[i] = 1e-3f * (i % 3 - 1);   // scale 1e-3/6*2688/2e6 << 2^-10
  for (int i = 48; i < 64; ++i) row[i] = 5e3f;                  // scale 5e3/6*2688/2e6 ~ 1.1
  std::vector<uint8_t> packed(32, 0xaa), bs(4, 0xaa);
  const float rs = encode_row_nvfp4(row.data(), 64, packed.data(), bs.data());
  EXPECT_GT(rs, 0.f);
  EXPECT_EQ(bs[1], 0);
  EXPECT_EQ(bs[2], 0);
  EXPECT_NE(bs[3], 0);
  for (int j = 8; j < 24; ++j) EXPECT_EQ(packed[j], 0) << j;
  std::vector<float> out(64, 1.f);
  decode_row_nvfp4(packed.data(), bs.data(), rs, 64, out.data());
  for (int i = 16; i < 48; ++i) EXPECT_EQ(out[i], 0.f) << i;
  for (int i = 48; i < 64; ++i) EXPECT_NEAR(out[i], 5e3, 5e3 * 0.2) << i;
  // A block just above the underflow threshold keeps a subnormal scale and decodes non-zero.
  for (int i = 32; i < 48; ++i) row[i] = 2e6f * 6 / 2688 * 0x1p-9f;  // scale exactly 2^-9
  row[0] = 2e6f;
  encode_row_nvfp4(row.data(), 64, packed.data(), bs.data());
  EXPECT_EQ(bs[2], 0x01);
}

}  // namespace
}  // namespace replayssm
