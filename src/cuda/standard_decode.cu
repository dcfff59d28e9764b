// Launcher of the standard-decode baseline: validates the views, then dispatches on the state and
// activation types to standard_decode_kernel (src/cuda/standard_decode.cuh).
#include <algorithm>

#include "cuda/cuda_backend.h"
#include "cuda/standard_decode.cuh"

namespace replayssm {
namespace {

using cuda::StandardDecodeParams;

void check_device_view(const TensorView& v, const char* name) {
  check(v.memory == MemoryKind::cuda, "cuda standard_decode: ", name,
        " must be in device memory, got ", v.describe(), " in host memory");
  check(v.data != nullptr, "cuda standard_decode: ", name, " is null");
}

void check_shape(const TensorView& v, const char* name, std::initializer_list<int64_t> want) {
  check(v.shape == std::vector<int64_t>(want), "cuda standard_decode: ", name, " has shape ",
        v.describe(), ", expected ", want.size(), " dims matching the layer");
}

// 32 bytes of state per lane and row (8 fp32 or 16 16-bit values), 16 bytes when a 16-bit row is
// no multiple of 16 values.
// T > 1 with a 16-bit state: 2 rows per thread instead of 4, so that the registers of the rows'
// 16 values each and of the next token's inputs leave room for more resident blocks. bf16 state,
// H200: 4 rows 168 registers, 3 blocks per SM, 68-69% of the copy bandwidth at T = 4 and 77-78% at
// T = 8; 2 rows 96 registers, 5 blocks, 72-73% and 80-81% (session 20).
template <typename StateT, typename ActT>
void launch(StandardDecodeParams p, cudaStream_t stream) {
  constexpr int kThreads = cuda::kStandardThreads, kWide = 32 / sizeof(StateT);
  constexpr int kRowsOne = 4, kRowsMany = sizeof(StateT) == 2 ? 2 : 4;
  p.token_bytes_bc = int64_t(p.ngroups) * p.dstate * int64_t(sizeof(ActT));
  p.token_bytes_x = int64_t(p.nheads) * p.headdim * int64_t(sizeof(ActT));
  p.token_bytes_state = int64_t(p.nheads) * p.headdim * p.dstate * int64_t(sizeof(StateT));
  auto run = [&]<int kElems>() {
    const int rows = p.tokens == 1 ? kRowsOne : kRowsMany;
    p.lanes_per_row = p.dstate / kElems;
    p.rows_per_block = (kThreads / p.lanes_per_row) * rows;
    p.blocks_per_head = (p.headdim + p.rows_per_block - 1) / p.rows_per_block;
    const int blocks = p.batch * p.nheads * p.blocks_per_head;
    if (blocks == 0) return;
    if (p.tokens == 1) {
      cuda::standard_decode_kernel<StateT, ActT, kElems, kRowsOne, true>
          <<<blocks, kThreads, 0, stream>>>(p);
    } else if constexpr (cuda::standard_uses_token_loop<StateT>()) {
      // Grid (row block, head, batch entry); z is at most 65535, so larger batches take several
      // launches.
      constexpr int kMaxGridZ = 65535;
      for (int base = 0; base < p.batch; base += kMaxGridZ) {
        p.batch_base = base;
        const dim3 grid(p.blocks_per_head, p.nheads, std::min(kMaxGridZ, p.batch - base));
        cuda::standard_decode_tokens_kernel<StateT, ActT, kElems, kRowsMany>
            <<<grid, kThreads, 0, stream>>>(p);
        RSSM_CUDA_CHECK(cudaGetLastError());
      }
    } else {
      cuda::standard_decode_kernel<StateT, ActT, kElems, kRowsMany, false>
          <<<blocks, kThreads, 0, stream>>>(p);
    }
    RSSM_CUDA_CHECK(cudaGetLastError());
  };
  if (p.dstate % kWide == 0)
    run.template operator()<kWide>();
  else
    run.template operator()<8>();
}

template <typename StateT>
void dispatch_act(DType act, const StandardDecodeParams& p, cudaStream_t stream) {
  switch (act) {
    case DType::f32:
      return launch<StateT, float>(p, stream);
    case DType::bf16:
      return launch<StateT, __nv_bfloat16>(p, stream);
    case DType::f16:
      return launch<StateT, __half>(p, stream);
    default:
      fail("cuda standard_decode: activation dtype ", dtype_name(act), " is not supported");
  }
}

}  // namespace

void cuda_standard_decode(const SsmShape& shape, const LayerParams& params,
                          const StandardDecodeConfig& config, const TensorView& state,
                          const TensorView& slots, const TensorView& x, const TensorView& B,
                          const TensorView& C, const TensorView& dt, const TensorView& y,
                          const TensorView* intermediate, cudaStream_t stream) {
  shape.validate();
  params.validate(shape);
  const int H = shape.nheads, P = shape.headdim, N = shape.dstate, G = shape.ngroups;
  check(N % 8 == 0 && N / 8 <= 32 && ((N / 8) & (N / 8 - 1)) == 0, "cuda standard_decode: dstate ",
        N, " must be 8 times a power of two, at most 256");
  check(H <= cuda::kMaxHeads, "cuda standard_decode: nheads ", H, " exceeds ", cuda::kMaxHeads);
  for (auto* v : {&state, &slots, &x, &B, &C, &dt, &y}) check_device_view(*v, "tensor");
  check(slots.dtype == DType::i32 && slots.shape.size() == 1, "cuda standard_decode: slots ",
        slots.describe(), " must be i32 [B]");
  const int64_t batch = slots.shape[0];
  check(x.shape.size() == 4, "cuda standard_decode: x ", x.describe(), " must be [B,T,H,P]");
  const int64_t T = x.shape[1];
  check(T >= 1, "cuda standard_decode: T must be >= 1, got ", T);
  check_shape(x, "x", {batch, T, H, P});
  check_shape(B, "B", {batch, T, G, N});
  check_shape(C, "C", {batch, T, G, N});
  check_shape(dt, "dt", {batch, T, H});
  check_shape(y, "y", {batch, T, H, P});
  check(B.dtype == x.dtype && C.dtype == x.dtype, "cuda standard_decode: x, B, C dtypes differ");
  check(dt.dtype == DType::f32, "cuda standard_decode: dt must be f32");
  check(state.dtype == config.state_dtype, "cuda standard_decode: state is ",
        dtype_name(state.dtype), " but the config says ", dtype_name(config.state_dtype));
  check(
      state.shape.size() == 4 && state.shape[1] == H && state.shape[2] == P && state.shape[3] == N,
      "cuda standard_decode: state ", state.describe(), " must be [S,H,P,N]");
  check(!config.stochastic_rounding || config.state_dtype == DType::f16,
        "cuda standard_decode: stochastic rounding needs an f16 state");
  check(config.sr_bits >= 1 && config.sr_bits <= 13, "cuda standard_decode: sr_bits ",
        config.sr_bits, " outside 1..13");
  if (T > 1) {
    check(intermediate != nullptr, "cuda standard_decode: T = ", T, " needs an intermediate");
    check_device_view(*intermediate, "intermediate");
    check(intermediate->dtype == state.dtype, "cuda standard_decode: intermediate dtype differs");
    check_shape(*intermediate, "intermediate", {batch, T, H, P, N});
  }

  StandardDecodeParams p{};
  p.state = state.data;
  p.slots = slots.as<int32_t>();
  p.x = x.data;
  p.B = B.data;
  p.C = C.data;
  p.dt = dt.as<float>();
  p.y = y.data;
  p.y_dtype = y.dtype;
  p.intermediate = T > 1 ? intermediate->data : nullptr;
  p.batch = int(batch);
  p.tokens = int(T);
  p.nheads = H;
  p.headdim = P;
  p.dstate = N;
  p.ngroups = G;
  p.token_bytes_y = int64_t(H) * P * int64_t(dtype_size(y.dtype));
  p.stochastic_rounding = config.stochastic_rounding;
  p.sr_bits = config.sr_bits;
  p.philox_rounds = config.philox_rounds;
  p.key = U32x2{{uint32_t(config.seed), uint32_t(config.seed >> 32) ^ uint32_t(config.layer)}};
  p.step = config.step;
  p.head = cuda::make_head_params(shape, params);

  switch (config.state_dtype) {
    case DType::f32:
      return dispatch_act<float>(x.dtype, p, stream);
    case DType::bf16:
      return dispatch_act<__nv_bfloat16>(x.dtype, p, stream);
    case DType::f16:
      return dispatch_act<__half>(x.dtype, p, stream);
    default:
      fail("cuda standard_decode: state dtype ", dtype_name(config.state_dtype),
           " is not supported");
  }
}

}  // namespace replayssm
