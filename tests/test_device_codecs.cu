// Device forms of the codecs that differ in formulation from core/formats.h's, run on the GPU
// element by element against the CPU reference (label gpu; skipped without a device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/formats.h"
#include "cuda/cuda_backend.h"
#include "cuda/replay_codec.cuh"

namespace replayssm {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// words[i] = the short-form SR of the pair (x[2i], x[2i+1]) with random words (random[2i],
// random[2i+1]) and r bits.
__global__ void sr_pairs_kernel(const float* x /*[2n]*/, const uint32_t* random /*[2n]*/, int r,
                                uint32_t* words /*[n]*/, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  words[i] = cuda::f16x2_sr_short(x[2 * i], x[2 * i + 1], cuda::sr_addend(random[2 * i], r),
                                  cuda::sr_addend(random[2 * i + 1], r));
}

// The device's short form (cvt.rz.satfinite on a pre-added sum, replay_codec.cuh) gives
// f32_to_f16_sr's bits for every r <= 12 and non-NaN x: each fp32 exponent from subnormals to
// above fp16's range with every 13-bit discarded field, a strided sweep of all magnitudes, and
// every random value at the edges of each range (the binade carries of the subnormal lift, the
// saturation at 65504, Inf); both signs; the pair's two halves swapped each time.
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

}  // namespace
}  // namespace replayssm
