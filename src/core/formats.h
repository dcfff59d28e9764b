// Numeric formats of the checkpoints (SPEC sections 5 and 6): scalar conversions between fp32 and
// bf16 / fp16 / fp8 e4m3 / int8 / fp4 e2m1, stochastic rounding to fp16, and the row-scaled codecs.
//
// Every function here is compiled for both the CPU reference and the CUDA kernels, and the two
// must produce identical bits. Hence: all rounding decisions are made on integer bit patterns,
// the few float operations are written out one per statement in a fixed order and go through
// mul_rn/div_rn (round-to-nearest on both sides, never contracted into an FMA), and no library
// call is used that exists on only one side. See docs/formats.md for the rules in prose.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace replayssm {

// ---------------------------------------------------------------------------------------------
// Bit casts and exactly rounded float arithmetic shared by host and device.

RSSM_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

RSSM_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  __builtin_memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

namespace detail {

// IEEE round-to-nearest product / sum / quotient. The device intrinsics pin the rounding even under
// --use_fast_math and forbid FMA contraction, so the kernel matches the host bit for bit.
RSSM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

RSSM_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// a b + c rounded once (an FMA on both sides).
RSSM_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

RSSM_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// a / y for a divisor y known in advance, from r = RN(1 / y): the product q = RN(a r) is within an
// ulp of a / y, its remainder a - q y is exact in one FMA, and a second FMA rounds q + remainder
// x r. Three instructions on the device against div_rn's ten and its slow-path check. It equals
// div_rn(a, y) for every finite a >= 0 whose quotient is a normal number for the divisors the
// encoders use, 6, 127, 448 and 2688 (test_formats: every significand of five binades, 4096 of
// every other; a run over every float found differences only where the quotient is subnormal,
// and none for 127): callers state why their operands qualify.
RSSM_HD float div_rn_by(float a, float y, float r) {
  const float q = mul_rn(a, r);
  return fma_rn(fma_rn(-q, y, a), r, q);
}

// An approximation of 1 / y for a normal y with a normal reciprocal: the device's MUFU.RCP
// (rcp.approx.ftz.f32, at most 1 ulp from 1 / y by the PTX ISA), one instruction; RN(1 / y) on
// the host. Its callers round their results correctly from any value within 2 ulps of RN(1 / y)
// (test_formats tries each such value), so host and device give the same bits.
RSSM_HD float rcp_approx(float y) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
#else
  return 1.f / y;
#endif
}

// a / y rounded to nearest for a y whose significand has at most 4 bits (an e4m3 value's), from
// any r with |r y - 1| < 2^-16: div_rn_by's product, exact remainder and correction. The
// remainder a - q y is a multiple of ulp(q) x ulp(y) below 15 k of them for q within k ulps, so
// it is exact; a / y lies at least ulp(q) / 30 from a rounding midpoint (a - M y is a nonzero
// multiple of ulp(q) ulp(y) / 2 for a midpoint M), and the corrected sum is off by
// |a / y - q| |r y - 1| < ulp(q) / 60 of it, so it rounds as a / y does. It equals div_rn(a, y)
// wherever a, q and the quotient are normal (test_formats: every positive finite e4m3 y).
RSSM_HD float div_rn_by_e4m3(float a, float y) { return div_rn_by(a, y, rcp_approx(y)); }

// a / b rounded to nearest from an approximation r0 of 1 / b: one Newton step refines r0, then
// div_rn_by's product, remainder and correction (__fdiv_rn's fast path without its operand
// range check and slow path). Equals div_rn(a, b) for every r0 within 3 ulps of RN(1 / b)
// where every intermediate is normal, for the a of nvfp4_global_factor (test_formats: every
// significand of b).
RSSM_HD float div_rn_refined(float a, float b, float r0) {
  return div_rn_by(a, b, fma_rn(r0, fma_rn(-b, r0, 1.f), r0));
}

RSSM_HD float abs_f32(float x) { return bits_f32(f32_bits(x) & 0x7fffffffu); }

