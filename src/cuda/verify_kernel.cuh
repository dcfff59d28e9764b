// verify_kernel and its variants (SPEC 3, 4: readout, ring term, window append, cursors).
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/flush_kernel.cuh"
#include "cuda/replay_common.cuh"
#include "cuda/verify_direct.cuh"
#include "cuda/verify_mma.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- verify ------------------------------------------------------------------------------------
// One block per (batch entry, group, chunk of heads_per_block heads of the group), for every slot
// (a flushing slot's heads were folded by flush_kernel; its window starts at logical 0):
//
//   y_j[p] = exp(A L_i) scale_p sum_n R[p,n] Cr_j[n] + sum_{k <= i} w_jk x_k[p] + D x_i[p]
//   w_jk   = delta_k exp(A (L_i - L_k)) (B_k . C_j),         i = c + j,  L_k = delta_0 + ... +
//   delta_k
//
// What the heads of a group share is done once per block: the entries' B and the window's C are
// staged and the products B_k . C_j go to shared memory. The read checkpoint streams through
// shared memory in (head, row chunk) units with cp.async, verify_stages(W) deep, so the bytes in
// flight do not depend on registers (an 8-byte fp8 chunk per lane held in registers leaves the
// memory system idle). The weights w_jk are formed once per block at W = 1 (every head's) and
// once per head at W > 1, in shared memory, except in the FMA readout at W > 1 (below).
// The 8/4-bit read modes read R C_j out on the tensor cores (mma_tile, 16-row tiles) and add the
// ring term per output. The 16/32-bit modes use the FMA readout: lane l of a row owns the
// entries k = l + t * N/8 (t < kEntries), and the ring term joins the checkpoint term in the
// row's one reduction,
//   part_j = exp(A L_i) scale (v . Cr_j)[8 columns] + sum_{own k} (w_jk + D [k == i]) x_k[p],
// with Cr_j in registers (each thread always works on the same 8 columns; reading it from
// shared memory per row would move 32 bytes of shared memory per checkpoint byte at W = 8).

// How a verify_kernel instantiation runs (the launcher picks one per step, replay_launch.h).
enum class VerifyVariant {
  chained,         // after validate_tokens and flush_kernel
  chained_wide,    // the same for W = 1 on the tensor cores, where the grid is one wave at 4
                   // blocks per SM: registers for 4 blocks instead of 6
  chained_direct,  // codes on the tensor cores, W <= kDirectMaxWindow (or up to 8 with the ring
                   // term on the tensor cores): A fragments loaded from global memory into
                   // registers (DirectReader), no staging (verify_direct_ok)
};

// Blocks per SM the register allocation of verify_kernel aims at, without spills (nvcc -Xptxas
// -v). The tensor-core path keeps C in shared memory and its stages and fragments leave room
// for 6 blocks at W = 1 (about 37 KB each at nemotron-h-8b's shape; aiming at 8 blocks, i.e. 64
// registers, spilled 8 bytes); the FMA path at W = 1 holds one row of C in 8 registers.
// The wide variant aims at 4: 128 registers leave the readout's per-unit addressing in registers
// (H200, W = 1 batch 64, 54.6 -> 50.6 us shared-fp8, 61.1 -> 57.2 separate-fp8; at batch 256,
// several waves, 4 blocks per SM lost 2%).
constexpr int verify_min_blocks(Mode mode, int kW, VerifyVariant variant) {
  if (variant == VerifyVariant::chained_direct) return kDirectMinBlocks;
  const int blocks = has_bf16_readout(mode) ? (kW == 1 ? 6 : 4) : kW == 1 ? 8 : 3;
  return variant != VerifyVariant::chained && blocks > 4 ? 4 : blocks;
}

// After validate_tokens and flush_kernel (the decode steps of small batches run
// small_step_kernel instead, one launch).
template <Mode kMode, typename ActT, int kW, int kEntries, VerifyVariant kVariant,
          int kDirectBlocks = 0>
