// The lock-step drift engine: one ReplayCache per arm, one slot per seed, one FP64 recurrence per
// seed. Flushes are issued explicitly (exactly where verify would issue them: c + W > history), so
// the checkpoint can be inspected just before and just after every flush.
#include "drift/drift.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "cache/backend.h"
#include "cache/checkpoint_codec.h"
#include "cache/layout.h"
#include "core/act.h"
#include "core/formats.h"
#include "core/splitmix.h"
#include "replayssm/error.h"

#ifdef REPLAYSSM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace replayssm::drift {
namespace {

// ---------------------------------------------------------------------------------------------
// Hook arms: deliberately biased fp16 encodings, applied outside the cache.

// Magnitude of an fp16 bit pattern one step toward zero (or up) keeps the sign: fp16 is
// sign-magnitude, so +-1 on the low 15 bits moves by one ulp, subnormals included.
uint16_t f16_toward_zero(float x) {
  uint16_t h = f32_to_f16(x);
  if ((h & 0x7fffu) >= 0x7c00u) h = uint16_t((h & 0x8000u) | 0x7bffu);  // saturate, as the cache
  if (std::fabs(f16_to_f32(h)) > std::fabs(x) && (h & 0x7fffu) != 0) h = uint16_t(h - 1);
  return h;
}

// SR as "add r random bits to the discarded field, then truncate" without the half-LSB term of
// SPEC section 6: rounds up with probability floor-biased by about 2^-(r+1) ulp.
float f16_sr_biased(float x, uint32_t random, int r_bits) {
  const uint16_t lo = f16_toward_zero(x);
  const float lo_f = f16_to_f32(lo);
  if (lo_f == x || (lo & 0x7fffu) == 0x7bffu) return lo_f;
  const float hi_f = f16_to_f32(uint16_t(lo + 1));  // next magnitude, same sign
  const double frac = (std::fabs(double(x)) - std::fabs(double(lo_f))) /
                      (std::fabs(double(hi_f)) - std::fabs(double(lo_f)));
  const uint32_t field = uint32_t(frac * 8192.0);  // the 13-bit discarded field of a normal value
  const uint32_t k = random >> (32 - r_bits);
  return field + (k << (13 - r_bits)) >= 8192u ? hi_f : lo_f;
}

Reencode truncating_hook() {
  return [](std::span<float> s, uint64_t, uint64_t) {
    for (float& v : s) v = f16_to_f32(f16_toward_zero(v));
  };
}

Reencode biased_sr_hook(int bits) {
  return [bits](std::span<float> s, uint64_t flush, uint64_t seed) {
    for (size_t i = 0; i < s.size(); ++i) {
      const uint32_t random = uint32_t(splitmix64(seed * 0x100000001b3ull ^ (flush << 32) ^ i));
      s[i] = f16_sr_biased(s[i], random, bits);
    }
  };
}

Arm mode_arm(Mode mode, int sr_bits = 7) {
  Arm arm;
  arm.mode = mode;
  arm.sr_bits = sr_bits;
  arm.name = mode == Mode::fp16_sr ? "fp16-sr" + std::to_string(sr_bits) : mode_name(mode);
  return arm;
}

// ---------------------------------------------------------------------------------------------
// Token buffers in the activation dtype, host side, plus device copies for the CUDA backend.

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)), bytes(o.bytes) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
#ifdef REPLAYSSM_WITH_CUDA
    if (ptr) cudaFree(ptr);
#endif
  }
  void* upload(const void* host, size_t n) {
#ifdef REPLAYSSM_WITH_CUDA
    if (n > bytes) {
      if (ptr) cudaFree(ptr);
      ptr = nullptr;
      check(cudaMalloc(&ptr, n) == cudaSuccess, "drift: cudaMalloc of ", n, " bytes failed");
      bytes = n;
    }
    if (host) {
      check(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice) == cudaSuccess,
            "drift: cudaMemcpy to the device failed");
    }
    return ptr;
#else
    (void)host;
    (void)n;
    fail("drift: the cuda backend is not available in this build");
