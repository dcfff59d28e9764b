// Per-step time of the CPU reference backend at a model's layer shape: verify(W) + commit with
// a synthetic acceptance process, over enough steps for several flush cycles, and the standard
// decode baseline in the same run. CPU timings only; GPU numbers come from the CUDA benchmark.
//
//   replayssm_bench_cpu [batch=8] [H=128 P=64 N=128 G=8] [steps=64]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/act.h"
#include "replayssm/cache.h"
#include "replayssm/presets.h"
#include "replayssm/standard_decode.h"

using namespace replayssm;

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Inputs {
  std::vector<uint16_t> x, B, C;
  std::vector<float> dt, y;
};

Inputs make_inputs(const SsmShape& s, int batch, int W, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  Inputs in;
  auto fill = [&](std::vector<uint16_t>& v, size_t n) {
    v.resize(n);
    for (auto& e : v) e = f32_to_bf16(normal(rng));
  };
  fill(in.x, size_t(batch) * W * s.nheads * s.headdim);
  fill(in.B, size_t(batch) * W * s.ngroups * s.dstate);
  fill(in.C, size_t(batch) * W * s.ngroups * s.dstate);
  in.dt.resize(size_t(batch) * W * s.nheads);
  for (auto& e : in.dt) e = 0.5f * normal(rng);
  in.y.resize(size_t(batch) * W * s.nheads * s.headdim);
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 8;
  SsmShape s{128, 64, 128, 8};
  if (argc > 5)
    s = SsmShape{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5])};
  const int steps = argc > 6 ? std::atoi(argv[6]) : 64;
  std::mt19937 rng(1);
  const LayerParams params = synthetic_layer_params(s, 1);
  std::vector<int32_t> slots(batch);
  for (int b = 0; b < batch; ++b) slots[b] = b;
  const TensorView slot_view = host_view(slots.data(), DType::i32, {batch});
  // us/token: per generated token over the whole batch (accepted tokens for W > 1).
  std::printf("| op | mode | W | batch | us/step | us/token |\n|---|---|---|---|---|---|\n");

  for (int W : {1, 8}) {
    Inputs in = make_inputs(s, batch, W, rng);
    auto views = [&](int T) {
      return std::array<TensorView, 5>{
          host_view(in.x.data(), DType::bf16, {batch, T, s.nheads, s.headdim}),
          host_view(in.B.data(), DType::bf16, {batch, T, s.ngroups, s.dstate}),
          host_view(in.C.data(), DType::bf16, {batch, T, s.ngroups, s.dstate}),
          host_view(in.dt.data(), DType::f32, {batch, T, s.nheads}),
          host_view(in.y.data(), DType::f32, {batch, T, s.nheads, s.headdim})};
    };
    const auto v = views(W);
    for (Mode mode :
         {Mode::fp32, Mode::fp16_sr, Mode::shared_fp8, Mode::separate_fp8, Mode::separate_nvfp4}) {
      CacheConfig config;
      config.mode = mode;
      config.num_slots = batch;
      ReplayCache cache(s, params, config);
      for (int b = 0; b < batch; ++b) cache.open(b, uint64_t(b));
      std::geometric_distribution<int> drafts(1.0 / 4.3);
      std::vector<int32_t> accepted(batch);
      double tokens = 0;
      const double t0 = now_us();
      for (int step = 0; step < steps; ++step) {
        cache.verify(slot_view, v[0], v[1], v[2], v[3], v[4]);
        for (auto& a : accepted) a = std::min(W, 1 + drafts(rng) % W);
        for (auto a : accepted) tokens += a;
        cache.commit(slot_view, host_view(accepted.data(), DType::i32, {batch}));
      }
      const double us = (now_us() - t0) / steps;
      std::printf("| replay | %s | %d | %d | %.1f | %.1f |\n", mode_name(mode), W, batch, us,
                  us * steps / tokens);
    }
    for (DType sdt : {DType::f32, DType::bf16}) {
      std::vector<uint8_t> state(size_t(batch) * s.state_elements() * dtype_size(sdt), 0);
      std::vector<uint8_t> inter(W > 1 ? size_t(batch) * W * s.state_elements() * dtype_size(sdt)
                                       : 0);
      TensorView sv = host_view(state.data(), sdt, {batch, s.nheads, s.headdim, s.dstate});
      TensorView iv = host_view(inter.data(), sdt, {batch, W, s.nheads, s.headdim, s.dstate});
      StandardDecodeConfig sd;
      sd.state_dtype = sdt;
      const int reps = std::max(2, steps / 8);
      const double t0 = now_us();
      for (int r = 0; r < reps; ++r)
        standard_decode(BackendKind::cpu, s, params, sd, sv, slot_view, v[0], v[1], v[2], v[3],
                        v[4], W > 1 ? &iv : nullptr);
      const double us = (now_us() - t0) / reps;
      // Tokens per step: one per request, or the mean accepted length 4.3 of the replay rows.
      const double tokens_per_step = batch * (W > 1 ? 4.3 : 1.0);
      std::printf("| standard | %s state | %d | %d | %.1f | %.1f |\n", dtype_name(sdt), W, batch,
                  us, us / tokens_per_step);
    }
  }
  return 0;
}