// min(|x|, c), IEEE minNum (c for NaN x) on both sides: one FMNMX with the |.| modifier on the
// device.
RSSM_HD float min_abs(float x, float c) {
#if defined(__CUDA_ARCH__)
  return fminf(fabsf(x), c);
#else
  return __builtin_fminf(__builtin_fabsf(x), c);
#endif
}

RSSM_HD bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// Magnitude `mant * 2^-shift` rounded to an integer, nearest-even. `mant` < 2^24, shift >= 1.
// Used for every result that lands in the subnormal range of the narrow format, where the
// discarded field is wider than the normal case.
RSSM_HD uint32_t rne_shift(uint32_t mant, int shift) {
  if (shift > 24) return 0;  // mant * 2^-shift < 2^24 * 2^-25 = 1/2: rounds to zero
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// fp32 magnitude bits `a` (finite, sign cleared) as (mantissa with implicit bit, exponent) such
// that value = mant * 2^(e - 150); fp32 subnormals use e = 1 without the implicit bit.
RSSM_HD uint32_t f32_mant(uint32_t a) { return (a >> 23) ? ((a & 0x7fffffu) | 0x800000u) : a; }
RSSM_HD int f32_exp(uint32_t a) { return (a >> 23) ? static_cast<int>(a >> 23) : 1; }

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// bf16: fp32 with the low 16 bits dropped.

// Round-to-nearest-even; overflow rounds to Inf as IEEE does; NaN keeps sign and top payload
// bits with the quiet bit set.
RSSM_HD uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if (detail::is_nan_bits(u)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the result's lsb carries into bit 16 exactly when the discarded half is
  // above the midpoint, or at it with an odd result; a carry out of the mantissa bumps the
  // exponent, which is the correct rounded value (up to Inf).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

RSSM_HD float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

// ---------------------------------------------------------------------------------------------
// fp16 (IEEE binary16): 1 sign, 5 exponent (bias 15), 10 mantissa bits.

RSSM_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));  // Inf, NaN (payload kept)
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_f32(sign);
  // Subnormal m * 2^-24: normalise so the leading one becomes the implicit bit.
  int ex = 113;  // biased fp32 exponent of 2^-14 (the value if m had its leading one at bit 10)
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --ex;
  }
  return bits_f32(sign | (static_cast<uint32_t>(ex) << 23) | ((m & 0x3ffu) << 13));
}

