#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "replayssm/error.h"

namespace replayssm::io {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr std::array<DTypeInfo, 13> kDTypes = {{
    {StDType::BOOL, "BOOL", 1},
    {StDType::U8, "U8", 1},
    {StDType::I8, "I8", 1},
    {StDType::U16, "U16", 2},
    {StDType::I16, "I16", 2},
    {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2},
    {StDType::U32, "U32", 4},
    {StDType::I32, "I32", 4},
    {StDType::F32, "F32", 4},
    {StDType::U64, "U64", 8},
    {StDType::I64, "I64", 8},
    {StDType::F64, "F64", 8},
}};

// The host is little-endian (x86-64 and aarch64 Linux), as is the format, so tensor bytes are
// copied as they are. Refuse to build elsewhere rather than silently write byte-swapped files.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

double half_to_double(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double value;
  if (exponent == 0) {
    value = std::ldexp(double(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::nan("") : INFINITY;
  } else {
    value = std::ldexp(double(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

double bf16_to_double(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// numel with overflow checks; dims are already known to be non-negative.
bool checked_numel(const std::vector<int64_t>& shape, size_t element, uint64_t* bytes) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  return !__builtin_mul_overflow(n, uint64_t(element), bytes);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);  // appended, not "," + ...: GCC 12 -Wrestrict false positive
  }
  out += ']';
  return out;
}

template <typename T>
StTensor make_tensor(StDType dtype, std::vector<int64_t> shape, std::span<const T> values) {
  StTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  check(t.numel() == int64_t(values.size()), "tensor of shape ", shape_string(t.shape), " given ",
        values.size(), " values");
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

template <typename T>
std::vector<T> typed_copy(const StTensor& t, StDType want, std::string_view name) {
  check(t.dtype == want, "tensor '", name, "' has dtype ", st_dtype_name(t.dtype), ", expected ",
        st_dtype_name(want));
  std::vector<T> out(t.data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

}  // namespace

size_t st_dtype_size(StDType dtype) { return kDTypes[size_t(dtype)].size; }
const char* st_dtype_name(StDType dtype) { return kDTypes[size_t(dtype)].name; }

StDType parse_st_dtype(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  fail("unknown safetensors dtype '", name, "'");
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string StTensor::describe() const { return st_dtype_name(dtype) + shape_string(shape); }

std::vector<float> StTensor::f32(std::string_view name) const {
  return typed_copy<float>(*this, StDType::F32, name);
}
std::vector<int32_t> StTensor::i32(std::string_view name) const {
  return typed_copy<int32_t>(*this, StDType::I32, name);
}

bool StTensor::is_floating() const {
  return dtype == StDType::F16 || dtype == StDType::BF16 || dtype == StDType::F32 ||
         dtype == StDType::F64;
}

std::vector<double> StTensor::as_f64(std::string_view name) const {
  const size_t n = size_t(numel());
  std::vector<double> out(n);
  const uint8_t* p = data.data();
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case StDType::F16:
      case StDType::BF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = dtype == StDType::F16 ? half_to_double(h) : bf16_to_double(h);
        break;
      }
      case StDType::F32: {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        out[i] = f;
        break;
      }
      case StDType::F64:
        std::memcpy(&out[i], p + 8 * i, 8);
        break;
      default:
        fail("tensor '", name, "' has dtype ", st_dtype_name(dtype), ", expected a float dtype");
    }
  }
  return out;
}

StTensor make_f32(std::vector<int64_t> shape, std::span<const float> values) {
  return make_tensor<float>(StDType::F32, std::move(shape), values);
}
StTensor make_i32(std::vector<int64_t> shape, std::span<const int32_t> values) {
  return make_tensor<int32_t>(StDType::I32, std::move(shape), values);
}
StTensor make_u8(std::vector<int64_t> shape, std::span<const uint8_t> values) {
  return make_tensor<uint8_t>(StDType::U8, std::move(shape), values);
}

StFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view what) {
  check(bytes.size() >= 8, what, ": not a safetensors file: ", bytes.size(),
        " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  check(header_len <= kMaxHeaderBytes, what, ": safetensors header length ", header_len,
        " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  check(header_len >= 2, what, ": safetensors header length ", header_len, " is too short");
  check(header_len <= bytes.size() - 8, what, ": truncated safetensors file: header of ",
        header_len, " bytes but only ", bytes.size() - 8, " bytes follow the length field");
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  check(header_begin[0] == '{', what, ": safetensors header does not start with '{'");

  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::parse_error& e) {
    fail(what, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  check(header.is_object(), what, ": safetensors header is not a JSON object");

  const std::span<const uint8_t> buffer = bytes.subspan(8 + header_len);
  StFile file;
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      check(entry.is_object(), what, ": __metadata__ is not a JSON object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        check(m.value().is_string(), what, ": __metadata__ value of '", m.key(),
              "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    check(entry.is_object(), what, ": entry of tensor '", name, "' is not a JSON object");
    for (auto field = entry.begin(); field != entry.end(); ++field) {
      check(field.key() == "dtype" || field.key() == "shape" || field.key() == "data_offsets", what,
            ": tensor '", name, "' has an unknown field '", field.key(), "'");
    }
    check(entry.contains("dtype") && entry["dtype"].is_string(), what, ": tensor '", name,
          "' has no string 'dtype'");
    check(entry.contains("shape") && entry["shape"].is_array(), what, ": tensor '", name,
          "' has no array 'shape'");
    check(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
              entry["data_offsets"].size() == 2,
          what, ": tensor '", name, "' has no 'data_offsets' pair");
    StTensor tensor;
    const std::string dtype_name = entry["dtype"].get<std::string>();
    try {
      tensor.dtype = parse_st_dtype(dtype_name);
    } catch (const Error&) {
      fail(what, ": tensor '", name, "' has unknown dtype '", dtype_name, "'");
    }
    for (const json& d : entry["shape"]) {
      check(d.is_number_unsigned(), what, ": tensor '", name,
            "' has a shape entry that is not a non-negative integer: ", d.dump());
      check(d.get<uint64_t>() <= uint64_t(INT64_MAX), what, ": tensor '", name,
            "' has a dimension that is too large");
      tensor.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    uint64_t nbytes = 0;
    check(checked_numel(tensor.shape, st_dtype_size(tensor.dtype), &nbytes), what, ": tensor '",
          name, "' of shape ", shape_string(tensor.shape), " overflows 64-bit byte counts");
    const json& offsets = entry["data_offsets"];
    check(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), what, ": tensor '",
          name, "' has data_offsets that are not non-negative integers: ", offsets.dump());
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    check(begin <= end, what, ": tensor '", name, "' has data_offsets [", begin, ", ", end,
          "] with begin after end");
    check(end <= buffer.size(), what, ": tensor '", name, "' has data_offsets [", begin, ", ", end,
          "] beyond the ", buffer.size(), "-byte data buffer (truncated file?)");
    check(end - begin == nbytes, what, ": tensor '", name, "' of ", tensor.describe(), " needs ",
          nbytes, " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin);
    tensor.data.assign(buffer.begin() + begin, buffer.begin() + end);
    auto [slot, inserted] = file.tensors.emplace(name, std::move(tensor));
    check(inserted, what, ": duplicate tensor '", name, "'");
    ranges.push_back({begin, end, &slot->first});
  }

  // The format requires the buffer to be covered exactly: tensors may not overlap (a writer bug
  // or a crafted file aliasing two tensors) and there may be no unreferenced bytes.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    check(r.begin >= covered, what, ": tensor '", *r.name, "' at bytes [", r.begin, ", ", r.end,
          ") overlaps the tensor before it (which ends at ", covered, ")");
    check(r.begin == covered, what, ": data buffer has a hole at bytes [", covered, ", ", r.begin,
          ") before tensor '", *r.name, "'");
    covered = r.end;
  }
  check(covered == buffer.size(), what, ": data buffer has ", buffer.size() - covered,
        " trailing bytes not referenced by any tensor");
  return file;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), path, ": cannot open for reading (", std::strerror(errno), ")");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  check(!in.bad(), path, ": read error");
  return bytes;
}

void write_file_bytes(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    check(bool(out), path, ": cannot open for writing (", std::strerror(errno), ")");
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail(path, ": write error");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(path, ": cannot rename temporary file into place (", ec.message(), ")");
  }
}

StFile read_safetensors(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return parse_safetensors(bytes, path);
}

std::vector<uint8_t> serialize_safetensors(const StFile& file) {
  json header = json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    check(name != "__metadata__", "a tensor may not be named __metadata__");
    check(tensor.data.size() == uint64_t(tensor.numel()) * st_dtype_size(tensor.dtype), "tensor '",
          name, "' of ", tensor.describe(), " holds ", tensor.data.size(), " bytes");
    header[name] = {{"dtype", st_dtype_name(tensor.dtype)},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  const uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  uint8_t* p = out.data() + 8 + text.size();
  for (const auto& [name, tensor] : file.tensors) {
    if (!tensor.data.empty()) std::memcpy(p, tensor.data.data(), tensor.data.size());
    p += tensor.data.size();
  }
  return out;
}

void write_safetensors(const std::string& path, const StFile& file) {
  write_file_bytes(path, serialize_safetensors(file));
}

}  // namespace replayssm::io
