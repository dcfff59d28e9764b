// Synthetic token streams of the drift study and the FP64 oracle.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/splitmix.h"
#include "drift/drift.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::drift {
namespace {

// A small counter-seeded generator: cheap to create per token, so any token can be produced on
// its own (lock step needs each token once per seed, drafts need an independent sequence).
class Rng {
 public:
  explicit Rng(uint64_t key) : state_(splitmix64(key)) {}
  uint64_t next() { return splitmix64(state_ += kSplitMixGamma); }
  double uniform() { return double(next() >> 11) * 0x1p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // Box-Muller; 1 - u keeps the logarithm finite.
    const double r = std::sqrt(-2.0 * std::log(1.0 - uniform())), phi = 2.0 * M_PI * uniform();
    spare_ = r * std::sin(phi);
    has_spare_ = true;
    return r * std::cos(phi);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(a ^ 0x5851f42d4c957f2dull) ^ b) ^
         splitmix64(c + 0x14057b7ef767814full);
}

// Long-memory heads hold delta fixed (raw dt = 0) and set A so that exp(delta * A) = exp(-rate).
constexpr double kFixedDelta = 1e-2;
constexpr double kTinyScale = 1e-4;   // x scale of the tiny stream after the prefill
constexpr double kBurstScale = 1e6;   // x scale inside a burst: delta x B reaches fp16 max
constexpr int kBurstLength = 4;       // tokens per burst
constexpr uint64_t kBurstOneIn = 64;  // one block of kBurstLength tokens in 64 is a burst

// What a head does, by stream kind: per-head parameter choice and token scaling.
enum HeadKind : uint8_t { kMamba2, kLong3, kLong5, kTiny4, kTiny5, kBursts };

double head_rate(uint8_t kind) {
  switch (kind) {
    case kLong3:
      return 1e-3;
    case kLong5:
    case kTiny5:
      return 1e-5;
    case kTiny4:
      return 1e-4;
    default:
      return 0;
  }
}

}  // namespace

const char* stream_name(StreamKind kind) {
  switch (kind) {
    case StreamKind::mamba2:
      return "mamba2";
    case StreamKind::long_memory:
      return "long";
    case StreamKind::tiny:
      return "tiny";
    case StreamKind::bursts:
      return "bursts";
    case StreamKind::mix:
      return "mix";
    case StreamKind::recorded:
      return "trace";
  }
  return "?";
}

StreamKind parse_stream(std::string_view name) {
  for (StreamKind k : all_streams())
    if (name == stream_name(k)) return k;
  check(name != "trace", "the trace stream needs a trace file (replayssm drift --trace FILE)");
  fail("unknown stream '", name, "' (expected mamba2, long, tiny, bursts or mix)");
}

std::vector<StreamKind> all_streams() {
  return {StreamKind::mamba2, StreamKind::long_memory, StreamKind::tiny, StreamKind::bursts,
          StreamKind::mix};
}

Stream::Stream(StreamKind kind, const SsmShape& shape, uint64_t layer_seed, uint64_t token_seed)
    : kind_(kind), shape_(shape), seed_(token_seed) {
  shape.validate();
  const int H = shape.nheads;
  head_kind_.resize(size_t(H));
  for (int h = 0; h < H; ++h) {
    switch (kind) {
      case StreamKind::mamba2:
        head_kind_[h] = kMamba2;
        break;
      case StreamKind::long_memory:
        head_kind_[h] = h % 2 ? kLong5 : kLong3;
        break;
      case StreamKind::tiny:
        head_kind_[h] = h % 2 ? kTiny5 : kTiny4;
        break;
      case StreamKind::bursts:
        head_kind_[h] = kBursts;
        break;
      case StreamKind::mix: {
        static constexpr uint8_t cycle[4] = {kMamba2, kLong3, kLong5, kTiny5};
        head_kind_[h] = cycle[h % 4];
        break;
      }
      case StreamKind::recorded:
        fail("a recorded stream is built from its recording, not from a seed");
    }
  }
  Rng rng(mix_key(layer_seed, ~0ull, 0x706172616d73ull));  // "params"
  for (int h = 0; h < H; ++h) {
    const double u1 = rng.uniform(), u2 = rng.uniform(), u3 = rng.uniform();
    const uint8_t hk = head_kind_[h];
    double a_log, dt;
    if (hk == kMamba2 || hk == kBursts) {
      a_log = std::log(1.0 + 15.0 * u1);
      dt = std::exp(std::log(1e-3) + (std::log(1e-1) - std::log(1e-3)) * u2);
    } else {
      dt = kFixedDelta;
      a_log = std::log(head_rate(hk) / kFixedDelta);
    }
    params_.A_log.push_back(float(a_log));
    params_.dt_bias.push_back(float(std::log(std::expm1(dt))));  // softplus^-1(dt)
    params_.D.push_back(float(0.5 + u3));
  }
}

