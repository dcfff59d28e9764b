// SplitMix64 (Steele, Lea, Flood 2014): the 64-bit mixer used wherever the host needs cheap,
// reproducible pseudo-random values from a counter or a seed (random weights, drift streams,
// per-request sampling seeds). Not for the stochastic-rounding bits: those come from Philox
// (core/philox.h, SPEC 6).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace replayssm {

inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;  // the Weyl increment

// The output function alone: a bijection of 64-bit values with good avalanche.
RSSM_HD uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One step of the generator from state z: finalize(z + gamma).
RSSM_HD uint64_t splitmix64(uint64_t z) { return splitmix64_finalize(z + kSplitMixGamma); }

}  // namespace replayssm
