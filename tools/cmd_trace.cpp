// replayssm trace gen | run | check
#include <fmt/format.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::cli {
namespace {

struct GenArgs {
  std::string shape = "4,16,32,2";
  ModeArgs mode;
  int steps = 32, slots = 3, window = 4, history = 16;
  double accept_mean = 0;
  uint64_t seed = 1;
  std::string activation = "fp32";
  bool no_lifecycle = false;
  std::string out;
};

void run_gen(const GenArgs& a) {
  io::TraceGenOptions o;
  o.shape = parse_shape(a.shape);
  o.mode = resolve_mode(a.mode).value_or(Mode::fp32);
  o.steps = a.steps;
  o.slots = a.slots;
  o.window = a.window;
  o.history = a.history;
  o.accept_mean = a.accept_mean;
  o.seed = a.seed;
  o.activation_dtype = parse_dtype(a.activation);
  o.lifecycle = !a.no_lifecycle;
  const io::Trace trace = io::generate_trace(o);
  const io::StFile file = io::trace_to_file(trace);
  const std::vector<uint8_t> bytes = io::serialize_safetensors(file);
  io::write_file_bytes(a.out, bytes);
  fmt::print("wrote {}: {} ops, {} tensors, {:.1f} KiB ({} mode, shape {},{},{},{})\n", a.out,
             trace.ops.size(), file.tensors.size(), bytes.size() / 1024.0,
             mode_name(trace.cache.mode), o.shape.nheads, o.shape.headdim, o.shape.dstate,
             o.shape.ngroups);
}

struct RunArgs {
  std::string trace, out, backend;
  ModeArgs mode;
  bool quiet = false;
};

std::string default_output(const std::string& trace) {
  const std::string suffix = ".safetensors";
  std::string stem = trace;
  if (stem.size() > suffix.size() && stem.ends_with(suffix))
    stem.resize(stem.size() - suffix.size());
  return stem + ".out.safetensors";
}

void run_run(const RunArgs& a) {
  const io::Trace trace = io::read_trace(a.trace);
  io::RunOptions options;
  options.backend = resolve_backend(a.backend);
  options.mode = resolve_mode(a.mode);
  io::RunSummary summary;
  const io::StFile out = io::run_trace(trace, options, &summary);
  const std::string path = a.out.empty() ? default_output(a.trace) : a.out;
  io::write_safetensors(path, out);
  if (!a.quiet) {
    fmt::print("ran {} ops of {} on {} in {} mode: {} flushes, {} saturated, {:.3f} s -> {}\n",
               summary.ops, a.trace, backend_name(options.backend),
               mode_name(options.mode.value_or(trace.cache.mode)), summary.stats.flushes,
               summary.stats.saturated, summary.seconds, path);
  }
}

struct CheckArgs {
  std::string out, ref;
  double rtol = 1e-4, atol = 1e-5;
  bool all = false;
  OutputFormat format;
};

// The family of a tensor name: "y.12" -> "y", "state.0" -> "state".
std::string family(const std::string& name) { return name.substr(0, name.find('.')); }

void run_check(const CheckArgs& a) {
  check(a.rtol >= 0 && a.atol >= 0, "--rtol and --atol must be non-negative");
  const io::StFile out = io::read_safetensors(a.out);
  const io::StFile ref = io::read_safetensors(a.ref);
  const io::CompareResult result = io::compare_outputs(out, ref, a.rtol, a.atol);
  int failed = 0;
  for (const io::TensorDiff& d : result.tensors) failed += d.ok() ? 0 : 1;

  if (a.format.json()) {
    nlohmann::json j = {{"out", a.out},   {"ref", a.ref},      {"rtol", a.rtol},
                        {"atol", a.atol}, {"ok", result.ok()}, {"failed", failed}};
    nlohmann::json rows = nlohmann::json::array();
    for (const io::TensorDiff& d : result.tensors) {
      rows.push_back({{"name", d.name},
                      {"shape", d.shape},
                      {"max_abs", d.max_abs},
                      {"max_rel", d.max_rel},
                      {"mismatches", d.mismatches},
                      {"nonfinite", d.nans},
                      {"problem", d.problem},
                      {"ok", d.ok()}});
    }
    j["tensors"] = std::move(rows);
    fmt::print("{}\n", j.dump(2));
  } else {
    Table table({"tensor", "shape", "max abs", "max rel", "mismatch", "nan/inf", "status"});
    // Without --all, tensors of one family (y.*, state.*, ...) that all pass share one row, so a
    // long trace still gives a short table; every failing tensor gets its own row.
    struct Family {
      int count = 0;
      double max_abs = 0, max_rel = 0;
    };
    std::map<std::string, Family> families;
    for (const io::TensorDiff& d : result.tensors) {
      if (a.all || !d.ok()) {
        table.add({d.name, d.shape, sci(d.max_abs), sci(d.max_rel), std::to_string(d.mismatches),
                   std::to_string(d.nans),
                   d.ok() ? "ok" : (d.problem.empty() ? "FAIL" : d.problem)});
      } else {
        Family& f = families[family(d.name)];
        f.count += 1;
        f.max_abs = std::max(f.max_abs, d.max_abs);
        f.max_rel = std::max(f.max_rel, d.max_rel);
      }
    }
    for (const auto& [name, f] : families) {
      table.add({fmt::format("{}.* ({} ok)", name, f.count), "", sci(f.max_abs), sci(f.max_rel),
                 "0", "0", "ok"});
    }
    fmt::print("{}", table.render());
    fmt::print("{}: {} of {} tensors differ (rtol {}, atol {})\n", result.ok() ? "OK" : "MISMATCH",
               failed, result.tensors.size(), a.rtol, a.atol);
  }
  if (!result.ok()) throw ExitStatus{1};
}

}  // namespace

