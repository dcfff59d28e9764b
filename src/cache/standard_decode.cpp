#include "replayssm/standard_decode.h"

#include "cache/validate.h"
#include "cpu/standard_decode.h"
#include "replayssm/error.h"

#if defined(REPLAYSSM_WITH_CUDA) && __has_include("cuda/cuda_backend.h")
#include "cuda/cuda_backend.h"
#define REPLAYSSM_CUDA_BACKEND 1
#endif

namespace replayssm {

void standard_decode(BackendKind backend, const SsmShape& shape, const LayerParams& params,
                     const StandardDecodeConfig& config, const TensorView& state,
                     const TensorView& slots, const TensorView& x, const TensorView& B,
                     const TensorView& C, const TensorView& dt, const TensorView& y,
                     const TensorView* intermediate) {
  const char* op = "standard_decode";
  shape.validate();
  params.validate(shape);
  const MemoryKind memory = backend == BackendKind::cpu ? MemoryKind::host : MemoryKind::cuda;
  check(state.dtype == DType::f32 || state.dtype == DType::bf16 || state.dtype == DType::f16, op,
        ": state dtype must be fp32, bf16 or fp16, got ", state.describe());
  check(!config.stochastic_rounding || state.dtype == DType::f16, op,
        ": stochastic rounding needs an fp16 state, got ", state.describe());
  check(config.sr_bits >= 1 && config.sr_bits <= 13, op, ": sr_bits ", config.sr_bits,
        " must be in 1..13");
  check(state.shape.size() == 4 && state.shape[0] >= 1, op, ": state must be [S, H, P, N], got ",
        state.describe());
  const int64_t S = state.shape[0];
  check_view(state, op, "state", {state.dtype}, {S, shape.nheads, shape.headdim, shape.dstate},
             memory);
  check(slots.dtype == DType::i32 && slots.shape.size() == 1, op,
        ": slots must be a 1-D i32 tensor, got ", slots.describe());
  check(x.shape.size() == 4 && x.shape[1] >= 1, op, ": x must be [B, T, H, P], got ", x.describe());
  const int64_t batch = slots.shape[0], tokens = x.shape[1];
  check_token_views(op, shape, x.dtype, memory, batch, tokens, x, B, C, dt, y);
  if (intermediate) {
    check_view(*intermediate, op, "intermediate", {state.dtype},
               {batch, tokens, shape.nheads, shape.headdim, shape.dstate}, memory);
  } else {
    check(tokens == 1, op, ": T = ", tokens,
          " tokens need an intermediate buffer [B, T, H, P, N] (in-place update is for T = 1)");
  }
  if (slots.memory == MemoryKind::host) {
    for (int64_t b = 0; b < batch; ++b) {
      const int slot = slots.as<const int32_t>()[b];
      check(slot == kPaddingSlot || (slot >= 0 && slot < S), op, ": slot ", slot,
            " is outside the state's 0..", S - 1);
    }
  }
  if (backend == BackendKind::cpu) {
    cpu_standard_decode(shape, params, config, state, slots, x, B, C, dt, y, intermediate);
    return;
  }
#ifdef REPLAYSSM_CUDA_BACKEND
  cuda_standard_decode(shape, params, config, state, slots, x, B, C, dt, y, intermediate);
#else
  fail(op, ": the cuda backend is not available in this build");
#endif
}

}  // namespace replayssm
