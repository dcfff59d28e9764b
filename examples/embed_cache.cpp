// Embedding replayssm in a serving engine: one ReplayCache per Mamba layer, each request in a
// slot, the prompt through prefill and speculative decoding through verify (1 + drafts tokens)
// and commit (the accepted prefix: a cursor move). Only the public headers are used
// (include/replayssm/), as a program built against an installed replayssm would
// (examples/consumer/ builds this file through find_package).
//
// The program checks itself: every accepted token's output is compared with the standard
// decode (fp32 state, one token at a time), the recurrence a serving engine runs today. The fp32
// mode agrees to rounding (~1e-7); separate-fp8 reads an fp8 copy of the state, so its outputs
// agree to a fraction of a percent, NVFP4 to about 1% (docs/accuracy.md). Exit status 1 if the
// error is far above that (1e-5 for fp32, 5% otherwise).
//
//   example_embed_cache [MODE]      MODE: fp32, separate-fp8 (default), separate-nvfp4, ...
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "replayssm/cache.h"
#include "replayssm/error.h"
#include "replayssm/standard_decode.h"

namespace {

using namespace replayssm;

// Per-token inputs of every slot for one call: x [S, T, H, P], B and C [S, T, G, N], dt [S, T, H].
struct Tokens {
  std::vector<float> x, B, C, dt;
  int S = 1, T = 1;
  TensorView vx(const SsmShape& s) const {
    return host_view(x.data(), DType::f32, {S, T, s.nheads, s.headdim});
  }
  TensorView vB(const SsmShape& s) const {
    return host_view(B.data(), DType::f32, {S, T, s.ngroups, s.dstate});
  }
  TensorView vC(const SsmShape& s) const {
    return host_view(C.data(), DType::f32, {S, T, s.ngroups, s.dstate});
  }
  TensorView vdt(const SsmShape& s) const {
    return host_view(dt.data(), DType::f32, {S, T, s.nheads});
  }
};

Tokens random_tokens(const SsmShape& s, int slots, int tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  Tokens t;
  t.S = slots;
  t.T = tokens;
  auto fill = [&](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    for (float& e : v) e = scale * normal(rng);
  };
  const size_t st = size_t(slots) * tokens;
  fill(t.x, st * s.nheads * s.headdim, 1.f);
  fill(t.B, st * s.ngroups * s.dstate, 0.3f);
  fill(t.C, st * s.ngroups * s.dstate, 0.3f);
  fill(t.dt, st * s.nheads, 1.f);
  return t;
}

// Token t of slot entry b of a batch, as a one-slot, one-token batch (for the reference).
Tokens one_token(const SsmShape& s, const Tokens& all, int b, int t) {
  Tokens one;
  auto take = [&](std::vector<float>& dst, const std::vector<float>& src, size_t per_token) {
    const size_t at = (size_t(b) * all.T + t) * per_token;
    dst.assign(src.begin() + long(at), src.begin() + long(at + per_token));
  };
  take(one.x, all.x, size_t(s.nheads) * s.headdim);
  take(one.B, all.B, size_t(s.ngroups) * s.dstate);
  take(one.C, all.C, size_t(s.ngroups) * s.dstate);
  take(one.dt, all.dt, size_t(s.nheads));
  return one;
}

}  // namespace

