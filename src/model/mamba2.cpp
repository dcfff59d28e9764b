#include "model/mamba2.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/act.h"
#include "core/formats.h"
#include "io/staging.h"
#include "model/matmul.h"
#include "replayssm/error.h"
#include "replayssm/standard_decode.h"

namespace replayssm::model {

namespace {

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// out = weight * x / sqrt(mean(x^2) + eps) over `width` elements (Mamba2RMSNorm).
void rms_norm(const float* x, const float* weight, int64_t width, float eps, float* out) {
  double sum = 0.0;  // double: wide layers (d_inner 8192+) would lose digits in an fp32 sum
  for (int64_t i = 0; i < width; ++i) sum += double(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(float(sum / double(width)) + eps);
  for (int64_t i = 0; i < width; ++i) out[i] = weight[i] * (x[i] * scale);
}

}  // namespace

Mamba2Model::Mamba2Model(std::shared_ptr<const ModelWeights> weights, const RunnerConfig& config)
    : weights_(std::move(weights)), runner_(config) {
  check(weights_ != nullptr, "Mamba2Model: no weights");
  const ModelConfig& c = weights_->config;
  check(runner_.activation_dtype == DType::f32 || runner_.activation_dtype == DType::bf16,
        "model runner: activation dtype must be fp32 or bf16, got ",
        dtype_name(runner_.activation_dtype));
  check(runner_.prefill_chunk >= 1, "model runner: prefill chunk must be at least 1, got ",
        runner_.prefill_chunk);
  check(runner_.threads >= 0, "model runner: threads must be >= 0, got ", runner_.threads);
  if (runner_.threads > 0) omp_set_num_threads(runner_.threads);
  check(runner_.num_slots >= 1, "model runner: num_slots must be at least 1, got ",
        runner_.num_slots);
  if (is_standard()) {
    // Only what standard_decode offers and a serving engine stores: fp32 or bf16 states (f16 and
    // stochastic rounding are replay checkpoint modes here).
    check(runner_.standard_state_dtype == DType::f32 || runner_.standard_state_dtype == DType::bf16,
          "model runner: the standard SSM path keeps fp32 or bf16 states, got ",
          dtype_name(runner_.standard_state_dtype));
    check(runner_.max_window >= 1, "model runner: max_window must be at least 1, got ",
          runner_.max_window);
  }
  caches_.reserve(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_->layers[size_t(l)];
    LayerParams params;
    params.A_log = lw.A_log;
    params.dt_bias = lw.dt_bias;
    params.D = lw.D;
    params.dt_min = c.time_step_min_clamp;
    params.dt_max = c.time_step_max_clamp;
    CacheConfig cc;
    cc.mode = runner_.mode;
    cc.history = runner_.history;
    cc.max_window = runner_.max_window;
    cc.num_slots = runner_.num_slots;
    cc.activation_dtype = runner_.activation_dtype;
    cc.seed = runner_.seed;
    cc.layer = l;
    params.validate(c.ssm_shape());
    layer_params_.push_back(params);
    if (!is_standard()) {
      caches_.emplace_back(c.ssm_shape(), params, cc, runner_.backend);
      continue;
    }
    const int64_t S = runner_.num_slots, W = runner_.max_window;
    const DType sdt = runner_.standard_state_dtype;
    states_.push_back(std::make_unique<io::BackendBuffer>(
        runner_.backend, sdt, std::vector<int64_t>{S, c.num_heads, c.head_dim, c.state_size}));
    inter_.push_back(std::make_unique<io::BackendBuffer>(
        runner_.backend, sdt, std::vector<int64_t>{S * W, c.num_heads, c.head_dim, c.state_size}));
  }
  in_place_.assign(size_t(runner_.num_slots), 0);
  open_.assign(size_t(runner_.num_slots), 0);
  conv_.assign(size_t(c.num_layers), std::vector<ConvState>(size_t(runner_.num_slots)));
  pending_.assign(size_t(runner_.num_slots), 0);
}

void Mamba2Model::check_slot(int slot, const char* op) const {
  const bool open = slot >= 0 && slot < runner_.num_slots &&
                    (is_standard() ? open_[size_t(slot)] != 0 : caches_.front().is_open(slot));
  check(open, op, ": slot ", slot, " is not open");
}

void Mamba2Model::check_batch(std::span<const int> slots, const char* op) const {
  check(!slots.empty(), op, ": the slot list is empty");
  std::vector<uint8_t> seen(size_t(runner_.num_slots), 0);
  for (int slot : slots) {
    check_slot(slot, op);
    check(!seen[size_t(slot)], op, ": slot ", slot, " appears twice in one batch");
    seen[size_t(slot)] = 1;
  }
}

int Mamba2Model::open(uint64_t request_id) {
  const ModelConfig& c = weights_->config;
  int slot = 0;
  if (is_standard()) {
    while (slot < runner_.num_slots && open_[size_t(slot)]) ++slot;
    check(slot < runner_.num_slots, "open: all ", runner_.num_slots, " slots are in use");
    const int64_t n = c.ssm_shape().state_elements();
    for (auto& state : states_) state->zero(slot * n, n);
    open_[size_t(slot)] = 1;
  } else {
    slot = caches_.front().allocate(request_id);
    for (size_t l = 1; l < caches_.size(); ++l) caches_[l].open(slot, request_id);
  }
  for (auto& layer : conv_) {
    ConvState& s = layer[size_t(slot)];
    s.committed.assign(size_t(c.conv_kernel - 1) * size_t(c.conv_dim()), 0.0f);
    s.pending.assign(size_t(runner_.max_window) * size_t(c.conv_dim()), 0.0f);
    s.pending_count = 0;
  }
  pending_[size_t(slot)] = 0;
  return slot;
}

void Mamba2Model::release(int slot) {
  check_slot(slot, "release");
  for (ReplayCache& cache : caches_) cache.release(slot);
  if (is_standard()) open_[size_t(slot)] = 0;
  pending_[size_t(slot)] = 0;
}

void Mamba2Model::prefill(int slot, std::span<const int32_t> tokens, std::vector<float>& logits,
                          bool all_logits) {
  check_slot(slot, "prefill");
  check(!tokens.empty(), "prefill: the prompt is empty (at least one token is needed)");
  check(pending_[size_t(slot)] == 0, "prefill: slot ", slot,
        " has an uncommitted verify window; commit it first");
  const int64_t V = vocab_size();
  std::vector<float> chunk_logits;
  if (all_logits) logits.assign(tokens.size() * size_t(V), 0.0f);
  for (size_t start = 0; start < tokens.size(); start += size_t(runner_.prefill_chunk)) {
    const int64_t T = int64_t(std::min(tokens.size() - start, size_t(runner_.prefill_chunk)));
    const bool last = start + size_t(T) == tokens.size();
    if (!all_logits && !last) {
      std::vector<float> none;
      forward({&slot, 1}, tokens.data() + start, T, Op::prefill, false, none);
      continue;
    }
    forward({&slot, 1}, tokens.data() + start, T, Op::prefill, all_logits, chunk_logits);
    if (all_logits) {
      std::copy(chunk_logits.begin(), chunk_logits.end(), logits.begin() + int64_t(start) * V);
    } else {
      logits = chunk_logits;
    }
  }
}

void Mamba2Model::verify(int slot, std::span<const int32_t> tokens, std::vector<float>& logits) {
  verify_batch({&slot, 1}, tokens, int(tokens.size()), logits);
}

void Mamba2Model::commit(int slot, int accepted) { commit_batch({&slot, 1}, {&accepted, 1}); }

void Mamba2Model::verify_batch(std::span<const int> slots, std::span<const int32_t> tokens, int W,
                               std::vector<float>& logits) {
  check_batch(slots, "verify");
  check(W >= 1 && W <= runner_.max_window, "verify: window of ", W,
        " tokens is outside 1..max_window (", runner_.max_window, ")");
  check(tokens.size() == slots.size() * size_t(W), "verify: ", tokens.size(), " tokens for ",
        slots.size(), " slots of window ", W,
        " (expected slots x window = ", slots.size() * size_t(W), ")");
  for (int slot : slots)
    check(pending_[size_t(slot)] == 0, "verify: slot ", slot,
          " has an uncommitted verify window; commit it first");
  forward(slots, tokens.data(), W, Op::verify, true, logits);
  for (int slot : slots) pending_[size_t(slot)] = W;
}

void Mamba2Model::commit_batch(std::span<const int> slots, std::span<const int> accepted) {
  check_batch(slots, "commit");
  check(accepted.size() == slots.size(), "commit: ", accepted.size(), " accepted counts for ",
        slots.size(), " slots");
  for (size_t s = 0; s < slots.size(); ++s) {
    const int W = pending_[size_t(slots[s])];
    check(W > 0, "commit: slot ", slots[s], " has no verify window to commit");
    check(accepted[s] >= 1 && accepted[s] <= W, "commit: accepted count ", accepted[s], " of slot ",
          slots[s], " is outside 1..", W, " (the window's size)");
  }
  slot_ids_.assign(slots.begin(), slots.end());
  const std::vector<int32_t> counts(accepted.begin(), accepted.end());
  const int64_t S = int64_t(slots.size());
  const TensorView slot_view = host_view(slot_ids_.data(), DType::i32, {S});
  const TensorView count_view = host_view(counts.data(), DType::i32, {S});
  for (ReplayCache& cache : caches_) cache.commit(slot_view, count_view);
  if (is_standard()) {
    // The state after the last accepted token is the slot's intermediate row accepted - 1; a
    // one-token window already updated the state in place.
    const int64_t n = weights_->config.ssm_shape().state_elements(), W = runner_.max_window;
    for (size_t l = 0; l < states_.size(); ++l)
      for (size_t s = 0; s < slots.size(); ++s) {
        const size_t slot = size_t(slots[s]);
        if (in_place_[slot]) continue;
        states_[l]->copy_from(*inter_[l], (int64_t(slot) * W + accepted[s] - 1) * n,
                              int64_t(slot) * n, n);
      }
  }
  if (capture_layer_ >= 0) {
    io::TraceOp traced;
    traced.kind = io::OpKind::commit;
    traced.slots.assign(slots.begin(), slots.end());
    traced.accepted.assign(accepted.begin(), accepted.end());
    capture_.ops.push_back(std::move(traced));
  }
  // Conv history: the last K-1 inputs of (committed history ++ first `accepted` window inputs).
  const int64_t K1 = weights_->config.conv_kernel - 1, cd = weights_->config.conv_dim();
  std::vector<float> seq;  // [K-1 + accepted, conv_dim]
  for (auto& layer : conv_) {
    for (size_t s = 0; s < slots.size(); ++s) {
      ConvState& cs = layer[size_t(slots[s])];
      seq.resize(size_t((K1 + accepted[s]) * cd));
      std::copy(cs.committed.begin(), cs.committed.end(), seq.begin());
      std::copy(cs.pending.begin(), cs.pending.begin() + int64_t(accepted[s]) * cd,
                seq.begin() + K1 * cd);
      std::copy(seq.end() - K1 * cd, seq.end(), cs.committed.begin());
      cs.pending_count = 0;
    }
  }
  for (int slot : slots) pending_[size_t(slot)] = 0;
}

void Mamba2Model::capture_layer(int layer) {
  check(!is_standard(), "capture: traces record replay cache operations; the standard SSM path ",
        "has no cache to capture (use ssm = replay)");
  check(layer >= 0 && layer < int(caches_.size()), "capture: layer ", layer, " is outside 0..",
        caches_.size() - 1);
  const ReplayCache& cache = caches_[size_t(layer)];
  capture_ = io::Trace{};
  capture_.shape = cache.shape();
  capture_.cache = cache.config();
  capture_.params = layer_params_[size_t(layer)];
  capture_layer_ = layer;
}

ReplayCache& Mamba2Model::cache(int layer) {
  check(!is_standard(), "cache: the standard SSM path has no replay cache");
  check(layer >= 0 && layer < int(caches_.size()), "cache: layer ", layer, " is outside 0..",
        caches_.size() - 1);
  return caches_[size_t(layer)];
}

std::vector<float> Mamba2Model::standard_state(int layer, int slot) const {
  check(is_standard(), "standard_state: the runner uses the replay SSM path");
  check(layer >= 0 && layer < int(states_.size()), "standard_state: layer ", layer,
        " is outside 0..", states_.size() - 1);
  check_slot(slot, "standard_state");
  const int64_t n = weights_->config.ssm_shape().state_elements();
  const io::BackendBuffer& state = *states_[size_t(layer)];
  std::vector<uint8_t> raw(size_t(n) * dtype_size(state.view().dtype));
  state.copy_to_host(int64_t(slot) * n, n, raw.data());
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load_act(raw.data(), state.view().dtype, i);
  return out;
}

CacheStats Mamba2Model::stats() const {
  CacheStats total;
  for (const ReplayCache& cache : caches_) {
    const CacheStats s = cache.stats();
    total.flushes += s.flushes;
    total.saturated += s.saturated;
    total.checkpoint_writes += s.checkpoint_writes;
    total.nonfinite += s.nonfinite;
  }
  return total;
}

uint64_t Mamba2Model::flushes_per_layer() const {
  return caches_.empty() ? 0 : caches_.front().stats().flushes;
}

void Mamba2Model::forward(std::span<const int> slots, const int32_t* tokens, int64_t T, Op op,
                          bool all_logits, std::vector<float>& logits) {
  const ModelConfig& c = weights_->config;
  const int64_t S = int64_t(slots.size()), R = S * T;  // R rows: token t of slot s is s * T + t
  const int64_t d = c.hidden_size, V = c.vocab_size;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = tokens[s * T + t];
      check(id >= 0 && id < V, "token id ", id, " at position ", t, " of slot ", slots[size_t(s)],
            " is outside the vocabulary 0..", V - 1);
    }
  resid_.resize(size_t(R * d));  // [R, d]
  for (int64_t r = 0; r < R; ++r) weights_->embeddings.row_f32(tokens[r], resid_.data() + r * d);
  for (int l = 0; l < c.num_layers; ++l) layer_forward(l, slots, T, op);
  // Final norm and lm_head, only for the rows the caller needs: all R, or each slot's last.
  const int64_t rows = all_logits ? R : S;
  h_.resize(size_t(rows * d));  // [rows, d]
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = all_logits ? i : i * T + T - 1;
    rms_norm(resid_.data() + r * d, weights_->norm_f.data(), d, c.layer_norm_epsilon,
             h_.data() + i * d);
  }
  logits.resize(size_t(rows * V));  // [rows, V]
  matmul(h_.data(), rows, weights_->head(), nullptr, logits.data());
}

