// Lookup tables for the element decoders on the host: the same values as the bit-level decoders
// of core/formats.h (the tables are filled from them), without their branches.
#pragma once

#include <cstdint>
#include <vector>

#include "core/formats.h"

namespace replayssm::cpu {

struct TableDecoder {
  const float* f16_values;   // [65536]
  const float* e4m3_values;  // [256]
  const float* e2m1_values;  // [16]
  float f16(uint16_t h) const { return f16_values[h]; }
  float bf16(uint16_t b) const { return bf16_to_f32(b); }  // a shift already
  float e4m3(uint8_t c) const { return e4m3_values[c]; }
  float e2m1(uint8_t c) const { return e2m1_values[c & 0xf]; }
};

inline const TableDecoder& table_decoder() {
  static const std::vector<float> f16 = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(uint16_t(i));
    return t;
  }();
  static const std::vector<float> e4m3 = [] {
    std::vector<float> t(256);
    for (uint32_t i = 0; i < 256; ++i) t[i] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  static const std::vector<float> e2m1 = [] {
    std::vector<float> t(16);
    for (uint32_t i = 0; i < 16; ++i) t[i] = e2m1_to_f32(uint8_t(i));
    return t;
  }();
  static const TableDecoder decoder{f16.data(), e4m3.data(), e2m1.data()};
  return decoder;
}

}  // namespace replayssm::cpu
