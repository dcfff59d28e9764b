// The drift study (issue 7): identical token streams run in lock step through one ReplayCache per
// checkpoint mode ("arm") and through an FP64 per-token recurrence; after every flush the folded
// state, the read checkpoint and the outputs are compared with the FP64 values. Used by
// `replayssm drift` (tools/cmd_drift.cpp) and tests/test_drift.cpp; results in docs/accuracy.md.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm::drift {

// ---------------------------------------------------------------------------------------------
// Token streams (src/drift/stream.cpp).

enum class StreamKind : uint8_t {
  mamba2,       // A_log = log U[1,16], dt_bias = softplus^-1(logU[1e-3,1e-1]), x,B,C ~ N(0,1)
  long_memory,  // heads alternate decay per token 1-1e-3 and 1-1e-5 (fixed delta 1e-2)
  tiny,         // decay 1-1e-4 / 1-1e-5, prefill at scale 1, then x ~ N(0, 1e-4): stagnation
  bursts,       // mamba2, with 4-token bursts of x ~ N(0, 1e6) (about 1 in 256 tokens): saturation
  mix,          // heads cycle through mamba2, long 1e-3, long 1e-5, tiny
  recorded,     // tokens recorded in a trace file (read_recorded_streams)
};
const char* stream_name(StreamKind kind);
StreamKind parse_stream(std::string_view name);
std::vector<StreamKind> all_streams();  // the synthetic ones

// Token sequences recorded in a trace file (docs/trace-format.md), e.g. captured from a model's
// layer: per slot, every token that reached the canonical state in order (prefill tokens,
// decoded tokens, and the accepted prefix of each verify; rejected drafts are dropped). A slot
// that is released, re-opened or forked into starts a new sequence.
struct RecordedStreams {
  std::string source;  // file name, for messages
  SsmShape shape;
  LayerParams params;
  struct Sequence {
    std::vector<float> x, B, C, dt;  // [T,H,P], [T,G,N], [T,G,N], [T,H]
    int64_t tokens = 0;
  };
  std::vector<Sequence> sequences;  // non-empty ones, in the order they end
};
RecordedStreams read_recorded_streams(const std::string& trace_path);

// A stream of tokens for one layer: per-head parameters plus a counter-based generator, so token
// t of seed s is the same whatever was generated before (arms, seeds and draft tokens never
// disturb one another's random numbers).
class Stream {
 public:
  // The layer parameters come from `layer_seed`, the tokens from `token_seed`.
  Stream(StreamKind kind, const SsmShape& shape, uint64_t layer_seed, uint64_t token_seed);
  // Sequence `index` (modulo their number) of a recording; token t < 0 is prefill token
  // prefill + t, draft tokens are other recorded tokens of the same sequence.
  Stream(std::shared_ptr<const RecordedStreams> recorded, int index, int prefill);
  const LayerParams& params() const { return params_; }
  StreamKind kind() const { return kind_; }
  // Token `t` (t < 0: prefill tokens, counted from -prefill) as fp32 values; `draft` selects an
  // independent sequence for rejected draft tokens. x [H*P], B [G*N], C [G*N], dt [H].
  void token(int64_t t, bool draft, float* x, float* B, float* C, float* dt) const;

 private:
  StreamKind kind_;
  SsmShape shape_;
  uint64_t seed_;
  LayerParams params_;
  std::vector<uint8_t> head_kind_;  // [H] StreamKind of each head (differs only in `mix`)
  std::shared_ptr<const RecordedStreams> recorded_;
  const RecordedStreams::Sequence* sequence_ = nullptr;
  int prefill_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The FP64 per-token recurrence of SPEC section 2 (the oracle).

class Fp64Recurrence {
 public:
  Fp64Recurrence(const SsmShape& shape, const LayerParams& params);
  // Applies one token (fp32 values as the cache sees them) and writes y [H*P].
  void step(const float* x /*[H*P]*/, const float* B /*[G*N]*/, const float* C /*[G*N]*/,
            const float* dt /*[H]*/, double* y /*[H*P]*/);
  const std::vector<double>& state() const { return S_; }  // [H,P,N]

