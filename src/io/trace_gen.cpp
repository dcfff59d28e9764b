// Random but valid traces. The generator tracks every slot's cursors exactly as the cache will,
// so each op it emits is legal at that point (commit never exceeds pending, state `at` never
// exceeds committed, forks go into free slots).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/acceptance.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::io {
namespace {

// splitmix64: tiny, fast, and identical everywhere. std::normal_distribution and friends are
// implementation-defined, which would make "the same seed gives the same trace" false across
// standard libraries.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed ^ 0x5eed5eed12345678ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int below(int n) { return int(next() % uint64_t(n)); }
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }  // inclusive
  double normal() {  // Box-Muller; 1 - u keeps the log argument in (0, 1]
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }

 private:
  uint64_t state_;
};

struct SimSlot {
  bool open = false;
  int committed = 0;
};

}  // namespace

Trace generate_trace(const TraceGenOptions& o) {
  Trace trace;
  trace.shape = o.shape;
  trace.shape.validate();
  check(o.slots >= 1 && o.slots <= 4096, "trace gen: --slots ", o.slots,
        " is out of range [1, 4096]");
  check(o.steps >= 0 && o.steps <= 1000000, "trace gen: --steps ", o.steps, " is out of range");
  check(o.window >= 1 && o.window <= o.history / 2, "trace gen: --window ", o.window,
        " must be in [1, history/2 = ", o.history / 2, "]");
  check(o.accept_mean == 0 || (o.accept_mean >= 1 && o.accept_mean <= o.window),
        "trace gen: --accept-mean ", o.accept_mean, " must be in [1, window = ", o.window, "]");
  CacheConfig& c = trace.cache;
  c.mode = o.mode;
  c.history = o.history;
  c.max_window = o.window;
  c.num_slots = o.slots;
  c.activation_dtype = o.activation_dtype;
  c.seed = o.seed;
  c.validate(trace.shape);

  Rng rng(o.seed);
  const int H = trace.shape.nheads, P = trace.shape.headdim, N = trace.shape.dstate,
            G = trace.shape.ngroups;
  // Mamba-2 initialisation ranges: A = -[1, 16], delta_bias so that softplus(dt_bias) is
  // log-uniform in [1e-3, 1e-1], D around 1.
  for (int h = 0; h < H; ++h) {
    trace.params.A_log.push_back(float(std::log(rng.uniform(1.0, 16.0))));
    const double delta = std::exp(rng.uniform(std::log(1e-3), std::log(1e-1)));
    trace.params.dt_bias.push_back(float(delta + std::log(-std::expm1(-delta))));
    trace.params.D.push_back(float(rng.uniform(0.5, 1.5)));
  }

  int next_input = 0;
  auto make_inputs = [&](int64_t rows) {
    TokenInputs in;
    in.x.resize(size_t(rows) * H * P);
    in.B.resize(size_t(rows) * G * N);
    in.C.resize(size_t(rows) * G * N);
    in.dt.resize(size_t(rows) * H);
    for (float& v : in.x) v = float(rng.normal());
    for (float& v : in.B) v = float(rng.normal());
    for (float& v : in.C) v = float(rng.normal());
    for (float& v : in.dt) v = float(0.5 * rng.normal());
    std::string name = "t";
    name += std::to_string(next_input++);
    trace.inputs[name] = std::move(in);
    return name;
  };

  std::vector<SimSlot> sim(size_t(o.slots));
  for (SimSlot& s : sim) s.open = true;
  auto live = [&] {
    std::vector<int> out;
    for (int i = 0; i < o.slots; ++i)
      if (sim[size_t(i)].open) out.push_back(i);
    return out;
  };
  auto free_slots = [&] {
    std::vector<int> out;
    for (int i = 0; i < o.slots; ++i)
      if (!sim[size_t(i)].open) out.push_back(i);
    return out;
  };
  auto pick = [&](const std::vector<int>& v) { return v[size_t(rng.below(int(v.size())))]; };
  // A random non-empty subset in increasing order; usually every slot, as a serving batch would.
  auto batch_of = [&](const std::vector<int>& v) {
    if (v.size() == 1 || rng.uniform() < 0.6) return v;
    std::vector<int> out;
    for (int s : v)
      if (rng.uniform() < 0.5) out.push_back(s);
    if (out.empty()) out.push_back(pick(v));
    return out;
  };
  auto prefill = [&](int slot) {
    TraceOp op;
    op.kind = OpKind::prefill;
    op.slots = {slot};
    op.window = rng.between(1, o.history + 3);
    op.input = make_inputs(op.window);
    trace.ops.push_back(op);
    sim[size_t(slot)].committed = 0;
  };

  for (int slot = 0; slot < o.slots; ++slot) {
    if (rng.uniform() < 0.85) prefill(slot);  // some requests start from an empty state
  }

  const double accept_mean = o.accept_mean > 0 ? o.accept_mean : 0.54 * o.window;
  for (int step = 0; step < o.steps; ++step) {
    std::vector<int> open_slots = live();
    const std::vector<int> free = free_slots();
    const double r = rng.uniform();
    if (o.lifecycle && r < 0.06 && !free.empty()) {
      TraceOp op;
      op.kind = OpKind::fork;
      op.src = pick(open_slots);
      op.dst = pick(free);
      trace.ops.push_back(op);
      sim[size_t(op.dst)] = sim[size_t(op.src)];
    } else if (o.lifecycle && r < 0.10 && open_slots.size() > 1) {
      TraceOp op;
      op.kind = OpKind::release;
      op.slots = {pick(open_slots)};
      trace.ops.push_back(op);
      sim[size_t(op.slot())].open = false;
    } else if (o.lifecycle && r < 0.13 && !free.empty()) {
      TraceOp op;
      op.kind = OpKind::open;
      op.slots = {pick(free)};
      trace.ops.push_back(op);
      sim[size_t(op.slot())] = SimSlot{true, 0};
      prefill(op.slot());
    } else if (r < 0.18) {
      prefill(pick(open_slots));  // a later prompt chunk: folds committed entries first
    } else if (r < 0.22) {
      TraceOp op;
      op.kind = OpKind::flush;
      op.slots = batch_of(open_slots);
      trace.ops.push_back(op);
      for (int s : op.slots) sim[size_t(s)].committed = 0;
    } else if (o.lifecycle && r < 0.25) {
      TraceOp op;
      op.kind = OpKind::state;
      op.slots = {pick(open_slots)};
      op.at = rng.between(0, sim[size_t(op.slot())].committed);
      trace.ops.push_back(op);
    } else if (o.lifecycle && r < 0.27) {
      TraceOp op;
      op.kind = OpKind::export_slot;
      op.slots = {pick(open_slots)};
      trace.ops.push_back(op);
    }

    open_slots = live();
    const std::vector<int> batch = batch_of(open_slots);
    const int64_t S = int64_t(batch.size());
    if (o.window == 1 || rng.uniform() < 0.25) {
      TraceOp op;
      op.kind = OpKind::decode;
      op.slots = batch;
      op.window = 1;
      op.input = make_inputs(S);
      trace.ops.push_back(op);
      for (int s : batch) {
        SimSlot& slot = sim[size_t(s)];
        if (slot.committed + 1 > o.history) slot.committed = 0;
        slot.committed += 1;
      }
    } else {
      TraceOp verify;
      verify.kind = OpKind::verify;
      verify.slots = batch;
      verify.window = rng.uniform() < 0.8 ? o.window : rng.between(2, o.window);
      verify.input = make_inputs(S * verify.window);
      trace.ops.push_back(verify);
      const double a = acceptance_for_mean(
          std::clamp(accept_mean * verify.window / o.window, 1.0, double(verify.window)),
          verify.window);
      TraceOp commit;
      commit.kind = OpKind::commit;
      commit.slots = batch;
      for (int s : batch) {
        int accepted = 1;
        while (accepted < verify.window && rng.uniform() < a) ++accepted;
        commit.accepted.push_back(accepted);
        SimSlot& slot = sim[size_t(s)];
        if (slot.committed + verify.window > o.history) slot.committed = 0;
        slot.committed += accepted;
      }
      trace.ops.push_back(commit);
    }
  }
  return trace;
}

}  // namespace replayssm::io
