// Trace files end to end: generate -> write -> read -> run -> compare, the reader's validation
// (every bad-input case of issue 4 gives an error naming the problem), the comparer's verdicts,
// and the runner's wiring checked against an independent FP64 interpreter of the trace.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/checkpoint_view.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::io {
namespace {

using json = nlohmann::json;

TraceGenOptions small_options(Mode mode = Mode::fp32) {
  TraceGenOptions o;
  o.shape = {4, 8, 16, 2};
  o.mode = mode;
  o.steps = 40;
  o.slots = 3;
  o.window = 4;
  o.seed = 11;
  return o;
}

// Returns the error message of parsing `file`, or "" when it parses.
std::string parse_error(const StFile& file) {
  try {
    parse_trace(file, "t.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A copy of `file` whose trace metadata went through `edit`.
template <typename Edit>
StFile with_meta(StFile file, Edit edit) {
  json meta = json::parse(file.metadata.at(kTraceMetadataKey));
  edit(meta);
  file.metadata[kTraceMetadataKey] = meta.dump();
  return file;
}

// Index of the first op of the given kind.
size_t first_op(const json& meta, const char* kind) {
  for (size_t i = 0; i < meta["ops"].size(); ++i)
    if (meta["ops"][i]["op"] == kind) return i;
  ADD_FAILURE() << "trace has no " << kind << " op";
  return 0;
}

#define EXPECT_ERROR_HAS(file, text)                                                   \
  do {                                                                                 \
    const std::string message = parse_error(file);                                     \
    EXPECT_NE(message.find(text), std::string::npos)                                   \
        << "expected an error containing '" << (text) << "', got '" << message << "'"; \
  } while (0)

TEST(Trace, GenerateWriteReadRoundTrip) {
  const Trace trace = generate_trace(small_options());
  const StFile file = trace_to_file(trace);
  const std::vector<uint8_t> bytes = serialize_safetensors(file);
  const Trace back = parse_trace(parse_safetensors(bytes, "mem"), "mem");
  EXPECT_EQ(trace_metadata_json(back), trace_metadata_json(trace));
  EXPECT_EQ(serialize_safetensors(trace_to_file(back)), bytes);
  // The generator covers what the snapshot tests rely on.
  std::set<std::string> kinds;
  for (const TraceOp& op : trace.ops) kinds.insert(op_name(op.kind));
  for (const char* kind : {"prefill", "decode", "verify", "commit", "flush"})
    EXPECT_TRUE(kinds.count(kind)) << kind;
}

TEST(Trace, GeneratorIsDeterministic) {
  const auto a = serialize_safetensors(trace_to_file(generate_trace(small_options())));
  const auto b = serialize_safetensors(trace_to_file(generate_trace(small_options())));
  EXPECT_EQ(a, b);
  TraceGenOptions other = small_options();
  other.seed = 12;
  EXPECT_NE(serialize_safetensors(trace_to_file(generate_trace(other))), a);
}

TEST(Trace, GeneratorAcceptanceMean) {
  TraceGenOptions o = small_options();
  o.window = 8;
  o.accept_mean = 4.3;
  o.steps = 3000;
  o.slots = 1;
  o.lifecycle = false;
  o.shape = {1, 4, 4, 1};
  const Trace trace = generate_trace(o);
  double sum = 0;
  int count = 0;
  for (size_t i = 0; i + 1 < trace.ops.size(); ++i) {
    if (trace.ops[i].kind == OpKind::verify && trace.ops[i].window == 8) {
      sum += trace.ops[i + 1].accepted[0];
      ++count;
    }
  }
  ASSERT_GT(count, 1000);
  EXPECT_NEAR(sum / count, 4.3, 0.15);
}

TEST(Trace, GeneratorRejectsBadOptions) {
  TraceGenOptions o = small_options();
  o.window = 9;  // > history / 2
  EXPECT_THROW(generate_trace(o), Error);
  o = small_options();
  o.accept_mean = 5;  // > window
  EXPECT_THROW(generate_trace(o), Error);
  o = small_options(Mode::separate_nvfp4);
  o.shape = {4, 8, 24, 2};  // dstate not a multiple of 16
  EXPECT_THROW(generate_trace(o), Error);
}

TEST(Trace, RunEqualsItselfInEveryMode) {
  const Trace trace = generate_trace(small_options());
  for (Mode mode : kAllModes) {
    RunOptions options;
    options.mode = mode;
    const StFile a = run_trace(trace, options), b = run_trace(trace, options);
    const CompareResult result = compare_outputs(a, b, 0, 0);
    EXPECT_TRUE(result.ok()) << mode_name(mode);
    EXPECT_GT(result.tensors.size(), 10u);
    // Round trip through the file format changes nothing.
    const StFile c = parse_safetensors(serialize_safetensors(a), "mem");
    EXPECT_TRUE(compare_outputs(c, a, 0, 0).ok());
  }
}

TEST(Trace, CheckFailsOnPerturbationNanAndMissingTensors) {
  const Trace trace = generate_trace(small_options());
  const StFile ref = run_trace(trace, {});
  StFile out = ref;
  // Perturb one element of one y tensor by more than the tolerance.
  std::string name;
  for (auto& [n, t] : out.tensors)
    if (n.rfind("y.", 0) == 0) name = n;
  ASSERT_FALSE(name.empty());
  std::vector<float> values = out.tensors.at(name).f32(name);
  values[3] += 1e-2f * (1.0f + std::fabs(values[3]));
  out.tensors[name] = make_f32(out.tensors.at(name).shape, values);
  CompareResult result = compare_outputs(out, ref, 1e-4, 1e-5);
  EXPECT_FALSE(result.ok());
  for (const TensorDiff& d : result.tensors) EXPECT_EQ(d.ok(), d.name != name) << d.name;
  // Loose enough tolerances accept it.
  EXPECT_TRUE(compare_outputs(out, ref, 1.0, 1.0).ok());

  // NaN fails whatever the tolerance, on either side.
  values[3] = NAN;
  out.tensors[name] = make_f32(out.tensors.at(name).shape, values);
  EXPECT_FALSE(compare_outputs(out, ref, 1e9, 1e9).ok());
  EXPECT_FALSE(compare_outputs(ref, out, 1e9, 1e9).ok());
  EXPECT_FALSE(compare_outputs(out, out, 1e9, 1e9).ok());

  // Missing, extra, reshaped and integer-mismatch tensors.
  StFile missing = ref;
  missing.tensors.erase(name);
  EXPECT_FALSE(compare_outputs(missing, ref, 1, 1).ok());
  EXPECT_FALSE(compare_outputs(ref, missing, 1, 1).ok());
  StFile reshaped = ref;
  reshaped.tensors[name].shape = {reshaped.tensors[name].numel()};
  EXPECT_FALSE(compare_outputs(reshaped, ref, 1, 1).ok());
  StFile cursors = ref;
  std::string cursor_name;
  for (auto& [n, t] : cursors.tensors)
    if (n.rfind("cursors.", 0) == 0) cursor_name = n;
  ASSERT_FALSE(cursor_name.empty());
  std::vector<int32_t> c = cursors.tensors.at(cursor_name).i32(cursor_name);
  c[0] += 1;
  cursors.tensors[cursor_name] = make_i32({3}, c);
  EXPECT_FALSE(compare_outputs(cursors, ref, 1e9, 1e9).ok());
}

TEST(Trace, ReaderRejectsBadTraces) {
  const StFile good = trace_to_file(generate_trace(small_options()));
  ASSERT_EQ(parse_error(good), "");
  const json meta = json::parse(good.metadata.at(kTraceMetadataKey));
  const size_t verify = first_op(meta, "verify"), commit = first_op(meta, "commit");
  const std::string input = meta["ops"][verify]["input"];

  StFile no_meta = good;
  no_meta.metadata.clear();
  EXPECT_ERROR_HAS(no_meta, "not a replayssm trace");
  StFile bad_json = good;
  bad_json.metadata[kTraceMetadataKey] = "{\"version\":";
  EXPECT_ERROR_HAS(bad_json, "not valid JSON");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["version"] = 2; }),
                   "version 2 is not supported");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m.erase("shape"); }), "has no 'shape'");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["extra"] = 1; }), "unknown field 'extra'");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["shape"]["ngroups"] = 3; }), "trace shape");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["cache"]["mode"] = "fp12"; }),
                   "unknown checkpoint mode 'fp12'");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["cache"]["sr_bits"] = 14; }),
                   "'sr_bits' = 14 is out of range");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["cache"]["history"] = 12; }), "trace 'cache'");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["cache"]["slots"] = "3"; }),
                   "'slots' is not an integer");
  EXPECT_ERROR_HAS(with_meta(good, [](json& m) { m["ops"] = 5; }), "'ops' is not an array");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["op"] = "vrfy"; }),
                   "op " + std::to_string(verify) + ": unknown op 'vrfy'");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["slots"] = {7}; }),
                   "'slots' entry 7 is out of range [0, 2]");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["slots"] = json::array(); }),
                   "not a non-empty array");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["window"] = 9; }),
                   "'window' = 9 is out of range");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["input"] = "nope"; }),
                   "missing tensor 'nope.x'");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][verify]["colour"] = 1; }),
                   "unknown field 'colour'");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][commit]["accepted"].push_back(1); }),
                   "'accepted' has");
  EXPECT_ERROR_HAS(with_meta(good, [&](json& m) { m["ops"][commit]["accepted"][0] = 0; }),
                   "'accepted' entry 0 is out of range");
  // An op on a released slot is caught before anything runs.
  EXPECT_ERROR_HAS(
      with_meta(
          good,
          [&](json& m) {
            m["ops"].insert(m["ops"].begin() + long(verify), json{{"op", "release"}, {"slot", 0}});
            m["ops"][verify + 1]["slots"] = {0};
          }),
      "slot 0 is not open");
  EXPECT_ERROR_HAS(with_meta(good,
                             [&](json& m) {
                               m["ops"].push_back(json{{"op", "fork"}, {"src", 0}, {"dst", 1}});
                             }),
                   "destination slot 1 is already open");

  // Tensors: wrong shape, wrong dtype, non-finite values, unused, missing parameters.
  StFile shape = good;
  shape.tensors[input + ".x"].shape.back() += 1;
  shape.tensors[input + ".x"].data.resize(shape.tensors[input + ".x"].data.size() +
                                          4 * shape.tensors[input + ".x"].numel() / 9);
  EXPECT_ERROR_HAS(shape, "tensor '" + input + ".x' is F32");
  StFile dtype = good;
  dtype.tensors[input + ".dt"].dtype = StDType::I32;
  EXPECT_ERROR_HAS(dtype, "tensor '" + input + ".dt' is I32");
  StFile nan = good;
  std::vector<float> B = nan.tensors[input + ".B"].f32("B");
  B[1] = INFINITY;
  nan.tensors[input + ".B"] = make_f32(nan.tensors[input + ".B"].shape, B);
  EXPECT_ERROR_HAS(nan, "non-finite value");
  StFile unused = good;
  unused.tensors["stray"] = make_f32({1}, std::vector<float>{1});
  EXPECT_ERROR_HAS(unused, "tensor 'stray' is not used");
  StFile no_alog = good;
  no_alog.tensors.erase("A_log");
  EXPECT_ERROR_HAS(no_alog, "missing tensor 'A_log'");
}

