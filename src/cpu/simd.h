// The two inner loops of the CPU backend, written so the compiler vectorises them: eight
// independent partial sums, combined in a fixed order (so results do not depend on the
// vector width the compiler picks).
#pragma once

namespace replayssm::cpu {

inline float combine_lanes(const float (&lanes)[8]) {
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// sum_i a[i] * b[i]
inline float dot(const float* a /*[n]*/, const float* b /*[n]*/, int n) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return combine_lanes(lanes) + tail;
}

// One token of the recurrence on a state row: s = a s + dx b, returning sum_i s[i] c[i].
inline float update_and_dot(float* s /*[n]*/, float a, float dx, const float* b /*[n]*/,
                            const float* c /*[n]*/, int n) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      s[i + l] = a * s[i + l] + dx * b[i + l];
      lanes[l] += s[i + l] * c[i + l];
    }
  }
  float tail = 0.0f;
  for (; i < n; ++i) {
    s[i] = a * s[i] + dx * b[i];
    tail += s[i] * c[i];
  }
  return combine_lanes(lanes) + tail;
}

}  // namespace replayssm::cpu
