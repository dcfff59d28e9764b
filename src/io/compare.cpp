// Tensor-by-tensor comparison of two output files (`replayssm trace check`).
#include <cmath>
#include <cstring>
#include <set>

#include "io/trace.h"

namespace replayssm::io {

bool CompareResult::ok() const {
  for (const TensorDiff& d : tensors)
    if (!d.ok()) return false;
  return true;
}

CompareResult compare_outputs(const StFile& out, const StFile& ref, double rtol, double atol) {
  std::set<std::string> names;
  for (const auto& [name, t] : out.tensors) names.insert(name);
  for (const auto& [name, t] : ref.tensors) names.insert(name);
  CompareResult result;
  for (const std::string& name : names) {
    TensorDiff d;
    d.name = name;
    auto a = out.tensors.find(name), b = ref.tensors.find(name);
    if (a == out.tensors.end()) {
      d.shape = b->second.describe();
      d.problem = "missing in OUT";
    } else if (b == ref.tensors.end()) {
      d.shape = a->second.describe();
      d.problem = "missing in REF";
    } else if (a->second.shape != b->second.shape ||
               a->second.is_floating() != b->second.is_floating() ||
               (!a->second.is_floating() && a->second.dtype != b->second.dtype)) {
      d.shape = a->second.describe() + " vs " + b->second.describe();
      d.problem = "shape or dtype differs";
    } else if (a->second.is_floating()) {
      // Float tensors of different widths compare by value, so an F16 reference can check an F32
      // output.
      d.shape = a->second.describe();
      const std::vector<double> x = a->second.as_f64(name), y = b->second.as_f64(name);
      for (size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(x[i]) || !std::isfinite(y[i])) {
          ++d.nans;
          continue;
        }
        const double diff = std::fabs(x[i] - y[i]);
        d.max_abs = std::max(d.max_abs, diff);
        if (y[i] != 0) d.max_rel = std::max(d.max_rel, diff / std::fabs(y[i]));
        if (diff > atol + rtol * std::fabs(y[i])) ++d.mismatches;
      }
    } else {
      // Integer and byte tensors (cursors, exports) must match exactly.
      d.shape = a->second.describe();
      const size_t element = st_dtype_size(a->second.dtype);
      for (size_t i = 0; i < a->second.data.size(); i += element) {
        if (std::memcmp(&a->second.data[i], &b->second.data[i], element) != 0) {
          ++d.mismatches;
          d.max_abs = std::max(d.max_abs, 1.0);
        }
      }
    }
    result.tensors.push_back(std::move(d));
  }
  return result;
}

}  // namespace replayssm::io
