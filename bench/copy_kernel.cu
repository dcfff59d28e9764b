// Device-to-device copy kernel of bench_decode: the measured copy-bandwidth ceiling.
#include <cuda_runtime.h>

#include <cstddef>

namespace {
__global__ void copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
}  // namespace

void cuda_copy_kernel_for_bench(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  copy_kernel<<<132 * 16, 256, 0, stream>>>(static_cast<uint4*>(dst),
                                            static_cast<const uint4*>(src), bytes / 16);
}
