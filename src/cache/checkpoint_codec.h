// Per-row encode and decode of a slot's checkpoint(s) in every mode of SPEC section 5. A row is
// one (head, headdim) pair: N = dstate values. Written once for the CPU backend and the CUDA
// kernels so both produce the same codes from the same fp32 values.
#pragma once

#include <cstdint>

#include "core/formats.h"
#include "core/hd.h"
#include "core/philox.h"
#include "replayssm/types.h"

namespace replayssm {

// Pointers into one slot's checkpoint sections (see cache/layout.h); unused ones are null.
struct SlotCheckpoint {
  void* rec;                  // [H*P, N] carrier codes
  float* rec_scale;           // [H*P]    shared 8-bit modes
  uint8_t* read;              // [H*P, N] e4m3 | [H*P, N/2] packed e2m1
  uint8_t* read_block_scale;  // [H*P, N/16] e4m3
  float* read_scale;          // [H*P]
};

// Where the random bits of a stochastic-rounding encode come from (SPEC section 6):
// key = (seed_lo, seed_hi ^ layer), counter = (group, flush_index, request_lo, request_hi), where
// one Philox call serves a group of consecutive elements, and the SR reads the low r bits of an
// element's field:
//  - r <= 8 (the default r = 7): 16 elements of 8 bits; group = element / 16, and element e takes
//    byte e % 16 of the draw, bits 8 (e % 4) of word (e % 16) / 4;
//  - r = 9..13: 8 elements of 16 bits; group = element / 8, and element e takes word (e % 8) / 2,
//    its low half for even e and its high half for odd e.
struct SrContext {
  U32x2 key;
  uint64_t request_id;
  uint32_t flush_index;
  int bits;
  int rounds;
  PhiloxKeys10 keys10;  // philox_keys10(key): kept, not recomputed, by the 10-round draws
};

inline constexpr int kSrByteMaxBits = 8;  // the largest r whose elements take a byte of a draw

RSSM_HD int sr_elements_per_draw(int bits) { return bits <= kSrByteMaxBits ? 16 : 8; }

RSSM_HD U32x2 philox_key(uint64_t seed, int layer) {
  return U32x2{{uint32_t(seed), uint32_t(seed >> 32) ^ uint32_t(layer)}};
}

RSSM_HD SrContext make_sr_context(U32x2 key, uint64_t request_id, uint32_t flush_index, int bits,
                                  int rounds) {
  return SrContext{key, request_id, flush_index, bits, rounds, philox_keys10(key)};
}

RSSM_HD U32x4 sr_counter(const SrContext& sr, uint64_t element) {
  return U32x4{{uint32_t(element / uint64_t(sr_elements_per_draw(sr.bits))), sr.flush_index,
                uint32_t(sr.request_id), uint32_t(sr.request_id >> 32)}};
}

// The draw of the group that holds `element`.
RSSM_HD U32x4 sr_draw(const SrContext& sr, uint64_t element) {
  return sr.rounds == 10 ? philox4x32_10(sr_counter(sr, element), sr.keys10)
                         : philox4x32(sr_counter(sr, element), sr.key, sr.rounds);
}

// The random field of `element` in the draw of its group; bits above the field belong to the
// next elements and are masked off by the SR (it reads r bits).
RSSM_HD uint32_t sr_random(const U32x4& draw, uint64_t element, int bits) {
  if (bits <= kSrByteMaxBits) {
    const int i = int(element % 16);
    return draw.v[i >> 2] >> (8 * (i & 3));
  }
  const int i = int(element % 8);
  return draw.v[i >> 1] >> (16 * (i & 1));
}

// The random fields of one chunk of 8 elements e .. e+7 (e % 8 == 0) in one form for both
// layouts, as the CUDA encoders take them: element k's field in half k % 2 of w[k / 2]. With
// r <= 8 each half's low byte is the element's byte (sr_chunk_from_bytes) and its high byte is
// not read.
struct SrChunk {
  uint32_t w[4];
};

// The chunk of the 8 bytes lo (elements 0-3) and hi (4-7) of the byte layout.
RSSM_HD SrChunk sr_chunk_from_bytes(uint32_t lo, uint32_t hi) {
#ifdef __CUDA_ARCH__
  // byte k of the pair to half k % 2 of word k / 2, one PRMT per word
  return SrChunk{{__byte_perm(lo, 0u, 0x4140u), __byte_perm(lo, 0u, 0x4342u),
                  __byte_perm(hi, 0u, 0x4140u), __byte_perm(hi, 0u, 0x4342u)}};
#else
  const auto spread = [](uint32_t two) { return (two & 0xffu) | (two & 0xff00u) << 8; };
  return SrChunk{{spread(lo), spread(lo >> 16), spread(hi), spread(hi >> 16)}};
#endif
}

// The chunk that starts at element e (e % 8 == 0) from the draw of its group: with r <= 8 the
// draw's half that holds it (words 0-1 for even e / 8, 2-3 for odd; sr_byte_chunk, for callers
// that know r <= 8), otherwise the whole draw.
RSSM_HD SrChunk sr_byte_chunk(const U32x4& draw, uint64_t e) {
  const bool upper = (e / 8) % 2 != 0;
  return sr_chunk_from_bytes(upper ? draw.v[2] : draw.v[0], upper ? draw.v[3] : draw.v[1]);
}
RSSM_HD SrChunk sr_chunk(const U32x4& draw, uint64_t e, int bits) {
  if (bits <= kSrByteMaxBits) return sr_byte_chunk(draw, e);
  return SrChunk{{draw.v[0], draw.v[1], draw.v[2], draw.v[3]}};
}

// Element k (0..7) of a chunk: sr_random of element e + k.
RSSM_HD uint32_t sr_chunk_random(const SrChunk& c, int k) { return c.w[k >> 1] >> (16 * (k & 1)); }

// Fp16 stochastic rounding of values[0..n) whose element indices start at `first_element`.
// Returns the number of saturated elements.
RSSM_HD int encode_f16_sr_row(const float* values /*[n]*/, int n, uint64_t first_element,
                              const SrContext& sr, uint16_t* out /*[n]*/) {
  int saturated = 0;
  const int per_draw = sr_elements_per_draw(sr.bits);
  U32x4 draw{};
  for (int i = 0; i < n; ++i) {
    const uint64_t e = first_element + uint64_t(i);
    if (i == 0 || e % uint64_t(per_draw) == 0) draw = sr_draw(sr, e);
    bool sat = false;
    out[i] = f32_to_f16_sr(values[i], sr_random(draw, e, sr.bits), sr.bits, &sat);
    saturated += sat ? 1 : 0;
  }
  return saturated;
}

// Counts fp16 round-to-nearest results that overflowed to Inf, and clamps them to +-65504
// (a checkpoint never holds Inf; the flush reports the count).
RSSM_HD int encode_f16_rn_row(const float* values, int n, uint16_t* out) {
  int saturated = 0;
  for (int i = 0; i < n; ++i) {
    uint16_t h = f32_to_f16(values[i]);
    if ((h & 0x7fffu) == 0x7c00u) {
      h = uint16_t((h & 0x8000u) | 0x7bffu);
      ++saturated;
    }
    out[i] = h;
  }
  return saturated;
}

// Writes row `row` of every checkpoint of the mode from the fp32 values. Returns the number of
// saturated elements. N must be a multiple of 16 for nvfp4 and of 4 in general.
RSSM_HD int encode_checkpoint_row(Mode mode, const SlotCheckpoint& ck, int row, int n,
                                  const float* values /*[N]*/, const SrContext& sr) {
  const uint64_t first = uint64_t(row) * n;
  switch (mode) {
    case Mode::fp32: {
      float* dst = static_cast<float*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) dst[i] = values[i];
      return 0;
    }
    case Mode::bf16: {
      uint16_t* dst = static_cast<uint16_t*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) dst[i] = f32_to_bf16(values[i]);
      return 0;
    }
    case Mode::fp16:
      return encode_f16_rn_row(values, n, static_cast<uint16_t*>(ck.rec) + first);
    case Mode::fp16_sr:
      return encode_f16_sr_row(values, n, first, sr, static_cast<uint16_t*>(ck.rec) + first);
    case Mode::shared_fp8:
      ck.rec_scale[row] = encode_row_e4m3(values, n, static_cast<uint8_t*>(ck.rec) + first);
      return 0;
    case Mode::shared_int8:
      ck.rec_scale[row] = encode_row_int8(values, n, static_cast<int8_t*>(ck.rec) + first);
      return 0;
    case Mode::separate_fp8:
      ck.read_scale[row] = encode_row_e4m3(values, n, ck.read + first);
      return encode_f16_sr_row(values, n, first, sr, static_cast<uint16_t*>(ck.rec) + first);
    case Mode::separate_nvfp4:
      ck.read_scale[row] =
          encode_row_nvfp4(values, n, ck.read + first / 2, ck.read_block_scale + first / 16);
      return encode_f16_sr_row(values, n, first, sr, static_cast<uint16_t*>(ck.rec) + first);
  }
  return 0;
}

