// The safetensors reader/writer: round trips, and every kind of corrupt file must be rejected with
// a clear error (never a crash, never a silently wrong tensor).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "replayssm/error.h"

namespace replayssm::io {
namespace {

StFile sample() {
  StFile file;
  file.metadata["replayssm.trace"] = "{\"version\":1}";
  file.metadata["note"] = "hello";
  const std::vector<float> f = {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f};
  const std::vector<int32_t> i = {1, -2, 3};
  file.tensors["a"] = make_f32({2, 3}, f);
  file.tensors["b.idx"] = make_i32({3}, i);
  file.tensors["empty"] = make_f32({0, 4}, {});
  file.tensors["scalar"] = make_f32({}, std::vector<float>{42.0f});
  return file;
}

// Builds a file from a raw header string and a data buffer, for crafting corrupt inputs.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes,
                              uint64_t header_len_override = UINT64_MAX) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t len = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    parse_safetensors(bytes, "f.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripInMemory) {
  const StFile file = sample();
  const std::vector<uint8_t> bytes = serialize_safetensors(file);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u) << "data buffer should start 8-byte aligned";
  const StFile back = parse_safetensors(bytes, "mem");
  EXPECT_EQ(back.metadata, file.metadata);
  ASSERT_EQ(back.tensors.size(), file.tensors.size());
  for (const auto& [name, t] : file.tensors) {
    const StTensor& u = back.tensors.at(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.data, t.data) << name;
  }
  EXPECT_EQ(back.tensors.at("a").f32("a")[3], 3.25f);
  EXPECT_EQ(back.tensors.at("b.idx").i32("b")[1], -2);
  EXPECT_EQ(serialize_safetensors(back), bytes) << "serialisation is canonical";
}

TEST(Safetensors, RoundTripOnDisk) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "replayssm_test_roundtrip.safetensors").string();
  write_safetensors(path, sample());
  const StFile back = read_safetensors(path);
  EXPECT_EQ(back.tensors.at("a").describe(), "F32[2,3]");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove(path);
}

TEST(Safetensors, ReadsForeignLayouts) {
  // Another writer may order entries differently and omit __metadata__; offsets decide.
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
                             R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  std::vector<uint8_t> bytes = raw_file(header, 8);
  const uint16_t halfs[2] = {0x3c00, 0xc000};  // 1.0, -2.0
  const uint16_t bf16s[2] = {0x3f80, 0x4040};  // 1.0, 3.0
  std::memcpy(bytes.data() + 8 + header.size(), halfs, 4);
  std::memcpy(bytes.data() + 8 + header.size() + 4, bf16s, 4);
  const StFile file = parse_safetensors(bytes, "foreign");
  EXPECT_TRUE(file.metadata.empty());
  EXPECT_EQ(file.tensors.at("a").as_f64("a"), (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(file.tensors.at("b").as_f64("b"), (std::vector<double>{1.0, 3.0}));
}

TEST(Safetensors, RejectsTruncatedFiles) {
  const std::vector<uint8_t> good = serialize_safetensors(sample());
  EXPECT_NE(error_of({}).find("shorter than the 8-byte header length"), std::string::npos);
  // Every proper prefix must be rejected (the last tensor always has data here).
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<uint8_t> prefix(good.begin(), good.begin() + n);
    EXPECT_FALSE(error_of(prefix).empty()) << "prefix of " << n << " bytes was accepted";
  }
  std::vector<uint8_t> cut(good.begin(), good.end() - 1);
  EXPECT_NE(error_of(cut).find("beyond"), std::string::npos) << error_of(cut);
}

TEST(Safetensors, RejectsBadHeaderLength) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_NE(error_of(raw_file(header, 4, 1ull << 40)).find("exceeds the limit"), std::string::npos);
  EXPECT_NE(error_of(raw_file(header, 4, header.size() + 100)).find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of(raw_file(header, 4, 0)).find("too short"), std::string::npos);
  // A length that cuts the JSON short.
  EXPECT_NE(error_of(raw_file(header, 4, header.size() - 3)).find("not valid JSON"),
            std::string::npos);
}

TEST(Safetensors, RejectsBadOffsets) {
  auto two = [](const char* a_off, const char* b_off) {
    return std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":)") + a_off +
           R"(},"b":{"dtype":"F32","shape":[2],"data_offsets":)" + b_off + "}}";
  };
  EXPECT_NE(error_of(raw_file(two("[0,8]", "[4,12]"), 12)).find("overlaps"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,8]", "[0,8]"), 8)).find("overlaps"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,8]", "[12,20]"), 20)).find("hole"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,8]", "[8,16]"), 20)).find("trailing"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,8]", "[8,16]"), 12)).find("beyond"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[8,0]", "[8,16]"), 16)).find("begin after end"),
            std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,4]", "[4,12]"), 12)).find("needs 8 bytes"),
            std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,-8]", "[8,16]"), 16)).find("not non-negative"),
            std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0]", "[8,16]"), 16)).find("data_offsets"), std::string::npos);
  EXPECT_NE(error_of(raw_file(two("[0,18446744073709551615]", "[8,16]"), 16)).find("beyond"),
            std::string::npos);
}

TEST(Safetensors, RejectsBadEntries) {
  auto one = [](const std::string& entry) {
    return error_of(raw_file(R"({"a":)" + entry + "}", 4));
  };
  EXPECT_NE(one(R"({"dtype":"F31","shape":[1],"data_offsets":[0,4]})").find("unknown dtype 'F31'"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})").find("dtype"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})").find("shape entry"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})").find("shape entry"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":"F32","shape":1,"data_offsets":[0,4]})").find("shape"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]})")
                .find("overflows"),
            std::string::npos);
  EXPECT_NE(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})").find("unknown field"),
            std::string::npos);
  EXPECT_NE(one(R"([1,2])").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(raw_file(R"({"__metadata__":{"k":1}})", 0)).find("not a string"),
            std::string::npos);
  EXPECT_NE(error_of(raw_file(R"([1])", 0)).find("does not start with"), std::string::npos);
  EXPECT_NE(error_of(raw_file(R"({"a":)", 0)).find("not valid JSON"), std::string::npos);
}

TEST(Safetensors, TypedAccessChecksDtype) {
  const StFile file = sample();
  try {
    file.tensors.at("b.idx").f32("b.idx");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b.idx' has dtype I32, expected F32"), std::string::npos);
  }
  EXPECT_THROW(make_f32({2, 2}, std::vector<float>{1, 2, 3}), Error);
}

TEST(Safetensors, MissingFileIsAClearError) {
  try {
    read_safetensors("/nonexistent/dir/x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

// Random corruption of a valid file: the reader must either accept it or throw Error, never crash
// or read out of bounds (run under ASan/UBSan in CI to make the latter visible).
TEST(Safetensors, FuzzedBytesNeverCrash) {
  const std::vector<uint8_t> good = serialize_safetensors(sample());
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint8_t> bytes = good;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % bytes.size();
      bytes[at] = uint8_t(rng());
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    try {
      const StFile file = parse_safetensors(bytes, "fuzz");
      for (const auto& [name, t] : file.tensors) {
        EXPECT_EQ(t.data.size(), size_t(t.numel()) * st_dtype_size(t.dtype));
      }
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace replayssm::io
