// SPEC section 8 (issue item 8): every bad input produces an error that names the problem and
// leaves the cache unchanged, checked by comparing the export bytes of every open slot.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "replayssm/cache.h"
#include "replayssm/error.h"
#include "ssm_test_util.h"

namespace replayssm {
namespace {

using testing::i32_view;
using testing::random_params;
using testing::random_tokens;
using testing::Tokens;

void expect_error(const std::function<void()>& op, const std::string& fragment) {
  try {
    op();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << fragment << "'";
  }
}

TEST(BadConfig, EachGetsItsOwnMessage) {
  std::mt19937_64 rng(1);
  const SsmShape s{4, 8, 16, 2};
  const LayerParams p = random_params(s, rng);
  auto make = [&](SsmShape shape, CacheConfig c) { ReplayCache cache(shape, p, c); };
  CacheConfig c;
  expect_error([&] { make(SsmShape{4, 8, 16, 3}, c); }, "not divisible by ngroups");
  CacheConfig sep = c;
  sep.mode = Mode::separate_fp8;
  sep.prefix_caching = true;
  expect_error([&] { make(s, sep); }, "prefix caching is not supported with separate checkpoints");
  CacheConfig wide = c;
  wide.max_window = 9;
  expect_error([&] { make(s, wide); }, "allows at most 7 draft tokens");
  CacheConfig hist = c;
  hist.history = 12;
  expect_error([&] { make(s, hist); }, "power of two");
  CacheConfig fp4 = c;
  fp4.mode = Mode::separate_nvfp4;
  expect_error([&] { make(SsmShape{4, 8, 24, 2}, fp4); }, "multiple of 16");
  CacheConfig sr = c;
  sr.sr_bits = 14;
  expect_error([&] { make(s, sr); }, "sr_bits");
  LayerParams short_params = p;
  short_params.A_log.pop_back();
  expect_error([&] { ReplayCache cache(s, short_params, c); }, "A_log has 3 entries");
  EXPECT_THROW(parse_mode("fp9"), Error);
  EXPECT_EQ(parse_mode("separate", "nvfp4"), Mode::separate_nvfp4);
  EXPECT_EQ(parse_mode("shared", "int8"), Mode::shared_int8);
}

class BadInput : public ::testing::Test {
 protected:
  const SsmShape s{4, 8, 16, 2};
  std::mt19937_64 rng{2};
  LayerParams params = random_params(s, rng);
  CacheConfig config = [] {
    CacheConfig c;
    c.mode = Mode::separate_fp8;
    c.num_slots = 4;
    c.activation_dtype = DType::f32;
    return c;
  }();
  ReplayCache cache{s, params, config};
  std::vector<std::vector<uint8_t>> before;

