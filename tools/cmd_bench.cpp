// `replayssm bench`: per layer-step time of the standard-decode baseline and of the replay cache
// in every requested mode, on the CPU or the GPU, in the manner of llama-bench (a markdown table,
// or -o json|csv). Docs: docs/cli.md ("bench"); GPU results: bench/results/.
//
// `bench --e2e`: decode tokens per second per user of a whole model (random weights in a preset's
// shape, src/model/synthetic.h) with the standard kernels and with the replay cache per mode.
//
// Bytes per step are modelled, not measured: the standard kernel reads and writes every state
// (T = 1) or reads it once and writes T states; a replay step reads the read checkpoint of every
// non-flushing slot, the recurrence checkpoint of every flushing slot plus all its checkpoint
// writes, the c committed ring entries it replays, writes the W new entries, and reads the
// inputs and writes y. The flush points come from replaying the same acceptance sequence through
// the cursor rules (cache/cursors.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_timing.h"
#include "cache/cursors.h"
#include "cache/layout.h"
#include "cli_common.h"
#include "core/acceptance.h"
#include "core/act.h"
#include "io/staging.h"
#include "model/mamba2.h"
#include "model/synthetic.h"
#include "replayssm/error.h"
#include "replayssm/presets.h"
#include "replayssm/standard_decode.h"
#include "replayssm/version.h"
#if REPLAYSSM_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace replayssm::cli {
namespace {

// The seed's benchmark: 4.3 tokens accepted per verify of 8 (1 + 7 drafts).
constexpr double kSeedAcceptMean = 4.3;
constexpr int kSeedAcceptWindow = 8;

struct BenchArgs {
  std::string model;  // default: nemotron-h-8b (layer bench), mamba2-2.7b (--e2e)
  std::string shape;
  std::vector<int> batches{1, 8, 64};
  std::vector<std::string> modes{"fp32", "shared-fp8", "separate-fp8", "separate-nvfp4"};
  std::vector<int> windows{1, 8};
  double accept_mean = kSeedAcceptMean;
  bool accept_mean_given = false;  // else the seed's 4.3 at W = 8, whatever the windows
  int history = 16;
  int flush_cycles = 4;
  int repeats = 5;
  uint64_t seed = 1;
  std::string backend = "auto";
  bool check = false;
  bool cold_cache = false;  // scrub the caches before every timed step
  // The slots' flush phases: "spread" (slot b starts b % history entries into its ring, as
  // requests that arrived at different times are) or "lockstep" (every ring starts empty).
  std::string phases = "spread";
  bool phases_given = false;  // --phases on the command line (refused with --e2e)
  bool spread() const { return phases == "spread"; }
  std::string format = "md";
  // --e2e: the whole model, batch 1.
  bool e2e = false;
  int prompt_len = 512;
  int new_tokens = 128;
  int window = 8;
  int threads = 0;
};

struct Row {
  std::string name;
  int batch = 0, window = 0;
  double us = 0;                    // per step
  double tokens = 0;                // generated tokens per step, whole batch
  double bytes = 0;                 // modelled bytes per step
  double fp32_us = 0, bf16_us = 0;  // the standard kernels of the same batch and T
};

// A host buffer and its view in the backend's memory (io::Staged copies it for CUDA).
struct Buffer {
  std::vector<uint8_t> host;
  std::unique_ptr<io::Staged> staged;
  Buffer(BackendKind backend, DType dtype, std::vector<int64_t> shape, std::mt19937_64* rng) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    host.assign(size_t(n) * dtype_size(dtype), 0);
    if (rng) {
      std::normal_distribution<float> normal(0.0f, dtype == DType::f32 ? 0.5f : 1.0f);
      for (int64_t i = 0; i < n; ++i) store_act(host.data(), dtype, i, normal(*rng));
    }
    staged = std::make_unique<io::Staged>(backend, host.data(), dtype, std::move(shape));
  }
  const TensorView& view() const { return staged->view(); }
};

// One batch of T tokens: x, B, C in the activation dtype, raw dt (fp32).
struct Tokens {
  Buffer x, B, C, dt;
  Tokens(BackendKind be, const SsmShape& s, DType act, int batch, int T, std::mt19937_64& rng)
      : x(be, act, {batch, T, s.nheads, s.headdim}, &rng),
        B(be, act, {batch, T, s.ngroups, s.dstate}, &rng),
        C(be, act, {batch, T, s.ngroups, s.dstate}, &rng),
        dt(be, DType::f32, {batch, T, s.nheads}, &rng) {}
};

