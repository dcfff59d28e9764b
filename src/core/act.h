// Loads and stores of activation elements (fp32, bf16, fp16) as fp32, for host and device code.
#pragma once

#include <cstdint>

#include "core/formats.h"
#include "core/hd.h"
#include "replayssm/types.h"

namespace replayssm {

RSSM_HD float load_act(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

RSSM_HD void store_act(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::bf16:
      static_cast<uint16_t*>(base)[index] = f32_to_bf16(value);
      return;
    case DType::f16:
      static_cast<uint16_t*>(base)[index] = f32_to_f16(value);
      return;
    default:
      static_cast<float*>(base)[index] = value;
      return;
  }
}

// softplus(u) = log(1 + exp(u)), taken as u above 20 where the difference is below fp32 rounding.
RSSM_HD float softplus(float u) { return u > 20.0f ? u : log1pf(expf(u)); }

// delta = softplus(dt + dt_bias), clamped to [dt_min, dt_max] (SPEC section 2).
RSSM_HD float process_dt(float dt, float dt_bias, float dt_min, float dt_max) {
  const float delta = softplus(dt + dt_bias);
  return fminf(fmaxf(delta, dt_min), dt_max);
}

// exp of a decay exponent A * (sum of deltas), clamped at 0 so rounding never makes it grow.
RSSM_HD float decay(float exponent) { return expf(fminf(exponent, 0.0f)); }

}  // namespace replayssm
