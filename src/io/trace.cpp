// Trace file reading and writing. See docs/trace-format.md for the contract this implements.
#include "io/trace.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "replayssm/error.h"

namespace replayssm::io {
namespace {

using json = nlohmann::json;

constexpr const char* kOpNames[] = {"prefill", "decode",  "verify", "commit", "flush",
                                    "fork",    "release", "open",   "state",  "export"};

// Strict access to one JSON object: typed getters with ranges, and a final check that no key
// was left unread, so a misspelled field is an error instead of a silently ignored default.
class Fields {
 public:
  Fields(const json& object, std::string context) : j_(object), context_(std::move(context)) {
    check(j_.is_object(), context_, " is not a JSON object");
  }
  bool has(const char* key) const { return j_.contains(key); }
  const json& raw(const char* key) {
    check(j_.contains(key), context_, " has no '", key, "'");
    used_.insert(key);
    return j_[key];
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi) {
    const json& v = raw(key);
    check(v.is_number_integer(), context_, ": '", key, "' is not an integer: ", v.dump());
    const int64_t value = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                              ? INT64_MAX
                              : v.get<int64_t>();
    check(value >= lo && value <= hi, context_, ": '", key, "' = ", v.dump(), " is out of range [",
          lo, ", ", hi, "]");
    return value;
  }
  uint64_t unsigned_integer(const char* key) {
    const json& v = raw(key);
    check(v.is_number_unsigned(), context_, ": '", key,
          "' is not a non-negative integer: ", v.dump());
    return v.get<uint64_t>();
  }
  std::string string(const char* key) {
    const json& v = raw(key);
    check(v.is_string(), context_, ": '", key, "' is not a string: ", v.dump());
    return v.get<std::string>();
  }
  std::vector<int> int_list(const char* key, int64_t lo, int64_t hi) {
    const json& v = raw(key);
    check(v.is_array() && !v.empty(), context_, ": '", key,
          "' is not a non-empty array: ", v.dump());
    std::vector<int> out;
    for (const json& e : v) {
      check(e.is_number_integer(), context_, ": '", key, "' holds a non-integer: ", e.dump());
      const int64_t value = e.get<int64_t>();
      check(!e.is_number_unsigned() || e.get<uint64_t>() <= uint64_t(INT64_MAX), context_, ": '",
            key, "' entry ", e.dump(), " is out of range");
      check(value >= lo && value <= hi, context_, ": '", key, "' entry ", value,
            " is out of range [", lo, ", ", hi, "]");
      out.push_back(int(value));
    }
    return out;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      check(used_.count(it.key()) != 0, context_, " has an unknown field '", it.key(), "'");
    }
  }

 private:
  const json& j_;
  std::string context_;
  std::set<std::string> used_;
};

const StTensor& tensor(const StFile& file, const std::string& what, const std::string& name) {
  auto it = file.tensors.find(name);
  check(it != file.tensors.end(), what, ": missing tensor '", name, "'");
  return it->second;
}

std::vector<float> f32_tensor(const StFile& file, const std::string& what, const std::string& name,
                              const std::vector<int64_t>& shape) {
  const StTensor& t = tensor(file, what, name);
  StTensor expected;
  expected.shape = shape;
  check(t.dtype == StDType::F32 && t.shape == shape, what, ": tensor '", name, "' is ",
        t.describe(), ", expected ", expected.describe());
  std::vector<float> values = t.f32(name);
  for (size_t i = 0; i < values.size(); ++i) {
    check(std::isfinite(values[i]), what, ": tensor '", name, "' holds a non-finite value (",
          values[i], ") at flat index ", i);
  }
  return values;
}

}  // namespace

const char* op_name(OpKind kind) { return kOpNames[size_t(kind)]; }

