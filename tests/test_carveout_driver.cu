// What the step's shared-memory carveout (cuda::step_carveout, replay_launch.h) assumes of the
// driver, observed on the device (label gpu; skipped without one): a launch's preferred carveout
// gives a configuration that holds the need it was computed from, eagerly and inside a CUDA graph,
// and two kernels launched with one preference share SMs, the second (a programmatic dependent
// launch) starting beside the first one's blocks. ncu's launch__shared_mem_config_size does not
// show a launch attribute's configuration (it reports the function's own), so the configuration
// is read from residency: each block records its SM and its start and end times.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.cuh"
#include "cuda/replay_launch.h"
#include "cuda_test_util.h"

namespace replayssm {
namespace {

struct BlockSpan {
  uint32_t sm;
  uint64_t start_ns, end_ns;
};

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Each block touches its dynamic shared memory, holds its SM for hold_ns and records its span.
__global__ void hold_kernel(BlockSpan* spans /*[gridDim.x]*/, uint64_t hold_ns,
                            int release_dependents) {
  extern __shared__ int scratch[];
  if (release_dependents) asm volatile("griddepcontrol.launch_dependents;");
  scratch[threadIdx.x] = int(threadIdx.x);
  __syncthreads();
  const uint64_t start = global_ns();
  while (global_ns() - start < hold_ns) {
  }
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) spans[blockIdx.x] = {sm, start, global_ns()};
  if (scratch[(threadIdx.x + 1) % blockDim.x] < 0) spans[0].sm = ~0u;  // keeps the stores
}

struct Launch {
  int blocks, threads;
  size_t smem;
  int carveout;  // percent, or -1 for the driver's choice
  bool dependent, release_dependents;
  uint64_t hold_ns;
  BlockSpan* spans;
};

void launch(const Launch& l, cudaStream_t stream) {
  cuda::launch_ex(hold_kernel, dim3(l.blocks), dim3(l.threads), l.smem, stream, l.dependent,
                  l.carveout, l.spans, l.hold_ns, int(l.release_dependents));
}

// Runs the launches eagerly or as one captured graph, then waits.
void run(const std::vector<Launch>& launches, bool graph, cudaStream_t stream) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (graph) CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (const Launch& l : launches) launch(l, stream);
  if (graph) {
    CUDA_OK(cudaStreamEndCapture(stream, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  if (graph) {
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(g));
  }
}

std::vector<BlockSpan> spans_of(const BlockSpan* device_spans, int blocks) {
  std::vector<BlockSpan> spans(blocks);
  EXPECT_EQ(
      cudaMemcpy(spans.data(), device_spans, blocks * sizeof(BlockSpan), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return spans;
}

// The most blocks resident on one SM at once.
int most_resident(const std::vector<BlockSpan>& spans) {
  std::vector<std::pair<uint64_t, int>> events;  // (time, +1 start / -1 end), per SM in turn
  uint32_t top_sm = 0;
  for (const BlockSpan& s : spans) top_sm = std::max(top_sm, s.sm);
  int most = 0;
  for (uint32_t sm = 0; sm <= top_sm; ++sm) {
    events.clear();
    for (const BlockSpan& s : spans)
      if (s.sm == sm) {
        events.push_back({s.start_ns, 1});
        events.push_back({s.end_ns, -1});
      }
    std::sort(events.begin(), events.end());  // an end before a start at the same time
    int resident = 0;
    for (const auto& e : events) most = std::max(most, resident += e.second);
  }
  return most;
}

class DriverCarveout : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    int sms, sm_shared, reserved, optin;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CUDA_OK(cudaDeviceGetAttribute(&sm_shared, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    CUDA_OK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0));
    CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    sms_ = sms;
    device_ = {size_t(sm_shared), size_t(reserved)};
    CUDA_OK(cudaFuncSetAttribute(hold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    CUDA_OK(cudaStreamCreate(&stream_));
    CUDA_OK(cudaMalloc(&spans_a_, kBlocksPerSm * sms_ * sizeof(BlockSpan)));
    CUDA_OK(cudaMalloc(&spans_b_, kBlocksPerSm * sms_ * sizeof(BlockSpan)));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    cudaFree(spans_a_);
    cudaFree(spans_b_);
  }
  static constexpr int kBlocksPerSm = 8;  // the spans' capacity, in blocks per SM
  int sms_ = 0;
  cuda::SmemNeed device_;
  cudaStream_t stream_ = nullptr;
  BlockSpan* spans_a_ = nullptr;
  BlockSpan* spans_b_ = nullptr;
};

// k blocks of 33 KB per SM planned as a step's need: the launch with step_carveout's percent
// holds at least k of them on an SM (a configuration that rounded the preference down would hold
// fewer), eagerly and in a graph. 33 KB blocks tell the H100's / H200's configurations apart (3
// fit 132 KB, 4 fit 164 KB, 5 fit 196 KB, 6 fit 228 KB).
TEST_F(DriverCarveout, StepCarveoutHoldsThePlannedBlocks) {
  const size_t block_bytes = 33 * 1024;
  const int fit = int(device_.sm_shared_bytes / (block_bytes + device_.reserved_per_block));
  ASSERT_GE(fit, 2) << "an SM holds fewer than two 33 KB blocks";
  for (const bool graph : {false, true})
    for (int k = 1; k <= std::min(fit, kBlocksPerSm); ++k) {
      cuda::SmemNeed need = device_;
      need.bytes = k * (block_bytes + device_.reserved_per_block);
      const int percent = cuda::step_carveout(need);
      run({{kBlocksPerSm * sms_, 128, block_bytes, percent, false, false, 20000, spans_a_}}, graph,
          stream_);
      const int resident = most_resident(spans_of(spans_a_, kBlocksPerSm * sms_));
      EXPECT_GE(resident, k) << (graph ? "graph" : "eager") << ", " << k << " planned, carveout "
                             << percent << "%";
    }
}

// A step: a long first kernel (2 blocks of 17 KB per SM, releasing its dependents at once) and a
// programmatic dependent second one (43 KB blocks), both launched with the carveout planned for
// the larger need. The second one's blocks start beside the first one's on their SMs.
TEST_F(DriverCarveout, KernelsOfOneCarveoutShareSms) {
  const size_t first_bytes = 17 * 1024, second_bytes = 43 * 1024;
  cuda::SmemNeed need = device_;
  need.bytes = 2 * (first_bytes + device_.reserved_per_block) +
               2 * (second_bytes + device_.reserved_per_block);
  ASSERT_LE(need.bytes, device_.sm_shared_bytes);
  const int percent = cuda::step_carveout(need);
  const int first_blocks = 2 * sms_, second_blocks = 4 * sms_;
  for (const bool graph : {false, true}) {
    run({{first_blocks, 256, first_bytes, percent, false, true, 40000, spans_a_},
         {second_blocks, 256, second_bytes, percent, true, false, 5000, spans_b_}},
        graph, stream_);
    const std::vector<BlockSpan> first = spans_of(spans_a_, first_blocks);
    const std::vector<BlockSpan> second = spans_of(spans_b_, second_blocks);
    int beside = 0;  // second-kernel blocks that started while a first-kernel block ran on their SM
    for (const BlockSpan& s : second)
      beside += std::any_of(first.begin(), first.end(), [&](const BlockSpan& f) {
        return f.sm == s.sm && f.start_ns < s.start_ns && s.start_ns < f.end_ns;
      });
    // All of them on the H100 (session 56); half allows for SMs the first kernel left early.
    EXPECT_GE(beside, second_blocks / 2)
        << (graph ? "graph" : "eager") << ", carveout " << percent << "%";
  }
}

}  // namespace
}  // namespace replayssm
