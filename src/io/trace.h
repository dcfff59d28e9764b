// Trace files: a recorded sequence of replay-cache operations with their inputs, in one
// safetensors file (docs/trace-format.md is the public, versioned contract). The reader validates
// everything before anything runs; the runner replays a trace through ReplayCache on any backend
// and mode and collects every output; the comparer checks two output files tensor by tensor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "replayssm/cache.h"
#include "replayssm/types.h"

namespace replayssm::io {

inline constexpr int kTraceVersion = 1;
inline constexpr const char* kTraceMetadataKey = "replayssm.trace";
inline constexpr const char* kOutputMetadataKey = "replayssm.output";

enum class OpKind : uint8_t {
  prefill,
  decode,
  verify,
  commit,
  flush,
  fork,
  release,
  open,
  state,
  export_slot
};
const char* op_name(OpKind kind);

struct TraceOp {
  OpKind kind = OpKind::decode;
  std::vector<int> slots;           // decode, verify, commit, flush; one entry for single-slot ops
  int window = 0;                   // verify: W; decode: 1; prefill: number of tokens
  std::vector<int> accepted;        // commit, one per slot
  int src = -1, dst = -1;           // fork
  int at = -1;                      // state: committed entries to fold, -1 = all
  std::optional<uint64_t> request;  // fork, open: request id of the new slot (default: next)
  std::string input;                // prefill, decode, verify: tensor name prefix
  int slot() const { return slots.at(0); }
  bool produces_y() const {
    return kind == OpKind::prefill || kind == OpKind::decode || kind == OpKind::verify;
  }
};

// Per-token inputs of one op, fp32, row-major: x [rows, H, P], B/C [rows, G, N], dt [rows, H]
// where rows = n tokens (prefill) or S * W (decode, verify).
struct TokenInputs {
  std::vector<float> x, B, C, dt;
};

struct Trace {
  SsmShape shape;
  CacheConfig cache;  // mode, history, max_window, num_slots, activation dtype, sr, seed, layer
  LayerParams params;
  std::vector<TraceOp> ops;
  std::map<std::string, TokenInputs> inputs;
};

// Validates structure, types, ranges, tensor names, shapes and dtypes, and slot liveness (an op
// on a slot that is not open at that point is rejected with its op index).
Trace parse_trace(const StFile& file, const std::string& what);
Trace read_trace(const std::string& path);
StFile trace_to_file(const Trace& trace);
std::string trace_metadata_json(const Trace& trace);

// ---- random traces ------------------------------------------------------------------------------
struct TraceGenOptions {
  SsmShape shape{4, 16, 32, 2};
  Mode mode = Mode::fp32;
  int steps = 32;  // decode/verify steps; prefills, flushes, forks... are interleaved
  int slots = 3;
  int window = 4;          // largest verify window (1 + drafts); 1 = autoregressive only
  double accept_mean = 0;  // mean accepted tokens per verify; 0 = about 0.54 * window
  uint64_t seed = 1;
  int history = 16;
  DType activation_dtype = DType::f32;
  bool lifecycle = true;  // forks, releases, re-opens, snapshots and exports
};

// A random but valid trace with Mamba-2-like parameter ranges (docs/trace-format.md). The same
// options give the same file on every platform (own RNG, no std distributions).
Trace generate_trace(const TraceGenOptions& options);

// ---- running -----------------------------------------------------------------------------------
struct RunOptions {
  BackendKind backend = BackendKind::cpu;
  std::optional<Mode> mode;  // overrides the trace's mode
};

struct RunSummary {
  CacheStats stats;
  int ops = 0;
  double seconds = 0;
};

// Replays the trace and returns the output file (y.<op>, snapshot.<op>, export.<op>, and
// state/read/cursors of every slot open at the end). Errors name the op index.
StFile run_trace(const Trace& trace, const RunOptions& options, RunSummary* summary = nullptr);

// ---- comparing ---------------------------------------------------------------------------------
struct TensorDiff {
  std::string name;
  std::string shape;       // "F32[3,1,4,16]", or both when they differ
  double max_abs = 0;      // max |out - ref|
  double max_rel = 0;      // max |out - ref| / |ref| over elements with ref != 0
  int64_t mismatches = 0;  // elements with |out - ref| > atol + rtol * |ref|
  int64_t nans = 0;        // NaN or Inf elements in either file
  std::string problem;     // "missing in OUT", "shape differs", ...; empty when comparable
  bool ok() const { return problem.empty() && mismatches == 0 && nans == 0; }
};

struct CompareResult {
  std::vector<TensorDiff> tensors;  // sorted by name
  bool ok() const;
};

CompareResult compare_outputs(const StFile& out, const StFile& ref, double rtol, double atol);

}  // namespace replayssm::io