// Element decoders of the checkpoint formats. The codec functions below take the decoder as a
// policy so a backend can substitute an equivalent one (the CPU backend uses lookup tables with
// the same values); the arithmetic around the element decode stays written once.
struct FormatDecoder {
  RSSM_HD float f16(uint16_t h) const { return f16_to_f32(h); }
  RSSM_HD float bf16(uint16_t b) const { return bf16_to_f32(b); }
  RSSM_HD float e4m3(uint8_t c) const { return e4m3_to_f32(c); }
  RSSM_HD float e2m1(uint8_t c) const { return e2m1_to_f32(c); }
};

// The fp32 values of row `row` of the recurrence checkpoint (what a flush folds from). The
// shared 8-bit modes decode as code * scale with one rounding, as decode_row_e4m3/int8 do.
template <typename Decoder = FormatDecoder>
RSSM_HD void decode_recurrence_row(Mode mode, const SlotCheckpoint& ck, int row, int n,
                                   float* out /*[N]*/, const Decoder& dec = Decoder{}) {
  const uint64_t first = uint64_t(row) * n;
  switch (mode) {
    case Mode::fp32: {
      const float* src = static_cast<const float*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) out[i] = src[i];
      return;
    }
    case Mode::bf16: {
      const uint16_t* src = static_cast<const uint16_t*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) out[i] = dec.bf16(src[i]);
      return;
    }
    case Mode::shared_fp8: {
      const uint8_t* codes = static_cast<const uint8_t*>(ck.rec) + first;
      const float scale = ck.rec_scale[row];
      for (int i = 0; i < n; ++i) out[i] = detail::mul_rn(dec.e4m3(codes[i]), scale);
      return;
    }
    case Mode::shared_int8: {
      const int8_t* codes = static_cast<const int8_t*>(ck.rec) + first;
      const float scale = ck.rec_scale[row];
      for (int i = 0; i < n; ++i) out[i] = detail::mul_rn(float(codes[i]), scale);
      return;
    }
    default: {  // fp16, fp16-sr and the separate modes' fp16 carrier
      const uint16_t* src = static_cast<const uint16_t*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) out[i] = dec.f16(src[i]);
      return;
    }
  }
}

