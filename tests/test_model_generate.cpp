// Generation tests: sampling helpers, the prompt-lookup drafter, speculative greedy decoding
// reproducing plain greedy decoding exactly (fp32 mode), the rejection-sampling rule keeping the
// sampling distribution, agreement in the low-precision modes, and the tokenizers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/acceptance.h"
#include "io/trace.h"
#include "model/generate.h"
#include "model/mamba2.h"
#include "model/synthetic.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "model_test_util.h"
#include "replayssm/error.h"

namespace replayssm::model {
namespace {

std::shared_ptr<const ModelWeights> tiny_weights(uint64_t seed, const std::string& name) {
  return testing::load_tiny_weights(seed, "gen_" + name);
}
using testing::builtin_weights;

std::vector<int32_t> bytes_of(const std::string& s) { return ByteTokenizer().encode(s); }

TEST(Sampling, DistributionsAndDraws) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(argmax(logits.data(), 5), 1);  // lowest index among equal maxima
  std::vector<float> p;
  SamplingParams sp;
  sampling_distribution(logits.data(), 5, sp, p);  // greedy: one-hot
  EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0, 0}));
  sp.temperature = 1.0f;
  sampling_distribution(logits.data(), 5, sp, p);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(p[size_t(i)], std::exp(double(logits[size_t(i)])) / z, 1e-6);
  sp.top_k = 2;  // the two 3.0 logits
  sampling_distribution(logits.data(), 5, sp, p);
  EXPECT_NEAR(p[1], 0.5, 1e-6);
  EXPECT_NEAR(p[3], 0.5, 1e-6);
  EXPECT_EQ(p[2], 0.0f);
  sp.top_k = 0;
  sp.top_p = 0.5f;  // the top token alone reaches ~0.39, two reach ~0.78
  sampling_distribution(logits.data(), 5, sp, p);
  EXPECT_NEAR(p[1] + p[3], 1.0, 1e-6);
  sp.temperature = 0.01f;
  sp.top_p = 1.0f;
  sampling_distribution(logits.data(), 5, sp, p);
  EXPECT_NEAR(p[1] + p[3], 1.0, 1e-6);
  EXPECT_EQ(sample_index({0.0f, 0.25f, 0.75f}, 0.0), 1);
  EXPECT_EQ(sample_index({0.0f, 0.25f, 0.75f}, 0.3), 2);
  EXPECT_EQ(sample_index({0.0f, 0.25f, 0.75f}, 0.999999), 2);
  sp.top_p = 0.0f;
  EXPECT_THROW(sp.validate(), Error);
  sp.top_p = 1.0f;
  sp.temperature = -1.0f;
  EXPECT_THROW(sp.validate(), Error);
}

TEST(Drafter, PromptLookup) {
  PromptLookupDrafter d;
  // "a b c d x a b" -> the trigram is absent, the bigram "a b" recurs: propose "c d x a b"...
  const std::vector<int32_t> h = {1, 2, 3, 4, 9, 1, 2};
  EXPECT_EQ(d.propose(h, 3), (std::vector<int32_t>{3, 4, 9}));
  EXPECT_EQ(d.propose(h, 0), std::vector<int32_t>{});
  // Drafts stop at the end of the history.
  EXPECT_EQ(d.propose(h, 7), (std::vector<int32_t>{3, 4, 9, 1, 2}));
  // The most recent match wins.
  const std::vector<int32_t> h2 = {5, 6, 5, 7, 5};
  EXPECT_EQ(d.propose(h2, 2), (std::vector<int32_t>{7, 5}));
  // No match: no drafts.
  EXPECT_EQ(d.propose(std::vector<int32_t>{1, 2, 3}, 4), std::vector<int32_t>{});
  EXPECT_EQ(d.propose(std::vector<int32_t>{1}, 4), std::vector<int32_t>{});
}

