// Unsigned division by a divisor fixed before a kernel runs, as a multiply-high and shifts
// (Granlund and Montgomery, "Division by invariant integers using multiplication", PLDI 1994,
// figure 4.1): the flush's per-item indices (entry = item / H, group = head / (H / G)) without
// the ~20-instruction integer division the hardware lacks.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "replayssm/error.h"

namespace replayssm {

struct FastDiv {
  uint32_t divisor = 1;
  uint32_t magic = 1;               // floor(2^32 (2^l - d) / d) + 1, l = ceil(log2 d)
  uint32_t shift1 = 0, shift2 = 0;  // min(l, 1), max(l - 1, 0)

  static FastDiv make(uint32_t d) {
    check(d >= 1, "FastDiv: divisor ", d, " must be positive");
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    FastDiv f;
    f.divisor = d;
    f.magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << l) - d)) / d + 1);
    f.shift1 = l < 1 ? l : 1;
    f.shift2 = l > 1 ? l - 1 : 0;
    return f;
  }
  // n / d for every 32-bit n: t = floor(m n / 2^32), q = (t + ((n - t) >> s1)) >> s2.
  RSSM_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(magic, n);
#else
    const uint32_t t = uint32_t((uint64_t(magic) * n) >> 32);
#endif
    return (t + ((n - t) >> shift1)) >> shift2;
  }
  RSSM_HD uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

}  // namespace replayssm
