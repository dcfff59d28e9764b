#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/splitmix.h"
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

uint64_t request_seed(uint64_t seed, size_t index) {
  if (index == 0) return seed;
  // The index-th SplitMix64 output from `seed`: well-separated streams for neighbouring seeds
  // and indices.
  return splitmix64_finalize(seed + kSplitMixGamma * uint64_t(index));
}

namespace {

void validate_options(const Mamba2Model& model, const GenerateOptions& options, const char* op) {
  options.sampling.validate();
  check(options.max_new_tokens >= 0, op, ": max new tokens must be >= 0, got ",
        options.max_new_tokens);
  const int max_drafts = model.runner_config().max_window - 1;
  check(options.draft_max >= 0 && options.draft_max <= max_drafts, op, ": draft-max ",
        options.draft_max, " is outside 0..", max_drafts, " (max_window ",
        model.runner_config().max_window, " = 1 + drafts; SPEC allows at most history/2)");
}

// The decoding state of one request, shared by generate() and generate_batch(): its output and
// history, its random stream, and the acceptance rule (header comment). The caller runs the model.
class Request {
 public:
  using Emit = std::function<void(std::span<const int32_t>)>;
  Request(std::span<const int32_t> prompt, const GenerateOptions& options, uint64_t seed, int V,
          const Emit* emit)
      : opt_(options), V_(V), rng_(seed), emit_(emit), history_(prompt.begin(), prompt.end()) {}

  const std::vector<int32_t>& out() const { return out_; }
  std::vector<int32_t>& take_out() { return out_; }
  bool active() const { return running_ && int(out_.size()) < opt_.max_new_tokens; }

  // The first token, from the last prompt position's logits row [V].
  void start(const float* row) {
    last_ = choose(row);
    running_ = push(std::span<const int32_t>(&last_, 1));
  }

  // The next window [last token, drafts...]. A window of k drafts yields at most k + 1 tokens:
  // never draft past the requested length.
  const std::vector<int32_t>& propose() {
    const int room = opt_.max_new_tokens - int(out_.size()) - 1;
    const std::vector<int32_t> drafts =
        opt_.drafter.propose(history_, std::min(opt_.draft_max, room));
    window_.assign(1, last_);
    window_.insert(window_.end(), drafts.begin(), drafts.end());
    return window_;
  }
  const std::vector<int32_t>& window() const { return window_; }
  int drafts() const { return int(window_.size()) - 1; }

  // Decides the tokens of the proposed window from its logits [>= window size, V] (row j predicts
  // the token after window[j]; rows past the window are ignored), emits them, and returns how many
  // window tokens to commit (1 + accepted drafts).
  int accept(const float* logits) {
    fresh_.clear();
    int accepted = 1;  // the window's first token is already part of the output
    bool rejected = false;
    for (int i = 0; i < drafts(); ++i) {
      const float* row = logits + size_t(i) * size_t(V_);
      const int32_t d = window_[size_t(i) + 1];
      bool ok;
      if (opt_.sampling.greedy()) {
        ok = argmax(row, V_) == d;
      } else {
        sampling_distribution(row, V_, opt_.sampling, probs_);
        ok = uniform() < double(probs_[size_t(d)]);
        if (!ok) probs_[size_t(d)] = 0.0f;  // residual max(0, p - onehot(d)), renormalised
      }
      if (ok) {
        fresh_.push_back(d);
        ++accepted;
        continue;
      }
      fresh_.push_back(opt_.sampling.greedy() ? int32_t(argmax(row, V_))
                                              : int32_t(sample_index(probs_, uniform())));
      rejected = true;
      break;
    }
    if (!rejected) fresh_.push_back(choose(logits + size_t(drafts()) * size_t(V_)));
    last_ = fresh_.back();
    running_ = push(fresh_);
    return accepted;
  }

 private:
  double uniform() { return double(rng_() >> 11) * 0x1.0p-53; }
  int32_t choose(const float* row) {
    if (opt_.sampling.greedy()) return int32_t(argmax(row, V_));
    sampling_distribution(row, V_, opt_.sampling, probs_);
    return int32_t(sample_index(probs_, uniform()));
  }
  // Appends tokens up to EOS (not included) to the output; false once EOS is reached.
  bool push(std::span<const int32_t> tokens) {
    size_t n = tokens.size();
    bool stop = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == opt_.eos_token_id) {
        n = i;
        stop = true;
        break;
      }
    }
    out_.insert(out_.end(), tokens.begin(), tokens.begin() + int64_t(n));
    history_.insert(history_.end(), tokens.begin(), tokens.begin() + int64_t(n));
    if (n > 0 && emit_ && *emit_) (*emit_)(tokens.subspan(0, n));
    return !stop;
  }

  const GenerateOptions& opt_;
  int V_;
  std::mt19937_64 rng_;
  const Emit* emit_;
  std::vector<int32_t> history_;  // prompt ++ output: what the drafter searches
  std::vector<int32_t> out_;
  std::vector<int32_t> window_, fresh_;
  std::vector<float> probs_;
  int32_t last_ = 0;
  bool running_ = true;
};

