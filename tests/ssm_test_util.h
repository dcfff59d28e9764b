// Shared helpers of the cache tests: Mamba-2-like random layers and tokens, host tensors in the
// activation dtype, and an FP64 per-token recurrence that serves as the exact oracle.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/act.h"
#include "replayssm/cache.h"

namespace replayssm::testing {

// A_log = log(U[1,16]); dt_bias = softplus^-1(logU[1e-3, 1e-1]); D ~ U[0.5, 1.5].
inline LayerParams random_params(const SsmShape& shape, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  LayerParams p;
  for (int h = 0; h < shape.nheads; ++h) {
    p.A_log.push_back(float(std::log(1.0 + 15.0 * u01(rng))));
    const double dt = std::exp(std::log(1e-3) + (std::log(1e-1) - std::log(1e-3)) * u01(rng));
    p.dt_bias.push_back(float(std::log(std::expm1(dt))));
    p.D.push_back(float(0.5 + u01(rng)));
  }
  return p;
}

// One batch of T tokens for B slots, stored in the activation dtype (what the cache receives)
// and as the fp32 values those elements represent (what the oracle uses).
struct Tokens {
  int batch = 0, tokens = 0;
  DType act = DType::f32;
  std::vector<uint8_t> x, B, C;   // [B,T,H,P], [B,T,G,N], [B,T,G,N] in `act`
  std::vector<float> dt;          // [B,T,H]
  std::vector<float> xf, Bf, Cf;  // the same values as fp32

  TensorView view_x(const SsmShape& s) {
    return host_view(x.data(), act, {batch, tokens, s.nheads, s.headdim});
  }
  TensorView view_B(const SsmShape& s) {
    return host_view(B.data(), act, {batch, tokens, s.ngroups, s.dstate});
  }
  TensorView view_C(const SsmShape& s) {
    return host_view(C.data(), act, {batch, tokens, s.ngroups, s.dstate});
  }
  TensorView view_dt(const SsmShape& s) {
    return host_view(dt.data(), DType::f32, {batch, tokens, s.nheads});
  }
  // Token t of batch row b, as a one-token batch.
  Tokens slice(const SsmShape& s, int b, int t, int count = 1) const;
};

inline void fill_act(std::vector<uint8_t>& bytes, std::vector<float>& values, DType act, size_t n,
                     std::mt19937_64& rng, double scale) {
  std::normal_distribution<double> normal(0.0, scale);
  bytes.assign(n * dtype_size(act), 0);
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    store_act(bytes.data(), act, int64_t(i), float(normal(rng)));
    values[i] = load_act(bytes.data(), act, int64_t(i));
  }
}

// x, B, C ~ N(0,1); raw dt ~ N(0, 0.5) (delta then spans roughly the dt_bias range).
inline Tokens random_tokens(const SsmShape& s, DType act, int batch, int tokens,
                            std::mt19937_64& rng) {
  Tokens t;
  t.batch = batch;
  t.tokens = tokens;
  t.act = act;
  const size_t bt = size_t(batch) * tokens;
  fill_act(t.x, t.xf, act, bt * s.nheads * s.headdim, rng, 1.0);
  fill_act(t.B, t.Bf, act, bt * s.ngroups * s.dstate, rng, 1.0);
  fill_act(t.C, t.Cf, act, bt * s.ngroups * s.dstate, rng, 1.0);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  t.dt.resize(bt * s.nheads);
  for (float& v : t.dt) v = normal(rng);
  return t;
}

inline Tokens Tokens::slice(const SsmShape& s, int b, int t, int count) const {
  Tokens out;
  out.batch = 1;
  out.tokens = count;
  out.act = act;
  const size_t e = dtype_size(act);
  auto cut = [&](const std::vector<uint8_t>& bytes, const std::vector<float>& values,
                 size_t per_token, std::vector<uint8_t>& ob, std::vector<float>& ov) {
    const size_t first = (size_t(b) * tokens + t) * per_token, n = size_t(count) * per_token;
    ob.assign(bytes.begin() + first * e, bytes.begin() + (first + n) * e);
    ov.assign(values.begin() + first, values.begin() + first + n);
  };
  cut(x, xf, size_t(s.nheads) * s.headdim, out.x, out.xf);
  cut(B, Bf, size_t(s.ngroups) * s.dstate, out.B, out.Bf);
  cut(C, Cf, size_t(s.ngroups) * s.dstate, out.C, out.Cf);
  const size_t first = (size_t(b) * tokens + t) * s.nheads;
  out.dt.assign(dt.begin() + first, dt.begin() + first + size_t(count) * s.nheads);
  return out;
}

