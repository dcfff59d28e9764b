// The weights of a Mamba2ForCausalLM checkpoint in host memory, loaded from model.safetensors or
// a sharded model.safetensors.index.json, checked name by name and shape by shape against the
// config. Large matrices keep their file dtype (bf16 or fp32; fp16 is widened to fp32); the small
// per-channel vectors are widened to fp32. See docs/model.md for the tensor names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace replayssm::model {

// A row-major matrix [rows, cols] in bf16 or fp32, the layout of torch.nn.Linear.weight
// ([out_features, in_features]) and nn.Embedding.weight ([num_embeddings, dim]).
struct Matrix {
  enum class Type : uint8_t { f32, bf16 };
  Type type = Type::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bytes;  // rows * cols elements of `type`

  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(bytes.data()); }
  void row_f32(int64_t r, float* out /*[cols]*/) const;  // one row widened to fp32
};

struct LayerWeights {
  std::vector<float> norm;        // [d_model] pre-norm (Mamba2RMSNorm)
  Matrix in_proj;                 // [2*d_mlp + d_inner + conv_dim + H, d_model]
  std::vector<float> in_bias;     // [in_proj.rows] or empty
  std::vector<float> conv_w;      // [conv_dim, K] depthwise taps, tap K-1 is the current token
  std::vector<float> conv_b;      // [conv_dim] (zeros without conv bias)
  std::vector<float> A_log;       // [H]
  std::vector<float> dt_bias;     // [H]
  std::vector<float> D;           // [H]
  std::vector<float> gated_norm;  // [d_inner] MambaRMSNormGated weight
  Matrix out_proj;                // [d_model, d_inner]
  std::vector<float> out_bias;    // [d_model] or empty
};

struct ModelWeights {
  ModelConfig config;
  int d_mlp = 0;      // leading in_proj rows HF discards (0 in every known checkpoint)
  Matrix embeddings;  // [V, d_model]
  Matrix lm_head;     // [V, d_model]; empty when tied to the embeddings
  bool tied = false;
  std::vector<float> norm_f;  // [d_model]
  std::vector<LayerWeights> layers;

  const Matrix& head() const { return tied ? embeddings : lm_head; }
  int64_t parameter_count() const;
};

// Reads config.json and the weights of a model directory. Throws replayssm::Error naming the
// directory and the first missing, mis-shaped or unreadable piece.
ModelWeights load_model(const std::string& dir);

}  // namespace replayssm::model
