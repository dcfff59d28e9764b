// The CPU reference backend: every operation of SPEC sections 3-5, written plainly, threaded over
// (slot, head) with OpenMP. Every other backend is tested against it.
#pragma once

#include <memory>

#include "cache/backend.h"

namespace replayssm {

std::unique_ptr<CacheBackend> make_cpu_backend(const SsmShape& shape, const LayerParams& params,
                                               const CacheConfig& config);

}  // namespace replayssm
