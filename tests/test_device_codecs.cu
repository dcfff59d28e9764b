// Device forms of the codecs that differ in formulation from core/formats.h's, run on the GPU
// element by element against the CPU reference (label gpu; skipped without a device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/formats.h"
#include "cuda/cuda_backend.h"
#include "cuda/replay_codec.cuh"
#include "cuda_test_util.h"

namespace replayssm {
namespace {

// words[i] = the short-form SR of the pair (x[2i], x[2i+1]) with random words (random[2i],
// random[2i+1]) and r bits.
__global__ void sr_pairs_kernel(const float* x /*[2n]*/, const uint32_t* random /*[2n]*/, int r,
                                uint32_t* words /*[n]*/, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  words[i] = cuda::f16x2_sr_short(x[2 * i], x[2 * i + 1], f16_sr_fraction(random[2 * i], r),
                                  f16_sr_fraction(random[2 * i + 1], r));
}

// The device's short form (cvt.rz.satfinite on a pre-added sum, replay_codec.cuh) gives
// f32_to_f16_sr's bits for every r <= 12 and non-NaN x: each fp32 exponent from subnormals to
// above fp16's range with every 13-bit discarded field, a strided sweep of all magnitudes, and
// every random value at the edges of each range (binade carries, the subnormal range, the
// saturation at 65504, Inf), and subnormal sums just short of a multiple of 2^-24; both signs; the
// pair's two halves swapped each time.
TEST(DeviceCodecs, ShortStochasticRoundingMatchesReference) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  std::vector<float> xs;
  std::vector<uint32_t> rs;
  auto add = [&](uint32_t a, uint32_t random) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      xs.push_back(bits_f32(a | sign));
      rs.push_back(random);
    }
  };
  for (uint32_t e = 0; e <= 0x90; ++e)
    for (uint32_t field = 0; field < (1u << 13); field += 1 + (e % 3))
      add((e << 23) | (rng() & 0x7fe000u) | field, rng());
  for (uint32_t a = 0; a < 0x7f800000u; a += 0x3fffdu) add(a, rng());
  add(0x7f800000u, rng());
  // Subnormal results whose exact |x| + A falls just short of a multiple of 2^-24, where only an
  // addition toward zero keeps the fp16 value (test_formats has the same cases).
  for (int r = 1; r <= kSrFastMaxBits; ++r)
    for (uint32_t R : {0u, 1u, (1u << r) - 1u, uint32_t(rng()) & ((1u << r) - 1u)})
      for (uint32_t k : {1u, 2u, 3u, 1023u, 1024u}) {
        const float target = float(k) * 0x1p-24f - std::ldexp(2.f * float(R) + 1.f, -r - 25);
        for (uint32_t below = 1; below <= 3; ++below) add(f32_bits(target) - below, R);
      }
  for (uint32_t R = 0; R < 4096; ++R)
    for (uint32_t a :
         {0x00000000u, 0x00000001u, 0x33000000u, 0x337fffffu, 0x387fe000u, 0x387fffffu, 0x38800000u,
          0x38801fffu, 0x477fe000u, 0x477fe001u, 0x477fffffu, 0x7f7fffffu})
      add(a, R);
  // Pairs (x[2i], x[2i+1]) as listed and, in a second pass, swapped.
  const size_t n = xs.size();
  std::vector<float> x2(2 * n);
  std::vector<uint32_t> r2(2 * n);
  for (size_t i = 0; i < n; ++i) {
    x2[i] = xs[i], r2[i] = rs[i];
    x2[n + (i ^ 1)] = xs[i], r2[n + (i ^ 1)] = rs[i];
  }
  const int pairs = int(n);  // 2n values
  float* dx = nullptr;
  uint32_t *dr = nullptr, *dw = nullptr;
  CUDA_OK(cudaMalloc(&dx, x2.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dr, r2.size() * sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&dw, size_t(pairs) * sizeof(uint32_t)));
  CUDA_OK(cudaMemcpy(dx, x2.data(), x2.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dr, r2.data(), r2.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  std::vector<uint32_t> words(pairs);
  uint64_t checked = 0;
  for (int r = 1; r <= kSrFastMaxBits; ++r) {
    sr_pairs_kernel<<<(pairs + 255) / 256, 256>>>(dx, dr, r, dw, pairs);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(words.data(), dw, words.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int i = 0; i < pairs; ++i) {
      for (int half = 0; half < 2; ++half) {
        const float x = x2[2 * i + half];
        const uint16_t want = f32_to_f16_sr(x, r2[2 * i + half], r);
        const uint16_t got = uint16_t(words[i] >> (16 * half));
        ASSERT_EQ(got, want) << "x bits " << std::hex << f32_bits(x) << " random "
                             << r2[2 * i + half] << std::dec << " r " << r;
        ++checked;
      }
    }
  }
  cudaFree(dx);
  cudaFree(dr);
  cudaFree(dw);
  EXPECT_GT(checked, 10'000'000u);
}

// The row encoders of the flush (replay_codec.cuh), one row of 128 elements per 16 lanes, each
// from the amax that row_amax forms for two rows at once from their lane amaxes, as prepare_rows
// does (the lane's own row and the row R / 2 further on; the codes and scales show whether it is
// the row's amax).
// amax_ok[lane] = 1 where both rows' amaxes and block amaxes agree bit for bit with chunk_amax's
// of each row alone (the two rows' exchanges, side by side, do not mix).
constexpr int kRowLen = 128, kRowLanes = kRowLen / 8;
__global__ void row_encoders_kernel(const float* rows /*[R, 128]*/, int R, uint2* e4m3 /*[R, 16]*/,
                                    float* e4m3_scale /*[R]*/, uint2* int8 /*[R, 16]*/,
                                    float* int8_scale /*[R]*/, uint32_t* nvfp4 /*[R, 16]*/,
                                    uint8_t* block_scale /*[R, 8]*/, float* nvfp4_scale /*[R]*/,
                                    int* amax_ok /*[R, 16]*/) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;  // R * 16 threads, whole warps
  const int row = t / kRowLanes, lane = t % kRowLanes;
  if (row >= R) return;                 // whole rows: the 16 lanes of a row leave together
  const int other = (row + R / 2) % R;  // R % 8 == 0: both rows' lanes are whole 16-lane groups
  float v[2][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[0][i] = rows[size_t(row) * kRowLen + lane * 8 + i];
    v[1][i] = rows[size_t(other) * kRowLen + lane * 8 + i];
  }
  float amax[2] = {cuda::lane_amax8(v[0]), cuda::lane_amax8(v[1])}, pair[2];
  cuda::row_amax(amax, kRowLanes, pair);
  bool ok = true;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float pair1;
    const float amax1 = cuda::chunk_amax(v[r], kRowLanes, &pair1);
    ok = ok && __float_as_uint(amax1) == __float_as_uint(amax[r]) &&
         __float_as_uint(pair1) == __float_as_uint(pair[r]);
  }
  amax_ok[t] = ok;
  float rv[8];
  uint2 codes;
  const float s8 = cuda::encode8_row8bit<true>(v[0], amax[0], codes, rv);
  e4m3[t] = codes;
  const float si = cuda::encode8_row8bit<false>(v[0], amax[0], codes, rv);
  int8[t] = codes;
  uint32_t packed;
  uint8_t bs;
  const float s4 = cuda::encode8_nvfp4(v[0], amax[0], pair[0], packed, bs, rv);
  nvfp4[t] = packed;
  if ((lane & 1) == 0) block_scale[row * (kRowLen / 16) + lane / 2] = bs;
  if (lane == 0) e4m3_scale[row] = s8, int8_scale[row] = si, nvfp4_scale[row] = s4;
}