Trace parse_trace(const StFile& file, const std::string& what) {
  auto meta = file.metadata.find(kTraceMetadataKey);
  check(meta != file.metadata.end(), what, ": not a replayssm trace (no '", kTraceMetadataKey,
        "' in __metadata__)");
  json root;
  try {
    root = json::parse(meta->second);
  } catch (const json::parse_error& e) {
    fail(what, ": trace metadata is not valid JSON (", e.what(), ")");
  }
  Trace trace;
  Fields top(root, what + ": trace metadata");
  const int64_t version = top.integer("version", 0, INT32_MAX);
  check(version == kTraceVersion, what, ": trace version ", version,
        " is not supported (this build reads version ", kTraceVersion, ")");

  {
    Fields shape(top.raw("shape"), what + ": trace 'shape'");
    trace.shape.nheads = int(shape.integer("nheads", 1, 1 << 16));
    trace.shape.headdim = int(shape.integer("headdim", 1, 1 << 16));
    trace.shape.dstate = int(shape.integer("dstate", 1, 1 << 16));
    trace.shape.ngroups = int(shape.integer("ngroups", 1, 1 << 16));
    shape.finish();
    check(trace.shape.state_elements() <= (int64_t(1) << 30), what, ": state of ",
          trace.shape.state_elements(), " elements per slot is too large for a trace");
    try {
      trace.shape.validate();
    } catch (const Error& e) {
      fail(what, ": trace shape: ", e.what());
    }
  }
  {
    Fields cache(top.raw("cache"), what + ": trace 'cache'");
    CacheConfig& c = trace.cache;
    try {
      c.mode = parse_mode(cache.string("mode"));
      c.activation_dtype = parse_dtype(cache.string("activation_dtype"));
    } catch (const Error& e) {
      fail(what, ": trace 'cache': ", e.what());
    }
    c.history = int(cache.integer("history", 1, 1 << 20));
    c.max_window = int(cache.integer("max_window", 1, 1 << 20));
    c.num_slots = int(cache.integer("slots", 1, 1 << 16));
    c.sr_bits = int(cache.integer("sr_bits", 1, 13));
    c.philox_rounds = int(cache.integer("philox_rounds", 1, 64));
    c.seed = cache.unsigned_integer("seed");
    if (cache.has("layer")) c.layer = int(cache.integer("layer", 0, INT32_MAX));
    cache.finish();
    try {
      c.validate(trace.shape);
    } catch (const Error& e) {
      fail(what, ": trace 'cache': ", e.what());
    }
  }
  if (top.has("dt_limits")) {
    const json& limits = top.raw("dt_limits");
    check(limits.is_array() && limits.size() == 2 && limits[0].is_number() && limits[1].is_number(),
          what, ": trace 'dt_limits' is not a pair of numbers: ", limits.dump());
    trace.params.dt_min = limits[0].get<float>();
    trace.params.dt_max = limits[1].get<float>();
    check(trace.params.dt_min >= 0 && trace.params.dt_min <= trace.params.dt_max, what,
          ": trace 'dt_limits' ", limits.dump(), " is not 0 <= min <= max");
  }

  const SsmShape& s = trace.shape;
  const int64_t H = s.nheads, P = s.headdim, N = s.dstate, G = s.ngroups;
  trace.params.A_log = f32_tensor(file, what, "A_log", {H});
  trace.params.dt_bias = f32_tensor(file, what, "dt_bias", {H});
  trace.params.D = f32_tensor(file, what, "D", {H});
  try {
    trace.params.validate(s);
  } catch (const Error& e) {
    fail(what, ": layer parameters: ", e.what());
  }

  const json& ops = top.raw("ops");
  check(ops.is_array(), what, ": trace 'ops' is not an array");
  top.finish();

  const int K = trace.cache.num_slots;
  std::set<std::string> used_tensors = {"A_log", "dt_bias", "D"};
  // Liveness is tracked here so that an op on a slot that is not open is reported with its
  // index before anything runs. All slots start open (request id = slot index).
  std::vector<bool> open(size_t(K), true);
  auto require_open = [&](const std::string& ctx, int slot) {
    check(open[size_t(slot)], ctx, ": slot ", slot, " is not open");
  };
  auto distinct = [&](const std::string& ctx, const std::vector<int>& slots) {
    std::set<int> seen(slots.begin(), slots.end());
    check(seen.size() == slots.size(), ctx, ": 'slots' lists a slot twice");
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string ctx = what + ": op " + std::to_string(i);
    Fields f(ops[i], ctx);
    const std::string name = f.string("op");
    TraceOp op;
    auto kind = std::find(std::begin(kOpNames), std::end(kOpNames), name);
    check(kind != std::end(kOpNames), ctx, ": unknown op '", name, "'");
    op.kind = OpKind(kind - std::begin(kOpNames));
    const std::string octx = ctx + " (" + name + ")";
    auto load_inputs = [&](std::vector<int64_t> lead) {
      op.input = f.string("input");
      check(!op.input.empty(), octx, ": empty 'input' name");
      auto with = [&](std::initializer_list<int64_t> tail) {
        std::vector<int64_t> shape = lead;
        shape.insert(shape.end(), tail);
        return shape;
      };
      TokenInputs in;
      in.x = f32_tensor(file, octx, op.input + ".x", with({H, P}));
      in.B = f32_tensor(file, octx, op.input + ".B", with({G, N}));
      in.C = f32_tensor(file, octx, op.input + ".C", with({G, N}));
      in.dt = f32_tensor(file, octx, op.input + ".dt", with({H}));
      for (const char* part : {".x", ".B", ".C", ".dt"}) used_tensors.insert(op.input + part);
      trace.inputs[op.input] = std::move(in);
    };
    switch (op.kind) {
      case OpKind::prefill: {
        op.slots = {int(f.integer("slot", 0, K - 1))};
        require_open(octx, op.slot());
        op.input = f.string("input");
        const std::string x_name = op.input + ".x";  // a named string: no temporary to dangle
        const StTensor& x = tensor(file, octx, x_name);
        check(x.shape.size() == 3 && x.shape[0] >= 1, octx, ": tensor '", op.input, ".x' is ",
              x.describe(), ", expected F32[n,", H, ",", P, "] with n >= 1");
        check(x.shape[0] <= (1 << 20), octx, ": prefill of ", x.shape[0], " tokens is too long");
        op.window = int(x.shape[0]);
        load_inputs({op.window});
        break;
      }
      case OpKind::decode:
      case OpKind::verify: {
        op.slots = f.int_list("slots", 0, K - 1);
        distinct(octx, op.slots);
        for (int slot : op.slots) require_open(octx, slot);
        op.window =
            op.kind == OpKind::decode ? 1 : int(f.integer("window", 1, trace.cache.max_window));
        const int64_t S = int64_t(op.slots.size());
        load_inputs({S, op.window});
        break;
      }
      case OpKind::commit:
        op.slots = f.int_list("slots", 0, K - 1);
        distinct(octx, op.slots);
        for (int slot : op.slots) require_open(octx, slot);
        op.accepted = f.int_list("accepted", 1, trace.cache.max_window);
        check(op.accepted.size() == op.slots.size(), octx, ": 'accepted' has ", op.accepted.size(),
              " entries for ", op.slots.size(), " slots");
        break;
      case OpKind::flush:
        op.slots = f.int_list("slots", 0, K - 1);
        distinct(octx, op.slots);
        for (int slot : op.slots) require_open(octx, slot);
        break;
      case OpKind::fork:
        op.src = int(f.integer("src", 0, K - 1));
        op.dst = int(f.integer("dst", 0, K - 1));
        check(op.src != op.dst, octx, ": 'src' and 'dst' are the same slot ", op.src);
        require_open(octx, op.src);
        check(!open[size_t(op.dst)], octx, ": destination slot ", op.dst, " is already open");
        if (f.has("request")) op.request = f.unsigned_integer("request");
        open[size_t(op.dst)] = true;
        break;
      case OpKind::release:
        op.slots = {int(f.integer("slot", 0, K - 1))};
        require_open(octx, op.slot());
        open[size_t(op.slot())] = false;
        break;
      case OpKind::open:
        op.slots = {int(f.integer("slot", 0, K - 1))};
        check(!open[size_t(op.slot())], octx, ": slot ", op.slot(), " is already open");
        if (f.has("request")) op.request = f.unsigned_integer("request");
        open[size_t(op.slot())] = true;
        break;
      case OpKind::state:
        op.slots = {int(f.integer("slot", 0, K - 1))};
        require_open(octx, op.slot());
        if (f.has("at")) op.at = int(f.integer("at", 0, trace.cache.history));
        break;
      case OpKind::export_slot:
        op.slots = {int(f.integer("slot", 0, K - 1))};
        require_open(octx, op.slot());
        break;
    }
    f.finish();
    trace.ops.push_back(std::move(op));
  }
  for (const auto& [name, t] : file.tensors) {
    check(used_tensors.count(name) != 0, what, ": tensor '", name,
          "' is not used by any op (misspelled input name?)");
  }
  return trace;
}

