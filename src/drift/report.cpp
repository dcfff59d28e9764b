// Metrics helpers and the drift study's outputs: drift.csv, summary.json and the SVG plots.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "drift/drift.h"
#include "drift/svg.h"
#include "replayssm/error.h"

namespace replayssm::drift {

double stagnation_fraction(std::span<const float> old, std::span<const float> fold,
                           std::span<const uint8_t> old_codes, std::span<const uint8_t> new_codes,
                           size_t code_bytes) {
  int64_t moved = 0, stuck = 0;
  for (size_t i = 0; i < fold.size(); ++i) {
    if (fold[i] == old[i]) continue;  // nothing to store: not a stagnation
    ++moved;
    if (std::memcmp(old_codes.data() + i * code_bytes, new_codes.data() + i * code_bytes,
                    code_bytes) == 0)
      ++stuck;
  }
  return moved ? double(stuck) / double(moved) : 0.0;
}

double fit_growth_exponent(std::span<const double> x, std::span<const double> y) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0) || !std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx;
    sy += ly;
    sxx += lx * lx;
    sxy += lx * ly;
    ++n;
  }
  const double den = n * sxx - sx * sx;
  if (n < 2 || !(std::fabs(den) > 1e-12)) return std::numeric_limits<double>::quiet_NaN();
  return (n * sxy - sx * sy) / den;
}

void write_csv(const DriftResult& result, std::ostream& out) {
  out << "stream,regime,history,arm,seed,step,flushes,out_rel,state_rel,read_rel,signed_rel,"
         "stagnation,zeroed,saturated\n";
  const char* stream = stream_name(result.config.stream);
  for (const Record& r : result.records) {
    out << fmt::format("{},{},{},{},{},{},{},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{:.6e},{}\n",
                       stream, regime_name(r.regime), r.history,
                       result.config.arms[size_t(r.arm)].name, r.seed, r.step, r.flushes, r.out_rel,
                       r.state_rel, r.read_rel, r.signed_rel, r.stagnation, r.zeroed, r.saturated);
  }
}

namespace {

nlohmann::json spread_json(const Spread& s) {
  // nlohmann writes NaN as null, which is what a failed fit should look like in JSON.
  return {{"mean", s.mean}, {"min", s.min}, {"max", s.max}};
}

// Mean, min and max over seeds of one metric at each scheduled flush count, with the mean
// token count as x. A seed's last row (the end of the run) is grouped with the other seeds' last
// rows: in speculative runs the seeds end at different flush counts.
struct Curve {
  std::vector<double> x, mean, lo, hi;
};

Curve curve(const DriftResult& result, Regime regime, int history, int arm,
            double Record::*metric) {
  std::map<int64_t, std::vector<const Record*>> groups;
  std::map<int, const Record*> last;
  for (const Record& r : result.records) {
    if (r.regime != regime || r.history != history || r.arm != arm) continue;
    last[r.seed] = &r;
  }
  for (const Record& r : result.records) {
    if (r.regime != regime || r.history != history || r.arm != arm) continue;
    const bool is_last = last[r.seed] == &r;
    groups[is_last ? std::numeric_limits<int64_t>::max() : r.flushes].push_back(&r);
  }
  Curve c;
  for (const auto& [key, rows] : groups) {
    double sx = 0, sy = 0, lo = INFINITY, hi = -INFINITY;
    for (const Record* r : rows) {
      sx += double(r->step);
      sy += r->*metric;
      lo = std::min(lo, r->*metric);
      hi = std::max(hi, r->*metric);
    }
    c.x.push_back(sx / double(rows.size()));
    c.mean.push_back(sy / double(rows.size()));
    c.lo.push_back(lo);
    c.hi.push_back(hi);
  }
  return c;
}

}  // namespace

