// Checkpoint codecs of SPEC section 5 for one 8-element chunk of a row, as the replay kernels
// hold it: a row of N elements is spread over N/8 consecutive lanes. The per-element conversions
// are the ones of core/formats.h and the float operations follow the order documented there
// (row amax, inv = max / amax, code = convert(value * inv), scale = amax / max), so the codes are
// bit-identical to cache/checkpoint_codec.h's row functions given the same fp32 row. The row amax
// is a NaN-sticky max and therefore independent of the reduction order.
#pragma once

#include <cuda_fp8.h>

#include "cache/checkpoint_codec.h"
#include "cache/layout.h"
#include "cuda/cuda_common.cuh"

namespace replayssm::cuda {

// Byte offsets of one slot's sections (SlotLayout) and the row geometry.
struct SlotGeometry {
  uint8_t* storage;  // [num_slots, slot_bytes]
  size_t slot_bytes;
  size_t offset[SlotLayout::kSections];
  int N;  // dstate
};

struct SlotSections {
  void* rec;
  float* rec_scale;
  uint8_t* read;
  uint8_t* read_block_scale;
  float* read_scale;
  void* ring_x;
  void* ring_B;
  float* ring_delta;
};

__device__ __forceinline__ SlotSections slot_sections(const SlotGeometry& g, int slot) {
  uint8_t* base = g.storage + size_t(slot) * g.slot_bytes;
  SlotSections s;
  s.rec = base + g.offset[SlotLayout::rec];
  s.rec_scale = reinterpret_cast<float*>(base + g.offset[SlotLayout::rec_scale]);
  s.read = base + g.offset[SlotLayout::read];
  s.read_block_scale = base + g.offset[SlotLayout::read_block_scale];
  s.read_scale = reinterpret_cast<float*>(base + g.offset[SlotLayout::read_scale]);
  s.ring_x = base + g.offset[SlotLayout::ring_x];
  s.ring_B = base + g.offset[SlotLayout::ring_B];
  s.ring_delta = reinterpret_cast<float*>(base + g.offset[SlotLayout::ring_delta]);
  return s;
}

// What a readout reads: in the separate modes the read copy ([H * P, row bytes] codes, [H * P]
// row scales), elsewhere the recurrence checkpoint itself.
template <Mode kMode>
__device__ __forceinline__ const uint8_t* readout_codes(const SlotSections& s) {
  return static_cast<const uint8_t*>(is_separate(kMode) ? s.read : s.rec);
}
template <Mode kMode>
__device__ __forceinline__ const float* readout_scales(const SlotSections& s) {
  return is_separate(kMode) ? s.read_scale : s.rec_scale;
}

// Eight e4m3 codes to fp32 through the hardware converter (exact: e4m3 -> fp16 -> fp32).
__device__ __forceinline__ void e4m3x8_to_f32(const uint8_t (&c)[8], float (&v)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        __nv_fp8x2_storage_t(uint16_t(c[i]) | uint16_t(c[i + 1]) << 8), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    v[i] = f.x;
    v[i + 1] = f.y;
  }
}

// Eight e2m1 codes (element i in nibble i) times d, a block scale's value: the same products as
// e2m1_to_f32(code) * d, bit for bit (exact in fp32). Each code becomes an e4m3 byte of value
// e2m1 x 2^-6 (formats.h), converted two at a time in hardware, the 2^6 folded into d.
__device__ __forceinline__ void e2m1x8_to_f32(uint32_t packed, float d, float (&v)[8]) {
  const float d64 = d * kE2m1E4m3Unscale;  // exact: a power of two
  const uint32_t bytes[2] = {e2m1x4_even_to_e4m3x4_scaled(packed),
                             e2m1x4_odd_to_e4m3x4_scaled(packed)};
#pragma unroll
  for (int odd = 0; odd < 2; ++odd)
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // elements (4 half + odd, 4 half + 2 + odd)
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          __nv_fp8x2_storage_t(uint16_t(bytes[odd] >> (16 * half))), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      v[4 * half + odd] = __fmul_rn(f.x, d64);
      v[4 * half + 2 + odd] = __fmul_rn(f.y, d64);
    }
}

