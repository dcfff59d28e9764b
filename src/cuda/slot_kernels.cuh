// The small kernels around the replay kernels: input validation (and the list of the slots an
// explicit flush folds), the cursor updates after an explicit flush / prefill, commit, and the
// cursor setters of open / release / fork. Not specialised per mode; included by cuda_backend.cu
// only.
#pragma once

#include "cuda/replay_kernels.cuh"

namespace replayssm::cuda {

// The chained verify's block order (ReplayParams::verify_order). In entry order the verify blocks
// of flushing entries, spread through the batch, held their SM slots idle through the flush: in
// the step timeline (H100, session 70, separate-fp8) 16 of the 264 verify blocks resident beside
// the W = 1 flush at batch 64, 16 rising to 80 at 256, and at W = 8 batch 64 200 of about 500 in
// the flush's last 20 us. So validate_tokens places every entry: those whose blocks wait for
// flush_kernel at the back, the others at the front, and a verify block's one load of its placed
// entry gives it the entry and the verdict (slot -1: the entry does not take part), where before
// it loaded the entry and the status words. No fence is needed: verify_kernel reads the order only
// after flush_kernel's wait for this grid. Decode steps of up to 64 entries keep entry order
// (verify_order_pays, ReplayParams::verify_in_place: validate_tokens writes each entry at its own
// index), which measured faster there: few verify blocks wait, and the placing's atomics come
// before the flush may start (the likely cause, not measured apart).
//
// Entry b's first block takes the place as soon as it has the cursors (order_place, overlapping
// its input scan); each of its kValidateSplit blocks then arrives once on the entry's word
// (order_arrive), adding 1, 256 if its share of the inputs or the slot is bad, and (first block)
// the place + 1 << 16; the last to arrive knows the verdict and the place and writes the entry.
inline constexpr uint32_t kOrderBack = 1u << 16;  // order_counts: front count | back count << 16
inline constexpr uint32_t kArriveBad = 1u << 8;   // validate_arrivals: count | bad << 8 | place

__device__ __forceinline__ int order_place(const ReplayParams& p, const SlotCursors& cur) {
  const bool waits = cur.live && cur.pending == 0 && verify_needs_flush(cur, p.tokens, p.L);
  const uint32_t before = atomicAdd(p.order_counts, waits ? kOrderBack : 1u);
  const int front = int(before & 0xffffu), back = int(before >> 16);
  // The last entry placed clears the counts for the next step (every other entry is placed).
  if (front + back == p.batch - 1) *p.order_counts = 0;
  return waits ? p.batch - 1 - back : front;
}

__device__ __forceinline__ void order_arrive(const ReplayParams& p, int b, int part, bool bad,
                                             int place, const SlotCursors& cur, int slot) {
  const uint32_t add = 1u | (bad ? kArriveBad : 0u) | (part == 0 ? uint32_t(place + 1) << 16 : 0u);
  const uint32_t before = atomicAdd(p.validate_arrivals + b, add);
  if ((before & 0xffu) != uint32_t(kValidateSplit - 1)) return;
  p.validate_arrivals[b] = 0;  // every block of the entry has arrived: for the next step
  const uint32_t all = before + add;
  const bool ok = (all & 0xff00u) == 0;
  p.verify_order[int(all >> 16) - 1] = ValidatedEntry{cur, b, ok ? slot : -1};
}

// Checks a slot before a token operation: open, nothing pending, finite inputs. Grid
// (B, kValidateSplit): each block scans a share of the entry's x, B, C, dt in 16-byte loads.
// The input scan needs only b, so its loads are issued first and overlap the slot -> cursors
// chain (the kernel is a few dependent loads long; at batch 64 W = 1 it took 4.5 us).
template <typename ActT>
__global__ void __launch_bounds__(256) validate_tokens_kernel(const ReplayParams p) {
  // Before small_verify_kernel (p.small_window) this grid is launched dependent on the kernel
  // before it, so that its launch overlaps that kernel (the commit of the previous step). Past
  // the wait every grid before this one is complete (each of ours waits for the one before it),
  // and small_verify_kernel may start: it reads what this kernel does not write before it waits
  // for this grid. Elsewhere a plain launch, whose wait returns at once.
  if (p.small_window) {
    wait_for_previous_grid();
    allow_dependent_launch();
  }
  const int b = blockIdx.x, part = blockIdx.y;
  int32_t* st = p.status + b * kValidateSplit;
  const bool local = entry_has_nonfinite<ActT>(p, b, int64_t(part) * blockDim.x,
                                               int64_t(kValidateSplit) * blockDim.x);
  const int slot = p.slots[b];
  const bool ordered = p.verify_order != nullptr && !p.verify_in_place && threadIdx.x == 0;
  if (slot < 0) {
    if (threadIdx.x == 0) st[part] = 1;  // padding: skipped, not an error
    if (ordered) order_arrive(p, b, part, true, part == 0 ? order_place(p, {}) : 0, {}, slot);
    return;
  }
  const SlotCursors cur = p.cursors[slot];
  const int place = ordered && part == 0 ? order_place(p, cur) : 0;
  if (!cur.live || cur.pending != 0) {
    if (threadIdx.x == 0) {
      st[part] = 1;
      if (part == 0)
        raise_error(p.error, cur.live ? kErrPending : kErrSlotClosed, slot, cur.pending);
    }
    if (ordered) order_arrive(p, b, part, true, place, cur, slot);
    return;
  }
  // flush_kernel checks the status words (every part's scan) before it uses the entry.
  if (part == 0 && threadIdx.x == 0) {
    const ValidatedEntry entry{cur, b, slot};
    if (p.verify_in_place) p.verify_order[b] = entry;
    if (p.list_flushes && verify_needs_flush(cur, p.tokens, p.L) && cur.committed > 0)
      p.flush_list[atomicAdd(p.flush_count, 1)] = entry;
  }
  const int bad = __syncthreads_or(local);
  if (threadIdx.x == 0) {
    st[part] = bad ? 1 : 0;
    if (bad) raise_error(p.error, kErrNonFiniteInput, slot, 0);
    if (ordered) order_arrive(p, b, part, bad, place, cur, slot);
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
  if (st == 0) {
    const SlotCursors cur = p.cursors[slot];
    if (cur.committed > 0) p.flush_list[atomicAdd(p.flush_count, 1)] = ValidatedEntry{cur, b, slot};
  }
}

// After an explicit flush: the cursors of every slot that flushed. One thread per batch entry.
__global__ void flush_finalize_kernel(const ReplayParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b == 0) *p.flush_count = 0;  // flush_kernel has completed: for the next operation's list
  if (b >= p.batch || !slot_ok(p, b)) return;
  const int slot = p.slots[b];
  SlotCursors cur = p.cursors[slot];
  if (cur.committed == 0) return;  // an empty ring writes nothing
  apply_flush(cur, p.L);
  p.cursors[slot] = cur;
  atomicAdd(&p.stats->flushes, 1ull);
  atomicAdd(&p.stats->checkpoint_writes, 1ull);
}

// commit: accepted [B] on the device; invalid counts raise an error and leave the slot as is.
__global__ void commit_kernel(SlotCursors* cursors, const int32_t* slots, const int32_t* accepted,
                              int batch, DeviceError* error) {
  // Launched dependent on the verify before it. The kernel after it may be scheduled at once:
  // every kernel of ours launched dependent waits for this grid before it reads anything this
  // step writes (validate_tokens before small_verify_kernel: the next step's, resident before
  // this one ends).
  allow_dependent_launch();
  wait_for_previous_grid();
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