std::string summary_json(const DriftResult& result) {
  const DriftConfig& c = result.config;
  nlohmann::json j;
  std::vector<std::string> arms, regimes;
  for (const Arm& a : c.arms) arms.push_back(a.name);
  for (Regime r : c.regimes) regimes.push_back(regime_name(r));
  j["config"] = {{"shape", {c.shape.nheads, c.shape.headdim, c.shape.dstate, c.shape.ngroups}},
                 {"steps", c.steps},
                 {"prefill", c.prefill},
                 {"histories", c.histories},
                 {"regimes", regimes},
                 {"window", c.window},
                 {"accept", c.accept},
                 {"seeds", c.seeds},
                 {"base_seed", c.base_seed},
                 {"fixed_stream", c.fixed_stream},
                 {"stream", stream_name(c.stream)},
                 {"trace", c.recorded ? c.recorded->source : std::string()},
                 {"activation", dtype_name(c.activation)},
                 {"backend", backend_name(c.backend)},
                 {"arms", arms}};
  j["seconds"] = result.seconds;
  j["metrics"] = {
      {"out_rel", "||y - y64|| / ||y64|| over the tokens since the previous row"},
      {"state_rel", "||S - S64|| / ||S64||, S the recurrence checkpoint after a flush"},
      {"read_rel", "the same for the read checkpoint (what the readout multiplies with C)"},
      {"signed_rel", "sum((S - S64) * sign(S64)) / sum|S64|; negative: the state shrinks"},
      {"growth", "slope of log state_rel against log flushes (flushes >= 4)"},
      {"stagnation",
       "fraction of elements whose checkpoint value did not change at a flush "
       "although the FP32 fold did"},
      {"zeroed", "fraction of elements non-zero in FP64 but zero in the read checkpoint"}};
  nlohmann::json rows = nlohmann::json::array();
  for (const ArmSummary& s : result.summaries) {
    rows.push_back({{"regime", regime_name(s.regime)},
                    {"history", s.history},
                    {"arm", s.name},
                    {"steps", s.steps},
                    {"flushes", s.flushes},
                    {"out_final", spread_json(s.out_final)},
                    {"out_max", spread_json(s.out_max)},
                    {"state_final", spread_json(s.state_final)},
                    {"state_max", spread_json(s.state_max)},
                    {"read_final", spread_json(s.read_final)},
                    {"signed_final", spread_json(s.signed_final)},
                    {"growth", spread_json(s.growth)},
                    {"stagnation", s.stagnation},
                    {"zeroed", s.zeroed},
                    {"counters",
                     {{"flushes", s.stats.flushes},
                      {"checkpoint_writes", s.stats.checkpoint_writes},
                      {"saturated", s.stats.saturated},
                      {"nonfinite", s.stats.nonfinite}}}});
  }
  j["arms"] = rows;
  return j.dump(2) + "\n";
}

std::vector<std::string> write_plots(const DriftResult& result, const std::string& dir) {
  const DriftConfig& c = result.config;
  struct Metric {
    const char* file;
    const char* label;
    double Record::*member;
    bool log_y;
  };
  const Metric metrics[] = {
      {"state", "state error ||S - S64|| / ||S64|| (recurrence checkpoint)", &Record::state_rel,
       true},
      {"read", "read-checkpoint error ||R - S64|| / ||S64||", &Record::read_rel, true},
      {"out", "output error ||y - y64|| / ||y64||", &Record::out_rel, true},
      {"signed", "signed state error sum((S - S64) sign S64) / sum|S64|", &Record::signed_rel,
       false},
  };
  std::vector<std::string> files;
  for (Regime regime : c.regimes) {
    for (int history : c.histories) {
      for (const Metric& m : metrics) {
        Plot plot;
        plot.title =
            fmt::format("{} stream, {} decode, history {}: {}", stream_name(c.stream),
                        regime == Regime::ar ? "autoregressive" : "speculative", history, m.file);
        plot.x_label = "decoded tokens";
        plot.y_label = m.label;
        plot.log_x = true;
        plot.log_y = m.log_y;
        for (size_t a = 0; a < c.arms.size(); ++a) {
          const Curve cv = curve(result, regime, history, int(a), m.member);
          PlotSeries s;
          s.name = c.arms[a].name;
          s.color = plot_color(int(a));
          s.dashed = c.arms[a].name.starts_with("separate") || c.arms[a].reencode != nullptr;
          s.x = cv.x;
          s.y = cv.mean;
          if (c.seeds > 1) {
            s.y_lo = cv.lo;
            s.y_hi = cv.hi;
          }
          plot.series.push_back(std::move(s));
        }
        const std::string name = fmt::format("{}_{}_h{}.svg", m.file, regime_name(regime), history);
        std::ofstream f(dir + "/" + name);
        check(bool(f), "cannot write ", dir, "/", name);
        f << plot.render();
        check(bool(f), "error writing ", dir, "/", name);
        files.push_back(name);
      }
    }
  }
  return files;
}

}  // namespace replayssm::drift