// Round-to-nearest-even. |x| >= 65520 (the midpoint between 65504 and 2^16, which ties to the
// even 2^16) becomes Inf; NaN keeps sign and top payload bits with the quiet bit set.
RSSM_HD uint16_t f32_to_f16(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and above
  if (a >= 0x38800000u) {                                              // >= 2^-14: normal
    uint32_t h = (a >> 13) - (112u << 10);
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach the exponent
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal result m * 2^-24 with m = mant * 2^(e - 126); 2^-14 rounds up to 0x400 naturally.
  const int shift = 126 - detail::f32_exp(a);
  return static_cast<uint16_t>(sign | detail::rne_shift(detail::f32_mant(a), shift));
}

// Stochastic rounding to fp16 with r_bits (1..13) random bits, SPEC section 6.
//
// Let f in [0,1) be the magnitude's discarded fraction of one result ulp (the low 13 fp32 bits
// for normal results; a wider field for subnormal results, and the whole value for magnitudes
// below the smallest subnormal 2^-24, whose truncation is 0). With R = random & (2^r - 1) the
// half-LSB rule rounds up iff f + R/2^r + 1/2^(r+1) >= 1. Multiplying by 2^(r+1) gives
// t + 2R + 1 >= 2^(r+1) with t = floor(f * 2^(r+1)): the left side changes in steps of 2^-(r+1),
// so the discarded bits below the top r+1 cannot affect the outcome and the test is exact with
// one guard bit beyond the random bits (this also covers the 13-bit field with r = 13, where the
// half-LSB lies below the fp32 lsb). Of the 2^r values of R exactly floor(f*2^r + 1/2) round up,
// so the mean is within 2^-(r+1) ulp of x.
//
// |x| > 65504 (including Inf) saturates to +-65504 and sets *saturated (never cleared here); the
// flag depends only on x, not on the random bits. NaN gives a quiet NaN with the sign kept.
//
// Branch-free apart from the rare NaN/overflow case (the flush runs this for every element, and
// data-dependent branches between normal and subnormal results diverge within a warp): the
// significand is placed in the high word of 64 bits and shifted right by the field width w, so
// the high word is the truncated magnitude q and the low word the discarded field aligned to bit
// 31, whose top r+1 bits are t. w is 13 for normal results and 126 - exponent (>= 14) for
// subnormal ones, capped at 63 (the 24-bit significand is then shifted out entirely).
RSSM_HD uint16_t f32_to_f16_sr(float x, uint32_t random, int r_bits, bool* saturated = nullptr) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x477fe000u) {  // NaN, or above 65504 (Inf included)
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (saturated != nullptr) *saturated = true;
    return static_cast<uint16_t>(sign | 0x7bffu);
  }
  const bool normal = a >= 0x38800000u;  // |x| >= 2^-14
  const uint32_t significand = normal ? a : detail::f32_mant(a);
  const int sub_width = 126 - detail::f32_exp(a);
  const uint32_t width = normal ? 13u : static_cast<uint32_t>(sub_width < 63 ? sub_width : 63);
  const uint64_t shifted = (static_cast<uint64_t>(significand) << 32) >> width;
  // For normal results the high word is (a >> 13): fp16 bits once the exponent bias moves from
  // 127 to 15 (112 << 10).
  const uint32_t q = static_cast<uint32_t>(shifted >> 32) - (normal ? (112u << 10) : 0u);
  const uint32_t t = static_cast<uint32_t>(shifted) >> (31 - r_bits);  // top r+1 bits of the field
  const uint32_t rnd = random & ((1u << r_bits) - 1u);
  // Adds 0 or 1; a carry into the exponent is correct, and the result stays <= 0x7bff (|x| <=
  // 65504).
  return static_cast<uint16_t>(sign | (q + ((t + 2u * rnd + 1u) >> (r_bits + 1))));
}

inline constexpr int kSrFastMaxBits = 12;  // the largest r the short form below handles

// The short form in floating-point operations, as the CUDA flush runs it (replay_codec.cuh
// f16_sr_presum): x + sign(x) A added toward zero, then truncated to fp16 (saturating), where
//   A = (R + 1/2) 2^-r u,  u = f16_sr_ulp(x) = 2^(max(e, -14) - 10)
// (R: the r random bits, e: x's binade, u: the fp16 lsb there, 2^-24 for subnormal results), gives
// f32_to_f16_sr's bits for r <= 12 and every non-NaN x. Why: f32_to_f16_sr rounds |x| up exactly
// when the discarded fraction f of |x| / u satisfies f + (R + 1/2) 2^-r >= 1, so its magnitude is
// floor_u(|x| + A), the exact sum truncated to the grid u. A is an fp32 number (2R + 1 < 2^13,
// A >= 2^-37); the sum stays below 2^(E+1) + u (E = max(e, -14)), where the fp32 grid g is at most
// u 2^-12 and divides u, so the addition's own truncation to g leaves floor_u unchanged; and the
// fp16 truncation of a sum in [2^(E+1), 2^(E+1) + u) gives 2^(E+1), which is floor_u too. Above
// 65504 both saturate. A = u F - u exactly in one FMA, F = f16_sr_fraction(R, r) = 1 + (R + 1/2)
// 2^-r (r + 2 <= 14 significant bits). test_formats checks the form against f32_to_f16_sr.
RSSM_HD float f16_sr_ulp(float x) {
  const int32_t e =
      static_cast<int32_t>(f32_bits(x) & 0x7f800000u) - static_cast<int32_t>(10u << 23);
  return bits_f32(static_cast<uint32_t>(e > 0x33800000 ? e : 0x33800000));  // at least 2^-24
}
RSSM_HD float f16_sr_fraction(uint32_t random, int r_bits) {
  const uint32_t top = 1u << 23;
  const uint32_t mask = top - (top >> r_bits);  // bits [23 - r, 23): the r random bits
  // 1 and the half lsb as one constant of r, so that an element costs a shift and one LOP3
  const uint32_t one_and_half = 0x3f800000u + (top >> (r_bits + 1));
  return bits_f32(((random << (23 - r_bits)) & mask) | one_and_half);
}

