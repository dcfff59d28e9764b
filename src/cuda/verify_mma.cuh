// The verify's tensor-core readout (the 8/4-bit read modes) and the W > 1 weights.
// Part of the replay kernels; replay_kernels.cuh has the overview.
#pragma once

#include <type_traits>

#include "cuda/replay_common.cuh"
#include "cuda/verify_staging.cuh"

namespace replayssm::cuda {

// ---- tensor-core readout (the 8/4-bit read modes, every window) ------------------------------
// R C_j for a 16-row tile and the 8 window columns j with mma.sync m16n8k16 in fp16 with fp32
// accumulation. fp16 holds every decoded value exactly: e4m3 and int8 codes as they are, and
// nvfp4's e2m1 x e4m3 block scale at 2^-6 (multiples of 2^-16 below 42). C_j, rounded to bf16
// (SPEC 5), goes in at a power-of-two scale 2^s_j that puts its largest magnitude in
// [2^14, 2^15): fp16 then holds every element down to 2^-31 of the largest exactly (a bf16
// value needs 8 significant bits above fp16's 2^-24 step); a smaller one is rounded by at most
// 2^-39 of the largest, far below fp32's rounding of the sum. The products are exact and summed
// in fp32, so only the summation order differs from the CPU reference's readout.
// A dot product is invariant under a permutation of K applied to both operands, so each lane's
// k-slots are mapped to the columns its ldmatrix delivers (kslot_col): lane (g, t) feeds
// k-slots {2t, 2t+1} and {2t+8, 2t+9} of k-step s with 4 columns of rows g and g+8, and its B
// fragment (the shared-memory c_frag) holds C_g at the same columns.

// First column of k-slots {2t, 2t+1} (half 0) or {2t+8, 2t+9} (half 1) of k-step s, lane t; the
// second is kslot_pair_step columns further.
// 8-bit codes: an ldmatrix row of 16 bytes is one k-step, lane t gets its columns 4t..4t+3.
// nvfp4: 16 bytes are 32 columns, two k-steps; lane t gets columns 8t..8t+7 of them, whose even
// columns (0, 2 | 4, 6) feed the first k-step and odd ones (1, 3 | 5, 7) the second
// (e2m1x8_f16x2: one byte per code, converted in pairs).
// Direct (DirectReader): lane t loads bytes 16t.. of every 64-byte block of its rows, whose
// register r (4 columns) feeds k-step 4 * block + r; nvfp4: register r holds 8 columns, 2
// k-steps (8 * block + 2r + kk) as above, a block being 128 columns.
template <Mode kMode, bool kDirect = false>
__device__ __forceinline__ int kslot_col(int s, int t, int half) {
  if constexpr (kDirect && kMode == Mode::separate_nvfp4)
    return 128 * (s / 8) + 32 * t + 8 * (s % 8 / 2) + s % 2 + 4 * half;
  if constexpr (kDirect) return 64 * (s / 4) + 16 * t + 4 * (s % 4) + 2 * half;
  if constexpr (kMode == Mode::separate_nvfp4) return 32 * (s / 2) + 8 * t + s % 2 + 4 * half;
  return 16 * s + 4 * t + 2 * half;
}
template <Mode kMode>
constexpr int kslot_pair_step = kMode == Mode::separate_nvfp4 ? 2 : 1;

// Factor from the fp16 values of a mode's A fragments to code values (nvfp4's decoder gives
// e2m1 x 2^-6).
template <Mode kMode>
constexpr float kFragUnscale = kMode == Mode::separate_nvfp4 ? kE2m1E4m3Unscale : 1.f;

// B fragments of the window's C (rounded to bf16; c_at(j, n) gives C_j[n]) into sm.c_frag, and
// into sm.c_unscale[j] what turns column j's fp32 results back to code x C units. Warp `warp`;
// the caller puts a barrier between this and the readout. Lane (g, t) starts at k-step
// (t + g) % steps. At one k-step the 32 lanes' columns fall in one or two shared-memory banks
// (rows of N floats or 16-bit values start in the same bank, and kslot_col's lane term is a
// multiple of 16 columns), a 16- to 32-way conflict per load (H200, the direct verify at W = 8
// batch 64: nvfp4's dots and C fragments phase took 7000 cycles to separate-fp8's 2400).
// Counted per load over every k-step: starting at lane % steps left the 8 window columns (g) of
// one t in one bank, 8-way in the 8-bit layouts; (t + g) % steps spreads them, 2-way for 16-bit
// C (the raw staging) and 4-way for fp32 C in the 8-bit layouts. nvfp4's direct layout stays
// 4-way under any start (its bank depends on s % 8 alone). Every fragment gets the same values
// whatever the order; the amax is a max.
template <Mode kMode, bool kDirect, typename CAt>
__device__ __forceinline__ void build_c_fragments_from(const StepSmem& sm, CAt&& c_at, int N, int W,
                                                       int warp) {
  if (int(threadIdx.x / 32) != warp) return;
  constexpr int kStep = kslot_pair_step<kMode>;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, steps = N / 16;
  const int first = (t + g) % steps;
  auto step = [&](int i) { return i + first < steps ? i + first : i + first - steps; };
  float amax = 0.f;
  if (g < W)  // window column g (rows of C exist for g < W only)
    for (int i = 0; i < steps; ++i)
      for (int half = 0; half < 2; ++half) {
        const int col = kslot_col<kMode, kDirect>(step(i), t, half);
        amax = fmaxf(amax, fmaxf(fabsf(c_at(g, col)), fabsf(c_at(g, col + kStep))));
      }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the 4 lanes of column g cover
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));  // all N columns between them
  const int shift = fp16_window_shift(amax);  // amax finite: the inputs were validated
  const float scale = pow2_f32(shift);
  for (int i = 0; i < steps; ++i) {
    const int s = step(i);
    uint2 frag = {0u, 0u};
    if (g < W) {
      const int c0 = kslot_col<kMode, kDirect>(s, t, 0), c1 = kslot_col<kMode, kDirect>(s, t, 1);
      const __half2 lo = __floats2half2_rn(c_at(g, c0) * scale, c_at(g, c0 + kStep) * scale);
      const __half2 hi = __floats2half2_rn(c_at(g, c1) * scale, c_at(g, c1 + kStep) * scale);
      frag = {*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
    }
    sm.c_frag[s * 32 + lane] = frag;
  }
  if (t == 0) sm.c_unscale[g] = pow2_f32(-shift) * kFragUnscale<kMode>;
}
// The same from sm.Cr (fp32, already rounded to bf16).
template <Mode kMode, bool kDirect = false>
__device__ __forceinline__ void build_c_fragments(const StepSmem& sm, int N, int W, int warp = 0) {
  build_c_fragments_from<kMode, kDirect>(
      sm, [&](int j, int n) { return sm.Cr[j * N + n]; }, N, W, warp);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&q)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
               : "r"(smem_addr));
}