struct Context {
  const BenchArgs& args;
  SsmShape shape;
  LayerParams params;
  BackendKind backend;
  DType act = DType::bf16;
  void* stream = nullptr;  // for the standard kernel on CUDA
  std::mt19937_64 rng;
  double copy_gbs = 0;   // measured copy bandwidth, the ceiling
  std::string device{};  // device_description()
  // Per-draft acceptance (core/acceptance.h), solved from --accept-mean at the largest window
  // benchmarked (by default from the seed's 4.3 at W = 8) and kept for every window, as a
  // drafter's acceptance rate would be.
  double accept_rate = 0;
  int accept_window = kSeedAcceptWindow;  // the window --accept-mean is solved at
  double mean_accepted(int W) const { return W > 1 ? mean_accepted_length(accept_rate, W) : 1.0; }
};

TensorView with_data(TensorView v, void* data, std::vector<int64_t> shape) {
  v.data = data;
  v.shape = std::move(shape);
  return v;
}

double io_bytes(const SsmShape& s, DType act, int T) {
  const double e = double(dtype_size(act));
  return T * (2.0 * s.nheads * s.headdim * e + 2.0 * s.ngroups * s.dstate * e + 4.0 * s.nheads);
}

Row bench_standard(Context& cx, int batch, DType sdt, int T) {
  const SsmShape& s = cx.shape;
  Buffer state(cx.backend, sdt, {batch, s.nheads, s.headdim, s.dstate}, &cx.rng);
  std::unique_ptr<Buffer> inter;
  if (T > 1)
    inter = std::make_unique<Buffer>(
        cx.backend, sdt, std::vector<int64_t>{batch, T, s.nheads, s.headdim, s.dstate}, nullptr);
  std::vector<int32_t> slot_ids(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) slot_ids[b] = b;
  io::Staged slots(cx.backend, slot_ids.data(), DType::i32, {batch});
  std::vector<std::unique_ptr<Tokens>> sets;
  for (int k = 0; k < 2; ++k)
    sets.push_back(std::make_unique<Tokens>(cx.backend, s, cx.act, batch, T, cx.rng));
  Buffer y(cx.backend, cx.act, {batch, T, s.nheads, s.headdim}, nullptr);
  StandardDecodeConfig config;
  config.state_dtype = sdt;
  const TensorView* iv = inter ? &inter->view() : nullptr;
  auto step = [&](int i) {
    const Tokens& tk = *sets[i % sets.size()];
#if REPLAYSSM_WITH_CUDA
    if (cx.backend == BackendKind::cuda) {
      cuda_standard_decode(s, cx.params, config, state.view(), slots.view(), tk.x.view(),
                           tk.B.view(), tk.C.view(), tk.dt.view(), y.view(), iv,
                           static_cast<cudaStream_t>(cx.stream));
      return;
    }
#endif
    standard_decode(cx.backend, s, cx.params, config, state.view(), slots.view(), tk.x.view(),
                    tk.B.view(), tk.C.view(), tk.dt.view(), y.view(), iv);
  };
  const int steps = cx.backend == BackendKind::cpu ? 4 : 20;
  Row r;
  r.name = fmt::format("standard {} state{}", dtype_name(sdt), T > 1 ? " + intermediates" : "");
  r.batch = batch;
  r.window = T;
  r.us = time_steps(cx.backend, cx.stream, steps, cx.args.repeats, cx.args.cold_cache, step);
  r.tokens = batch * cx.mean_accepted(T);
  const double state_bytes = double(s.state_elements()) * dtype_size(sdt);
  r.bytes = batch * (state_bytes * (T == 1 ? 2 : 1 + T) + io_bytes(s, cx.act, T));
  return r;
}