// ---------------------------------------------------------------------------------------------
// fp8 e4m3 "fn" (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no Inf; S.1111.111 is NaN.
// Largest finite 448 = 1.75 * 2^8, smallest normal 2^-6, smallest subnormal 2^-9.

constexpr float kE4m3Max = 448.f, kInt8Max = 127.f, kE2m1Max = 6.f;
// RN(1 / y) of the encoders' constant divisors (detail::div_rn_by); 2688 = 448 x 6 is nvfp4's.
constexpr float kInvE4m3Max = 1.f / kE4m3Max, kInvInt8Max = 1.f / kInt8Max,
                kInvE2m1Max = 1.f / kE2m1Max, kInvNvfp4Global = 1.f / (kE4m3Max * kE2m1Max);

// Round-to-nearest-even; finite overflow and +-Inf saturate to +-448 (0x7e/0xfe); NaN -> 0x7f
// with the sign kept (0xff for negative NaN); -0 -> 0x80.
RSSM_HD uint8_t f32_to_e4m3(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  uint32_t c;
  if (a >= 0x3c800000u) {                                             // >= 2^-6: normal
    if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and Inf)
    c = (a >> 20) - (120u << 3);
    const uint32_t rem = a & 0xfffffu;
    // Below 448 the truncated code is at most 0x7d (416), so rounding up reaches at most 0x7e
    // and never the NaN pattern 0x7f.
    if (rem > 0x80000u || (rem == 0x80000u && (c & 1u))) ++c;
  } else {
    // Subnormal result m * 2^-9 with m = mant * 2^(e - 141); 2^-6 rounds up to 0x08 naturally.
    c = detail::rne_shift(detail::f32_mant(a), 141 - detail::f32_exp(a));
  }
  return static_cast<uint8_t>(sign | c);
}

RSSM_HD float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 7u;
  if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
  if (e != 0) return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
  // Subnormal m * 2^-9: exact as an fp32 product of two exactly representable factors.
  return bits_f32(sign | f32_bits(static_cast<float>(m) * 0.001953125f));
}

// ---------------------------------------------------------------------------------------------
// int8, symmetric: round-to-nearest-even, clamp to [-127, 127] (-128 unused), NaN -> 0.

RSSM_HD int8_t f32_to_int8(float x) {
  if (detail::is_nan_bits(f32_bits(x))) return 0;
  if (x >= 127.f) return 127;
  if (x <= -127.f) return -127;
#if defined(__CUDA_ARCH__)
  return static_cast<int8_t>(__float2int_rn(x));  // RNE, same result as the host path
#else
  // |x| < 127: adding 1.5 * 2^23 puts the sum in [2^23, 2^24) where the fp32 ulp is 1, so the
  // addition itself rounds x to the nearest integer, ties to even; the subtraction is exact.
  // (IEEE semantics forbid folding (x + c) - c; the build never uses -ffast-math.)
  constexpr float kMagic = 12582912.f;
  float t = x + kMagic;
  t = t - kMagic;
  return static_cast<int8_t>(t);
#endif
}

// ---------------------------------------------------------------------------------------------
// fp4 e2m1: code bit 3 = sign, bits 2..0 index the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}
// (2 exponent bits, bias 1, 1 mantissa bit; index 1 is the subnormal 0.5).

