// small_verify_kernel: a speculative verify (W = 2 .. max_window) of a small batch in one launch
// after validate_tokens. Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/flush_kernel.cuh"
#include "cuda/replay_common.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- the verify of a small batch ---------------------------------------------------------------
// At batch 1 a verify moves a few MB and its time is the chain of launches and dependent round
// trips, not bytes. The chained path is three launches (validate_tokens, flush_kernel,
// verify_kernel); this is two: validate_tokens, then one block per (entry, head) that
//
//   before validate_tokens is done (it lets this grid start once past its own wait; this grid
//   reads nothing it writes until wait_for_previous_grid)
//     round trip 1  slot id; the window's B, C (the head's group) and x, dt (the head) -> smem
//     round trip 2  the slot's cursors; the head's read-checkpoint rows and delta at every ring
//                   position (into registers); B and x at every ring position -> smem (the
//                   cursors say which positions hold the committed entries, and in which order,
//                   only when they arrive)
//   then            the entry's verdict (validate_tokens' status words); where c + W > L the fold
//                   of its own head (flush_head) and the new checkpoint rows; the window's ring
//                   x and delta; B_k . C_j; the weights; the readout of the W outputs; the
//                   last block to arrive advances the cursors (without a fold the arrival goes
//                   before B_k . C_j: early_arrival; after one, at the end: finish_verify)
//
// with, at logical position i = c + j of window token j (c committed entries after any fold,
// L_k = delta_0 + ... + delta_k, Cr_j = C_j rounded to bf16 in the 8/4-bit read modes),
//   y_j[p] = exp(A L_i) scale_p sum_n R[p,n] Cr_j[n] + sum_{k <= i} w_jk x_k[p]
//   w_jk   = delta_k exp(A (L_i - L_k)) (B_k . C_j)  (+ D for k = i)
// A lane of a row holds 8 columns of R; the lanes of a row split the entries k of the ring term,
// so one reduction over the row's lanes gives y for 4 outputs of each of the thread's 2 rows.
//
// The ring and window operands are staged as they are in memory (16 or 32 bits) by cp.async, all
// of them in flight at once. Validation stays in validate_tokens, whose 8 blocks per entry scan
// the inputs. small_step_kernel's blocks test only their own inputs and let the entry's last
// block refuse the step, but a fold must know the whole entry's verdict first, and at W = 8
// every 2 to 3 steps fold: each block would then scan 160 KB (nemotron-h-8b), 20 MB through the
// L2 per step.
//
// 512 threads (16 warps) per block: at batch 1 the grid is one block per SM, and the fold and
// the W-output readout are chains of dependent instructions per thread that 4 warps could not
// hide (H200, batch 1 separate-fp8: 128 threads took W = 4 / W = 8 steps 14.9 / 20.1 us, 512
// threads 13.2 / 17.4; bench/results/2026-12-02-h200-session28.md). One wave of such blocks is
// batch x H x (blocks per head) <= the SM count; where that is exceeded, blocks of 256 or 128
// threads at two or four per SM hold more rows per thread (small_verify_shape).
inline constexpr int kSmallVerifyThreads = 512;
inline constexpr int kSmallVerifyRows = 2;  // rows per thread (nemotron-h-8b: the head's 64 rows)

// Shared memory, placed after the fold's (flush_head overwrites that; what is staged here
// outlives the fold). Activations in their own dtype (ActT); counts in elements; R: the block's
// rows of the head (P, or P / 2^s where the head is split over 2^s blocks).
struct SmallVerifySmem {
  void* ring_B;      // [L, N] ActT  B at each ring position (the head's group)
  void* ring_x;      // [L, R] ActT  x of the block's rows at each ring position
  void* win_B;       // [W, N] ActT  the window's B
  void* win_C;       // [W, N] ActT  the window's C
  void* win_x;       // [W, R] ActT  the window's x of the block's rows
  float* dot;        // [W, L]       B_k . C_j, logical entry k
  float* w;          // [W, L]       w_jk
  float* dec;        // [W]          exp(A L_{c+j})
  float* delta_log;  // [L]          delta_k, logical entry k
  float* Cr;         // [W, N]       C_j as the readout takes it (bf16-rounded in 8/4-bit modes)