int main(int argc, char** argv) try {
  const SsmShape shape{8, 64, 128, 2};  // heads, headdim, dstate, groups
  std::mt19937 rng(7);
  LayerParams params;
  for (int h = 0; h < shape.nheads; ++h) {
    params.A_log.push_back(std::log(1.0f + float(h)));  // decays from slow to fast
    params.dt_bias.push_back(-2.0f);
    params.D.push_back(1.0f);
  }

  CacheConfig config;
  config.mode = parse_mode(argc > 1 ? argv[1] : "separate-fp8");
  config.num_slots = 4;
  config.activation_dtype = DType::f32;                        // ring inputs kept as given
  ReplayCache cache(shape, params, config, BackendKind::cpu);  // CUDA: the same calls, device views

  const int S = 2;  // two requests
  std::vector<int32_t> slots;
  for (int r = 0; r < S; ++r) slots.push_back(cache.allocate(/*request_id=*/100 + r));
  const TensorView slot_view = host_view(slots.data(), DType::i32, {S});

  // The reference: the standard decode of the same accepted tokens, fp32 state, in place.
  const size_t per_state = size_t(shape.state_elements());
  std::vector<float> state(size_t(config.num_slots) * per_state, 0.f);
  const StandardDecodeConfig plain;  // fp32 state
  auto reference = [&](int slot, const Tokens& one, float* y) {
    const int32_t s[1] = {slot};
    standard_decode(BackendKind::cpu, shape, params, plain,
                    host_view(state.data(), DType::f32,
                              {config.num_slots, shape.nheads, shape.headdim, shape.dstate}),
                    host_view(s, DType::i32, {1}), one.vx(shape), one.vB(shape), one.vC(shape),
                    one.vdt(shape), host_view(y, DType::f32, {1, 1, shape.nheads, shape.headdim}),
                    nullptr);
  };
  const size_t hp = size_t(shape.nheads) * shape.headdim;
  double err2 = 0, ref2 = 0;
  auto compare = [&](const float* got, const float* want) {
    for (size_t i = 0; i < hp; ++i) {
      err2 += double(got[i] - want[i]) * double(got[i] - want[i]);
      ref2 += double(want[i]) * double(want[i]);
    }
  };
  std::vector<float> want(hp);

  // The prompt: 24 tokens per request in one prefill.
  {
    const int T = 24;
    const Tokens prompt = random_tokens(shape, S, T, rng);
    std::vector<float> y(size_t(S) * T * hp);
    cache.prefill(slot_view, prompt.vx(shape), prompt.vB(shape), prompt.vC(shape),
                  prompt.vdt(shape),
                  host_view(y.data(), DType::f32, {S, T, shape.nheads, shape.headdim}));
    for (int b = 0; b < S; ++b)
      for (int t = 0; t < T; ++t) {
        reference(slots[b], one_token(shape, prompt, b, t), want.data());
        compare(y.data() + (size_t(b) * T + t) * hp, want.data());
      }
  }

  // Decode: windows of W = 4 tokens (the next token and 3 drafts); a random prefix is accepted.
  const int W = 4;
  int generated = 0;
  for (int step = 0; step < 40; ++step) {
    const Tokens window = random_tokens(shape, S, W, rng);
    std::vector<float> y(size_t(S) * W * hp);
    cache.verify(slot_view, window.vx(shape), window.vB(shape), window.vC(shape), window.vdt(shape),
                 host_view(y.data(), DType::f32, {S, W, shape.nheads, shape.headdim}));
    std::vector<int32_t> accepted(S);
    for (int b = 0; b < S; ++b) {
      accepted[b] = 1 + int(rng() % W);
      for (int t = 0; t < accepted[b]; ++t) {  // the rejected drafts never reach the reference
        reference(slots[b], one_token(shape, window, b, t), want.data());
        compare(y.data() + (size_t(b) * W + t) * hp, want.data());
      }
      generated += accepted[b];
    }
    cache.commit(slot_view, host_view(accepted.data(), DType::i32, {S}));
  }

  const double rel = std::sqrt(err2 / ref2);
  const CacheStats stats = cache.stats();
  std::printf(
      "mode %s: %d tokens decoded for %d requests in 40 verify steps, %llu flushes; outputs vs "
      "the fp32 standard decode: relative L2 error %.3g\n",
      mode_name(config.mode), generated, S, (unsigned long long)stats.flushes, rel);
  for (int slot : slots) cache.release(slot);
  return rel < (config.mode == Mode::fp32 ? 1e-5 : 0.05) ? 0 : 1;
} catch (const replayssm::Error& e) {
  std::fprintf(stderr, "example_embed_cache: %s\n", e.what());
  return 2;
}