// Greedy with drafts == greedy without, token for token, in the fp32 mode; drafts do get
// accepted (the prompt repeats itself).
TEST(Generate, SpeculativeGreedyEqualsGreedy) {
  struct Case {
    std::shared_ptr<const ModelWeights> w;
    std::vector<int32_t> prompt;
    int n;
  };
  std::vector<int32_t> tiny_prompt;
  for (int r = 0; r < 4; ++r)
    for (int t : {3, 14, 15, 9, 26, 5, 35, 8, 9, 7}) tiny_prompt.push_back(t);
  const std::string code =
      "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, "
      "b):\n";
  const std::vector<Case> cases = {{tiny_weights(21, "spec"), tiny_prompt, 96},
                                   {builtin_weights(), bytes_of(code), 160}};
  for (const Case& c : cases) {
    RunnerConfig rc;
    rc.threads = 1;
    Mamba2Model model(c.w, rc);
    GenerateOptions opt;
    opt.max_new_tokens = c.n;
    opt.draft_max = 0;
    GenerateStats plain_stats;
    const std::vector<int32_t> plain = generate(model, c.prompt, opt, nullptr, &plain_stats);
    ASSERT_EQ(int(plain.size()), c.n);
    EXPECT_EQ(plain_stats.steps, c.n - 1);
    for (int k : {1, 3, 7}) {
      opt.draft_max = k;
      GenerateStats st;
      std::vector<int32_t> streamed;
      const std::vector<int32_t> spec = generate(
          model, c.prompt, opt,
          [&](std::span<const int32_t> t) { streamed.insert(streamed.end(), t.begin(), t.end()); },
          &st);
      EXPECT_EQ(spec, plain) << "draft_max " << k;
      EXPECT_EQ(streamed, spec);
      EXPECT_GT(st.accepted, 0) << "draft_max " << k;
      EXPECT_LT(st.steps, c.n - 1) << "draft_max " << k;
      EXPECT_EQ(st.generated, c.n);
    }
  }
}

// --capture: the recorded trace of one layer (prefill, verify windows, commits with rejected
// drafts), replayed through a fresh cache by the trace runner in the same mode, ends in the bytes
// of the model's own cache of that layer, for the fp32 and a stochastically rounded mode.
TEST(Generate, CapturedLayerTraceReplaysToTheSameCache) {
  const std::string code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n";
  for (Mode mode : {Mode::fp32, Mode::separate_fp8}) {
    RunnerConfig rc;
    rc.threads = 1;
    rc.mode = mode;
    rc.activation_dtype = DType::bf16;
    Mamba2Model model(builtin_weights(), rc);
    model.capture_layer(1);
    // Request id 0 in slot 0: what a trace assumes for its slots, so SR draws the same bits.
    const int slot = model.open(0);
    ASSERT_EQ(slot, 0);
    const std::vector<int32_t> tokens = bytes_of(code);
    std::vector<float> logits;
    model.prefill(slot, std::span(tokens).first(20), logits);
    for (size_t at = 20, step = 0; at + 8 <= tokens.size(); ++step) {
      model.verify(slot, std::span(tokens).subspan(at, 8), logits);
      const int accepted = 1 + int(step * 5 % 8);  // a spread of accepted counts
      model.commit(slot, accepted);
      at += size_t(accepted);
    }
    io::Trace trace = model.captured();
    ASSERT_GT(trace.ops.size(), 10u);
    io::TraceOp exported;
    exported.kind = io::OpKind::export_slot;
    exported.slots = {0};
    trace.ops.push_back(exported);
    // The file round trip is part of what --capture promises.
    const io::Trace reread = io::parse_trace(io::trace_to_file(trace), "captured trace");
    const io::StFile out = io::run_trace(reread, io::RunOptions{});
    const io::StTensor* replayed = nullptr;
    for (const auto& [name, tensor] : out.tensors)
      if (name.rfind("export.", 0) == 0) replayed = &tensor;
    ASSERT_NE(replayed, nullptr);
    EXPECT_EQ(replayed->data, model.cache(1).export_slot(0)) << mode_name(mode);
  }
}

