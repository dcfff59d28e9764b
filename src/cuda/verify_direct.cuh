// The readout from registers (VerifyVariant::chained_direct; which steps take it: replay_launch.h).
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include <algorithm>

#include "cuda/replay_common.cuh"
#include "cuda/verify_mma.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- tensor-core readout from registers (VerifyVariant::chained_direct) ----------------------
// The staged readout above spends most of a unit's instructions on the staging itself (cp.async
// issue, barriers, the ring term per tile: about 270 of 365 per warp and unit, H200 session 10).
// Here each lane loads its own A fragments from global memory: lane (g, t) reads bytes 16t..
// 16t + 15 of every 64-byte block of rows g and g + 8 of a 16-row tile (the 4 lanes of a row
// read 64 contiguous bytes), and k-step 4 * block + r takes register r of those 16 bytes
// (kslot_col<kMode, true>: a permutation of K applied to C's fragments too). A warp walks its
// tiles (tile w, w + 4, ... of the block's rows; heads are consecutive rows of the checkpoint)
// with kDirectDepth 64-column pieces in flight, and needs no barrier. The ring term and the
// per-row factor of the readout are formed before, for all rows of the block at once
// (direct_ring_pass), into shared memory. The walk is specialised for N (DirectReader<kMode,
// N / 64>): with the column count known, a tile's pieces unroll, C's fragments stay in registers
// and no address is recomputed per piece (a piece-by-piece walk over a run-time N spent about 95
// instructions per piece beside its 4 MMAs and 16 conversions; H200 session 15, ncu: the
// verify's warp instructions 13.3 M -> 8.0 M, W = 1 batch 64 separate-fp8 56.2 -> 49.4 us).
// At W > 1 the same MMAs fill the window's columns (n = 8 of the m16n8k16 shape: at W = 1 seven
// of them are zeros), and the ring term of every (row, window) pair is formed before the walk
// like W = 1's, from every head's weights formed at once (StepSmem all_heads). With bf16
// activations and history <= 16, or 32 at dstate 128 (direct_ring_mma_ok), the ring term of
// W > 1 is formed on the tensor cores inside the walk instead, tile by tile (DirectReader<...,
// true>): the A operand is the tile's x of 16 rows x 16 entries per k-step, loaded from global
// memory with the codes (4 bytes of two rows of one entry per lane, transposed by movmatrix), the
// B operand the head's w split in three bf16 parts (direct_ring_weights), the gains formed per
// tile; then windows 5 to 8 take the direct readout too. The ring terms summed by the CUDA cores,
// 8 per row at W = 8, cost more than the staged readout's tensor-core ring term saves (H200
// session 16, batch 64 W = 8 shared-fp8 / separate-fp8: 145.8 / 178.5 us staged, 181.1 / 214.1
// direct; at W = 4 110.6 / 130.4 staged, 102.4 / 122.8 direct), so fp16 activations keep those
// windows staged. separate-nvfp4 reads its 64-byte pieces as 128 columns (8 k-steps) with the
// lane's two block scales (DirectPiece), which its decoder multiplies into the codes (e2m1 times
// e4m3, exact in fp16): batch 64 W = 1 80.8 -> 63.2 us against the staged readout.
inline constexpr int kDirectMaxWindow = 4;  // with the ring term on the CUDA cores
inline constexpr int kDirectDepth = 4;      // pieces (16 rows x 64 codes) in flight per warp
inline constexpr int kDirectMinBlocks = 4;  // blocks per SM the registers aim at
// Code rows per block hinted into L2 after the prologue's staging (verify_kernel; beyond the
// kDirectDepth pieces per warp in registers): 32 KB of 8-bit codes at dstate 128. As 32 KB,
// separate-nvfp4's 64-byte rows took half a block's codes at batch 64 and its steps 0.9-2.0%
// longer there (H200 session 40).
inline constexpr int kDirectL2PrefetchRows = 256;

