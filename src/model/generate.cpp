#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "replayssm/error.h"

namespace replayssm::model {

void SamplingParams::validate() const {
  check(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0, got ",
        temperature);
  check(top_k >= 0, "top-k must be >= 0, got ", top_k);
  check(top_p > 0.0f && top_p <= 1.0f, "top-p must be in (0, 1], got ", top_p);
}

int argmax(const float* logits, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v)
    if (logits[v] > logits[best]) best = v;
  return best;
}

void sampling_distribution(const float* logits, int V, const SamplingParams& params,
                           std::vector<float>& probs) {
  probs.assign(size_t(V), 0.0f);
  if (params.greedy()) {
    probs[size_t(argmax(logits, V))] = 1.0f;
    return;
  }
  std::vector<int> keep(static_cast<size_t>(V));
  std::iota(keep.begin(), keep.end(), 0);
  // Larger logit first, lower index first among equals: a reproducible order.
  auto before = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (params.top_k > 0 && params.top_k < V) {
    std::nth_element(keep.begin(), keep.begin() + params.top_k, keep.end(), before);
    keep.resize(size_t(params.top_k));
  }
  std::sort(keep.begin(), keep.end(), before);
  const double inv_t = 1.0 / double(params.temperature);
  const double top = double(logits[keep.front()]) * inv_t;
  std::vector<double> e(keep.size());
  double total = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    e[i] = std::exp(double(logits[keep[i]]) * inv_t - top);
    total += e[i];
  }
  size_t count = keep.size();
  if (params.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep.size(); ++i) {
      mass += e[i] / total;
      if (mass >= double(params.top_p)) {
        count = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < count; ++i) kept += e[i];
  for (size_t i = 0; i < count; ++i) probs[size_t(keep[i])] = float(e[i] / kept);
}

int sample_index(const std::vector<float>& probs, double u) {
  double total = 0;
  for (float p : probs) total += p;
  const double target = u * total;
  double acc = 0;
  int last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last = int(i);
    if (target < acc) return int(i);
  }
  return last;  // rounding: u * total landed at the very end
}

std::vector<int32_t> PromptLookupDrafter::propose(std::span<const int32_t> history,
                                                  int max_drafts) const {
  std::vector<int32_t> drafts;
  const int64_t len = int64_t(history.size());
  if (max_drafts <= 0) return drafts;
  for (int n = std::min<int64_t>(max_ngram, len - 1); n >= std::max(1, min_ngram); --n) {
    const int32_t* suffix = history.data() + len - n;
    // Most recent earlier match first: in code and prose the latest repetition predicts best.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, history.data() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_drafts, len - from);
      drafts.assign(history.begin() + from, history.begin() + from + count);
      return drafts;
    }
  }
  return drafts;
}

double GenerateStats::decode_tokens_per_second() const {
  return decode_seconds > 0 ? double(generated) / decode_seconds : 0.0;
}
double GenerateStats::mean_accepted_length() const {
  return steps > 0 ? double(steps + accepted) / double(steps) : 0.0;
}
double GenerateStats::acceptance_rate() const {
  return drafted > 0 ? double(accepted) / double(drafted) : 0.0;
}

std::vector<int32_t> generate(Mamba2Model& model, std::span<const int32_t> prompt,
                              const GenerateOptions& options,
                              const std::function<void(std::span<const int32_t>)>& emit,
                              GenerateStats* stats) {
  options.sampling.validate();
  check(!prompt.empty(), "generate: the prompt is empty (at least one token is needed)");
  check(options.max_new_tokens >= 0, "generate: max new tokens must be >= 0, got ",
        options.max_new_tokens);
  const int max_drafts = model.runner_config().max_window - 1;
  check(options.draft_max >= 0 && options.draft_max <= max_drafts, "generate: draft-max ",
        options.draft_max, " is outside 0..", max_drafts, " (max_window ",
        model.runner_config().max_window, " = 1 + drafts; SPEC allows at most history/2)");
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  st = GenerateStats{};
  st.prompt_tokens = int(prompt.size());
  const int V = model.vocab_size();
  const SamplingParams& sp = options.sampling;
  std::mt19937_64 rng(sp.seed);
  auto uniform = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<float> probs;
  auto choose = [&](const float* row) {
    if (sp.greedy()) return int32_t(argmax(row, V));
    sampling_distribution(row, V, sp, probs);
    return int32_t(sample_index(probs, uniform()));
  };

  using clock = std::chrono::steady_clock;
  const int slot = model.open(options.request_id);
  struct Release {
    Mamba2Model& m;
    int s;
    ~Release() { m.release(s); }
  } release{model, slot};

  std::vector<int32_t> out;
  if (options.max_new_tokens == 0) return out;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits;
  const auto t0 = clock::now();
  model.prefill(slot, prompt, logits);
  const auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  const uint64_t flushes0 = model.flushes_per_layer();

  auto push = [&](std::span<const int32_t> tokens) -> bool {  // false once EOS is reached
    size_t n = tokens.size();
    bool stop = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == options.eos_token_id) {
        n = i;
        stop = true;
        break;
      }
    }
    out.insert(out.end(), tokens.begin(), tokens.begin() + int64_t(n));
    history.insert(history.end(), tokens.begin(), tokens.begin() + int64_t(n));
    if (n > 0 && emit) emit(tokens.subspan(0, n));
    return !stop;
  };

  int32_t last = choose(logits.data());
  bool running = push(std::span<const int32_t>(&last, 1));
  std::vector<int32_t> window, fresh;
  while (running && int(out.size()) < options.max_new_tokens) {
    // A window of k drafts yields at most k + 1 tokens: never draft past the requested length.
    const int room = options.max_new_tokens - int(out.size()) - 1;
    const int k = std::min(options.draft_max, room);
    const std::vector<int32_t> drafts = options.drafter.propose(history, k);
    window.assign(1, last);
    window.insert(window.end(), drafts.begin(), drafts.end());
    model.verify(slot, window, logits);  // [W, V]; row j predicts the token after window[j]
    ++st.steps;
    st.drafted += int64_t(drafts.size());
    fresh.clear();
    int accepted = 1;  // the window's first token is already part of the output
    bool rejected = false;
    for (size_t i = 0; i < drafts.size(); ++i) {
      const float* row = logits.data() + i * size_t(V);
      const int32_t d = drafts[i];
      bool accept;
      if (sp.greedy()) {
        accept = argmax(row, V) == d;
      } else {
        sampling_distribution(row, V, sp, probs);
        accept = uniform() < double(probs[size_t(d)]);
        if (!accept) probs[size_t(d)] = 0.0f;  // residual max(0, p - onehot(d)), renormalised
      }
      if (accept) {
        fresh.push_back(d);
        ++accepted;
        continue;
      }
      fresh.push_back(sp.greedy() ? int32_t(argmax(row, V))
                                  : int32_t(sample_index(probs, uniform())));
      rejected = true;
      break;
    }
    if (!rejected) fresh.push_back(choose(logits.data() + drafts.size() * size_t(V)));
    model.commit(slot, accepted);
    st.accepted += accepted - 1;
    last = fresh.back();
    running = push(fresh);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  st.generated = int(out.size());
  st.flushes = model.flushes_per_layer() - flushes0;
  return out;
}

}  // namespace replayssm::model