#endif
  }
  void download(void* host, size_t n) const {
#ifdef REPLAYSSM_WITH_CUDA
    check(cudaMemcpy(host, ptr, n, cudaMemcpyDeviceToHost) == cudaSuccess,
          "drift: cudaMemcpy from the device failed");
#else
    (void)host;
    (void)n;
#endif
  }
};

// One batch of tokens [S, T, ...] for all seeds, in the activation dtype, and the fp32 values
// those elements represent (what the FP64 oracle consumes).
struct TokenBuffers {
  SsmShape shape;
  DType act;
  int seeds = 0, tokens = 0;
  std::vector<uint8_t> x, B, C;   // [S,T,H,P], [S,T,G,N], [S,T,G,N] act
  std::vector<float> dt;          // [S,T,H]
  std::vector<float> xf, Bf, Cf;  // fp32 values of x, B, C
  DeviceBuffer dx, dB, dC, ddt;

  void resize(int s, int t) {
    seeds = s;
    tokens = t;
    const size_t st = size_t(s) * t, hp = size_t(shape.nheads) * shape.headdim,
                 gn = size_t(shape.ngroups) * shape.dstate, e = dtype_size(act);
    x.assign(st * hp * e, 0);
    B.assign(st * gn * e, 0);
    C.assign(st * gn * e, 0);
    dt.assign(st * shape.nheads, 0.0f);
    xf.assign(st * hp, 0.0f);
    Bf.assign(st * gn, 0.0f);
    Cf.assign(st * gn, 0.0f);
  }
  // Writes token (s, j) from fp32 values, rounding to the activation dtype.
  void set(int s, int j, const float* xv, const float* Bv, const float* Cv, const float* dtv) {
    const int64_t hp = int64_t(shape.nheads) * shape.headdim,
                  gn = int64_t(shape.ngroups) * shape.dstate, row = int64_t(s) * tokens + j;
    for (int64_t i = 0; i < hp; ++i) {
      store_act(x.data(), act, row * hp + i, xv[i]);
      xf[row * hp + i] = load_act(x.data(), act, row * hp + i);
    }
    for (int64_t i = 0; i < gn; ++i) {
      store_act(B.data(), act, row * gn + i, Bv[i]);
      Bf[row * gn + i] = load_act(B.data(), act, row * gn + i);
      store_act(C.data(), act, row * gn + i, Cv[i]);
      Cf[row * gn + i] = load_act(C.data(), act, row * gn + i);
    }
    std::memcpy(dt.data() + row * shape.nheads, dtv, sizeof(float) * shape.nheads);
  }
  const float* xf_at(int s, int j) const {
    return xf.data() + (size_t(s) * tokens + j) * shape.nheads * shape.headdim;
  }
  const float* Bf_at(int s, int j) const {
    return Bf.data() + (size_t(s) * tokens + j) * shape.ngroups * shape.dstate;
  }
  const float* Cf_at(int s, int j) const {
    return Cf.data() + (size_t(s) * tokens + j) * shape.ngroups * shape.dstate;
  }
  const float* dt_at(int s, int j) const {
    return dt.data() + (size_t(s) * tokens + j) * shape.nheads;
  }

  struct Views {
    TensorView x, B, C, dt;
  };
  // Views for the cache; on CUDA the inputs are uploaded first (once per batch, for all arms).
  Views views(BackendKind backend) {
    const int64_t S = seeds, T = tokens, H = shape.nheads, P = shape.headdim, G = shape.ngroups,
                  N = shape.dstate;
    void *px = x.data(), *pB = B.data(), *pC = C.data(), *pdt = dt.data();
    MemoryKind mem = MemoryKind::host;
    if (backend == BackendKind::cuda) {
      px = dx.upload(x.data(), x.size());
      pB = dB.upload(B.data(), B.size());
      pC = dC.upload(C.data(), C.size());
      pdt = ddt.upload(dt.data(), dt.size() * sizeof(float));
      mem = MemoryKind::cuda;
    }
    return Views{TensorView{px, act, {S, T, H, P}, mem}, TensorView{pB, act, {S, T, G, N}, mem},
                 TensorView{pC, act, {S, T, G, N}, mem},
                 TensorView{pdt, DType::f32, {S, T, H}, mem}};
  }
};