// The modes VerifyVariant::chained_direct is compiled for: every mode read on the tensor cores
// (8-bit codes and nvfp4).
__host__ __device__ constexpr bool has_direct_readout(Mode mode) { return has_bf16_readout(mode); }
// Whether a shape can take it: 16-row tiles of 128 or 256 columns (DirectReader is specialised
// for the column count; every preset's dstate is one of them).
__host__ __device__ constexpr bool verify_direct_ok(Mode mode, int P, int N) {
  return has_direct_readout(mode) && P % 16 == 0 && (N == 128 || N == 256);
}

// The ring term of W > 1 on the tensor cores in the direct walk: 16-bit activations that are
// bf16 (the A operand's type; fp16 x would need fp16 parts of w, whose range is too short) and at
// most 16 ring entries per k-step of the m16n8k16 shape that the kernel holds operands for
// (entries_per_lane k-steps: verify_kernel's kEntries, 2 only for history 32 at dstate 128).
// windows: W rounded up (kW).
// The k-steps of 16 ring entries the ring term takes at the histories it serves (L <= 32; shared
// memory is sized by it).
__host__ __device__ constexpr int direct_ring_steps(int L) { return L > 16 ? 2 : 1; }
__host__ __device__ constexpr bool direct_ring_mma_ok(int act_bytes, bool act_f16, int L,
                                                      int windows, int entries_per_lane) {
  return windows > 1 && act_bytes == 2 && !act_f16 && L <= 16 * entries_per_lane &&
         direct_ring_steps(L) == entries_per_lane;
}

struct DirectPiece {
  uint4 lo, hi;  // 16 code bytes of rows g and g + 8 of one tile, one 64-byte piece
  uint16_t scales_lo, scales_hi;  // nvfp4: the e4m3 scales of their 2 blocks of 16 columns
};

// Shared memory of the direct readout, after StepSmem: per row r of the block's heads and
// window column j (i = c + j)
//   gain[r][j] = exp(A L_i) * c_unscale_j * scale_r,   ring[r][j] = sum_{k <= i} w_jk x_k[r]
// so that y_j[r] = gain[r][j] * (codes_r . C_j) + ring[r][j]; or, with the ring term on the
// tensor cores (ring_mma), each head's B fragments of w instead (the gains are formed per tile).
struct DirectSmem {
  float* gain;  // [heads_per_block * P, windows]
  float* ring;  // [heads_per_block * P, windows]
  // ring_mma: [heads_per_block, direct_ring_steps(L), 3 parts, 32 lanes] (direct_ring_weights)
  uint2* ring_w;
  __host__ __device__ static size_t bytes(int heads, int P, int windows, bool ring_mma, int L) {
    return ring_mma ? size_t(heads) * direct_ring_steps(L) * 3 * 32 * sizeof(uint2)
                    : 2 * size_t(heads) * P * windows * sizeof(float);
  }
  __device__ static DirectSmem carve(uint8_t* base, int heads, int P, int windows, bool ring_mma) {
    DirectSmem d{};
    if (ring_mma) {
      d.ring_w = reinterpret_cast<uint2*>(base);
    } else {
      d.gain = reinterpret_cast<float*>(base);
      d.ring = d.gain + heads * P * windows;
    }
    return d;
  }
};

// 8 activations from their raw 16-byte vectors (one of 16-bit values, two of fp32).
template <typename ActT>
__device__ __forceinline__ void act8_f32(const uint4 (&raw)[sizeof(ActT) / 2], bool f16,
                                         float (&x)[8]) {
  if constexpr (sizeof(ActT) == 4) {
    convert8_act<ActT>(raw, f16, x);
  } else {  // a select per value: a variant with one uniform branch (and two other changes) was
            // slower (H200 session 38, call 3)
    const uint32_t w[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = act_f32<ActT>(ActT(w[i] & 0xffffu), f16);
      x[2 * i + 1] = act_f32<ActT>(ActT(w[i] >> 16), f16);
    }
  }
}