void register_trace(CLI::App& app) {
  CLI::App* trace = app.add_subcommand(
      "trace", "record, replay and compare cache-operation traces (docs/trace-format.md)");
  trace->require_subcommand(1);

  auto gen = std::make_shared<GenArgs>();
  CLI::App* g = trace->add_subcommand("gen", "write a random but valid trace");
  g->add_option("--shape", gen->shape, "H,P,N,G: heads, headdim, dstate, groups")
      ->capture_default_str();
  add_mode_options(g, &gen->mode, "checkpoint mode recorded in the trace (default fp32)");
  g->add_option("--steps", gen->steps, "decode/verify steps")->capture_default_str();
  g->add_option("--slots", gen->slots, "cache slots")->capture_default_str();
  g->add_option("--window", gen->window, "largest verify window, 1 + drafts (1: decode only)")
      ->capture_default_str();
  g->add_option("--accept-mean", gen->accept_mean,
                "mean accepted tokens per verify (default 0.54 * window)");
  g->add_option("--history", gen->history, "ring capacity")->capture_default_str();
  g->add_option("--seed", gen->seed, "random seed (also the cache's Philox seed)")
      ->capture_default_str();
  g->add_option("--activation-dtype", gen->activation, "ring dtype: fp32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  g->add_flag("--no-lifecycle", gen->no_lifecycle,
              "no forks, releases, opens, snapshots or exports");
  g->add_option("-o,--output", gen->out, "trace file to write")->required();
  g->callback([gen] { run_gen(*gen); });

  auto run = std::make_shared<RunArgs>();
  CLI::App* r = trace->add_subcommand("run", "replay a trace and write every output");
  r->add_option("TRACE", run->trace, "trace file")->required();
  add_backend_option(r, &run->backend, "cpu");
  add_mode_options(r, &run->mode, "run in this mode instead of the trace's");
  r->add_option("-o,--output", run->out, "output file (default TRACE.out.safetensors)");
  r->add_flag("-q,--quiet", run->quiet, "print nothing on success");
  r->callback([run] { run_run(*run); });

  auto chk = std::make_shared<CheckArgs>();
  CLI::App* c = trace->add_subcommand(
      "check", "compare two output files tensor by tensor; exit 1 on a mismatch or NaN");
  c->add_option("OUT", chk->out, "output file to check")->required();
  c->add_option("REF", chk->ref, "reference output file")->required();
  c->add_option("--rtol", chk->rtol, "relative tolerance: |out-ref| <= atol + rtol*|ref|")
      ->capture_default_str();
  c->add_option("--atol", chk->atol, "absolute tolerance")->capture_default_str();
  c->add_flag("--all", chk->all, "one table row per tensor (default: passing tensors grouped)");
  add_format_option(c, &chk->format);
  c->callback([chk] { run_check(*chk); });
}

}  // namespace replayssm::cli
