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

BackendBuffer::BackendBuffer(BackendKind backend, DType dtype, std::vector<int64_t> shape)
    : view_{nullptr, dtype, std::move(shape), MemoryKind::host} {
  const size_t bytes = view_.nbytes();
  if (backend == BackendKind::cpu) {
    host_.assign(bytes, 0);
    view_.data = host_.data();
    return;
  }
#if REPLAYSSM_WITH_CUDA
  cuda_check(cudaMalloc(&view_.data, bytes ? bytes : 1), "cudaMalloc");
  view_.memory = MemoryKind::cuda;
  zero(0, view_.numel());
#else
  fail("this build has no CUDA support");
#endif
}

BackendBuffer::~BackendBuffer() {
#if REPLAYSSM_WITH_CUDA
  if (view_.memory == MemoryKind::cuda) cudaFree(view_.data);
#endif
}

TensorView BackendBuffer::slice(int64_t offset, std::vector<int64_t> shape) const {
  TensorView v = view_;
  v.data = static_cast<uint8_t*>(view_.data) + size_t(offset) * dtype_size(view_.dtype);
  v.shape = std::move(shape);
  return v;
}

void BackendBuffer::zero(int64_t offset, int64_t count) {
  void* dst = slice(offset, {count}).data;
  const size_t bytes = size_t(count) * dtype_size(view_.dtype);
  if (view_.memory == MemoryKind::host) {
    std::memset(dst, 0, bytes);
    return;
  }
#if REPLAYSSM_WITH_CUDA
  cuda_check(cudaMemset(dst, 0, bytes), "memset");
#endif
}

void BackendBuffer::copy_from(const BackendBuffer& src, int64_t src_offset, int64_t dst_offset,
                              int64_t count) {
  check(src.view_.dtype == view_.dtype && src.view_.memory == view_.memory,
        "BackendBuffer: copy between different dtypes or memories");
  void* dst = slice(dst_offset, {count}).data;
  const void* from = src.slice(src_offset, {count}).data;
  const size_t bytes = size_t(count) * dtype_size(view_.dtype);
  if (view_.memory == MemoryKind::host) {
    std::memcpy(dst, from, bytes);
    return;
  }
#if REPLAYSSM_WITH_CUDA
  cuda_check(cudaMemcpy(dst, from, bytes, cudaMemcpyDeviceToDevice), "copy on the device");
#endif
}

void BackendBuffer::copy_to_host(int64_t offset, int64_t count, void* host) const {
  const void* from = slice(offset, {count}).data;
  const size_t bytes = size_t(count) * dtype_size(view_.dtype);
  if (view_.memory == MemoryKind::host) {
    std::memcpy(host, from, bytes);
    return;
  }
#if REPLAYSSM_WITH_CUDA
  cuda_check(cudaMemcpy(host, from, bytes, cudaMemcpyDeviceToHost), "copy to host");
#endif
}

}  // namespace replayssm::io