Row bench_replay(Context& cx, int batch, Mode mode, int W) {
  const SsmShape& s = cx.shape;
  const int L = cx.args.history;
  CacheConfig config;
  config.mode = mode;
  config.history = L;
  config.max_window = std::max(1, std::min(8, L / 2));
  check(W <= config.max_window, "bench: window ", W, " exceeds history/2 = ", L / 2);
  config.num_slots = batch;
  config.activation_dtype = cx.act;
  config.seed = cx.args.seed;
  ReplayCache cache(s, cx.params, config, cx.backend);
  std::vector<int32_t> slot_ids(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    slot_ids[b] = b;
    cache.open(b, uint64_t(b));
  }
  io::Staged slots(cx.backend, slot_ids.data(), DType::i32, {batch});
  {
    Tokens prompt(cx.backend, s, cx.act, batch, 4, cx.rng);
    Buffer y(cx.backend, DType::f32, {batch, 4, s.nheads, s.headdim}, nullptr);
    cache.prefill(slots.view(), prompt.x.view(), prompt.B.view(), prompt.C.view(), prompt.dt.view(),
                  y.view());
  }
  // --phases spread: slot b decodes b % L tokens before the timed run (pre-step k decodes the
  // slots with b % L >= k), so at W = 1 about batch / L slots flush per step, as when requests
  // arrive at different times; lockstep: every slot starts with an empty ring and all flush
  // together.
  std::vector<SlotCursors> start(size_t(batch), fresh_cursors(0));
  for (int k = 1; cx.args.spread() && k < L; ++k) {
    std::vector<int32_t> sub;
    for (int b = 0; b < batch; ++b)
      if (b % L >= k) {
        sub.push_back(b);
        apply_verify(start[b], 1);
        apply_commit(start[b], 1);
      }
    if (sub.empty()) break;
    const int n = int(sub.size());
    io::Staged sub_slots(cx.backend, sub.data(), DType::i32, {n});
    Tokens tk(cx.backend, s, cx.act, n, 1, cx.rng);
    Buffer yk(cx.backend, cx.act, {n, 1, s.nheads, s.headdim}, nullptr);
    cache.decode(sub_slots.view(), tk.x.view(), tk.B.view(), tk.C.view(), tk.dt.view(), yk.view());
  }
  // Enough steps for flush_cycles flushes of every slot.
  const int steps = std::max(8, int(std::ceil(cx.args.flush_cycles * L / cx.mean_accepted(W))));
  const double q = cx.accept_rate;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> accepted(size_t(steps) * batch);
  double total_accepted = 0;
  for (int32_t& k : accepted) {
    k = 1;
    while (k < W && u(cx.rng) < q) ++k;
    total_accepted += k;
  }
  io::Staged acc(cx.backend, accepted.data(), DType::i32, {int64_t(accepted.size())});
  std::vector<std::unique_ptr<Tokens>> sets;
  for (int k = 0; k < 4; ++k)
    sets.push_back(std::make_unique<Tokens>(cx.backend, s, cx.act, batch, W, cx.rng));
  Buffer y(cx.backend, cx.act, {batch, W, s.nheads, s.headdim}, nullptr);
  auto step = [&](int i) {
    const Tokens& tk = *sets[i % sets.size()];
    if (W == 1) {  // autoregressive: decode (the CUDA backend commits in the verify kernel)
      cache.decode(slots.view(), tk.x.view(), tk.B.view(), tk.C.view(), tk.dt.view(), y.view());
      return;
    }
    cache.verify(slots.view(), tk.x.view(), tk.B.view(), tk.C.view(), tk.dt.view(), y.view());
    cache.commit(slots.view(),
                 with_data(acc.view(), acc.view().as<int32_t>() + size_t(i) * batch, {batch}));
  };
  void* stream = nullptr;
#if REPLAYSSM_WITH_CUDA
  if (cx.backend == BackendKind::cuda) stream = cuda_backend_stream(cache.impl());
#endif
  Row r;
  r.name = fmt::format("replay {}", mode_name(mode));
  r.batch = batch;
  r.window = W;
  r.us = time_steps(cx.backend, stream, steps, cx.args.repeats, cx.args.cold_cache, step);
  r.tokens = total_accepted / steps;

  // Modelled bytes: the acceptance sequence through the cursor rules from an empty ring.
  const SlotLayout layout = SlotLayout::make(s, config);
  const double e = double(dtype_size(cx.act));
  const double entry = s.nheads * s.headdim * e + s.ngroups * s.dstate * e + 4.0 * s.nheads;
  const double carrier = double(layout.size[SlotLayout::rec] + layout.size[SlotLayout::rec_scale]);
  double bytes = 0;
  std::vector<SlotCursors> cur = start;
  for (int i = 0; i < steps; ++i) {
    for (int b = 0; b < batch; ++b) {
      SlotCursors& c = cur[b];
      bytes += c.committed * entry + W * entry + io_bytes(s, cx.act, W);
      if (verify_needs_flush(c, W, L)) {
        bytes += carrier + double(layout.checkpoint_bytes());
        apply_flush(c, L);
      } else {
        bytes += double(layout.read_checkpoint_bytes(mode));
      }
      apply_verify(c, W);
      apply_commit(c, accepted[size_t(i) * batch + b]);
    }
  }
  r.bytes = bytes / steps;
  return r;
}

