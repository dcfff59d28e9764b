// replayssm demo: the main job until a model runner exists. A synthetic multi-layer Mamba-2
// stack decodes a batch of requests with speculative decoding, once per checkpoint mode, on the
// best available backend; every mode sees exactly the same tokens and acceptance pattern, so the
// table compares storage, checkpoint traffic and output error against the fp32 mode directly.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>

#include "cache/layout.h"
#include "cli_common.h"
#include "core/acceptance.h"
#include "core/formats.h"
#include "io/staging.h"
#include "replayssm/error.h"
#include "replayssm/presets.h"

namespace replayssm::cli {
namespace {

// Hash-seeded generator: the inputs of a token depend only on (seed, layer, token identity),
// never on the order of generation, so every mode and backend sees the same numbers.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  double normal() {
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }

 private:
  uint64_t state_;
};

uint64_t mix(uint64_t a, uint64_t b) { return Rng(a * 0x100000001b3ull ^ b).next(); }

struct DemoArgs {
  std::string preset = "small", backend, activation = "bf16";
  int layers = 0, batch = 4, tokens = 64, prompt = 16, window = 8, history = 16;
  double accept_mean = 4.3;
  uint64_t seed = 1;
  std::vector<std::string> modes;
  bool no_progress = false;
  OutputFormat format;
};

struct ModeResult {
  Mode mode;
  double bytes_per_element = 0, read_bytes_per_token = 0, write_bytes_per_token = 0;
  uint64_t flushes = 0, saturated = 0;
  double max_err = 0, rms_err = 0, rel_rms_err = 0, tokens_per_s = 0;
  std::vector<float> outputs;  // last layer y of the first `tokens` generated tokens per request
};

class Demo {
 public:
  Demo(const DemoArgs& a, const SsmShape& shape, int layers, BackendKind backend)
      : a_(a),
        shape_(shape),
        layers_(layers),
        backend_(backend),
        act_(parse_dtype(a.activation)),
        d_(size_t(shape.nheads) * shape.headdim) {
    Rng rng(mix(a.seed, 0xa11ce));
    for (int l = 0; l < layers; ++l) {  // Mamba-2 initialisation ranges, as in `trace gen`
      LayerParams p;
      for (int h = 0; h < shape.nheads; ++h) {
        p.A_log.push_back(float(std::log(1.0 + 15.0 * rng.uniform())));
        const double delta = std::exp(std::log(1e-3) + rng.uniform() * std::log(100.0));
        p.dt_bias.push_back(float(delta + std::log(-std::expm1(-delta))));
        p.D.push_back(float(0.5 + rng.uniform()));
      }
      params_.push_back(std::move(p));
    }
    // Accepted tokens per (step, request): a draft is accepted only if all before it were, with
    // the per-draft probability that gives the requested mean. Fixed up front for all modes.
    const double prob = acceptance_for_mean(a.accept_mean, a.window);
    std::vector<int> done(size_t(a.batch), 0);
    Rng accept_rng(mix(a.seed, 0xacce97));
    while (*std::min_element(done.begin(), done.end()) < a.tokens) {
      std::vector<int> step;
      for (int b = 0; b < a.batch; ++b) {
        int k = 1;
        while (k < a.window && accept_rng.uniform() < prob) ++k;
        step.push_back(k);
        done[size_t(b)] += k;
      }
      schedule_.push_back(std::move(step));
    }
  }

  int steps() const { return int(schedule_.size()); }
  double observed_accept_mean() const {
    double sum = 0;
    for (const auto& step : schedule_)
      for (int k : step) sum += k;
    return sum / double(schedule_.size() * size_t(a_.batch));
  }

