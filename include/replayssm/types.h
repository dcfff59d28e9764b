// Basic vocabulary of the public API: element types, checkpoint modes, layer shapes and plain
// tensor views (pointer + shape + dtype + where the memory lives).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace replayssm {

// Element types of activations, outputs and index arrays (checkpoint codes are internal).
enum class DType : uint8_t { f32, bf16, f16, i32 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType parse_dtype(std::string_view name);  // "fp32"/"f32", "bf16", "fp16"/"f16", "i32"

// The checkpoint modes of SPEC section 5.
enum class Mode : uint8_t {
  fp32,
  bf16,
  fp16,
  fp16_sr,
  shared_fp8,
  shared_int8,
  separate_fp8,
  separate_nvfp4,
};
inline constexpr std::array<Mode, 8> kAllModes = {
    Mode::fp32,       Mode::bf16,        Mode::fp16,         Mode::fp16_sr,
    Mode::shared_fp8, Mode::shared_int8, Mode::separate_fp8, Mode::separate_nvfp4};
const char* mode_name(Mode mode);  // the SPEC name, e.g. "separate-fp8"
Mode parse_mode(std::string_view name);
// The seed's vocabulary: --checkpoint-mode separate|shared --state-dtype fp8|nvfp4|int8.
Mode parse_mode(std::string_view checkpoint_mode, std::string_view state_dtype);
// Mode predicates, constexpr so that kernels specialise on them at compile time.
constexpr bool is_separate(Mode mode) {  // two checkpoints: fp16 SR carrier + 8/4-bit read copy
  return mode == Mode::separate_fp8 || mode == Mode::separate_nvfp4;
}
constexpr bool is_shared_quantized(Mode mode) {  // one 8-bit checkpoint with a row scale
  return mode == Mode::shared_fp8 || mode == Mode::shared_int8;
}
constexpr bool uses_stochastic_rounding(Mode mode) {
  return mode == Mode::fp16_sr || is_separate(mode);
}
constexpr bool has_bf16_readout(Mode mode) {  // 8/4-bit read checkpoint: BF16 readout of SPEC 5
  return is_separate(mode) || is_shared_quantized(mode);
}

// Mamba-2 layer shape: H heads of P x N state, G groups sharing B and C.
struct SsmShape {
  int nheads = 0;   // H
  int headdim = 0;  // P
  int dstate = 0;   // N
  int ngroups = 0;  // G, divides H
  void validate() const;
  int64_t state_elements() const { return int64_t(nheads) * headdim * dstate; }
  int heads_per_group() const { return nheads / ngroups; }
  bool operator==(const SsmShape&) const = default;
};

// Per-head scalars of one layer, all of length H. delta = softplus(dt + dt_bias) clamped to
// [dt_min, dt_max]; the defaults clamp nothing.
struct LayerParams {
  std::vector<float> A_log;    // [H], A = -exp(A_log)
  std::vector<float> dt_bias;  // [H]
  std::vector<float> D;        // [H]
  float dt_min = 0.0f;
  float dt_max = std::numeric_limits<float>::infinity();
  void validate(const SsmShape& shape) const;
};

enum class MemoryKind : uint8_t { host, cuda };

// A non-owning view of a dense row-major tensor.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  MemoryKind memory = MemoryKind::host;

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  std::string describe() const;  // "bf16[4,8,128,64]"
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

inline TensorView host_view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView{const_cast<void*>(data), dtype, std::vector<int64_t>(shape), MemoryKind::host};
}

}  // namespace replayssm
