// End-to-end decode measurements without a trained model (the seed's e2e benchmark): random
// weights in the shape of a preset, random prompt tokens, and a synthetic acceptance process in
// place of a drafter and a target distribution. Every step verifies a full window (1 + drafts
// random tokens) through every layer and the lm_head, exactly as real speculative decoding does,
// then commits a random accepted count with the requested mean.
#pragma once

#include <cstdint>

#include "model/mamba2.h"
#include "replayssm/presets.h"

namespace replayssm::model {

// A Mamba2ForCausalLM config with the preset's SSM shape: d_model = heads * headdim / 2
// (expand 2), conv 4, untied lm_head.
ModelConfig config_for_preset(const ModelPreset& preset, int vocab_size = 50288);

// Random bf16 weights with the scales of a freshly initialised model (A = -[1, 16], dt in
// [1e-3, 1e-1], D = 1, unit norms, in/out projections ~ 1/sqrt(fan_in)), from a counter-based
// hash so that it is fast, parallel and reproducible from `seed`.
ModelWeights random_weights(const ModelConfig& config, uint64_t seed);

struct SyntheticOptions {
  int prompt_tokens = 512;
  int new_tokens = 256;
  int window = 8;                     // 1 + drafts per verify; 1 is plain decoding
  double mean_accepted_length = 4.3;  // target E[tokens committed per verify], in [1, window]
  uint64_t seed = 1;
};

struct SyntheticResult {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int generated = 0;
  int steps = 0;
  uint64_t flushes = 0;           // per layer, during decoding
  double accept_probability = 0;  // per-draft acceptance of the geometric process
  double tokens_per_second() const { return decode_seconds > 0 ? generated / decode_seconds : 0; }
  double mean_accepted_length() const { return steps ? double(generated) / steps : 0; }
};

SyntheticResult run_synthetic(Mamba2Model& model, const SyntheticOptions& options);

}  // namespace replayssm::model
