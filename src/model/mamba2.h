// The Mamba-2 language model on the CPU, one ReplayCache per layer (SPEC sections 3-5).
//
// Per layer and token (Hugging Face Mamba2Block / Mamba2Mixer, docs/model.md):
//   h = RMSNorm(residual)                       [d_model]
//   [d_mlp, d_mlp, z, xBC, dt] = in_proj(h)     z [d_inner], xBC [conv_dim], dt [H]
//   xBC = SiLU(causal depthwise conv1d(xBC))    kernel K over this and the K-1 previous tokens
//   x, B, C = split(xBC)                        x [H, P], B [G, N], C [G, N]
//   y = SSM(x, B, C, dt) through the cache      [H, P] (softplus(dt + dt_bias), D x inside)
//   residual += out_proj(GatedRMSNorm(y * SiLU(z)))
// then logits = lm_head(RMSNorm_f(residual)).
//
// Speculative decoding: verify(W tokens) runs the window through every layer together
// (ReplayCache::verify), commit(k) keeps the first k. The conv1d has its own rolling state: the
// last K-1 committed inputs per slot plus the inputs of the pending window, so commit advances it
// by exactly the accepted tokens and rejected drafts leave no trace.
//
// Backends: every op of the layer goes through a ModelOps (model/model_ops.h) chosen by
// RunnerConfig::backend, so the layer sequence below exists once: on the CPU the ops are the
// reference loops; on CUDA weights, activations and the conv history live on the device and the
// GEMMs run through cuBLAS (docs/model.md "GPU path").
//
// SSM path (RunnerConfig::ssm): `replay` runs each layer's SSM through a ReplayCache; `standard`
// is the baseline serving engines run today (include/replayssm/standard_decode.h): every layer
// keeps a dense state [H, P, N] per slot, verify(W) applies the W tokens with standard_decode into
// W intermediate states (the state itself unchanged) and commit(k) copies intermediate k-1 into
// the state. Everything else (GEMMs, conv history, norms) is the same code for both paths.
//
// Batching: verify_batch runs the W-token windows of S slots through every layer in one pass
// (GEMMs over S * W rows, one ReplayCache::verify per layer for all S slots); verify and commit
// are its one-slot cases.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/staging.h"
#include "io/trace.h"
#include "model/model_ops.h"
#include "model/weights.h"
#include "replayssm/cache.h"

namespace replayssm::model {

enum class SsmPath { replay, standard };

struct RunnerConfig {
  SsmPath ssm = SsmPath::replay;
  // The standard path's state dtype: f32 or bf16 (rounded to nearest after every state write).
  DType standard_state_dtype = DType::f32;
  Mode mode = Mode::fp32;  // the replay path's checkpoint mode
  int history = 16;        // ring capacity per layer
  int max_window = 8;      // 1 + the most drafts per verify
  int num_slots = 1;
  // x, B, C as stored in the ring. fp32 keeps the fp32 mode exact; the SPEC default is bf16.
  DType activation_dtype = DType::f32;
  uint64_t seed = 0;  // stochastic rounding (Philox key)
  BackendKind backend = BackendKind::cpu;
  int prefill_chunk = 256;  // prompt tokens per prefill call (bounds the activation memory)
  // OpenMP threads (omp_set_num_threads, process-wide); 0 leaves the OpenMP default. Small
  // models decode fastest on one thread: a decode step is shorter than a thread team's wake-up.
  int threads = 0;
};

class Mamba2Model {
 public:
  Mamba2Model(std::shared_ptr<const ModelWeights> weights, const RunnerConfig& config);

  const ModelConfig& config() const { return weights_->config; }
  const RunnerConfig& runner_config() const { return runner_; }
  const ModelWeights& weights() const { return *weights_; }
  int vocab_size() const { return weights_->config.vocab_size; }

  int open(uint64_t request_id);  // a fresh slot: zero SSM state, zero conv history
  void release(int slot);

  // Runs the tokens through every layer (cache prefill: FP32 recurrence, checkpoint written,
  // ring empty). logits: [T, V] when all_logits, else [1, V] for the last token.
  void prefill(int slot, std::span<const int32_t> tokens, std::vector<float>& logits,
               bool all_logits = false);
  // Runs W = tokens.size() tokens (1 <= W <= max_window) as pending entries; logits [W, V].
  // Row j is the next-token distribution after tokens[0..j]. verify_batch with one slot.
  void verify(int slot, std::span<const int32_t> tokens, std::vector<float>& logits);
  // Keeps the first `accepted` tokens of the last verify (1..W) in every layer.
  void commit(int slot, int accepted);

