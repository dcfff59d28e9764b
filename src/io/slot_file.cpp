#include "io/slot_file.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "cache/cursors.h"
#include "core/crc32.h"
#include "replayssm/error.h"

namespace replayssm {
namespace {

constexpr char kMagic[8] = {'R', 'S', 'S', 'M', 'S', 'L', 'O', 'T'};
constexpr const char* kSectionNames[SlotLayout::kSections] = {
    "rec", "rec_scale", "read", "read_block_scale", "read_scale", "ring_x", "ring_B", "ring_delta"};

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

nlohmann::json describe(const SsmShape& shape, const CacheConfig& config) {
  return {{"mode", mode_name(config.mode)},
          {"shape",
           {{"nheads", shape.nheads},
            {"headdim", shape.headdim},
            {"dstate", shape.dstate},
            {"ngroups", shape.ngroups}}},
          {"history", config.history},
          {"activation_dtype", dtype_name(config.activation_dtype)}};
}

}  // namespace

void canonicalize_ring(const SsmShape& shape, const CacheConfig& config, SlotImage& image) {
  const SlotLayout layout = SlotLayout::make(shape, config);
  const int L = config.history;
  image.cursors.pending = 0;
  for (int phys = 0; phys < L; ++phys) {
    const int logical = (phys - image.cursors.origin + L) & (L - 1);
    if (logical < image.cursors.committed) continue;
    for (auto s : {SlotLayout::ring_x, SlotLayout::ring_B, SlotLayout::ring_delta}) {
      const size_t entry = layout.size[s] / size_t(L);
      std::memset(image.bytes.data() + layout.offset[s] + phys * entry, 0, entry);
    }
  }
}

std::vector<uint8_t> encode_slot_file(const SsmShape& shape, const CacheConfig& config,
                                      const SlotImage& image) {
  const SlotLayout layout = SlotLayout::make(shape, config);
  check(image.bytes.size() == layout.total, "slot image has ", image.bytes.size(),
        " bytes, layout needs ", layout.total);
  nlohmann::json header = describe(shape, config);
  header["cursors"] = {{"committed", image.cursors.committed},
                       {"origin", image.cursors.origin},
                       {"flush_index", image.cursors.flush_index},
                       {"request_id", image.cursors.request_id}};
  nlohmann::json sections = nlohmann::json::array();
  for (int s = 0; s < SlotLayout::kSections; ++s)
    sections.push_back(
        {{"name", kSectionNames[s]}, {"offset", layout.offset[s]}, {"size", layout.size[s]}});
  header["sections"] = sections;
  header["payload_bytes"] = layout.total;
  header["sr"] = {{"bits", config.sr_bits},
                  {"philox_rounds", config.philox_rounds},
                  {"seed", config.seed},
                  {"layer", config.layer}};
  const std::string text = header.dump();

  std::vector<uint8_t> out(kMagic, kMagic + 8);
  put_u32(out, kSlotFormatVersion);
  put_u32(out, uint32_t(text.size()));
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), image.bytes.begin(), image.bytes.end());
  put_u32(out, crc32(out.data(), out.size()));
  return out;
}

SlotImage decode_slot_file(const SsmShape& shape, const CacheConfig& config,
                           std::span<const uint8_t> bytes) {
  check(bytes.size() >= 20, "slot file is truncated: ", bytes.size(), " bytes");
  check(std::memcmp(bytes.data(), kMagic, 8) == 0, "not a replayssm slot file (bad magic)");
  const uint32_t version = get_u32(bytes.data() + 8);
  check(version == kSlotFormatVersion, "slot file version ", version, " is not supported (this ",
        "build reads version ", kSlotFormatVersion, ")");
  const uint32_t stored_crc = get_u32(bytes.data() + bytes.size() - 4);
  check(crc32(bytes.data(), bytes.size() - 4) == stored_crc,
        "slot file is corrupt: checksum mismatch");
  const uint32_t header_len = get_u32(bytes.data() + 12);
  check(size_t(header_len) + 20 <= bytes.size(), "slot file is truncated: header of ", header_len,
        " bytes does not fit");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 16, bytes.begin() + 16 + header_len);
  } catch (const std::exception& e) {
    fail("slot file header is not valid JSON: ", e.what());
  }
  const nlohmann::json expected = describe(shape, config);
  for (const char* key : {"mode", "shape", "history", "activation_dtype"}) {
    check(header.contains(key) && header[key] == expected[key], "slot file ", key, " ",
          header.contains(key) ? header[key].dump() : "(missing)", " does not match this cache's ",
          expected[key].dump());
  }
  const SlotLayout layout = SlotLayout::make(shape, config);
  const size_t payload = bytes.size() - 20 - header_len;
  check(payload == layout.total, "slot file payload has ", payload, " bytes, expected ",
        layout.total);
  SlotImage image;
  try {
    const auto& c = header.at("cursors");
    image.cursors = fresh_cursors(c.at("request_id").get<uint64_t>());
    image.cursors.committed = c.at("committed").get<int32_t>();
    image.cursors.origin = c.at("origin").get<int32_t>();
    image.cursors.flush_index = c.at("flush_index").get<uint32_t>();
  } catch (const nlohmann::json::exception& e) {
    fail("slot file cursors are malformed: ", e.what());
  }
  check(image.cursors.committed >= 0 && image.cursors.committed <= config.history,
        "slot file committed count ", image.cursors.committed, " is outside 0..", config.history);
  check(image.cursors.origin >= 0 && image.cursors.origin < config.history,
        "slot file ring origin ", image.cursors.origin, " is outside 0..", config.history - 1);
  const uint8_t* data = bytes.data() + 16 + header_len;
  image.bytes.assign(data, data + payload);
  return image;
}

}  // namespace replayssm