// Round-to-nearest-even: each tie goes to the even index (0.25->0, 0.75->1, 1.25->1, 1.75->2,
// 2.5->2, 3.5->4, 5->4); |x| > 5 and Inf saturate to 6; NaN -> 0 (code 0); zeros keep the sign.
//
// Without comparisons (the flush runs this for every element of the nvfp4 read checkpoint): the
// grid's step is 0.5 below 2 (index = magnitude / 0.5), 1 in [2, 4) (index = magnitude + 2) and 2
// in [4, 8) (index = magnitude / 2 + 4), i.e. 2^(e - 1) for the binade 2^e of the magnitude a,
// with binades below 1 taking 0.5. Adding M = 2^23 x step to a puts the sum in [M, 2M), where the
// fp32 ulp is that step, so the addition itself rounds a / step to an integer k, ties to even
// (an even k is an even index in every binade); k is the sum's bits minus M's. The index is k +
// 2 e (e = 0, 1, 2), capped at 7: a is first capped at 8 (Inf too), whose k + 2 e = 8 saturates.
namespace detail {
// f32_to_e2m1's rounding (f32_to_e2m1_scaled does the same at 2^-6 of the scale): magnitude bits
// `a` (finite, at most 8) plus M = 2^23 x the grid step of a's binade (biased exponent e, at least
// 2^0's), whose sum's rounding is the format's; returns the sum and sets `magic` to M's bits.
// 2^k x the grid step of magnitude bits a's binade (a has no sign bit, a <= 8's bits), as float
// bits: the step is 2^(e - 127 - 1), e = max(a's exponent, 127), so this is the exponent field of
// max(a, 1) plus k - 1. Formed as max(a + o, 1 + o) with the mantissa bits cleared, o = (k - 1)
// 2^23: adding a multiple of 2^23 commutes with clearing the low 23 bits and, without overflow,
// with the max. The sum and the max are one VIADDMNMX on the device: two integer operations
// instead of three.
RSSM_HD uint32_t e2m1_step_bits(uint32_t a, uint32_t k) {
  const uint32_t o = (k - 1u) << 23, s = a + o, floor = 0x3f800000u + o;
  return (s > floor ? s : floor) & 0xff800000u;
}
RSSM_HD float e2m1_grid_sum(uint32_t a, uint32_t& magic) {
  magic = e2m1_step_bits(a, 23);  // M = 2^23 x step
  return add_rn(bits_f32(a), bits_f32(magic));
}
}  // namespace detail

RSSM_HD uint8_t f32_to_e2m1(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 28) & 0x8u;
  const uint32_t a0 = u & 0x7fffffffu;
  const uint32_t a = a0 < 0x41000000u ? a0 : 0x41000000u;  // min(|x|, 8); NaN handled below
  uint32_t magic;
  const uint32_t k = f32_bits(detail::e2m1_grid_sum(a, magic)) - magic;
  const uint32_t e = (magic >> 23) - 22u;  // the binade's biased exponent
  const uint32_t index = k + 2u * (e - 127u);
  const uint32_t code = sign | (index < 7u ? index : 7u);
  return static_cast<uint8_t>(detail::is_nan_bits(u) ? 0u : code);
}

RSSM_HD float e2m1_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x8u) << 28;
  const uint32_t e = (code >> 1) & 3u;
  const uint32_t m = code & 1u;
  if (e == 0) return bits_f32(sign | (m ? 0x3f000000u : 0u));  // 0 or 0.5
  return bits_f32(sign | ((e + 126u) << 23) | (m << 22));      // (1 + m/2) * 2^(e-1)
}