// The outputs of one arm, y [S, T, H, P] fp32, on the host (and the device for CUDA).
struct OutputBuffer {
  std::vector<float> y;
  DeviceBuffer dy;
  TensorView view(const SsmShape& shape, int seeds, int tokens, BackendKind backend) {
    y.resize(size_t(seeds) * tokens * shape.nheads * shape.headdim);
    std::vector<int64_t> dims{seeds, tokens, shape.nheads, shape.headdim};
    if (backend == BackendKind::cuda)
      return TensorView{dy.upload(nullptr, y.size() * sizeof(float)), DType::f32, dims,
                        MemoryKind::cuda};
    return TensorView{y.data(), DType::f32, dims, MemoryKind::host};
  }
  void fetch(BackendKind backend) {
    if (backend == BackendKind::cuda) dy.download(y.data(), y.size() * sizeof(float));
  }
  const float* at(const SsmShape& shape, int tokens, int s, int j) const {
    return y.data() + (size_t(s) * tokens + j) * shape.nheads * shape.headdim;
  }
};

// ---------------------------------------------------------------------------------------------
// Per (arm, seed) accumulators between two rows of the CSV.

struct Accum {
  double out_err2 = 0, out_ref2 = 0;
  double stagnation_sum = 0;
  int64_t stagnation_count = 0;
};