// The raw bytes of one 8-element chunk of the recurrence (rec = true) or read checkpoint, loaded
// without any dependent instruction so that the loads of several rows stay in flight while the
// thread does other work; decode_raw8 turns them into values later.
struct RawChunk {
  uint4 lo, hi;    // up to 32 bytes of codes
  float scale;     // row scale (8/4-bit modes)
  uint32_t extra;  // nvfp4 block scale
};

// The index of element n0 of checkpoint row `row` (h P + p) within the slot's sections, which is
// also the stochastic rounding's element counter: below 2^31 (checked at construction), so 32-bit
// arithmetic and a zero-extended add to the section pointer suffice.
__device__ __forceinline__ uint32_t chunk_element(int64_t row, int n0, int N) {
  return uint32_t(row) * uint32_t(N) + uint32_t(n0);
}

template <Mode kMode>
__device__ __forceinline__ void load_raw8(const SlotSections& s, int64_t row, int n0, int N,
                                          bool rec, RawChunk& c) {
  const uint32_t e = chunk_element(row, n0, N);
  c.scale = 1.f;
  if constexpr (kMode == Mode::fp32) {
    c.lo = reinterpret_cast<const uint4*>(static_cast<const float*>(s.rec) + e)[0];
    c.hi = reinterpret_cast<const uint4*>(static_cast<const float*>(s.rec) + e)[1];
  } else if constexpr (kMode == Mode::shared_fp8 || kMode == Mode::shared_int8) {
    const uint2 r = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(s.rec) + e);
    c.lo.x = r.x, c.lo.y = r.y;
    c.scale = s.rec_scale[row];
  } else if constexpr (kMode == Mode::separate_fp8) {
    if (rec) {
      c.lo = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(s.rec) + e);
    } else {
      const uint2 r = *reinterpret_cast<const uint2*>(s.read + e);
      c.lo.x = r.x, c.lo.y = r.y;
      c.scale = s.read_scale[row];
    }
  } else if constexpr (kMode == Mode::separate_nvfp4) {
    if (rec) {
      c.lo = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(s.rec) + e);
    } else {
      c.lo.x = *reinterpret_cast<const uint32_t*>(s.read + e / 2);
      c.extra = s.read_block_scale[e / 16];
      c.scale = s.read_scale[row];
    }
  } else {  // bf16, fp16, fp16-sr
    c.lo = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(s.rec) + e);
  }
}

// Values of a RawChunk: the decoded recurrence state (rec, returns 1), or the read values and
// the row scale (y_row = scale * sum_n v[n] C[n]).
template <Mode kMode>
__device__ __forceinline__ float decode_raw8(const RawChunk& c, bool rec, float (&v)[8]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&c.lo);
  if constexpr (kMode == Mode::fp32) {
    const float* f = reinterpret_cast<const float*>(&c.lo);
    const float* g = reinterpret_cast<const float*>(&c.hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = f[i], v[i + 4] = g[i];
    return 1.f;
  } else if constexpr (kMode == Mode::bf16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = bf16_to_f32(h[i]);
    return 1.f;
  } else if constexpr (kMode == Mode::shared_fp8 || kMode == Mode::shared_int8) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&c.lo);
    uint8_t codes[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) codes[i] = b[i];
    if constexpr (kMode == Mode::shared_fp8) {
      e4m3x8_to_f32(codes, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(static_cast<int8_t>(codes[i]));
    }
    if (!rec) return c.scale;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(v[i], c.scale);
    return 1.f;
  } else {
    if (kMode == Mode::separate_fp8 && !rec) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(&c.lo);
      uint8_t codes[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) codes[i] = b[i];
      e4m3x8_to_f32(codes, v);
      return c.scale;
    }
    if (kMode == Mode::separate_nvfp4 && !rec) {
      e2m1x8_to_f32(c.lo.x, e4m3_to_f32(uint8_t(c.extra)), v);
      return c.scale;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __half2float(__ushort_as_half(h[i]));
    return 1.f;
  }
}

// Recurrence checkpoint, decoded to fp32: elements [n0, n0 + 8) of row `row` (= h * P + p).
template <Mode kMode>
__device__ __forceinline__ void load_rec8(const SlotSections& s, int64_t row, int n0, int N,
                                          float (&v)[8]) {
  RawChunk c;
  load_raw8<kMode>(s, row, n0, N, true, c);
  decode_raw8<kMode>(c, true, v);
}

