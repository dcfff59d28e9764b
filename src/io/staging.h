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

}  // namespace replayssm::io