// verify_kernel's shared memory in VerifyVariant::chained_direct (windows: W rounded up to 1,
// kDirectMaxWindow or 8): no stages, every head's weights and the rows' gains and ring terms
// instead, or with ring_mma each head's B fragments of w (DirectSmem).
inline size_t verify_direct_smem(int L, int N, int P, int heads, int windows, bool ring_mma) {
  return StepSmem::bytes(L, N, windows, heads, true, true) +
         DirectSmem::bytes(heads, P, windows, ring_mma, L);
}
// The most shared memory a direct readout block takes: its gains and ring terms grow with the
// window (2 W floats per row), so a block of many long heads would need more than it should take
// (a block of falcon-h1-7b's 24 heads of 128 rows needs about 133 KB at W = 4); such steps keep
// the staged readout.
inline constexpr size_t kDirectMaxSmem = 100 * 1024;
inline bool verify_direct_fits(int L, int N, int P, int heads, int windows, bool ring_mma) {
  return verify_direct_smem(L, N, P, heads, windows, ring_mma) <= kDirectMaxSmem;
}
// The larger of the two forms' shared memory: what a kernel is prepared for, whichever form its
// launches take.
inline size_t verify_direct_smem_any(int L, int N, int P, int heads, int windows) {
  return std::max(verify_direct_smem(L, N, P, heads, windows, false),
                  verify_direct_smem(L, N, P, heads, windows, true));
}

// How direct_ring_pass spreads the block's rows over its threads: in vectors of 8 rows (of one
// head, P % 8 == 0), `split` adjacent lanes sharing a vector (as many as the block has threads to
// spare, a power of two), lane j of them summing entries j, j + split, ...; per_pass vectors per
// pass of the block's threads.
struct RingPassLanes {
  int vectors, split, j, per_pass;
  __device__ __forceinline__ explicit RingPassLanes(const ReplayParams& p)
      : vectors(p.heads_per_block * p.P / 8), split(1) {
    while (split < 32 && 2 * split * vectors <= int(blockDim.x)) split *= 2;
    j = threadIdx.x % split;
    per_pass = blockDim.x / split;
  }
};

// One batch of a thread's ring entries in direct_ring_pass: kBatch entries' loads in flight at
// once (a runtime-bounded loop would leave the remainder's loads one round trip each).
template <typename ActT>
struct RingPassBatch {
  static constexpr int kBatch = sizeof(ActT) == 2 ? 8 : 4, kVecs = sizeof(ActT) / 2;
  uint4 raw[kBatch][kVecs];  // entry k0 + b split of the 8 rows, as stored (zeros past m)
  // x0: ring x [L, H, P] at the block's first row; rows r0.. of entries k0, k0 + split, ...
  __device__ __forceinline__ void load(const ActT* x0, const SlotCursors& after, int L,
                                       int64_t entry_stride, int r0, int k0, int split, int m) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int k = k0 + b * split;
      const uint4* src =
          reinterpret_cast<const uint4*>(x0 + ring_index(after, k, L) * entry_stride + r0);
#pragma unroll
      for (int q = 0; q < kVecs; ++q) raw[b][q] = k < m ? src[q] : make_uint4(0, 0, 0, 0);
    }
  }
};

// The ring x of the block's first heads (x0 of RingPassBatch::load).
template <typename ActT>
__device__ __forceinline__ const ActT* ring_pass_x0(const SlotSections& sec, int h0, int P) {
  return static_cast<const ActT*>(sec.ring_x) + int64_t(h0) * P;
}

// The first batch of the thread's first vector in direct_ring_pass, loaded ahead by the caller
// (kFirstAhead): at W = 1 it is issued before the block forms its dots and weights, so that its
// round trip overlaps them instead of following them (nothing it reads is written after the
// staging's barrier).
template <typename ActT>
__device__ __forceinline__ void direct_ring_first(RingPassBatch<ActT>& first, const ReplayParams& p,
                                                  const SlotSections& sec, const SlotCursors& after,
                                                  int h0, int m) {
  const RingPassLanes lanes(p);
  const int v = threadIdx.x / lanes.split;
  if (v < lanes.vectors)
    first.load(ring_pass_x0<ActT>(sec, h0, p.P), after, p.L, int64_t(p.H) * p.P, 8 * v, lanes.j,
               lanes.split, m);
}