// --check: a few verify + commit steps (decode at W = 1, as timed) of a small batch through the
// benchmarked backend and the CPU reference's verify + commit from the same inputs; no number is
// reported for a configuration that disagrees.
void check_against_cpu(Context& cx, Mode mode, int W) {
  if (cx.backend == BackendKind::cpu) return;  // the CPU backend is the reference
  const SsmShape& s = cx.shape;
  CacheConfig config;
  config.mode = mode;
  config.history = cx.args.history;
  config.max_window = std::max(1, std::min(8, cx.args.history / 2));
  config.num_slots = 2;
  config.activation_dtype = cx.act;
  ReplayCache ref(s, cx.params, config, BackendKind::cpu);
  ReplayCache dut(s, cx.params, config, cx.backend);
  for (int b = 0; b < 2; ++b) {
    ref.open(b, uint64_t(b));
    dut.open(b, uint64_t(b));
  }
  std::vector<int32_t> slot_ids{0, 1}, accepted{W, std::max(1, W / 2)};
  double worst = 0;
  for (int i = 0; i < 3 * cx.args.history; ++i) {
    Tokens host(BackendKind::cpu, s, cx.act, 2, W, cx.rng);
    io::Staged x(cx.backend, host.x.host.data(), cx.act, {2, W, s.nheads, s.headdim});
    io::Staged B(cx.backend, host.B.host.data(), cx.act, {2, W, s.ngroups, s.dstate});
    io::Staged C(cx.backend, host.C.host.data(), cx.act, {2, W, s.ngroups, s.dstate});
    io::Staged dt(cx.backend, host.dt.host.data(), DType::f32, {2, W, s.nheads});
    std::vector<float> y_ref(size_t(2) * W * s.nheads * s.headdim), y_dut(y_ref.size(), NAN);
    io::Staged yd(cx.backend, y_dut.data(), DType::f32, {2, W, s.nheads, s.headdim});
    const TensorView sv = host_view(slot_ids.data(), DType::i32, {2});
    const TensorView av = host_view(accepted.data(), DType::i32, {2});
    ref.verify(sv, host.x.view(), host.B.view(), host.C.view(), host.dt.view(),
               host_view(y_ref.data(), DType::f32, {2, W, s.nheads, s.headdim}));
    ref.commit(sv, av);
    if (W == 1) {  // the operation the W = 1 rows time
      dut.decode(sv, x.view(), B.view(), C.view(), dt.view(), yd.view());
    } else {
      dut.verify(sv, x.view(), B.view(), C.view(), dt.view(), yd.view());
      dut.commit(sv, av);
    }
    yd.copy_to_host(y_dut.data());
    double num = 0, den = 0;
    for (size_t k = 0; k < y_ref.size(); ++k) {
      num += (double(y_dut[k]) - y_ref[k]) * (double(y_dut[k]) - y_ref[k]);
      den += double(y_ref[k]) * y_ref[k];
    }
    worst = std::max(worst, std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY);
  }
  // CPU and CUDA differ by FP32 summation order and codes flipped at rounding boundaries
  // (docs/cuda.md); a wrong kernel is off by far more.
  check(worst < 1e-3, "bench --check: ", mode_name(mode), " W=", W, " on ",
        backend_name(cx.backend), " differs from the CPU reference: y rel L2 ", worst);
}

double speedup_over(double base_us, double us) { return base_us > 0 ? base_us / us : 0.0; }

// What a bench run's rows depend on besides (name, batch, window): the JSON document's fields
// and, for a run stopped before that document, its stderr's `[bench] settings` line, so that
// scripts/bench_compare.py can refuse to pool runs of different settings either way.
nlohmann::json run_settings(const BenchArgs& a, const Context& cx) {
  return {{"backend", backend_name(cx.backend)},
          {"device", cx.device},
          {"shape", {cx.shape.nheads, cx.shape.headdim, cx.shape.dstate, cx.shape.ngroups}},
          {"history", a.history},
          {"accept_mean", a.accept_mean},
          {"accept_window", cx.accept_window},
          {"accept_rate", cx.accept_rate},
          {"copy_gb_per_s", cx.copy_gbs},
          {"cold_cache", a.cold_cache},
          {"phases", a.phases}};
}

