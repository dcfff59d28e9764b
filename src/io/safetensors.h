// A small, strict reader and writer of the safetensors format (https://huggingface.co/docs/
// safetensors): an 8-byte little-endian header length, a JSON header mapping tensor names to
// {dtype, shape, data_offsets} plus an optional "__metadata__" string map, then the data buffer.
//
// The reader trusts nothing: every length, offset, shape and dtype is checked against the file
// before any byte is read, the data buffer must be covered exactly (no holes, no overlaps), and
// every problem is reported as a replayssm::Error that names the file and the offending entry.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace replayssm::io {

// The element types of the safetensors format. Unknown names are rejected by the reader.
enum class StDType : uint8_t { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };
size_t st_dtype_size(StDType dtype);
const char* st_dtype_name(StDType dtype);
// Throws replayssm::Error for names that are not safetensors dtypes.
StDType parse_st_dtype(std::string_view name);

struct StTensor {
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel * element size bytes, little-endian

  int64_t numel() const;
  std::string describe() const;  // "F32[4,8]"

  // Typed copies; each checks the dtype and throws with `name` in the message on a mismatch.
  std::vector<float> f32(std::string_view name) const;
  std::vector<int32_t> i32(std::string_view name) const;
  // Any floating dtype (F16, BF16, F32, F64) widened to double, for comparisons.
  std::vector<double> as_f64(std::string_view name) const;
  bool is_floating() const;
};

StTensor make_f32(std::vector<int64_t> shape, std::span<const float> values);
StTensor make_i32(std::vector<int64_t> shape, std::span<const int32_t> values);
StTensor make_u8(std::vector<int64_t> shape, std::span<const uint8_t> values);

struct StFile {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::map<std::string, StTensor> tensors;      // sorted by name; written in this order
};

// Upper bound on the JSON header, as in the reference implementation (100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// `what` names the source in error messages (usually the path).
StFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view what);
StFile read_safetensors(const std::string& path);
std::vector<uint8_t> serialize_safetensors(const StFile& file);
// Writes to `path` via a temporary file and a rename, so a failed write leaves no partial file.
void write_safetensors(const std::string& path, const StFile& file);

std::vector<uint8_t> read_file_bytes(const std::string& path);
void write_file_bytes(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace replayssm::io
