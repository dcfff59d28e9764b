// The synthetic acceptance process of speculative decoding used by the benchmarks, the trace
// generator and the demo: the first token of a window is always accepted, and draft i is accepted
// with probability a if every draft before it was (a truncated geometric law, the usual model of
// a drafter with a per-token acceptance rate). The committed count of a window of W tokens then
// has mean 1 + a + ... + a^(W-1).
#pragma once

#include "replayssm/error.h"

namespace replayssm {

inline double mean_accepted_length(double a, int window) {
  double mean = 0, term = 1;
  for (int i = 0; i < window; ++i, term *= a) mean += term;
  return mean;
}

// The per-draft acceptance a whose mean accepted length at `window` is `mean` (bisection; the
// mean grows with a).
inline double acceptance_for_mean(double mean, int window) {
  check(window >= 1, "synthetic acceptance: window must be >= 1, got ", window);
  check(mean >= 1.0 && mean <= double(window), "synthetic acceptance: mean accepted length ", mean,
        " is outside [1, ", window, "]");
  double lo = 0, hi = 1;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (mean_accepted_length(mid, window) < mean ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace replayssm