// Four e2m1 codes as four e4m3 bytes whose values are exactly e2m1 x 2^-6, for decoders that
// convert e4m3 pairs in hardware (sm_89 and later): a code's magnitude bits (exponent e1 e0,
// mantissa m) become e4m3's exponent field 0 0 e1 e0 and mantissa m 0 0, its sign e4m3's sign.
// Normal codes then carry exponent e - 7 instead of e2m1's e - 1, and the subnormal 0.5 (e = 0,
// m = 1) lands on e4m3's subnormal 4 x 2^-9 = 0.5 x 2^-6; no code reaches e4m3's NaN pattern.
// `packed` holds 8 codes, column 2i in the low nibble of byte i and 2i + 1 in the high one: the
// _even form gives byte i = column 2i (columns 0, 2, 4, 6), the _odd form column 2i + 1.
RSSM_HD uint32_t e2m1x4_even_to_e4m3x4_scaled(uint32_t packed) {
  return ((packed << 2) & 0x1c1c1c1cu) | ((packed << 4) & 0x80808080u);
}
RSSM_HD uint32_t e2m1x4_odd_to_e4m3x4_scaled(uint32_t packed) {
  return ((packed >> 2) & 0x1c1c1c1cu) | (packed & 0x80808080u);
}
inline constexpr float kE2m1E4m3Unscale = 64.0f;  // 2^6: e4m3 value * this = e2m1 value

// The encoder's way back for converters that round to e4m3 in hardware (two per instruction on
// sm_89 and later): f32_to_e2m1's rounding of x, with |x| capped at 6 first (the same codes:
// f32_to_e2m1 saturates every magnitude above 5 to 6), returned as the value of the e4m3 byte
// that e2m1x4_even_to_e4m3x4_scaled makes of the code: the rounded magnitude times 2^-6, sign
// kept. Its e4m3 conversion is exact and e4m3x4_scaled_to_e2m1x4 takes the codes back out.
// x must not be NaN (f32_to_e2m1 maps NaN to code 0; this to 6 with x's sign).
RSSM_HD float f32_to_e2m1_scaled(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t a = f32_bits(detail::min_abs(x, 6.0f));  // min(|x|, 6): one FMNMX on the device
  // e2m1_grid_sum's rounding done at 2^-6 of the scale: a 2^-6 + M 2^-6 rounded in one FMA (the
  // product is exact inside it) is RN(a + M) 2^-6 since every value stays normal (M 2^-6 >= 2^16),
  // and subtracting M 2^-6 is exact (same binade), so r = (RN(a + M) - M) 2^-6 without forming M
  // itself: one integer operation fewer per element than adding M and scaling the difference.
  const uint32_t magic6 = detail::e2m1_step_bits(a, 17);  // M 2^-6 = 2^17 x step
  const float sum6 = detail::fma_rn(bits_f32(a), 0x1p-6f, bits_f32(magic6));
  const float r = detail::add_rn(sum6, -bits_f32(magic6));
  return bits_f32(f32_bits(r) | (u & 0x80000000u));
}
// Four e4m3 bytes (the values of f32_to_e2m1_scaled, element i in byte i) as four e2m1 codes,
// element i in the low nibble of byte i: the inverse of e2m1x4_even_to_e4m3x4_scaled.
RSSM_HD uint32_t e4m3x4_scaled_to_e2m1x4(uint32_t bytes) {
  return ((bytes >> 2) & 0x07070707u) | ((bytes >> 4) & 0x08080808u);
}
// Eight codes in the packed layout (element i in nibble i) from two words of
// e4m3x4_scaled_to_e2m1x4 (elements 0-3 and 4-7).
RSSM_HD uint32_t e2m1x4_pair_pack(uint32_t lo, uint32_t hi) {
  const uint32_t a = lo | (lo >> 4), b = hi | (hi >> 4);  // bytes 0 and 2: two codes each
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, 0x6420);
#else
  return (a & 0xffu) | ((a >> 8) & 0xff00u) | ((b & 0xffu) << 16) | ((b << 8) & 0xff000000u);
#endif
}

// 2^e as an fp32 number, for -126 <= e <= 127 (normal numbers only).
RSSM_HD float pow2_f32(int e) { return bits_f32(static_cast<uint32_t>(127 + e) << 23); }

