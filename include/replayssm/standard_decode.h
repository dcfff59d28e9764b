// The standard-decode baseline: what serving engines run today (SPEC section 1). The full state
// is read, the T tokens are applied one by one in FP32, and the state is written after every
// token: in place when T == 1, or into T separate buffers for speculative decoding so that any
// prefix can be kept. It is the baseline of every benchmark and a second oracle for tests.
#pragma once

#include <cstdint>

#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm {

struct StandardDecodeConfig {
  // State element type: f32, bf16 or f16; f16 with stochastic_rounding is "fp16-sr".
  DType state_dtype = DType::f32;
  bool stochastic_rounding = false;
  int sr_bits = 7;
  int philox_rounds = 10;
  uint64_t seed = 0;
  int layer = 0;
  // Philox counter of the SR bits: (request = slot index, flush index = step, element index).
  uint32_t step = 0;
};

// state:        [S, H, P, N] in state_dtype; row slots[b] is request b's state.
// slots:        i32 [B] (kPaddingSlot skipped).
// x [B,T,H,P], B/C [B,T,G,N] (f32, bf16 or f16, all the same), dt [B,T,H] f32, y [B,T,H,P].
// intermediate: nullptr for T == 1 in place; else [B, T, H, P, N] in state_dtype, receiving the
//               state after each token while `state` is left unchanged.
void standard_decode(BackendKind backend, const SsmShape& shape, const LayerParams& params,
                     const StandardDecodeConfig& config, const TensorView& state,
                     const TensorView& slots, const TensorView& x, const TensorView& B,
                     const TensorView& C, const TensorView& dt, const TensorView& y,
                     const TensorView* intermediate);

}  // namespace replayssm