// The short form of stochastic rounding (r <= 12, no NaN) for two values, in floating point
// (formats.h f16_sr_ulp, which has the proof): x + sign(x) (R + 1/2) 2^-r u added toward zero,
// u the fp16 lsb of x's binade, then cvt.rz.satfinite.f16x2.f32, which drops the bits below the
// fp16 lsb, rebiases the exponent and saturates at +-65504. `fraction` = f16_sr_fraction(random,
// r). Five instructions per value (exponent mask, max, FMA, sign, FADD.RZ) where the integer form
// on the float's bits took seven: a subnormal result needed its own lift, cap and select there.
// Bit-identical to f32_to_f16_sr for r <= 12 and every non-NaN x (test_formats on the CPU,
// test_device_codecs on the GPU, over the grid of StochasticRounding.ShortFormMatchesReference).
__device__ __forceinline__ float f16_sr_presum(float x, float fraction) {
  const float ulp = f16_sr_ulp(x);
  return __fadd_rz(x, copysignf(fmaf(ulp, fraction, -ulp), x));  // the FMA is exact
}
// Element x0 in the low half of the result, x1 in the high half.
__device__ __forceinline__ uint32_t f16x2_sr_short(float x0, float x1, float fraction0,
                                                   float fraction1) {
  uint32_t d;
  asm("cvt.rz.satfinite.f16x2.f32 %0, %1, %2;"
      : "=r"(d)
      : "f"(f16_sr_presum(x1, fraction1)), "f"(f16_sr_presum(x0, fraction0)));
  return d;
}

// The elements of v that saturate in fp16 (|v| > 65504), counted only where `bound`, an upper
// bound of their magnitudes, says that one may (rare: a branch, not a count per element).
__device__ __forceinline__ int count_f16_saturated(const float (&v)[8], float bound) {
  int saturated = 0;
  if (bound > 65504.f)
#pragma unroll
    for (int k = 0; k < 8; ++k) saturated += fabsf(v[k]) > 65504.f ? 1 : 0;
  return saturated;
}

// Stochastic rounding of 8 values to fp16 (SPEC 6), element indices e .. e+7 (e % 8 == 0);
// element k in half k % 2 of words[k / 2] (the layout of the 16 bytes a checkpoint row stores).
// kShortSr: the caller guarantees r <= kSrByteMaxBits (the flush is specialised for it), so only
// the short form is compiled and the 8 elements' instructions interleave without a branch each.
// kBounded: `bound` is an upper bound of the 8 |v| that the caller has at hand (the row amax of
// the separate modes' read encoder); otherwise the function takes their maximum itself.
// drawn: the chunk's random fields where the caller has taken them already (EncodePrep), else
// null.
// kCountSaturation = false: the caller counts the saturated elements itself (flush_head, once for
// all its rows), and this returns 0.
template <bool kShortSr = false, bool kBounded = false, bool kCountSaturation = true>
__device__ __forceinline__ int encode8_f16_sr(const float (&v)[8], uint64_t e, const SrContext& sr,
                                              uint32_t (&words)[4], float bound = 0.f,
                                              const SrChunk* drawn = nullptr) {
  int saturated = 0;
  // e % 8 == 0: one draw (or half of one); round keys from the parameters
  const SrChunk chunk = drawn      ? *drawn
                        : kShortSr ? sr_byte_chunk(sr_draw(sr, e), e)
                                   : sr_chunk(sr_draw(sr, e), e, sr.bits);
  // The short form needs r <= 12 and no NaN (the encoders sanitize first); r = 13 is rare. With
  // kShortSr the condition is a constant and the long form is not compiled.
  const bool fast = kShortSr || sr.bits <= kSrFastMaxBits;
  // The largest |x| (or a bound): saturation is rare, counted only when it may have happened.
  float magnitude = kBounded ? bound : 0.f;
  if (fast) {
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      words[k / 2] =
          f16x2_sr_short(v[k], v[k + 1], f16_sr_fraction(sr_chunk_random(chunk, k), sr.bits),
                         f16_sr_fraction(sr_chunk_random(chunk, k + 1), sr.bits));
      if (kCountSaturation && !kBounded)
        magnitude = fmaxf(magnitude, fmaxf(fabsf(v[k]), fabsf(v[k + 1])));
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      bool sat0 = false, sat1 = false;
      const uint32_t lo = f32_to_f16_sr(v[k], sr_chunk_random(chunk, k), sr.bits, &sat0);
      const uint32_t hi = f32_to_f16_sr(v[k + 1], sr_chunk_random(chunk, k + 1), sr.bits, &sat1);
      words[k / 2] = lo | hi << 16;
      saturated += (sat0 ? 1 : 0) + (sat1 ? 1 : 0);
    }
  }
  if (kCountSaturation) saturated += count_f16_saturated(v, magnitude);
  return saturated;
}

