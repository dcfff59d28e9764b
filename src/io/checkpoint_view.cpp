#include "io/checkpoint_view.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "cache/checkpoint_codec.h"
#include "cache/layout.h"
#include "io/slot_file.h"
#include "replayssm/error.h"

namespace replayssm::io {
namespace {

SlotCheckpoint checkpoint_of(const SlotLayout& layout, SlotImage& image) {
  uint8_t* base = image.bytes.data();
  auto section = [&](SlotLayout::Section s) -> uint8_t* {
    return layout.size[s] ? base + layout.offset[s] : nullptr;
  };
  return SlotCheckpoint{section(SlotLayout::rec),
                        reinterpret_cast<float*>(section(SlotLayout::rec_scale)),
                        section(SlotLayout::read), section(SlotLayout::read_block_scale),
                        reinterpret_cast<float*>(section(SlotLayout::read_scale))};
}

template <typename DecodeRow>
std::vector<float> decode_rows(const SsmShape& shape, const CacheConfig& config,
                               const SlotImage& image, DecodeRow decode_row) {
  const SlotLayout layout = SlotLayout::make(shape, config);
  check(image.bytes.size() >= layout.total, "slot image of ", image.bytes.size(),
        " bytes is smaller than its layout (", layout.total, " bytes)");
  SlotImage copy = image;  // the codec takes mutable section pointers
  const SlotCheckpoint ck = checkpoint_of(layout, copy);
  const int rows = shape.nheads * shape.headdim, n = shape.dstate;
  std::vector<float> out(size_t(rows) * size_t(n));
  for (int row = 0; row < rows; ++row) decode_row(ck, row, n, out.data() + size_t(row) * n);
  return out;
}

}  // namespace

SlotFileInfo inspect_slot_file(std::span<const uint8_t> bytes) {
  check(bytes.size() >= 20, "not a replayssm slot file: ", bytes.size(), " bytes is too short");
  check(std::memcmp(bytes.data(), "RSSMSLOT", 8) == 0, "not a replayssm slot file (bad magic)");
  SlotFileInfo info;
  std::memcpy(&info.version, bytes.data() + 8, 4);
  uint32_t header_len = 0;
  std::memcpy(&header_len, bytes.data() + 12, 4);
  check(uint64_t(header_len) + 20 <= bytes.size(), "slot file is truncated: header of ", header_len,
        " bytes does not fit in ", bytes.size(), " bytes");
  const char* text = reinterpret_cast<const char*>(bytes.data() + 16);
  info.header_json.assign(text, header_len);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(info.header_json);
    info.config.mode = parse_mode(h.at("mode").get<std::string>());
    const auto& s = h.at("shape");
    info.shape = SsmShape{s.at("nheads").get<int>(), s.at("headdim").get<int>(),
                          s.at("dstate").get<int>(), s.at("ngroups").get<int>()};
    info.config.history = h.at("history").get<int>();
    info.config.activation_dtype = parse_dtype(h.at("activation_dtype").get<std::string>());
    if (h.contains("sr")) {
      info.config.sr_bits = h["sr"].at("bits").get<int>();
      info.config.philox_rounds = h["sr"].at("philox_rounds").get<int>();
      info.config.seed = h["sr"].at("seed").get<uint64_t>();
      info.config.layer = h["sr"].at("layer").get<int>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("slot file header is malformed: ", e.what());
  }
  info.shape.validate();
  // A cache that accepts this slot: one slot, the largest window the history allows.
  info.config.num_slots = 1;
  info.config.max_window = std::max(1, info.config.history / 2);
  info.config.validate(info.shape);
  info.image = decode_slot_file(info.shape, info.config, bytes);
  return info;
}

std::vector<float> decode_recurrence_checkpoint(const SsmShape& shape, const CacheConfig& config,
                                                const SlotImage& image) {
  return decode_rows(shape, config, image,
                     [&](const SlotCheckpoint& ck, int row, int n, float* out) {
                       decode_recurrence_row(config.mode, ck, row, n, out);
                     });
}

std::vector<float> decode_read_checkpoint(const SsmShape& shape, const CacheConfig& config,
                                          const SlotImage& image) {
  return decode_rows(shape, config, image,
                     [&](const SlotCheckpoint& ck, int row, int n, float* out) {
                       const float scale = decode_read_row(config.mode, ck, row, n, out);
                       for (int i = 0; i < n; ++i) out[i] *= scale;
                     });
}

}  // namespace replayssm::io