// Agreement of speculative greedy decoding in the low-precision modes with fp32 plain greedy
// (reported, loosely bounded: bf16 activations and 8/4-bit readouts may flip near-ties).
TEST(Generate, LowPrecisionModesAgreement) {
  const std::string code =
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"
      "\n        self.items.append(item)\n\n    def pop(self):\n";
  const std::vector<int32_t> prompt = bytes_of(code);
  GenerateOptions opt;
  opt.max_new_tokens = 96;
  opt.draft_max = 0;
  RunnerConfig base;
  base.threads = 1;
  Mamba2Model ref_model(builtin_weights(), base);
  const std::vector<int32_t> ref = generate(ref_model, prompt, opt, nullptr, nullptr);
  opt.draft_max = 7;
  for (Mode mode : kAllModes) {
    RunnerConfig rc = base;
    rc.mode = mode;
    rc.activation_dtype = mode == Mode::fp32 ? DType::f32 : DType::bf16;
    Mamba2Model model(builtin_weights(), rc);
    GenerateStats st;
    const std::vector<int32_t> got = generate(model, prompt, opt, nullptr, &st);
    int prefix = 0;
    while (prefix < int(got.size()) && got[size_t(prefix)] == ref[size_t(prefix)]) ++prefix;
    int same = 0;
    for (size_t i = 0; i < got.size(); ++i) same += got[i] == ref[i];
    std::printf(
        "%-15s common prefix %3d/%zu, same position %3d/%zu, acceptance %.2f, flushes %llu\n",
        mode_name(mode), prefix, ref.size(), same, ref.size(), st.acceptance_rate(),
        static_cast<unsigned long long>(st.flushes));
    if (mode == Mode::fp32) {
      EXPECT_EQ(got, ref);
    }
    EXPECT_GE(prefix, 8) << mode_name(mode);
  }
}

// Rejection sampling keeps the distribution: token frequencies at positions 1..3 of sampled
// continuations match plain sampling's (total variation, fixed seeds, 3000 runs each).
TEST(Generate, SpeculativeSamplingKeepsTheDistribution) {
  auto w = tiny_weights(31, "sampling");
  std::vector<int32_t> prompt;
  for (int r = 0; r < 3; ++r)
    for (int t : {4, 8, 15, 16, 23, 42}) prompt.push_back(t);
  RunnerConfig rc;
  rc.threads = 1;
  Mamba2Model model(w, rc);
  const int V = w->config.vocab_size, runs = 3000, len = 4;
  auto histogram = [&](int draft_max, int64_t* drafted, int64_t* accepted) {
    std::vector<std::vector<double>> h(size_t(len), std::vector<double>(size_t(V), 0.0));
    GenerateOptions opt;
    opt.max_new_tokens = len;
    opt.draft_max = draft_max;
    opt.sampling.temperature = 0.7f;
    for (int r = 0; r < runs; ++r) {
      opt.sampling.seed = uint64_t(r) + (draft_max ? 1000003u : 0u);
      GenerateStats st;
      const std::vector<int32_t> out = generate(model, prompt, opt, nullptr, &st);
      for (int i = 0; i < len; ++i) h[size_t(i)][size_t(out[size_t(i)])] += 1.0 / runs;
      if (drafted) *drafted += st.drafted;
      if (accepted) *accepted += st.accepted;
    }
    return h;
  };
  int64_t drafted = 0, accepted = 0;
  const auto plain = histogram(0, nullptr, nullptr);
  const auto spec = histogram(3, &drafted, &accepted);
  EXPECT_GT(drafted, runs);
  EXPECT_GT(accepted, drafted / 20) << "drafts must be accepted sometimes for this to test much";
  for (int i = 1; i < len; ++i) {
    double tv = 0;
    for (int v = 0; v < V; ++v)
      tv += 0.5 * std::fabs(plain[size_t(i)][size_t(v)] - spec[size_t(i)][size_t(v)]);
    EXPECT_LT(tv, 0.06) << "position " << i;
  }
}

TEST(Generate, BadOptions) {
  RunnerConfig rc;
  rc.threads = 1;
  Mamba2Model model(tiny_weights(41, "bad"), rc);
  GenerateOptions opt;
  EXPECT_THROW(generate(model, std::vector<int32_t>{}, opt, nullptr, nullptr), Error);
  opt.draft_max = 8;  // max_window 8 allows 7
  EXPECT_THROW(generate(model, std::vector<int32_t>{1}, opt, nullptr, nullptr), Error);
  opt.draft_max = 2;
  opt.sampling.top_p = 2.0f;
  EXPECT_THROW(generate(model, std::vector<int32_t>{1}, opt, nullptr, nullptr), Error);
  opt.sampling.top_p = 1.0f;
  EXPECT_THROW(generate(model, std::vector<int32_t>{1, 1000}, opt, nullptr, nullptr), Error);
  // The slot of a failed call is released again.
  EXPECT_EQ(generate(model, std::vector<int32_t>{1, 2}, opt, nullptr, nullptr).size(), 64u);
  opt.eos_token_id = 5;
  for (int32_t t : generate(model, std::vector<int32_t>{1, 2}, opt, nullptr, nullptr))
    EXPECT_NE(t, 5);
}