Trace read_trace(const std::string& path) { return parse_trace(read_safetensors(path), path); }

std::string trace_metadata_json(const Trace& trace) {
  json root = json::object();
  root["version"] = kTraceVersion;
  root["shape"] = {{"nheads", trace.shape.nheads},
                   {"headdim", trace.shape.headdim},
                   {"dstate", trace.shape.dstate},
                   {"ngroups", trace.shape.ngroups}};
  const CacheConfig& c = trace.cache;
  root["cache"] = {{"mode", mode_name(c.mode)},
                   {"history", c.history},
                   {"max_window", c.max_window},
                   {"slots", c.num_slots},
                   {"activation_dtype", c.activation_dtype == DType::f32 ? "fp32" : "bf16"},
                   {"sr_bits", c.sr_bits},
                   {"philox_rounds", c.philox_rounds},
                   {"seed", c.seed}};
  if (c.layer != 0) root["cache"]["layer"] = c.layer;
  if (trace.params.dt_min > 0 || std::isfinite(trace.params.dt_max)) {
    root["dt_limits"] = {trace.params.dt_min, trace.params.dt_max};
  }
  json ops = json::array();
  for (const TraceOp& op : trace.ops) {
    json o = {{"op", op_name(op.kind)}};
    switch (op.kind) {
      case OpKind::prefill:
        o["slot"] = op.slot();
        o["input"] = op.input;
        break;
      case OpKind::decode:
        o["slots"] = op.slots;
        o["input"] = op.input;
        break;
      case OpKind::verify:
        o["slots"] = op.slots;
        o["window"] = op.window;
        o["input"] = op.input;
        break;
      case OpKind::commit:
        o["slots"] = op.slots;
        o["accepted"] = op.accepted;
        break;
      case OpKind::flush:
        o["slots"] = op.slots;
        break;
      case OpKind::fork:
        o["src"] = op.src;
        o["dst"] = op.dst;
        if (op.request) o["request"] = *op.request;
        break;
      case OpKind::open:
        o["slot"] = op.slot();
        if (op.request) o["request"] = *op.request;
        break;
      case OpKind::state:
        o["slot"] = op.slot();
        if (op.at >= 0) o["at"] = op.at;
        break;
      case OpKind::release:
      case OpKind::export_slot:
        o["slot"] = op.slot();
        break;
    }
    ops.push_back(std::move(o));
  }
  root["ops"] = std::move(ops);
  return root.dump();
}