  ModeResult run(Mode mode, Progress& progress) {
    const int B = a_.batch, H = shape_.nheads, P = shape_.headdim, N = shape_.dstate,
              G = shape_.ngroups, W = a_.window;
    std::vector<ReplayCache> caches;
    for (int l = 0; l < layers_; ++l) {
      CacheConfig c;
      c.mode = mode;
      c.history = a_.history;
      c.max_window = W;
      c.num_slots = B;
      c.activation_dtype = act_;
      c.seed = a_.seed;
      c.layer = l;
      caches.emplace_back(shape_, params_[size_t(l)], c, backend_);
      for (int b = 0; b < B; ++b) caches.back().open(b, uint64_t(b));
    }
    std::vector<int32_t> slots(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) slots[size_t(b)] = b;
    const TensorView slots_view = host_view(slots.data(), DType::i32, {B});

    // Runs T tokens per request through the stack (prefill or verify); returns the last layer's
    // y [B, T, H*P]. Token (b, j) has identity ids[b * T + j].
    auto forward = [&](const std::vector<uint64_t>& ids, int T, bool prefill) {
      const size_t rows = size_t(B) * size_t(T);
      std::vector<float> h(rows * d_), y(rows * d_);
      for (size_t r = 0; r < rows; ++r) {
        Rng rng(mix(a_.seed, ids[r]));
        for (size_t i = 0; i < d_; ++i) h[r * d_ + i] = float(rng.normal());
      }
      std::vector<float> x(rows * d_), Bm(rows * G * N), Cm(rows * G * N), dt(rows * H);
      std::vector<uint16_t> x16, B16, C16;
      for (int l = 0; l < layers_; ++l) {
        for (size_t r = 0; r < rows; ++r) {
          // Pre-norm residual block: the layer sees rmsnorm(h), so errors of earlier layers
          // propagate into later ones as in a real model.
          double ss = 0;
          for (size_t i = 0; i < d_; ++i) ss += double(h[r * d_ + i]) * h[r * d_ + i];
          const float inv = float(1.0 / std::sqrt(ss / double(d_) + 1e-6));
          for (size_t i = 0; i < d_; ++i) x[r * d_ + i] = h[r * d_ + i] * inv;
          Rng rng(mix(mix(a_.seed, ids[r]), uint64_t(l) + 1));
          for (int i = 0; i < G * N; ++i) Bm[r * G * N + i] = float(rng.normal());
          for (int i = 0; i < G * N; ++i) Cm[r * G * N + i] = float(rng.normal());
          for (int i = 0; i < H; ++i) dt[r * H + i] = float(0.5 * rng.normal());
        }
        const void *xp = x.data(), *Bp = Bm.data(), *Cp = Cm.data();
        if (act_ == DType::bf16) {
          auto to16 = [](const std::vector<float>& v, std::vector<uint16_t>& out) {
            out.resize(v.size());
            for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
            return out.data();
          };
          xp = to16(x, x16);
          Bp = to16(Bm, B16);
          Cp = to16(Cm, C16);
        }
        const io::Staged sx(backend_, xp, act_, {B, T, H, P});
        const io::Staged sB(backend_, Bp, act_, {B, T, G, N});
        const io::Staged sC(backend_, Cp, act_, {B, T, G, N});
        const io::Staged sdt(backend_, dt.data(), DType::f32, {B, T, H});
        const io::Staged sy(backend_, y.data(), DType::f32, {B, T, H, P});
        ReplayCache& cache = caches[size_t(l)];
        if (prefill) {
          cache.prefill(slots_view, sx.view(), sB.view(), sC.view(), sdt.view(), sy.view());
        } else {
          cache.verify(slots_view, sx.view(), sB.view(), sC.view(), sdt.view(), sy.view());
        }
        sy.copy_to_host(y.data());
        if (l + 1 < layers_)
          for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
      }
      return y;
    };

    std::vector<uint64_t> ids;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < a_.prompt; ++j) ids.push_back(mix(mix(uint64_t(b), uint64_t(j)), 0));
    if (a_.prompt > 0) forward(ids, a_.prompt, true);

    ModeResult result;
    result.mode = mode;
    result.outputs.assign(size_t(B) * a_.tokens * d_, 0.0f);
    std::vector<int> pos(size_t(B), 0);
    uint64_t verifies = 0;
    const auto start = std::chrono::steady_clock::now();
    for (size_t s = 0; s < schedule_.size(); ++s) {
      // Token identity = (request, position, step): a rejected draft and the token that later
      // takes its position are different tokens.
      ids.clear();
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < W; ++j)
          ids.push_back(mix(mix(uint64_t(b), uint64_t(a_.prompt + pos[size_t(b)] + j)), s + 1));
      const std::vector<float> y = forward(ids, W, false);
      std::vector<int32_t> accepted(schedule_[s].begin(), schedule_[s].end());
      const TensorView accepted_view = host_view(accepted.data(), DType::i32, {B});
      for (ReplayCache& cache : caches) cache.commit(slots_view, accepted_view);
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < accepted[size_t(b)]; ++j) {
          const int p = pos[size_t(b)] + j;
          if (p >= a_.tokens) break;
          std::copy_n(y.begin() + (size_t(b) * W + j) * d_, d_,
                      result.outputs.begin() + (size_t(b) * a_.tokens + p) * d_);
        }
        pos[size_t(b)] += accepted[size_t(b)];
      }
      verifies += uint64_t(B);
      progress.advance();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t generated = 0;
    for (int p : pos) generated += p;

    const SlotLayout layout = SlotLayout::make(shape_, caches.front().config());
    const CacheStats stats = caches.front().stats();
    result.flushes = stats.flushes;
    for (const ReplayCache& cache : caches) result.saturated += cache.stats().saturated;
    result.bytes_per_element = double(layout.checkpoint_bytes()) / double(shape_.state_elements());
    // Every verify reads the read checkpoint once; every flush reads the recurrence checkpoint
    // (the carrier) to fold into. Summed over layers, per generated token.
    const double carrier =
        double(layout.size[SlotLayout::rec] + layout.size[SlotLayout::rec_scale]);
    uint64_t flushes_all = 0;
    for (const ReplayCache& cache : caches) flushes_all += cache.stats().flushes;
    result.read_bytes_per_token =
        (double(verifies) * layers_ * double(layout.read_checkpoint_bytes(mode)) +
         double(flushes_all) * carrier) /
        double(generated);
    // Only flushes write checkpoints during decode (both checkpoints in the separate modes).
    result.write_bytes_per_token =
        double(flushes_all) * double(layout.checkpoint_bytes()) / double(generated);
    result.tokens_per_s = double(generated) / seconds;
    return result;
  }

  // Standard decode at the same acceptance: reads the fp32 state once per verify and writes W
  // states (any prefix can be kept), per generated token, summed over layers.
  std::pair<double, double> standard_decode_bytes_per_token() const {
    const double state = 4.0 * double(shape_.state_elements()) * layers_;
    const double per_verify = 1.0 / observed_accept_mean();
    return {state * per_verify, state * a_.window * per_verify};
  }

 private:
  const DemoArgs& a_;
  SsmShape shape_;
  int layers_;
  BackendKind backend_;
  DType act_;
  size_t d_;
  std::vector<LayerParams> params_;
  std::vector<std::vector<int>> schedule_;
};

