// Byte layout of one slot's storage, shared by every backend and by the export format: the
// sections below, in this order, each padded to 64 bytes.
//
//   rec               [H*P, N]    recurrence checkpoint codes (fp32, bf16, fp16, e4m3 or int8)
//   rec_scale         [H*P]       fp32 decode scale per row (shared 8-bit modes)
//   read              [H*P, N]    e4m3 codes (separate-fp8) | [H*P, N/2] e2m1 pairs (nvfp4)
//   read_block_scale  [H*P, N/16] e4m3 block scales (separate-nvfp4)
//   read_scale        [H*P]       fp32 decode scale per row (separate modes)
//   ring_x            [L, H, P]   activation dtype
//   ring_B            [L, G, N]   activation dtype
//   ring_delta        [L, H]      fp32, softplus(dt + dt_bias) after the clamp
#pragma once

#include <cstddef>
#include <cstdint>

#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm {

// Bytes per element of the recurrence checkpoint.
size_t carrier_bytes(Mode mode);

struct SlotLayout {
  enum Section { rec, rec_scale, read, read_block_scale, read_scale, ring_x, ring_B, ring_delta };
  static constexpr int kSections = 8;
  static constexpr size_t kAlign = 64;

  size_t size[kSections] = {};    // unpadded bytes of each section
  size_t offset[kSections] = {};  // padded offsets
  size_t total = 0;               // bytes per slot, padded

  static SlotLayout make(const SsmShape& shape, const CacheConfig& config);
  // Bytes of the checkpoint sections (what a replay step reads), unpadded.
  size_t checkpoint_bytes() const;
  size_t read_checkpoint_bytes(Mode mode) const;
};

}  // namespace replayssm