// W = 1: the rows' scales of the readout copied by cp.async into the place of their gains
// (DirectSmem::gain, [heads * P] at W = 1) with the prologue's staging, where the ring pass
// (kScalesStaged) reads them: loaded by the ring pass after its sums, they were one DRAM round
// trip more at the end of the prologue.
template <Mode kMode>
__device__ __forceinline__ void direct_stage_scales(float* gain, const SlotSections& sec, int h0,
                                                    int P, int heads) {
  const float* scales = readout_scales<kMode>(sec) + int64_t(h0) * P;
  for (int u = threadIdx.x; u < heads * P / 4; u += blockDim.x)
    cp_async16(gain + 4 * u, scales + 4 * u);
}

// The ring terms and gains of the block's rows (heads h0.., heads_per_block * P rows) for the
// window's columns j < W, rows in vectors of 8 (RingPassLanes). The windows go in groups of kJ,
// each a pass over the entries (8 kJ accumulators: the DirectReader's first tiles are held in
// registers through this). The window's x (k >= c) is read from the ring, where this block wrote
// it before the barrier that precedes the call; w_jk is 0 for k > i, so every pass sums k < m.
// W = 1 only: kScalesStaged, the rows' scales are in the gains' place (direct_stage_scales);
// kFirstAhead, the first batch of the thread's first vector is `first` (direct_ring_first).
template <Mode kMode, typename ActT, int kW, bool kScalesStaged = false, bool kFirstAhead = false>
__device__ __forceinline__ void direct_ring_pass(const ReplayParams& p, const StepSmem& sm,
                                                 const DirectSmem& ds, const SlotSections& sec,
                                                 const SlotCursors& after, int h0, int m,
                                                 const RingPassBatch<ActT>* first = nullptr) {
  static_assert((!kScalesStaged && !kFirstAhead) || kW == 1,
                "staged scales and the first batch ahead: W = 1 (one window group)");
  constexpr int kJ = kW < 2 ? kW : 2;
  using Batch = RingPassBatch<ActT>;
  const int P = p.P, L = p.L, W = p.tokens;
  const RingPassLanes lanes(p);
  const int vectors = lanes.vectors, split = lanes.split, j = lanes.j, per_pass = lanes.per_pass;
  const int64_t entry_stride = int64_t(p.H) * P;  // ring x [L, H, P]
  const ActT* x0 = ring_pass_x0<ActT>(sec, h0, P);
  // The rows' scales: in the gains' place when staged (direct_stage_scales), else the checkpoint's.
  const float* scales = kScalesStaged ? ds.gain : readout_scales<kMode>(sec) + int64_t(h0) * P;
  for (int v0 = 0; v0 < vectors; v0 += per_pass) {  // uniform: every lane reaches the shuffles
    const int v = v0 + threadIdx.x / split, r0 = 8 * v, hh = r0 / P;
    for (int j0 = 0; j0 < W; j0 += kJ) {
      float acc[kJ][8];
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[jj][i] = 0.f;
      if (v < vectors) {
        const float* w = sm.head_w + (hh * kW + j0) * L;  // [kJ, L] of this head
        for (int k0 = j; k0 < m; k0 += Batch::kBatch * split) {
          Batch batch;
          if (kFirstAhead && v0 == 0 && j0 == 0 && k0 == j)
            batch = *first;
          else
            batch.load(x0, after, L, entry_stride, r0, k0, split, m);
#pragma unroll
          for (int b = 0; b < Batch::kBatch; ++b) {
            const int k = k0 + b * split;
            if (k >= m) break;
            float x[8];
            act8_f32<ActT>(batch.raw[b], p.act_f16, x);
#pragma unroll
            for (int jj = 0; jj < kJ; ++jj) {
              const float wk = w[jj * L + k];
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[jj][i] += wk * x[i];
            }
          }
        }
      }
      for (int o = split / 2; o > 0; o /= 2)
#pragma unroll
        for (int jj = 0; jj < kJ; ++jj)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[jj][i] += __shfl_xor_sync(0xffffffffu, acc[jj][i], o);
      if (v < vectors && j == 0) {
        float s[8];
        load8(scales + r0, s);
        if constexpr (kW == 1) {
          // Two 16-byte stores per array (2-way bank conflicts): 8 scalar stores per lane, the
          // lanes' rows 8 floats apart, were 8-way conflicts (H200 session 40, ncu, W = 1 batch
          // 64 separate-fp8: 229 K of the verify's 271 K excess shared-memory wavefronts).
          const float dec = sm.head_dec[hh] * sm.c_unscale[0];
          float4* gain = reinterpret_cast<float4*>(ds.gain + r0);
          float4* ring = reinterpret_cast<float4*>(ds.ring + r0);
          gain[0] = make_float4(dec * s[0], dec * s[1], dec * s[2], dec * s[3]);
          gain[1] = make_float4(dec * s[4], dec * s[5], dec * s[6], dec * s[7]);
          ring[0] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
          ring[1] = make_float4(acc[0][4], acc[0][5], acc[0][6], acc[0][7]);
        } else {
#pragma unroll
          for (int jj = 0; jj < kJ; ++jj) {
            const int jw = j0 + jj;
            if (jw >= W) break;
            const float dec = sm.head_dec[hh * kW + jw] * sm.c_unscale[jw];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              ds.gain[(r0 + i) * kW + jw] = dec * s[i];
              ds.ring[(r0 + i) * kW + jw] = acc[jj][i];
            }
          }
        }
      }
    }
  }
}

