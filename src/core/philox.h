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

RSSM_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}
}  // namespace detail

// `rounds` rounds (10 is the standard, Crush-resistant choice; 7 also passes BigCrush per the
// paper). Round i (0-based) uses key + i * (W0, W1). One round: the 32x32->64 products of the
// multipliers with words 0 and 2 are mixed as
//   (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)).
RSSM_HD U32x4 philox4x32(U32x4 counter, U32x2 key, int rounds = 10) {
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  uint32_t k0 = key.v[0], k1 = key.v[1];
  for (int i = 0; i < rounds; ++i) {
    if (i > 0) {
      k0 += detail::kPhiloxW0;  // wraps mod 2^32 by design
      k1 += detail::kPhiloxW1;
    }
    const uint32_t hi0 = detail::mulhi32(detail::kPhiloxM0, c0);
    const uint32_t lo0 = detail::kPhiloxM0 * c0;
    const uint32_t hi1 = detail::mulhi32(detail::kPhiloxM1, c2);
    const uint32_t lo1 = detail::kPhiloxM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return U32x4{{c0, c1, c2, c3}};
}

}  // namespace replayssm
