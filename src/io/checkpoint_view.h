// Read-only views of exported slots for tools: what a slot file describes (without knowing its
// cache beforehand) and the decoded contents of its checkpoints.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/backend.h"
#include "replayssm/cache.h"

namespace replayssm::io {

struct SlotFileInfo {
  uint32_t version = 0;
  SsmShape shape;
  CacheConfig config;  // mode, history, activation dtype, sr bits/rounds, seed, layer
  SlotImage image;     // validated payload and cursors
  std::string header_json;
};

// Reads the self-description of a slot file (io/slot_file.h), then validates the whole file
// (magic, version, checksum, sizes) against it. Throws Error naming the problem.
SlotFileInfo inspect_slot_file(std::span<const uint8_t> bytes);

// The recurrence checkpoint (what flushes fold from) and the read checkpoint (what the readout
// multiplies with C, scales applied), both decoded to fp32 [H, P, N].
std::vector<float> decode_recurrence_checkpoint(const SsmShape& shape, const CacheConfig& config,
                                                const SlotImage& image);
std::vector<float> decode_read_checkpoint(const SsmShape& shape, const CacheConfig& config,
                                          const SlotImage& image);

}  // namespace replayssm::io