TEST(Trace, RuntimeErrorsNameTheOp) {
  // Commit more than the verify left pending: valid syntax, caught by the cache at run time.
  StFile file = trace_to_file(generate_trace(small_options()));
  json meta = json::parse(file.metadata.at(kTraceMetadataKey));
  const size_t commit = first_op(meta, "commit");
  const int window = meta["ops"][commit - 1]["window"];
  for (auto& a : meta["ops"][commit]["accepted"]) a = window + 1;
  meta["cache"]["max_window"] = 8;
  file.metadata[kTraceMetadataKey] = meta.dump();
  const Trace trace = parse_trace(file, "t");
  try {
    run_trace(trace, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op " + std::to_string(commit) + " (commit)"),
              std::string::npos)
        << e.what();
  }
}

// A hand-written trace exercising every op and the optional fields, written the way an external
// tool would: JSON metadata plus F32 tensors.
TEST(Trace, HandWrittenTraceRunsEveryOp) {
  const json meta = {{"version", 1},
                     {"shape", {{"nheads", 2}, {"headdim", 4}, {"dstate", 16}, {"ngroups", 1}}},
                     {"cache",
                      {{"mode", "separate-nvfp4"},
                       {"history", 8},
                       {"max_window", 4},
                       {"slots", 3},
                       {"activation_dtype", "fp32"},
                       {"sr_bits", 7},
                       {"philox_rounds", 10},
                       {"seed", 99},
                       {"layer", 2}}},
                     {"dt_limits", {0.0, 0.5}},
                     {"ops",
                      {{{"op", "prefill"}, {"slot", 0}, {"input", "p"}},
                       {{"op", "verify"}, {"slots", {0, 1}}, {"window", 3}, {"input", "v"}},
                       {{"op", "commit"}, {"slots", {0, 1}}, {"accepted", {2, 1}}},
                       {{"op", "state"}, {"slot", 0}, {"at", 1}},
                       {{"op", "release"}, {"slot", 2}},  // every slot starts open
                       {{"op", "fork"}, {"src", 0}, {"dst", 2}, {"request", 77}},
                       {{"op", "release"}, {"slot", 1}},
                       {{"op", "open"}, {"slot", 1}},
                       {{"op", "decode"}, {"slots", {1, 2}}, {"input", "d"}},
                       {{"op", "export"}, {"slot", 2}},
                       {{"op", "flush"}, {"slots", {0}}}}}};
  StFile file;
  file.metadata[kTraceMetadataKey] = meta.dump();
  auto fill = [&](const std::string& name, std::vector<int64_t> shape_of, float scale) {
    StTensor t;
    t.shape = shape_of;
    std::vector<float> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(float(i) * 0.7f + scale);
    file.tensors[name] = make_f32(shape_of, v);
  };
  fill("A_log", {2}, 1.0f);
  fill("dt_bias", {2}, -2.0f);
  fill("D", {2}, 1.0f);
  for (auto [input, lead] :
       {std::pair<std::string, std::vector<int64_t>>{"p", {5}}, {"v", {2, 3}}, {"d", {2, 1}}}) {
    auto with = [&](std::initializer_list<int64_t> tail) {
      std::vector<int64_t> s = lead;
      s.insert(s.end(), tail);
      return s;
    };
    fill(input + ".x", with({2, 4}), 1.0f);
    fill(input + ".B", with({1, 16}), 0.8f);
    fill(input + ".C", with({1, 16}), 0.9f);
    fill(input + ".dt", with({2}), 0.5f);
  }
  const Trace trace = parse_trace(file, "hand");
  EXPECT_EQ(trace.cache.layer, 2);
  EXPECT_EQ(trace.params.dt_max, 0.5f);
  // Re-serialising gives the same metadata (all optional fields kept).
  EXPECT_EQ(json::parse(trace_metadata_json(trace)), meta);
  const StFile out = run_trace(trace, {});
  std::vector<std::string> names;
  for (const auto& [name, t] : out.tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"cursors.0", "cursors.1", "cursors.2", "export.9",
                                             "read.0", "read.1", "read.2", "snapshot.3", "state.0",
                                             "state.1", "state.2", "y.0", "y.1", "y.8"}));
  EXPECT_EQ(out.tensors.at("y.1").describe(), "F32[2,3,2,4]");
  EXPECT_EQ(out.tensors.at("y.8").describe(), "F32[2,1,2,4]");
  EXPECT_EQ(out.tensors.at("cursors.0").i32("c")[0], 0);  // flushed
  EXPECT_EQ(out.tensors.at("cursors.1").i32("c")[0], 1);  // reopened, one decode
  EXPECT_EQ(out.tensors.at("cursors.2").i32("c")[0], 3);  // fork of 2 committed, one decode
  const SlotFileInfo exported = inspect_slot_file(out.tensors.at("export.9").data);
  EXPECT_EQ(exported.image.cursors.request_id, 77u);  // the fork's explicit request id
  EXPECT_EQ(exported.config.mode, Mode::separate_nvfp4);
  EXPECT_EQ(exported.config.layer, 2);
  // The snapshot after one committed entry differs from the state after two.
  EXPECT_FALSE(compare_outputs(StFile{{}, {{"s", out.tensors.at("snapshot.3")}}},
                               StFile{{}, {{"s", out.tensors.at("state.0")}}}, 0, 0)
                   .ok());
}

