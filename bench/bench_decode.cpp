// Per layer-step time of the standard-decode baseline and of the replay cache on the GPU
// (issue 5). Every configuration runs as a CUDA graph of many steps (>= 4 flush cycles for the
// replay modes), after a warm-up; the median over repeats is reported, next to the measured
// device-to-device copy bandwidth of the same process.
//
//   bench_decode [--batches 64,256] [--repeats 7] [--out results.md]
//
// Bytes per step (the "GB/s" column) count the state traffic only: standard decode reads and
// writes the state (T = 1) or reads it once and writes T states (T = 8); replay reads the read
// checkpoint once per step and, amortised by the measured flush rate, reads the recurrence
// checkpoint and writes every checkpoint at a flush. Ring traffic (x, B, delta) is not counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cache/layout.h"
#include "core/act.h"
#include "cuda/cuda_backend.h"
#include "replayssm/cache.h"
#include "replayssm/presets.h"
#include "replayssm/standard_decode.h"

using namespace replayssm;

// A plain 16-byte-per-thread device copy (grid-stride), the ceiling the kernels are held to.
void cuda_copy_kernel_for_bench(void* dst, const void* src, size_t bytes, cudaStream_t stream);

#define CK(expr)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

const SsmShape kShape{128, 64, 128, 8};  // Nemotron-H 8B

void* dalloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes));
  return p;
}

// Fills a device buffer of `count` values of `dtype` with N(0, scale) values.
void fill(void* dst, DType dtype, size_t count, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<uint8_t> host(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) store_act(host.data(), dtype, int64_t(i), normal(rng));
  CK(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice));
}

TensorView dv(void* p, DType dtype, std::vector<int64_t> shape) {
  return TensorView{p, dtype, std::move(shape), MemoryKind::cuda};
}

