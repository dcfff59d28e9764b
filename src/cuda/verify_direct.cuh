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
// (direct_ring_pass), into shared memory. The walk is specialised for N (DirectReader<kMode,
// N / 64>): with the column count known, a tile's pieces unroll, C's fragments stay in registers
// and no address is recomputed per piece (a piece-by-piece walk over a run-time N spent about 95
// instructions per piece beside its 4 MMAs and 16 conversions; H200 session 15, ncu: the
// verify's warp instructions 13.3 M -> 8.0 M, W = 1 batch 64 separate-fp8 56.2 -> 49.4 us).
inline constexpr int kDirectDepth = 4;      // pieces (16 rows x 64 codes) in flight per warp
inline constexpr int kDirectMinBlocks = 4;  // blocks per SM the registers aim at

// The modes VerifyVariant::chained_direct is compiled for: 8-bit codes on the tensor cores
// (nvfp4 keeps the staged readout).
__host__ __device__ constexpr bool has_direct_readout(Mode mode) {
  return has_bf16_readout(mode) && mode != Mode::separate_nvfp4;
}
// Whether a shape can take it: 16-row tiles of 128 or 256 columns (DirectReader is specialised
// for the column count; every preset's dstate is one of them).
__host__ __device__ constexpr bool verify_direct_ok(Mode mode, int P, int N) {
  return has_direct_readout(mode) && P % 16 == 0 && (N == 128 || N == 256);
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

// One warp's walk over its tiles (tile w, w + warps, ... of the block's rows; every tile is
// kBlocks 64-column pieces, N = 64 kBlocks): prefetch() requests the first kAhead tiles (before
// the block's prologue), run() reads out every tile and writes y. The walk is tile by tile with
// the pieces of a tile unrolled, and each piece's buffer is reloaded as soon as its codes are
// converted, so that no register moves between buffers and no address is recomputed per piece.
template <Mode kMode, int kBlocks>
struct DirectReader {
  static constexpr int kN = 64 * kBlocks;  // dstate: bytes per code row
  static constexpr int kAhead = kDirectDepth / kBlocks > 0 ? kDirectDepth / kBlocks : 1;
  const uint8_t* next;  // the next tile to request: its row g, byte 16 t
  int64_t stride;       // bytes from one of this warp's tiles to its next
  int tiles;            // this warp's tiles
  DirectPiece buf[kAhead][kBlocks];

  __device__ void init(const uint8_t* codes /* [H * P, kN] */, int h0, int P, int heads) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int all = heads * P / 16;
    tiles = all > warp ? (all - warp + warps - 1) / warps : 0;
    next = codes + (int64_t(h0) * P + 16 * warp + lane / 4) * kN + 16 * (lane % 4);
    stride = int64_t(warps) * 16 * kN;
  }
  __device__ __forceinline__ void request(DirectPiece& q, int blk) const {
    q.lo = __ldcs(reinterpret_cast<const uint4*>(next + 64 * blk));
    q.hi = __ldcs(reinterpret_cast<const uint4*>(next + 64 * blk + 8 * kN));
  }
  __device__ __forceinline__ void prefetch() {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (a < tiles) {
#pragma unroll
        for (int blk = 0; blk < kBlocks; ++blk) request(buf[a][blk], blk);
      }
      next += stride;
    }
  }
  // y: row 0 of head h0 (W = 1), rows [heads * P].
  template <typename YT>
  __device__ __forceinline__ void run(const uint2* c_frag, const DirectSmem& ds, YT* y) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int warps = blockDim.x / 32;
    uint2 cf[4 * kBlocks];  // C's fragment of every k-step, one per lane
#pragma unroll
    for (int s = 0; s < 4 * kBlocks; ++s) cf[s] = c_frag[s * 32 + lane];
    int row = 16 * (threadIdx.x / 32) + g;
    for (int t0 = 0; t0 < tiles; t0 += kAhead) {
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
        if (t0 + a >= tiles) break;
        const bool more = t0 + a + kAhead < tiles;
        float d[4] = {0.f, 0.f, 0.f, 0.f};  // rows (g, g + 8) x window columns (2t, 2t + 1)
#pragma unroll
        for (int blk = 0; blk < kBlocks; ++blk) {
          const uint32_t lo[4] = {buf[a][blk].lo.x, buf[a][blk].lo.y, buf[a][blk].lo.z,
                                  buf[a][blk].lo.w};
          const uint32_t hi[4] = {buf[a][blk].hi.x, buf[a][blk].hi.y, buf[a][blk].hi.z,
                                  buf[a][blk].hi.w};
          uint32_t f[4][4];  // k-step r's A fragment
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            f[r][0] = code8x2_f16x2<kMode>(lo[r], false);
            f[r][1] = code8x2_f16x2<kMode>(hi[r], false);
            f[r][2] = code8x2_f16x2<kMode>(lo[r], true);
            f[r][3] = code8x2_f16x2<kMode>(hi[r], true);
          }
          if (more) request(buf[a][blk], blk);
#pragma unroll
          for (int r = 0; r < 4; ++r)
            mma_f16_16816(d, f[r][0], f[r][1], f[r][2], f[r][3], cf[4 * blk + r]);
        }
        next += stride;
        if (t == 0) {  // window column 0: d[0] (row g), d[2] (row g + 8)
          y[row] = output_from_f32<YT>(ds.gain[row] * d[0] + ds.ring[row]);
          y[row + 8] = output_from_f32<YT>(ds.gain[row + 8] * d[2] + ds.ring[row + 8]);
        }
        row += 16 * warps;
      }
    }
  }
};

}  // namespace replayssm::cuda