// delta = softplus(dt + dt_bias) clamped to the layer's limits, in FP64 (SPEC section 2).
inline double delta64(double dt, const LayerParams& params, int h) {
  const double u = dt + params.dt_bias[h];
  const double delta = u > 20.0 ? u : std::log1p(std::exp(u));
  return std::min(std::max(delta, double(params.dt_min)), double(params.dt_max));
}

// The per-token recurrence of SPEC section 2 in FP64 for one request.
struct Fp64Recurrence {
  SsmShape shape;
  LayerParams params;
  std::vector<double> S;  // [H,P,N]

  Fp64Recurrence(const SsmShape& s, const LayerParams& p)
      : shape(s), params(p), S(size_t(s.state_elements()), 0.0) {}

  // Applies token t of batch row b and returns y [H,P].
  std::vector<double> step(const Tokens& tk, int b, int t) {
    const int H = shape.nheads, P = shape.headdim, N = shape.dstate, G = shape.ngroups;
    const size_t token = size_t(b) * tk.tokens + t;
    std::vector<double> y(size_t(H) * P);
    for (int h = 0; h < H; ++h) {
      const int g = h / shape.heads_per_group();
      const double delta = delta64(tk.dt[token * H + h], params, h);
      const double a = std::exp(delta * -std::exp(double(params.A_log[h])));
      for (int p = 0; p < P; ++p) {
        const double x = tk.xf[(token * H + h) * P + p];
        double acc = 0.0;
        for (int n = 0; n < N; ++n) {
          double& s = S[(size_t(h) * P + p) * N + n];
          s = a * s + delta * x * tk.Bf[(token * G + g) * N + n];
          acc += s * tk.Cf[(token * G + g) * N + n];
        }
        y[size_t(h) * P + p] = acc + double(params.D[h]) * x;
      }
    }
    return y;
  }
};

inline TensorView i32_view(std::vector<int32_t>& v) {
  return host_view(v.data(), DType::i32, {int64_t(v.size())});
}

// verify or prefill of `tk` on `slots`; returns y as fp32 [B, T, H, P], poisoned with NaN first
// so an unwritten output cannot pass.
inline std::vector<float> run_tokens(ReplayCache& cache, bool prefill, std::vector<int32_t> slots,
                                     Tokens& tk) {
  const SsmShape& s = cache.shape();
  std::vector<float> y(size_t(tk.batch) * tk.tokens * s.nheads * s.headdim, NAN);
  const TensorView yv = host_view(y.data(), DType::f32, {tk.batch, tk.tokens, s.nheads, s.headdim});
  if (prefill)
    cache.prefill(i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s), yv);
  else
    cache.verify(i32_view(slots), tk.view_x(s), tk.view_B(s), tk.view_C(s), tk.view_dt(s), yv);
  return y;
}
inline std::vector<float> verify(ReplayCache& cache, std::vector<int32_t> slots, Tokens& tk) {
  return run_tokens(cache, false, std::move(slots), tk);
}
inline std::vector<float> prefill(ReplayCache& cache, std::vector<int32_t> slots, Tokens& tk) {
  return run_tokens(cache, true, std::move(slots), tk);
}
inline void commit(ReplayCache& cache, std::vector<int32_t> slots, std::vector<int32_t> accepted) {
  cache.commit(i32_view(slots), i32_view(accepted));
}
inline void flush(ReplayCache& cache, std::vector<int32_t> slots) { cache.flush(i32_view(slots)); }

// Output token j of a [T, H, P] block of outputs (per_token = H * P).
inline std::vector<float> token_slice(const std::vector<float>& y, int j, int per_token) {
  return std::vector<float>(y.begin() + size_t(j) * per_token,
                            y.begin() + size_t(j + 1) * per_token);
}

// ||a - b|| / ||b|| over all elements.
template <typename A, typename B>
double rel_l2(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (!std::isfinite(num)) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace replayssm::testing
