// small_step_kernel: a whole decode step (W = 1) of a small batch in one launch, the checkpoint
// read straight into registers. Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/flush_kernel.cuh"
#include "cuda/replay_common.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- the step of a small batch ------------------------------------------------------------------
// One block per (batch entry, head): at batch 1 to 4 a step moves 0.5-2 MB, a fraction of a
// microsecond at the copy bandwidth, and its time is the chain of dependent global round trips
// (600-800 cycles each on the H200) and barriers. So the block issues everything as soon as its
// address is known:
//
//   round trip 1  slot id; this head's C, B, dt, x (nothing converted or tested yet, so the
//                 thread goes on as soon as the slot id is in)
//   round trip 2  the slot's cursors; the head's read-checkpoint rows (RowMap, into registers);
//                 B and delta at every ring position, x into shared memory (RingXStage) (the
//                 cursors then say which positions hold committed entries and in which order:
//                 loading the L positions instead of the c entries takes a round trip out of
//                 the step)
//   then          the block's own inputs tested; without a fold the block's arrival
//                 (early_arrival, carrying its verdict), its round trip beside the rest;
//                 B_k . C, the weights, the readout, y; the last block to arrive advances the
//                 cursors or, if any block of the entry found a NaN or Inf, refuses the step
//                 (after a fold: finish_verify)
//
// Every byte a block brings through the L2 counts at batch 1, where the blocks' two round trips
// are most of a step (H200, session 31: the ring's x was 16 KB of 32-byte sectors per block, and
// each block copied the whole entry's inputs, 20 KB, for a validation scan: 36 of the block's
// 50 KB, counted from the access pattern).
//
// (H200, session 27, bench/results/2026-12-02-h200-session27.md: batch 1 separate-fp8 9.7 us in
// verify_kernel's former one-launch variant, 8.5 with the ring a third round trip, 7.2 since;
// phase clocks of block 0: bench/diagnostics/small-step-phase-clock.patch.)
//
// with, at logical position c (c committed entries; L_k = delta_0 + ... + delta_k),
//   y[p] = exp(A L_c) scale_p sum_n R[p,n] Cr[n] + sum_{k <= c} w_k x_k[p]
//   w_k  = delta_k exp(A (L_c - L_k)) (B_k . C)  (+ D for k = c)
// (Cr = C rounded to bf16 in the 8/4-bit read modes, SPEC 5). A lane of a row holds 8 columns of
// R and Cr and the entries k = lane_in_row + t N/8 of the ring term, so one reduction per row
// gives y. Every block checks its slot as validate_tokens would and its own inputs before it
// writes anything; where the entry must flush (c = L) it checks the whole entry, folds its own
// head (flush_head) and reads the new checkpoint, and the entry's last block then appends ring B
// (finish_verify).
//
// Two block sizes (kThreads, small_step_threads): 256 threads where the (entry, head) blocks fit
// one wave at two blocks per SM (nemotron-h-8b at batch 1 and 2), else 128 at four. A thread of
// the larger block takes half the rows, whose decode, readout and reduction are the longest chain
// after the round trips, and folds half as many elements (H200, session 30: batch 1 -10 to -15%
// in every mode; 512 threads at one block per SM gained less, 2-10%, and lost 4% for
// mamba2-2.7b's separate-fp8).
inline constexpr int kSmallStepThreads = 128;
inline constexpr int kSmallStepWideThreads = 256;
// Rows per thread, all of them in flight at once (nemotron-h-8b: the head's 64 rows in one group
// of 8 rows x 8 passes, or 4 x 16 in the wide block); fp32 codes are 8 registers per row chunk.
constexpr int small_step_rows(Mode mode, int threads) {
  return threads == kSmallStepWideThreads || mode == Mode::fp32 ? 4 : 8;
}
constexpr int small_step_min_blocks(int threads) {
  return threads == kSmallStepWideThreads ? 2 : 4;
}
// Rows per thread of the fold (flush_head) where the entry flushes: 4 in the wide block of the
// modes without stochastic rounding (nemotron-h-8b: the head's 64 rows in one group of 4 rows x 16
// passes), else 2. H200, session 30, call 5, batch 1 / 2 with 4 rows in every mode: fp32 -3.9 /
// -5.6%, bf16 -4.7 / -4.2%, shared-fp8 -1.7 / -3.5%, but fp16-sr +9.3 / +6.7%, separate-fp8
// +7.1 / +4.2%, separate-nvfp4 +7.4 / +3.4% (not analysed further; flush_kernel keeps 2 rows for
// fp16-sr and separate-nvfp4 too). fp32 takes 4 in the 128-thread block as well (session 35,
// call 6, batches 3-8 with 4 rows against 2: fp32 -2 to -7% at every batch of nemotron-h-8b,
// mamba2-2.7b and nemotron3-nano-4b; bf16 and shared-fp8 between -5 and +3.5%, the
// stochastic-rounding modes up to +6.3%; bench/results/2026-12-04-h200-session35.md).
constexpr int small_step_fold_rows(Mode mode, int threads) {
  const bool wide = threads == kSmallStepWideThreads;
  return mode == Mode::fp32 || (wide && !uses_stochastic_rounding(mode)) ? 4 : 2;
}
// Dot products B_k . C whose B loads go out together (nemotron-h-8b: 8 entries per pass at 128
// threads, 16 at 256, so history 16 takes one batch).
inline constexpr int kSmallStepDots = 2;

