#include "io/staging.h"

#include <cstring>

#include "replayssm/error.h"

#if REPLAYSSM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace replayssm::io {

#if REPLAYSSM_WITH_CUDA
namespace {
void cuda_check(cudaError_t status, const char* what) {
  check(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}
}  // namespace
#endif

Staged::Staged(BackendKind backend, const void* host, DType dtype, std::vector<int64_t> shape)
    : view_{const_cast<void*>(host), dtype, std::move(shape), MemoryKind::host} {
  if (backend == BackendKind::cpu) return;
#if REPLAYSSM_WITH_CUDA
  const size_t bytes = view_.nbytes();
  cuda_check(cudaMalloc(&device_, bytes ? bytes : 1), "cudaMalloc");
  if (bytes) cuda_check(cudaMemcpy(device_, host, bytes, cudaMemcpyHostToDevice), "copy to device");
  view_.data = device_;
  view_.memory = MemoryKind::cuda;
#else
  fail("this build has no CUDA support");
#endif
}

Staged::~Staged() {
#if REPLAYSSM_WITH_CUDA
  if (device_) cudaFree(device_);
#endif
}

void Staged::copy_to_host(void* host) const {
  if (!device_) {
    if (host != view_.data) std::memcpy(host, view_.data, view_.nbytes());
    return;
  }
#if REPLAYSSM_WITH_CUDA
  cuda_check(cudaMemcpy(host, device_, view_.nbytes(), cudaMemcpyDeviceToHost), "copy to host");
#endif
}

}  // namespace replayssm::io