std::string bytes_text(double bytes) {
  if (bytes >= 1 << 30) return fmt::format("{:.2f} GiB", bytes / (1 << 30));
  if (bytes >= 1 << 20) return fmt::format("{:.2f} MiB", bytes / (1 << 20));
  if (bytes >= 1 << 10) return fmt::format("{:.1f} KiB", bytes / (1 << 10));
  return fmt::format("{:.0f} B", bytes);
}

void run_demo(const DemoArgs& a) {
  const ModelPreset& preset = find_preset(a.preset);
  const int layers = a.layers > 0 ? a.layers : preset.layers;
  check(a.layers >= 0 && layers <= 1024, "--layers ", a.layers, " is out of range [1, 1024]");
  check(a.batch >= 1 && a.batch <= 4096, "--batch ", a.batch, " is out of range [1, 4096]");
  check(a.tokens >= 1 && a.tokens <= 1 << 20, "--tokens ", a.tokens, " is out of range");
  check(a.prompt >= 0 && a.prompt <= 1 << 20, "--prompt ", a.prompt, " is out of range");
  check(a.window >= 1 && a.window <= a.history / 2, "--window ", a.window,
        " must be in [1, history/2 = ", a.history / 2, "]");
  check(a.accept_mean >= 1 && a.accept_mean <= a.window, "--accept-mean ", a.accept_mean,
        " must be in [1, window = ", a.window, "]");
  std::vector<Mode> modes;
  if (a.modes.empty()) modes.assign(kAllModes.begin(), kAllModes.end());
  for (const std::string& name : a.modes) modes.push_back(parse_mode(name));
  // fp32 runs first: it is the reference of the error columns.
  std::stable_partition(modes.begin(), modes.end(), [](Mode m) { return m == Mode::fp32; });
  if (modes.front() != Mode::fp32) modes.insert(modes.begin(), Mode::fp32);

  const BackendKind backend = resolve_backend(a.backend);
  Demo demo(a, preset.shape, layers, backend);
  const SsmShape& s = preset.shape;
  if (!a.format.json()) {
    fmt::print(
        "replayssm demo: preset {} ({}): H={} P={} N={} G={}, {} layers; {} backend\n"
        "  {} requests x {} generated tokens after a {}-token prompt; window {} (1 + {} drafts), "
        "{:.2f} accepted per verify; {} activations, ring of {}\n\n",
        preset.name, preset.about, s.nheads, s.headdim, s.dstate, s.ngroups, layers,
        backend_name(backend), a.batch, a.tokens, a.prompt, a.window, a.window - 1,
        demo.observed_accept_mean(), a.activation, a.history);
  }

  Progress progress(int64_t(modes.size()) * demo.steps(), !a.no_progress);
  std::vector<ModeResult> results;
  for (Mode mode : modes) {
    progress.set_label(mode_name(mode));
    results.push_back(demo.run(mode, progress));
  }
  progress.finish();

  const std::vector<float>& ref = results.front().outputs;
  double ref_ss = 0;
  for (float v : ref) ref_ss += double(v) * v;
  for (ModeResult& r : results) {
    double ss = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(r.outputs[i]) - ref[i];
      r.max_err = std::max(r.max_err, std::fabs(d));
      ss += d * d;
    }
    r.rms_err = std::sqrt(ss / double(ref.size()));
    r.rel_rms_err = ref_ss > 0 ? std::sqrt(ss / ref_ss) : 0;
  }
  const auto [std_read, std_write] = demo.standard_decode_bytes_per_token();

  if (a.format.json()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const ModeResult& r : results) {
      rows.push_back({{"mode", mode_name(r.mode)},
                      {"stored_bytes_per_element", r.bytes_per_element},
                      {"checkpoint_bytes_read_per_token", r.read_bytes_per_token},
                      {"checkpoint_bytes_written_per_token", r.write_bytes_per_token},
                      {"flushes", r.flushes},
                      {"saturated", r.saturated},
                      {"max_error", r.max_err},
                      {"rms_error", r.rms_err},
                      {"relative_rms_error", r.rel_rms_err},
                      {"tokens_per_second", r.tokens_per_s}});
    }
    nlohmann::json j = {
        {"preset", preset.name},
        {"shape",
         {{"nheads", s.nheads},
          {"headdim", s.headdim},
          {"dstate", s.dstate},
          {"ngroups", s.ngroups}}},
        {"layers", layers},
        {"backend", backend_name(backend)},
        {"batch", a.batch},
        {"tokens", a.tokens},
        {"prompt", a.prompt},
        {"window", a.window},
        {"history", a.history},
        {"activation_dtype", a.activation},
        {"accepted_per_verify", demo.observed_accept_mean()},
        {"standard_decode_fp32",
         {{"state_bytes_read_per_token", std_read}, {"state_bytes_written_per_token", std_write}}},
        {"modes", rows}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  Table table({"mode", "bytes/elem", "ckpt read/token", "write/token", "flushes", "max err",
               "rms err", "rel rms", "tokens/s"});
  for (const ModeResult& r : results) {
    table.add({mode_name(r.mode), fmt::format("{:.3f}", r.bytes_per_element),
               bytes_text(r.read_bytes_per_token), bytes_text(r.write_bytes_per_token),
               std::to_string(r.flushes), sci(r.max_err), sci(r.rms_err), sci(r.rel_rms_err),
               fmt::format("{:.0f}", r.tokens_per_s)});
  }
  fmt::print("{}", table.render());
  fmt::print(
      "\n"
      "bytes/elem       stored checkpoint bytes per state element (both checkpoints in separate "
      "modes)\n"
      "ckpt read/token  checkpoint bytes read per generated token, all layers (readouts + flush "
      "folds)\n"
      "write/token      checkpoint bytes written per generated token, all layers (flushes)\n"
      "flushes          checkpoint rewrites per layer, all requests\n"
      "errors           last layer output of the generated tokens against the fp32 mode\n"
      "standard decode with an fp32 state would read {} and write {} per generated token\n",
      bytes_text(std_read), bytes_text(std_write));
  for (const ModeResult& r : results) {
    if (r.saturated)
      fmt::print("warning: {} saturated {} elements to +-65504\n", mode_name(r.mode), r.saturated);
  }
}

}  // namespace