// ---- the runner against an independent FP64 interpreter ----------------------------------------

// Interprets a trace with the per-token recurrence in FP64: per slot the state after every
// committed token since the last checkpoint write, and the states of the pending window.
class Fp64Interpreter {
 public:
  explicit Fp64Interpreter(const Trace& t) : t_(t) {
    slots_.resize(size_t(t.cache.num_slots));
    for (Slot& s : slots_) s.open(size());
  }

  StFile run() {
    StFile out;
    const int64_t H = t_.shape.nheads, P = t_.shape.headdim, N = t_.shape.dstate;
    const int L = t_.cache.history;
    for (size_t i = 0; i < t_.ops.size(); ++i) {
      const TraceOp& op = t_.ops[i];
      const std::string y_name = "y." + std::to_string(i);
      switch (op.kind) {
        case OpKind::prefill: {
          Slot& s = slots_[size_t(op.slot())];
          std::vector<double> state = s.current();
          std::vector<float> y;
          for (int k = 0; k < op.window; ++k) step(state, t_.inputs.at(op.input), k, &y);
          s.history = {state};
          out.tensors[y_name] = make_f32({op.window, H, P}, y);
          break;
        }
        case OpKind::decode:
        case OpKind::verify: {
          std::vector<float> y;
          for (size_t b = 0; b < op.slots.size(); ++b) {
            Slot& s = slots_[size_t(op.slots[b])];
            if (int(s.history.size()) - 1 + op.window > L) s.history = {s.current()};
            std::vector<double> state = s.current();
            s.pending.clear();
            for (int k = 0; k < op.window; ++k) {
              step(state, t_.inputs.at(op.input), int(b) * op.window + k, &y);
              s.pending.push_back(state);
            }
            if (op.kind == OpKind::decode) s.commit(1);
          }
          out.tensors[y_name] = make_f32({int64_t(op.slots.size()), op.window, H, P}, y);
          break;
        }
        case OpKind::commit:
          for (size_t b = 0; b < op.slots.size(); ++b)
            slots_[size_t(op.slots[b])].commit(op.accepted[b]);
          break;
        case OpKind::flush:
          for (int slot : op.slots) slots_[size_t(slot)].history = {slots_[size_t(slot)].current()};
          break;
        case OpKind::fork:
          slots_[size_t(op.dst)] = slots_[size_t(op.src)];
          break;
        case OpKind::open:
          slots_[size_t(op.slot())].open(size());
          break;
        case OpKind::release:
          slots_[size_t(op.slot())].live = false;
          break;
        case OpKind::state: {
          const Slot& s = slots_[size_t(op.slot())];
          const auto& state = op.at < 0 ? s.current() : s.history[size_t(op.at)];
          out.tensors["snapshot." + std::to_string(i)] =
              make_f32({H, P, N}, std::vector<float>(state.begin(), state.end()));
          break;
        }
        case OpKind::export_slot:
          break;
      }
    }
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (!slots_[k].live) continue;
      const auto& state = slots_[k].current();
      out.tensors["state." + std::to_string(k)] =
          make_f32({H, P, N}, std::vector<float>(state.begin(), state.end()));
    }
    return out;
  }

 private:
  struct Slot {
    bool live = false;
    std::vector<std::vector<double>> history;  // [0] = checkpoint, then one per committed token
    std::vector<std::vector<double>> pending;
    void open(size_t n) {
      live = true;
      history = {std::vector<double>(n, 0.0)};
      pending.clear();
    }
    const std::vector<double>& current() const { return history.back(); }
    void commit(int k) {
      for (int i = 0; i < k; ++i) history.push_back(pending[size_t(i)]);
      pending.clear();
    }
  };
  size_t size() const { return size_t(t_.shape.state_elements()); }

  void step(std::vector<double>& S, const TokenInputs& in, int row, std::vector<float>* y) {
    const int H = t_.shape.nheads, P = t_.shape.headdim, N = t_.shape.dstate, G = t_.shape.ngroups;
    for (int h = 0; h < H; ++h) {
      const int g = h / t_.shape.heads_per_group();
      const double u = double(in.dt[size_t(row) * H + h]) + t_.params.dt_bias[size_t(h)];
      const double delta = u > 20 ? u : std::log1p(std::exp(u));
      const double a = std::exp(-delta * std::exp(double(t_.params.A_log[size_t(h)])));
      for (int p = 0; p < P; ++p) {
        const double x = in.x[(size_t(row) * H + h) * P + p];
        double acc = 0;
        for (int n = 0; n < N; ++n) {
          double& s = S[(size_t(h) * P + p) * N + n];
          s = a * s + delta * x * in.B[(size_t(row) * G + g) * N + n];
          acc += s * in.C[(size_t(row) * G + g) * N + n];
        }
        y->push_back(float(acc + t_.params.D[size_t(h)] * x));
      }
    }
  }

  const Trace& t_;
  std::vector<Slot> slots_;
};

TEST(Trace, Fp32RunMatchesFp64Interpreter) {
  for (int window : {1, 4, 8}) {
    TraceGenOptions o = small_options();
    o.window = window;
    o.steps = 60;
    const Trace trace = generate_trace(o);
    const StFile out = run_trace(trace, {});
    const StFile ref = Fp64Interpreter(trace).run();
    int compared = 0;
    for (const auto& [name, t] : ref.tensors) {
      ASSERT_TRUE(out.tensors.count(name)) << name;
      const std::vector<double> a = out.tensors.at(name).as_f64(name), b = t.as_f64(name);
      double amax = 0, err = 0;
      for (size_t i = 0; i < b.size(); ++i) {
        amax = std::max(amax, std::fabs(b[i]));
        err = std::max(err, std::fabs(a[i] - b[i]));
      }
      EXPECT_LE(err, 1e-5 * std::max(amax, 1.0)) << name << " window " << window;
      ++compared;
    }
    EXPECT_GT(compared, 20);
  }
}

}  // namespace
}  // namespace replayssm::io