StFile trace_to_file(const Trace& trace) {
  StFile file;
  file.metadata[kTraceMetadataKey] = trace_metadata_json(trace);
  const int64_t H = trace.shape.nheads, P = trace.shape.headdim, N = trace.shape.dstate,
                G = trace.shape.ngroups;
  file.tensors["A_log"] = make_f32({H}, trace.params.A_log);
  file.tensors["dt_bias"] = make_f32({H}, trace.params.dt_bias);
  file.tensors["D"] = make_f32({H}, trace.params.D);
  for (const TraceOp& op : trace.ops) {
    if (!op.produces_y() || file.tensors.count(op.input + ".x")) continue;
    auto it = trace.inputs.find(op.input);
    check(it != trace.inputs.end(), "trace op ", op_name(op.kind), " uses missing input '",
          op.input, "'");
    std::vector<int64_t> lead = op.kind == OpKind::prefill
                                    ? std::vector<int64_t>{op.window}
                                    : std::vector<int64_t>{int64_t(op.slots.size()), op.window};
    auto with = [&](std::initializer_list<int64_t> tail) {
      std::vector<int64_t> shape = lead;
      shape.insert(shape.end(), tail);
      return shape;
    };
    file.tensors[op.input + ".x"] = make_f32(with({H, P}), it->second.x);
    file.tensors[op.input + ".B"] = make_f32(with({G, N}), it->second.B);
    file.tensors[op.input + ".C"] = make_f32(with({G, N}), it->second.C);
    file.tensors[op.input + ".dt"] = make_f32(with({H}), it->second.dt);
  }
  return file;
}

}  // namespace replayssm::io