// md and csv go out row by row, flushed: a long run shows its progress, and a run stopped by a
// time limit keeps every row it measured. json is one document at the end (print_json); the copy
// bandwidth, the run's settings and each row (time, bytes, bandwidth) are reported on stderr as
// they are measured.
void print_header(const BenchArgs& a, const Context& cx) {
  if (a.format == "json") {
    fmt::print(stderr, "[bench] {}, copy bandwidth {:.0f} GB/s (read + write)\n", cx.device,
               cx.copy_gbs);
    fmt::print(stderr, "[bench] settings {}\n", run_settings(a, cx).dump());
    return;
  }
  if (a.format == "csv") {
    fmt::print(
        "name,batch,window,us_per_step,us_per_token,modelled_bytes_per_step,gb_per_s,"
        "fraction_of_copy_bandwidth,speedup_vs_fp32,speedup_vs_bf16\n");
  } else {
    std::string accepted_by_window;
    for (int W : a.windows)
      if (W > 1)
        accepted_by_window += fmt::format(
            "{} {:.2f} at W = {}", accepted_by_window.empty() ? "" : ",", cx.mean_accepted(W), W);
    // Only speculative windows draw accepted counts; decode-only runs say nothing of them.
    const std::string acceptance =
        accepted_by_window.empty() ? std::string()
                                   : fmt::format(", per-draft acceptance {:.3f} (mean accepted{})",
                                                 cx.accept_rate, accepted_by_window);
    fmt::print("replayssm {}, {}: {}\n", version_line(), run_info().started_utc,
               run_info().command);
    fmt::print(
        "replayssm bench: {} backend ({}), H={} P={} N={} G={}, history {}{}, median of {} runs{}; "
        "copy bandwidth {:.0f} GB/s (read + write)\n\n",
        backend_name(cx.backend), cx.device, cx.shape.nheads, cx.shape.headdim, cx.shape.dstate,
        cx.shape.ngroups, a.history, acceptance, a.repeats,
        std::string(a.spread() ? ", flush phases spread" : ", flush phases in lockstep") +
            (a.cold_cache ? ", caches scrubbed before every step" : ""),
        cx.copy_gbs);
    fmt::print(
        "| configuration | batch | W | us/step | us/token | MB/step | GB/s | % copy BW "
        "| vs std fp32 | vs std bf16 |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  std::fflush(stdout);
}

void print_row(const BenchArgs& a, const Context& cx, const Row& r) {
  const double gbs = r.bytes / r.us * 1e-3;
  if (a.format == "json") {
    // Everything a stopped run needs to be read without its JSON (scripts grep these lines).
    fmt::print(stderr,
               "[bench] {}, batch {}, W {}: {:.1f} us/step, {:.1f} MB/step, {:.0f} GB/s, {:.1f}% "
               "of copy bandwidth\n",
               r.name, r.batch, r.window, r.us, r.bytes / 1e6, gbs, 100.0 * gbs / cx.copy_gbs);
  } else if (a.format == "csv") {
    fmt::print("{},{},{},{:.3f},{:.4f},{:.0f},{:.2f},{:.4f},{:.3f},{:.3f}\n", r.name, r.batch,
               r.window, r.us, r.us / r.tokens, r.bytes, gbs, gbs / cx.copy_gbs,
               speedup_over(r.fp32_us, r.us), speedup_over(r.bf16_us, r.us));
  } else {
    auto ratio = [&](double base) {
      return base > 0 ? fmt::format("{:.2f}x", base / r.us) : std::string("-");
    };
    fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.1f} | {:.0f} | {:.0f}% | {} | {} |\n", r.name,
               r.batch, r.window, r.us, r.us / r.tokens, r.bytes / 1e6, gbs,
               100.0 * gbs / cx.copy_gbs, ratio(r.fp32_us), ratio(r.bf16_us));
  }
  std::fflush(a.format == "json" ? stderr : stdout);
}

// A JSON document of bench with what produced it (cli_common.h, RunInfo).
nlohmann::json with_provenance(nlohmann::json doc) {
  doc["replayssm_version"] = version();
  doc["commit"] = build_commit();
  doc["command"] = run_info().command;
  doc["started_utc"] = run_info().started_utc;
  return doc;
}

