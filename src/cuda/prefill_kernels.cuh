// prefill (fold, per-token fp32 recurrence, encode) and the state / import kernel.
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/replay_common.cuh"

namespace replayssm::cuda {

// prefill: fold the committed entries, run the T tokens through the fp32 recurrence (y for each),
// encode the result. One block per (b, h); the cursors are advanced by prefill_finalize_kernel.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads) prefill_kernel(const ReplayParams p) {
  extern __shared__ float4 smem_raw[];
  const int b = blockIdx.x / p.H, h = blockIdx.x % p.H;
  if (!slot_ok(p, b)) return;
  const int slot = p.slots[b];
  const SlotCursors cur = p.cursors[slot];
  const int T = p.tokens, N = p.N, P = p.P, H = p.H, G = p.G;
  const int g = h / (H / G);
  const SlotSections sec = slot_sections(p.geo, slot);
  const FoldSmem f = FoldSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P);
  stage_fold<ActT>(p, sec, cur, cur.committed, h, g, nullptr, f);
  __syncthreads();
  const float A = p.head.A[h], D = p.head.D[h];
  const RowMap rm(p.lanes_per_row, kStepRows);
  const int lanes = rm.lanes, lane_in_row = rm.lane_in_row, n0 = rm.n0;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rm.rows_per_group) {
    float v[kStepRows][8];
    int prow[kStepRows], clamped[kStepRows];
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      prow[r] = rm.row(base, r);
      clamped[r] = min(prow[r], P - 1);
      load_rec8<kMode>(sec, int64_t(h) * P + clamped[r], n0, N, v[r]);
    }
    fold_rows(v, f, cur.committed, clamped, n0, N, P);
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t(b) * T + t;
      const float delta =
          process_dt(p.dt[bt * H + h], p.head.dt_bias[h], p.head.dt_min, p.head.dt_max);
      const float a = expf(delta * A);
      float Bv[8], Cv[8];
      load8_act(static_cast<const ActT*>(p.B) + (bt * G + g) * N + n0, p.act_f16, Bv);
      load8_act(static_cast<const ActT*>(p.C) + (bt * G + g) * N + n0, p.act_f16, Cv);
      const ActT* x = static_cast<const ActT*>(p.x) + (bt * H + h) * P;
#pragma unroll
      for (int r = 0; r < kStepRows; ++r) {
        const int pr = min(prow[r], P - 1);
        const float xv = act_f32(x[pr], p.act_f16);
        const float dx = delta * xv;
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          v[r][i] = a * v[r][i] + dx * Bv[i];
          acc += v[r][i] * Cv[i];
        }
        acc = row_sum(acc, lanes);
        if (prow[r] < P && lane_in_row == 0)
          store_scalar(p.y, p.y_dtype, (bt * H + h) * P + pr, acc + D * xv);
      }
    }
#pragma unroll
    for (int r = 0; r < kStepRows; ++r) {
      const int pr = min(prow[r], P - 1);
      const int bad = sanitize8(v[r]);
      if (prow[r] < P) nonfinite += bad;
      float rv[8];
      // A duplicated row (past P) loaded row P - 1 while another warp may already have stored
      // its new values there: it must not store (a second update of that row).
      encode8<kMode>(sec, int64_t(h) * P + pr, n0, N, lane_in_row, lanes, v[r], sr, rv, &saturated,
                     prow[r] < P);
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

// state(slot, at): dense [H, P, N] fp32 = fold(decode(rec), entries 0..at-1). Block per head.
// import (encode = true): encodes dense into the slot's checkpoint(s) instead.
template <Mode kMode, typename ActT>
__global__ void __launch_bounds__(kStepThreads)
    dense_kernel(const ReplayParams p, int slot, bool encode) {
  extern __shared__ float4 smem_raw[];
  const int h = blockIdx.x;
  const SlotCursors cur = p.cursors[slot];
  const int N = p.N, P = p.P, H = p.H, G = p.G;
  const SlotSections sec = slot_sections(p.geo, slot);
  const FoldSmem f = FoldSmem::carve(reinterpret_cast<float*>(smem_raw), p.L, N, P);
  const int at = encode ? 0 : p.at;
  if (!encode) stage_fold<ActT>(p, sec, cur, at, h, h / (H / G), nullptr, f);
  __syncthreads();
  const RowMap rm(p.lanes_per_row, 1);
  const int lanes = rm.lanes, lane_in_row = rm.lane_in_row, n0 = rm.n0;
  const SrContext sr = make_sr(p, cur);
  int saturated = 0;
  int nonfinite = 0;
  for (int base = 0; base < P; base += rm.rows_per_pass) {
    const int prow = rm.row(base, 0);
    const int pr = min(prow, P - 1);
    const int64_t row = int64_t(h) * P + pr;
    if (encode) {
      float v[8];
      load8(p.dense + row * N + n0, v);
      const int bad = sanitize8(v);
      if (prow < P) nonfinite += bad;
      float rv[8];
      encode8<kMode>(sec, row, n0, N, lane_in_row, lanes, v, sr, rv, &saturated, prow < P);
    } else {
      float one[1][8];
      load_rec8<kMode>(sec, row, n0, N, one[0]);
      const int rows[1] = {pr};
      fold_rows(one, f, at, rows, n0, N, P);
      if (prow < P) store8_f32(p.dense + row * N + n0, one[0]);
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

}  // namespace replayssm::cuda