void Mamba2Model::layer_forward(int layer, std::span<const int> slots, int64_t T, Op op) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& w = weights_->layers[size_t(layer)];
  const int64_t d = c.hidden_size, H = c.num_heads, P = c.head_dim, N = c.state_size,
                G = c.n_groups, K = c.conv_kernel, K1 = K - 1;
  const int64_t d_inner = c.d_inner(), cd = c.conv_dim();
  const int64_t rows = w.in_proj.rows;
  const int64_t z_off = 2 * int64_t(weights_->d_mlp), xbc_off = z_off + d_inner,
                dt_off = xbc_off + cd;
  // All S slots' tokens are rows of one activation matrix: row s * T + t is token t of slots[s].
  const int64_t S = int64_t(slots.size()), R = S * T;

  // 1. Pre-norm and in_proj over all R rows (one GEMM: each row's result is independent of R).
  h_.resize(size_t(R * d));  // [R, d]
  for (int64_t r = 0; r < R; ++r)
    rms_norm(resid_.data() + r * d, w.norm.data(), d, c.layer_norm_epsilon, h_.data() + r * d);
  proj_.resize(size_t(R * rows));  // [R, in_proj rows]: z, xBC, dt
  matmul(h_.data(), R, w.in_proj, w.in_bias.empty() ? nullptr : w.in_bias.data(), proj_.data());

  // 2. Causal depthwise conv1d per slot over [K-1 history inputs ++ T new inputs], then SiLU.
  xbc_.resize(size_t(R * cd));         // [R, conv_dim]
  seq_.resize(size_t((K1 + T) * cd));  // [K-1 + T, conv_dim], one slot at a time
  for (int64_t s = 0; s < S; ++s) {
    ConvState& cs = conv_[size_t(layer)][size_t(slots[size_t(s)])];
    std::copy(cs.committed.begin(), cs.committed.end(), seq_.begin());
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(seq_.data() + (K1 + t) * cd, proj_.data() + (s * T + t) * rows + xbc_off,
                  size_t(cd) * sizeof(float));
    float* xbc = xbc_.data() + s * T * cd;  // [T, conv_dim] of this slot
#pragma omp parallel for schedule(static) if (T * cd > 16384)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t ch = 0; ch < cd; ++ch) {
        float acc = w.conv_b[size_t(ch)];
        for (int64_t i = 0; i < K; ++i)
          acc += w.conv_w[size_t(ch * K + i)] * seq_[size_t((t + i) * cd + ch)];
        xbc[t * cd + ch] = silu(acc);
      }
    }
    if (op == Op::prefill) {
      std::copy(seq_.end() - K1 * cd, seq_.end(), cs.committed.begin());
    } else {
      std::copy(seq_.begin() + K1 * cd, seq_.end(), cs.pending.begin());
      cs.pending_count = int(T);
    }
  }

  // 3. Split into x [R, H, P], B [R, G, N], C [R, G, N] and raw dt [R, H].
  x_.resize(size_t(R * d_inner));
  B_.resize(size_t(R * G * N));
  C_.resize(size_t(R * G * N));
  dt_.resize(size_t(R * H));
  for (int64_t r = 0; r < R; ++r) {
    const float* src = xbc_.data() + r * cd;
    std::memcpy(x_.data() + r * d_inner, src, size_t(d_inner) * sizeof(float));
    std::memcpy(B_.data() + r * G * N, src + d_inner, size_t(G * N) * sizeof(float));
    std::memcpy(C_.data() + r * G * N, src + d_inner + G * N, size_t(G * N) * sizeof(float));
    std::memcpy(dt_.data() + r * H, proj_.data() + r * rows + dt_off, size_t(H) * sizeof(float));
  }
  const void* xp = x_.data();
  const void* Bp = B_.data();
  const void* Cp = C_.data();
  if (runner_.activation_dtype == DType::bf16) {
    auto narrow = [](const std::vector<float>& in, std::vector<uint16_t>& out) {
      out.resize(in.size());
      for (size_t i = 0; i < in.size(); ++i) out[i] = f32_to_bf16(in[i]);
    };
    narrow(x_, x16_);
    narrow(B_, B16_);
    narrow(C_, C16_);
    xp = x16_.data();
    Bp = B16_.data();
    Cp = C16_.data();
  }

  // 4. The SSM through the replay cache, one call for all S slots (the checkpoint reads of a
  // batch are the traffic batching exists to share): y [S, T, H, P] fp32, D x included.
  const DType act = runner_.activation_dtype;
  y_.resize(size_t(R * d_inner));
  // On the CUDA backend the token tensors are staged to the device and y comes back; the GEMMs,
  // conv and norms stay on the CPU (docs/model.md).
  slot_ids_.assign(slots.begin(), slots.end());
  const TensorView slot_view = host_view(slot_ids_.data(), DType::i32, {S});  // [S]
  const BackendKind be = runner_.backend;
  const io::Staged xv(be, xp, act, {S, T, H, P});
  const io::Staged Bv(be, Bp, act, {S, T, G, N});
  const io::Staged Cv(be, Cp, act, {S, T, G, N});
  const io::Staged dtv(be, dt_.data(), DType::f32, {S, T, H});
  const io::Staged yv(be, y_.data(), DType::f32, {S, T, H, P});
  if (is_standard()) {
    if (op == Op::prefill) {
      // The prompt goes through in windows of up to max_window tokens, each as a fully accepted
      // verify (the intermediate buffer holds max_window states), so that a long prompt needs no
      // state buffer per token; within a window the state stays fp32 (standard_decode).
      const int64_t Wmax = runner_.max_window;
      for (int64_t t0 = 0; t0 < T; t0 += Wmax) {
        const int64_t n = std::min(Wmax, T - t0);
        auto part = [&](const io::Staged& v, int64_t row) {
          TensorView p = v.view();
          p.data = static_cast<uint8_t*>(p.data) + size_t(t0 * row) * dtype_size(p.dtype);
          p.shape[1] = n;
          return p;
        };
        standard_ssm(layer, slots, n, n == 1, part(xv, H * P), part(Bv, G * N), part(Cv, G * N),
                     part(dtv, H), part(yv, H * P));
        if (n > 1) {
          const int64_t e = c.ssm_shape().state_elements();
          const int64_t slot = slots.front();
          states_[size_t(layer)]->copy_from(*inter_[size_t(layer)], (slot * Wmax + n - 1) * e,
                                            slot * e, e);
        }
      }
    } else {
      // A one-token window can only be committed whole (commit(1)), so it updates the state in
      // place: plain decoding without intermediate-state traffic, as serving engines run it.
      standard_ssm(layer, slots, T, T == 1, xv.view(), Bv.view(), Cv.view(), dtv.view(), yv.view());
    }
  } else if (op == Op::prefill) {
    caches_[size_t(layer)].prefill(slot_view, xv.view(), Bv.view(), Cv.view(), dtv.view(),
                                   yv.view());
  } else {
    caches_[size_t(layer)].verify(slot_view, xv.view(), Bv.view(), Cv.view(), dtv.view(),
                                  yv.view());
  }
  if (layer == capture_layer_) {
    // The trace stores fp32 inputs; with bf16 activations they are the bf16-rounded values, which
    // the trace runner rounds again to the same bits.
    io::TraceOp traced;
    traced.kind = op == Op::prefill ? io::OpKind::prefill : io::OpKind::verify;
    traced.slots.assign(slots.begin(), slots.end());
    traced.window = int(T);
    traced.input = "in" + std::to_string(capture_.ops.size());
    io::TokenInputs& in = capture_.inputs[traced.input];
    auto widen = [&](const std::vector<float>& f32, const std::vector<uint16_t>& b16) {
      if (act != DType::bf16) return f32;
      std::vector<float> out(b16.size());
      for (size_t i = 0; i < b16.size(); ++i) out[i] = bf16_to_f32(b16[i]);
      return out;
    };
    in.x = widen(x_, x16_);
    in.B = widen(B_, B16_);
    in.C = widen(C_, C16_);
    in.dt = dt_;
    capture_.ops.push_back(std::move(traced));
  }
  yv.copy_to_host(y_.data());

  // 5. Gated RMSNorm: norm(y * silu(z)) over groups of d_inner / norm_groups, then out_proj.
  g_.resize(size_t(R * d_inner));  // [R, d_inner]
  const int64_t group = d_inner / c.norm_groups;
  for (int64_t r = 0; r < R; ++r) {
    const float* z = proj_.data() + r * rows + z_off;
    float* g = g_.data() + r * d_inner;
    for (int64_t i = 0; i < d_inner; ++i) g[i] = y_[size_t(r * d_inner + i)] * silu(z[i]);
    for (int64_t g0 = 0; g0 < d_inner; g0 += group)
      rms_norm(g + g0, w.gated_norm.data() + g0, group, c.layer_norm_epsilon, g + g0);
  }
  out_.resize(size_t(R * d));  // [R, d]
  matmul(g_.data(), R, w.out_proj, w.out_bias.empty() ? nullptr : w.out_bias.data(), out_.data());
  for (int64_t i = 0; i < R * d; ++i) resid_[size_t(i)] += out_[size_t(i)];
}