// ring_mma: each head's w as the B operand of ring_term_mma's shape, k-step s of 16 entries
// (RingWeightParts at entries 16 s..: three bf16 parts per lane; 0 past m and for j >= W, where
// head_w holds 0), at ring_w[head, s, part, lane].
template <int kW, int kSteps>
__device__ __forceinline__ void direct_ring_weights(const StepSmem& sm, const DirectSmem& ds,
                                                    int heads, int L, int m) {
  for (int i = threadIdx.x; i < heads * kSteps * 32; i += blockDim.x) {
    const int hs = i / 32, hh = hs / kSteps, k0 = 16 * (hs % kSteps), lane = i % 32;
    RingWeightParts<kW> parts(sm.head_w + hh * kW * L, L, k0, m, lane);
#pragma unroll
    for (int part = 0; part < 3; ++part) ds.ring_w[(hs * 3 + part) * 32 + lane] = parts.next();
  }
}

// ring_mma: what a tile's ring term and gains need beside its codes, loaded with them. x[4 s + i]
// is 4 bytes of entry 16 s + g (i < 2) or 16 s + 8 + g, rows 2t, 2t + 1 (+ 8 for odd i) of the
// tile: a fragment of the 8 x 8 matrix [entry][row], which movmatrix transposes into the A
// fragment of k-step s.
template <int kSteps>
struct DirectRingX {
  uint32_t x[4 * kSteps];
  float scale[2];  // the row scales of rows g and g + 8
};

