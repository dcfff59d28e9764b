// The CPU GEMM of the model runner: Y[M, N] = X[M, K] * W[N, K]^T (+ bias), W in the layout of
// torch.nn.Linear.weight, bf16 or fp32, computed in fp32.
//
// Every output element is one dot product summed in a fixed order (16 interleaved partial sums,
// then a fixed reduction tree) that does not depend on M or on the thread count. So a token's
// result is bit-identical whether it goes through a 1-token decode, an 8-token verify window or
// a prefill chunk, which is what lets speculative greedy decoding reproduce plain greedy decoding
// exactly in the fp32 mode.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace replayssm::model {

void matmul(const float* X /*[M, K]*/, int64_t M, const Matrix& W /*[N, K]*/,
            const float* bias /*[N] or null*/, float* Y /*[M, N]*/);

}  // namespace replayssm::model
