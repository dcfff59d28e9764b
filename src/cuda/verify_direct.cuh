// The W = 1 readout from registers (VerifyVariant::chained_direct).
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/replay_common.cuh"
#include "cuda/verify_mma.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- W = 1 tensor-core readout from registers (VerifyVariant::chained_direct) ---------------
// The staged readout above spends most of a unit's instructions on the staging itself (cp.async
// issue, barriers, the ring term per tile: about 270 of 365 per warp and unit, H200 session 10).
// Here each lane loads its own A fragments from global memory: lane (g, t) reads bytes 16t..
// 16t + 15 of every 64-byte block of rows g and g + 8 of a 16-row tile (the 4 lanes of a row
// read 64 contiguous bytes), and k-step 4 * block + r takes register r of those 16 bytes
// (kslot_col<kMode, true>: a permutation of K applied to C's fragments too). A warp walks its
// tiles (tile w, w + 4, ... of the block's rows; heads are consecutive rows of the checkpoint)
// with kDirectDepth 64-column pieces in flight, and needs no barrier. The ring term and the
// per-row factor of the readout are formed before, for all rows of the block at once
// (direct_ring_pass), into shared memory.
inline constexpr int kDirectDepth = 4;      // pieces (16 rows x 64 codes) in flight per warp
inline constexpr int kDirectMinBlocks = 4;  // blocks per SM the registers aim at

// The modes VerifyVariant::chained_direct is compiled for: 8-bit codes on the tensor cores
// (nvfp4 keeps the staged readout).
__host__ __device__ constexpr bool has_direct_readout(Mode mode) {
  return has_bf16_readout(mode) && mode != Mode::separate_nvfp4;
}
// Whether a shape can take it: 16-row tiles, whole 64-column blocks, a power-of-two number of
// them per row.
__host__ __device__ constexpr bool verify_direct_ok(Mode mode, int P, int N) {
  return has_direct_readout(mode) && P % 16 == 0 && N % 64 == 0 && ((N / 64) & (N / 64 - 1)) == 0;
}

struct DirectPiece {
  uint4 lo, hi;  // 16 codes of rows g and g + 8 of one tile, one 64-column block
};

// Shared memory of the direct readout, after StepSmem: per row r of the block's heads
//   gain[r] = exp(A L_i) * c_unscale * scale_r,   ring[r] = sum_{k < m} w_k x_k[r]
// so that y[r] = gain[r] * (codes_r . C) + ring[r].
struct DirectSmem {
  float* gain;  // [heads_per_block * P]
  float* ring;  // [heads_per_block * P]
  __host__ __device__ static size_t bytes(int heads, int P) {
    return 2 * size_t(heads) * P * sizeof(float);
  }
  __device__ static DirectSmem carve(uint8_t* base, int heads, int P) {
    DirectSmem d;
    d.gain = reinterpret_cast<float*>(base);
    d.ring = d.gain + heads * P;
    return d;
  }
};

// 8 activations from their raw 16-byte vectors (one of 16-bit values, two of fp32).
template <typename ActT>
__device__ __forceinline__ void act8_f32(const uint4 (&raw)[sizeof(ActT) / 2], bool f16,
                                         float (&x)[8]) {
  if constexpr (sizeof(ActT) == 4) {
    const uint32_t w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w,
                           raw[1].x, raw[1].y, raw[1].z, raw[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(w[i]);
  } else {
    const uint32_t w[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = act_f32<ActT>(ActT(w[i] & 0xffffu), f16);
      x[2 * i + 1] = act_f32<ActT>(ActT(w[i] >> 16), f16);
    }
  }
}

// verify_kernel's shared memory in VerifyVariant::chained_direct: no stages, the rows' gains and
// ring terms instead.
inline size_t verify_direct_smem(int L, int N, int P, int heads) {
  return StepSmem::bytes(L, N, 1, heads, true) + DirectSmem::bytes(heads, P);
}

// The ring term and gains of the block's rows (heads h0.., `rows` = heads_per_block * P of them)
// at W = 1. Rows go in vectors of 8 (of one head, P % 8 == 0); `split` adjacent lanes share a
// vector (as many as the block has threads to spare, a power of two), lane j summing entries
// j, j + split, ... before the lanes add their sums. The window's x (k = c) is read from the
// ring, where this block wrote it before the barrier that precedes the call.
template <Mode kMode, typename ActT>
__device__ __forceinline__ void direct_ring_pass(const ReplayParams& p, const StepSmem& sm,
                                                 const DirectSmem& ds, const SlotSections& sec,
                                                 const SlotCursors& after, int h0, int m) {
  const int P = p.P, L = p.L, vectors = p.heads_per_block * P / 8;
  int split = 1;
  while (split < 32 && 2 * split * vectors <= int(blockDim.x)) split *= 2;
  const int j = threadIdx.x % split, per_pass = blockDim.x / split;
  const int64_t entry_stride = int64_t(p.H) * P;  // ring x [L, H, P]
  const ActT* x0 = static_cast<const ActT*>(sec.ring_x) + int64_t(h0) * P;
  const float* scales = (is_separate(kMode) ? sec.read_scale : sec.rec_scale) + int64_t(h0) * P;
  for (int v0 = 0; v0 < vectors; v0 += per_pass) {  // uniform: every lane reaches the shuffles
    const int v = v0 + threadIdx.x / split, r0 = 8 * v;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (v < vectors) {
      const float* w = sm.head_w + r0 / P * L;
      // kBatch entries' loads in flight at once (a runtime-bounded loop would leave the
      // remainder's loads one round trip each).
      constexpr int kBatch = sizeof(ActT) == 2 ? 8 : 4, kVecs = sizeof(ActT) / 2;
      for (int k0 = j; k0 < m; k0 += kBatch * split) {
        uint4 raw[kBatch][kVecs];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int k = k0 + b * split;
          const uint4* src =
              reinterpret_cast<const uint4*>(x0 + ring_index(after, k, L) * entry_stride + r0);
#pragma unroll
          for (int q = 0; q < kVecs; ++q) raw[b][q] = k < m ? src[q] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int k = k0 + b * split;
          if (k >= m) break;
          float x[8];
          act8_f32<ActT>(raw[b], p.act_f16, x);
          const float wk = w[k];
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] += wk * x[i];
        }
      }
    }
    for (int o = split / 2; o > 0; o /= 2)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if (v < vectors && j == 0) {
      float s[8];
      load8(scales + r0, s);
      const float dec = sm.head_dec[r0 / P] * sm.c_unscale[0];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ds.gain[r0 + i] = dec * s[i];
        ds.ring[r0 + i] = acc[i];
      }
    }
  }
}

