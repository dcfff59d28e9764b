#include "cache/validate.h"

#include <string>

#include "replayssm/error.h"

namespace replayssm {

void check_view(const TensorView& view, std::string_view op, std::string_view name,
                std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape,
                MemoryKind memory) {
  check(view.data != nullptr || view.numel() == 0, op, ": ", name, " is a null pointer");
  bool dtype_ok = false;
  std::string allowed;
  for (DType d : dtypes) {
    dtype_ok |= view.dtype == d;
    allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  TensorView expected{nullptr, *dtypes.begin(), std::vector<int64_t>(shape), memory};
  check(dtype_ok, op, ": ", name, " must be ", allowed, ", got ", view.describe());
  check(view.shape == expected.shape, op, ": ", name, " must have shape ", expected.describe(),
        ", got ", view.describe());
  check(view.memory == memory, op, ": ", name, " must be in ",
        memory == MemoryKind::host ? "host" : "cuda", " memory for this backend, got ",
        view.describe());
}

void check_token_views(std::string_view op, const SsmShape& shape, DType act, MemoryKind memory,
                       int64_t batch, int64_t tokens, const TensorView& x, const TensorView& B,
                       const TensorView& C, const TensorView& dt, const TensorView& y) {
  const int64_t H = shape.nheads, P = shape.headdim, G = shape.ngroups, N = shape.dstate;
  check_view(x, op, "x", {act}, {batch, tokens, H, P}, memory);
  check_view(B, op, "B", {act}, {batch, tokens, G, N}, memory);
  check_view(C, op, "C", {act}, {batch, tokens, G, N}, memory);
  check_view(dt, op, "dt", {DType::f32}, {batch, tokens, H}, memory);
  check_view(y, op, "y", {DType::f32, act}, {batch, tokens, H, P}, memory);
}

}  // namespace replayssm