  // Runs a window of W tokens for each of S distinct open slots without a pending window
  // (1 <= W <= max_window) in one pass through every layer. tokens [S, W] row-major; logits
  // [S, W, V]: row (s, j) is slot s's next-token distribution after tokens (s, 0..j). Each slot's
  // logits are bit-identical to a verify of that slot alone (matmul.h; the cache works per slot).
  // Every input is checked before anything changes.
  void verify_batch(std::span<const int> slots /*[S]*/, std::span<const int32_t> tokens /*[S, W]*/,
                    int W, std::vector<float>& logits /*[S, W, V]*/);
  // Keeps the first accepted[s] tokens (1..W of that slot's pending window) of each slot.
  void commit_batch(std::span<const int> slots /*[S]*/, std::span<const int> accepted /*[S]*/);

  // Records every cache operation of `layer` (prefill, verify, commit) with its inputs as a trace
  // (docs/trace-format.md), so the layer's real SSM input stream can be replayed in any mode or
  // backend (`replayssm trace run`) or studied (`replayssm drift --trace`). Call before decoding.
  void capture_layer(int layer);
  const io::Trace& captured() const { return capture_; }

  CacheStats stats() const;            // summed over layers (zero on the standard path)
  uint64_t flushes_per_layer() const;  // layer 0's flush count (0 on the standard path)
  ReplayCache& cache(int layer);       // the replay path's cache of `layer`
  // The standard path's committed state of (layer, slot) as fp32, [H, P, N].
  std::vector<float> standard_state(int layer, int slot) const;
  // The conv history of (layer, slot), copied to the host.
  ConvState conv_state(int layer, int slot) const { return ops_->conv_state(layer, slot); }

 private:
  enum class Op { prefill, verify };
  // T tokens of each of S slots through every layer; row s * T + t of every activation is token t
  // of slots[s]. logits: [S * T, V] when all_logits, else [S, V] (each slot's last token).
  void forward(std::span<const int> slots /*[S]*/, const int32_t* tokens /*[S, T]*/, int64_t T,
               Op op, bool all_logits, std::vector<float>& logits);
  void layer_forward(int layer, std::span<const int> slots /*[S]*/, int64_t T, Op op);
  void check_slot(int slot, const char* op) const;
  void check_batch(std::span<const int> slots, const char* op) const;  // open, distinct
  bool is_standard() const { return runner_.ssm == SsmPath::standard; }
  // The standard path's SSM of one layer for T tokens of S slots (views [S, T, ...]): in place
  // when `in_place` (T == 1), else the states after each token go to intermediate rows s * T + t.
  void standard_ssm(int layer, std::span<const int> slots, int64_t T, bool in_place,
                    const TensorView& x, const TensorView& B, const TensorView& C,
                    const TensorView& dt, const TensorView& y);

  std::shared_ptr<const ModelWeights> weights_;
  RunnerConfig runner_;
  std::vector<ReplayCache> caches_;        // [layers]
  std::vector<LayerParams> layer_params_;  // [layers]
  std::vector<int> pending_;               // [slots] W of the uncommitted verify, or 0
  // Standard path: states_[l] [slots, H, P, N]; inter_[l] [slots * max_window, H, P, N] holding
  // the states after each token of slot s's verify window in rows s * max_window + t; in_place_[s]
  // when its window (W = 1) updated the state directly. scratch_: batched verify's kernel output.
  std::vector<std::unique_ptr<io::BackendBuffer>> states_, inter_;
  std::unique_ptr<io::BackendBuffer> scratch_;
  std::vector<uint8_t> in_place_;  // [slots]
  std::vector<uint8_t> open_;      // [slots] the standard path's open slots
  int capture_layer_ = -1;
  io::Trace capture_;

  // The per-op implementations of runner_.backend (conv history included), and the activation
  // workspace in their memory, sized for the largest batch seen (declared after ops_, so freed
  // before it). resid [R, d], h [R, d], proj [R, in_proj rows], xbc [R, conv_dim], x [R, H, P],
  // B and C [R, G, N] (activation dtype), dt [R, H], y [R, H, P], g [R, d_inner], out [R, d],
  // logits [R, V] (the CUDA path's logits before the copy to the host).
  std::unique_ptr<ModelOps> ops_;
  OpsBuffer resid_, h_, proj_, xbc_, x_, B_, C_, dt_, y_, g_, out_, logits_;
  std::vector<int32_t> slot_ids_;  // [S]: the cache's i32 slot list
};

}  // namespace replayssm::model
