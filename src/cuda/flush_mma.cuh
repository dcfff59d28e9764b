// The flush's fold on the tensor cores, its sums kept in the MMA's registers (separate-fp8, bf16
// activations, dstate 128). Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include "cuda/replay_common.cuh"

namespace replayssm::cuda {

// The fold of one head (SPEC 3, S_m) as a matrix product per 8-row tile of the head's P rows:
//   S[p][n] = d0 S0[p][n] + sum_{k < m} x_k[p] (w_k B_k[n])
//   A = x [8 rows, 16 entries] (the MMA's rows 8-15 zeros): bf16 in the ring, so exact;
//   B = w_k B_k[n] [16 entries, 8 columns] per n-tile, formed in fp32 and split into three bf16
//       parts (hi + mid + lo carry its 24 significant bits: every product with x is exact);
//   C = d0 S0, the decoded carrier scaled as the CPU reference scales it before adding entries.
// Only the fp32 summation order (and x (w B) for (w x) B) differs from flush_head's FMA loop, as
// in the verify's ring term on the tensor cores: a value within a few fp32 ulps of a rounding
// boundary may take the neighbouring code (docs/cuda.md, "CPU against CUDA"). The ring holds
// finite values only (validate_tokens refuses the rest), so the split parts are finite unless
// w_k B_k[n] itself overflows fp32, where the FMA fold's (w_k x_k[p]) B_k[n] would overflow too.
// The MMA's accumulators are the values the encoders take, in the flush's own registers. The
// flush's FMA fold was about a third of its instructions (1288 of 3874 per warp at 16 entries,
// H100 session 62's ncu); fold-mma.patch (session 36) did it on the tensor cores but took the
// sums back into flush_head's row layout through shared memory, which cost more than it saved.
//
// Layout: warp w takes the head's 8-row tiles w, w + 4, ...; lane (g, t) (g = lane / 4,
// t = lane % 4) holds row g of its tile, columns 32 q + 8 t .. 32 q + 8 t + 7 of each 32-column
// quarter q: 4 chunks of 8 contiguous elements, loaded and stored as 16-byte vectors and encoded
// by encode8 as flush_head's chunks are. The MMA's rows 8-15 are zeros in A: their 32 of its
// 64 accumulators would not fit beside the encode (16-row tiles: 128 registers and 92-160 bytes
// of spills, ptxas), and the MMAs are few (48 per tile for 1024 elements). An m16n8k16
// accumulator holds (g, 2 t + i) of its n-tile (i = 0, 1); n-tile 4 q + j is staged with column
// c of its B operand taken from checkpoint column 32 q + 8 (c / 2) + 2 j + c % 2, so that
// (g, 2 t + i) is column 32 q + 8 t + 2 j + i, element 2 j + i of chunk q.
inline constexpr int kFoldMmaN = 128;
inline constexpr int kFoldMmaNTiles = kFoldMmaN / 8;
inline constexpr int kFoldMmaWarps = 4;  // kFlushThreads / 32
// The B fragments: [n-tile][part][lane] uint2, so that a warp reads each as 256 contiguous bytes.
inline constexpr size_t kFoldMmaFragBytes = size_t(kFoldMmaNTiles) * 3 * 32 * sizeof(uint2);

// Whether flush_kernel's whole-head items may take this fold: separate-fp8 (one 8-bit read code
// per element beside the fp16 carrier), bf16 activations (x exact as an operand), the short
// stochastic rounding (its paired draws), dstate 128 (32 values per lane) and at most 16
// committed entries (one k-step: history <= 16). Heads of a multiple of 32 rows, so that every
// warp takes as many 8-row tiles: the GPU tests cover 64 (nemotron-h-8b's, mamba2-2.7b's);
// nemotron3-nano-4b's 80 (10 tiles over 4 warps) was timed (H100 session 73: 4.8-8.2% faster)
// and waits for its GPU test (WholeHeadFlushDecodeMatchesCpu's 80-row case).
__host__ __device__ constexpr bool flush_fold_mma_ok(Mode mode, int act_bytes, bool act_f16,
                                                     bool short_sr, int P, int N, int L) {
  return mode == Mode::separate_fp8 && act_bytes == 2 && !act_f16 && short_sr && P % 32 == 0 &&
         N == kFoldMmaN && L <= 16;
}
// Its shared memory: the fold's (FoldSmem), then the B fragments.
inline size_t flush_fold_mma_smem(int L, int N, int P) {
  return FoldSmem::bytes(L, N, P) + kFoldMmaFragBytes;
}

// Lane (g, t)'s B fragment of n-tile `tile_n`, part by part: w_k B_k[n] at the column that
// accumulator column g of the tile stands for, entries 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1),
// 0 past `count`. The block writes all of them once per head, after stage_fold's barrier.
__device__ __forceinline__ void stage_fold_fragments(const FoldSmem& f, int count, uint2* frag) {
  for (int i = threadIdx.x; i < kFoldMmaNTiles * 32; i += blockDim.x) {
    const int tile_n = i / 32, l = i % 32, lg = l / 4, lt = l % 4;
    const int n = 32 * (tile_n / 4) + 8 * (lg / 2) + 2 * (tile_n % 4) + lg % 2;
    float v[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int k = 2 * lt + (c & 1) + 8 * (c >> 1);
      v[c] = k < count ? f.w[k] * f.B[k * kFoldMmaN + n] : 0.f;
    }
#pragma unroll
    for (int part = 0; part < 3; ++part) {
      const uint32_t b0 = bf16x2_split(v[0], v[1]);
      frag[(tile_n * 3 + part) * 32 + l] = make_uint2(b0, bf16x2_split(v[2], v[3]));
    }
  }
}

// flush_head's whole-head item in this layout (flush_fold_mma_ok holds; check_b as there).
template <typename ActT>
__device__ __forceinline__ void flush_head_mma(const ReplayParams& p, int slot,
                                               const SlotCursors& cur, int h, float* smem,
                                               int check_b) {
  static_assert(sizeof(ActT) == 2, "x must be bf16 to be an exact MMA operand");
  constexpr int N = kFoldMmaN;
  const int P = p.P, tiles = P / 8, count = cur.committed;
  const SlotSections sec = slot_sections(p.geo, slot);
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint16_t* carrier = static_cast<const uint16_t*>(sec.rec);  // [H P, N] fp16
  uint4 raw[4];  // the carrier's chunks of row g of a tile, quarters 0..3
  auto load_tile = [&](int tile) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
      raw[q] = *reinterpret_cast<const uint4*>(
          carrier + chunk_element(int64_t(h) * P + 8 * tile + g, 32 * q + 8 * t, N));
  };
  int tile = threadIdx.x / 32;
  if (tile < tiles) load_tile(tile);
  // As in flush_head: the verdict before the first store, its load beside the staging's.
  const EntryStatus status = check_b >= 0 ? EntryStatus::load(p, check_b) : EntryStatus{};
  const FoldSmem f = FoldSmem::carve(smem, p.L, N, P);
  stage_fold<ActT>(p, sec, cur, count, h, int(p.by_group_heads.div(h)), nullptr, f);
  if (!status.ok()) return;  // uniform over the block
  __syncthreads();
  uint2* frag = reinterpret_cast<uint2*>(smem + FoldSmem::bytes(p.L, N, P) / sizeof(float));
  stage_fold_fragments(f, count, frag);
  __syncthreads();
  const SrContext sr = make_sr(p, cur);
  const float d0 = *f.d0;
  int saturated = 0, nonfinite = 0;
  for (; tile < tiles; tile += kFoldMmaWarps) {  // uniform over the warp
    const int row = 8 * tile + g;
    float v[4][8];  // chunk q: columns 32 q + 8 t ..
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      RawChunk c;
      c.lo = raw[q];
      decode_raw8<Mode::separate_fp8>(c, true, v[q]);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[q][i] *= d0;
    }
    if (tile + kFoldMmaWarps < tiles) load_tile(tile + kFoldMmaWarps);
    // A fragment: x_k[row] at entries 2t, 2t + 1 (a0) and 2t + 8, 2t + 9 (a2); rows 8-15 (a1,
    // a3) zero; 0 past count (the staged rows there are stale).
    uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = 2 * t + 8 * i;
      float x0 = k < count ? f.x_staged[k * P + row] : 0.f;
      float x1 = k + 1 < count ? f.x_staged[(k + 1) * P + row] : 0.f;
      a[2 * i] = bf16x2_split(x0, x1);  // exact: bf16 values
    }