// One warp's walk over its tiles: prefetch() issues the first kDirectDepth pieces (before the
// block's prologue), run() reads out every tile and writes y.
template <Mode kMode>
struct DirectReader {
  const uint8_t* lane_codes;  // row g of the block's first tile, byte 16 t
  int N, log2_blocks, pieces, warp;
  DirectPiece buf[kDirectDepth];

  __device__ void init(const uint8_t* codes /* [H * P, N] */, int h0, int P, int N_, int heads) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    warp = threadIdx.x / 32;
    N = N_;
    log2_blocks = __ffs(N / 64) - 1;
    const int tiles = heads * P / 16;
    const int mine = tiles > warp ? (tiles - warp + warps - 1) / warps : 0;
    pieces = mine << log2_blocks;
    lane_codes = codes + (int64_t(h0) * P + lane / 4) * N + 16 * (lane % 4);
  }
  __device__ __forceinline__ int tile_of(int piece) const {
    return warp + (piece >> log2_blocks) * int(blockDim.x / 32);
  }
  __device__ __forceinline__ void load(DirectPiece& q, int piece) const {
    const int blk = piece & ((1 << log2_blocks) - 1);
    const uint8_t* src = lane_codes + int64_t(tile_of(piece)) * 16 * N + 64 * blk;
    q.lo = __ldcs(reinterpret_cast<const uint4*>(src));
    q.hi = __ldcs(reinterpret_cast<const uint4*>(src + 8 * N));
  }
  __device__ __forceinline__ void prefetch() {
#pragma unroll
    for (int i = 0; i < kDirectDepth; ++i)
      if (i < pieces) load(buf[i], i);
  }
  // y0: index in p.y of row 0 of head h0 (W = 1).
  __device__ __forceinline__ void run(const ReplayParams& p, const uint2* c_frag,
                                      const DirectSmem& ds, int64_t y0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int last_blk = (1 << log2_blocks) - 1;
    float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (g, g + 8) x window columns (2t, 2t + 1)
    for (int base = 0; base < pieces; base += kDirectDepth) {
#pragma unroll
      for (int i = 0; i < kDirectDepth; ++i) {
        const int piece = base + i;
        if (piece >= pieces) break;
        const int blk = piece & last_blk;
        const DirectPiece q = buf[i];
        if (piece + kDirectDepth < pieces) load(buf[i], piece + kDirectDepth);
        const uint32_t lo[4] = {q.lo.x, q.lo.y, q.lo.z, q.lo.w};
        const uint32_t hi[4] = {q.hi.x, q.hi.y, q.hi.z, q.hi.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
          mma_f16_16816(d, code8x2_f16x2<kMode>(lo[r], false), code8x2_f16x2<kMode>(hi[r], false),
                        code8x2_f16x2<kMode>(lo[r], true), code8x2_f16x2<kMode>(hi[r], true),
                        c_frag[(4 * blk + r) * 32 + lane]);
        if (blk == last_blk) {
          if (t == 0) {  // window column 0: d[0] (row g), d[2] (row g + 8)
            const int r = tile_of(piece) * 16 + g;
            store_scalar(p.y, p.y_dtype, y0 + r, ds.gain[r] * d[0] + ds.ring[r]);
            store_scalar(p.y, p.y_dtype, y0 + r + 8, ds.gain[r + 8] * d[2] + ds.ring[r + 8]);
          }
          d[0] = d[1] = d[2] = d[3] = 0.f;
        }
      }
    }
  }
};

}  // namespace replayssm::cuda
