#include "cache/layout.h"

namespace replayssm {

size_t carrier_bytes(Mode mode) {
  switch (mode) {
    case Mode::fp32:
      return 4;
    case Mode::shared_fp8:
    case Mode::shared_int8:
      return 1;
    default:
      return 2;  // bf16, fp16, fp16-sr and the fp16 carrier of the separate modes
  }
}

SlotLayout SlotLayout::make(const SsmShape& shape, const CacheConfig& config) {
  const size_t rows = size_t(shape.nheads) * shape.headdim;
  const size_t n = shape.dstate;
  const size_t act = dtype_size(config.activation_dtype);
  SlotLayout layout;
  layout.size[rec] = rows * n * carrier_bytes(config.mode);
  layout.size[rec_scale] = is_shared_quantized(config.mode) ? rows * sizeof(float) : 0;
  if (config.mode == Mode::separate_fp8) layout.size[read] = rows * n;
  if (config.mode == Mode::separate_nvfp4) {
    layout.size[read] = rows * n / 2;
    layout.size[read_block_scale] = rows * n / 16;
  }
  layout.size[read_scale] = is_separate(config.mode) ? rows * sizeof(float) : 0;
  layout.size[ring_x] = size_t(config.history) * rows * act;
  layout.size[ring_B] = size_t(config.history) * shape.ngroups * n * act;
  layout.size[ring_delta] = size_t(config.history) * shape.nheads * sizeof(float);
  size_t offset = 0;
  for (int s = 0; s < kSections; ++s) {
    layout.offset[s] = offset;
    offset += (layout.size[s] + kAlign - 1) / kAlign * kAlign;
  }
  layout.total = offset;
  return layout;
}

size_t SlotLayout::checkpoint_bytes() const {
  return size[rec] + size[rec_scale] + size[read] + size[read_block_scale] + size[read_scale];
}

size_t SlotLayout::read_checkpoint_bytes(Mode mode) const {
  if (is_separate(mode)) return size[read] + size[read_block_scale] + size[read_scale];
  return size[rec] + size[rec_scale];
}

}  // namespace replayssm
