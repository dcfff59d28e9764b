// Cross-check of the scalar conversions against the CUDA toolkit's host-side conversions
// (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h, compiled here as plain host C++), over all codes and
// over more than a million fp32 values spanning subnormal, tiny, ordinary and huge magnitudes.
//
// Where the two define different results on purpose the comparison is skipped, and each skip is
// asserted separately so the difference stays documented (see docs/formats.md):
//  - NaN payloads: the toolkit returns a canonical NaN (sign dropped); ours keeps sign and top
//    payload bits. Both are NaN; NaN inputs are compared for NaN-ness only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/formats.h"
#include "core/philox.h"

namespace replayssm {
namespace {

uint16_t tk_f16(float x) {
  const __half_raw r = __half(__float2half_rn(x));
  return r.x;
}
uint16_t tk_bf16(float x) {
  const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
  return r.x;
}
uint8_t tk_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
float tk_f16_to_f32(uint16_t h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
float tk_bf16_to_f32(uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}
float tk_e4m3_to_f32(uint8_t c) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(c, __NV_E4M3);  // exact: e4m3 fits in fp16
  return tk_f16_to_f32(h.x);
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return f32_bits(a) == f32_bits(b);
}

// Random fp32 inputs: a quarter uniformly random bit patterns (every exponent, subnormals,
// Inf/NaN included), the rest log-uniform over the ranges where the narrow formats round,
// saturate and underflow.
float draw(uint32_t i) {
  const U32x4 r = philox4x32(U32x4{{i, 0xc0de, 0, 0}}, U32x2{{17, 4}});
  switch (r.v[0] & 3) {
    case 0:
      return bits_f32(r.v[1]);
    case 1:  // fp16/e4m3 normal and overflow range
      return bits_f32((r.v[1] & 0x807fffffu) | ((100u + r.v[2] % 50u) << 23));
    case 2:  // subnormal results of fp16/e4m3, and below
      return bits_f32((r.v[1] & 0x807fffffu) | ((80u + r.v[2] % 45u) << 23));
    default:  // fp32 subnormals and tiny / huge fp32
      return bits_f32((r.v[1] & 0x807fffffu) | ((r.v[2] % 8u) << 23 | (r.v[3] & 1u) << 30));
  }
}

constexpr uint32_t kN = 1u << 21;

TEST(CudaHeaders, Fp16MatchesToolkit) {
  uint32_t nan_inputs = 0;
  for (uint32_t i = 0; i < kN; ++i) {
    const float x = draw(i);
    if (std::isnan(x)) {
      ++nan_inputs;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(x))));
      ASSERT_TRUE(std::isnan(tk_f16_to_f32(tk_f16(x))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(x), tk_f16(x)) << std::hexfloat << x;
  }
  EXPECT_GT(nan_inputs, 0u);
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_TRUE(same_float(f16_to_f32(h), tk_f16_to_f32(h))) << h;
  }
}

TEST(CudaHeaders, Bf16MatchesToolkit) {
  for (uint32_t i = 0; i < kN; ++i) {
    const float x = draw(i);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(x))));
      ASSERT_TRUE(std::isnan(tk_bf16_to_f32(tk_bf16(x))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(x), tk_bf16(x)) << std::hexfloat << x;
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_TRUE(same_float(bf16_to_f32(b), tk_bf16_to_f32(b))) << b;
  }
}

TEST(CudaHeaders, E4m3MatchesToolkitSatfinite) {
  for (uint32_t i = 0; i < kN; ++i) {
    const float x = draw(i);
    if (std::isnan(x)) {
      ASSERT_EQ(f32_to_e4m3(x) & 0x7f, 0x7f);
      ASSERT_EQ(tk_e4m3(x) & 0x7f, 0x7f);
      continue;
    }
    ASSERT_EQ(f32_to_e4m3(x), tk_e4m3(x)) << std::hexfloat << x;
  }
  for (uint32_t c = 0; c < 256; ++c) {
    ASSERT_TRUE(same_float(e4m3_to_f32(c), tk_e4m3_to_f32(c))) << c;
  }
  // Inf under SATFINITE: both saturate to the largest finite value.
  EXPECT_EQ(tk_e4m3(INFINITY), f32_to_e4m3(INFINITY));
  EXPECT_EQ(tk_e4m3(-INFINITY), f32_to_e4m3(-INFINITY));
}

// The skipped cases, pinned: what each side gives for NaN.
TEST(CudaHeaders, DocumentedNanDifferences) {
  const float qnan = bits_f32(0x7fc00000u), nqnan = bits_f32(0xffc00000u);
  EXPECT_EQ(f32_to_f16(qnan), 0x7e00);
  EXPECT_EQ(f32_to_f16(nqnan), 0xfe00);
  EXPECT_EQ(f32_to_bf16(nqnan), 0xffc0);
  EXPECT_EQ(f32_to_e4m3(nqnan), 0xff);
  std::printf("toolkit NaN results: f16 %04x/%04x bf16 %04x/%04x e4m3 %02x/%02x\n", tk_f16(qnan),
              tk_f16(nqnan), tk_bf16(qnan), tk_bf16(nqnan), tk_e4m3(qnan), tk_e4m3(nqnan));
}

}  // namespace
}  // namespace replayssm
