#include "cli_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "replayssm/error.h"
#include "replayssm/version.h"

namespace replayssm::cli {

void add_mode_options(CLI::App* app, ModeArgs* args, const std::string& what) {
  auto* mode = app->add_option("--mode", args->mode,
                               what +
                                   ": fp32, bf16, fp16, fp16-sr, shared-fp8, shared-int8, "
                                   "separate-fp8 or separate-nvfp4");
  // The seed's spelling, with and without its engine prefix.
  auto* cm = app->add_option("--checkpoint-mode,--replayssm-checkpoint-mode", args->checkpoint_mode,
                             "seed vocabulary: separate|shared (with --state-dtype)");
  auto* sd = app->add_option("--state-dtype,--replayssm-state-dtype", args->state_dtype,
                             "seed vocabulary: fp8|nvfp4 (separate), fp8|int8 (shared)");
  mode->excludes(cm)->excludes(sd);
  cm->needs(sd);
  sd->needs(cm);
}

std::optional<Mode> resolve_mode(const ModeArgs& args) {
  if (!args.mode.empty()) return parse_mode(args.mode);
  if (!args.checkpoint_mode.empty()) return parse_mode(args.checkpoint_mode, args.state_dtype);
  return std::nullopt;
}

void add_backend_option(CLI::App* app, std::string* backend, const std::string& default_value) {
  *backend = default_value;
  app->add_option("--backend", *backend,
                  "auto, cpu or cuda (auto: cuda when built with CUDA and a GPU is present)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

BackendKind resolve_backend(const std::string& name) {
  if (name == "auto") {
    return backend_available(BackendKind::cuda) ? BackendKind::cuda : BackendKind::cpu;
  }
  const BackendKind kind = parse_backend(name);
  check(backend_available(kind), "backend '", name,
        "' is not available (not built with CUDA, or no GPU present); use --backend cpu");
  return kind;
}

void add_format_option(CLI::App* app, OutputFormat* format) {
  app->add_option("-o,--output", format->format, "table (default) or json on stdout")
      ->check(CLI::IsMember({"table", "json"}));
}

SsmShape parse_shape(const std::string& text) {
  std::vector<int> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(!part.empty() && used == part.size() && value > 0, "--shape '", text,
          "': expected four positive integers H,P,N,G (e.g. 8,64,128,1)");
    values.push_back(value);
    start = comma + 1;
  }
  check(values.size() == 4, "--shape '", text, "': expected four values H,P,N,G, got ",
        values.size());
  SsmShape shape{values[0], values[1], values[2], values[3]};
  shape.validate();
  return shape;
}

std::string Table::render() const {
  std::vector<size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  std::string out;
  auto line = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string& cell = i < row.size() ? row[i] : std::string();
      if (i) out += "  ";
      out += i == 0 ? fmt::format("{:<{}}", cell, width[i]) : fmt::format("{:>{}}", cell, width[i]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  line(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  out += std::string(total + 2 * (width.size() - 1), '-') + "\n";
  for (const auto& row : rows_) line(row);
  return out;
}

namespace {
RunInfo& run_info_storage() {
  static RunInfo info;
  return info;
}
std::string shell_quoted(const std::string& arg) {
  const bool plain = !arg.empty() && arg.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-+=.,/:@%") == std::string::npos;
  if (plain) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

void record_command_line(int argc, const char* const* argv) {
  RunInfo& info = run_info_storage();
  info.command.clear();
  for (int i = 0; i < argc; ++i) info.command += (i ? " " : "") + shell_quoted(argv[i]);
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  info.started_utc = text;
}

const RunInfo& run_info() { return run_info_storage(); }

std::string version_line() { return std::string(version()) + " (commit " + build_commit() + ")"; }

std::string sci(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  const double a = std::fabs(value);
  if (a >= 1e-3 && a < 1e5) return fmt::format("{:.4g}", value);
  return fmt::format("{:.2e}", value);
}

Progress::Progress(int64_t total, bool enabled)
    : total_(std::max<int64_t>(total, 1)), enabled_(enabled && isatty(STDERR_FILENO)) {}

Progress::~Progress() { finish(); }

void Progress::advance(int64_t n) {
  done_ = std::min(done_ + n, total_);
  const auto now = std::chrono::steady_clock::now();
  // Redraw at most 20 times a second: terminals are slow compared to a decode step.
  if (now - last_draw_ > std::chrono::milliseconds(50) || done_ == total_) {
    last_draw_ = now;
    draw();
  }
}

void Progress::draw() {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const int filled = int(kWidth * done_ / total_);
  std::fprintf(stderr, "\r[%s%s] %3d%% %-40.40s", std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '.').c_str(), int(100 * done_ / total_),
               label_.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  // Erase the bar so the table printed next starts on a clean line.
  std::fprintf(stderr, "\r%*s\r", 80, "");
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace replayssm::cli