  __host__ __device__ static size_t act_bytes(int L, int N, int R, int W, int act_size) {
    return size_t(act_size) * (size_t(L) * (N + R) + size_t(W) * (2 * N + R));
  }
  __host__ __device__ static size_t bytes(int L, int N, int R, int W, int act_size) {
    return act_bytes(L, N, R, W, act_size) +
           sizeof(float) * (size_t(L) + 2 * size_t(W) * L + W + size_t(W) * N);
  }
  // base: 16-byte aligned, past the fold's shared memory.
  __device__ static SmallVerifySmem carve(uint8_t* base, int L, int N, int R, int W, int act_size) {
    SmallVerifySmem s;
    s.ring_B = base;
    s.win_B = base + size_t(act_size) * L * N;
    s.win_C = base + size_t(act_size) * (L + W) * N;
    s.ring_x = base + size_t(act_size) * (L + 2 * W) * N;
    s.win_x = base + size_t(act_size) * ((L + 2 * W) * N + L * R);
    s.Cr = reinterpret_cast<float*>(base + act_bytes(L, N, R, W, act_size));  // 16-byte aligned
    s.dot = s.Cr + W * N;
    s.w = s.dot + W * L;
    s.dec = s.w + W * L;
    s.delta_log = s.dec + W;
    return s;
  }
};

// Where the staging starts in the dynamic shared memory: past the fold's, 16-byte aligned.
__host__ __device__ inline size_t small_verify_staging_offset(int L, int N, int P) {
  return (FoldSmem::bytes(L, N, P) + 15) / 16 * 16;
}