 private:
  SsmShape shape_;
  std::vector<double> A_, dt_bias_, D_;  // [H]
  double dt_min_, dt_max_;
  std::vector<double> S_;
};

// ---------------------------------------------------------------------------------------------
// Arms and configuration.

// Re-encodes a checkpoint in place: state [H*P*N] fp32, `flush` counts the arm's flushes, `seed`
// identifies the run (for the arm's own random numbers).
using Reencode = std::function<void(std::span<float> state, uint64_t flush, uint64_t seed)>;

struct Arm {
  std::string name;  // e.g. "fp16-sr7"
  Mode mode = Mode::fp32;
  int sr_bits = 7;
  // Test hook, not a cache mode: when set, the arm runs an fp32 cache and after every flush
  // replaces its checkpoint by reencode(checkpoint) (read back with state(), written with
  // import_state()). Lets the tests inject a deliberately biased rounding without touching the
  // cache.
  Reencode reencode;
};

// The arms of the issue: fp32, bf16, fp16, fp16-sr7, fp16-sr13, shared-fp8, shared-int8,
// separate-fp8, separate-nvfp4.
std::vector<Arm> standard_arms();
// "all", or a comma list of arm names: the standard ones, "fp16-sr" (= fp16-sr7), "fp16-srR" for
// R in 1..13, and the hook arms "fp16-trunc" (toward zero) and "fp16-srR-biased" (SR without
// the half-LSB term, biased toward zero by about 2^-(R+1) ulp).
std::vector<Arm> parse_arms(std::string_view list);
Arm parse_arm(std::string_view name);

enum class Regime : uint8_t { ar, spec };
const char* regime_name(Regime regime);
Regime parse_regime(std::string_view name);

struct DriftConfig {
  SsmShape shape{8, 16, 32, 2};
  int64_t steps = 4096;  // committed decode tokens per run (after the prefill)
  int prefill = 64;      // prompt tokens run through prefill first
  std::vector<int> histories{16};
  std::vector<Regime> regimes{Regime::ar, Regime::spec};
  int window = 8;        // speculative window W = 1 + drafts, capped at history / 2
  double accept = 0.81;  // per-draft acceptance probability (W = 8: mean accepted 4.3)
  int seeds = 3;         // runs side by side as slots: SR seed and stream both change
  uint64_t base_seed = 1;
  bool fixed_stream = false;  // every seed sees the same tokens (only SR bits differ)
  StreamKind stream = StreamKind::mamba2;
  // With stream == recorded: the tokens and the layer (shape and parameters must match); seed s
  // decodes sequence s modulo their number, so steps + prefill must fit in each sequence used.
  std::shared_ptr<const RecordedStreams> recorded;
  DType activation = DType::bf16;
  BackendKind backend = BackendKind::cpu;
  std::vector<Arm> arms = standard_arms();
  double record_ratio = 1.1;  // a row at flush 1..16 and then whenever flushes grow by this ratio
  void validate() const;
};

// One row of drift.csv: the state of one (regime, history, arm, seed) after a flush.
struct Record {
  Regime regime;
  int history;
  int arm;  // index into DriftConfig::arms
  int seed;
  int64_t step;       // committed decode tokens so far
  int64_t flushes;    // flushes so far (decode only)
  double out_rel;     // ||y - y64|| / ||y64|| over the tokens since the previous row
  double state_rel;   // ||S - S64|| / ||S64||, S = recurrence checkpoint decoded after the flush
  double read_rel;    // the same for the read checkpoint (what the readout multiplies with C)
  double signed_rel;  // sum((S - S64) * sign(S64)) / sum|S64|: < 0 shrinks, > 0 grows
  double stagnation;  // mean over the flushes since the previous row, see stagnation_fraction
  double zeroed;      // fraction of elements non-zero in FP64 but zero in the read checkpoint
  int64_t saturated;  // elements of the recurrence checkpoint at +-65504 (fp16 carriers)
};

// Per (regime, history, arm): statistics over seeds (mean, min, max).
struct Spread {
  double mean = 0, min = 0, max = 0;
};
struct ArmSummary {
  Regime regime;
  int history;
  int arm;
  std::string name;
  int64_t steps = 0, flushes = 0;                           // of the longest seed
  Spread out_final, state_final, read_final, signed_final;  // at the last row
  Spread out_max, state_max;                                // over all rows
  Spread growth;          // exponent of state_rel ~ flushes^k (log-log least squares)
  double stagnation = 0;  // mean over all flushes and seeds
  double zeroed = 0;      // mean over rows and seeds
  CacheStats stats;       // the cache's counters (all seeds)
};

struct DriftResult {
  DriftConfig config;
  std::vector<Record> records;
  std::vector<ArmSummary> summaries;
  double seconds = 0;
};

// Progress: (done, total) in token-steps over all runs, and a label.
using ProgressFn = std::function<void(int64_t done, int64_t total, const std::string& label)>;

DriftResult run_drift(const DriftConfig& config, const ProgressFn& progress = {});

// ---------------------------------------------------------------------------------------------
// Metrics and reports (src/drift/report.cpp).

// Fraction of elements whose recurrence-checkpoint code did not change at a flush although the
// FP32 value did: old = decoded checkpoint before the flush, fold = the FP32 flush result,
// old_codes / new_codes = the checkpoint's codes before and after (`code_bytes` bytes each). In
// the shared 8-bit modes a stagnant code can still decode to a new value when the row scale
// moves; it counts as stagnant, because the element then follows its row's amax, not its own
// update. 0 when no element changed in FP32.
double stagnation_fraction(std::span<const float> old, std::span<const float> fold,
                           std::span<const uint8_t> old_codes, std::span<const uint8_t> new_codes,
                           size_t code_bytes);
// Slope k of log y = k log x + c (least squares over points with x > 0 and y > 0); NaN when
// fewer than two such points.
double fit_growth_exponent(std::span<const double> x, std::span<const double> y);

void write_csv(const DriftResult& result, std::ostream& out);
std::string summary_json(const DriftResult& result);
// state_<regime>_h<L>.svg, out_..., signed_... into dir; returns the file names written.
std::vector<std::string> write_plots(const DriftResult& result, const std::string& dir);

}  // namespace replayssm::drift
