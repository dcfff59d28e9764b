#include "replayssm/types.h"

#include <cmath>
#include <string>

#include "replayssm/error.h"

namespace replayssm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "fp16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::f16;
  if (name == "i32" || name == "int32") return DType::i32;
  fail("unknown dtype '", name, "' (expected fp32, bf16, fp16 or i32)");
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::fp32:
      return "fp32";
    case Mode::bf16:
      return "bf16";
    case Mode::fp16:
      return "fp16";
    case Mode::fp16_sr:
      return "fp16-sr";
    case Mode::shared_fp8:
      return "shared-fp8";
    case Mode::shared_int8:
      return "shared-int8";
    case Mode::separate_fp8:
      return "separate-fp8";
    case Mode::separate_nvfp4:
      return "separate-nvfp4";
  }
  return "?";
}

Mode parse_mode(std::string_view name) {
  for (Mode mode : kAllModes) {
    if (name == mode_name(mode)) return mode;
  }
  fail("unknown checkpoint mode '", name,
       "' (expected fp32, bf16, fp16, fp16-sr, shared-fp8, shared-int8, separate-fp8 or "
       "separate-nvfp4)");
}

Mode parse_mode(std::string_view checkpoint_mode, std::string_view state_dtype) {
  if (checkpoint_mode == "separate") {
    if (state_dtype == "fp8") return Mode::separate_fp8;
    if (state_dtype == "nvfp4") return Mode::separate_nvfp4;
    fail("--checkpoint-mode separate takes --state-dtype fp8 or nvfp4, not '", state_dtype, "'");
  }
  if (checkpoint_mode == "shared") {
    if (state_dtype == "fp8") return Mode::shared_fp8;
    if (state_dtype == "int8") return Mode::shared_int8;
    if (state_dtype == "fp32" || state_dtype == "bf16" || state_dtype == "fp16" ||
        state_dtype == "fp16-sr")
      return parse_mode(state_dtype);
    fail(
        "--checkpoint-mode shared takes --state-dtype fp8, int8, fp32, bf16, fp16 or fp16-sr, not "
        "'",
        state_dtype, "'");
  }
  fail("unknown --checkpoint-mode '", checkpoint_mode, "' (expected shared or separate)");
}

void SsmShape::validate() const {
  check(nheads > 0 && headdim > 0 && dstate > 0 && ngroups > 0,
        "shape must be positive, got H=", nheads, " P=", headdim, " N=", dstate, " G=", ngroups);
  check(nheads % ngroups == 0, "nheads ", nheads, " is not divisible by ngroups ", ngroups);
  check(dstate % 4 == 0, "dstate ", dstate, " must be a multiple of 4");
}

void LayerParams::validate(const SsmShape& shape) const {
  const size_t h = size_t(shape.nheads);
  check(A_log.size() == h, "A_log has ", A_log.size(), " entries, expected nheads = ", h);
  check(dt_bias.size() == h, "dt_bias has ", dt_bias.size(), " entries, expected nheads = ", h);
  check(D.size() == h, "D has ", D.size(), " entries, expected nheads = ", h);
  for (size_t i = 0; i < h; ++i) {
    check(std::isfinite(A_log[i]) && std::isfinite(dt_bias[i]) && std::isfinite(D[i]),
          "layer parameters of head ", i, " are not finite");
  }
  check(!std::isnan(dt_min) && !std::isnan(dt_max) && dt_min <= dt_max, "dt limits [", dt_min, ", ",
        dt_max, "] are not an interval");
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::describe() const {
  std::string text = dtype_name(dtype);
  text += "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ",";
    text += std::to_string(shape[i]);
  }
  text += "]";
  if (memory == MemoryKind::cuda) text += "@cuda";
  return text;
}

}  // namespace replayssm
