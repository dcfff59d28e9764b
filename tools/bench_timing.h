// Step timing for `replayssm bench`: the median time per step over repeated runs of a sequence of
// steps, after a warm-up run. On the CPU the steps run directly under a steady clock; on CUDA they
// are captured once into a CUDA graph on the given stream and timed with events (METHOD: graphs
// remove the launch gaps of small kernels).
#pragma once

#include <functional>
#include <string>

#include "replayssm/cache.h"

namespace replayssm::cli {

// Median microseconds per step. `stream` is a cudaStream_t for BackendKind::cuda, unused on cpu.
// cold_cache: the caches are scrubbed before every step (twice the L2 on CUDA, 64 MiB on the
// CPU) and only the steps themselves are timed: what a layer-step costs when the other layers of
// a model have run in between, as they do in service.
double time_steps(BackendKind backend, void* stream, int steps, int repeats, bool cold_cache,
                  const std::function<void(int step)>& step);

// The ceiling the kernels are held to: bytes read plus bytes written per second (GB/s) of a large
// copy in the backend's memory (a device-to-device cudaMemcpyAsync of 2 x 512 MiB on CUDA, timed
// with events; an OpenMP-parallel memcpy of 2 x 256 MiB on the CPU), median of `repeats`.
double copy_bandwidth_gbs(BackendKind backend, void* stream, int repeats);

// What the timings ran on, for the record beside them: on CUDA the current device's name, SM
// count and rated peak SM and memory clocks (the runtime reports no current clocks; nvidia-smi
// does), on the CPU the OpenMP thread count.
std::string device_description(BackendKind backend);

// A fresh non-blocking CUDA stream (cuda builds only), for work outside a cache's own stream.
void* new_cuda_stream();

}  // namespace replayssm::cli