// Shared memory besides the fold's (which it overlays: the fold is over before these are set).
struct SmallStepSmem {
  float* delta;  // [L] delta_k of the entries 0..c
  float* dot;    // [L] B_k . C
  float* w;      // [L] w_k
  float* dec;    // [1] exp(A L_c)
  __host__ __device__ static size_t bytes(int L) { return sizeof(float) * (3 * size_t(L) + 1); }
  __device__ static SmallStepSmem carve(float* base, int L) {
    return {base, base + L, base + 2 * L, base + 3 * L};
  }
};

// The head's ring x at every position, copied in 16-byte vectors (ring_x_stage): [L][P] with a
// position stride of P + 16 bytes, so that the 16 positions a row's lanes read fall in different
// banks but for pairs. A thread's ring term needs one row at several positions, 2-4 bytes from
// rows H P elements apart: loaded from global memory one element at a time, each took a 32-byte
// sector, 16 KB per block at nemotron-h-8b (its 2 KB of x and the entry's other inputs came to
// about 50 KB per SM through the L2 in a step's two round trips).
struct RingXStage {
  // Elements between positions (act_size: bytes per activation).
  __host__ __device__ static int stride(int P, int act_size) { return P + 16 / act_size; }
  // Byte offset in the kernel's shared memory: after SmallStepSmem, which is live beside it.
  __host__ __device__ static size_t offset(int L) {
    return (SmallStepSmem::bytes(L) + 15) / 16 * 16;
  }
  // small_step_kernel's shared memory besides the fold's.
  __host__ __device__ static size_t end(int L, int P, int act_size) {
    return offset(L) + size_t(act_size) * L * stride(P, act_size);
  }
};

// Grid ((H / G) << p.step_split_log2, G, batch) of kThreads: block (x, g, b) takes entry b's
// head g H / G + (x >> p.step_split_log2), all its rows or (kSplit) one split of them.
// kEntries: ring entries per lane of a row (history <= kEntries N / 8).
// kSplit: the head's rows are split over 2^p.step_split_log2 blocks (small_step_split_log2;
// 256-thread blocks only); without it the kernel folds the whole head in the fold's own form,
// whose loop keeps fewer registers (the row-chunk form made nemotron-h-8b's 16/32-bit modes 4-10%
// slower at batch 1, H200 session 31, call 3).
// kRows: rows per thread (small_step_rows, or 5 where the head is 5 row passes of the wide
// block: small_step_five_rows).
template <Mode kMode, typename ActT, int kEntries, int kThreads, bool kSplit = false,
          int kRows = small_step_rows(kMode, kThreads)>
