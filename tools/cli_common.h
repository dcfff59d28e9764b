// Pieces shared by the subcommands of the `replayssm` program: mode and backend options in both
// vocabularies, plain tables, JSON output selection and a stderr progress bar.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm::cli {

// --mode NAME (SPEC names) or the seed's --checkpoint-mode separate|shared --state-dtype X.
struct ModeArgs {
  std::string mode;
  std::string checkpoint_mode;
  std::string state_dtype;
};
void add_mode_options(CLI::App* app, ModeArgs* args, const std::string& what);
// Empty when no mode option was given; throws replayssm::Error on unknown names.
std::optional<Mode> resolve_mode(const ModeArgs& args);

// --backend auto|cpu|cuda; auto picks CUDA when it is built and a device is present.
void add_backend_option(CLI::App* app, std::string* backend, const std::string& default_value);
BackendKind resolve_backend(const std::string& name);

// -o table|json for commands that print a table.
struct OutputFormat {
  std::string format = "table";
  bool json() const { return format == "json"; }
};
void add_format_option(CLI::App* app, OutputFormat* format);

// "4,16,32,2" -> H, P, N, G.
SsmShape parse_shape(const std::string& text);

// A left-aligned first column and right-aligned other columns, as plain text.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Compact number formatting for tables: 3 significant digits, scientific when small or large.
std::string sci(double value);

// A one-line progress bar on stderr, redrawn in place. Silent unless stderr is a terminal, so
// logs and tests do not fill with carriage returns.
class Progress {
 public:
  Progress(int64_t total, bool enabled);
  ~Progress();
  void set_label(std::string label) { label_ = std::move(label); }
  void advance(int64_t n = 1);
  void finish();

 private:
  void draw();
  int64_t total_, done_ = 0;
  bool enabled_;
  std::string label_;
  std::chrono::steady_clock::time_point last_draw_{};
};

// Where a result came from, besides version() and build_commit() (replayssm/version.h): the
// command line (arguments with spaces or shell characters single-quoted) and the UTC time it
// started (ISO 8601). main() records the command line before parsing; benchmark outputs print it.
struct RunInfo {
  std::string command, started_utc;
};
void record_command_line(int argc, const char* const* argv);
const RunInfo& run_info();
// "VERSION (commit COMMIT)", as --version prints it.
std::string version_line();

// Thrown by a command that has already reported its outcome and wants a non-zero exit status
// (e.g. `trace check` on a mismatch), so main() prints no extra error line.
struct ExitStatus {
  int code;
};

// Subcommand registration (one file each).
void register_trace(CLI::App& app);
void register_ckpt(CLI::App& app);
void register_demo(CLI::App& app);
void register_plan(CLI::App& app);
void register_bench(CLI::App& app);  // tools/cmd_bench.cpp
void register_drift(CLI::App& app);
void register_generate(CLI::App& app);  // tools/cmd_generate.cpp

}  // namespace replayssm::cli