#pragma unroll
    for (int tile_n = 0; tile_n < kFoldMmaNTiles; ++tile_n) {
      const int q = tile_n / 4, j = tile_n % 4;
      float d[4] = {v[q][2 * j], v[q][2 * j + 1], 0.f, 0.f};
#pragma unroll
      for (int part = 0; part < 3; ++part) {
        const uint2 b = frag[(tile_n * 3 + part) * 32 + lane];
        mma_bf16_16816(d, a, b.x, b.y);
      }
      v[q][2 * j] = d[0], v[q][2 * j + 1] = d[1];
    }
    // The encode: flush_head's kPrepFirst path, with the row amax over the row's 4 lanes.
    float lane_amax[4];
    int bad[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) lane_amax[q] = lane_amax8(v[q]);
    sanitize_rows(v, lane_amax, bad);
    float row_max = amax_combine(amax_combine(lane_amax[0], lane_amax[1]),
                                 amax_combine(lane_amax[2], lane_amax[3]));
    row_max = amax_combine(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
    row_max = amax_combine(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
    const int erow = h * P + row;
    // Lanes t and t ^ 1 hold the two halves of one draw group (16 elements) in each quarter.
    SrChunk drawn[4];
    paired_draws<4>(
        t % 2 != 0, [&](int q) { return chunk_element(erow, 32 * q + 8 * t, N); }, sr, drawn);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      EncodePrep prep;
      prep.amax = row_max, prep.pair = 0.f, prep.draw = drawn[q];
      float rv[8];
      // lane_in_row t + 4 q: the row scale is written once, by lane t = 0 at quarter 0.
      encode8<Mode::separate_fp8, true>(sec, erow, 32 * q + 8 * t, N, t + 4 * q, 4, v[q], sr, rv,
                                        &saturated, true, &prep);
      saturated += count_f16_saturated(v[q], row_max);
      nonfinite += bad[q];
    }
  }
  add_encode_stats(p, saturated, nonfinite);
}

}  // namespace replayssm::cuda