// d += A B for one m16n8k16 step (A: 16 x 16 fp16 rows, B: 16 x 8 fp16 columns, d: fp32).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint2 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&q)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(q[0]), "=r"(q[1]), "=r"(q[2]), "=r"(q[3])
               : "r"(smem_addr));
}

// The transpose of an 8 x 8 matrix of 16-bit values held one fragment per lane: lane l gives
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1, and gets column l / 4, rows 2 (l % 4) and
// 2 (l % 4) + 1 (low half first). The whole warp takes part.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// Lane (g, t)'s B fragment of the ring weights w [kW, L] (row j: window column j) for the
// m16n8k16 shape: column j = g at entries k0 + 2t, 2t + 1 (b0) and k0 + 2t + 8, 2t + 9 (b1), 0
// past m and for g >= kW; split into three bf16 parts, which next() returns in turn (hi + mid +
// lo carry an fp32 value's 24 significant bits, so each product with a bf16 x is exact).
template <int kW>
struct RingWeightParts {
  float v[4];
  __device__ __forceinline__ RingWeightParts(const float* w, int L, int k0, int m, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + 2 * t + (i & 1) + 8 * (i >> 1);
      v[i] = g < kW && k < m ? w[g * L + k] : 0.f;
    }
  }
  __device__ __forceinline__ uint2 next() {
    const uint32_t b0 = bf16x2_split(v[0], v[1]);
    return make_uint2(b0, bf16x2_split(v[2], v[3]));
  }
};

