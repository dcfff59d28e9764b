// Philox4x32 counter-based generator (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), the source of the stochastic-rounding bits (SPEC section 6). Being a
// pure function of (counter, key), it gives the same bits on the CPU reference and in a CUDA
// kernel for the same (seed, layer, request, flush, element), whatever the thread layout.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace replayssm {

struct U32x4 {
  uint32_t v[4];
};
struct U32x2 {
  uint32_t v[2];
};

namespace detail {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // round multipliers
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key schedule increments (Weyl sequence)
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

// One round with round key (k0, k1). The product is formed once as 64 bits (one wide multiply on
// the GPU gives both halves).
RSSM_HD void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0,
                          uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
  c0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
  c1 = static_cast<uint32_t>(p1);
  c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c3 = static_cast<uint32_t>(p0);
}
}  // namespace detail

// `rounds` rounds (10 is the standard, Crush-resistant choice; 7 also passes BigCrush per the
// paper). Round i (0-based) uses key + i * (W0, W1). One round: the 32x32->64 products of the
// multipliers with words 0 and 2 are mixed as
//   (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)).
RSSM_HD U32x4 philox4x32(U32x4 counter, U32x2 key, int rounds = 10) {
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  const uint32_t k0 = key.v[0], k1 = key.v[1];
  if (rounds == 10) {
    // The default, unrolled: the stochastic-rounding flush calls this once per 8 elements, and a
    // counted loop costs as many instructions as the rounds themselves (wraps mod 2^32 by design).
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (uint32_t i = 0; i < 10; ++i)
      detail::philox_round(c0, c1, c2, c3, k0 + i * detail::kPhiloxW0, k1 + i * detail::kPhiloxW1);
  } else {
    for (uint32_t i = 0; i < uint32_t(rounds); ++i)
      detail::philox_round(c0, c1, c2, c3, k0 + i * detail::kPhiloxW0, k1 + i * detail::kPhiloxW1);
  }
  return U32x4{{c0, c1, c2, c3}};
}

// The round keys of the 10-round generator, key + i (W0, W1) for i = 0..9. A kernel keeps them
// in its parameters (constant memory), so each round is two wide multiplies and two 3-input XORs
// with a constant operand instead of also advancing the key in registers.
struct PhiloxKeys10 {
  uint32_t k0[10], k1[10];
};

RSSM_HD PhiloxKeys10 philox_keys10(U32x2 key) {
  PhiloxKeys10 keys{};
  for (uint32_t i = 0; i < 10; ++i) {
    keys.k0[i] = key.v[0] + i * detail::kPhiloxW0;
    keys.k1[i] = key.v[1] + i * detail::kPhiloxW1;
  }
  return keys;
}

// philox4x32(counter, key, 10) with the key schedule given (the same bits).
RSSM_HD U32x4 philox4x32_10(U32x4 counter, const PhiloxKeys10& keys) {
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 10; ++i) detail::philox_round(c0, c1, c2, c3, keys.k0[i], keys.k1[i]);
  return U32x4{{c0, c1, c2, c3}};
}

}  // namespace replayssm
