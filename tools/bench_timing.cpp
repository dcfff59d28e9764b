#include "bench_timing.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "replayssm/error.h"

#if REPLAYSSM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace replayssm::cli {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

#if REPLAYSSM_WITH_CUDA
void cuda_check(cudaError_t err, const char* what) {
  check(err == cudaSuccess, "bench: ", what, ": ", cudaGetErrorString(err));
}
#endif

}  // namespace

double time_steps(BackendKind backend, void* stream, int steps, int repeats,
                  const std::function<void(int)>& step) {
  check(steps >= 1 && repeats >= 1, "bench: steps and repeats must be positive");
  std::vector<double> us_per_step;
  if (backend == BackendKind::cpu) {
    for (int s = 0; s < steps; ++s) step(s);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) step(s);
      const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
      us_per_step.push_back(dt.count() / steps);
    }
    return median(us_per_step);
  }
#if REPLAYSSM_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < steps; ++i) step(i);
  cuda_check(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate graph");
  cuda_check(cudaGraphLaunch(exec, s), "launch graph");  // warm-up
  cuda_check(cudaStreamSynchronize(s), "synchronize");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
  for (int r = 0; r < repeats; ++r) {
    cuda_check(cudaEventRecord(start, s), "record");
    cuda_check(cudaGraphLaunch(exec, s), "launch graph");
    cuda_check(cudaEventRecord(stop, s), "record");
    cuda_check(cudaEventSynchronize(stop), "synchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "elapsed time");
    us_per_step.push_back(1000.0 * ms / steps);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return median(us_per_step);
#else
  (void)stream;
  fail("bench: this build has no CUDA support");
#endif
}

double copy_bandwidth_gbs(BackendKind backend, void* stream, int repeats) {
  std::vector<double> gbs;
  if (backend == BackendKind::cpu) {
    const size_t bytes = size_t(256) << 20;
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);  // touched: no page faults in the timing
    const int64_t chunks = 64, chunk = int64_t(bytes / chunks);
    auto copy = [&] {
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < chunks; ++c)
        std::memcpy(dst.data() + c * chunk, src.data() + c * chunk, size_t(chunk));
    };
    copy();  // warm-up
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      copy();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      gbs.push_back(2.0 * double(bytes) / dt.count() * 1e-9);
    }
    return median(gbs);
  }
#if REPLAYSSM_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  const size_t bytes = size_t(512) << 20;
  void *src = nullptr, *dst = nullptr;
  cuda_check(cudaMalloc(&src, bytes), "allocate copy source");
  cuda_check(cudaMalloc(&dst, bytes), "allocate copy destination");
  cuda_check(cudaMemsetAsync(src, 1, bytes, s), "fill copy source");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
  for (int r = -1; r < repeats; ++r) {  // r = -1: warm-up
    cuda_check(cudaEventRecord(start, s), "record");
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy");
    cuda_check(cudaEventRecord(stop, s), "record");
    cuda_check(cudaEventSynchronize(stop), "synchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "elapsed time");
    if (r >= 0) gbs.push_back(2.0 * double(bytes) / (ms * 1e-3) * 1e-9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return median(gbs);
#else
  (void)stream;
  fail("bench: this build has no CUDA support");
#endif
}

void* new_cuda_stream() {
#if REPLAYSSM_WITH_CUDA
  cudaStream_t s;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create stream");
  return s;
#else
  fail("bench: this build has no CUDA support");
#endif
}

}  // namespace replayssm::cli