double rel_l2(std::span<const float> a, std::span<const double> ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool has_fp16_carrier(Mode mode) {
  return mode == Mode::fp16 || mode == Mode::fp16_sr || is_separate(mode);
}

// Decodes the read checkpoint (what the readout multiplies with C) of a slot image.
void decode_read_checkpoint(const SsmShape& shape, const CacheConfig& config,
                            std::vector<uint8_t>& bytes, std::vector<float>& out) {
  const SlotLayout layout = SlotLayout::make(shape, config);
  auto ptr = [&](SlotLayout::Section s) -> uint8_t* {
    return layout.size[s] ? bytes.data() + layout.offset[s] : nullptr;
  };
  const SlotCheckpoint ck{ptr(SlotLayout::rec),
                          reinterpret_cast<float*>(ptr(SlotLayout::rec_scale)),
                          ptr(SlotLayout::read), ptr(SlotLayout::read_block_scale),
                          reinterpret_cast<float*>(ptr(SlotLayout::read_scale))};
  const int N = shape.dstate, rows = shape.nheads * shape.headdim;
  out.resize(size_t(rows) * N);
  for (int r = 0; r < rows; ++r) {
    float* row = out.data() + size_t(r) * N;
    const float scale = decode_read_row(config.mode, ck, r, N, row);
    for (int n = 0; n < N; ++n) row[n] *= scale;
  }
}

// Record schedule: every flush up to 16, then geometric (so a log-log fit weighs all scales).
int64_t next_record_after(int64_t flushes, double ratio) {
  if (flushes < 16) return flushes + 1;
  return std::max(flushes + 1, int64_t(std::ceil(double(flushes) * ratio)));
}

Spread spread(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  s.min = s.max = v[0];
  double sum = 0;
  for (double x : v) {
    sum += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  s.mean = sum / double(v.size());
  return s;
}

// One arm of one (regime, history) experiment, all seeds as slots of one cache. Every arm
// regenerates the same tokens, acceptance draws and FP64 reference from the same counters, so
// the arms see identical inputs without having to run in literal lock step: each arm is one task
// from start to end, and the arms run in parallel with no synchronisation per token (at small
// shapes a per-token barrier costs more than the token itself).
class ArmRun {
 public:
  // `report` is called now and then from the first thread with the token-steps done so far.
  ArmRun(const DriftConfig& config, Regime regime, int history, int arm,
         std::atomic<int64_t>& progress_done, std::function<void()> report)
      : cfg_(config),
        arm_(config.arms[size_t(arm)]),
        arm_index_(arm),
        regime_(regime),
        history_(history),
        window_(regime == Regime::ar ? 1 : std::min(config.window, history / 2)),
        S_(config.seeds),
        progress_done_(progress_done),
        report_(std::move(report)) {
    const SsmShape& shape = cfg_.shape;
    // The layer (A, dt_bias, D) is fixed by the base seed; each seed has its own tokens (unless
    // fixed_stream), its own acceptance draws and its own SR bits (request id = seed + 1).
    for (int s = 0; s < S_; ++s) {
      const uint64_t token_seed = cfg_.fixed_stream ? cfg_.base_seed : cfg_.base_seed + uint64_t(s);
      if (cfg_.recorded) {
        streams_.emplace_back(cfg_.recorded, cfg_.fixed_stream ? 0 : s, cfg_.prefill);
      } else {
        streams_.emplace_back(cfg_.stream, shape, cfg_.base_seed, token_seed);
      }
      refs_.emplace_back(shape, streams_.back().params());
      accept_rng_.push_back(splitmix64(cfg_.base_seed * kSplitMixGamma + uint64_t(s)));
    }
    config_.mode = arm_.reencode ? Mode::fp32 : arm_.mode;
    config_.history = history;
    config_.max_window = window_;
    config_.num_slots = S_;
    config_.activation_dtype = cfg_.activation;
    config_.sr_bits = arm_.sr_bits;
    config_.seed = cfg_.base_seed;
    cache_ = std::make_unique<ReplayCache>(shape, streams_[0].params(), config_, cfg_.backend);
    for (int s = 0; s < S_; ++s) cache_->open(s, uint64_t(s) + 1);
    acc_.resize(size_t(S_));
    committed_.assign(size_t(S_), 0);
    in_ring_.assign(size_t(S_), 0);
    flushes_.assign(size_t(S_), 0);
    next_record_.assign(size_t(S_), 1);
    last_row_step_.assign(size_t(S_), -1);
    tokens_.shape = shape;
    tokens_.act = cfg_.activation;
  }

  void run() {
    prefill();
    const int64_t steps = cfg_.steps;
    const SsmShape& sh = cfg_.shape;
    const size_t hp = size_t(sh.nheads) * sh.headdim;
    std::vector<int> accepted(static_cast<size_t>(S_), 0);
    std::vector<std::vector<double>> y64(static_cast<size_t>(S_));
    std::vector<float> x(hp), B(size_t(sh.ngroups) * sh.dstate), C(B.size()), dt(size_t(sh.nheads));
    for (;;) {
      bool any = false;
      std::vector<int> flushing;
      for (int s = 0; s < S_; ++s) {
        accepted[s] = 0;
        if (committed_[s] >= steps) continue;
        any = true;
        accepted[s] = int(std::min<int64_t>(draw_accepted(s), steps - committed_[s]));
        // Where verify would flush (c + W > history); issued here to look at it.
        if (in_ring_[s] + window_ > history_) flushing.push_back(s);
      }
      if (!any) break;
      if (!flushing.empty()) flush(flushing);

      // The window: accepted stream tokens first, then draft tokens the verifier rejects.
      tokens_.resize(S_, window_);
      for (int s = 0; s < S_; ++s) {
        if (!accepted[s]) continue;
        y64[s].resize(size_t(accepted[s]) * hp);
        for (int j = 0; j < window_; ++j) {
          streams_[s].token(committed_[s] + j, j >= accepted[s], x.data(), B.data(), C.data(),
                            dt.data());
          tokens_.set(s, j, x.data(), B.data(), C.data(), dt.data());
          if (j < accepted[s]) {
            refs_[s].step(tokens_.xf_at(s, j), tokens_.Bf_at(s, j), tokens_.Cf_at(s, j),
                          tokens_.dt_at(s, j), y64[s].data() + size_t(j) * hp);
          }
        }
      }
      verify_commit(accepted);
      int64_t done = 0;
      for (int s = 0; s < S_; ++s) {
        for (int j = 0; j < accepted[s]; ++j) {
          const float* y = out_.at(sh, window_, s, j);
          const double* r = y64[s].data() + size_t(j) * hp;
          Accum& acc = acc_[s];
          for (size_t i = 0; i < hp; ++i) {
            const double d = double(y[i]) - r[i];
            acc.out_err2 += d * d;
            acc.out_ref2 += r[i] * r[i];
          }
        }
        committed_[s] += accepted[s];
        in_ring_[s] += accepted[s];
        done += accepted[s];
      }
      progress_done_ += done;
      since_report_ += done;
      if (since_report_ >= 1024 && report_) {
        since_report_ = 0;
#ifdef _OPENMP
        if (omp_get_thread_num() == 0) report_();
#else
        report_();
#endif
      }
    }
    // A last flush so every run ends on a row at exactly `steps` tokens.
    std::vector<int> all;
    for (int s = 0; s < S_; ++s) all.push_back(s);
    flush(all, /*final_row=*/true);
  }

  std::vector<Record>& records() { return records_; }

  ArmSummary summary() const {
    ArmSummary sum;
    sum.regime = regime_;
    sum.history = history_;
    sum.arm = arm_index_;
    sum.name = arm_.name;
    std::vector<double> out_f, st_f, rd_f, sg_f, out_m, st_m, growth;
    double zeroed = 0;
    int64_t zeroed_n = 0;
    for (int s = 0; s < S_; ++s) {
      std::vector<double> gx, gy;
      const Record* last = nullptr;
      double om = 0, sm = 0;
      for (const Record& r : records_) {
        if (r.seed != s) continue;
        last = &r;
        om = std::max(om, r.out_rel);
        sm = std::max(sm, r.state_rel);
        // The first flushes still carry the prefill's single encoding; fit from the fourth on.
        if (r.flushes >= 4) {
          gx.push_back(double(r.flushes));
          gy.push_back(r.state_rel);
        }
        zeroed += r.zeroed;
        ++zeroed_n;
      }
      if (!last) continue;
      out_f.push_back(last->out_rel);
      st_f.push_back(last->state_rel);
      rd_f.push_back(last->read_rel);
      sg_f.push_back(last->signed_rel);
      out_m.push_back(om);
      st_m.push_back(sm);
      growth.push_back(fit_growth_exponent(gx, gy));
      sum.steps = std::max(sum.steps, last->step);
      sum.flushes = std::max(sum.flushes, last->flushes);
    }
    sum.out_final = spread(out_f);
    sum.state_final = spread(st_f);
    sum.read_final = spread(rd_f);
    sum.signed_final = spread(sg_f);
    sum.out_max = spread(out_m);
    sum.state_max = spread(st_m);
    sum.growth = spread(growth);
    sum.stagnation = stagnation_count_ ? stagnation_sum_ / double(stagnation_count_) : 0;
    sum.zeroed = zeroed_n ? zeroed / double(zeroed_n) : 0;
    sum.stats = cache_->stats();
    return sum;
  }

 private:
  int draw_accepted(int s) {
    if (window_ == 1) return 1;
    // The first token is always accepted; each draft after it with probability `accept`,
    // stopping at the first rejection (what a rejection sampler does).
    int k = 1;
    while (k < window_) {
      accept_rng_[s] = splitmix64(accept_rng_[s]);
      if (double(accept_rng_[s] >> 11) * 0x1p-53 >= cfg_.accept) break;
      ++k;
    }
    return k;
  }

  void prefill() {
    if (cfg_.prefill <= 0) return;
    const SsmShape& sh = cfg_.shape;
    tokens_.resize(S_, cfg_.prefill);
    std::vector<float> x(size_t(sh.nheads) * sh.headdim), B(size_t(sh.ngroups) * sh.dstate),
        C(B.size()), dt(size_t(sh.nheads));
    std::vector<double> y64(x.size());
    for (int s = 0; s < S_; ++s) {
      for (int j = 0; j < cfg_.prefill; ++j) {
        streams_[s].token(int64_t(j) - cfg_.prefill, false, x.data(), B.data(), C.data(),
                          dt.data());
        tokens_.set(s, j, x.data(), B.data(), C.data(), dt.data());
        refs_[s].step(tokens_.xf_at(s, j), tokens_.Bf_at(s, j), tokens_.Cf_at(s, j),
                      tokens_.dt_at(s, j), y64.data());
      }
    }
    std::vector<int32_t> slots(static_cast<size_t>(S_));
    for (int s = 0; s < S_; ++s) slots[s] = s;
    const TokenBuffers::Views v = tokens_.views(cfg_.backend);
    const TensorView y = out_.view(cfg_.shape, S_, cfg_.prefill, cfg_.backend);
    cache_->prefill(host_view(slots.data(), DType::i32, {S_}), v.x, v.B, v.C, v.dt, y);
    // A prefill writes the checkpoint like a flush does; a hook arm re-encodes it too.
    if (arm_.reencode) {
      for (int s = 0; s < S_; ++s) reencode(s, 0);
    }
  }

  void verify_commit(const std::vector<int>& accepted) {
    // Finished seeds are padding: they keep their state, their tokens are ignored.
    std::vector<int32_t> slots(static_cast<size_t>(S_)), acc(static_cast<size_t>(S_));
    for (int s = 0; s < S_; ++s) {
      slots[s] = accepted[s] ? s : kPaddingSlot;
      acc[s] = std::max(accepted[s], 1);
    }
    const TokenBuffers::Views v = tokens_.views(cfg_.backend);
    const TensorView sv = host_view(slots.data(), DType::i32, {S_});
    cache_->verify(sv, v.x, v.B, v.C, v.dt, out_.view(cfg_.shape, S_, window_, cfg_.backend));
    out_.fetch(cfg_.backend);
    cache_->commit(sv, host_view(acc.data(), DType::i32, {S_}));
  }

  // Replaces the checkpoint of a hook arm's slot by its re-encoding (ring empty: just flushed).
  void reencode(int s, uint64_t flush) {
    std::vector<float> state = cache_->state(s, 0);
    arm_.reencode(state, flush, cfg_.base_seed * 1000003ull + uint64_t(s));
    const uint64_t request = cache_->cursors(s).request_id;
    cache_->release(s);
    cache_->import_state(s, request, state.data());
  }

  void flush(const std::vector<int>& seeds, bool final_row = false) {
    const SsmShape& sh = cfg_.shape;
    std::vector<float> old_ck, fold, now, read;
    const bool fp16_carrier = has_fp16_carrier(config_.mode);
    const SlotLayout layout = SlotLayout::make(sh, config_);
    const size_t rec_at = layout.offset[SlotLayout::rec], rec_bytes = layout.size[SlotLayout::rec];
    for (int s : seeds) {
      const bool empty = in_ring_[s] == 0;
      old_ck = cache_->state(s, 0);
      fold = cache_->state(s);
      const std::vector<uint8_t> old_bytes = cache_->impl().read_slot(s).bytes;
      if (!empty) {
        const int32_t one[1] = {s};
        cache_->flush(host_view(one, DType::i32, {1}));
        if (arm_.reencode) reencode(s, uint64_t(flushes_[s]) + 1);
        flushes_[s] += 1;
        in_ring_[s] = 0;
      }
      now = cache_->state(s, 0);
      std::vector<uint8_t> bytes = cache_->impl().read_slot(s).bytes;
      decode_read_checkpoint(sh, config_, bytes, read);

      const std::vector<double>& S64 = refs_[s].state();
      Accum& acc = acc_[s];
      if (!empty) {
        acc.stagnation_sum += stagnation_fraction(
            old_ck, fold, std::span(old_bytes).subspan(rec_at, rec_bytes),
            std::span(bytes).subspan(rec_at, rec_bytes), carrier_bytes(config_.mode));
        acc.stagnation_count += 1;
      }
      double signed_num = 0, abs_den = 0;
      int64_t zeroed = 0, nonzero = 0, saturated = 0;
      for (size_t i = 0; i < now.size(); ++i) {
        const double r = S64[i];
        signed_num += (double(now[i]) - r) * (r > 0 ? 1.0 : r < 0 ? -1.0 : 0.0);
        abs_den += std::fabs(r);
        if (r != 0) {
          ++nonzero;
          if (read[i] == 0.0f) ++zeroed;
        }
        if (fp16_carrier && std::fabs(now[i]) == 65504.0f) ++saturated;
      }

      // A row at every scheduled flush, and at the end unless the last row already is the end.
      const bool due = flushes_[s] >= next_record_[s];
      if (!due && !(final_row && last_row_step_[s] != committed_[s])) continue;
      if (due) next_record_[s] = next_record_after(flushes_[s], cfg_.record_ratio);
      Record r;
      r.regime = regime_;
      r.history = history_;
      r.arm = arm_index_;
      r.seed = s;
      r.step = committed_[s];
      r.flushes = flushes_[s];
      r.out_rel = acc.out_ref2 > 0 ? std::sqrt(acc.out_err2 / acc.out_ref2) : 0;
      r.state_rel = rel_l2(now, S64);
      r.read_rel = rel_l2(read, S64);
      r.signed_rel = abs_den > 0 ? signed_num / abs_den : 0;
      r.stagnation = acc.stagnation_count ? acc.stagnation_sum / double(acc.stagnation_count) : 0;
      r.zeroed = nonzero ? double(zeroed) / double(nonzero) : 0;
      r.saturated = saturated;
      records_.push_back(r);
      stagnation_sum_ += acc.stagnation_sum;
      stagnation_count_ += acc.stagnation_count;
      acc = Accum{};
      last_row_step_[s] = committed_[s];
    }
  }

  const DriftConfig& cfg_;
  const Arm& arm_;
  int arm_index_;
  Regime regime_;
  int history_, window_, S_;
  std::atomic<int64_t>& progress_done_;
  std::function<void()> report_;
  int64_t since_report_ = 0;
  CacheConfig config_;
  std::unique_ptr<ReplayCache> cache_;
  std::vector<Stream> streams_;
  std::vector<Fp64Recurrence> refs_;
  std::vector<uint64_t> accept_rng_;
  std::vector<Accum> acc_;  // [S]
  std::vector<int64_t> committed_, in_ring_, flushes_, next_record_, last_row_step_;
  std::vector<Record> records_;
  double stagnation_sum_ = 0;
  int64_t stagnation_count_ = 0;
  TokenBuffers tokens_;
  OutputBuffer out_;
};

}  // namespace

std::vector<Arm> standard_arms() {
  return {
      mode_arm(Mode::fp32),        mode_arm(Mode::bf16),         mode_arm(Mode::fp16),
      mode_arm(Mode::fp16_sr, 7),  mode_arm(Mode::fp16_sr, 13),  mode_arm(Mode::shared_fp8),
      mode_arm(Mode::shared_int8), mode_arm(Mode::separate_fp8), mode_arm(Mode::separate_nvfp4)};
}

Arm parse_arm(std::string_view name) {
  auto bits_of = [&](std::string_view digits) {
    int bits = 0;
    for (char ch : digits) {
      check(ch >= '0' && ch <= '9' && bits < 100, "arm '", name, "': bad SR bit count");
      bits = bits * 10 + (ch - '0');
    }
    check(!digits.empty() && bits >= 1 && bits <= 13, "arm '", name, "': SR bits must be in 1..13");
    return bits;
  };
  if (name == "fp16-sr") return mode_arm(Mode::fp16_sr, 7);
  if (name == "fp16-trunc") {
    Arm arm;
    arm.name = "fp16-trunc";
    arm.reencode = truncating_hook();
    return arm;
  }
  constexpr std::string_view kSr = "fp16-sr", kBiased = "-biased";
  if (name.starts_with(kSr)) {
    std::string_view rest = name.substr(kSr.size());
    if (rest.ends_with(kBiased)) {
      const int bits = bits_of(rest.substr(0, rest.size() - kBiased.size()));
      Arm arm;
      arm.name = std::string(name);
      arm.sr_bits = bits;
      arm.reencode = biased_sr_hook(bits);
      return arm;
    }
    return mode_arm(Mode::fp16_sr, bits_of(rest));
  }
  try {
    return mode_arm(parse_mode(name));
  } catch (const Error&) {
    fail("unknown arm '", name,
         "' (expected fp32, bf16, fp16, fp16-sr7, fp16-sr13, fp16-srR with R in 1..13, "
         "shared-fp8, shared-int8, separate-fp8, separate-nvfp4, or the biased test arms "
         "fp16-trunc, fp16-srR-biased)");
  }
}

std::vector<Arm> parse_arms(std::string_view list) {
  if (list == "all") return standard_arms();
  std::vector<Arm> arms;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view part = list.substr(start, comma - start);
    if (!part.empty()) {
      Arm arm = parse_arm(part);
      for (const Arm& a : arms) check(a.name != arm.name, "arm '", arm.name, "' given twice");
      arms.push_back(std::move(arm));
    }
    start = comma + 1;
  }
  check(!arms.empty(), "no arms given");
  return arms;
}