  void SetUp() override {
    cache.open(0, 1);
    cache.open(1, 2);
    Tokens tk = random_tokens(s, DType::f32, 2, 5, rng);
    std::vector<int32_t> slots{0, 1};
    std::vector<float> y(2 * 5 * 32);
    cache.verify(i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                 host_view(y.data(), DType::f32, {2, 5, 4, 8}));
    std::vector<int32_t> acc{3, 5};
    cache.commit(i32_view(slots), i32_view(acc));
    before = snapshot();
  }
  std::vector<std::vector<uint8_t>> snapshot() {
    std::vector<std::vector<uint8_t>> out;
    for (int i = 0; i < config.num_slots; ++i)
      out.push_back(cache.is_open(i) ? cache.export_slot(i) : std::vector<uint8_t>{});
    return out;
  }
  void verify(std::vector<int32_t> slots, Tokens& tk, DType y_dtype = DType::f32) {
    std::vector<float> y(size_t(tk.batch) * tk.tokens * 32);
    cache.verify(i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                 host_view(y.data(), y_dtype, {tk.batch, tk.tokens, 4, 8}));
  }
  void TearDown() override { EXPECT_EQ(snapshot(), before) << "a failed operation changed a slot"; }
};

TEST_F(BadInput, WindowAboveMaxWindow) {
  Tokens tk = random_tokens(s, DType::f32, 1, 9, rng);
  expect_error([&] { verify({0}, tk); }, "window 9 is outside 1..max_window");
}

TEST_F(BadInput, CommitOfZeroOrAbovePending) {
  Tokens tk = random_tokens(s, DType::f32, 2, 4, rng);
  // A verify that flushes slot 1 (c = 5... no: 5 + 4 <= 16) and appends 4 pending entries.
  verify({0, 1}, tk);
  before = snapshot();  // pending entries are not part of an export; cursors are checked below
  std::vector<int32_t> slots{0, 1}, zero{1, 0}, above{5, 1};
  expect_error([&] { cache.commit(i32_view(slots), i32_view(zero)); }, "accepts 0 entries");
  expect_error([&] { cache.commit(i32_view(slots), i32_view(above)); }, "accepts 5 entries");
  EXPECT_EQ(cache.cursors(0).pending, 4);
  EXPECT_EQ(cache.cursors(1).pending, 4);
  std::vector<int32_t> ok{4, 4};
  cache.commit(i32_view(slots), i32_view(ok));
  before = snapshot();
}

TEST_F(BadInput, VerifyWhilePendingAndCommitWithoutVerify) {
  std::vector<int32_t> slots{0}, one{1};
  expect_error([&] { cache.commit(i32_view(slots), i32_view(one)); }, "has 0 pending");
  Tokens tk = random_tokens(s, DType::f32, 1, 2, rng);
  verify({0}, tk);
  expect_error([&] { verify({0}, tk); }, "uncommitted entries");
  cache.commit(i32_view(slots), i32_view(one));
  before = snapshot();
}

TEST_F(BadInput, ReleasedUnknownAndDuplicateSlots) {
  Tokens tk = random_tokens(s, DType::f32, 2, 1, rng);
  expect_error([&] { verify({0, 2}, tk); }, "slot 2 is not open");
  expect_error([&] { verify({0, 7}, tk); }, "slot 7 is out of range");
  expect_error([&] { verify({1, 1}, tk); }, "appears twice");
  expect_error([&] { cache.release(3); }, "slot 3 is not open");
  expect_error([&] { cache.open(1, 5); }, "already open");
  expect_error([&] { cache.fork(2, 3, 5); }, "slot 2 is not open");
  expect_error([&] { cache.export_slot(2); }, "not open");
  expect_error([&] { cache.state(0, 4); }, "beyond the 3 committed");
}

TEST_F(BadInput, NonFiniteInputs) {
  for (int which = 0; which < 4; ++which) {
    Tokens tk = random_tokens(s, DType::f32, 2, 3, rng);
    const char* name[] = {"x", "B", "C", "dt"};
    if (which == 0) reinterpret_cast<float*>(tk.x.data())[100] = NAN;
    if (which == 1) reinterpret_cast<float*>(tk.B.data())[50] = INFINITY;
    if (which == 2) reinterpret_cast<float*>(tk.C.data())[150] = -INFINITY;
    if (which == 3) tk.dt[20] = NAN;
    expect_error([&] { verify({0, 1}, tk); }, std::string("input ") + name[which]);
  }
  std::vector<float> st(size_t(s.state_elements()), 1.0f);
  st[17] = NAN;
  expect_error([&] { cache.import_state(3, 9, st.data()); }, "state element 17 is not finite");
}

TEST_F(BadInput, WrongShapesAndDtypes) {
  Tokens tk = random_tokens(s, DType::f32, 2, 3, rng);
  Tokens bf = random_tokens(s, DType::bf16, 2, 3, rng);
  std::vector<float> y(2 * 3 * 32);
  std::vector<int32_t> slots{0, 1}, one_slot{0};
  expect_error([&] { verify({0, 1}, bf); }, "x must be fp32");
  expect_error(
      [&] {
        cache.verify(i32_view(one_slot), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                     host_view(y.data(), DType::f32, {1, 3, 4, 8}));
      },
      "x must have shape fp32[1,3,4,8]");
  expect_error(
      [&] {
        cache.verify(i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s),
                     host_view(y.data(), DType::f32, {2, 3, 4, 9}));
      },
      "y must have shape");
  std::vector<float> fslots{0.f};
  expect_error([&] { cache.flush(host_view(fslots.data(), DType::f32, {1})); },
               "slots must be a 1-D i32 tensor");
  TensorView device_slots = i32_view(one_slot);
  device_slots.memory = MemoryKind::cuda;
  expect_error([&] { cache.flush(device_slots); }, "slots must be in host memory");
}

TEST_F(BadInput, CorruptOrMismatchedExports) {
  std::vector<uint8_t> bytes = cache.export_slot(0);
  std::vector<uint8_t> flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  expect_error([&] { cache.import_slot(2, flipped); }, "checksum mismatch");
  std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + 100);
  expect_error([&] { cache.import_slot(2, truncated); }, "");
  std::vector<uint8_t> magic = bytes;
  magic[0] = 'X';
  expect_error([&] { cache.import_slot(2, magic); }, "bad magic");
  expect_error([&] { cache.import_slot(2, std::vector<uint8_t>(5)); }, "truncated");
  // A slot exported from a cache of another mode or shape.
  CacheConfig other = config;
  other.mode = Mode::separate_nvfp4;
  ReplayCache nvfp4(s, params, other);
  nvfp4.open(0, 1);
  expect_error([&] { cache.import_slot(2, nvfp4.export_slot(0)); }, "mode");
  ReplayCache wider(SsmShape{4, 8, 32, 2}, params, config);
  wider.open(0, 1);
  expect_error([&] { cache.import_slot(2, wider.export_slot(0)); }, "shape");
  expect_error([&] { cache.import_slot(0, bytes); }, "already open");
}

}  // namespace
}  // namespace replayssm
