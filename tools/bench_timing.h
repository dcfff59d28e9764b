// Step timing for `replayssm bench`: the median time per step over repeated runs of a sequence of
// steps, after a warm-up run. On the CPU the steps run directly under a steady clock; on CUDA they
// are captured once into a CUDA graph on the given stream and timed with events (METHOD: graphs
// remove the launch gaps of small kernels).
#pragma once

#include <functional>

#include "replayssm/cache.h"

namespace replayssm::cli {

// Median microseconds per step. `stream` is a cudaStream_t for BackendKind::cuda, unused on cpu.
double time_steps(BackendKind backend, void* stream, int steps, int repeats,
                  const std::function<void(int step)>& step);

// A fresh non-blocking CUDA stream (cuda builds only), for work outside a cache's own stream.
void* new_cuda_stream();

}  // namespace replayssm::cli
