// The small kernels around the replay kernels: input validation (which also lists the entries
// that flush), the cursor updates after verify / flush / prefill, commit, and the cursor setters
// of open / release / fork. Not specialised per mode; included by cuda_backend.cu only.
#pragma once

#include "cuda/replay_kernels.cuh"

namespace replayssm::cuda {

// True when one of the values packed in 16 bytes is NaN or Inf (exponent field all ones).
template <typename ActT>
__device__ __forceinline__ bool nonfinite16(const uint4 v, bool f16) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(ActT) == 4) {
      bad |= (w[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint32_t m = f16 ? 0x7c00u : 0x7f80u;
      bad |= (w[i] & m) == m || ((w[i] >> 16) & m) == m;
    }
  }
  return bad;
}

// Checks a slot before a token operation: open, nothing pending, finite inputs. Grid
// (B, kValidateSplit): each block scans a share of the entry's x, B, C, dt in 16-byte loads.
template <typename ActT>
__global__ void __launch_bounds__(256) validate_tokens_kernel(const ReplayParams p) {
  const int b = blockIdx.x, part = blockIdx.y;
  int32_t* st = p.status + b * kValidateSplit;
  const int slot = p.slots[b];
  if (slot < 0) {
    if (threadIdx.x == 0) st[part] = 1;  // padding: skipped, not an error
    return;
  }
  const SlotCursors cur = p.cursors[slot];
  if (!cur.live || cur.pending != 0) {
    if (threadIdx.x == 0) {
      st[part] = 1;
      if (part == 0)
        raise_error(p.error, cur.live ? kErrPending : kErrSlotClosed, slot, cur.pending);
    }
    return;
  }
  const int T = p.tokens;
  if (p.list_flushes && part == 0 && threadIdx.x == 0 && verify_needs_flush(cur, T, p.L) &&
      cur.committed > 0)
    p.flush_list[atomicAdd(p.flush_count, 1)] = b;  // flush_kernel checks the status first
  const int64_t nx = int64_t(T) * p.H * p.P, nb = int64_t(T) * p.G * p.N, nd = int64_t(T) * p.H;
  const int64_t ux = nx * int64_t(sizeof(ActT)) / 16, ub = nb * int64_t(sizeof(ActT)) / 16;
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) + b * nx);
  const uint4* Bm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.B) + b * nb);
  const uint4* Cm = reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.C) + b * nb);
  const float* dt = p.dt + b * nd;
  const int64_t total = ux + 2 * ub, stride = int64_t(kValidateSplit) * blockDim.x;
  bool local = false;
#pragma unroll 4
  for (int64_t u = int64_t(part) * blockDim.x + threadIdx.x; u < total; u += stride) {
    const uint4 v = u < ux ? x[u] : (u < ux + ub ? Bm[u - ux] : Cm[u - ux - ub]);
    local |= nonfinite16<ActT>(v, p.act_f16);
  }
  for (int64_t i = int64_t(part) * blockDim.x + threadIdx.x; i < nd; i += stride)
    local |= !isfinite(dt[i]);
  const int bad = __syncthreads_or(local);
  if (threadIdx.x == 0) {
    st[part] = bad ? 1 : 0;
    if (bad) raise_error(p.error, kErrNonFiniteInput, slot, 0);
  }
}

// Validates every slot of a flush (open) into status and lists those with committed entries.
__global__ void validate_slots_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch) return;
  const int slot = p.slots[b];
  int st = 0;
  if (slot < 0) {
    st = 1;
  } else if (!p.cursors[slot].live) {
    st = 1;
    raise_error(p.error, kErrSlotClosed, slot, 0);
  }
  for (int i = 0; i < kValidateSplit; ++i) p.status[b * kValidateSplit + i] = st;
  if (st == 0 && p.cursors[slot].committed > 0) p.flush_list[atomicAdd(p.flush_count, 1)] = b;
}

// After an explicit flush (W = 0), or a verify whose kernel does not update the cursors itself:
// ring B of the window and the cursors. One block per b.
template <typename ActT>
__global__ void verify_finalize_kernel(const ReplayParams p) {
  const int b = blockIdx.x;
  if (!slot_ok(p, b)) return;
  const int slot = p.slots[b];
  SlotCursors cur = p.cursors[slot];
  const int W = p.tokens, L = p.L;
  const bool flush =
      (p.force_flush && cur.committed > 0) || (W > 0 && verify_needs_flush(cur, W, L));
  SlotCursors after = cur;
  if (flush) apply_flush(after, L);
  const SlotSections sec = slot_sections(p.geo, slot);
  // 16-byte vectors (G * N * sizeof(ActT) is a multiple of 16), all of a thread's in flight.
  const int per_row = p.G * p.N * int(sizeof(ActT)) / 16;
#pragma unroll 4
  for (int u = threadIdx.x; u < W * per_row; u += blockDim.x) {
    const int j = u / per_row, i = u - j * per_row;
    const int phys = ring_index(after, after.committed + j, L);
    reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_B))[int64_t(phys) * per_row + i] =
        reinterpret_cast<const uint4*>(
            static_cast<const ActT*>(p.B))[(int64_t(b) * W + j) * per_row + i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (W > 0) apply_verify(after, W);
    p.cursors[slot] = after;
    if (flush) {
      atomicAdd(&p.stats->flushes, 1ull);
      atomicAdd(&p.stats->checkpoint_writes, 1ull);
    }
  }
}

// commit: accepted [B] on the device; invalid counts raise an error and leave the slot as is.
__global__ void commit_kernel(SlotCursors* cursors, const int32_t* slots, const int32_t* accepted,
                              int batch, DeviceError* error) {
  wait_for_previous_grid();  // launched dependent on the verify before it
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const int slot = slots[b];
  if (slot < 0) return;
  SlotCursors cur = cursors[slot];
  if (!cur.live) {
    raise_error(error, kErrSlotClosed, slot, 0);
    return;
  }
  const int k = accepted[b];
  if (!commit_is_valid(cur, k)) {
    raise_error(error, kErrCommitRange, slot, k);
    return;
  }
  apply_commit(cur, k);
  cursors[slot] = cur;
}

// After prefill: the committed entries are folded and the checkpoint written.
__global__ void prefill_finalize_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.batch || !slot_ok(p, b)) return;
  const int slot = p.slots[b];
  SlotCursors cur = p.cursors[slot];
  cur.origin = (cur.origin + cur.committed) & (p.L - 1);
  cur.committed = 0;
  cur.pending = 0;
  cur.flush_index += 1;
  p.cursors[slot] = cur;
  atomicAdd(&p.stats->checkpoint_writes, 1ull);
}

// Sets one slot's cursors (open, release, fork) without a host round trip.
__global__ void set_cursors_kernel(SlotCursors* cursors, int slot, SlotCursors value) {
  cursors[slot] = value;
}

// fork: dst's cursors = src's with a new request id.
__global__ void fork_cursors_kernel(SlotCursors* cursors, int src, int dst, uint64_t request_id) {
  SlotCursors c = cursors[src];
  c.request_id = request_id;
  c.pending = 0;
  cursors[dst] = c;
}

}  // namespace replayssm::cuda
