// FastDiv (core/fast_div.h) against the hardware division: every divisor up to 4096 and a sweep
// of large ones, with the numerators where errors would show first (around multiples of the
// divisor, powers of two, the top of the range) and random ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_div.h"

namespace replayssm {
namespace {

void expect_exact(uint32_t d, const std::vector<uint32_t>& numerators) {
  const FastDiv f = FastDiv::make(d);
  for (const uint32_t n : numerators) {
    ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
  }
}

std::vector<uint32_t> numerators_for(uint32_t d, std::mt19937& rng) {
  std::vector<uint32_t> n = {0u, 1u, d - 1, d, d + 1, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  for (int e = 0; e < 32; ++e) n.push_back(uint32_t(1) << e), n.push_back((uint32_t(1) << e) - 1);
  const uint64_t top = uint64_t(0xffffffffu) / d;  // multiples q d - 1, q d, q d + 1
  for (uint64_t q : {uint64_t(2), uint64_t(3), top / 2, top - 1, top})
    for (int64_t off : {-1, 0, 1}) {
      const int64_t v = int64_t(q * d) + off;
      if (v >= 0 && v <= 0xffffffffll) n.push_back(uint32_t(v));
    }
  for (int i = 0; i < 200; ++i) n.push_back(uint32_t(rng()));
  return n;
}

TEST(FastDiv, MatchesDivisionForSmallDivisors) {
  std::mt19937 rng(1);
  for (uint32_t d = 1; d <= 4096; ++d) expect_exact(d, numerators_for(d, rng));
}

TEST(FastDiv, MatchesDivisionForLargeDivisors) {
  std::mt19937 rng(2);
  for (int i = 0; i < 2000; ++i) {
    const uint32_t d = uint32_t(rng()) | 1u << (i % 31);
    expect_exact(d, numerators_for(d, rng));
  }
  expect_exact(0xffffffffu, numerators_for(0xffffffffu, rng));
  expect_exact(0x80000000u, numerators_for(0x80000000u, rng));
}

TEST(FastDiv, RejectsZero) { EXPECT_THROW(FastDiv::make(0), Error); }

}  // namespace
}  // namespace replayssm