const char* regime_name(Regime regime) { return regime == Regime::ar ? "ar" : "spec"; }

Regime parse_regime(std::string_view name) {
  if (name == "ar") return Regime::ar;
  if (name == "spec") return Regime::spec;
  fail("unknown regime '", name, "' (expected ar or spec)");
}

void DriftConfig::validate() const {
  shape.validate();
  check(steps >= 1, "steps must be at least 1, got ", steps);
  check(prefill >= 0, "prefill must be >= 0, got ", prefill);
  check(!histories.empty() && !regimes.empty() && !arms.empty(),
        "need at least one history, regime and arm");
  for (int h : histories)
    check(h >= 2 && (h & (h - 1)) == 0, "history ", h, " must be a power of two >= 2");
  check(window >= 1, "window must be at least 1, got ", window);
  check(accept >= 0 && accept <= 1, "accept must be in [0, 1], got ", accept);
  check(seeds >= 1 && seeds <= 1024, "seeds must be in 1..1024, got ", seeds);
  check(record_ratio > 1.0, "record ratio must exceed 1");
  check(backend_available(backend), "backend ", backend_name(backend), " is not available");
  check((stream == StreamKind::recorded) == bool(recorded),
        "a recorded stream needs its recording, and a recording needs stream 'trace'");
  if (recorded) {
    check(shape == recorded->shape, "the shape must be the recording's (", recorded->shape.nheads,
          ",", recorded->shape.headdim, ",", recorded->shape.dstate, ",", recorded->shape.ngroups,
          ")");
    const size_t used = fixed_stream ? 1 : std::min(size_t(seeds), recorded->sequences.size());
    for (size_t i = 0; i < used; ++i) {
      check(recorded->sequences[i].tokens >= prefill + steps, recorded->source, ": sequence ", i,
            " has ", recorded->sequences[i].tokens, " tokens, fewer than prefill ", prefill,
            " + steps ", steps);
    }
  }
  for (const Arm& arm : arms) {
    if (arm.mode == Mode::separate_nvfp4 && !arm.reencode)
      check(shape.dstate % 16 == 0, "separate-nvfp4 needs dstate to be a multiple of 16, got ",
            shape.dstate);
  }
}

