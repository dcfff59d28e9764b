// Tests of the drift study (src/drift): the metrics, the engine's lock step, and that the study
// can tell an unbiased rounding from a biased one. Shapes and step counts are small: the whole
// file runs in a few seconds on two cores.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "drift/drift.h"
#include "drift/svg.h"
#include "io/safetensors.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::drift {
namespace {

DriftConfig small_config(StreamKind stream, const std::string& arms, int64_t steps = 1024) {
  DriftConfig c;
  c.shape = SsmShape{4, 8, 16, 2};
  c.steps = steps;
  c.seeds = 2;
  c.stream = stream;
  c.regimes = {Regime::ar};
  c.arms = parse_arms(arms);
  return c;
}

// The name by value (a view): g++ 13 warns of a dangling reference wherever a function that
// returns a reference is given a temporary std::string, as the callers' literals would be.
const ArmSummary& summary_of(const DriftResult& r, std::string_view name,
                             Regime regime = Regime::ar) {
  for (const ArmSummary& s : r.summaries)
    if (s.name == name && s.regime == regime) return s;
  throw std::runtime_error("no summary for " + std::string(name));
}

std::vector<const Record*> rows_of(const DriftResult& r, const std::string& name, Regime regime) {
  std::vector<const Record*> out;
  for (const Record& rec : r.records)
    if (r.config.arms[size_t(rec.arm)].name == name && rec.regime == regime) out.push_back(&rec);
  return out;
}

TEST(DriftFit, GrowthExponentOfSyntheticSeries) {
  std::vector<double> x, sq, lin, flat;
  for (int i = 1; i <= 200; ++i) {
    x.push_back(i);
    sq.push_back(0.01 * std::sqrt(double(i)));
    lin.push_back(3e-4 * i);
    flat.push_back(0.02);
  }
  EXPECT_NEAR(fit_growth_exponent(x, sq), 0.5, 1e-12);
  EXPECT_NEAR(fit_growth_exponent(x, lin), 1.0, 1e-12);
  EXPECT_NEAR(fit_growth_exponent(x, flat), 0.0, 1e-12);
  // Multiplicative noise of +-10% moves the slope only slightly over two decades.
  std::vector<double> noisy = sq;
  for (size_t i = 0; i < noisy.size(); ++i) noisy[i] *= (i % 2 ? 1.1 : 0.9);
  EXPECT_NEAR(fit_growth_exponent(x, noisy), 0.5, 0.02);
  // Non-positive points are skipped; fewer than two usable points give NaN.
  std::vector<double> with_zero = lin;
  with_zero[5] = 0;
  EXPECT_NEAR(fit_growth_exponent(x, with_zero), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(fit_growth_exponent(std::vector<double>{1.0}, std::vector<double>{1.0})));
  EXPECT_TRUE(std::isnan(
      fit_growth_exponent(std::vector<double>{2.0, 2.0}, std::vector<double>{1.0, 3.0})));
}

TEST(DriftMetrics, StagnationCountsOnlyElementsWhoseFoldMoved) {
  const std::vector<float> old{1, 2, 3, 4}, fold{1, 2.1f, 3.1f, 4.1f};
  // One-byte codes: element 0 did not move in FP32; of the three that did, two kept their code.
  const std::vector<uint8_t> before{10, 20, 30, 40}, after{11, 20, 31, 40};
  EXPECT_NEAR(stagnation_fraction(old, fold, before, after, 1), 2.0 / 3.0, 1e-12);
  EXPECT_EQ(stagnation_fraction(old, old, before, after, 1), 0.0);
  // Two-byte codes compare whole elements.
  const std::vector<uint8_t> b2{1, 0, 2, 0, 3, 0, 4, 0}, a2{1, 0, 2, 1, 3, 0, 4, 0};
  EXPECT_NEAR(stagnation_fraction(old, fold, b2, a2, 2), 2.0 / 3.0, 1e-12);
}

TEST(DriftArms, ParseNamesAndRejectBadOnes) {
  const std::vector<Arm> all = parse_arms("all");
  ASSERT_EQ(all.size(), 9u);
  EXPECT_EQ(all[3].name, "fp16-sr7");
  EXPECT_EQ(all[4].name, "fp16-sr13");
  EXPECT_EQ(all[4].sr_bits, 13);
  EXPECT_EQ(parse_arm("fp16-sr").name, "fp16-sr7");
  EXPECT_TRUE(parse_arm("fp16-trunc").reencode != nullptr);
  EXPECT_EQ(parse_arm("fp16-sr5-biased").sr_bits, 5);
  EXPECT_EQ(parse_arm("separate-nvfp4").mode, Mode::separate_nvfp4);
  EXPECT_THROW(parse_arm("fp16-sr14"), Error);
  EXPECT_THROW(parse_arm("fp16-srx"), Error);
  EXPECT_THROW(parse_arm("fp12"), Error);
  EXPECT_THROW(parse_arms("fp32,fp32"), Error);
  EXPECT_THROW(parse_stream("nope"), Error);
}

// Replay in fp32 equals the FP64 recurrence to FP32 rounding, also over long-memory heads where
// the rounding noise of every flush is kept for ~1e5 tokens.
TEST(DriftEngine, Fp32ArmStaysAtRoundingLevel) {
  for (StreamKind stream : {StreamKind::mamba2, StreamKind::long_memory, StreamKind::mix}) {
    DriftConfig c = small_config(stream, "fp32");
    c.regimes = {Regime::ar, Regime::spec};
    const DriftResult r = run_drift(c);
    for (Regime regime : c.regimes) {
      const ArmSummary& s = summary_of(r, "fp32", regime);
      EXPECT_LT(s.state_max.max, 1e-5) << stream_name(stream);
      EXPECT_LT(s.out_max.max, 1e-5) << stream_name(stream);
      EXPECT_LT(std::fabs(s.signed_final.mean), 1e-5) << stream_name(stream);
      EXPECT_EQ(s.stagnation, 0.0);
      EXPECT_EQ(s.stats.saturated, 0u);
    }
  }
}

// The point of the signed metric: an encoding that truncates toward zero instead of rounding
// stochastically shrinks the state systematically, and error then grows linearly, not like a
// random walk. The hook arm injects that bias without touching the cache.
TEST(DriftEngine, SignedErrorDetectsBiasedRounding) {
  const DriftResult r =
      run_drift(small_config(StreamKind::long_memory, "fp16-sr7,fp16-trunc,fp16-sr2-biased"));
  const ArmSummary& sr = summary_of(r, "fp16-sr7");
  const ArmSummary& trunc = summary_of(r, "fp16-trunc");
  const ArmSummary& biased = summary_of(r, "fp16-sr2-biased");
  EXPECT_LT(trunc.signed_final.max, -5e-3);
  EXPECT_LT(std::fabs(sr.signed_final.mean), 1e-3);
  EXPECT_LT(trunc.signed_final.max, -10 * std::fabs(sr.signed_final.mean));
  // 2 random bits without the half-LSB term: biased by 1/8 ulp, visible at this length too.
  EXPECT_LT(biased.signed_final.max, -1e-3);
  EXPECT_GT(trunc.growth.min, 0.7);
  EXPECT_LT(sr.growth.max, 0.6);
  for (const Record* rec : rows_of(r, "fp16-trunc", Regime::ar)) {
    if (rec->flushes >= 8) {
      EXPECT_LT(rec->signed_rel, 0.0) << "flush " << rec->flushes;
    }
  }
}

// Every arm sees the same tokens and acceptance counts: the rows line up across arms, AR flushes
// once per history tokens, and the separate modes' fp16 carrier is bit-for-bit the fp16-sr7
// checkpoint (same SR bits), while only their read copy differs.
TEST(DriftEngine, ArmsRunInLockStep) {
  DriftConfig c = small_config(StreamKind::mamba2, "fp16-sr7,separate-fp8,separate-nvfp4", 512);
  c.regimes = {Regime::ar, Regime::spec};
  const DriftResult r = run_drift(c);
  for (Regime regime : c.regimes) {
    const auto sr = rows_of(r, "fp16-sr7", regime);
    const auto fp8 = rows_of(r, "separate-fp8", regime);
    const auto fp4 = rows_of(r, "separate-nvfp4", regime);
    ASSERT_EQ(sr.size(), fp8.size());
    ASSERT_EQ(sr.size(), fp4.size());
    for (size_t i = 0; i < sr.size(); ++i) {
      EXPECT_EQ(sr[i]->step, fp8[i]->step);
      EXPECT_EQ(sr[i]->flushes, fp4[i]->flushes);
      EXPECT_EQ(sr[i]->state_rel, fp8[i]->state_rel);
      EXPECT_EQ(sr[i]->state_rel, fp4[i]->state_rel);
      EXPECT_EQ(sr[i]->read_rel, sr[i]->state_rel);
      EXPECT_GT(fp8[i]->read_rel, 5 * fp8[i]->state_rel);  // the 8-bit read copy
      EXPECT_GT(fp4[i]->read_rel, fp8[i]->read_rel);       // 4 bits: coarser still
    }
    const ArmSummary& s = summary_of(r, "fp16-sr7", regime);
    EXPECT_EQ(s.steps, 512);
    if (regime == Regime::ar) {
      EXPECT_EQ(s.flushes, 512 / 16);
    }
    // Speculative: mean acceptance 4.3 of 8 flushes a bit more often than every 16 tokens.
    if (regime == Regime::spec) {
      EXPECT_GT(s.flushes, 512 / 16);
      EXPECT_LT(s.flushes, 512 / 8);
    }
  }
  // The same configuration gives the same numbers, and an arm run alone (one thread, nothing
  // beside it) gives its rows of the parallel run bit for bit: the arms share nothing.
  const DriftResult again = run_drift(c);
  ASSERT_EQ(r.records.size(), again.records.size());
  for (size_t i = 0; i < r.records.size(); ++i) {
    EXPECT_EQ(r.records[i].out_rel, again.records[i].out_rel);
    EXPECT_EQ(r.records[i].state_rel, again.records[i].state_rel);
  }
  DriftConfig alone = small_config(StreamKind::mamba2, "separate-nvfp4", 512);
  alone.regimes = c.regimes;
  const DriftResult single = run_drift(alone);
  for (Regime regime : c.regimes) {
    const auto in_parallel = rows_of(r, "separate-nvfp4", regime);
    const auto by_itself = rows_of(single, "separate-nvfp4", regime);
    ASSERT_EQ(in_parallel.size(), by_itself.size());
    for (size_t i = 0; i < by_itself.size(); ++i) {
      EXPECT_EQ(in_parallel[i]->out_rel, by_itself[i]->out_rel);
      EXPECT_EQ(in_parallel[i]->read_rel, by_itself[i]->read_rel);
      EXPECT_EQ(in_parallel[i]->stagnation, by_itself[i]->stagnation);
    }
  }
}

// The design claim on long-memory heads: a shared 8-bit checkpoint feeds its quantisation error
// back at every flush and drifts, the separate read copy does not.
TEST(DriftEngine, SharedFp8DriftsWhereSeparateStaysBounded) {
  const DriftResult r = run_drift(small_config(StreamKind::long_memory, "shared-fp8,separate-fp8"));
  const ArmSummary& shared = summary_of(r, "shared-fp8");
  const ArmSummary& separate = summary_of(r, "separate-fp8");
  EXPECT_GT(shared.state_final.min, 3 * separate.read_final.max);
  EXPECT_GT(shared.growth.min, 0.3);
  EXPECT_LT(separate.read_final.max, 0.04);  // about one e4m3 encoding
  EXPECT_GT(shared.out_final.min, 3 * separate.out_final.max);
}

TEST(DriftEngine, BurstsSaturateFp16AndAreCounted) {
  DriftConfig c = small_config(StreamKind::bursts, "fp16,bf16", 2048);
  c.seeds = 1;
  const DriftResult r = run_drift(c);
  EXPECT_GT(summary_of(r, "fp16").stats.saturated, 0u);
  EXPECT_EQ(summary_of(r, "bf16").stats.saturated, 0u);
  EXPECT_EQ(summary_of(r, "fp16").stats.nonfinite, 0u);
}

// A trace (here a generated one; later one captured from a model) as the token stream: the
// committed tokens of each slot, drafts dropped, replayed through every arm.
TEST(DriftEngine, RecordedStreamFromATrace) {
  io::TraceGenOptions gen;
  gen.shape = SsmShape{4, 8, 16, 2};
  gen.steps = 300;
  gen.slots = 2;
  gen.window = 4;
  gen.lifecycle = false;
  const io::Trace trace = io::generate_trace(gen);
  // The tokens the trace commits per slot: prefill chunks, decodes, accepted verify prefixes.
  std::map<int, int64_t> committed;
  for (const io::TraceOp& op : trace.ops) {
    if (op.kind == io::OpKind::prefill) committed[op.slot()] += op.window;
    if (op.kind == io::OpKind::decode)
      for (int slot : op.slots) committed[slot] += 1;
    if (op.kind == io::OpKind::commit)
      for (size_t i = 0; i < op.slots.size(); ++i) committed[op.slots[i]] += op.accepted[i];
  }
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("drift_trace_" + std::to_string(::getpid()));
  io::write_safetensors(path.string(), io::trace_to_file(trace));
  auto rec = std::make_shared<RecordedStreams>(read_recorded_streams(path.string()));
  std::filesystem::remove(path);
  ASSERT_EQ(rec->sequences.size(), committed.size());
  std::vector<int64_t> want, got;
  for (const auto& [slot, n] : committed) want.push_back(n);
  for (const auto& seq : rec->sequences) got.push_back(seq.tokens);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(rec->shape, gen.shape);

  DriftConfig c;
  c.shape = rec->shape;
  c.stream = StreamKind::recorded;
  c.recorded = rec;
  c.prefill = 2;
  c.steps = std::min(got.front(), int64_t(200)) - c.prefill;
  c.seeds = 2;
  c.arms = parse_arms("fp32,fp16-sr7");
  const DriftResult r = run_drift(c);
  EXPECT_LT(summary_of(r, "fp32").state_max.max, 1e-5);
  EXPECT_LT(summary_of(r, "fp32").out_max.max, 1e-5);
  EXPECT_GT(summary_of(r, "fp16-sr7").state_final.mean, 1e-5);
  // More steps than the shortest sequence holds is an error, not a silent wrap-around.
  c.steps = got.back() + 1;
  EXPECT_THROW(run_drift(c), Error);
}

TEST(DriftEngine, RejectsBadConfigurations) {
  DriftConfig c = small_config(StreamKind::mamba2, "fp32");
  c.histories = {12};
  EXPECT_THROW(run_drift(c), Error);
  c = small_config(StreamKind::mamba2, "separate-nvfp4");
  c.shape = SsmShape{4, 8, 8, 2};
  EXPECT_THROW(run_drift(c), Error);
  c = small_config(StreamKind::mamba2, "fp32");
  c.steps = 0;
  EXPECT_THROW(run_drift(c), Error);
}

TEST(DriftReport, CsvJsonAndSvgAreWellFormed) {
  DriftConfig c = small_config(StreamKind::mix, "fp32,fp16-sr7,shared-int8", 256);
  c.regimes = {Regime::ar, Regime::spec};
  c.histories = {8, 16};
  const DriftResult r = run_drift(c);

  std::ostringstream csv;
  write_csv(r, csv);
  std::istringstream lines(csv.str());
  std::string line;
  ASSERT_TRUE(std::getline(lines, line));
  EXPECT_EQ(line.rfind("stream,regime,history,arm,seed,step,flushes,out_rel", 0), 0u);
  const auto columns = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  const auto header_columns = columns(line);
  size_t rows = 0;
  while (std::getline(lines, line)) {
    EXPECT_EQ(columns(line), header_columns) << line;
    ++rows;
  }
  EXPECT_EQ(rows, r.records.size());

  const nlohmann::json j = nlohmann::json::parse(summary_json(r));
  EXPECT_EQ(j["config"]["stream"], "mix");
  ASSERT_EQ(j["arms"].size(), 3u * 2 * 2);
  for (const auto& arm : j["arms"]) {
    EXPECT_TRUE(arm["state_final"]["mean"].is_number());
    EXPECT_TRUE(arm["counters"]["flushes"].is_number_unsigned());
  }

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("drift_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> files = write_plots(r, dir.string());
  EXPECT_EQ(files.size(), 2u * 2 * 4);
  for (const std::string& f : files) {
    std::ifstream in(dir / f);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(svg.rfind("<svg xmlns=", 0), 0u) << f;
    EXPECT_NE(svg.find("<polyline"), std::string::npos) << f;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << f;
    EXPECT_EQ(svg.find("nan"), std::string::npos) << f;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << f;
  }
  std::filesystem::remove_all(dir);
}

TEST(DriftSvg, SkipsUnplottablePointsAndEscapesText) {
  Plot p;
  p.title = "a < b & c";
  p.log_x = p.log_y = true;
  p.series.push_back({"s", "#000", false, {1, 10, 100, -1}, {1e-3, 0, 1e-2, 1}, {}, {}});
  const std::string svg = p.render();
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace replayssm::drift
