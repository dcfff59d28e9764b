// NaN / Inf detection in packed activations, every value of a 32-bit word at once: the input
// validation of the device's verify and decode steps (SPEC 8) tests whole 16-byte vectors with it.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace replayssm {

// The bit fields of a 32-bit word holding one fp32 value or two bf16 / fp16 values.
struct PackedFields {
  uint32_t exponent;  // every value's exponent field
  uint32_t lowest;    // the lowest bit of each exponent field
  uint32_t carry;     // the bit above each field: a sign bit, which `exponent` clears
};

RSSM_HD PackedFields packed_fields(int value_bytes, bool f16) {
  if (value_bytes == 4) return {0x7f800000u, 0x00800000u, 0x80000000u};
  if (f16) return {0x7c007c00u, 0x04000400u, 0x80008000u};
  return {0x7f807f80u, 0x00800080u, 0x80008000u};  // bf16
}

// The exponent fields of `word` incremented at their lowest bit: a field carries into the bit
// above it exactly when it is all ones (NaN or Inf), and no carry reaches the next value (a field
// plus one is at most the carry bit). OR several words' results, then test them once with
// any_nonfinite: 3 instructions a word instead of a compare per value.
RSSM_HD uint32_t exponent_carries(uint32_t word, const PackedFields& f) {
  return (word & f.exponent) + f.lowest;
}
RSSM_HD bool any_nonfinite(uint32_t carries, const PackedFields& f) {
  return (carries & f.carry) != 0;
}

}  // namespace replayssm