Stream::Stream(std::shared_ptr<const RecordedStreams> recorded, int index, int prefill)
    : kind_(StreamKind::recorded),
      shape_(recorded->shape),
      seed_(0),
      params_(recorded->params),
      recorded_(std::move(recorded)),
      prefill_(prefill) {
  check(!recorded_->sequences.empty(), recorded_->source, ": no tokens recorded");
  sequence_ = &recorded_->sequences[size_t(index) % recorded_->sequences.size()];
}

void Stream::token(int64_t t, bool draft, float* x, float* B, float* C, float* dt) const {
  const int H = shape_.nheads, P = shape_.headdim, N = shape_.dstate, G = shape_.ngroups;
  if (sequence_) {
    const int64_t n = sequence_->tokens;
    int64_t i = prefill_ + t;
    // A rejected draft is some other real token of the sequence: plausible magnitudes, wrong
    // content, as a draft model's miss would be.
    if (draft) i = (i + n / 2 + 1) % n;
    check(i >= 0 && i < n, recorded_->source, ": token ", i, " requested but the sequence has ", n,
          " (reduce --steps or --prefill)");
    std::copy_n(sequence_->x.data() + i * H * P, H * P, x);
    std::copy_n(sequence_->B.data() + i * G * N, G * N, B);
    std::copy_n(sequence_->C.data() + i * G * N, G * N, C);
    std::copy_n(sequence_->dt.data() + i * H, H, dt);
    return;
  }
  Rng rng(mix_key(seed_, uint64_t(t), draft ? 1 : 0));
  const bool in_burst =
      t >= 0 && splitmix64(mix_key(seed_, uint64_t(t / kBurstLength), 2)) % kBurstOneIn == 0;
  for (int h = 0; h < H; ++h) {
    const uint8_t hk = head_kind_[h];
    double scale = 1.0;
    if ((hk == kTiny4 || hk == kTiny5) && t >= 0) scale = kTinyScale;
    if (hk == kBursts && in_burst) scale = kBurstScale;
    for (int p = 0; p < P; ++p) x[h * P + p] = float(scale * rng.normal());
    // Mamba-2-like heads: raw dt ~ N(0, 0.5) moves delta around dt_bias; long-memory heads keep
    // delta fixed so their decay per token is exactly the stated one.
    dt[h] = (hk == kMamba2 || hk == kBursts) ? float(0.5 * rng.normal()) : 0.0f;
  }
  for (int i = 0; i < G * N; ++i) B[i] = float(rng.normal());
  for (int i = 0; i < G * N; ++i) C[i] = float(rng.normal());
}

Fp64Recurrence::Fp64Recurrence(const SsmShape& shape, const LayerParams& params)
    : shape_(shape),
      dt_min_(params.dt_min),
      dt_max_(params.dt_max),
      S_(size_t(shape.state_elements()), 0.0) {
  for (int h = 0; h < shape.nheads; ++h) {
    A_.push_back(-std::exp(double(params.A_log[h])));
    dt_bias_.push_back(params.dt_bias[h]);
    D_.push_back(params.D[h]);
  }
}