// Grid ((H / G) << p.step_split_log2, G, batch) of kThreads: block (x, g, b) takes
// entry b's head g H / G + (x >> p.step_split_log2), all its rows or (kSplit) one split of them:
// rows [p0, p0 + R), whole row groups (small_verify_shape). A split block stages, folds,
// appends and reads out its rows only; B_k . C_j and the weights are every block's.
// Launched dependent on validate_tokens, which lets it start only once every grid before
// validate_tokens is complete.
// kThreads: kSmallVerifyThreads at one block per SM, or a half or a quarter of it at two or four
// (small_verify_shape), the same registers per thread.
template <Mode kMode, typename ActT, bool kSplit = false, int kThreads = kSmallVerifyThreads>
__global__ void __launch_bounds__(kThreads, kSmallVerifyThreads / kThreads)
    small_verify_kernel(const ReplayParams p) {
  constexpr int kRows = kSmallVerifyRows;
  constexpr int kAct = int(sizeof(ActT));
  // The commit after this verify may be scheduled at once; it waits for this grid to complete.
  allow_dependent_launch();
  extern __shared__ float4 smem_raw[];
  float* const fold_smem = reinterpret_cast<float*>(smem_raw);
  const int H = p.H, P = p.P, N = p.N, G = p.G, L = p.L, W = p.tokens;
  const int split_log2 = kSplit ? p.step_split_log2 : 0;
  const int split = blockIdx.x & ((1 << split_log2) - 1);
  const int b = blockIdx.z, g = blockIdx.y, h = g * (H / G) + (blockIdx.x >> split_log2);
  const int R = P >> split_log2, p0 = split * R, p1 = p0 + R;  // the block's rows
  const int blocks_per_entry = H << split_log2;
  HeadScalars head = HeadScalars::load(p.head, h);
  const bool f16 = p.act_f16;
  const RowMap rm(p.lanes_per_row, kRows);
  const int lanes = rm.lanes, lane = rm.lane_in_row;
  const SmallVerifySmem sm = SmallVerifySmem::carve(
      reinterpret_cast<uint8_t*>(smem_raw) + small_verify_staging_offset(L, N, P), L, N, R, W,
      kAct);

  // ---- round trip 1: what depends on (b, h) only
  const int slot = p.slots[b];
  const ActT* const x_in =
      static_cast<const ActT*>(p.x) + (int64_t(b) * W * H + h) * P;  // [W] rows
  const int64_t bc0 = (int64_t(b) * W * G + g) * N;  // the window's B and C rows of the group
  cp_async_rows(sm.win_B, static_cast<const ActT*>(p.B) + bc0, W, N * kAct, int64_t(G) * N * kAct);
  cp_async_rows(sm.win_C, static_cast<const ActT*>(p.C) + bc0, W, N * kAct, int64_t(G) * N * kAct);
  cp_async_rows(sm.win_x, x_in + p0, W, R * kAct, int64_t(H) * P * kAct);
  cp_async_commit();
  const float dt_window = int(threadIdx.x) < W ? p.dt[(int64_t(b) * W + threadIdx.x) * H + h] : 0.f;
  if (slot < 0) {  // padding
    cp_async_wait<0>();
    return;
  }

  // ---- round trip 2: everything at the slot's addresses
  RawChunk raw[kRows];
  int prow[kRows];
  SlotSections sec = slot_sections(p.geo, slot);
  load_group<kMode>(sec, rm, h, P, N, p0, false, raw, prow);
  cp_async_rows(sm.ring_B, static_cast<const ActT*>(sec.ring_B) + int64_t(g) * N, L, N * kAct,
                int64_t(G) * N * kAct);
  cp_async_rows(sm.ring_x, static_cast<const ActT*>(sec.ring_x) + int64_t(h) * P + p0, L, R * kAct,
                int64_t(H) * P * kAct);
  cp_async_commit();
  const float ring_delta = int(threadIdx.x) < L ? sec.ring_delta[threadIdx.x * H + h] : 0.f;
  SlotCursors cur = p.cursors[slot];
  const SlotCursors before = cur;  // what the entry's last block finishes from
  // Where the entry flushes, the fold's first recurrence rows too (whether the step may write is
  // known only below).
  const bool folded = verify_needs_flush(cur, W, L);
  RawChunk fold_raw[kRows];
  if (folded) {
    int fold_prow[kRows];
    load_group<kMode>(sec, rm, h, P, N, p0, true, fold_raw, fold_prow);
  }

  // The window's delta of the head, in threads 0 .. W - 1.
  const float win_delta = int(threadIdx.x) < W ? head.delta(dt_window) : 0.f;

  // ---- the verdict of validate_tokens (open, nothing pending, finite inputs; it raised any
  // error), the same for every block of the entry
  wait_for_previous_grid();
  const bool ok = slot_ok(p, b);
  cp_async_wait<0>();
  if (!ok) return;  // uniform

  // SPEC 4: the flush first (c + W > L), from the ring this block staged; the ring is empty
  // after it, and the new checkpoint rows are loaded again.
  if (folded) {
    __syncthreads();  // every thread's copies of the ring
    const FoldOperands<ActT> held{static_cast<const ActT*>(sm.ring_B),
                                  static_cast<const ActT*>(sm.ring_x), ring_delta, p0, R};
    flush_head<kMode, ActT, kRows, false, kSplit, false>(p, slot, cur, h, fold_smem, -1, split,
                                                         1 << split_log2, &held, fold_raw);
    __syncthreads();  // this block reads its own writes below
    apply_flush(cur, L);
    load_group<kMode>(sec, rm, h, P, N, p0, false, raw, prow);
    head = HeadScalars::load(p.head, h);  // not held across the fold's registers
  }
  const int c = cur.committed, m = c + W;
  // Entry deltas in logical order, for the weights' running sums: the committed entries' from
  // their ring positions (none after a fold), then the window's.
  if (int(threadIdx.x) < L) {
    const int k = (int(threadIdx.x) - cur.origin) & (L - 1);
    if (k < c) sm.delta_log[k] = ring_delta;
  }
  if (int(threadIdx.x) < W) sm.delta_log[c + threadIdx.x] = win_delta;
  __syncthreads();  // the staging and the deltas
  // Without a fold every block of the entry holds the cursors now, and they are all that the
  // entry's last block writes that a block reads: the arrival goes now, its round trip hidden.
  const int ticket = folded ? 0 : early_arrival(p, b);
  auto phys = [&](int k) { return ring_index(cur, k, L); };
  // Operands of logical entry k (k < c: committed, in the ring; else window token k - c).
  auto entry_B = [&](int k) {
    return static_cast<const ActT*>(k < c ? sm.ring_B : sm.win_B) + (k < c ? phys(k) : k - c) * N;
  };
  auto entry_x = [&](int k) {
    return static_cast<const ActT*>(k < c ? sm.ring_x : sm.win_x) + (k < c ? phys(k) : k - c) * R;
  };

  // The window into the ring at logical c .. c + W - 1, read by no block of this step (after a
  // fold, the positions of entries whose x of these rows only this block read, from its own
  // copy; other blocks never read these rows). Ring B by the group's first block, or after a
  // fold by the entry's last block (finish_verify: the other blocks of the group fold the old
  // entries' B until they finish); so too delta after a fold where the head is split (its other
  // blocks load the old entries' delta until they start).
  {
    const int per_row = R * kAct / 16;
    for (int u = threadIdx.x; u < W * per_row; u += blockDim.x) {
      const int j = u / per_row, i = u - j * per_row;
      reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + (int64_t(phys(c + j)) * H + h) * P +
                               p0)[i] =
          reinterpret_cast<const uint4*>(static_cast<const ActT*>(sm.win_x) + j * R)[i];
    }
    const bool append_delta = split == 0 && (!folded || split_log2 == 0);
    if (append_delta && int(threadIdx.x) < W)
      sec.ring_delta[phys(c + threadIdx.x) * H + h] = win_delta;
    if (!folded && blockIdx.x == 0) append_window_B<ActT>(p, b, sec, cur, g, 1);
  }

  // The readout's C: rounded to bf16 in the 8/4-bit read modes (SPEC 5), as is otherwise.
  for (int u = threadIdx.x; u < W * N / 8; u += blockDim.x) {
    float cv[8];
    load8_act(static_cast<const ActT*>(sm.win_C) + 8 * u, f16, cv);
    if constexpr (has_bf16_readout(kMode)) {
#pragma unroll
      for (int i = 0; i < 8; ++i) cv[i] = bf16_to_f32(f32_to_bf16(cv[i]));
    }
    store8_f32(sm.Cr + 8 * u, cv);
  }
  // B_k . C_j for every pair k <= c + j, pair q = j m + k, by 4 threads: thread `part` takes
  // the 8-column chunks part, part + 4, ..., shifted by 4 chunks for odd k (a quarter warp's two
  // pairs would otherwise read the same banks of rows N apart), then two shuffles. The trip count
  // is the block's (the shuffles need every lane of the warp).
  {
    const int chunks = N / 8;  // 8, 16 or 32
    const int part = int(threadIdx.x) % 4;
    for (int q0 = 0; q0 < W * m; q0 += int(blockDim.x) / 4) {
      const int q = q0 + int(threadIdx.x) / 4, j = q / m, k = q - j * m;
      const bool live = q < W * m && k <= c + j;
      float d = 0.f;
      if (live) {
        const ActT* bk = entry_B(k);
        const ActT* cj = static_cast<const ActT*>(sm.win_C) + j * N;
        for (int t = part; t < chunks; t += 4) {
          const int n = 8 * ((t + 4 * (k & 1)) & (chunks - 1));
          float bv[8], cv[8];
          load8_act(bk + n, f16, bv);
          load8_act(cj + n, f16, cv);
#pragma unroll
          for (int i = 0; i < 8; ++i) d += bv[i] * cv[i];
        }
      }
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      if (live && part == 0) sm.dot[j * L + k] = d;
    }
  }
  __syncthreads();  // sm.dot
  // The weights, one thread per pair: running sums in the CPU reference's order (sequential).
  const float A = head.A;
  for (int q = threadIdx.x; q < W * m; q += blockDim.x) {
    const int j = q / m, k = q - j * m, i = c + j;
    if (k > i) {  // not seen by output j: a zero weight, so the readout need not ask
      sm.w[j * L + k] = 0.f;
      continue;
    }
    float run = 0.f, Lk = 0.f;
    running_sums(sm.delta_log, i + 1, k, run, Lk);
    float w = sm.delta_log[k] * decay(A * (run - Lk)) * sm.dot[j * L + k];
    if (k == i) {
      w += head.D;
      sm.dec[j] = decay(A * run);
    }
    sm.w[j * L + k] = w;
  }
  __syncthreads();  // sm.w, sm.dec

  // ---- the readout, one row group at a time (nemotron-h-8b: one). The outputs go kOut at a
  // time: a lane holds its share of y_j at each of its rows (8 columns of the checkpoint term, the
  // ring terms of its entries k = lane, lane + lanes, ...), and one reduction of those kOut x
  // kRows values over the row's lanes leaves each value's sum in lanes / (kOut kRows) of them.
  // Windows of 5 to 8 take all their outputs in one reduction where the row has 16 lanes or more
  // (dstate >= 128: one value per lane), the others 4 at a time (row_sum_values needs
  // lanes >= kOut kRows).
  auto readout = [&]<int kOut>() {
    constexpr int kValues = kOut * kRows;
    const int per_value = lanes / kValues;  // lanes holding each value's sum
    const int my_value = lane / per_value;  // value index v = jj kRows + r
    for (int base = p0; base < p1; base += rm.rows_per_group) {
      float v[kRows][8], scale[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) scale[r] = decode_raw8<kMode>(raw[r], false, v[r]);
      int xrow[kRows];  // among the block's rows
#pragma unroll
      for (int r = 0; r < kRows; ++r) xrow[r] = min(rm.row(base, r), p1 - 1) - p0;
      const int next = base + rm.rows_per_group;
      if (next < p1) load_group<kMode>(sec, rm, h, P, N, next, false, raw, prow);
      for (int j0 = 0; j0 < W; j0 += kOut) {
        float part[kValues];
#pragma unroll
        for (int jj = 0; jj < kOut; ++jj) {
          const int j = j0 + jj < W ? j0 + jj : W - 1;  // past W: computed, never stored
          const float4 c0 = *reinterpret_cast<const float4*>(sm.Cr + j * N + rm.n0);
          const float4 c1 = *reinterpret_cast<const float4*>(sm.Cr + j * N + rm.n0 + 4);
          const float cr[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
          const float dec = sm.dec[j];
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) s += v[r][i] * cr[i];
            part[jj * kRows + r] = dec * scale[r] * s;
          }
        }
        // Ring terms: w_jk = 0 where output j does not see entry k (k > c + j).
        const int k_end = min(m, c + j0 + kOut);
        for (int k = lane; k < k_end; k += lanes) {
          const ActT* xk = entry_x(k);
          float xv[kRows];
#pragma unroll
          for (int r = 0; r < kRows; ++r) xv[r] = act_f32(xk[xrow[r]], f16);
#pragma unroll
          for (int jj = 0; jj < kOut; ++jj) {
            const float wk = j0 + jj < W ? sm.w[(j0 + jj) * L + k] : 0.f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) part[jj * kRows + r] += wk * xv[r];
          }
        }
        const float y = row_sum_values<kValues>(part, lane, lanes);
        const int j = j0 + my_value / kRows, row = rm.row(base, my_value % kRows);
        if (lane % per_value == 0 && j < W && row < p1)
          store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j) * H + h) * P + row, y);
      }
    }
  };
  if (W > 4 && lanes >= 8 * kRows)
    readout.template operator()<8>();
  else
    readout.template operator()<4>();
  if (folded)
    finish_verify<ActT>(p, b, slot, blocks_per_entry, before,
                        split_log2 > 0 ? WindowAppend::delta : WindowAppend::none);
  else
    finish_early_arrival(p, b, slot, blocks_per_entry, before, ticket);
}

}  // namespace replayssm::cuda