__global__ void __launch_bounds__(kThreads, small_step_min_blocks(kThreads))
    small_step_kernel(const ReplayParams p) {
  static_assert(kRows != 5 || (kThreads == kSmallStepWideThreads && !kSplit),
                "5 rows: the wide block's whole head in one row group");
  const int H = p.H, P = p.P, N = p.N, G = p.G, L = p.L;
  // Block x of group g: head g H / G + x / splits, rows [p0, p1) (p.step_split_log2).
  const int split_log2 = kSplit ? p.step_split_log2 : 0;
  const int split = blockIdx.x & ((1 << split_log2) - 1);
  const int b = blockIdx.z, g = blockIdx.y, h = g * (H / G) + (blockIdx.x >> split_log2);
  const int p0 = split * (P >> split_log2), p1 = p0 + (P >> split_log2);
  const int blocks_per_entry = H << split_log2;
  HeadScalars head = HeadScalars::load(p.head, h);  // issued with round trip 1
  // Launched dependent on the step before it; the next kernel's blocks may be scheduled at once
  // (they wait in wait_for_previous_grid for this grid to complete), which takes their launch
  // out of a small batch's step.
  wait_for_previous_grid();
  allow_dependent_launch();
  extern __shared__ float4 smem_raw[];
  float* const smem = reinterpret_cast<float*>(smem_raw);
  const bool f16 = p.act_f16;
  const RowMap rm(p.lanes_per_row, kRows);
  const int lanes = rm.lanes, lane = rm.lane_in_row;

  // ---- round trip 1: what depends on (b, h) only
  const int slot = p.slots[b];
  const ActT* const x_in = static_cast<const ActT*>(p.x) + (int64_t(b) * H + h) * P;  // [P]
  const ActT* const B_in = static_cast<const ActT*>(p.B) + (int64_t(b) * G + g) * N;  // [N]
  constexpr int kVec = 16 / sizeof(ActT);
  const int x_vectors = (p1 - p0) / kVec;                                  // of this block's rows
  const uint4* const x_block = reinterpret_cast<const uint4*>(x_in + p0);  // [x_vectors]
  Act8<ActT> c_window;  // columns n0.. of C, converted once the slot's loads are out
  Act8<ActT> b_window;  // and of the window's B
  float dt_window;
  uint4 x_vector;  // the window's x row of this head, in 16-byte vectors, for its ring append
  // Loaded again after a fold, so that none of it is live across the fold's registers.
  auto load_window = [&]() {
    c_window.load(static_cast<const ActT*>(p.C) + (int64_t(b) * G + g) * N + rm.n0);
    b_window.load(B_in + rm.n0);
    dt_window = p.dt[int64_t(b) * H + h];
    x_vector = int(threadIdx.x) < x_vectors ? x_block[threadIdx.x] : make_uint4(0u, 0u, 0u, 0u);
  };
  // Nothing converts or tests the window's loads before the slot's loads are out: that would
  // hold the thread until they arrive.
  load_window();
  if (slot < 0) return;  // padding

  // ---- round trip 2: everything at the slot's addresses: the cursors, this head's read
  // checkpoint rows and every ring position (which of them hold committed entries, and in which
  // logical order, is known only when the cursors arrive; loading the L positions instead of the
  // c entries saves the round trip that would wait for them)
  RawChunk raw[kRows];
  int prow[kRows];
  ActT ring_x[kRows][kEntries];           // x at position lane + t N/8 of this thread's rows
  Act8<ActT> ring_b[kSmallStepDots];      // B at positions threadIdx.x / (N/8) + q rows_per_pass
  float ring_delta = 0.f;                 // delta_h at position threadIdx.x (< L)
  const int per_pass = rm.rows_per_pass;  // B rows (positions) per pass of the block
  const int first = int(threadIdx.x) / lanes;
  // The head's ring x at every position into RingXStage, 16 bytes per copy.
  constexpr int kAct = sizeof(ActT);
  ActT* const x_stage =
      reinterpret_cast<ActT*>(reinterpret_cast<char*>(smem_raw) + RingXStage::offset(L));
  const int x_stride = RingXStage::stride(P, kAct);
  auto stage_ring_x = [&](const SlotSections& s) {
    const ActT* const src = static_cast<const ActT*>(s.ring_x) + int64_t(h) * P + p0;
    for (int u = threadIdx.x; u < L * x_vectors; u += blockDim.x) {
      const int pos = u / x_vectors, i = u - pos * x_vectors;
      cp_async16(reinterpret_cast<uint4*>(x_stage + pos * x_stride) + i,
                 reinterpret_cast<const uint4*>(src + int64_t(pos) * H * P) + i);
    }
    cp_async_commit();
  };
  // Ring x of the row group at `base` from the stage (positions past L read position 0: never
  // used).
  auto load_ring_x = [&](int base) {
#pragma unroll
    for (int t = 0; t < kEntries; ++t) {
      const int pos = lane + t * lanes < L ? lane + t * lanes : 0;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        ring_x[r][t] = x_stage[pos * x_stride + min(rm.row(base, r), P - 1) - p0];
    }
  };
  // Ring B of the positions k0 + first + q rows_per_pass.
  auto load_ring_b = [&](const SlotSections& s, int k0) {
#pragma unroll
    for (int q = 0; q < kSmallStepDots; ++q) {
      const int pos = k0 + first + q * per_pass;
      ring_b[q].load(static_cast<const ActT*>(s.ring_B) + (int64_t(pos < L ? pos : 0) * G + g) * N +
                     rm.n0);
    }
  };
  {
    const SlotSections s = slot_sections(p.geo, slot);
    load_group<kMode>(s, rm, h, P, N, p0, false, raw, prow);
    stage_ring_x(s);
    load_ring_b(s, 0);
    if (int(threadIdx.x) < L) ring_delta = s.ring_delta[threadIdx.x * H + h];
  }
  SlotCursors cur = p.cursors[slot];
  const SlotCursors before = cur;              // what the entry's last block finishes from
  float delta_window = head.delta(dt_window);  // while round trip 2 is out
  // The validation (validate_tokens' checks). The step's inputs this block reads, and writes into
  // the ring, are its head's x and dt and its group's B and C, all in its registers: each block
  // tests its own, and the entry's last block to arrive holds the verdict (finish_early_arrival),
  // since only the cursors it writes commit the step. A refused entry's blocks may have written
  // ring position c, which holds no committed entry (and y). A fold, which rewrites the
  // checkpoint, waits for the whole entry's verdict instead: each of its blocks scans the whole
  // entry after the cursors have said that it folds.
  bool refused = !isfinite(dt_window) || c_window.nonfinite(f16) || b_window.nonfinite(f16);
  for (int u = threadIdx.x; u < x_vectors; u += blockDim.x)
    refused |= nonfinite16<ActT>(u < int(blockDim.x) ? x_vector : x_block[u], f16);
  const bool report = blockIdx.x == 0 && g == 0;
  if (!slot_takes_step(p, slot, cur, report)) return;  // uniform
  // SPEC 4: the flush first. Nothing else is live across the fold, which has the registers to
  // itself (what is loaded above is loaded again or, the ring being empty after it, unused);
  // this block reads its writes after the barrier.
  const bool folded = verify_needs_flush(cur, 1, L);  // c = L > 0
  if (folded) refused |= entry_has_nonfinite<ActT>(p, b, threadIdx.x, blockDim.x);
  cp_async_wait<0>();
  refused = __syncthreads_or(refused);  // also: the ring x stage visible to every thread
  if (folded && refused) {
    if (report && threadIdx.x == 0) raise_error(p.error, kErrNonFiniteInput, slot, 0);
    return;
  }
  load_ring_x(p0);
  int ticket = 0;  // early_arrival's, where the step does not fold
  if (folded) {
    // Rows [p0, p1): whole row groups of the fold's RowMap (small_step_split_log2).
    flush_head<kMode, ActT, small_step_fold_rows(kMode, kThreads), false, kSplit, false>(
        p, slot, cur, h, smem, -1, split, 1 << split_log2);
    __syncthreads();
    apply_flush(cur, L);
    load_group<kMode>(slot_sections(p.geo, slot), rm, h, P, N, p0, false, raw, prow);
    load_window();
    head = HeadScalars::load(p.head, h);  // not held across the fold's registers
    delta_window = head.delta(dt_window);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kEntries; ++t) ring_x[r][t] = ActT(0);
#pragma unroll
    for (int q = 0; q < kSmallStepDots; ++q) ring_b[q] = Act8<ActT>{};
  } else {
    // Every thread holds the cursors (the barrier above): the arrival goes now.
    ticket = early_arrival(p, b, refused);
    if (refused) return finish_early_arrival(p, b, slot, blocks_per_entry, before, ticket, true);
  }
  const SlotSections sec = slot_sections(p.geo, slot);
  const int c = cur.committed, m = c + 1;
  // Logical index of ring position `pos` (entries 0..c-1 committed; c: the window's position).
  auto logical = [&](int pos) { return (pos - cur.origin) & (L - 1); };
  const SmallStepSmem sm = SmallStepSmem::carve(smem, L);
  if (int(threadIdx.x) < L && logical(threadIdx.x) < c) sm.delta[logical(threadIdx.x)] = ring_delta;
  if (threadIdx.x == 0) sm.delta[c] = delta_window;
  // The ring term's x_k[p] and the entries k whose weights the lane takes: the committed entries
  // at the lane's positions, and the window's (input) x where the lane's position is logical c.
  float xw[kRows];  // the window's x of this thread's rows
  auto load_window_x = [&](int base) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) xw[r] = act_f32(x_in[min(rm.row(base, r), P - 1)], f16);
  };
  load_window_x(p0);
  int lane_k[kEntries];  // logical entry of the lane's position t, L where none (w = 0)