void Fp64Recurrence::step(const float* x, const float* B, const float* C, const float* dt,
                          double* y) {
  const int H = shape_.nheads, P = shape_.headdim, N = shape_.dstate;
  // Heads are independent (no sum across them), so the result does not depend on the threads.
  // Parallel over heads for a single-arm run at a model shape (~1M state elements); when the arms
  // run in parallel this region is nested and serial.
#pragma omp parallel for schedule(static) if (int64_t(H) * P * N >= (int64_t(1) << 18))
  for (int h = 0; h < H; ++h) {
    const int g = h / shape_.heads_per_group();
    const double u = double(dt[h]) + dt_bias_[h];
    double delta = u > 20.0 ? u : std::log1p(std::exp(u));
    delta = std::min(std::max(delta, dt_min_), dt_max_);
    const double a = std::exp(delta * A_[h]);
    const float* b = B + size_t(g) * N;
    const float* c = C + size_t(g) * N;
    for (int p = 0; p < P; ++p) {
      const double dx = delta * double(x[h * P + p]);
      double* s = S_.data() + (size_t(h) * P + p) * N;
      double acc = 0.0;
      for (int n = 0; n < N; ++n) {
        s[n] = a * s[n] + dx * double(b[n]);
        acc += s[n] * double(c[n]);
      }
      y[h * P + p] = acc + D_[h] * double(x[h * P + p]);
    }
  }
}

}  // namespace replayssm::drift

namespace replayssm::drift {

RecordedStreams read_recorded_streams(const std::string& trace_path) {
  const io::Trace trace = io::read_trace(trace_path);
  RecordedStreams rec;
  rec.source = trace_path;
  rec.shape = trace.shape;
  rec.params = trace.params;
  const int H = trace.shape.nheads, P = trace.shape.headdim, G = trace.shape.ngroups,
            N = trace.shape.dstate;
  const size_t hp = size_t(H) * P, gn = size_t(G) * N;
  std::map<int, RecordedStreams::Sequence> open;                     // slot -> its current sequence
  std::map<int, std::pair<const io::TokenInputs*, size_t>> pending;  // slot -> verify rows
  auto close = [&](int slot) {
    auto it = open.find(slot);
    if (it != open.end() && it->second.tokens > 0) rec.sequences.push_back(std::move(it->second));
    if (it != open.end()) open.erase(it);
    pending.erase(slot);
  };
  auto append = [&](int slot, const io::TokenInputs& in, size_t row, size_t count) {
    RecordedStreams::Sequence& seq = open[slot];
    seq.x.insert(seq.x.end(), in.x.begin() + row * hp, in.x.begin() + (row + count) * hp);
    seq.B.insert(seq.B.end(), in.B.begin() + row * gn, in.B.begin() + (row + count) * gn);
    seq.C.insert(seq.C.end(), in.C.begin() + row * gn, in.C.begin() + (row + count) * gn);
    seq.dt.insert(seq.dt.end(), in.dt.begin() + row * H, in.dt.begin() + (row + count) * H);
    seq.tokens += int64_t(count);
  };
  for (const io::TraceOp& op : trace.ops) {
    switch (op.kind) {
      case io::OpKind::prefill:
        append(op.slot(), trace.inputs.at(op.input), 0, size_t(op.window));
        break;
      case io::OpKind::decode: {
        const io::TokenInputs& in = trace.inputs.at(op.input);
        for (size_t i = 0; i < op.slots.size(); ++i) append(op.slots[i], in, i, 1);
        break;
      }
      case io::OpKind::verify: {
        const io::TokenInputs& in = trace.inputs.at(op.input);
        for (size_t i = 0; i < op.slots.size(); ++i)
          pending[op.slots[i]] = {&in, i * size_t(op.window)};
        break;
      }
      case io::OpKind::commit:
        for (size_t i = 0; i < op.slots.size(); ++i) {
          auto it = pending.find(op.slots[i]);
          if (it == pending.end()) continue;  // the reader or the runner reports this one
          append(op.slots[i], *it->second.first, it->second.second, size_t(op.accepted[i]));
          pending.erase(it);
        }
        break;
      case io::OpKind::release:
      case io::OpKind::open:
        close(op.slot());
        break;
      case io::OpKind::fork:
        close(op.dst);
        break;
      default:
        break;
    }
  }
  while (!open.empty()) close(open.begin()->first);
  check(!rec.sequences.empty(), trace_path, ": the trace decodes no tokens");
  return rec;
}

}  // namespace replayssm::drift