// The e2e measurement pieces: the acceptance solve, the committed-length mean, flush cadence.
TEST(Synthetic, AcceptanceProcessAndFlushCadence) {
  EXPECT_NEAR(acceptance_for_mean(1.0, 8), 0.0, 1e-9);
  EXPECT_NEAR(acceptance_for_mean(8.0, 8), 1.0, 1e-9);
  const double a = acceptance_for_mean(4.3, 8);
  double mean = 0, p = 1;
  for (int i = 0; i < 8; ++i, p *= a) mean += p;
  EXPECT_NEAR(mean, 4.3, 1e-9);
  EXPECT_THROW(acceptance_for_mean(9.0, 8), Error);

  const ModelConfig c = config_for_preset(find_preset("tiny"), 300);
  EXPECT_EQ(c.hidden_size, 4 * 16 / 2);
  auto w = std::make_shared<const ModelWeights>(random_weights(c, 3));
  EXPECT_EQ(random_weights(c, 3).layers[1].in_proj.bytes, w->layers[1].in_proj.bytes);
  RunnerConfig rc;
  rc.threads = 1;
  Mamba2Model model(w, rc);
  SyntheticOptions o;
  o.prompt_tokens = 40;
  o.new_tokens = 4000;
  o.window = 8;
  o.mean_accepted_length = 4.3;
  const SyntheticResult spec = run_synthetic(model, o);
  EXPECT_EQ(spec.generated, 4000);
  EXPECT_NEAR(spec.mean_accepted_length(), 4.3, 0.15);
  o.window = 1;
  o.new_tokens = 513;
  const SyntheticResult plain = run_synthetic(model, o);
  EXPECT_EQ(plain.steps, 513);
  EXPECT_EQ(plain.flushes, 32u);  // SPEC 7.4: one flush every `history` tokens
}

TEST(Tokenizer, ByteRoundTrip) {
  ByteTokenizer t;
  const char raw[] = "def f(x):\n\treturn x\xc3\xa9\xe2\x82\xac\0end";
  const std::string s(raw, sizeof(raw) - 1);
  EXPECT_EQ(t.decode(t.encode(s)), s);
  EXPECT_EQ(t.encode("AB"), (std::vector<int32_t>{65, 66}));
  EXPECT_EQ(t.decode(300), "");
}

TEST(Tokenizer, Gpt2PreTokenizer) {
  using V = std::vector<std::string>;
  EXPECT_EQ(gpt2_pre_tokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2_pre_tokenize("don't stop"), (V{"don", "'t", " stop"}));
  EXPECT_EQ(gpt2_pre_tokenize("x  = 42;"), (V{"x", " ", " =", " 42", ";"}));
  EXPECT_EQ(gpt2_pre_tokenize("a\n\n    b"), (V{"a", "\n\n   ", " b"}));
  EXPECT_EQ(gpt2_pre_tokenize("end  "), (V{"end", "  "}));
  EXPECT_EQ(gpt2_pre_tokenize("\nx"), (V{"\n", "x"}));
  EXPECT_EQ(gpt2_pre_tokenize("caf\xc3\xa9 ok"), (V{"caf\xc3\xa9", " ok"}));
  EXPECT_EQ(gpt2_pre_tokenize("f(x)+1"), (V{"f", "(", "x", ")+", "1"}));
  // Non-ASCII classes: an emoji is neither letter nor number, U+00A0 is white space, U+00B2
  // (superscript two) is a number, Cyrillic and CJK are letters.
  EXPECT_EQ(gpt2_pre_tokenize("ab\xf0\x9f\x98\x80"
                              "cd"),
            (V{"ab", "\xf0\x9f\x98\x80", "cd"}));
  EXPECT_EQ(gpt2_pre_tokenize("x\xc2\xa0y"), (V{"x", "\xc2\xa0", "y"}));
  EXPECT_EQ(gpt2_pre_tokenize("m\xc2\xb2 \xd0\xbc\xd0\xb8\xd1\x80\xe4\xb8\xad"),
            (V{"m", "\xc2\xb2", " \xd0\xbc\xd0\xb8\xd1\x80\xe4\xb8\xad"}));
}

