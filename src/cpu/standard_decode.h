#pragma once

#include "replayssm/standard_decode.h"

namespace replayssm {

// The CPU reference of standard_decode (arguments validated by the caller).
void cpu_standard_decode(const SsmShape& shape, const LayerParams& params,
                         const StandardDecodeConfig& config, const TensorView& state,
                         const TensorView& slots, const TensorView& x, const TensorView& B,
                         const TensorView& C, const TensorView& dt, const TensorView& y,
                         const TensorView* intermediate);

}  // namespace replayssm