// The tensor-core readout (cuda/verify_mma.cuh) holds the window's C, rounded to bf16, in
// fp16 at the scale 2^s, s = fp16_window_shift(amax), that puts the largest magnitude amax in
// [2^14, 2^15); s is clamped to [-126, 126] so that 2^s and 2^-s are normal fp32 numbers (a tiny
// amax then lands lower, which only adds room). Every bf16 value v with |v| >= 2^-31 amax is
// then exact in fp16 (its 8 significant bits stay at or above fp16's 2^-24 step), and a smaller
// one is rounded by at most 2^-25 in scaled units, 2^-39 of the largest (test_formats.cpp).
RSSM_HD int fp16_window_shift(float amax /* >= 0, finite */) {
  const int s = 141 - static_cast<int>(f32_bits(amax) >> 23);
  return s < -126 ? -126 : (s > 126 ? 126 : s);
}

// ---------------------------------------------------------------------------------------------
// Row-scaled codecs for one (head, headdim) row of n = dstate values.
//
// Common rules. amax = max |row[i]|, scanned in index order; a NaN element makes amax NaN (it is
// sticky), so a NaN row reports a NaN scale and an Inf row an Inf scale: the caller (the flush)
// checks the returned scale and reports; the codes are then deterministic but meaningless.
// Rows with amax < kMinRowAmax, zero rows included, are stored as zero rows (scale 0, codes 0):
// this keeps 448/amax, 2688/amax and the block factor g/bs finite, so a zero element can never
// become 0*Inf = NaN; such values are far below anything fp16 can hold.
constexpr float kMinRowAmax = 0x1p-100f;

namespace detail {
RSSM_HD float row_amax(const float* row /*[n]*/, int n) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) {
    const float a = abs_f32(row[i]);
    if (a > amax || a != a) amax = a;  // once NaN, no comparison is true: NaN stays
  }
  return amax;
}
RSSM_HD bool is_zero_row(float amax) { return amax < kMinRowAmax; }  // false for NaN
}  // namespace detail

// Float-op order: amax as above; scale = amax / 448 (rounded); inv = 448 / amax (rounded);
// codes[i] = f32_to_e4m3(row[i] * inv) (product rounded, then RNE/saturate). Returns scale.
RSSM_HD float encode_row_e4m3(const float* row /*[n]*/, int n, uint8_t* codes /*[n]*/) {
  const float amax = detail::row_amax(row, n);
  if (detail::is_zero_row(amax)) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.f;
  }
  const float inv = detail::div_rn(kE4m3Max, amax);
  for (int i = 0; i < n; ++i) codes[i] = f32_to_e4m3(detail::mul_rn(row[i], inv));
  return detail::div_rn(amax, kE4m3Max);
}

// out[i] = e4m3_to_f32(codes[i]) * scale (one rounding).
RSSM_HD void decode_row_e4m3(const uint8_t* codes /*[n]*/, float scale, int n, float* out /*[n]*/) {
  for (int i = 0; i < n; ++i) out[i] = detail::mul_rn(e4m3_to_f32(codes[i]), scale);
}

// Float-op order: scale = amax / 127; inv = 127 / amax; codes[i] = f32_to_int8(row[i] * inv).
RSSM_HD float encode_row_int8(const float* row /*[n]*/, int n, int8_t* codes /*[n]*/) {
  const float amax = detail::row_amax(row, n);
  if (detail::is_zero_row(amax)) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0.f;
  }
  const float inv = detail::div_rn(kInt8Max, amax);
  for (int i = 0; i < n; ++i) codes[i] = f32_to_int8(detail::mul_rn(row[i], inv));
  return detail::div_rn(amax, kInt8Max);
}

// out[i] = float(codes[i]) * scale (the conversion is exact, one rounding).
RSSM_HD void decode_row_int8(const int8_t* codes /*[n]*/, float scale, int n, float* out /*[n]*/) {
  for (int i = 0; i < n; ++i) out[i] = detail::mul_rn(static_cast<float>(codes[i]), scale);
}