void register_demo(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* d = app.add_subcommand(
      "demo", "synthetic multi-layer Mamba-2 speculative decode through every checkpoint mode");
  d->add_option("--preset", args->preset, "layer shape and depth: " + preset_names())
      ->capture_default_str();
  d->add_option("--layers", args->layers, "number of layers (default: the preset's)");
  d->add_option("--batch", args->batch, "concurrent requests")->capture_default_str();
  d->add_option("--tokens", args->tokens, "generated tokens per request")->capture_default_str();
  d->add_option("--prompt", args->prompt, "prompt tokens per request (prefill)")
      ->capture_default_str();
  d->add_option("--window", args->window, "verify window, 1 + drafts (1: plain decode)")
      ->capture_default_str();
  d->add_option("--accept-mean", args->accept_mean, "mean accepted tokens per verify")
      ->capture_default_str();
  d->add_option("--history", args->history, "ring capacity")->capture_default_str();
  d->add_option("--activation-dtype", args->activation, "ring dtype: bf16 or fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  d->add_option("--modes", args->modes, "modes to run (default all; fp32 always runs first)")
      ->delimiter(',');
  d->add_option("--seed", args->seed, "random seed")->capture_default_str();
  add_backend_option(d, &args->backend, "auto");
  d->add_flag("--no-progress", args->no_progress, "no progress bar on stderr");
  add_format_option(d, &args->format);
  d->callback([args] { run_demo(*args); });
}

}  // namespace replayssm::cli