void print_json(const BenchArgs& a, const Context& cx, const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows)
    out.push_back({{"name", r.name},
                   {"batch", r.batch},
                   {"window", r.window},
                   {"us_per_step", r.us},
                   {"us_per_token", r.us / r.tokens},
                   {"tokens_per_step", r.tokens},
                   {"modelled_bytes_per_step", r.bytes},
                   {"gb_per_s", r.bytes / r.us * 1e-3},
                   {"fraction_of_copy_bandwidth", r.bytes / r.us * 1e-3 / cx.copy_gbs},
                   {"speedup_vs_standard_fp32", speedup_over(r.fp32_us, r.us)},
                   {"speedup_vs_standard_bf16", speedup_over(r.bf16_us, r.us)}});
  nlohmann::json doc = run_settings(a, cx);
  doc["rows"] = out;
  fmt::print("{}\n", with_provenance(doc).dump(2));
}

void run_bench(const BenchArgs& a) {
  Context cx{a,
             a.shape.empty() ? find_preset(a.model.empty() ? "nemotron-h-8b" : a.model).shape
                             : parse_shape(a.shape),
             {},
             resolve_backend(a.backend),
             DType::bf16,
             nullptr,
             std::mt19937_64(a.seed)};
  cx.shape.validate();
  check(a.accept_mean >= 1.0, "--accept-mean ", a.accept_mean, " must be at least 1");
  check(a.repeats >= 1 && a.flush_cycles >= 1, "--repeats and --flush-cycles must be positive");
  for (int batch : a.batches) check(batch >= 1, "--batches: ", batch, " must be positive");
  cx.params = synthetic_layer_params(cx.shape, a.seed);
  std::vector<Mode> modes;
  for (const std::string& m : a.modes) modes.push_back(parse_mode(m));
  for (int W : a.windows)
    check(W >= 1 && W <= std::min(8, a.history / 2), "--windows: ", W, " outside 1..",
          std::min(8, a.history / 2));
  const int max_window = *std::max_element(a.windows.begin(), a.windows.end());
  if (a.accept_mean_given) {
    check(max_window > 1 || a.accept_mean == 1.0, "--accept-mean ", a.accept_mean,
          " needs a speculative window (--windows above 1)");
    check(a.accept_mean <= max_window, "--accept-mean ", a.accept_mean,
          " exceeds the largest window ", max_window);
    cx.accept_window = max_window;
    if (max_window > 1) cx.accept_rate = acceptance_for_mean(a.accept_mean, max_window);
  } else {
    cx.accept_rate = acceptance_for_mean(kSeedAcceptMean, kSeedAcceptWindow);
  }
  if (cx.backend == BackendKind::cuda) cx.stream = new_cuda_stream();
  cx.copy_gbs = copy_bandwidth_gbs(cx.backend, cx.stream, std::max(a.repeats, 5));
  cx.device = device_description(cx.backend);
  if (a.check)
    for (Mode m : modes)
      for (int W : a.windows) check_against_cpu(cx, m, W);
  print_header(a, cx);
  std::vector<Row> rows;
  auto add = [&](const Row& r) {
    rows.push_back(r);
    print_row(a, cx, r);
  };
  for (int batch : a.batches) {
    for (int W : a.windows) {
      const Row f32 = bench_standard(cx, batch, DType::f32, W);
      const Row b16 = bench_standard(cx, batch, DType::bf16, W);
      add(f32);
      add(b16);
      for (Mode m : modes) {
        Row r = bench_replay(cx, batch, m, W);
        r.fp32_us = f32.us;
        r.bf16_us = b16.us;
        add(r);
      }
    }
  }
  if (a.format == "json") print_json(a, cx, rows);
}

// One configuration of `bench --e2e`: a synthetic run (src/model/synthetic.h) of the whole model.
struct E2eRow {
  std::string name;
  int window = 1;
  model::SyntheticResult result;
};

