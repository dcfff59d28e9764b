#include "model/mamba2.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/act.h"
#include "core/formats.h"
#include "io/staging.h"
#include "replayssm/error.h"
#include "replayssm/standard_decode.h"

namespace replayssm::model {

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
  ops_ = make_model_ops(*weights_, runner_);
  for (OpsBuffer* b : {&resid_, &h_, &proj_, &xbc_, &x_, &B_, &C_, &dt_, &y_, &g_, &out_, &logits_})
    b->bind(ops_.get());
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
  ops_->conv_reset(slot);
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
  ops_->conv_commit(slots, accepted);
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
  float* resid = resid_.of(R * d);  // [R, d]
  ops_->embed(tokens, R, weights_->embeddings, resid);
  for (int l = 0; l < c.num_layers; ++l) layer_forward(l, slots, T, op);
  // Final norm and lm_head, only for the rows the caller needs: all R, or each slot's last
  // (row s * T + T - 1, so rows T * d apart starting at row T - 1).
  const int64_t rows = all_logits ? R : S;
  float* h = h_.of(rows * d);  // [rows, d]
  ops_->rms_norm(all_logits ? resid : resid + (T - 1) * d, all_logits ? d : T * d, rows, d,
                 weights_->norm_f, c.layer_norm_epsilon, h);
  logits.resize(size_t(rows * V));  // [rows, V]
  // Host ops write the caller's vector directly; device ops go through logits_ and one copy.
  const bool host = ops_->memory() == MemoryKind::host;
  float* out = host ? logits.data() : logits_.of(rows * V);
  ops_->matmul(h, rows, weights_->head(), {}, out);
  if (!host) ops_->to_host(out, logits.size() * sizeof(float), logits.data());
}

void Mamba2Model::layer_forward(int layer, std::span<const int> slots, int64_t T, Op op) {
  const ModelConfig& c = weights_->config;
  const LayerWeights& w = weights_->layers[size_t(layer)];
  const int64_t d = c.hidden_size, H = c.num_heads, P = c.head_dim, N = c.state_size,
                G = c.n_groups;
  const int64_t d_inner = c.d_inner(), cd = c.conv_dim();
  const int64_t rows = w.in_proj.rows;
  const int64_t z_off = 2 * int64_t(weights_->d_mlp), xbc_off = z_off + d_inner,
                dt_off = xbc_off + cd;
  // All S slots' tokens are rows of one activation matrix: row s * T + t is token t of slots[s].
  const int64_t S = int64_t(slots.size()), R = S * T;
  const DType act = runner_.activation_dtype;
  const size_t act_size = dtype_size(act);
  float* resid = static_cast<float*>(resid_.data());  // [R, d]

  // 1. Pre-norm and in_proj over all R rows (one GEMM: each row's result is independent of R).
  float* h = h_.of(R * d);           // [R, d]
  float* proj = proj_.of(R * rows);  // [R, in_proj rows]: z, xBC, dt
  ops_->rms_norm(resid, d, R, d, w.norm, c.layer_norm_epsilon, h);
  ops_->matmul(h, R, w.in_proj, w.in_bias, proj);

  // 2. Causal depthwise conv1d per slot over [K-1 history inputs ++ T new inputs], then SiLU;
  // prefill moves the history on, verify keeps the window as the slots' pending inputs.
  float* xbc = xbc_.of(R * cd);  // [R, conv_dim]
  ops_->conv_silu(layer, slots, T, proj, rows, xbc_off, w.conv_w, w.conv_b, op == Op::prefill, xbc);

  // 3. Split into x [R, H, P], B [R, G, N], C [R, G, N] (activation dtype) and raw dt [R, H].
  void* x = x_.reserve(size_t(R * d_inner) * act_size);
  void* B = B_.reserve(size_t(R * G * N) * act_size);
  void* C = C_.reserve(size_t(R * G * N) * act_size);
  float* dt = dt_.of(R * H);
  ops_->split_xbc(xbc, proj, rows, dt_off, R, d_inner, G * N, H, act, x, B, C, dt);

  // 4. The SSM through the replay cache, one call for all S slots (the checkpoint reads of a
  // batch are the traffic batching exists to share): y [S, T, H, P] fp32, D x included. The
  // tensors are in the ops' memory, which is the cache backend's (host or device).
  float* y = y_.of(R * d_inner);
  slot_ids_.assign(slots.begin(), slots.end());
  const TensorView slot_view = host_view(slot_ids_.data(), DType::i32, {S});  // [S]
  const MemoryKind mem = ops_->memory();
  const TensorView xv{x, act, {S, T, H, P}, mem};
  const TensorView Bv{B, act, {S, T, G, N}, mem};
  const TensorView Cv{C, act, {S, T, G, N}, mem};
  const TensorView dtv{dt, DType::f32, {S, T, H}, mem};
  const TensorView yv{y, DType::f32, {S, T, H, P}, mem};
  if (is_standard()) {
    if (op == Op::prefill) {
      // The prompt goes through in windows of up to max_window tokens, each as a fully accepted
      // verify (the intermediate buffer holds max_window states), so that a long prompt needs no
      // state buffer per token; within a window the state stays fp32 (standard_decode).
      const int64_t Wmax = runner_.max_window;
      for (int64_t t0 = 0; t0 < T; t0 += Wmax) {
        const int64_t n = std::min(Wmax, T - t0);
        auto part = [&](const TensorView& v, int64_t row) {
          TensorView p = v;
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
      standard_ssm(layer, slots, T, T == 1, xv, Bv, Cv, dtv, yv);
    }
  } else if (op == Op::prefill) {
    caches_[size_t(layer)].prefill(slot_view, xv, Bv, Cv, dtv, yv);
  } else {
    caches_[size_t(layer)].verify(slot_view, xv, Bv, Cv, dtv, yv);
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
    auto fetch = [&](const void* src, int64_t n) {  // [n] activation dtype -> fp32 on the host
      std::vector<uint8_t> raw(size_t(n) * act_size);
      ops_->to_host(src, raw.size(), raw.data());
      std::vector<float> out(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load_act(raw.data(), act, i);
      return out;
    };
    in.x = fetch(x, R * d_inner);
    in.B = fetch(B, R * G * N);
    in.C = fetch(C, R * G * N);
    in.dt.resize(size_t(R * H));
    ops_->to_host(dt, in.dt.size() * sizeof(float), in.dt.data());
    capture_.ops.push_back(std::move(traced));
  }

  // 5. Gated RMSNorm: norm(y * silu(z)) over groups of d_inner / norm_groups, then out_proj and
  // the residual add.
  float* g = g_.of(R * d_inner);  // [R, d_inner]
  ops_->gated_rms_norm(y, proj + z_off, rows, R, d_inner, c.norm_groups, w.gated_norm,
                       c.layer_norm_epsilon, g);
  float* out = out_.of(R * d);  // [R, d]
  ops_->matmul(g, R, w.out_proj, w.out_bias, out);
  ops_->add(resid, out, R * d);
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
