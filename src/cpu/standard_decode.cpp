#include "cpu/standard_decode.h"

#include <cmath>
#include <vector>

#include "cache/checkpoint_codec.h"
#include "core/act.h"
#include "cpu/simd.h"

namespace replayssm {

void cpu_standard_decode(const SsmShape& shape, const LayerParams& params,
                         const StandardDecodeConfig& config, const TensorView& state,
                         const TensorView& slots, const TensorView& x, const TensorView& B,
                         const TensorView& C, const TensorView& dt, const TensorView& y,
                         const TensorView* intermediate) {
  const int H = shape.nheads, P = shape.headdim, N = shape.dstate, G = shape.ngroups;
  const int batch = int(x.shape[0]), T = int(x.shape[1]), heads_per_group = shape.heads_per_group();
  const int64_t state_elems = shape.state_elements(), head_elems = int64_t(P) * N;
  const DType act = x.dtype, sdt = state.dtype;
  const int32_t* slot_ids = slots.as<const int32_t>();
  const float* dts = dt.as<const float>();

  // Writes the head's fp32 state into `dst` in the state dtype; SR bits use
  // counter (request = slot, flush index = step, element = t * state_elems + element).
  auto store = [&](const float* S, void* dst, int slot, int h, int t) {
    for (int64_t i = 0; i < head_elems; ++i) {
      if (sdt == DType::f16 && config.stochastic_rounding) continue;  // below, the whole head
      store_act(dst, sdt, i, S[i]);
    }
    if (sdt == DType::f16 && config.stochastic_rounding) {
      const SrContext sr = make_sr_context(philox_key(config.seed, config.layer), uint64_t(slot),
                                           config.step, config.sr_bits, config.philox_rounds);
      encode_f16_sr_row(S, int(head_elems), uint64_t(t) * state_elems + uint64_t(h) * head_elems,
                        sr, static_cast<uint16_t*>(dst));
    }
  };

  // Threads only above ~2^18 multiply-adds: below, waking OpenMP threads costs more than the work.
  const bool parallel = int64_t(batch) * T * state_elems >= (int64_t(1) << 18);
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < H; ++h) {
      const int slot = slot_ids[b];
      if (slot == kPaddingSlot) continue;
      const int g = h / heads_per_group;
      const float A = -std::exp(params.A_log[h]);
      const int64_t state_offset = int64_t(slot) * state_elems + h * head_elems;
      std::vector<float> S(static_cast<size_t>(head_elems)), b_row(static_cast<size_t>(N)),
          c_row(static_cast<size_t>(N));
      for (int64_t i = 0; i < head_elems; ++i) S[i] = load_act(state.data, sdt, state_offset + i);
      for (int t = 0; t < T; ++t) {
        const int64_t token = int64_t(b) * T + t;
        const float delta =
            process_dt(dts[token * H + h], params.dt_bias[h], params.dt_min, params.dt_max);
        const float a = std::exp(delta * A);
        for (int n = 0; n < N; ++n) {
          b_row[n] = load_act(B.data, act, (token * G + g) * N + n);
          c_row[n] = load_act(C.data, act, (token * G + g) * N + n);
        }
        for (int p = 0; p < P; ++p) {
          const float xv = load_act(x.data, act, (token * H + h) * P + p);
          const float acc = cpu::update_and_dot(S.data() + size_t(p) * N, a, delta * xv,
                                                b_row.data(), c_row.data(), N);
          store_act(y.data, y.dtype, (token * H + h) * P + p, acc + params.D[h] * xv);
        }
        if (intermediate) {
          const size_t elem = dtype_size(sdt);
          void* dst = static_cast<uint8_t*>(intermediate->data) +
                      size_t((token * H + h) * head_elems) * elem;
          store(S.data(), dst, slot, h, t);
        }
      }
      if (!intermediate) {
        void* dst = static_cast<uint8_t*>(state.data) + size_t(state_offset) * dtype_size(sdt);
        store(S.data(), dst, slot, h, 0);
      }
    }
  }
}

}  // namespace replayssm