// A small tokenizer.json in the GPT-2 layout: the 256 byte characters plus a few merges.
std::string tiny_tokenizer_json(bool pair_merges, bool prefix_space = false) {
  // GPT-2 byte -> character map, as in the tokenizer's code, written out independently.
  std::vector<std::string> chars(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cp = printable ? b : 256 + extra++;
    std::string u;
    if (cp < 0x80) {
      u += char(cp);
    } else {
      u += char(0xC0 | (cp >> 6));
      u += char(0x80 | (cp & 0x3F));
    }
    chars[size_t(b)] = u;
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[chars[size_t(b)]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0t", "he"}, {"d", "e"}, {"de", "f"}};
  int id = 256;
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    if (pair_merges) {
      m.push_back({a, b});
    } else {
      m.push_back(a + " " + b);
    }
  }
  nlohmann::json root = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", {{{"type", "ByteLevel"}, {"add_prefix_space", prefix_space}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  return root.dump();
}

TEST(Tokenizer, ByteLevelBpe) {
  for (bool pairs : {false, true}) {
    const auto tok = parse_bpe_tokenizer(tiny_tokenizer_json(pairs), "tokenizer.json");
    // " the" -> "Ġthe" (merges Ġ+t, h+e, Ġt+he), "def" -> "def".
    EXPECT_EQ(tok->encode("def the"), (std::vector<int32_t>{260, 258}));
    EXPECT_EQ(tok->encode("the"), (std::vector<int32_t>{'t', 257}));
    EXPECT_EQ(tok->encode("a<|endoftext|>b"), (std::vector<int32_t>{'a', 300, 'b'}));
    EXPECT_EQ(tok->decode(258), " the");
    EXPECT_EQ(tok->decode(300), "<|endoftext|>");
    for (const std::string& s :
         {std::string("def the(x):\n\treturn x  # caf\xc3\xa9 \xe2\x82\xac\n"), std::string(" "),
          std::string("\n\n\n"), std::string("don't 'x' 123abc")}) {
      EXPECT_EQ(tok->decode(tok->encode(s)), s);
    }
  }
  // add_prefix_space: "the" is encoded as " the".
  const auto spaced = parse_bpe_tokenizer(tiny_tokenizer_json(false, true), "tokenizer.json");
  EXPECT_EQ(spaced->encode("the"), (std::vector<int32_t>{258}));
  EXPECT_THROW(parse_bpe_tokenizer("{\"model\": {\"type\": \"Unigram\"}}", "t"), Error);
  EXPECT_THROW(parse_bpe_tokenizer("{", "t"), Error);
  EXPECT_THROW(parse_bpe_tokenizer(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "pre_tokenizer": {"type": "Metaspace"}})",
                                   "t"),
               Error);
}

// The Hugging Face tokenizers library's own ids for a byte-level BPE it trained, GPT-NeoX style
// (tests/data/bpe, made by scripts/make_bpe_fixture.py): code, prose, contractions, whitespace
// runs, special tokens inside text, non-ASCII letters, digits and symbols.
TEST(Tokenizer, MatchesTheTokenizersLibrary) {
  const std::string dir = std::string(REPLAYSSM_SOURCE_DIR) + "/tests/data/bpe";
  ModelConfig config;
  const auto tok = load_tokenizer(dir, config);
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << dir << "/expected.json";
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_GE(expected["cases"].size(), 10u);
  for (const auto& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text), ids) << "text: " << text;
    if (c.value("decodes_back", true)) {
      EXPECT_EQ(tok->decode(ids), text);
    }
  }
}

}  // namespace
}  // namespace replayssm::model