// Releases the model's slots however generation ends.
struct SlotGuard {
  Mamba2Model& model;
  std::vector<int> slots;
  ~SlotGuard() {
    for (int s : slots) model.release(s);
  }
};

}  // namespace

std::vector<int32_t> generate(Mamba2Model& model, std::span<const int32_t> prompt,
                              const GenerateOptions& options,
                              const std::function<void(std::span<const int32_t>)>& emit,
                              GenerateStats* stats) {
  validate_options(model, options, "generate");
  check(!prompt.empty(), "generate: the prompt is empty (at least one token is needed)");
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  st = GenerateStats{};
  st.prompt_tokens = int(prompt.size());

  using clock = std::chrono::steady_clock;
  SlotGuard guard{model, {model.open(options.request_id)}};
  const int slot = guard.slots.front();
  if (options.max_new_tokens == 0) return {};
  Request req(prompt, options, options.sampling.seed, model.vocab_size(), &emit);
  std::vector<float> logits;
  const auto t0 = clock::now();
  model.prefill(slot, prompt, logits);
  const auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  const uint64_t flushes0 = model.flushes_per_layer();

  req.start(logits.data());
  while (req.active()) {
    const std::vector<int32_t>& window = req.propose();
    model.verify(slot, window, logits);  // [W, V]; row j predicts the token after window[j]
    ++st.steps;
    st.drafted += req.drafts();
    const int accepted = req.accept(logits.data());
    model.commit(slot, accepted);
    st.accepted += accepted - 1;
  }
  st.passes = st.steps;
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  st.generated = int(req.out().size());
  st.flushes = model.flushes_per_layer() - flushes0;
  return std::move(req.take_out());
}

std::vector<std::vector<int32_t>> generate_batch(Mamba2Model& model,
                                                 std::span<const std::vector<int32_t>> prompts,
                                                 const GenerateOptions& options,
                                                 GenerateStats* stats) {
  validate_options(model, options, "generate_batch");
  check(!prompts.empty(), "generate_batch: no prompts");
  for (size_t i = 0; i < prompts.size(); ++i)
    check(!prompts[i].empty(), "generate_batch: prompt ", i,
          " is empty (at least one token is needed)");
  check(int64_t(prompts.size()) <= model.runner_config().num_slots,
        "generate_batch: ", prompts.size(), " prompts need as many slots; the runner has ",
        model.runner_config().num_slots);
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  st = GenerateStats{};
  const int V = model.vocab_size();
  const size_t n = prompts.size();

  using clock = std::chrono::steady_clock;
  SlotGuard guard{model, {}};
  for (size_t i = 0; i < n; ++i) guard.slots.push_back(model.open(options.request_id + i));
  std::vector<std::vector<int32_t>> outs(n);
  if (options.max_new_tokens == 0) return outs;
  std::vector<Request> reqs;
  reqs.reserve(n);
  for (size_t i = 0; i < n; ++i)
    reqs.emplace_back(prompts[i], options, request_seed(options.sampling.seed, i), V, nullptr);

  // Prefill one request at a time: prompts differ in length, and a prefill is long enough that
  // batching it buys little.
  std::vector<float> logits;
  const auto t0 = clock::now();
  for (size_t i = 0; i < n; ++i) {
    st.prompt_tokens += int(prompts[i].size());
    model.prefill(guard.slots[i], prompts[i], logits);
    reqs[i].start(logits.data());
  }
  const auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  const uint64_t flushes0 = model.flushes_per_layer();

  std::vector<size_t> active;  // request indices in this pass
  std::vector<int> slots, accepted;
  std::vector<int32_t> tokens;  // [S, W]
  for (;;) {
    active.clear();
    int W = 1;
    for (size_t i = 0; i < n; ++i) {
      if (!reqs[i].active()) continue;
      active.push_back(i);
      W = std::max(W, int(reqs[i].propose().size()));
    }
    if (active.empty()) break;
    // One window size for the batch: shorter windows are padded with copies of their last token.
    // Padding is causal-invisible to the real positions (row j sees tokens 0..j only) and is never
    // accepted (accept() reads only the request's own drafts), so it costs compute, not results.
    slots.clear();
    tokens.clear();
    for (size_t i : active) {
      const std::vector<int32_t>& window = reqs[i].window();
      slots.push_back(guard.slots[i]);
      tokens.insert(tokens.end(), window.begin(), window.end());
      tokens.insert(tokens.end(), size_t(W) - window.size(), window.back());
      st.padded += W - int64_t(window.size());
    }
    model.verify_batch(slots, tokens, W, logits);  // [S, W, V]
    ++st.passes;
    accepted.clear();
    for (size_t s = 0; s < active.size(); ++s) {
      Request& req = reqs[active[s]];
      ++st.steps;
      st.drafted += req.drafts();
      accepted.push_back(req.accept(logits.data() + s * size_t(W) * size_t(V)));
      st.accepted += accepted.back() - 1;
    }
    model.commit_batch(slots, accepted);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  st.flushes = model.flushes_per_layer() - flushes0;
  for (size_t i = 0; i < n; ++i) {
    outs[i] = std::move(reqs[i].take_out());
    st.generated += int(outs[i].size());
  }
  return outs;
}

}  // namespace replayssm::model
