// Batched verify (issue 8): Mamba2Model::verify_batch / commit_batch against separate one-slot
// calls, generate_batch against generate() on each prompt alone, and bad batched calls changing
// nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "model/generate.h"
#include "model/mamba2.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "model_test_util.h"
#include "replayssm/error.h"

namespace replayssm::model {
namespace {

std::shared_ptr<const ModelWeights> tiny_weights(uint64_t seed) {
  return testing::load_tiny_weights(seed, "batch");
}
using testing::builtin_weights;

using testing::random_token_ids;

std::vector<int32_t> bytes_of(const std::string& s) { return ByteTokenizer().encode(s); }

// Everything a slot holds in the runner: every layer's exported cache and conv state.
struct SlotSnapshot {
  std::vector<std::vector<uint8_t>> caches;
  std::vector<std::vector<float>> conv_committed, conv_pending;
  std::vector<int> conv_pending_count;
  bool operator==(const SlotSnapshot&) const = default;
};

SlotSnapshot snapshot(Mamba2Model& m, int slot) {
  SlotSnapshot s;
  for (int l = 0; l < m.config().num_layers; ++l) {
    s.caches.push_back(m.cache(l).export_slot(slot));
    const ConvState& cs = m.conv_state(l, slot);
    s.conv_committed.push_back(cs.committed);
    s.conv_pending.push_back(cs.pending);
    s.conv_pending_count.push_back(cs.pending_count);
  }
  return s;
}

using testing::error_of;
using testing::max_rel_diff;

// verify_batch over S slots (unsorted, a changing subset, windows of every size) gives each slot
// the logits of a verify of that slot alone, and commit_batch leaves every layer's cache and conv
// state as separate commits do. Model a batches, model b runs the same slots one by one. The
// GEMMs and the cache work row by row and slot by slot, so this holds to the bit (the test asks
// for 1e-6 relative on logits and equal bytes for the state); the separate-fp8 arm checks that the
// stochastic rounding at flushes follows the slot's request id, not its batch position.
TEST(ModelBatch, VerifyBatchMatchesSeparateVerifies) {
  struct Case {
    const char* name;
    std::shared_ptr<const ModelWeights> w;
    Mode mode;
  };
  const std::vector<Case> cases = {{"tiny fp32", tiny_weights(51), Mode::fp32},
                                   {"builtin fp32", builtin_weights(), Mode::fp32},
                                   {"tiny separate-fp8", tiny_weights(52), Mode::separate_fp8}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RunnerConfig rc;
    rc.threads = 1;
    rc.mode = c.mode;
    rc.activation_dtype = c.mode == Mode::fp32 ? DType::f32 : DType::bf16;
    rc.num_slots = 5;
    Mamba2Model a(c.w, rc), b(c.w, rc);
    const int V = a.vocab_size(), S = 4;
    std::mt19937_64 rng(7);
    std::vector<int> slots;
    for (int s = 0; s < S; ++s) {
      slots.push_back(a.open(100 + uint64_t(s)));
      ASSERT_EQ(b.open(100 + uint64_t(s)), slots.back());
      const std::vector<int32_t> prompt = random_token_ids(3 + 5 * s, V, rng);
      std::vector<float> la, lb;
      a.prefill(slots.back(), prompt, la);
      b.prefill(slots.back(), prompt, lb);
    }
    std::vector<float> la, lb;
    for (int step = 0; step < 40; ++step) {  // 40 steps of up to 8 tokens: several flushes
      // A changing, unsorted subset of the slots.
      std::vector<int> batch = slots;
      std::shuffle(batch.begin(), batch.end(), rng);
      batch.resize(size_t(1 + int(rng() % uint64_t(S))));
      const int W = 1 + int(rng() % uint64_t(rc.max_window));
      const std::vector<int32_t> tokens = random_token_ids(int(batch.size()) * W, V, rng);
      a.verify_batch(batch, tokens, W, la);
      ASSERT_EQ(la.size(), batch.size() * size_t(W) * size_t(V));
      std::vector<int> accepted;
      for (size_t s = 0; s < batch.size(); ++s) {
        b.verify(batch[s], std::span(tokens).subspan(s * size_t(W), size_t(W)), lb);
        ASSERT_EQ(lb.size(), size_t(W) * size_t(V));
        EXPECT_LE(max_rel_diff(la.data() + s * lb.size(), lb.data(), lb.size()), 1e-6)
            << "step " << step << " slot " << batch[s];
        accepted.push_back(1 + int(rng() % uint64_t(W)));
        b.commit(batch[s], accepted.back());
      }
      a.commit_batch(batch, accepted);
      for (int slot : slots) {
        ASSERT_TRUE(snapshot(a, slot) == snapshot(b, slot)) << "step " << step << " slot " << slot;
        EXPECT_EQ(a.cache(0).state(slot), b.cache(0).state(slot));
      }
    }
    EXPECT_GT(a.flushes_per_layer(), 0u);
    EXPECT_EQ(a.flushes_per_layer(), b.flushes_per_layer());
  }
}

// Bad batched calls throw an Error naming the problem and change no slot.
TEST(ModelBatch, BadCallsChangeNothing) {
  RunnerConfig rc;
  rc.threads = 1;
  rc.num_slots = 4;
  Mamba2Model m(tiny_weights(53), rc);
  const int V = m.vocab_size();
  std::vector<float> logits;
  const int s0 = m.open(1), s1 = m.open(2), s2 = m.open(3);
  for (int s : {s0, s1, s2}) m.prefill(s, std::vector<int32_t>{1, 2, 3, 4, 5}, logits);
  // s2 holds a pending window.
  m.verify(s2, std::vector<int32_t>{6, 7}, logits);
  const SlotSnapshot before0 = snapshot(m, s0), before1 = snapshot(m, s1),
                     before2 = snapshot(m, s2);
  logits.assign(3, 42.0f);
  const std::vector<float> logits_before = logits;
  const std::vector<int> both = {s0, s1};
  auto verify = [&](std::vector<int> slots, std::vector<int32_t> tokens, int W) {
    return error_of([&] { m.verify_batch(slots, tokens, W, logits); });
  };
  auto commit = [&](std::vector<int> slots, std::vector<int> accepted) {
    return error_of([&] { m.commit_batch(slots, accepted); });
  };
  struct Expect {
    std::string message, needle;
  };
  const std::vector<Expect> cases = {
      {verify({s0, s0}, {1, 2}, 1), "appears twice"},
      {verify(both, {}, 0), "outside 1..max_window"},
      {verify(both, std::vector<int32_t>(18, 1), 9), "outside 1..max_window"},
      {verify(both, {1, 2, 3}, 2), "expected slots x window"},
      {verify(both, {1, 2, 3, V}, 2), "outside the vocabulary"},
      {verify(both, {1, 2, 3, -1}, 2), "outside the vocabulary"},
      {verify({s0, 3}, {1, 2}, 1), "slot 3 is not open"},
      {verify({s0, 7}, {1, 2}, 1), "slot 7 is not open"},
      {verify({}, {}, 1), "slot list is empty"},
      {verify({s0, s2}, {1, 2}, 1), "uncommitted verify window"},
      {commit(both, {1, 1}), "no verify window"},
      {commit({s2, s0}, {1, 1}), "no verify window"},
      {commit({s2}, {0}), "outside 1..2"},
      {commit({s2}, {3}), "outside 1..2"},
      {commit({s2}, {1, 1}), "accepted counts for 1 slots"},
      {commit({s2, s2}, {1, 1}), "appears twice"},
  };
  for (const Expect& e : cases) {
    EXPECT_NE(e.message.find(e.needle), std::string::npos)
        << "message '" << e.message << "' lacks '" << e.needle << "'";
  }
  EXPECT_EQ(logits, logits_before);
  EXPECT_TRUE(snapshot(m, s0) == before0);
  EXPECT_TRUE(snapshot(m, s1) == before1);
  EXPECT_TRUE(snapshot(m, s2) == before2);
  // The slots still work: s2's window commits, then all three verify together.
  m.commit_batch(std::vector<int>{s2}, std::vector<int>{2});
  m.verify_batch(std::vector<int>{s2, s0, s1}, std::vector<int32_t>{1, 2, 3}, 1, logits);
  EXPECT_EQ(logits.size(), 3 * size_t(V));
  m.commit_batch(std::vector<int>{s0, s1, s2}, std::vector<int>{1, 1, 1});
}

// Code-like prompts of different lengths and repetitiveness, so that requests draft different
// amounts (and some none) in the same pass.
std::vector<std::vector<int32_t>> code_prompts() {
  return {bytes_of("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
                   "def mul(a, b):\n"),
          bytes_of("import os\n"),
          bytes_of("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def "
                   "push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n"),
          bytes_of("for i in range(10):\n    print(i)\nfor j in range(")};
}

std::vector<int32_t> alone(Mamba2Model& model, std::span<const int32_t> prompt, GenerateOptions opt,
                           size_t index) {
  opt.request_id += index;
  opt.sampling.seed = request_seed(opt.sampling.seed, index);
  return generate(model, prompt, opt, nullptr, nullptr);
}

// Plain greedy decoding (W = 1 for every request): the batch gives each prompt generate()'s
// tokens, and the flush points are the same as alone.
TEST(GenerateBatch, PlainGreedyEqualsGenerate) {
  RunnerConfig rc;
  rc.threads = 1;
  rc.num_slots = 4;
  Mamba2Model model(builtin_weights(), rc);
  const auto prompts = code_prompts();
  GenerateOptions opt;
  opt.max_new_tokens = 80;
  opt.draft_max = 0;
  GenerateStats st;
  const auto outs = generate_batch(model, prompts, opt, &st);
  ASSERT_EQ(outs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(outs[i], alone(model, prompts[i], opt, i)) << "prompt " << i;
    EXPECT_EQ(int(outs[i].size()), opt.max_new_tokens);
  }
  EXPECT_EQ(st.passes, opt.max_new_tokens - 1);
  EXPECT_EQ(st.steps, int(prompts.size()) * (opt.max_new_tokens - 1));
  EXPECT_EQ(st.drafted, 0);
  EXPECT_EQ(st.padded, 0);
  EXPECT_EQ(st.generated, int(prompts.size()) * opt.max_new_tokens);
  // Every slot was released.
  for (int s = 0; s < rc.num_slots; ++s) EXPECT_FALSE(model.cache(0).is_open(s));
}

// Speculative greedy decoding (up to 7 drafts): each request's tokens equal generate()'s on its
// prompt alone and plain greedy decoding's. Padding changes where flushes happen (a slot flushes
// when c + W > history with the batch's W, not its own), which in the fp32 mode moves the result
// only by rounding; with these prompts the tokens are exact. Also with an EOS that ends requests
// at different passes, so the batch shrinks.
TEST(GenerateBatch, SpeculativeGreedyEqualsGenerate) {
  RunnerConfig rc;
  rc.threads = 1;
  rc.num_slots = 4;
  Mamba2Model model(builtin_weights(), rc);
  const auto prompts = code_prompts();
  for (int eos : {-1, int('\n')}) {
    SCOPED_TRACE("eos " + std::to_string(eos));
    GenerateOptions opt;
    opt.max_new_tokens = 120;
    opt.draft_max = 7;
    opt.eos_token_id = eos;
    GenerateStats st;
    const auto outs = generate_batch(model, prompts, opt, &st);
    ASSERT_EQ(outs.size(), prompts.size());
    GenerateOptions plain = opt;
    plain.draft_max = 0;
    int64_t steps_alone = 0;
    uint64_t flushes_alone = 0;
    size_t shortest = size_t(opt.max_new_tokens), longest = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateOptions one = opt;
      one.request_id += i;
      GenerateStats st_one;
      EXPECT_EQ(outs[i], generate(model, prompts[i], one, nullptr, &st_one)) << "prompt " << i;
      EXPECT_EQ(outs[i], alone(model, prompts[i], plain, i)) << "prompt " << i;
      steps_alone += st_one.steps;
      flushes_alone += st_one.flushes;
      shortest = std::min(shortest, outs[i].size());
      longest = std::max(longest, outs[i].size());
    }
    EXPECT_GT(st.accepted, 0);
    EXPECT_EQ(st.steps, steps_alone);  // each request took the windows it takes alone
    EXPECT_LT(st.passes, st.steps);
    EXPECT_GT(st.padded, 0) << "windows of different sizes should share passes";
    // Reported: padding moves flush points (more flushes than the requests make alone).
    std::printf(
        "eos %d: %d passes for %d windows, %lld padded positions, flushes %llu batched vs "
        "%llu alone\n",
        eos, st.passes, st.steps, static_cast<long long>(st.padded),
        static_cast<unsigned long long>(st.flushes),
        static_cast<unsigned long long>(flushes_alone));
    if (eos >= 0) {
      EXPECT_LT(shortest, longest) << "requests should end at different passes";
    }
  }
}

// Sampling: request i draws from mt19937_64(request_seed(seed, i)), so it reproduces generate()
// with that seed; distinct requests get distinct streams.
TEST(GenerateBatch, SamplingFollowsPerRequestStreams) {
  RunnerConfig rc;
  rc.threads = 1;
  rc.num_slots = 4;
  Mamba2Model model(builtin_weights(), rc);
  const std::vector<int32_t> p = bytes_of("def main():\n    ");
  const std::vector<std::vector<int32_t>> prompts = {p, p, p};
  for (int draft_max : {0, 3}) {
    GenerateOptions opt;
    opt.max_new_tokens = 48;
    opt.draft_max = draft_max;
    opt.sampling.temperature = 1.0f;
    opt.sampling.seed = 1234;
    const auto outs = generate_batch(model, prompts, opt, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(outs[i], alone(model, prompts[i], opt, i)) << "request " << i;
    EXPECT_NE(outs[0], outs[1]);
    EXPECT_NE(outs[1], outs[2]);
  }
  EXPECT_EQ(request_seed(99, 0), 99u);
  EXPECT_NE(request_seed(99, 1), request_seed(99, 2));
  EXPECT_NE(request_seed(99, 1), request_seed(100, 1));
}

TEST(GenerateBatch, BadInputs) {
  RunnerConfig rc;
  rc.threads = 1;
  rc.num_slots = 2;
  Mamba2Model model(tiny_weights(54), rc);
  GenerateOptions opt;
  opt.max_new_tokens = 8;
  using Prompts = std::vector<std::vector<int32_t>>;
  EXPECT_NE(error_of([&] { generate_batch(model, Prompts{}, opt, nullptr); }).find("no prompts"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              generate_batch(model, Prompts{{1}, {}}, opt, nullptr);
            }).find("prompt 1 is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              generate_batch(model, Prompts{{1}, {2}, {3}}, opt, nullptr);
            }).find("as many slots"),
            std::string::npos);
  // A token outside the vocabulary fails in the second prefill; both slots are released again.
  EXPECT_NE(error_of([&] {
              generate_batch(model, Prompts{{1}, {2, 1000}}, opt, nullptr);
            }).find("outside the vocabulary"),
            std::string::npos);
  opt.draft_max = 8;
  EXPECT_NE(error_of([&] { generate_batch(model, Prompts{{1}}, opt, nullptr); }).find("draft-max"),
            std::string::npos);
  opt.draft_max = 2;
  const auto outs = generate_batch(model, Prompts{{1, 2}, {3}}, opt, nullptr);
  EXPECT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].size(), 8u);
  opt.max_new_tokens = 0;
  EXPECT_EQ(generate_batch(model, Prompts{{1, 2}, {3}}, opt, nullptr),
            (std::vector<std::vector<int32_t>>(2)));
}

}  // namespace
}  // namespace replayssm::model
