// Kernels of the CUDA replay cache (SPEC sections 3-5). A row (h, p) of N elements is held by
// N/8 consecutive lanes, 8 elements each (RowMap), and a thread keeps several rows so that their
// checkpoint loads are all in flight together.
//
// verify (window W, committed c, running sums L_k = delta_0 + ... + delta_k), launches in order:
//   validate_tokens  open, nothing pending, finite inputs; lists the entries that flush (c + W > L)
//   flush            S = fold(decode(rec), entries 0..c-1) in fp32, encoded; the window then
//                    starts at logical 0 of an empty ring (c' = 0)
//   verify           for j = 0..W-1 at logical position i = c' + j:
//                      y_j = exp(A L_i) * scale * sum_n R[p,n] C_j[n]   (R: read checkpoint values)
//                          + sum_{k <= i} delta_k exp(A (L_i - L_k)) (B_k . C_j) x_k[p] + D x_j[p]
//                    the window's ring x, delta and B, and (one block of each entry) the
//                    cursors
// Decode steps (W = 1) of small batches run as one launch of small_step_kernel, a block per
// (entry, head): each block validates its entry and folds its own head where the entry flushes.
// Speculative verifies (W > 1) of small batches run validate_tokens and small_verify_kernel, a
// block per (entry, head) that starts before the validation ends and folds its own head where the
// entry flushes. An explicit flush runs validate_slots (lists the slots to fold), flush and
// flush_finalize. In the 8/4-bit read modes R are code values (exact in bf16) and C_j is rounded to
// bf16 (BF16 readout rule); products are exact in fp32 and summed in fp32.
//
// The kernels live in one header per idea, included here in dependency order:
//   replay_common.cuh      parameters, errors, validation, shared-memory layouts, staging, fold
//   flush_kernel.cuh       flush_head and flush_kernel
//   flush_mma.cuh          flush_head_mma: separate-fp8's fold on the tensor cores, in registers
//   verify_staging.cuh     the verify's checkpoint stages, cp.async, ring appends, finish_verify
//   small_step_kernel.cuh  the decode step of a small batch in one launch
//   small_verify_kernel.cuh  the speculative verify of a small batch, after validate_tokens
//   verify_mma.cuh         the tensor-core readout (mma_tile, C fragments, W > 1 ring term)
//   verify_direct.cuh      the readout from registers at W <= 4 (VerifyVariant::chained_direct)
//   verify_kernel.cuh      verify_kernel and its variants
//   prefill_kernels.cuh    prefill_kernel and dense_kernel (state, import)
#pragma once

#include "cuda/flush_kernel.cuh"
#include "cuda/prefill_kernels.cuh"
#include "cuda/replay_common.cuh"
#include "cuda/small_step_kernel.cuh"
#include "cuda/small_verify_kernel.cuh"
#include "cuda/verify_direct.cuh"
#include "cuda/verify_kernel.cuh"
#include "cuda/verify_mma.cuh"
#include "cuda/verify_staging.cuh"
