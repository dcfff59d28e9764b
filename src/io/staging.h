// Host tensors handed to a backend: the CPU backend takes host views as they are; the CUDA
// backend wants its token tensors in device memory, so they are copied there and back. Slot and
// accepted lists stay on the host (the facade validates host lists completely).
#pragma once

#include <cstdint>
#include <vector>

#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm::io {

class Staged {
 public:
  // Copies `host` (numel of `shape` elements of `dtype`) to the backend's memory when needed.
  Staged(BackendKind backend, const void* host, DType dtype, std::vector<int64_t> shape);
  ~Staged();
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  const TensorView& view() const { return view_; }
  // Copies the backend's tensor back into `host` (a no-op for host tensors viewed in place).
  void copy_to_host(void* host) const;

 private:
  TensorView view_;
  void* device_ = nullptr;
};

// Zero-initialised storage owned in the backend's memory (host memory on the CPU backend, device
// memory on CUDA), for state that lives there between calls: the model runner's dense SSM states
// of the standard-decode path. Offsets and counts are in elements of `dtype`. The CUDA copies run
// on the legacy default stream, so they are ordered after kernels enqueued there.
class BackendBuffer {
 public:
  BackendBuffer(BackendKind backend, DType dtype, std::vector<int64_t> shape);
  ~BackendBuffer();
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  const TensorView& view() const { return view_; }
  // A view of `shape` starting at element `offset` (the caller keeps it inside the buffer).
  TensorView slice(int64_t offset, std::vector<int64_t> shape) const;
  void zero(int64_t offset, int64_t count);
  // Copies `count` elements of `src` (same backend and dtype) from src_offset to dst_offset.
  void copy_from(const BackendBuffer& src, int64_t src_offset, int64_t dst_offset, int64_t count);
  void copy_to_host(int64_t offset, int64_t count, void* host) const;

 private:
  TensorView view_;
  std::vector<uint8_t> host_;  // the CPU backend's storage
};

}  // namespace replayssm::io
