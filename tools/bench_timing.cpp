#include "bench_timing.h"

#include <fmt/format.h>
#include <omp.h>

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

double time_steps(BackendKind backend, void* stream, int steps, int repeats, bool cold_cache,
                  const std::function<void(int)>& step) {
  check(steps >= 1 && repeats >= 1, "bench: steps and repeats must be positive");
  std::vector<double> us_per_step;
  if (backend == BackendKind::cpu) {
    // Cold: 64 MiB written before every step, outside the timed region, evicts the caches.
    std::vector<uint8_t> scrub(cold_cache ? size_t(64) << 20 : 0);
    for (int s = 0; s < steps; ++s) step(s);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      std::chrono::duration<double, std::micro> total{0};
      for (int s = 0; s < steps; ++s) {
        if (cold_cache) std::memset(scrub.data(), s & 0xff, scrub.size());
        const auto t0 = std::chrono::steady_clock::now();
        step(s);
        total += std::chrono::steady_clock::now() - t0;
      }
      us_per_step.push_back(total.count() / steps);
    }
    return median(us_per_step);
  }
#if REPLAYSSM_WITH_CUDA
  // The steps are captured once into a graph. Warm: events around the whole graph. Cold: a
  // memset of twice the L2 before every step evicts it, and each step is timed on its own
  // between two event nodes (cudaEventRecordExternal), so the memsets are not counted.
  auto s = static_cast<cudaStream_t>(stream);
  void* scrub = nullptr;
  size_t scrub_bytes = 0;
  std::vector<cudaEvent_t> marks(cold_cache ? 2 * size_t(steps) : 2);
  for (cudaEvent_t& e : marks) cuda_check(cudaEventCreate(&e), "event");
  if (cold_cache) {
    int device = 0, l2 = 0;
    cuda_check(cudaGetDevice(&device), "device");
    cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "L2 size");
    scrub_bytes = std::max<size_t>(2 * size_t(l2), size_t(16) << 20);
    cuda_check(cudaMalloc(&scrub, scrub_bytes), "allocate the L2 scrub buffer");
  }
  cudaGraph_t graph;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < steps; ++i) {
    if (cold_cache) {
      cuda_check(cudaMemsetAsync(scrub, i & 0xff, scrub_bytes, s), "scrub L2");
      cuda_check(cudaEventRecordWithFlags(marks[2 * size_t(i)], s, cudaEventRecordExternal),
                 "record");
    }
    step(i);
    if (cold_cache)
      cuda_check(cudaEventRecordWithFlags(marks[2 * size_t(i) + 1], s, cudaEventRecordExternal),
                 "record");
  }
  cuda_check(cudaStreamEndCapture(s, &graph), "end capture");
  cudaGraphExec_t exec;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate graph");
  cuda_check(cudaGraphLaunch(exec, s), "launch graph");  // warm-up
  cuda_check(cudaStreamSynchronize(s), "synchronize");
  for (int r = 0; r < repeats; ++r) {
    float ms = 0;
    if (cold_cache) {
      cuda_check(cudaGraphLaunch(exec, s), "launch graph");
      cuda_check(cudaStreamSynchronize(s), "synchronize");
      for (int i = 0; i < steps; ++i) {
        float one = 0;
        cuda_check(cudaEventElapsedTime(&one, marks[2 * size_t(i)], marks[2 * size_t(i) + 1]),
                   "elapsed time");
        ms += one;
      }
    } else {
      cuda_check(cudaEventRecord(marks[0], s), "record");
      cuda_check(cudaGraphLaunch(exec, s), "launch graph");
      cuda_check(cudaEventRecord(marks[1], s), "record");
      cuda_check(cudaEventSynchronize(marks[1]), "synchronize");
      cuda_check(cudaEventElapsedTime(&ms, marks[0], marks[1]), "elapsed time");
    }
    us_per_step.push_back(1000.0 * ms / steps);
  }
  for (cudaEvent_t e : marks) cudaEventDestroy(e);
  if (scrub) cudaFree(scrub);
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

std::string device_description(BackendKind backend) {
  if (backend == BackendKind::cpu) return fmt::format("{} OpenMP threads", omp_get_max_threads());
#if REPLAYSSM_WITH_CUDA
  int device = 0, sm_khz = 0, mem_khz = 0;
  cuda_check(cudaGetDevice(&device), "current device");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "device properties");
  cuda_check(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device), "clock rate");
  cuda_check(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device),
             "memory clock rate");
  return fmt::format("{}, {} SMs, peak clocks {} MHz SM / {} MHz memory", prop.name,
                     prop.multiProcessorCount, sm_khz / 1000, mem_khz / 1000);
#else
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
