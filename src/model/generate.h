// Text generation with the Mamba-2 runner: greedy or sampled decoding, optionally speculative
// with a prompt-lookup (n-gram) drafter. Each step verifies [last token, drafts...] in one pass
// through every layer (Mamba2Model::verify) and commits the accepted prefix (commit), so
// rejected drafts never reach the SSM checkpoints or the conv history.
//
// Acceptance: greedy keeps a draft while it equals the argmax of the model's distribution at its
// position (the output is exactly greedy decoding's). Sampling uses the standard rejection rule
// for a deterministic drafter (draft distribution q = one-hot at the draft d): accept d with
// probability min(1, p(d) / q(d)) = p(d); on rejection sample from normalize(max(0, p - q)),
// i.e. p with d removed; after an all-accepted window sample a bonus token from the last row.
// The tokens are then distributed exactly as plain sampling from p.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "model/mamba2.h"

namespace replayssm::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no top-k cut
  float top_p = 1.0f;        // 1: no nucleus cut
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0f; }
  void validate() const;
};

// Index of the largest logit; the lowest index wins ties, so the choice is reproducible.
int argmax(const float* logits /*[V]*/, int V);

// The sampling distribution: softmax(logits / temperature) restricted to the top_k largest and
// then to the smallest set whose mass reaches top_p, renormalised. probs [V], zeros outside.
void sampling_distribution(const float* logits /*[V]*/, int V, const SamplingParams& params,
                           std::vector<float>& probs);

// Draws an index from probs [V] (sums to 1 up to rounding) with u ~ U[0,1).
int sample_index(const std::vector<float>& probs, double u);

// Prompt lookup: finds the most recent earlier occurrence of the last n tokens (n from max_ngram
// down to min_ngram) and proposes the tokens that followed it.
struct PromptLookupDrafter {
  int max_ngram = 3;
  int min_ngram = 1;
  std::vector<int32_t> propose(std::span<const int32_t> history, int max_drafts) const;
};

struct GenerateOptions {
  int max_new_tokens = 64;
  int draft_max = 7;  // drafts per step, 0..max_window-1; 0 is plain decoding
  SamplingParams sampling;
  PromptLookupDrafter drafter;
  int eos_token_id = -1;  // stop after this token (not emitted); -1: never
  uint64_t request_id = 1;
};

struct GenerateStats {
  int prompt_tokens = 0;
  int generated = 0;  // tokens emitted
  double prefill_seconds = 0;
  double decode_seconds = 0;  // everything after the prefill
  int steps = 0;              // verify windows (one per request and pass)
  int passes = 0;             // verify passes through the model (generate: = steps)
  int64_t padded = 0;         // generate_batch: window positions that only pad to the batch's W
  int64_t drafted = 0;        // draft tokens proposed and verified
  int64_t accepted = 0;       // of those, accepted
  uint64_t flushes = 0;       // checkpoint flushes of layer 0 during decoding (all slots)
  double decode_tokens_per_second() const;
  double mean_accepted_length() const;  // tokens committed per window (1 + accepted drafts)
  double acceptance_rate() const;       // accepted / drafted
};

// Generates from `prompt` in a fresh slot of `model` (released at the end). `emit` receives the
// new tokens of each step as they are decided. Returns the generated tokens.
std::vector<int32_t> generate(Mamba2Model& model, std::span<const int32_t> prompt,
                              const GenerateOptions& options,
                              const std::function<void(std::span<const int32_t>)>& emit,
                              GenerateStats* stats);

// Generates from several prompts together, one slot each (released at the end); returns each
// prompt's tokens. Each prompt is prefilled alone; then every pass verifies the windows of all
// unfinished requests in one Mamba2Model::verify_batch: W = 1 + the most drafts among them, shorter
// windows padded with copies of their last token (never accepted: a request accepts at most its
// own drafts), acceptance per request exactly as generate(), one commit_batch. Request i runs in
// a slot with request id options.request_id + i and samples from its own stream,
// mt19937_64(request_seed(options.sampling.seed, i)). In the fp32 mode its logits are
// generate()'s with that seed and request id up to rounding where padding moves a flush (a slot
// flushes when c + W > history with the batch's W), so its tokens are generate()'s except at a
// near-tie (none in the tests). stats sums over the requests (steps: windows, passes: batches).
std::vector<std::vector<int32_t>> generate_batch(Mamba2Model& model,
                                                 std::span<const std::vector<int32_t>> prompts,
                                                 const GenerateOptions& options,
                                                 GenerateStats* stats);

// The sampling seed of request `index` of a batch: `seed` itself for index 0 (so a batch of one
// samples as generate()), a splitmix64 mix of (seed, index) otherwise.
uint64_t request_seed(uint64_t seed, size_t index);

}  // namespace replayssm::model