DriftResult run_drift(const DriftConfig& config, const ProgressFn& progress) {
  config.validate();
  const auto start = std::chrono::steady_clock::now();
  DriftResult result;
  result.config = config;
  const int64_t per_experiment = config.steps * config.seeds * int64_t(config.arms.size());
  const int64_t total = per_experiment * int64_t(config.histories.size() * config.regimes.size());
  std::atomic<int64_t> done{0};
  for (Regime regime : config.regimes) {
    for (int history : config.histories) {
      const std::string label = std::string(regime_name(regime)) + " h" + std::to_string(history) +
                                " " + stream_name(config.stream);
      const int n = int(config.arms.size());
      std::function<void()> report;
      if (progress) report = [&] { progress(done.load(), total, label); };
      std::vector<std::unique_ptr<ArmRun>> runs(static_cast<size_t>(n));
      std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
      // Arms in parallel, one thread each (their caches share nothing; on CUDA each has its own
      // stream). The backend's and the FP64 reference's parallel regions are then nested and run
      // on one thread: at model shapes the per-flush measurements (state read back, decoded and
      // compared on the host) cost more than the tokens, and they only parallelise across arms.
      const bool parallel = n > 1;
#pragma omp parallel for schedule(dynamic) if (parallel)
      for (int a = 0; a < n; ++a) {
        try {
          runs[size_t(a)] = std::make_unique<ArmRun>(config, regime, history, a, done, report);
          runs[size_t(a)]->run();
        } catch (...) {
          errors[size_t(a)] = std::current_exception();
        }
      }
      for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
      for (auto& run : runs) {
        result.records.insert(result.records.end(), run->records().begin(), run->records().end());
        result.summaries.push_back(run->summary());
      }
      if (progress) progress(done.load(), total, label);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace replayssm::drift
