// replayssm drift: the accuracy study of every checkpoint mode (issue 7, docs/accuracy.md).
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli_common.h"
#include "drift/drift.h"
#include "replayssm/error.h"

namespace replayssm::cli {
namespace {

struct DriftArgs {
  std::string shape = "8,16,32,2";
  int64_t steps = 4096;
  std::string modes = "all";
  std::vector<int> histories{16};
  std::vector<std::string> regimes{"ar", "spec"};
  int window = 8;
  double accept = 0.81;
  int seeds = 3;
  uint64_t seed = 1;
  bool fixed_stream = false;
  std::vector<std::string> streams{"mamba2"};
  std::string trace;
  std::string activation = "bf16";
  int prefill = 64;
  double record_ratio = 1.1;
  std::string backend = "cpu";
  std::string out;
  bool quiet = false;
  bool plots = true;
  OutputFormat format;
};

std::string spread_text(const drift::Spread& s, int seeds) {
  if (seeds <= 1 || s.min == s.max) return sci(s.mean);
  return fmt::format("{} [{}..{}]", sci(s.mean), sci(s.min), sci(s.max));
}

void print_table(const drift::DriftResult& r) {
  const int seeds = r.config.seeds;
  Table table({"regime", "L", "arm", "out@end", "state@end", "state max", "read@end", "growth",
               "signed@end", "stagn", "zeroed", "sat"});
  for (const drift::ArmSummary& s : r.summaries) {
    table.add({drift::regime_name(s.regime), std::to_string(s.history), s.name,
               sci(s.out_final.mean), spread_text(s.state_final, seeds), sci(s.state_max.mean),
               sci(s.read_final.mean), spread_text(s.growth, seeds), sci(s.signed_final.mean),
               sci(s.stagnation), sci(s.zeroed), std::to_string(s.stats.saturated)});
  }
  std::cout << table.render();
}

void run(const DriftArgs& args, bool shape_given) {
  drift::DriftConfig base;
  base.shape = parse_shape(args.shape);
  base.steps = args.steps;
  base.prefill = args.prefill;
  base.histories = args.histories;
  base.regimes.clear();
  for (const std::string& r : args.regimes) base.regimes.push_back(drift::parse_regime(r));
  base.window = args.window;
  base.accept = args.accept;
  base.seeds = args.seeds;
  base.base_seed = args.seed;
  base.fixed_stream = args.fixed_stream;
  base.activation = parse_dtype(args.activation);
  check(base.activation == DType::bf16 || base.activation == DType::f32,
        "--act must be bf16 or fp32, got ", args.activation);
  base.backend = resolve_backend(args.backend);
  base.arms = drift::parse_arms(args.modes);
  base.record_ratio = args.record_ratio;

  std::vector<drift::StreamKind> streams;
  if (!args.trace.empty()) {
    // Tokens and layer from a trace file (e.g. captured from a model); it fixes the shape.
    base.recorded =
        std::make_shared<drift::RecordedStreams>(drift::read_recorded_streams(args.trace));
    if (!shape_given) base.shape = base.recorded->shape;
    streams.push_back(drift::StreamKind::recorded);
  }
  for (const std::string& s : streams.empty() ? args.streams : std::vector<std::string>{}) {
    if (s == "all") {
      for (drift::StreamKind k : drift::all_streams()) streams.push_back(k);
    } else {
      streams.push_back(drift::parse_stream(s));
    }
  }
  const bool tty = isatty(STDERR_FILENO);
  for (drift::StreamKind stream : streams) {
    drift::DriftConfig config = base;
    config.stream = stream;
    config.validate();
    // One stream writes into DIR; several write into DIR/<stream>/.
    const std::string dir =
        streams.size() > 1 ? args.out + "/" + drift::stream_name(stream) : args.out;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    check(!ec, "cannot create output directory ", dir, ": ", ec.message());

    std::string last_label;
    int64_t next_line = 0;  // without a terminal: a line per label and per tenth of the work
    Progress steps_bar(
        config.steps * config.seeds * int64_t(config.histories.size() * config.regimes.size()),
        !args.quiet);
    int64_t shown = 0;
    const drift::DriftResult result = drift::run_drift(config, [&](int64_t done, int64_t total,
                                                                   const std::string& label) {
      if (!label.empty()) steps_bar.set_label(label);
      steps_bar.advance(done - shown);
      shown = done;
      if (!args.quiet && !tty && ((label != last_label && !label.empty()) || done >= next_line)) {
        fmt::print(stderr, "drift: {} stream: {} ({}/{} token-steps)\n", drift::stream_name(stream),
                   label.empty() ? last_label : label, done, total);
        if (!label.empty()) last_label = label;
        next_line = done + std::max<int64_t>(total / 10, 1);
      }
    });
    steps_bar.finish();

    {
      std::ofstream csv(dir + "/drift.csv");
      check(bool(csv), "cannot write ", dir, "/drift.csv");
      drift::write_csv(result, csv);
      std::ofstream json(dir + "/summary.json");
      check(bool(json), "cannot write ", dir, "/summary.json");
      json << drift::summary_json(result);
      check(bool(csv) && bool(json), "error writing the results into ", dir);
    }
    const std::vector<std::string> plots =
        args.plots ? drift::write_plots(result, dir) : std::vector<std::string>{};
    if (args.format.json()) {
      std::cout << drift::summary_json(result);
    } else {
      fmt::print("stream {}: shape {},{},{},{}, {} steps, {} seed(s), {} backend, {:.1f} s\n",
                 drift::stream_name(stream), config.shape.nheads, config.shape.headdim,
                 config.shape.dstate, config.shape.ngroups, config.steps, config.seeds,
                 backend_name(config.backend), result.seconds);
      print_table(result);
      fmt::print("wrote {0}/drift.csv, {0}/summary.json and {1} plots\n", dir, plots.size());
    }
  }
}

}  // namespace

void register_drift(CLI::App& app) {
  auto args = std::make_shared<DriftArgs>();
  CLI::App* cmd = app.add_subcommand(
      "drift",
      "accuracy of every checkpoint mode over long decodes, against an FP64 recurrence "
      "(docs/accuracy.md)");
  CLI::Option* shape_option =
      cmd->add_option("--shape", args->shape, "H,P,N,G")->capture_default_str();
  cmd->add_option("--steps", args->steps, "decode tokens per run (after the prefill)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cmd->add_option("--modes,--arms", args->modes,
                  "'all' or a comma list: fp32,bf16,fp16,fp16-sr7,fp16-sr13,shared-fp8,"
                  "shared-int8,separate-fp8,separate-nvfp4 (also fp16-srR, and the biased "
                  "reference arms fp16-trunc, fp16-srR-biased)")
      ->capture_default_str();
  cmd->add_option("--history", args->histories, "ring length(s), e.g. 8,16,32")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--regime", args->regimes, "ar (W = 1) and/or spec (W = window)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"ar", "spec"}));
  cmd->add_option("--window", args->window,
                  "speculative window W = 1 + drafts (capped at history/2)")
      ->capture_default_str();
  cmd->add_option("--accept", args->accept,
                  "per-draft acceptance probability (0.81 at W = 8: mean 4.3 accepted)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seeds", args->seeds, "runs side by side (tokens, acceptance and SR bits)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seed", args->seed, "base seed (layer parameters, SR key)")
      ->capture_default_str();
  cmd->add_flag("--fixed-stream", args->fixed_stream,
                "every seed decodes the same tokens (the spread is then SR noise only)");
  cmd->add_option("--stream", args->streams,
                  "mamba2, long, tiny, bursts, mix or all (several: DIR/<stream>/)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--trace", args->trace,
                  "decode the token sequences of a trace file (one per slot; seed s takes "
                  "sequence s) with its layer, instead of a synthetic --stream")
      ->check(CLI::ExistingFile);
  cmd->add_option("--act", args->activation, "activation dtype of the ring: bf16 or fp32")
      ->capture_default_str();
  cmd->add_option("--prefill", args->prefill, "prompt tokens before decoding")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--record-ratio", args->record_ratio,
                  "a CSV row at flushes 1..16, then whenever the flush count grows by this "
                  "factor")
      ->capture_default_str();
  add_backend_option(cmd, &args->backend, "cpu");
  cmd->add_option("--out", args->out, "output folder (drift.csv, summary.json, *.svg)")->required();
  cmd->add_flag("-q,--quiet", args->quiet, "no progress on stderr");
  cmd->add_flag("--plots,!--no-plots", args->plots, "write the SVG plots (default) or not");
  add_format_option(cmd, &args->format);
  cmd->callback([args, shape_option] { run(*args, shape_option->count() > 0); });
}

}  // namespace replayssm::cli