// The amax of a lane's 8 values (|.| folds into the max).
__device__ __forceinline__ float lane_amax8(const float (&v)[8]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = amax_combine(m, fabsf(v[i]));
  return m;
}
// Row amax of a lane's 8-element chunk over the lanes of its row (cuda_common.cuh's row_amax);
// pair: the amax of the lane pair, an nvfp4 block of 16 elements; lane: the chunk's lane_amax8
// where the caller has it (sanitize_by_amax).
__device__ __forceinline__ float chunk_amax(const float (&v)[8], int lanes, float* pair = nullptr,
                                            const float* lane = nullptr) {
  float amax[1] = {lane ? *lane : lane_amax8(v)}, p[1];
  row_amax(amax, lanes, p);
  if (pair) *pair = p[0];
  return amax[0];
}

// Two fp32 values to e4m3 codes (bits 0-7 and 8-15 of the result, the rest 0), round to nearest
// even, finite overflow saturating to +-448: one
// hardware conversion (cvt.rn.satfinite.e4m3x2.f32) on sm_89 and later, bit-identical to
// core/formats.h's f32_to_e4m3 for every non-NaN input (test_formats_cuda_headers checks the
// same rule against cuda_fp8.h); the encoders never pass NaN (sanitize8 runs first).
__device__ __forceinline__ uint32_t e4m3x2_bits(float a, float b) {  // a: low byte
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// 8-bit row codec (e4m3: kMax = 448, int8: 127) of a row whose amax (chunk_amax) is given.
// Returns the row scale; codes = the 8 codes, element i in byte i of the little-endian pair of
// words; rv = code values. Two e4m3 conversions of two values each make a word in two
// instructions (the second merges into the first's upper half), where assembling the words byte
// by byte took about 20 instructions per lane and row. No branch: a zero row's codes, values and
// scale are selected, so that the encodes of a thread's rows can interleave (flush_head).
template <bool kFp8>
__device__ __forceinline__ float encode8_row8bit(const float (&v)[8], float amax, uint2& codes,
                                                 float (&rv)[8]) {
  const bool live = !detail::is_zero_row(amax);
  // = __fdiv_rn(kmax, amax) without its range check and slow path: amax is finite (sanitize8)
  // and at least 2^-100 where the row is live (formats.h live_row_factor); whatever it gives for
  // a zero row is discarded below.
  const float inv = live_row_factor(kFp8 ? kE4m3Max : kInt8Max, amax);
  const float kmax = kFp8 ? kE4m3Max : kInt8Max;
  float t[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) t[i] = __fmul_rn(v[i], inv);
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kFp8) {
      w[h] = e4m3x2_bits(t[4 * h], t[4 * h + 1]) | e4m3x2_bits(t[4 * h + 2], t[4 * h + 3]) << 16;
      w[h] = live ? w[h] : 0u;
#pragma unroll
      for (int i = 0; i < 4; ++i) rv[4 * h + i] = e4m3_to_f32(uint8_t(w[h] >> (8 * i)));
    } else {
      w[h] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int8_t q = live ? f32_to_int8(t[4 * h + i]) : int8_t(0);
        w[h] |= uint32_t(uint8_t(q)) << (8 * i);
        rv[4 * h + i] = float(q);
      }
    }
  }
  codes = make_uint2(w[0], w[1]);
  // exact: amax >= 2^-100 where the row is live (detail::div_rn_by)
  return live ? detail::div_rn_by(amax, kmax, kFp8 ? kInvE4m3Max : kInvInt8Max) : 0.f;
}