// The ring term of a 16-row tile at W > 1 on the tensor cores, bf16 activations:
//   d[r][j] += sum_{k < m} x_k[r0 + r] w_jk
// A = the staged x (entry-major rows [k][p], read transposed by ldmatrix: exact in bf16); B = w
// split into three bf16 parts (hi + mid + lo carry an fp32 value's 24 significant bits), so every
// product is exact and only the fp32 summation order differs from the FMA loop's. Lane (g, t)
// gets rows (g, g + 8) x columns (2t, 2t + 1), the layout of mma_tile's d. Entries past m are
// zero in w, and their staged x rows must be finite (verify_kernel zeroes them once). Needs the
// staged x to hold whole 16-entry steps (history a multiple of 16); the whole warp takes part.
template <int kW>
__device__ __forceinline__ void ring_term_mma(const uint16_t* xs, int x_pitch, int r0,
                                              const float* w, int L, int m, float (&d)[4]) {
  const int lane = threadIdx.x % 32;
  for (int k0 = 0; k0 < m; k0 += 16) {
    // ldmatrix.trans: lane l gives the address of entry k0 + (l & 7) (+ 8 for l >= 16), rows
    // r0 (+ 8 for l & 8): matrices (rows 0-7, entries 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
    uint32_t a[4];
    ldmatrix_x4_trans(
        a, static_cast<uint32_t>(__cvta_generic_to_shared(
               xs + (k0 + (lane & 7) + ((lane & 16) >> 1)) * x_pitch + r0 + (lane & 8))));
    RingWeightParts<kW> parts(w, L, k0, m, lane);
#pragma unroll
    for (int part = 0; part < 3; ++part) {
      const uint2 b = parts.next();
      mma_bf16_16816(d, a, b.x, b.y);
    }
  }
}

// The products B_k . C_j of the step's entries and window on the tensor cores, 16-bit activations
// (kF16: fp16, else bf16), into sm.dot [W, L] (0 for k > c + j):
//   dot[j][k] = sum_n B[k][n] C[j][n],   A = B's entry rows (16 per tile), B operand = C's rows
// B [L, N] and C [W, N] are the activations as they are (kRaw, 16-bit) or widened to fp32 (sm.B,
// sm.C), which narrow back exactly; every product is exact, and only the fp32 summation order
// differs from the CPU reference's. A dot product is invariant under a permutation of n applied
// to both operands, so lane (g, t) feeds k-slots {2t, 2t + 1, 2t + 8, 2t + 9} of k-step s with
// the 4 consecutive columns 16 s + 4 t.. (one load per row). Entries past m and window columns
// past W go in as 0 (their rows are not staged). Warp w takes the 16-entry tiles w, w + warps, ...
// (one at history 16: 8 dependent MMAs at dstate 128, where the FMA loop ran W rounds of
// shared-memory loads and shuffle reductions).
template <bool kF16, bool kRaw>
__device__ __forceinline__ void entry_window_dots_mma(const void* B, const void* C, float* dot,
                                                      int N, int L, int m, int c, int W) {
  using Elem = std::conditional_t<kRaw, uint16_t, float>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto pack = [](float lo, float hi) -> uint32_t {
    if constexpr (kF16) {
      const __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&v);
    } else {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&v);
    }
  };
  // Columns 4t.. of a row as two 16-bit pairs (0 where the row is not staged).
  auto pairs = [&](const Elem* row, bool ok) -> uint2 {
    if (!ok) return make_uint2(0u, 0u);
    if constexpr (kRaw) {
      return *reinterpret_cast<const uint2*>(row);
    } else {
      const float4 v = *reinterpret_cast<const float4*>(row);
      return make_uint2(pack(v.x, v.y), pack(v.z, v.w));
    }
  };
  const bool c_ok = g < W;
  for (int k0 = 16 * warp; k0 < m; k0 += 16 * int(blockDim.x / 32)) {
    const bool lo_ok = k0 + g < m, hi_ok = k0 + g + 8 < m;
    const Elem* b_lo = static_cast<const Elem*>(B) + (k0 + g) * N + 4 * t;
    const Elem* b_hi = b_lo + 8 * N;
    const Elem* cj = static_cast<const Elem*>(C) + g * N + 4 * t;
    float d[4] = {0.f, 0.f, 0.f, 0.f};  // entries (k0 + g, k0 + g + 8) x windows (2t, 2t + 1)
#pragma unroll 4
    for (int s = 0; s < N / 16; ++s) {
      const uint2 lo = pairs(b_lo + 16 * s, lo_ok), hi = pairs(b_hi + 16 * s, hi_ok);
      const uint2 cc = pairs(cj + 16 * s, c_ok);
      const uint32_t a[4] = {lo.x, hi.x, lo.y, hi.y};
      if constexpr (kF16) {
        mma_f16_16816(d, a[0], a[1], a[2], a[3], cc);
      } else {
        mma_bf16_16816(d, a, cc.x, cc.y);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int k = k0 + g + 8 * (q >> 1), j = 2 * t + (q & 1);
      if (k < m && j < W) dot[j * L + k] = k <= c + j ? d[q] : 0.f;
    }
  }
}