// Median over `repeats` launches of a graph holding `steps` steps: microseconds per step.
template <typename Capture>
double time_graph(cudaStream_t stream, int steps, int repeats, Capture&& capture) {
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < steps; ++s) capture(s);
  CK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));  // warm-up
  CK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    CK(cudaEventRecord(a, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(1000.0 * ms / steps);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t(2) << 30;
  void* a = dalloc(bytes);
  void* b = dalloc(bytes);
  CK(cudaMemset(a, 1, bytes));
  const double us =
      time_graph(stream, 4, 5, [&](int) { cuda_copy_kernel_for_bench(b, a, bytes, stream); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (us * 1e-6) / 1e9;
}

struct Row {
  std::string name;
  int batch;
  double us, gbs, baseline_us;
  std::string baseline;
};

// Standard decode: state [B, H, P, N], T = 1 in place or T = 8 into intermediates.
Row bench_standard(cudaStream_t stream, const LayerParams& params, int batch, DType sdt, int T,
                   int repeats, std::mt19937_64& rng) {
  const int64_t E = kShape.state_elements();
  const size_t esz = dtype_size(sdt);
  void* state = dalloc(size_t(batch) * E * esz);
  fill(state, sdt, size_t(batch) * E, rng, 1.f);
  void* inter = T > 1 ? dalloc(size_t(batch) * T * E * esz) : nullptr;
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) slots[b] = b;
  void* dslots = dalloc(slots.size() * 4);
  CK(cudaMemcpy(dslots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const int H = kShape.nheads, P = kShape.headdim, G = kShape.ngroups, N = kShape.dstate;
  const DType act = DType::bf16;
  void* x = dalloc(size_t(batch) * T * H * P * 2);
  void* Bm = dalloc(size_t(batch) * T * G * N * 2);
  void* Cm = dalloc(size_t(batch) * T * G * N * 2);
  void* dt = dalloc(size_t(batch) * T * H * 4);
  void* y = dalloc(size_t(batch) * T * H * P * 2);
  fill(x, act, size_t(batch) * T * H * P, rng, 1.f);
  fill(Bm, act, size_t(batch) * T * G * N, rng, 1.f);
  fill(Cm, act, size_t(batch) * T * G * N, rng, 1.f);
  fill(dt, DType::f32, size_t(batch) * T * H, rng, 0.5f);
  StandardDecodeConfig cfg;
  cfg.state_dtype = sdt;
  const TensorView vs = dv(state, sdt, {batch, H, P, N});
  const TensorView vi = dv(inter, sdt, {batch, T, H, P, N});
  const double us = time_graph(stream, 20, repeats, [&](int) {
    cuda_standard_decode(kShape, params, cfg, vs, dv(dslots, DType::i32, {batch}),
                         dv(x, act, {batch, T, H, P}), dv(Bm, act, {batch, T, G, N}),
                         dv(Cm, act, {batch, T, G, N}), dv(dt, DType::f32, {batch, T, H}),
                         dv(y, act, {batch, T, H, P}), T > 1 ? &vi : nullptr, stream);
  });
  for (void* p : {state, inter, dslots, x, Bm, Cm, dt, y}) cudaFree(p);
  const double bytes = double(batch) * E * esz * (T == 1 ? 2 : 1 + T);
  Row r;
  r.name = std::string("standard ") + dtype_name(sdt) + (T == 1 ? " T=1" : " T=8 + intermediates");
  r.batch = batch;
  r.us = us;
  r.gbs = bytes / (us * 1e-6) / 1e9;
  r.baseline_us = 0;
  return r;
}

// Replay: verify(W) + commit(accepted) per step, accepted ~ truncated geometric (mean ~4.3 at
// W = 8; 1 at W = 1). Steps cover >= 4 flush cycles.
Row bench_replay(const LayerParams& params, int batch, Mode mode, int W, int repeats,
                 std::mt19937_64& rng) {
  CacheConfig cfg;
  cfg.mode = mode;
  cfg.num_slots = batch;
  cfg.history = 16;
  cfg.max_window = 8;
  cfg.activation_dtype = DType::bf16;
  ReplayCache cache(kShape, params, cfg, BackendKind::cuda);
  cudaStream_t stream = cuda_backend_stream(cache.impl());
  const int H = kShape.nheads, P = kShape.headdim, G = kShape.ngroups, N = kShape.dstate;
  const DType act = DType::bf16;
  std::vector<int32_t> slots(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    cache.open(b, 100 + b);
    slots[b] = b;
  }
  void* dslots = dalloc(slots.size() * 4);
  CK(cudaMemcpy(dslots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  const int kSets = 4;  // rotating input sets
  std::vector<void*> xs, Bs, Cs, dts;
  const int T = std::max(W, 4);
  for (int s = 0; s < kSets; ++s) {
    xs.push_back(dalloc(size_t(batch) * T * H * P * 2));
    Bs.push_back(dalloc(size_t(batch) * T * G * N * 2));
    Cs.push_back(dalloc(size_t(batch) * T * G * N * 2));
    dts.push_back(dalloc(size_t(batch) * T * H * 4));
    fill(xs[s], act, size_t(batch) * T * H * P, rng, 1.f);
    fill(Bs[s], act, size_t(batch) * T * G * N, rng, 1.f);
    fill(Cs[s], act, size_t(batch) * T * G * N, rng, 1.f);
    fill(dts[s], DType::f32, size_t(batch) * T * H, rng, 0.5f);
  }
  void* y = dalloc(size_t(batch) * T * H * P * 2);
  // A prompt chunk first, so the checkpoints hold real data.
  cache.prefill(dv(dslots, DType::i32, {batch}), dv(xs[0], act, {batch, 4, H, P}),
                dv(Bs[0], act, {batch, 4, G, N}), dv(Cs[0], act, {batch, 4, G, N}),
                dv(dts[0], DType::f32, {batch, 4, H}), dv(y, act, {batch, 4, H, P}));
  const int steps = W == 1 ? 64 : 32;
  std::vector<int32_t> accepted(size_t(steps) * batch);
  std::uniform_real_distribution<double> u(0, 1);
  long total_accepted = 0;
  for (auto& a : accepted) {
    int k = 1;
    while (k < W && u(rng) < 0.81) ++k;  // mean ~4.3 at W = 8
    a = k;
    total_accepted += k;
  }
  void* dacc = dalloc(accepted.size() * 4);
  CK(cudaMemcpy(dacc, accepted.data(), accepted.size() * 4, cudaMemcpyHostToDevice));
  cuda_backend_synchronize(cache.impl());
  const uint64_t flushes0 = cache.stats().flushes;
  const double us = time_graph(stream, steps, repeats, [&](int s) {
    const int k = s % kSets;
    cache.verify(dv(dslots, DType::i32, {batch}), dv(xs[k], act, {batch, W, H, P}),
                 dv(Bs[k], act, {batch, W, G, N}), dv(Cs[k], act, {batch, W, G, N}),
                 dv(dts[k], DType::f32, {batch, W, H}), dv(y, act, {batch, W, H, P}));
    cache.commit(dv(dslots, DType::i32, {batch}),
                 dv(static_cast<int32_t*>(dacc) + size_t(s) * batch, DType::i32, {batch}));
  });
  const uint64_t flushes = cache.stats().flushes - flushes0;  // warm-up + repeats launches
  const double launches = double(repeats + 1) * steps;
  const double flush_rate = double(flushes) / (launches * batch);
  const SlotLayout layout = SlotLayout::make(kShape, cfg);
  const double read = double(layout.read_checkpoint_bytes(mode));
  const double all = double(layout.checkpoint_bytes());
  const double carrier = double(layout.size[SlotLayout::rec] + layout.size[SlotLayout::rec_scale]);
  const double bytes = double(batch) * (read + flush_rate * (carrier + all));
  for (int s = 0; s < kSets; ++s)
    for (void* p : {xs[s], Bs[s], Cs[s], dts[s]}) cudaFree(p);
  for (void* p : {dslots, y, dacc}) cudaFree(p);
  Row r;
  char name[160];
  std::snprintf(name, sizeof(name), "replay %s W=%d (accept %.2f, flushes/step %.3f)",
                mode_name(mode), W, double(total_accepted) / double(accepted.size()), flush_rate);
  r.name = name;
  r.batch = batch;
  r.us = us;
  r.gbs = bytes / (us * 1e-6) / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches{64, 256};
  int repeats = 7;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) {
      batches.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        const size_t q = s.find(',', p);
        batches.push_back(std::stoi(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::stoi(argv[++i]);
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    }
  }
  if (!cuda_device_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::mt19937_64 rng(1);
  const LayerParams params = synthetic_layer_params(kShape, 1);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy = copy_bandwidth(stream);
  std::vector<Row> rows;
  for (int batch : batches) {
    const Row f1 = bench_standard(stream, params, batch, DType::f32, 1, repeats, rng);
    const Row b1 = bench_standard(stream, params, batch, DType::bf16, 1, repeats, rng);
    const Row f8 = bench_standard(stream, params, batch, DType::f32, 8, repeats, rng);
    const Row b8 = bench_standard(stream, params, batch, DType::bf16, 8, repeats, rng);
    for (Row r : {f1, b1, f8, b8}) {
      r.baseline = "";
      rows.push_back(r);
    }
    for (int W : {1, 8}) {
      for (Mode mode : {Mode::fp32, Mode::shared_fp8, Mode::separate_fp8, Mode::separate_nvfp4}) {
        Row r = bench_replay(params, batch, mode, W, repeats, rng);
        const Row& base = W == 1 ? f1 : f8;
        r.baseline_us = base.us;
        r.baseline = W == 1 ? "standard fp32 T=1" : "standard fp32 T=8";
        rows.push_back(r);
      }
    }
  }
  std::string table;
  char line[512];
  std::snprintf(line, sizeof(line),
                "device: %s, %d SMs, L2 %d MB; measured copy bandwidth %.0f GB/s (read + write)\n"
                "shape H=128 P=64 N=128 G=8, history 16, bf16 activations, median of %d graph "
                "launches\n\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy, repeats);
  table += line;
  table += "| configuration | batch | us/step | GB/s | % of copy BW | speedup vs baseline |\n";
  table += "|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    std::string speed = "-";
    if (r.baseline_us > 0) {
      char s[96];
      std::snprintf(s, sizeof(s), "%.2fx (%s)", r.baseline_us / r.us, r.baseline.c_str());
      speed = s;
    }
    std::snprintf(line, sizeof(line), "| %s | %d | %.1f | %.0f | %.0f%% | %s |\n", r.name.c_str(),
                  r.batch, r.us, r.gbs, 100.0 * r.gbs / copy, speed.c_str());
    table += line;
  }
  std::fputs(table.c_str(), stdout);
  if (!out.empty()) {
    if (FILE* f = std::fopen(out.c_str(), "w")) {
      std::fputs(table.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