// Decode tokens/s per user of a model with random weights: every row prefills the same random
// prompt and generates the same number of tokens; speculative rows (W > 1) verify a full window
// through every layer and the lm_head per step and commit the synthetic accepted count, the same
// acceptance sequence in every row (same seed and window). x, B, C are bf16 in every row (the
// SPEC's activation dtype; what a serving engine streams to the SSM kernels).
void run_e2e(const BenchArgs& a) {
  check(a.shape.empty(),
        "bench --e2e builds a whole model from a preset: use --model, not --shape");
  check(!a.cold_cache, "bench --e2e: --cold-l2 is for layer steps (a whole model evicts the ",
        "caches by itself)");
  check(!a.phases_given, "bench --e2e: --phases is for layer steps (a model's requests share one ",
        "prompt here)");
  check(a.prompt_len >= 1 && a.new_tokens >= 1, "bench --e2e: --prompt-len and --new-tokens must ",
        "be positive");
  check(a.window >= 2 && a.window <= std::min(8, a.history / 2), "bench --e2e: --window ", a.window,
        " is outside 2..", std::min(8, a.history / 2), " (1 + drafts; at most history/2)");
  check(a.accept_mean >= 1.0 && a.accept_mean <= a.window, "bench --e2e: --accept-mean ",
        a.accept_mean, " is outside [1, ", a.window, "]");
  std::vector<Mode> modes;
  for (const std::string& m : a.modes) modes.push_back(parse_mode(m));
  const ModelPreset& preset = find_preset(a.model.empty() ? "mamba2-2.7b" : a.model);
  const BackendKind backend = resolve_backend(a.backend);
  const model::ModelConfig config = model::config_for_preset(preset);
  auto weights = std::make_shared<const model::ModelWeights>(model::random_weights(config, a.seed));

  model::RunnerConfig base;
  base.history = a.history;
  base.max_window = a.window;
  base.activation_dtype = DType::bf16;
  base.backend = backend;
  base.seed = a.seed;
  base.threads = a.threads;
  std::vector<E2eRow> rows;
  auto run = [&](const std::string& name, const model::RunnerConfig& rc, int W) {
    fmt::print(stderr, "[bench --e2e] {} ...\n", name);
    model::Mamba2Model runner(weights, rc);
    model::SyntheticOptions opt;
    opt.prompt_tokens = a.prompt_len;
    opt.new_tokens = a.new_tokens;
    opt.window = W;
    opt.mean_accepted_length = W > 1 ? a.accept_mean : 1.0;
    opt.seed = a.seed;
    rows.push_back({name, W, model::run_synthetic(runner, opt)});
  };
  for (DType sdt : {DType::f32, DType::bf16}) {
    model::RunnerConfig rc = base;
    rc.ssm = model::SsmPath::standard;
    rc.standard_state_dtype = sdt;
    run(fmt::format("standard {} (plain decode)", dtype_name(sdt)), rc, 1);
  }
  {
    // Standard kernels under speculative decoding: W intermediate states per verify.
    model::RunnerConfig rc = base;
    rc.ssm = model::SsmPath::standard;
    run(fmt::format("standard fp32 W={}", a.window), rc, a.window);
  }
  for (Mode m : modes) {
    model::RunnerConfig rc = base;
    rc.mode = m;
    run(fmt::format("replay {} W={}", mode_name(m), a.window), rc, a.window);
  }

  const double base_tps = rows.front().result.tokens_per_second();
  auto speedup = [&](const E2eRow& r) {
    return base_tps > 0 ? r.result.tokens_per_second() / base_tps : 0.0;
  };
  auto ms_per_token = [](const E2eRow& r) {
    return r.result.generated ? 1e3 * r.result.decode_seconds / r.result.generated : 0.0;
  };
  const double params = double(weights->parameter_count());
  if (a.format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const E2eRow& r : rows)
      out.push_back({{"name", r.name},
                     {"window", r.window},
                     {"decode_tokens_per_s_per_user", r.result.tokens_per_second()},
                     {"ms_per_token", ms_per_token(r)},
                     {"mean_accepted_length", r.result.mean_accepted_length()},
                     {"prefill_seconds", r.result.prefill_seconds},
                     {"decode_seconds", r.result.decode_seconds},
                     {"generated", r.result.generated},
                     {"verify_steps", r.result.steps},
                     {"flushes_per_layer", r.result.flushes},
                     {"speedup_vs_standard_fp32", speedup(r)}});
    fmt::print("{}\n", with_provenance(nlohmann::json{{"backend", backend_name(backend)},
                                                      {"model", preset.name},
                                                      {"parameters", params},
                                                      {"batch", 1},
                                                      {"prompt_len", a.prompt_len},
                                                      {"new_tokens", a.new_tokens},
                                                      {"window", a.window},
                                                      {"accept_mean", a.accept_mean},
                                                      {"history", a.history},
                                                      {"rows", out}})
                           .dump(2));
    return;
  }
  if (a.format == "csv") {
    fmt::print(
        "name,window,decode_tokens_per_s_per_user,ms_per_token,mean_accepted_length,"
        "prefill_seconds,speedup_vs_standard_fp32\n");
    for (const E2eRow& r : rows)
      fmt::print("{},{},{:.3f},{:.4f},{:.3f},{:.4f},{:.3f}\n", r.name, r.window,
                 r.result.tokens_per_second(), ms_per_token(r), r.result.mean_accepted_length(),
                 r.result.prefill_seconds, speedup(r));
    return;
  }
  fmt::print(
      "replayssm bench --e2e: {} backend, {} ({:.0f}M params, random weights), batch 1, prompt {} "
      "tokens, {} new tokens, window {} with mean accepted length {:.2f} (synthetic), history "
      "{}\n\n",
      backend_name(backend), preset.name, params / 1e6, a.prompt_len, a.new_tokens, a.window,
      a.accept_mean, a.history);
  fmt::print(
      "| configuration | decode tok/s/user | ms/token | mean accepted | prefill s | vs std fp32 "
      "plain |\n|---|---:|---:|---:|---:|---:|\n");
  for (const E2eRow& r : rows)
    fmt::print("| {} | {:.1f} | {:.2f} | {:.2f} | {:.3f} | {:.2f}x |\n", r.name,
               r.result.tokens_per_second(), ms_per_token(r), r.result.mean_accepted_length(),
               r.result.prefill_seconds, speedup(r));
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* b = app.add_subcommand(
      "bench", "per layer-step time of the standard kernel and every replay mode");
  b->add_option("--model", args->model,
                "layer shape preset (default nemotron-h-8b; with --e2e the model's preset, "
                "default mamba2-2.7b): " +
                    preset_names());
  b->add_option("--shape", args->shape, "H,P,N,G (instead of --model)");
  b->add_option("--batches", args->batches, "batch sizes")->delimiter(',')->capture_default_str();
  b->add_option("--modes", args->modes, "replay checkpoint modes")
      ->delimiter(',')
      ->capture_default_str();
  b->add_option("--windows", args->windows, "verify windows W (1 = autoregressive)")
      ->delimiter(',')
      ->capture_default_str();
  b->add_option("--accept-mean", args->accept_mean,
                "mean accepted tokens per verify at the largest window; the per-draft acceptance "
                "solved from it applies to every window (default: 4.3 at W = 8, a = 0.811)")
      ->capture_default_str()
      ->each([args](const std::string&) { args->accept_mean_given = true; });
  b->add_option("--history", args->history, "ring capacity")->capture_default_str();
  b->add_option("--flush-cycles", args->flush_cycles, "flushes per slot in a timed run")
      ->capture_default_str();
  b->add_option("--repeats", args->repeats, "timed runs (the median is reported)")
      ->capture_default_str();
  b->add_option("--seed", args->seed, "random seed")->capture_default_str();
  add_backend_option(b, &args->backend, "auto");
  b->add_flag("--check", args->check,
              "first compare every replay configuration with the CPU reference");
  b->add_flag("--cold-l2", args->cold_cache,
              "scrub the caches before every step and time the steps alone (the other layers "
              "of a model evict the L2 between a layer's steps in service)");
  b->add_option("--phases", args->phases,
                "the slots' flush phases: spread (slot b starts b mod history entries into its "
                "ring, as in service) or lockstep (every slot flushes on the same steps)")
      ->check(CLI::IsMember({"spread", "lockstep"}))
      ->capture_default_str()
      ->each([args](const std::string&) { args->phases_given = true; });
  b->add_option("-o,--output", args->format, "md (default), json or csv")
      ->check(CLI::IsMember({"md", "json", "csv"}));
  b->add_flag("--e2e", args->e2e,
              "end to end instead: decode tokens/s per user of a whole model with random weights "
              "(batch 1), standard kernels next to each replay mode");
  b->add_option("--prompt-len", args->prompt_len, "--e2e: prompt tokens (prefill)")
      ->capture_default_str();
  b->add_option("--new-tokens", args->new_tokens, "--e2e: generated tokens per configuration")
      ->capture_default_str();
  b->add_option("--window", args->window, "--e2e: verify window W = 1 + drafts")
      ->capture_default_str();
  b->add_option("--threads", args->threads, "--e2e: OpenMP threads; 0 = the OpenMP default")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  b->callback([args] { args->e2e ? run_e2e(*args) : run_bench(*args); });
}

}  // namespace replayssm::cli