// One warp's walk over its tiles (tile w, w + warps, ... of the block's rows; N = 64 kBlocks
// columns, a row of kRowBytes code bytes in 64-byte pieces: 64 columns of 8-bit codes, 128 of
// nvfp4): prefetch() requests the first kAhead tiles (before the block's prologue), run() reads
// out every tile and writes y. The walk is tile by tile with a tile's pieces unrolled, and each
// piece's buffer is reloaded as soon as its codes are converted, so that no register moves
// between buffers and no address is recomputed per piece. nvfp4: lane t's 32 codes of a row
// piece are 2 blocks of 16 (2t, 2t + 1 of the piece's 8), whose e4m3 scales come with the piece.
// kRingMma: the walk can also form the ring term on the tensor cores (init_ring, run<kW, true>),
// over kRingSteps k-steps of 16 ring entries.
template <Mode kMode, int kBlocks, bool kRingMma = false, int kRingSteps = 1>
struct DirectReader {
  static constexpr bool kFp4 = kMode == Mode::separate_nvfp4;
  static constexpr int kN = 64 * kBlocks;                 // dstate
  static constexpr int kRowBytes = kFp4 ? kN / 2 : kN;    // code bytes per row
  static constexpr int kPieces = kRowBytes / 64;          // per row (and tile)
  static constexpr int kSteps = kFp4 ? 8 : 4;             // k-steps of 16 columns per piece
  static constexpr int kScaleBytes = kFp4 ? kN / 16 : 0;  // nvfp4 block scales per row
  static constexpr int kAhead = kDirectDepth / kPieces > 0 ? kDirectDepth / kPieces : 1;
  // Tiles whose ring operands are in flight (kRingMma): at most 2, 6 registers each. The nvfp4
  // walk at dstate 128 holds 4 tiles of codes; with as many of ring operands its kW = 4 and 8
  // kernels spilled 308-552 bytes at 128 registers (sm_90a, -Xptxas -v), and their steps took
  // 5-14% longer (batch 64-256, H200 session 20).
  // With two k-steps a tile's operands take 10 registers, and one tile of them is in flight.
  static constexpr int kRingAhead = kRingSteps > 1 ? 1 : kAhead < 2 ? kAhead : 2;
  static_assert(kAhead % kRingAhead == 0,
                "run() finds a tile's ring slot from its place in kAhead");
  static_assert(kPieces >= 1, "a row of at least 64 code bytes");
  const uint8_t* next;         // the next tile to request: its row g, byte 16 t
  const uint8_t* next_scales;  // nvfp4: the same tile's row g, block 2 t
  int64_t stride;              // code bytes from one of this warp's tiles to its next
  int tiles;                   // this warp's tiles
  DirectPiece buf[kAhead][kPieces];
  // kRingMma, after init_ring: entries 16 s + g and 16 s + 8 + g of this lane (x_entry[2 s],
  // x_entry[2 s + 1]) at its first tile's row 2t (nullptr past m), the row scales at its row g;
  // tile i of the warp is rows 16 warps i on.
  const uint16_t* x_entry[2 * kRingSteps] = {};
  const float* row_scale = nullptr;
  DirectRingX<kRingSteps> ring_buf[kRingMma ? kRingAhead : 1];