// Codes 2 and 3 (hi) or 0 and 1 of a register of four 8-bit codes as an fp16 pair.
template <Mode kMode>
__device__ __forceinline__ uint32_t code8x2_f16x2(uint32_t q, bool hi) {
  const uint32_t two = hi ? q >> 16 : q & 0xffffu;
  if constexpr (kMode == Mode::shared_int8) {
    // 0x6400 | (code + 128) is the fp16 1024 + code + 128, exact; subtracting 1152 leaves code.
    const uint32_t biased = __byte_perm(two ^ 0x8080u, 0x64646464u, 0x5140u);
    const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&biased), __float2half2_rn(1152.f));
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  }
}

// An e4m3 code's value (exact in fp16) in both halves of an fp16 pair.
__device__ __forceinline__ __half2 e4m3_half2(uint8_t code) {
  return __half2half2(__ushort_as_half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x));
}

// nvfp4: a register of 8 codes (column 2i in the low nibble of byte i) times the block scale
// (the same fp16 twice), at 2^-6, as 4 fp16 pairs: columns (0, 2), (4, 6), (1, 3), (5, 7). Each
// code becomes an e4m3 byte (e2m1x4_even/odd_to_e4m3x4_scaled), converted two at a time in
// hardware; the products are exact in fp16 (test_formats).
__device__ __forceinline__ void e2m1x8_f16x2(uint32_t packed, __half2 block_scale,
                                             uint32_t (&out)[4]) {
  const uint32_t bytes[2] = {e2m1x4_even_to_e4m3x4_scaled(packed),
                             e2m1x4_odd_to_e4m3x4_scaled(packed)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t two = i % 2 ? bytes[i / 2] >> 16 : bytes[i / 2] & 0xffffu;
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
    const __half2 v = __hmul2(__half2(h), block_scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// d += R C for the 16-row tile at row r0 of a staged unit (codes: rows code_pitch bytes apart,
// code_bytes of them used; nvfp4 block scales: block_bytes per row): lane (g, t) ends with rows
// (r0 + g, r0 + g + 8) x window columns (2t, 2t + 1) in (d[0], d[1]), (d[2], d[3]).
template <Mode kMode>
__device__ __forceinline__ void mma_tile(const uint8_t* codes, int code_pitch, int code_bytes,
                                         const uint8_t* block_scales, int block_bytes, int r0,
                                         const uint2* c_frag, float (&d)[4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // ldmatrix.x4 over 32 bytes of the 16 rows: matrix 0 rows 0-7 bytes 0-15, matrix 1 rows 8-15
  // bytes 0-15, matrices 2 and 3 the same rows at bytes 16-31; lane l gives the address of row
  // l % 8 of matrix l / 8 and receives 4 bytes (4t..4t+3) of row g of each matrix.
  const uint32_t base = static_cast<uint32_t>(
      __cvta_generic_to_shared(codes + (r0 + (lane & 7) + (lane & 8)) * code_pitch + (lane & 16)));
  for (int c = 0; c < code_bytes / 32; ++c) {
    uint32_t q[4];  // rows (g, g + 8) at bytes 32c + 4t.. (q0, q1) and 32c + 16 + 4t.. (q2, q3)
    ldmatrix_x4(q, base + 32 * c);
    if constexpr (kMode == Mode::separate_nvfp4) {
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // bytes 16 part + 4t.. = 2 k-steps: 64c + 32 part
        const int block = 4 * c + 2 * part + t / 2;  // columns 64c + 32 part + 8t.. in one block
        const __half2 s_lo = e4m3_half2(block_scales[(r0 + g) * block_bytes + block]);
        const __half2 s_hi = e4m3_half2(block_scales[(r0 + g + 8) * block_bytes + block]);
        uint32_t lo[4], hi[4];  // rows g, g + 8: columns (0, 2), (4, 6), (1, 3), (5, 7) of 8t..
        e2m1x8_f16x2(q[2 * part], s_lo, lo);
        e2m1x8_f16x2(q[2 * part + 1], s_hi, hi);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)  // even columns, then odd ones
          mma_f16_16816(d, lo[2 * kk], hi[2 * kk], lo[2 * kk + 1], hi[2 * kk + 1],
                        c_frag[(4 * c + 2 * part + kk) * 32 + lane]);
      }
    } else {
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // one k-step: columns 32c + 16 part..
        const uint32_t lo = q[2 * part], hi = q[2 * part + 1];
        mma_f16_16816(d, code8x2_f16x2<kMode>(lo, false), code8x2_f16x2<kMode>(hi, false),
                      code8x2_f16x2<kMode>(lo, true), code8x2_f16x2<kMode>(hi, true),
                      c_frag[(2 * c + part) * 32 + lane]);
      }
    }
  }
}

// The weights of head h for the tensor-core readout at W > 1, into buffer `buf` of sm.w and
// sm.dec, with no block barrier: lane k holds delta_k (k < m <= 32), every warp forms the running
// sums itself (sequential, the CPU reference's order, so L_k has the same bits in every warp) and
// then the weights of its window columns (two per warp at kW = 8), with i = c + j:
//   w_jk = delta_k exp(A (L_i - L_k)) (B_k . C_j) (+ D when k = i),   dec_j = exp(A L_i)
template <int kW>
__device__ __forceinline__ void form_head_weights(const ReplayParams& p, const StepSmem& sm, int h,
                                                  float delta_k, int c, int m, int buf) {
  constexpr int kPerWarp = kW * 32 / kVerifyThreads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = p.tokens, L = p.L;
  float run = 0.f, Lk = 0.f;
  for (int q = 0; q < m; ++q) {
    run += __shfl_sync(0xffffffffu, delta_k, q);
    if (q == lane) Lk = run;
  }
  const float A = p.head.A[h], D = p.head.D[h];
#pragma unroll
  for (int jj = 0; jj < kPerWarp; ++jj) {
    const int j = warp * kPerWarp + jj, i = c + j;  // i < m <= 32 whenever j < W
    const float Li = __shfl_sync(0xffffffffu, Lk, min(i, 31));
    float w = 0.f;
    if (j < W && lane <= i) w = delta_k * decay(A * (Li - Lk)) * sm.dot[j * L + lane];
    if (j < W && lane == i) w += D;
    if (lane < m) sm.w[(buf * kW + j) * L + lane] = w;
    if (lane == 0) sm.dec[buf * kW + j] = j < W ? decay(A * Li) : 0.f;
  }
}

}  // namespace replayssm::cuda