// The 8-bit and NVFP4 row encoders on the device (branch-free, their factors from
// live_row_factor) give the CPU reference's codes and scales bit for bit: rows whose amax spans
// every binade a live row can have (2^-100 to FLT_MAX), rows at the edges (amax just below and at
// 2^-100, FLT_MAX), zero rows, and rows with zero and tied elements.
TEST(DeviceCodecs, RowEncodersMatchReference) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> rows;
  auto add_row = [&](float scale, float zero_share) {
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int i = 0; i < kRowLen; ++i)
      rows.push_back(u(rng) < zero_share ? 0.f
                                         : scale * (std::clamp(normal(rng), -3.f, 3.f) / 3.f));
  };
  for (int e = -112; e <= 127; ++e)
    for (int k = 0; k < 24; ++k)
      add_row(std::ldexp(1.f + float(k) / 24.f, e), k % 4 == 0 ? .5f : 0.f);
  for (int k = 0; k < 64; ++k) add_row(0x1.fffffep127f, 0.f);  // amax up to FLT_MAX
  add_row(0.f, 0.f);                                           // zero row
  for (const float amax : {0x1.fffffep-101f, 0x1p-100f, 0x1.000002p-100f, 1.f, 448.f}) {
    add_row(amax, .3f);  // then the row's largest magnitude set to amax exactly
    float* r = rows.data() + rows.size() - kRowLen;
    r[rng() % kRowLen] = (rng() & 1) ? amax : -amax;
    for (int i = 0; i < kRowLen; ++i) r[i] = std::clamp(r[i], -amax, amax);
  }
  while (rows.size() / kRowLen % 8 != 0) add_row(0.f, 0.f);  // whole warps (the shuffles)
  for (const float x : rows) ASSERT_TRUE(std::isfinite(x));  // the encoders' inputs are sanitized
  const int R = int(rows.size()) / kRowLen;
  float *d_rows = nullptr, *d_scales = nullptr;
  uint2* d_codes = nullptr;
  uint32_t* d_nvfp4 = nullptr;
  uint8_t* d_bs = nullptr;
  int* d_ok = nullptr;
  const int lanes = R * kRowLanes;
  CUDA_OK(cudaMalloc(&d_rows, rows.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_scales, 3 * size_t(R) * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_codes, 2 * size_t(lanes) * sizeof(uint2)));
  CUDA_OK(cudaMalloc(&d_nvfp4, size_t(lanes) * sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&d_bs, size_t(R) * (kRowLen / 16)));
  CUDA_OK(cudaMalloc(&d_ok, size_t(lanes) * sizeof(int)));
  CUDA_OK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
  row_encoders_kernel<<<(lanes + 127) / 128, 128>>>(d_rows, R, d_codes, d_scales, d_codes + lanes,
                                                    d_scales + R, d_nvfp4, d_bs, d_scales + 2 * R,
                                                    d_ok);
  CUDA_OK(cudaGetLastError());
  std::vector<uint2> codes(2 * size_t(lanes));
  std::vector<float> scales(3 * size_t(R));
  std::vector<uint32_t> packed(lanes);
  std::vector<uint8_t> bs(size_t(R) * (kRowLen / 16));
  std::vector<int> ok(lanes);
  CUDA_OK(cudaMemcpy(codes.data(), d_codes, codes.size() * sizeof(uint2), cudaMemcpyDeviceToHost));
  CUDA_OK(
      cudaMemcpy(scales.data(), d_scales, scales.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(
      cudaMemcpy(packed.data(), d_nvfp4, packed.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(bs.data(), d_bs, bs.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ok.data(), d_ok, ok.size() * sizeof(int), cudaMemcpyDeviceToHost));
  cudaFree(d_rows), cudaFree(d_scales), cudaFree(d_codes), cudaFree(d_nvfp4), cudaFree(d_bs);
  cudaFree(d_ok);
  // The device's codes as bytes in element order (little-endian words).
  auto bytes_of = [](const void* p, size_t i) { return static_cast<const uint8_t*>(p)[i]; };
  int live = 0;
  for (int r = 0; r < R; ++r) {
    const float* row = rows.data() + size_t(r) * kRowLen;
    uint8_t want_e4m3[kRowLen], want_nvfp4[kRowLen / 2], want_bs[kRowLen / 16];
    int8_t want_int8[kRowLen];
    const float s8 = encode_row_e4m3(row, kRowLen, want_e4m3);
    const float si = encode_row_int8(row, kRowLen, want_int8);
    const float s4 = encode_row_nvfp4(row, kRowLen, want_nvfp4, want_bs);
    live += s8 != 0.f;
    ASSERT_EQ(f32_bits(scales[r]), f32_bits(s8)) << "row " << r;
    ASSERT_EQ(f32_bits(scales[R + r]), f32_bits(si)) << "row " << r;
    ASSERT_EQ(f32_bits(scales[2 * R + r]), f32_bits(s4)) << "row " << r;
    const uint2* e4 = codes.data() + size_t(r) * kRowLanes;
    const uint2* i8 = codes.data() + lanes + size_t(r) * kRowLanes;
    for (int i = 0; i < kRowLen; ++i) {
      ASSERT_EQ(bytes_of(e4, i), want_e4m3[i]) << "row " << r << " element " << i;
      ASSERT_EQ(bytes_of(i8, i), uint8_t(want_int8[i])) << "row " << r << " element " << i;
    }
    for (int i = 0; i < kRowLen / 2; ++i)
      ASSERT_EQ(bytes_of(packed.data() + size_t(r) * kRowLanes, i), want_nvfp4[i])
          << "row " << r << " byte " << i;
    for (int b = 0; b < kRowLen / 16; ++b)
      ASSERT_EQ(bs[size_t(r) * (kRowLen / 16) + b], want_bs[b]) << "row " << r << " block " << b;
    for (int l = 0; l < kRowLanes; ++l) ASSERT_EQ(ok[size_t(r) * kRowLanes + l], 1) << "row " << r;
  }
  EXPECT_GT(live, 5000);   // rows of every binade from 2^-100 up
  EXPECT_LT(live, R - 1);  // and zero rows
}

}  // namespace
}  // namespace replayssm