  // codes [H * P, kRowBytes], block_scales [H * P, kN / 16] (nvfp4; else unused)
  __device__ void init(const uint8_t* codes, const uint8_t* block_scales, int h0, int P,
                       int heads) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int all = heads * P / 16;
    tiles = all > warp ? (all - warp + warps - 1) / warps : 0;
    const int64_t row = int64_t(h0) * P + 16 * warp + lane / 4;
    next = codes + row * kRowBytes + 16 * (lane % 4);
    next_scales = kFp4 ? block_scales + row * kScaleBytes + 2 * (lane % 4) : nullptr;
    stride = int64_t(warps) * 16 * kRowBytes;
  }
  __device__ __forceinline__ void request(DirectPiece& q, int pc) const {
    q.lo = __ldcs(reinterpret_cast<const uint4*>(next + 64 * pc));
    q.hi = __ldcs(reinterpret_cast<const uint4*>(next + 64 * pc + 8 * kRowBytes));
    if constexpr (kFp4) {
      q.scales_lo = *reinterpret_cast<const uint16_t*>(next_scales + 8 * pc);
      q.scales_hi = *reinterpret_cast<const uint16_t*>(next_scales + 8 * pc + 8 * kScaleBytes);
    }
  }
  // The ring term's operands (kRingMma): x[2 s], x[2 s + 1] the rows of entries 16 s + g and
  // 16 s + 8 + g at the block's first row (nullptr: 0), scales the block's row scales.
  __device__ void init_ring(const uint16_t* const (&x)[2 * kRingSteps], const float* scales) {
    const int lane = threadIdx.x % 32, first = 16 * (threadIdx.x / 32);
#pragma unroll
    for (int e = 0; e < 2 * kRingSteps; ++e)
      x_entry[e] = x[e] ? x[e] + first + 2 * (lane % 4) : nullptr;
    row_scale = scales + first + lane / 4;
  }
  // The operands of this warp's tile i. The row offset is formed from i, not carried from tile to
  // tile: with a running offset the nvfp4 kW = 4 and 8 kernels spilled 48-284 bytes (sm_90a).
  __device__ __forceinline__ void request_ring(DirectRingX<kRingSteps>& q, int i) const {
    const int rows = i * 16 * (blockDim.x / 32);
#pragma unroll
    for (int v = 0; v < 4 * kRingSteps; ++v) {
      const uint16_t* e = x_entry[v >> 1];
      q.x[v] = e ? *reinterpret_cast<const uint32_t*>(e + rows + 8 * (v & 1)) : 0u;
    }
    q.scale[0] = row_scale[rows];
    q.scale[1] = row_scale[rows + 8];
  }
  // Hints that up to `rows` of the block's code rows after those the warps request first
  // (prefetch) be brought into L2, in 4 KB pieces spread over the block's threads (codes as in
  // init).
  __device__ void prefetch_l2(const uint8_t* codes, int h0, int P, int heads, int rows) const {
    const int64_t block = int64_t(heads) * P * kRowBytes;
    const int64_t begin = min(block, int64_t(kAhead) * (blockDim.x / 32) * 16 * kRowBytes);
    const int64_t end = min(block, begin + int64_t(rows) * kRowBytes);
    const uint8_t* base = codes + int64_t(h0) * P * kRowBytes;
    for (int64_t o = begin + 4096 * int64_t(threadIdx.x); o < end; o += 4096 * int64_t(blockDim.x))
      bulk_prefetch_l2(base + o, uint32_t(min(int64_t(4096), end - o)));
  }
  __device__ __forceinline__ void advance() {
    next += stride;
    if constexpr (kFp4) next_scales += stride / kRowBytes * kScaleBytes;
  }
  // ring: the ring term's operands too (after init_ring).
  __device__ __forceinline__ void prefetch(bool ring = false) {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (a < tiles) {
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) request(buf[a][pc], pc);
        if constexpr (kRingMma)
          if (ring && a < kRingAhead) request_ring(ring_buf[a], a);
      }
      advance();
    }
  }
  // A piece's A fragments, k-step s of the piece in f[s] (kslot_col<kMode, true>).
  __device__ __forceinline__ void convert(const DirectPiece& q, uint32_t (&f)[kSteps][4]) const {
    const uint32_t lo[4] = {q.lo.x, q.lo.y, q.lo.z, q.lo.w};
    const uint32_t hi[4] = {q.hi.x, q.hi.y, q.hi.z, q.hi.w};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if constexpr (kFp4) {
        // Register r: columns 8 r.. of the lane's 32, in block 2 t + r / 2 of the piece.
        const __half2 s_lo = e4m3_half2(uint8_t(q.scales_lo >> (8 * (r / 2))));
        const __half2 s_hi = e4m3_half2(uint8_t(q.scales_hi >> (8 * (r / 2))));
        uint32_t l[4], h[4];  // columns (0, 2), (4, 6), (1, 3), (5, 7) of the register's 8
        e2m1x8_f16x2(lo[r], s_lo, l);
        e2m1x8_f16x2(hi[r], s_hi, h);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {  // even columns, then odd ones
          f[2 * r + kk][0] = l[2 * kk];
          f[2 * r + kk][1] = h[2 * kk];
          f[2 * r + kk][2] = l[2 * kk + 1];
          f[2 * r + kk][3] = h[2 * kk + 1];
        }
      } else {
        f[r][0] = code8x2_f16x2<kMode>(lo[r], false);
        f[r][1] = code8x2_f16x2<kMode>(hi[r], false);
        f[r][2] = code8x2_f16x2<kMode>(lo[r], true);
        f[r][3] = code8x2_f16x2<kMode>(hi[r], true);
      }
    }
  }
  // y: row 0 of head h0 in window column 0, rows [heads * P], window column j at j *
  // window_stride (kW: W rounded up to 1, kDirectMaxWindow or 8). kRing: the ring term on the
  // tensor cores from the operands prefetched with the codes (gains from sm, heads of P rows);
  // else the gains and ring terms of direct_ring_pass.
  template <int kW, bool kRing = false, typename YT>
  __device__ __forceinline__ void run(const uint2* c_frag, const DirectSmem& ds, YT* y, int W,
                                      int64_t window_stride, const StepSmem* sm = nullptr,
                                      int P = 0) {
    static_assert(!kRing || (kRingMma && kW > 1), "the ring term on the tensor cores: W > 1");
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int warps = blockDim.x / 32;
    uint2 cf[kSteps * kPieces];  // C's fragment of every k-step (N / 16), one per lane
#pragma unroll
    for (int s = 0; s < kSteps * kPieces; ++s) cf[s] = c_frag[s * 32 + lane];
    int row = 16 * (threadIdx.x / 32) + g;
    int head = 0, in_head = row - g;  // kRing: the tile's head in the block, its first row there
    if constexpr (kRing)
      while (in_head >= P) in_head -= P, ++head;
    for (int t0 = 0; t0 < tiles; t0 += kAhead) {
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
        if (t0 + a >= tiles) break;
        const bool more = t0 + a + kAhead < tiles;
        float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (g, g + 8) x window columns (2t, 2t + 1)
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) {
          uint32_t f[kSteps][4];
          convert(buf[a][pc], f);
          if (more) request(buf[a][pc], pc);
#pragma unroll
          for (int s = 0; s < kSteps; ++s)
            mma_f16_16816(d, f[s][0], f[s][1], f[s][2], f[s][3], cf[kSteps * pc + s]);
        }
        if constexpr (kRing) {
          // ring_q = sum_k x_k[r] w_jk for rows (g, g + 8) x columns (2t, 2t + 1), as d.
          // Tile t0 + a's slot: t0 is a multiple of kAhead, and so of kRingAhead.
          const DirectRingX<kRingSteps> rx = ring_buf[a % kRingAhead];
          if (t0 + a + kRingAhead < tiles)
            request_ring(ring_buf[a % kRingAhead], t0 + a + kRingAhead);
          float ring[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int s = 0; s < kRingSteps; ++s) {
            uint32_t xa[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) xa[i] = movmatrix_trans(rx.x[4 * s + i]);
#pragma unroll
            for (int part = 0; part < 3; ++part) {
              const uint2 b = ds.ring_w[((head * kRingSteps + s) * 3 + part) * 32 + lane];
              mma_bf16_16816(ring, xa, b.x, b.y);
            }
          }
          // Its own store loop beside the one below: one loop for both forms, choosing gain and
          // ring term per form, made separate-fp8's steps 2% slower (H200 session 20).
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = row + 8 * (q >> 1), j = 2 * t + (q & 1);
            if (j < W) {
              const float gain = sm->head_dec[head * kW + j] * sm->c_unscale[j] * rx.scale[q >> 1];
              y[j * window_stride + r] = output_from_f32<YT>(gain * d[q] + ring[q]);
            }
          }
          advance();
          row += 16 * warps;
          for (in_head += 16 * warps; in_head >= P; in_head -= P) ++head;
          continue;
        }
        advance();
        if constexpr (kW == 1) {
          if (t == 0) {  // window column 0: d[0] (row g), d[2] (row g + 8)
            y[row] = output_from_f32<YT>(ds.gain[row] * d[0] + ds.ring[row]);
            y[row + 8] = output_from_f32<YT>(ds.gain[row + 8] * d[2] + ds.ring[row + 8]);
          }
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) {  // rows (g, g + 8) x window columns (2t, 2t + 1)
            const int r = row + 8 * (q >> 1), j = 2 * t + (q & 1);
            if (j < W)
              y[j * window_stride + r] =
                  output_from_f32<YT>(ds.gain[r * kW + j] * d[q] + ds.ring[r * kW + j]);
          }
        }
        row += 16 * warps;
      }
    }
  }
};

}  // namespace replayssm::cuda