#pragma unroll
  for (int t = 0; t < kEntries; ++t) {
    const int pos = lane + t * lanes, k = logical(pos);
    lane_k[t] = pos < L && k <= c ? k : L;
  }
  auto ring_term_x = [&](int r, int t) {
    return lane_k[t] < c ? act_f32(ring_x[r][t], f16) : lane_k[t] == c ? xw[r] : 0.f;
  };
  // The window into the ring at logical c (read by no block of this step; after a fold in this
  // kernel the position held entry 0, which only this head's fold read where the head is one
  // block). Ring B by the group's first block, or after a fold by the entry's last block
  // (finish_verify: the other blocks of the group fold entry 0's B until they finish); so too x
  // and delta after a fold where a head's rows are split over several blocks.
  const bool append_x = !folded || split_log2 == 0;
  const int phys = ring_index(cur, c, L);
  for (int u = threadIdx.x; append_x && u < x_vectors; u += blockDim.x) {
    if (u >= int(blockDim.x)) x_vector = x_block[u];  // rows longer than a vector per thread
    reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + (int64_t(phys) * H + h) * P + p0)[u] =
        x_vector;
  }
  if (append_x && threadIdx.x == 0 && split == 0) sec.ring_delta[phys * H + h] = delta_window;
  if (!folded && blockIdx.x == 0) append_window_B<ActT>(p, b, sec, cur, g, 1);

  float cr[8];  // columns n0.. of C (then Cr)
  c_window.get(f16, cr);
  // B_k . C of the positions k0 + first + q rows_per_pass, kSmallStepDots at a time (the first
  // batch loaded above); the trip count is the block's (the shuffles need every lane of the warp).
  for (int k0 = 0; k0 < L; k0 += kSmallStepDots * per_pass) {
    if (k0 > 0) load_ring_b(sec, k0);  // history 32, or dstate 256: more positions than a batch
#pragma unroll
    for (int q = 0; q < kSmallStepDots; ++q) {
      const int pos = k0 + first + q * per_pass, k = pos < L ? logical(pos) : L;
      float bk[8];
      (k < c ? ring_b[q] : k == c ? b_window : Act8<ActT>{}).get(f16, bk);
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) d += bk[i] * cr[i];
      // row_sum's order; row_sum itself (every offset unrolled and predicated) made ptxas spill
      // 8-48 bytes in the history-32 instantiations.
      for (int o = lanes / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (lane == 0 && k < m) sm.dot[k] = d;
    }
  }
  __syncthreads();  // sm.delta, sm.dot
  // The weights, thread k for entry k: running sums in the CPU reference's order (sequential).
  if (int(threadIdx.x) < m) {
    const int k = threadIdx.x;
    float run = 0.f, Lk = 0.f;
    running_sums(sm.delta, m, k, run, Lk);
    float w = sm.delta[k] * decay(head.A * (run - Lk)) * sm.dot[k];
    if (k == c) {
      w += head.D;
      *sm.dec = decay(head.A * run);
    }
    sm.w[k] = w;
  }
  // The readout's C: rounded to bf16 in the 8/4-bit read modes (SPEC 5), as is otherwise.
  if constexpr (has_bf16_readout(kMode)) {
#pragma unroll
    for (int i = 0; i < 8; ++i) cr[i] = bf16_to_f32(f32_to_bf16(cr[i]));
  }
  __syncthreads();  // sm.w, sm.dec
  float wk[kEntries];
