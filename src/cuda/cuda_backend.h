// The CUDA backend of the replay cache and the CUDA standard-decode baseline (docs/cuda.md).
//
// All slot storage lives in device memory, one SlotLayout image per slot, and the cursors in a
// device array, so verify and commit never synchronise with the host: a step can be captured in a
// CUDA graph. Errors that depend on device state (commit above pending, a closed slot, NaN/Inf
// inputs) set a device error word, leave that slot unchanged, and are thrown as replayssm::Error
// by the next host-synchronising call (cursors, state, read_slot, stats, synchronize, ...).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "cache/backend.h"
#include "replayssm/standard_decode.h"

namespace replayssm {

std::unique_ptr<CacheBackend> make_cuda_backend(const SsmShape& shape, const LayerParams& params,
                                                const CacheConfig& config);

// True when a CUDA device can be used.
bool cuda_device_available();

// The stream a CUDA backend runs on (capture verify + commit on it to build a graph), and a
// synchronisation that throws the first pending device-side error. `backend` must come from
// make_cuda_backend. A kernel launched on this stream as a programmatic dependent launch must
// call cudaGridDependencySynchronize() before it reads what the backend wrote: the decode step
// of small batches (small_step_kernel) lets the next kernel start before it completes.
cudaStream_t cuda_backend_stream(CacheBackend& backend);
void cuda_backend_synchronize(CacheBackend& backend);

// standard_decode (replayssm/standard_decode.h) on device tensors, enqueued on `stream`.
void cuda_standard_decode(const SsmShape& shape, const LayerParams& params,
                          const StandardDecodeConfig& config, const TensorView& state,
                          const TensorView& slots, const TensorView& x, const TensorView& B,
                          const TensorView& C, const TensorView& dt, const TensorView& y,
                          const TensorView* intermediate, cudaStream_t stream = nullptr);

}  // namespace replayssm
