// `replayssm plan`: the capacity side of the trade-off. Bytes per slot per layer and per model
// for every checkpoint mode next to the standard-decode baseline, and how many concurrent
// requests fit in a memory budget.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cache/layout.h"
#include "cli_common.h"
#include "replayssm/error.h"
#include "replayssm/presets.h"

namespace replayssm::cli {
namespace {

struct PlanArgs {
  std::string model = "nemotron-h-8b";
  ModeArgs mode;
  double memory_gb = 80.0;
  int history = 16;
  int max_window = 8;
  std::string activation = "bf16";
  OutputFormat format;
};

struct PlanRow {
  std::string name;
  double bytes_per_layer;  // per request
};

void run_plan(const PlanArgs& a) {
  const ModelPreset& preset = find_preset(a.model);
  const SsmShape& s = preset.shape;
  check(a.memory_gb > 0, "--memory must be positive, got ", a.memory_gb);
  const std::optional<Mode> only = resolve_mode(a.mode);
  const double state = double(s.state_elements());
  const int W = a.max_window;

  std::vector<PlanRow> rows;
  // The standard kernels keep one state per request, and for speculative decoding one more per
  // verified token (the intermediate states any accepted prefix may be taken from).
  for (DType d : {DType::f32, DType::bf16}) {
    const std::string name = std::string("standard ") + dtype_name(d);
    rows.push_back({name + " (decode)", state * dtype_size(d)});
    rows.push_back({fmt::format("{} (spec W={})", name, W), state * dtype_size(d) * (1 + W)});
  }
  for (Mode mode : kAllModes) {
    if (only && mode != *only) continue;
    CacheConfig config;
    config.mode = mode;
    config.history = a.history;
    config.max_window = W;
    config.activation_dtype = parse_dtype(a.activation);
    config.validate(s);
    const SlotLayout layout = SlotLayout::make(s, config);
    double bytes = 0;
    for (size_t size : layout.size) bytes += double(size);
    rows.push_back({mode_name(mode), bytes});
  }

  const double budget = a.memory_gb * 1e9;
  const double baseline = rows[0].bytes_per_layer;
  if (a.format.json()) {
    nlohmann::json out = nlohmann::json::array();
    for (const PlanRow& r : rows)
      out.push_back({{"name", r.name},
                     {"bytes_per_layer", r.bytes_per_layer},
                     {"bytes_per_request", r.bytes_per_layer * preset.layers},
                     {"requests", int64_t(budget / (r.bytes_per_layer * preset.layers))}});
    fmt::print("{}\n", nlohmann::json{{"model", preset.name},
                                      {"layers", preset.layers},
                                      {"memory_bytes", budget},
                                      {"rows", out}}
                           .dump(2));
    return;
  }
  fmt::print(
      "replayssm plan: {} ({}), {} Mamba layers of H={} P={} N={} G={}; {:.1f} GB for SSM "
      "state; history {}, window {}, {} ring\n\n",
      preset.name, preset.about, preset.layers, s.nheads, s.headdim, s.dstate, s.ngroups,
      a.memory_gb, a.history, W, a.activation);
  Table table({"layout", "MiB/request/layer", "MiB/request", "requests", "vs fp32 decode"});
  for (const PlanRow& r : rows) {
    const double per_request = r.bytes_per_layer * preset.layers;
    table.add({r.name, fmt::format("{:.3f}", r.bytes_per_layer / (1 << 20)),
               fmt::format("{:.1f}", per_request / (1 << 20)),
               fmt::format("{}", int64_t(budget / per_request)),
               fmt::format("{:.2f}x", baseline / r.bytes_per_layer)});
  }
  fmt::print("{}", table.render());
  fmt::print(
      "\nreplay modes: checkpoint(s) + ring of {} entries (x, B in {}, delta fp32); conv state "
      "and activations not counted\n",
      a.history, a.activation);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* p = app.add_subcommand(
      "plan", "bytes per request and concurrent requests per checkpoint mode for a model");
  p->add_option("--model", args->model, "model preset: " + preset_names())->capture_default_str();
  add_mode_options(p, &args->mode, "only this checkpoint mode (default: all)");
  p->add_option("--memory", args->memory_gb, "GB available for SSM state")->capture_default_str();
  p->add_option("--history", args->history, "ring capacity")->capture_default_str();
  p->add_option("--max-window", args->max_window, "verify window, 1 + drafts")
      ->capture_default_str();
  p->add_option("--activation-dtype", args->activation, "ring dtype: bf16 or fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  add_format_option(p, &args->format);
  p->callback([args] { run_plan(*args); });
}

}  // namespace replayssm::cli
