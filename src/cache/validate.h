// Checks of the tensor views handed to the public API, shared by the cache facade and the
// standard-decode entry point. Each failure names the argument, what was expected and what came.
#pragma once

#include <initializer_list>
#include <string_view>

#include "replayssm/types.h"

namespace replayssm {

void check_view(const TensorView& view, std::string_view op, std::string_view name,
                std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape,
                MemoryKind memory);

// The per-token argument set: x [B,T,H,P], B/C [B,T,G,N] in `act`, dt [B,T,H] fp32, y [B,T,H,P]
// fp32 or `act`.
void check_token_views(std::string_view op, const SsmShape& shape, DType act, MemoryKind memory,
                       int64_t batch, int64_t tokens, const TensorView& x, const TensorView& B,
                       const TensorView& C, const TensorView& dt, const TensorView& y);

}  // namespace replayssm