#pragma unroll
  for (int t = 0; t < kEntries; ++t) wk[t] = lane_k[t] < m ? sm.w[lane_k[t]] : 0.f;
  const float dec = *sm.dec;

  // ---- the readout, one row group at a time (nemotron-h-8b: one), the next one's loads ahead
  const int64_t y0 = (int64_t(b) * H + h) * P;
  for (int base = p0; base < p1; base += rm.rows_per_group) {
    float part[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v[8];
      const float scale = decode_raw8<kMode>(raw[r], false, v);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s += v[i] * cr[i];
      float acc = dec * scale * s;
#pragma unroll
      for (int t = 0; t < kEntries; ++t) acc += wk[t] * ring_term_x(r, t);
      part[r] = acc;
    }
    const int next = base + rm.rows_per_group;
    if (next < p1) {
      load_group<kMode>(sec, rm, h, P, N, next, false, raw, prow);
      load_ring_x(next);
      load_window_x(next);
    }
    if constexpr (kRows == 5) {
      float y_fifth;
      const float y = row_sum_values(part, lane, lanes, y_fifth);
      const int row = rm.row(base, lane / (lanes / 4)), fifth = rm.row(base, 4);
      if (lane % (lanes / 4) == 0 && row < p1) store_scalar(p.y, p.y_dtype, y0 + row, y);
      if (lane == 0 && fifth < p1) store_scalar(p.y, p.y_dtype, y0 + fifth, y_fifth);
    } else {
      const int per_value = lanes / kRows;  // lanes holding each row's sum
      const float y = row_sum_values<kRows>(part, lane, lanes);
      const int row = rm.row(base, lane / per_value);
      if (lane % per_value == 0 && row < p1) store_scalar(p.y, p.y_dtype, y0 + row, y);
    }
  }
  if (folded)
    finish_verify<ActT>(p, b, slot, blocks_per_entry, before,
                        append_x ? WindowAppend::none : WindowAppend::x_and_delta);
  else
    finish_early_arrival(p, b, slot, blocks_per_entry, before, ticket);
}

}  // namespace replayssm::cuda