void Mamba2Model::standard_ssm(int layer, std::span<const int> slots, int64_t T, bool in_place,
                               const TensorView& x, const TensorView& B, const TensorView& C,
                               const TensorView& dt, const TensorView& y) {
  const ModelConfig& c = weights_->config;
  const int64_t S = int64_t(slots.size());
  StandardDecodeConfig sc;
  sc.state_dtype = runner_.standard_state_dtype;
  sc.seed = runner_.seed;
  sc.layer = layer;
  // The kernel reads the slot list on the device on CUDA (a no-op copy on the CPU).
  std::vector<int32_t> ids(slots.begin(), slots.end());
  const io::Staged slot_view(runner_.backend, ids.data(), DType::i32, {S});  // [S]
  for (int slot : slots) in_place_[size_t(slot)] = in_place ? 1 : 0;
  const int64_t e = c.ssm_shape().state_elements(), Wmax = runner_.max_window;
  const std::vector<int64_t> inter_shape{S, T, c.num_heads, c.head_dim, c.state_size};
  io::BackendBuffer& inter = *inter_[size_t(layer)];
  auto run = [&](const TensorView* iv) {
    standard_decode(runner_.backend, c.ssm_shape(), layer_params_[size_t(layer)], sc,
                    states_[size_t(layer)]->view(), slot_view.view(), x, B, C, dt, y, iv);
  };
  if (in_place) return run(nullptr);
  // Slot s keeps its window's states in rows s * max_window + t, so that verifying other slots
  // before its commit leaves them alone. The kernel writes batch row b's states contiguously
  // ([S, T, ...]): one slot writes its rows directly; a batch of several goes through a scratch
  // buffer and is copied to the slots' rows (an extra copy only batched verify pays).
  if (S == 1) {
    const TensorView iv = inter.slice(slots.front() * Wmax * e, inter_shape);
    return run(&iv);
  }
  if (!scratch_)
    scratch_ = std::make_unique<io::BackendBuffer>(
        runner_.backend, runner_.standard_state_dtype,
        std::vector<int64_t>{runner_.num_slots * Wmax, c.num_heads, c.head_dim, c.state_size});
  const TensorView iv = scratch_->slice(0, inter_shape);
  run(&iv);
  for (int64_t s = 0; s < S; ++s)
    inter.copy_from(*scratch_, s * T * e, slots[size_t(s)] * Wmax * e, T * e);
}

}  // namespace replayssm::model