// RN(k / amax) for a live row's amax (finite, at least 2^-100) and the encoders' numerators k =
// 127, 448 (the 8-bit rows' factor) and 2688 (nvfp4's global factor g), as the CUDA encoders
// compute it, without __fdiv_rn's range check and slow-path branch: both operands scaled by 2^-14
// (exact; for a constant k the compiler folds k's) so that 1 / (amax 2^-14) is normal up to the
// largest float, then div_rn_refined from rcp_approx. Every intermediate is normal over that range
// (the quotient is at least 127 / FLT_MAX > 2^-122 and the remainder scales with neither operand),
// so each result is a scaled copy of one for a divisor in [1, 2) (test_formats: every significand
// there, and every one of the extreme binades of amax, for each k).
inline constexpr float kLiveRowFactorScale = 0x1p-14f;
RSSM_HD float live_row_factor(float k, float amax) {
  const float b = detail::mul_rn(amax, kLiveRowFactorScale);
  return detail::div_rn_refined(k * kLiveRowFactorScale, b, detail::rcp_approx(b));
}
RSSM_HD float nvfp4_global_factor(float amax) { return live_row_factor(kE4m3Max * kE2m1Max, amax); }

// NVFP4 (n a multiple of 16). Float-op order:
//   g = 2688 / amax                       (2688 = 448 * 6; rounded)
//   per block b of 16: bamax = max |row| over the block (same scan rule as amax)
//     s = bamax / 6 ; s = s * g           (two roundings)  ; block_scales[b] = f32_to_e4m3(s)
//     d = e4m3_to_f32(block_scales[b])    (exact)
//     d > 0: k = g / d (rounded); code = f32_to_e2m1(row[i] * k) (product rounded)
//     d == 0 (the block scale underflowed e4m3): codes 0, so the block decodes to zero
//   returns amax / 2688 (rounded directly, not 1/g, to avoid a second rounding)
// Codes are packed two per byte, element 2j in the low nibble, 2j+1 in the high nibble.
RSSM_HD float encode_row_nvfp4(const float* row /*[n]*/, int n, uint8_t* packed /*[n/2]*/,
                               uint8_t* block_scales /*[n/16]*/) {
  const float amax = detail::row_amax(row, n);
  if (detail::is_zero_row(amax)) {
    for (int i = 0; i < n / 2; ++i) packed[i] = 0;
    for (int b = 0; b < n / 16; ++b) block_scales[b] = 0;
    return 0.f;
  }
  constexpr float kGlobal = kE4m3Max * kE2m1Max;  // 2688, exact
  const float g = detail::div_rn(kGlobal, amax);
  for (int b = 0; b < n / 16; ++b) {
    const float* blk = row + 16 * b;
    float s = detail::div_rn(detail::row_amax(blk, 16), kE2m1Max);
    s = detail::mul_rn(s, g);
    const uint8_t bs = f32_to_e4m3(s);
    block_scales[b] = bs;
    const float d = e4m3_to_f32(bs);
    const bool live = d > 0.f;  // false for 0 and for NaN (a NaN row)
    const float k = live ? detail::div_rn(g, d) : 0.f;
    for (int j = 0; j < 16; j += 2) {
      const uint8_t lo = live ? f32_to_e2m1(detail::mul_rn(blk[j], k)) : 0;
      const uint8_t hi = live ? f32_to_e2m1(detail::mul_rn(blk[j + 1], k)) : 0;
      packed[(16 * b + j) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
  return detail::div_rn(amax, kGlobal);
}

// out[i] = (e2m1(code_i) * e4m3(bs)) * row_scale: the first product is exact (2 x 4 significant
// bits), the second rounds once.
RSSM_HD void decode_row_nvfp4(const uint8_t* packed /*[n/2]*/,
                              const uint8_t* block_scales /*[n/16]*/, float row_scale, int n,
                              float* out /*[n]*/) {
  for (int i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t code = static_cast<uint8_t>((i & 1) ? (byte >> 4) : (byte & 0xfu));
    const float v = detail::mul_rn(e2m1_to_f32(code), e4m3_to_f32(block_scales[i / 16]));
    out[i] = detail::mul_rn(v, row_scale);
  }
}

}  // namespace replayssm