// The values the readout multiplies with C, and the fp32 scale applied to the row's dot product
// afterwards: y_row = scale * sum_n values[n] * C[n]. For the 8- and 4-bit read checkpoints the
// values are the code values (times the e4m3 block scale for nvfp4), all exact in bf16, so the
// readout can run as a BF16 product with FP32 accumulation (SPEC 5, readout precision); for the
// 32- and 16-bit modes they are the decoded state and the scale is 1.
template <typename Decoder = FormatDecoder>
RSSM_HD float decode_read_row(Mode mode, const SlotCheckpoint& ck, int row, int n,
                              float* values /*[N]*/, const Decoder& dec = Decoder{}) {
  const uint64_t first = uint64_t(row) * n;
  switch (mode) {
    case Mode::shared_fp8: {
      const uint8_t* codes = static_cast<const uint8_t*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) values[i] = dec.e4m3(codes[i]);
      return ck.rec_scale[row];
    }
    case Mode::shared_int8: {
      const int8_t* codes = static_cast<const int8_t*>(ck.rec) + first;
      for (int i = 0; i < n; ++i) values[i] = float(codes[i]);
      return ck.rec_scale[row];
    }
    case Mode::separate_fp8: {
      const uint8_t* codes = ck.read + first;
      for (int i = 0; i < n; ++i) values[i] = dec.e4m3(codes[i]);
      return ck.read_scale[row];
    }
    case Mode::separate_nvfp4: {
      const uint8_t* packed = ck.read + first / 2;
      const uint8_t* block_scales = ck.read_block_scale + first / 16;
      for (int i = 0; i < n; ++i) {
        const uint8_t code = (i & 1) ? uint8_t(packed[i / 2] >> 4) : uint8_t(packed[i / 2] & 0xf);
        values[i] = dec.e2m1(code) * dec.e4m3(block_scales[i / 16]);  // exact product
      }
      return ck.read_scale[row];
    }
    default:
      decode_recurrence_row(mode, ck, row, n, values, dec);
      return 1.0f;
  }
}

}  // namespace replayssm
