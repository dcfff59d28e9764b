// The export format of one slot (docs/design.md, "Export format"):
//
//   "RSSMSLOT"                  8 bytes magic
//   u32 format version (1)      little endian
//   u32 header length H
//   H bytes of JSON             mode, shape, history, activation dtype, cursors, section sizes
//   SlotLayout::total bytes     the slot's sections, pending ring entries zeroed
//   u32 CRC-32                  of everything before it
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/backend.h"

namespace replayssm {

inline constexpr uint32_t kSlotFormatVersion = 1;

std::vector<uint8_t> encode_slot_file(const SsmShape& shape, const CacheConfig& config,
                                      const SlotImage& image);
// Validates magic, version, checksum, and that mode, shape, history and activation dtype match
// `config`/`shape`; throws Error naming the first problem.
SlotImage decode_slot_file(const SsmShape& shape, const CacheConfig& config,
                           std::span<const uint8_t> bytes);

// Zeroes the ring entries that are not committed, so an export depends only on canonical state.
void canonicalize_ring(const SsmShape& shape, const CacheConfig& config, SlotImage& image);

}  // namespace replayssm
