// The CUDA ops of the model runner (docs/model.md "GPU path"): weights uploaded once at
// construction, activations and the conv history in device memory, GEMMs through cuBLAS in fp32
// (no TF32), the small ops as kernels of cuda/model_ops.cuh. Host header: no CUDA types.
#pragma once

#include <memory>

#include "model/model_ops.h"

namespace replayssm::cuda {

// Throws replayssm::Error when no device is present or an upload fails.
std::unique_ptr<model::ModelOps> make_cuda_model_ops(const model::ModelWeights& weights,
                                                     const model::RunnerConfig& runner);

}  // namespace replayssm::cuda