__global__ void __launch_bounds__(kVerifyThreads, verify_min_blocks(kMode, kW, kVariant))
    verify_kernel(const ReplayParams p) {
  constexpr bool kDirect = kVariant == VerifyVariant::chained_direct;
  static_assert(!kDirect || (has_direct_readout(kMode) && kDirectBlocks > 0),
                "the direct readout: codes on the tensor cores, N = 64 kDirectBlocks");
  // Launched dependent on the kernel before it. The chained verify overlaps flush_kernel, which
  // writes only the checkpoints of flushing entries: the blocks of those entries wait for it
  // below, the others read nothing it writes; block 0 waits here, so that this grid cannot
  // complete before the flush and whatever follows in the stream sees both. That block also
  // clears the flush count for the next step's validate_tokens: every flush block read it before
  // the flush grid completed (flush_kernel).
  if ((blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    wait_for_previous_grid();
    if (threadIdx.x == 0) *p.flush_count = 0;
  }
  extern __shared__ float4 smem_raw[];
  constexpr int kStages = verify_stages(kW);
  const int H = p.H, P = p.P, N = p.N, G = p.G, L = p.L, W = p.tokens;
  const int chunks = gridDim.x;  // grid (chunks of the group's heads, G, batch)
  // The entries run in the order validate_tokens placed them (order_place, where
  // verify_order_pays): those that wait for the flush last, so that the blocks resident beside the
  // flush have work; slot -1: the entry does not take part (padding, a closed or pending slot, a
  // NaN or Inf among its inputs). Else in entry order, the entry used only when its status words
  // are all 0 (those may leave a stale entry behind; a used one is this step's, e.b = blockIdx.z);
  // both loads in flight together.
  const ValidatedEntry e = p.verify_order[blockIdx.z];
  if (p.verify_in_place ? !slot_ok(p, blockIdx.z) : e.slot < 0) return;  // uniform over the block
  const int b = e.b, g = blockIdx.y;
  const int h0 = g * (H / G) + blockIdx.x * p.heads_per_block;
  const int slot = e.slot;
  SlotCursors after = e.cursors;  // the cursors of this verify (flushed below where it flushes)
  // validate_tokens completed before any flush block got past its wait, so the placed entry is
  // in place; the checkpoints of a flushing entry are not until the flush is.
  if (verify_needs_flush(after, W, L)) wait_for_previous_grid();
  const SlotSections sec = slot_sections(p.geo, slot);
  if (verify_needs_flush(after, W, L)) apply_flush(after, L);  // flush_kernel did it
  const int c = after.committed, m = c + W;
  // The 8/4-bit read modes read out on the tensor cores, the others on FFMA with Cr_j in
  // registers.
  constexpr bool kMma = has_bf16_readout(kMode);

  // Every head's weights at once at W = 1 and in the direct readout (all_heads).
  const StepSmem sm =
      StepSmem::carve(reinterpret_cast<float*>(smem_raw), L, N, kW, p.heads_per_block, kDirect);
  const VerifyStage vs = VerifyStage::make(kMode, sizeof(ActT), P, N, L);
  uint8_t* stages = reinterpret_cast<uint8_t*>(smem_raw) +
                    StepSmem::bytes(L, N, kW, p.heads_per_block, kMma, kDirect);
  const int units_per_head = P / vs.rows, units = p.heads_per_block * units_per_head;
  // Unit u is rows row0.. of head h0 + hh; a head is one unit whenever its codes fit a stage
  // (every preset at 8 bits), and then no division is needed.
  auto unit_head = [&](int u) { return units_per_head == 1 ? u : u / units_per_head; };
  auto unit_row0 = [&](int u) { return units_per_head == 1 ? 0 : u % units_per_head * vs.rows; };
  // The 16-byte vectors of a unit's code rows and x rows.
  const XCopy cc = XCopy::make(vs.code_bytes / 16),
              xc = XCopy::make(vs.rows * int(sizeof(ActT)) / 16);
  // W > 1 on the tensor cores with bf16 activations: the ring term on the tensor cores too
  // (ring_term_mma), which reads whole 16-entry steps of the staged x: rows m.. of every stage are
  // zeroed once (the copies write rows < m only), so that they add 0 x 0.
  const bool ring_mma =
      kMma && !kDirect && kW > 1 && sizeof(ActT) == 2 && !p.act_f16 && L % 16 == 0;
  if (ring_mma) {
    for (int s = 0; s < kStages; ++s) {
      uint16_t* x0 = reinterpret_cast<uint16_t*>(vs.view(stages + s * vs.bytes).ring_x);
      for (int i = m * vs.x_pitch + int(threadIdx.x); i < L * vs.x_pitch; i += blockDim.x)
        x0[i] = 0;
    }
    __syncthreads();  // before any copy lands in a stage
  }
  auto issue = [&](int u) {
    issue_unit<kMode, ActT>(p, sec, after, vs, cc, xc, stages + (u % kStages) * vs.bytes, b,
                            h0 + unit_head(u), unit_row0(u), m);
  };
  // The direct readout's first pieces are loaded while the block forms its weights; with the
  // ring term on the tensor cores (direct_ring) also their x, that of the window's entries from the
  // input (this block writes it to the ring only below).
  // Its k-steps of 16 entries: kEntries (2 only for history 32 at dstate 128, direct_ring_mma_ok;
  // kEntries = 2 at dstate 256 is history 64, which never takes it).
  constexpr bool kRingMmaCompiled =
      kDirect && kW > 1 && sizeof(ActT) == 2 && (kEntries == 1 || kDirectBlocks == 2);
  const bool direct_ring =
      kRingMmaCompiled && direct_ring_mma_ok(sizeof(ActT), p.act_f16, L, kW, kEntries);
  DirectReader<kDirect ? kMode : Mode::shared_fp8, kDirect ? kDirectBlocks : 2, kRingMmaCompiled,
               kRingMmaCompiled ? kEntries : 1>
      direct;
  if constexpr (kDirect) {
    direct.init(readout_codes<kMode>(sec), sec.read_block_scale, h0, P, p.heads_per_block);
    if constexpr (kRingMmaCompiled) {
      if (direct_ring) {
        // Entries 16 s + g and 16 s + 8 + g of this lane (m <= L <= 16 kEntries), at the block's
        // first row.
        auto entry_x = [&](int k) -> const uint16_t* {
          if (k >= m) return nullptr;
          const ActT* rows =
              k < c
                  ? static_cast<const ActT*>(sec.ring_x) + int64_t(ring_index(after, k, L)) * H * P
                  : static_cast<const ActT*>(p.x) + (int64_t(b) * W + (k - c)) * H * P;
          return reinterpret_cast<const uint16_t*>(rows + int64_t(h0) * P);
        };
        const int g8 = threadIdx.x % 32 / 4;
        const uint16_t* x[2 * kEntries];
#pragma unroll
        for (int e = 0; e < 2 * kEntries; ++e) x[e] = entry_x(8 * e + g8);
        direct.init_ring(x, readout_scales<kMode>(sec) + int64_t(h0) * P);
        // The walk requests a tile's ring operands one or two tiles ahead (kRingAhead), too late
        // to hide a DRAM round trip; the committed entries' x rows of the block's heads (one
        // contiguous run per entry) are brought into L2 now, one bulk prefetch per entry.
        if (int(threadIdx.x) < c)
          bulk_prefetch_l2(static_cast<const ActT*>(sec.ring_x) +
                               (int64_t(ring_index(after, threadIdx.x, L)) * H + h0) * P,
                           uint32_t(p.heads_per_block * P * sizeof(ActT)));
      }
    }
    direct.prefetch(direct_ring);
  } else {
    for (int u = 0; u < kStages - 1; ++u) {
      if (u < units)
        issue(u);
      else
        cp_async_commit();  // empty group: the wait count below stays uniform
    }
  }

  // W = 1 and the direct readout: the window's x and every head's deltas are loaded before the
  // staging of B and C, so that their round trips overlap its (phase clocks, H200: a batch-1 step,
  // session 18, the staging took 4500 cycles, its loops one round trip after another; the direct
  // verify at W = 8 batch 64, session 22, 11700 of 48000 cycles). kXAhead x vectors and two
  // (head, entry) deltas per thread are held in registers (at W = 1 every preset has at most 128
  // x vectors and 256 pairs per block); the stores after the staging take any rest from memory.
  constexpr bool kAhead = kW == 1 || kDirect;
  constexpr int kXAhead = kW == 1 ? 2 : 4;
  constexpr int kVec = 16 / sizeof(ActT);  // elements per 16-byte vector
  const int log2_L = __ffs(L) - 1;
  // The block's heads are one contiguous run of x per token, in the input and in the ring: vector
  // u of the window is vector u % x_vectors of token u / x_vectors.
  const int x_vectors = p.heads_per_block * P / kVec, window_vectors = x_vectors * W;
  const int delta_pairs = p.heads_per_block * L;
  auto window_x = [&](int u, bool ring) -> uint4* {
    const int j = kW == 1 ? 0 : u / x_vectors;
    ActT* row =
        ring ? static_cast<ActT*>(sec.ring_x) + int64_t(ring_index(after, c + j, L)) * H * P
             : const_cast<ActT*>(static_cast<const ActT*>(p.x)) + (int64_t(b) * W + j) * H * P;
    return reinterpret_cast<uint4*>(row + int64_t(h0) * P) + (u - j * x_vectors);
  };
  uint4 x_ahead[kXAhead];
  float head_delta_ahead[2];
  float A_ahead = 0.f, D_ahead = 0.f;  // of the head of the thread's first (head, entry) pair
  if constexpr (kAhead) {
    if (int(threadIdx.x) < delta_pairs) {
      A_ahead = p.head.A[h0 + (threadIdx.x >> log2_L)];
      D_ahead = p.head.D[h0 + (threadIdx.x >> log2_L)];
    }
#pragma unroll
    for (int q = 0; q < kXAhead; ++q) {
      const int u = threadIdx.x + q * blockDim.x;
      if (u < window_vectors) x_ahead[q] = *window_x(u, false);
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int t = threadIdx.x + q * blockDim.x, hh = t >> log2_L, k = t & (L - 1);
      // Raw: both loads in flight before either is processed (in store() below); as one call
      // each the loads waited one after the other, behind a branch (H200 session 40, ncu).
      head_delta_ahead[q] =
          t < delta_pairs && k < m ? entry_delta_raw(p, sec, after, b, h0 + hh, k) : 0.f;
    }
  }
  // ---- shared by the heads of the group: B of the entries, C of the window, B_k . C_j
  // The direct readout with 16-bit activations (kRawStage) copies B and C as they are, by
  // cp.async into the space of sm.B and sm.C: every row's copy is in flight at once, where the
  // fp32 staging took two round trips, and both are read only by the tensor cores (the dots and
  // the C fragments), which take 16-bit operands. A one-wave grid (W = 1 at batch 64) overlaps no
  // block's prologue with another block's readout, so each round trip saved is the kernel's.
  constexpr bool kRawStage = kDirect && sizeof(ActT) == 2;
  uint16_t* const b_raw = reinterpret_cast<uint16_t*>(sm.B);  // [L, N] (kRawStage)
  uint16_t* const c_raw = reinterpret_cast<uint16_t*>(sm.C);  // [W, N]
  // The direct readout at W = 1: its ring pass's row scales with the staging
  // (direct_stage_scales), and with 8-bit codes its first entries' x after it (direct_ring_first).
  // The nvfp4 reader holds 4 tiles of codes and their block scales through the prologue: with
  // the first entries' x too, its W = 1 bf16 kernels spilled 76 bytes (sm_90a, -Xptxas -v).
  constexpr bool kRingScalesStaged = kDirect && kW == 1;
  constexpr bool kRingFirstAhead = kRingScalesStaged && kMode != Mode::separate_nvfp4;
  if constexpr (kRingScalesStaged) {
    direct_stage_scales<kMode>(DirectSmem::carve(stages, p.heads_per_block, P, kW, false).gain, sec,
                               h0, P, p.heads_per_block);
    if constexpr (!kRawStage) cp_async_commit();  // else in the raw staging's group below
  }
  if constexpr (kRawStage) {
    // Rows 0..m-1 are the entries' B (committed from the ring, then the window's), rows m.. the
    // window's C; N / 8 vectors of 16 bytes per row (N a power of two).
    const int log2_per_row = __ffs(N / 8) - 1, vectors = (m + W) << log2_per_row;
    for (int u = threadIdx.x; u < vectors; u += blockDim.x) {
      const int r = u >> log2_per_row, v = u & ((1 << log2_per_row) - 1);
      const uint16_t* src;
      uint16_t* dst;
      if (r < m) {
        src = static_cast<const uint16_t*>(r < c ? sec.ring_B : p.B) +
              (r < c ? int64_t(ring_index(after, r, L)) * G + g
                     : (int64_t(b) * W + (r - c)) * G + g) *
                  N;
        dst = b_raw + r * N;
      } else {
        src = static_cast<const uint16_t*>(p.C) + ((int64_t(b) * W + (r - m)) * G + g) * N;
        dst = c_raw + (r - m) * N;
      }
      cp_async16(dst + 8 * v, src + 8 * v);
    }
    cp_async_commit();
  } else {
    const StageSegment<ActT> seg[3] = {
        {sm.B, static_cast<const ActT*>(sec.ring_B) + int64_t(g) * N, int64_t(G) * N, c, N, true,
         nullptr},
        {sm.B + c * N, static_cast<const ActT*>(p.B) + (int64_t(b) * W * G + g) * N, int64_t(G) * N,
         W, N, false, nullptr},
        {sm.C, static_cast<const ActT*>(p.C) + (int64_t(b) * W * G + g) * N, int64_t(G) * N, W, N,
         false, sm.Cr}};
    stage_segments<ActT, has_bf16_readout(kMode), true>(seg, after, L, p.act_f16);  // n = N
  }
  // The window's ring x and delta for this block's heads (raw copies: the ring holds the
  // activation dtype). Logical positions c.. are read by no block of this step.
  {
    if constexpr (kAhead) {
      // The x loaded ahead; the window's deltas go to the ring with the heads' deltas below.
#pragma unroll
      for (int q = 0; q < kXAhead; ++q) {
        const int u = threadIdx.x + q * blockDim.x;
        if (u < window_vectors) *window_x(u, true) = x_ahead[q];
      }
      // The rest (batch 256 at W = 8: 4 vectors per thread more) kXAhead loads at a time before
      // their stores: one vector per iteration waited a round trip each (a store to the ring may
      // alias the next load from the input, so the compiler keeps them in order).
      for (int u0 = threadIdx.x + kXAhead * blockDim.x; u0 < window_vectors;
           u0 += kXAhead * blockDim.x) {
#pragma unroll
        for (int q = 0; q < kXAhead; ++q) {
          const int u = u0 + q * blockDim.x;
          if (u < window_vectors) x_ahead[q] = *window_x(u, false);
        }
#pragma unroll
        for (int q = 0; q < kXAhead; ++q) {
          const int u = u0 + q * blockDim.x;
          if (u < window_vectors) *window_x(u, true) = x_ahead[q];
        }
      }
    } else {
      // One flat loop over (head, token, vector): a loop per token serialised the tokens' loads
      // and stores (H200, W = 8 batch 64 separate-fp8: 196.8 -> 206.8 us).
      const int per_row = P / kVec, total = p.heads_per_block * W * per_row;
      for (int u = threadIdx.x; u < total; u += blockDim.x) {
        const int hh = u / (W * per_row), j = u / per_row % W, i = u % per_row;
        const int h = h0 + hh, phys = ring_index(after, c + j, L);
        reinterpret_cast<uint4*>(static_cast<ActT*>(sec.ring_x) + (int64_t(phys) * H + h) * P)[i] =
            reinterpret_cast<const uint4*>(static_cast<const ActT*>(p.x) +
                                           ((int64_t(b) * W + j) * H + h) * P)[i];
      }
      for (int u = threadIdx.x; u < p.heads_per_block * W; u += blockDim.x) {
        const int h = h0 + u / W, j = u % W;
        sec.ring_delta[ring_index(after, c + j, L) * H + h] =
            entry_delta(p, sec, after, b, h, c + j);
      }
    }
    // Ring B of the group, by the group's first block: the other blocks of the group stage only
    // committed entries (logical < c), and flush_kernel has folded what these positions held.
    // kRawStage: from the staged rows, after the barrier below.
    if (!kRawStage && blockIdx.x == 0) append_window_B<ActT>(p, b, sec, after, g, 1);
  }
  if constexpr (kAhead) {
    // The deltas of every head of the block, loaded ahead of the staging (the window's come from
    // dt, not from the ring positions written here), and the window's into the ring.
    // (head, entry) pairs as t = hh L + k (L a power of two): no division by m.
    auto store = [&](int t, float delta) {
      const int hh = t >> log2_L, k = t & (L - 1);
      if (k >= m) return;
      sm.head_delta[hh * L + k] = delta;
      if (k >= c) sec.ring_delta[ring_index(after, k, L) * H + h0 + hh] = delta;
    };
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int t = threadIdx.x + q * blockDim.x;
      if (t < delta_pairs)
        store(t,
              entry_delta_from_raw(p, after, h0 + (t >> log2_L), t & (L - 1), head_delta_ahead[q]));
    }
    // The rest (history 32 at 16 heads per block) two at a time, loads before stores as above.
    for (int t0 = threadIdx.x + 2 * blockDim.x; t0 < delta_pairs; t0 += 2 * blockDim.x) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int t = t0 + q * blockDim.x, hh = t >> log2_L, k = t & (L - 1);
        head_delta_ahead[q] =
            t < delta_pairs && k < m ? entry_delta(p, sec, after, b, h0 + hh, k) : 0.f;
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int t = t0 + q * blockDim.x;
        if (t < delta_pairs) store(t, head_delta_ahead[q]);
      }
    }
  }
  if constexpr (kRawStage || kRingScalesStaged) cp_async_wait<0>();
  __syncthreads();
  // W = 1: the ring pass's first entries are loaded now, so that their round trip overlaps the
  // dots and the weights (direct_ring_first). The window's x, which this block wrote to the ring
  // above, is visible after the barrier.
  RingPassBatch<ActT> ring_first;
  if constexpr (kRingFirstAhead) direct_ring_first<ActT>(ring_first, p, sec, after, h0, m);
  // The direct readout's next codes into L2 while the block forms its dots and weights
  // (DirectReader::prefetch_l2). H200 session 40, separate-fp8 batch 64 / 256, us per step,
  // against none: 32 KB (256 rows) here 44.4 -> 43.7 / 155.4 -> 152.2 at W = 1, 121.8 ->
  // 121.0 / 435.4 -> 433.3 at W = 8; 32 KB at the block's start or after the staging's issue
  // gained less (W = 8 batch 64 up to +1.4%), 64 and 112 KB after the issue lost 1-9%: L2 holds
  // about 95 KB per resident block, and the prefetch must not delay the prologue's own loads.
  if constexpr (kDirect)
    direct.prefetch_l2(readout_codes<kMode>(sec), h0, P, p.heads_per_block, kDirectL2PrefetchRows);
  constexpr bool kDotsMma = (kW > 1 && sizeof(ActT) == 2) || kRawStage;
  if constexpr (kDotsMma) {
    // On the tensor cores (H200, phase clocks of the direct verify at W = 8 batch 64: the FMA
    // loop below took 11600 of a block's 48000 cycles). The direct readout's C fragments are
    // built beside them by the last warp, which has no 16-entry tile below history 64.
    if constexpr (kRawStage) {
      // C rounded to bf16 (SPEC 5: exact for bf16 activations).
      const bool f16 = p.act_f16;
      build_c_fragments_from<kMode, kDirect>(
          sm,
          [&](int j, int n) {
            const float v = act_f32(c_raw[j * N + n], f16);
            return f16 ? bf16_to_f32(f32_to_bf16(v)) : v;
          },
          N, W, blockDim.x / 32 - 1);
      if (blockIdx.x == 0)  // ring B of the group (above), from the staged rows
        append_window_B_from<ActT>(p, sec, after, g, 1,
                                   reinterpret_cast<const ActT*>(b_raw + c * N), N);
    }
    if (p.act_f16)
      entry_window_dots_mma<true, kRawStage>(sm.B, sm.C, sm.dot, N, L, m, c, W);
    else
      entry_window_dots_mma<false, kRawStage>(sm.B, sm.C, sm.dot, N, L, m, c, W);
  } else {
    // A warp takes kDots entries at a time, so that their reductions' shuffle chains run side by
    // side instead of one after another (each entry's sum is formed as before). The entries are
    // strided over the warps (k = warp + q warps), since k > c + j has no product: consecutive
    // entries per warp left the last warps idle at the window's first columns (H200, batch 1 W = 8:
    // 24.7 -> 25.3 us).
    constexpr int kDots = 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int j = 0; j < W; ++j)
      for (int k0 = warp; k0 < m; k0 += warps * kDots) {
        float d[kDots];
#pragma unroll
        for (int q = 0; q < kDots; ++q) {
          const int k = k0 + q * warps;
          d[q] = 0.f;
          if (k < m && k <= c + j)
            for (int n = lane; n < N; n += 32) d[q] += sm.B[k * N + n] * sm.C[j * N + n];
        }
#pragma unroll
        for (int q = 0; q < kDots; ++q) d[q] = row_sum(d[q], 32);
        if (lane == 0)
#pragma unroll
          for (int q = 0; q < kDots; ++q)
            if (k0 + q * warps < m) sm.dot[j * L + k0 + q * warps] = d[q];
      }
  }
  // Tensor-core path at W > 1: lane k of every warp holds delta_k of the next head whose weights
  // are to be formed (loaded a head ahead); the first head's are formed here.
  float delta_ahead = 0.f;
  if constexpr (kMma && kW > 1 && !kDirect) {
    const int lane = threadIdx.x % 32;
    const float delta_first = lane < m ? entry_delta(p, sec, after, b, h0, lane) : 0.f;
    if (p.heads_per_block > 1 && lane < m)
      delta_ahead = entry_delta(p, sec, after, b, h0 + 1, lane);
    __syncthreads();  // sm.dot
    form_head_weights<kW>(p, sm, h0, delta_first, c, m, 0);
  }
  if constexpr (kW == 1 || kDirect) {
    // The weights of every head of the block, once: per head and unit each lane would form the
    // running sums of its entries itself, the same work in every row group of lanes. Window
    // column j (i = c + j its logical position) gets w_jk = 0 for k > i and for j >= W.
    __syncthreads();  // sm.dot
    const int hpb = p.heads_per_block;
    for (int t = threadIdx.x; t < hpb * L; t += blockDim.x) {
      const int hh = t >> log2_L, k = t & (L - 1);
      if (k >= m) continue;
      const float* dl = sm.head_delta + hh * L;
      const bool ahead = t == int(threadIdx.x);  // the pair whose A and D were loaded ahead
      const float A = ahead ? A_ahead : p.head.A[h0 + hh], D = ahead ? D_ahead : p.head.D[h0 + hh];
      // Running sums over q sequentially, the CPU reference's order: L_k, and L_i at the window's
      // positions i = c + j.
      float run = 0.f, Lk = 0.f, Li[kW];
#pragma unroll 4
      for (int q = 0; q < c; ++q) {
        run += dl[q];
        if (q == k) Lk = run;
      }
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (j < W) {
          run += dl[c + j];
          if (c + j == k) Lk = run;
        }
        Li[j] = run;
      }
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        const int i = c + j;
        float w = 0.f;
        if (j < W && k <= i) w = dl[k] * decay(A * (Li[j] - Lk)) * sm.dot[j * L + k];
        if (j < W && k == i) w += D;
        sm.head_w[(hh * kW + j) * L + k] = w;
      }
      // exp(A L_i) of window position i = k, by the thread of that entry (Li[k - c] is Lk, the
      // same value): one exponential per window entry, where a store under k == c + j in the
      // loop above left an exponential per column in every thread's unrolled code.
      if (k >= c) sm.head_dec[hh * kW + (k - c)] = decay(A * Lk);
    }
  }
  if constexpr (kDirect) {
    if constexpr (!kRawStage) build_c_fragments<kMode, true>(sm, N, W);
    __syncthreads();  // head_w, head_dec, c_frag, c_unscale
    const DirectSmem ds = DirectSmem::carve(stages, p.heads_per_block, P, kW, direct_ring);
    const int64_t y0 = (int64_t(b) * W * H + h0) * P, window_stride = int64_t(H) * P;
    if constexpr (kRingMmaCompiled) {
      if (direct_ring) {
        direct_ring_weights<kW, kEntries>(sm, ds, p.heads_per_block, L, m);
        __syncthreads();  // ring_w
        with_output_type(p.y, p.y_dtype, [&](auto* y) {
          direct.template run<kW, true>(sm.c_frag, ds, y + y0, W, window_stride, &sm, P);
        });
        finish_chained_verify<ActT>(p, b, slot);
        return;
      }
    }
    direct_ring_pass<kMode, ActT, kW, kRingScalesStaged, kRingFirstAhead>(p, sm, ds, sec, after, h0,
                                                                          m, &ring_first);
    __syncthreads();  // gain, ring
    // This block has read all it reads of the ring (the walk reads only the checkpoint), so it
    // arrives now (early_arrival's reasoning), and the entry's last block advances the cursors
    // from the entry's validated copy after its walk: no barrier, fence or atomic round trip
    // after the walk (finish_verify's took about 9% of the W = 1 verify's warp samples, H200
    // session 40, ncu).
    const int ticket = early_arrival(p, b);
    with_output_type(p.y, p.y_dtype, [&](auto* y) {
      direct.template run<kW>(sm.c_frag, ds, y + y0, W, window_stride);
    });
    finish_arrived_verify<ActT>(p, b, slot, G * chunks, e.cursors, ticket);
    return;
  }
  if constexpr (kMma && !kRawStage)
    build_c_fragments<kMode>(sm, N, W);  // read after the loop's barrier
  const RowMap rm(p.lanes_per_row, 1);
  float cr[kMma ? 1 : kW][8];  // the FMA readout's Cr_j (each thread works on 8 columns)
  if constexpr (!kMma) {
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      if (j < W) {
        load8(sm.Cr + j * N + rm.n0, cr[j]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) cr[j][i] = 0.f;
      }
    }
  }

  // One reduction serves kBatch = 8 / kW rows: value q * kW + j is row q's y_j, so a lane
  // reduces 8 values in lanes - 1 shuffles however small W is, and the writers are spread over
  // the lanes (lane_in_row / per_value is the value a lane ends up holding).
  constexpr int kBatch = 8 / kW;
  const int per_value = rm.lanes / 8;
  const int v_out = rm.lane_in_row / per_value, q_out = v_out / kW, j_out = v_out % kW;
  const bool writer = rm.lane_in_row % per_value == 0 && j_out < W;
  float wk[kEntries][kW];  // w_jk (+ D when k = i) of the lane's entries, current head
  float dec[kW];           // exp(A L_i)
  float dl_next[kEntries];
  if constexpr (!kMma && kW > 1) {
#pragma unroll
    for (int t = 0; t < kEntries; ++t)
      dl_next[t] = entry_delta(p, sec, after, b, h0, rm.lane_in_row + t * rm.lanes);
  }
  for (int u = 0; u < units; ++u) {
    __syncthreads();  // the stage issued next was consumed in iteration u - 1 (and sm.dot is set)
    if (u + kStages - 1 < units)
      issue(u + kStages - 1);
    else
      cp_async_commit();
    const int h = h0 + unit_head(u), row0 = unit_row0(u);
    if (kMma && kW > 1 && row0 == 0 && h + 1 < h0 + p.heads_per_block) {
      // The next head's weights into the other buffer (its last reader, head h - 1, finished
      // before the barrier above); this head's were formed one head ago.
      const int lane = threadIdx.x % 32;
      form_head_weights<kW>(p, sm, h + 1, delta_ahead, c, m, (h + 1 - h0) & 1);
      if (h + 2 < h0 + p.heads_per_block && lane < m)
        delta_ahead = entry_delta(p, sec, after, b, h + 2, lane);
    } else if (!kMma && kW == 1 && row0 == 0) {
      const int hh = h - h0;
#pragma unroll
      for (int t = 0; t < kEntries; ++t) {
        const int k = rm.lane_in_row + t * rm.lanes;
        wk[t][0] = k < m ? sm.head_w[hh * L + k] : 0.f;
      }
      dec[0] = sm.head_dec[hh];
    } else if (!kMma && row0 == 0) {
      // Running sums in the CPU reference's order (sequential over k), broadcast from the lanes
      // that own the entries; m is uniform over the block, so every lane takes part.
      const float A = p.head.A[h], D = p.head.D[h];
      float dl[kEntries], Lk[kEntries], Li[kW];
#pragma unroll
      for (int t = 0; t < kEntries; ++t) dl[t] = dl_next[t], Lk[t] = 0.f;
      if (h + 1 < h0 + p.heads_per_block)
#pragma unroll
        for (int t = 0; t < kEntries; ++t)
          dl_next[t] = entry_delta(p, sec, after, b, h + 1, rm.lane_in_row + t * rm.lanes);
#pragma unroll
      for (int j = 0; j < kW; ++j) Li[j] = 0.f;
      float run = 0.f;
#pragma unroll
      for (int t = 0; t < kEntries; ++t) {
        for (int l2 = 0; l2 < rm.lanes && t * rm.lanes + l2 < m; ++l2) {
          const int q = t * rm.lanes + l2;
          run += __shfl_sync(0xffffffffu, dl[t], l2, rm.lanes);
          if (l2 == rm.lane_in_row) Lk[t] = run;
#pragma unroll
          for (int j = 0; j < kW; ++j)
            if (q == c + j) Li[j] = run;
        }
      }
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        dec[j] = j < W ? decay(A * Li[j]) : 0.f;
#pragma unroll
        for (int t = 0; t < kEntries; ++t) {
          const int k = rm.lane_in_row + t * rm.lanes, i = c + j;
          float w = 0.f;
          if (j < W && k <= i) w = dl[t] * decay(A * (Li[j] - Lk[t])) * sm.dot[j * L + k];
          if (j < W && k == i) w += D;
          wk[t][j] = w;
        }
      }
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();  // unit u's bytes, copied by every thread, are in shared memory
    uint8_t* stage = stages + (u % kStages) * vs.bytes;
    const SlotSections view = vs.view(stage);
    const ActT* xs = static_cast<const ActT*>(view.ring_x);
    if constexpr (kMma) {
      const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, tq = threadIdx.x % 4;
      const uint8_t* codes = static_cast<const uint8_t*>(view.rec);
      for (int tile = warp; tile < vs.rows / 16; tile += blockDim.x / 32) {
        const int r_lo = tile * 16 + g, r_hi = r_lo + 8;
        float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (r_lo, r_hi) x windows (2 tq, 2 tq + 1)
        mma_tile<kMode>(codes, vs.code_pitch, vs.code_bytes, view.read_block_scale, vs.block_bytes,
                        tile * 16, sm.c_frag, d);
        if constexpr (kW == 1) {
          // Only window column 0 (lanes tq = 0) is a result. The ring term of rows r_lo and r_hi
          // is spread over the 4 lanes of the row pair: lane tq takes entries tq, tq + 4, ...
          const int hh = h - h0;
          const float* w = sm.head_w + hh * L;
          float ring_lo = 0.f, ring_hi = 0.f;
          for (int k = tq; k < m; k += 4) {
            const float wk = w[k];
            ring_lo += wk * act_f32(xs[k * vs.x_pitch + r_lo], p.act_f16);
            ring_hi += wk * act_f32(xs[k * vs.x_pitch + r_hi], p.act_f16);
          }
          ring_lo += __shfl_xor_sync(0xffffffffu, ring_lo, 1);
          ring_hi += __shfl_xor_sync(0xffffffffu, ring_hi, 1);
          ring_lo += __shfl_xor_sync(0xffffffffu, ring_lo, 2);
          ring_hi += __shfl_xor_sync(0xffffffffu, ring_hi, 2);
          if (tq == 0) {
            const float dec = sm.head_dec[hh] * sm.c_unscale[0];
            const int64_t out = (int64_t(b) * H + h) * P + row0;
            store_scalar(p.y, p.y_dtype, out + r_lo,
                         dec * (view.read_scale[r_lo] * d[0]) + ring_lo);
            store_scalar(p.y, p.y_dtype, out + r_hi,
                         dec * (view.read_scale[r_hi] * d[2]) + ring_hi);
          }
        } else {
          // Values q = (row r_lo, r_hi) x (window 2 tq, 2 tq + 1): each entry's x of the two rows
          // and w of the two windows are read once for the four sums (entries in logical order),
          // or, with bf16 activations, the ring term comes from the tensor cores (whole warp).
          const int j0 = 2 * tq, buf = (h - h0) & 1;  // this head's weights (form_head_weights)
          float ring[4] = {0.f, 0.f, 0.f, 0.f};
          if constexpr (sizeof(ActT) == 2)
            if (ring_mma)
              ring_term_mma<kW>(reinterpret_cast<const uint16_t*>(xs), vs.x_pitch, tile * 16,
                                sm.w + buf * kW * L, L, m, ring);
          if (j0 < kW) {  // else no window column here (the arrays hold kW of them)
            float acc[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int r = q < 2 ? r_lo : r_hi, j = j0 + (q & 1);
              acc[q] =
                  sm.dec[buf * kW + j] * sm.c_unscale[j] * (view.read_scale[r] * d[q]) + ring[q];
            }
            const float* w0 = sm.w + (buf * kW + j0) * L;
            for (int k = 0; !ring_mma && k < m; ++k) {
              const float x_lo = act_f32(xs[k * vs.x_pitch + r_lo], p.act_f16);
              const float x_hi = act_f32(xs[k * vs.x_pitch + r_hi], p.act_f16);
              const float wa = w0[k], wb = w0[L + k];
              acc[0] += wa * x_lo;
              acc[1] += wb * x_lo;
              acc[2] += wa * x_hi;
              acc[3] += wb * x_hi;
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int r = q < 2 ? r_lo : r_hi, j = j0 + (q & 1);
              if (j < W)
                store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j) * H + h) * P + row0 + r, acc[q]);
            }
          }
        }
      }
      continue;
    }
    const int slot_row = threadIdx.x / rm.lanes;  // the thread's row within a pass
    for (int r0 = 0; r0 < vs.rows; r0 += kBatch * rm.rows_per_pass) {
      float part[8];
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        const int rc = min(r0 + q * rm.rows_per_pass + slot_row, vs.rows - 1);
        RawChunk raw;
        load_raw8<kMode>(view, rc, rm.n0, N, false, raw);
        float v[8];
        const float scale = decode_raw8<kMode>(raw, false, v);
        float xk[kEntries];
#pragma unroll
        for (int t = 0; t < kEntries; ++t) {
          const int k = rm.lane_in_row + t * rm.lanes;
          xk[t] = k < m ? act_f32(xs[k * vs.x_pitch + rc], p.act_f16) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) s += v[i] * cr[j][i];
          float acc = dec[j] * scale * s;
#pragma unroll
          for (int t = 0; t < kEntries; ++t) acc += wk[t][j] * xk[t];
          part[q * kW + j] = acc;
        }
      }
      const float y = row_sum_values<8>(part, rm.lane_in_row, rm.lanes);
      const int rr = r0 + q_out * rm.rows_per_pass + slot_row;
      if (writer && rr < vs.rows)
        store_scalar(p.y, p.y_dtype, ((int64_t(b) * W + j_out) * H + h) * P + row0 + rr, y);
    }
  }
  finish_chained_verify<ActT>(p, b, slot);
}

}  // namespace replayssm::cuda
