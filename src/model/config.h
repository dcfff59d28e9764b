// The configuration of a Hugging Face Mamba2ForCausalLM checkpoint (config.json), reduced to what
// the runner needs, with the derived sizes of the in_proj split. See docs/model.md.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "replayssm/types.h"

namespace replayssm::model {

struct ModelConfig {
  int vocab_size = 0;
  int hidden_size = 0;  // d_model
  int num_layers = 0;
  int state_size = 0;  // N (dstate)
  int num_heads = 0;   // H
  int head_dim = 0;    // P
  int n_groups = 1;    // G
  int conv_kernel = 4;
  float expand = 2.0f;
  float layer_norm_epsilon = 1e-5f;
  bool use_bias = false;      // in_proj / out_proj bias
  bool use_conv_bias = true;  // conv1d bias
  bool tie_word_embeddings = false;
  float time_step_min_clamp = 0.0f;  // time_step_limit[0]
  float time_step_max_clamp = std::numeric_limits<float>::infinity();
  // Groups of the gated RMSNorm. Hugging Face's MambaRMSNormGated normalises over the whole inner
  // width (1 group) whatever n_groups is; the original mamba_ssm Mamba2 block normalises per
  // group (n_groups). 1 unless config.json sets "replayssm_norm_groups" (docs/model.md).
  int norm_groups = 1;
  int eos_token_id = -1;  // -1: none
  int bos_token_id = -1;
  std::string tokenizer;  // "byte" for the built-in model ("replayssm_tokenizer"), else empty

  // Derived sizes.
  int d_inner() const { return num_heads * head_dim; }
  int conv_dim() const { return d_inner() + 2 * n_groups * state_size; }   // x, B, C
  int in_proj_size() const { return d_inner() + conv_dim() + num_heads; }  // z, xBC, dt
  SsmShape ssm_shape() const { return SsmShape{num_heads, head_dim, state_size, n_groups}; }

  void validate() const;  // throws replayssm::Error naming the first inconsistent field
};

// Parses config.json text. Bare Infinity / -Infinity / NaN (Python's json.dump of time_step_limit)
// are accepted outside strings. `what` names the source in errors.
ModelConfig parse_model_config(std::string_view json_text, std::string_view what);
ModelConfig read_model_config(const std::string& path);

}  // namespace replayssm::model