// NVFP4 row codec (formats.h encode_row_nvfp4) of a row whose amax and block amax bm (the
// 16-element block of this lane's chunk, shared with lane ^ 1: chunk_amax's pair) are given.
// Writes 4 packed bytes and (even lanes) the block scale.
__device__ __forceinline__ float encode8_nvfp4(const float (&v)[8], float amax, float bm,
                                               uint32_t& packed, uint8_t& block_scale,
                                               float (&rv)[8]) {
  if (detail::is_zero_row(amax)) {
    packed = 0;
    block_scale = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) rv[i] = 0.f;
    return 0.f;
  }
  constexpr float kGlobal = kE4m3Max * kE2m1Max;
  // = __fdiv_rn(kGlobal, amax) without its range check and slow path: amax is finite (sanitize8)
  // and at least 2^-100 here (formats.h nvfp4_global_factor).
  const float g = nvfp4_global_factor(amax);
  // bm / 6 by div_rn_by: exact where the quotient is normal (bm >= 2^-125). Below that both
  // quotients are under 2^-126 and s = quotient x g under 2^-126 x 2^111.4 (g <= 2688 / 2^-100,
  // the smallest amax of a live row), far below half the smallest e4m3 value 2^-9: the block
  // scale is 0 from either, and so are the codes.
  float s = detail::div_rn_by(bm, kE2m1Max, kInvE2m1Max);
  s = __fmul_rn(s, g);
  // s >= 0: the hardware conversion rounds and saturates as f32_to_e4m3 does (NaN -> 0x7f). As
  // a pair with 0 in the upper byte, so that the word converts back as it is (no byte mask).
  const uint32_t bs_pair = e4m3x2_bits(s, 0.f);
  block_scale = uint8_t(bs_pair);
  const float d =
      __low2float(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bs_pair), __NV_E4M3)));
  const bool live = d > 0.f;  // false for 0 and for NaN (a NaN row)
  // = __fdiv_rn(g, d): d is a positive e4m3 value and g, k are normal (formats.h
  // div_rn_by_e4m3). Where the block is not live the quotient may be NaN (d = 0 or NaN): the
  // select discards it, and nothing traps on the device.
  const float k = live ? detail::div_rn_by_e4m3(g, d) : 0.f;
  // The products are finite where the block is live (|v| <= amax, k finite), so the rounding of
  // f32_to_e2m1_scaled is f32_to_e2m1's; the e4m3 conversions of its values are exact, two per
  // instruction, and the codes come out of the bytes' bit fields (formats.h).
  uint32_t bytes[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const float2 lo = make_float2(f32_to_e2m1_scaled(__fmul_rn(v[4 * w], k)),
                                  f32_to_e2m1_scaled(__fmul_rn(v[4 * w + 1], k)));
    const float2 hi = make_float2(f32_to_e2m1_scaled(__fmul_rn(v[4 * w + 2], k)),
                                  f32_to_e2m1_scaled(__fmul_rn(v[4 * w + 3], k)));
    bytes[w] = e4m3x4_scaled_to_e2m1x4(
        uint32_t(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
        uint32_t(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16);
  }
  packed = live ? e2m1x4_pair_pack(bytes[0], bytes[1]) : 0u;
  e2m1x8_to_f32(packed, d, rv);
  return detail::div_rn_by(amax, kGlobal, kInvNvfp4Global);  // exact: amax >= 2^-100 (div_rn_by)
}

// What a row's encode needs before its codes: the row amax and the lane pair's (an nvfp4 block;
// the modes with row scales) and the stochastic rounding's draw (the modes with it). flush_head
// forms them for all of a thread's rows first, side by side (prepare_rows): inside each row's
// encode, the row reduction's shuffles and the 10-round Philox were chains that no other row's
// work could fill, since the encodes have branches between them.
struct EncodePrep {
  float amax, pair;
  SrChunk draw;  // the chunk's random fields
};

// The random fields of K chunks of 8 elements (element_of(r): chunk r's first element index,
// chunk_element), for callers that know r <= kSrByteMaxBits and whose lanes 2m and 2m + 1 hold
// the two halves of one draw group (16 elements) in every one of their K chunks (`odd`: this lane
// holds the upper halves). The even lane draws for the first K / 2 chunks and the odd lane for
// the others, and each passes the other its half: K / 2 draws per thread instead of K, for K
// shuffles. All lanes of the warp call it.
template <int K, typename ElementOf>
__device__ __forceinline__ void paired_draws(bool odd, ElementOf element_of, const SrContext& sr,
                                             SrChunk (&chunk)[K]) {
  static_assert(K % 2 == 0, "paired draws split a thread's chunks in two halves");
  constexpr int kHalf = K / 2;
#pragma unroll
  for (int r = 0; r < kHalf; ++r) {
    // Chunk r (even lane) or r + K/2 (odd lane); the pair's elements e and e + 8 share the draw.
    const U32x4 d = sr_draw(sr, element_of(odd ? r + kHalf : r));
    // Words 0-1 serve the even lane's chunk, 2-3 the odd lane's: keep one half, pass the other.
    const uint32_t keep0 = odd ? d.v[2] : d.v[0], keep1 = odd ? d.v[3] : d.v[1];
    const uint32_t give0 = odd ? d.v[0] : d.v[2], give1 = odd ? d.v[1] : d.v[3];
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
    // The partner drew chunk r + K/2 (for the even lane) or r (for the odd one).
    chunk[r] = sr_chunk_from_bytes(odd ? got0 : keep0, odd ? got1 : keep1);
    chunk[r + kHalf] = sr_chunk_from_bytes(odd ? keep0 : got0, odd ? keep1 : got1);
  }
}
// The same for K rows' chunks [n0, n0 + 8) (`rows`: the rows' indices, h P + p), where N % 16 == 0
// puts the lanes 2m and 2m + 1 of a row on its elements [16m, 16m + 16).
template <int K>
__device__ __forceinline__ void paired_row_draws(const int (&rows)[K], int n0, int N,
                                                 const SrContext& sr, SrChunk (&chunk)[K]) {
  paired_draws<K>((n0 / 8) % 2 != 0, [&](int r) { return chunk_element(rows[r], n0, N); }, sr,
                  chunk);
}

// EncodePrep of K rows, chunk [n0, n0 + 8) of each; `rows`: the rows' indices (h P + p);
// lane_amax: lane_amax8 of each row's chunk (flush_head has them from sanitize_rows).
// kPairedDraws: the draws by paired_row_draws (its conditions hold).
template <Mode kMode, int K, bool kPairedDraws = false>
__device__ __forceinline__ void prepare_rows(const float (&lane_amax)[K], const int (&rows)[K],
                                             int n0, int N, int lanes, const SrContext& sr,
                                             EncodePrep (&prep)[K]) {
  if constexpr (is_separate(kMode) || is_shared_quantized(kMode)) {
    float amax[K], pair[K];
#pragma unroll
    for (int r = 0; r < K; ++r) amax[r] = lane_amax[r];
    row_amax(amax, lanes, pair);
#pragma unroll
    for (int r = 0; r < K; ++r) prep[r].amax = amax[r], prep[r].pair = pair[r];
  }
  if constexpr (uses_stochastic_rounding(kMode) && kPairedDraws) {
    SrChunk chunk[K];
    paired_row_draws(rows, n0, N, sr, chunk);
#pragma unroll
    for (int r = 0; r < K; ++r) prep[r].draw = chunk[r];
  } else if constexpr (uses_stochastic_rounding(kMode)) {
#pragma unroll
    for (int r = 0; r < K; ++r) {
      const uint32_t e = chunk_element(rows[r], n0, N);
      prep[r].draw = sr_chunk(sr_draw(sr, e), e, sr.bits);
    }
  }
}

// Writes elements [n0, n0+8) of row `row` of every checkpoint of the mode from the fp32 values
// `v`. All lanes of the warp must call it (row reductions), so the lanes of a duplicated row
// (past P, see RowMap) call it with store = false: they take part in the shuffles and write
// nothing, since their row may already hold the new values of its owner. Returns the values the
// readout multiplies with C (rv) and the row scale, as decode_raw8 would return them from the new
// codes; adds the number of fp16-saturated elements to *saturated (store = false: nothing).
// prep: the row's EncodePrep where the caller formed it (prepare_rows), else null; with it, in the
// separate modes, the caller counts the carrier's fp16-saturated elements itself from the rows'
// amaxes (count_f16_saturated), and they are not added to *saturated here.
// lane_amax: without prep, the chunk's lane_amax8 where the caller has it (sanitize_by_amax), for
// the modes with row scales.
// drawn: without prep, the chunk's random fields where the caller has them (paired_row_draws).
template <Mode kMode, bool kShortSr = false>
__device__ __forceinline__ float encode8(const SlotSections& s, int64_t row, int n0, int N,
                                         int lane_in_row, int lanes, const float (&v)[8],
                                         const SrContext& sr, float (&rv)[8], int* saturated,
                                         bool store, const EncodePrep* prep = nullptr,
                                         const float* lane_amax = nullptr,
                                         const SrChunk* drawn = nullptr) {
  const uint32_t e = chunk_element(row, n0, N);
  int sat = 0;
  if constexpr (kMode == Mode::fp32) {
    if (store) store8_f32(static_cast<float*>(s.rec) + e, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) rv[i] = v[i];
    return 1.f;
  } else if constexpr (kMode == Mode::bf16) {
    uint16_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = f32_to_bf16(v[i]), rv[i] = bf16_to_f32(c[i]);
    if (store) store8_u16(static_cast<uint16_t*>(s.rec) + e, c);
    return 1.f;
  } else if constexpr (kMode == Mode::fp16) {
    uint16_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint16_t hb = f32_to_f16(v[i]);
      if ((hb & 0x7fffu) == 0x7c00u) {
        hb = uint16_t((hb & 0x8000u) | 0x7bffu);
        ++sat;
      }
      c[i] = hb;
      rv[i] = f16_to_f32(hb);
    }
    if (store) {
      store8_u16(static_cast<uint16_t*>(s.rec) + e, c);
      *saturated += sat;
    }
    return 1.f;
  } else if constexpr (kMode == Mode::fp16_sr) {
    uint32_t w[4];
    sat = encode8_f16_sr<kShortSr>(v, uint64_t(e), sr, w, 0.f, prep ? &prep->draw : drawn);
#pragma unroll
    for (int i = 0; i < 8; ++i) rv[i] = f16_to_f32(uint16_t(w[i / 2] >> (16 * (i % 2))));
    if (store) {
      store8_u16(static_cast<uint16_t*>(s.rec) + e, w);
      *saturated += sat;
    }
    return 1.f;
  } else if constexpr (kMode == Mode::shared_fp8 || kMode == Mode::shared_int8) {
    uint2 c;
    const float amax = prep ? prep->amax : chunk_amax(v, lanes, nullptr, lane_amax);
    const float scale = encode8_row8bit<kMode == Mode::shared_fp8>(v, amax, c, rv);
    if (store) {
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(s.rec) + e) = c;
      if (lane_in_row == 0) s.rec_scale[row] = scale;
    }
    return scale;
  } else {
    float scale, amax, pair;  // amax: the row's, which bounds the SR's saturation check
    if (prep) {
      amax = prep->amax, pair = prep->pair;
    } else {
      amax = chunk_amax(v, lanes, &pair, lane_amax);
    }
    if constexpr (kMode == Mode::separate_fp8) {
      uint2 c;
      scale = encode8_row8bit<true>(v, amax, c, rv);
      if (store) *reinterpret_cast<uint2*>(s.read + e) = c;
    } else {
      uint32_t packed;
      uint8_t bs;
      scale = encode8_nvfp4(v, amax, pair, packed, bs, rv);
      if (store) {
        *reinterpret_cast<uint32_t*>(s.read + e / 2) = packed;
        if ((lane_in_row & 1) == 0) s.read_block_scale[e / 16] = bs;
      }
    }
    uint32_t w[4];
    sat = prep ? encode8_f16_sr<kShortSr, true, false>(v, uint64_t(e), sr, w, amax, &prep->draw)
               : encode8_f16_sr<kShortSr, true>(v, uint64_t(e), sr, w, amax, drawn);
    if (store) {
      if (lane_in_row == 0) s.read_scale[row] = scale;
      store8_u16(static_cast<uint16_t*>(s.rec) + e, w);
      *saturated += sat;
    }
    return scale;
  }
}

}  // namespace replayssm::cuda
