// Model runner tests: the Hugging Face loader and its errors, the forward pass against an
// independent FP64 reference (prefill and verify/commit windows), and rollback of rejected drafts.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/mamba2.h"
#include "model/weights.h"
#include "model_test_util.h"
#include "replayssm/error.h"

namespace replayssm::model {
namespace {

namespace fs = std::filesystem;
using testing::TinyModel;
using testing::TinySpec;

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("replayssm_test_model_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Expects load_model(dir) to throw an Error whose message contains `needle`.
void expect_load_error(const std::string& dir, const std::string& needle) {
  try {
    load_model(dir);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = int32_t(rng() % uint64_t(vocab));
  return t;
}

double max_rel_error(const std::vector<float>& got, const std::vector<double>& want,
                     size_t want_offset, size_t n) {
  double max_abs = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    max_abs = std::max(max_abs, std::fabs(double(got[i]) - want[want_offset + i]));
    scale = std::max(scale, std::fabs(want[want_offset + i]));
  }
  return max_abs / std::max(scale, 1e-30);
}

TEST(ModelConfig, AcceptsBareInfinityAndDefaults) {
  const ModelConfig c = parse_model_config(testing::tiny_config_json(TinySpec{}), "config.json");
  EXPECT_EQ(c.time_step_min_clamp, 0.0f);
  EXPECT_TRUE(std::isinf(c.time_step_max_clamp));
  EXPECT_EQ(c.d_inner(), 32);
  EXPECT_EQ(c.conv_dim(), 32 + 2 * 2 * 16);
  EXPECT_EQ(c.norm_groups, 1);
  // "Infinity" inside a string stays a string.
  const ModelConfig d = parse_model_config(
      R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "state_size": 16,
          "num_heads": 2, "head_dim": 4, "n_groups": 1, "name": "Infinity NaN",
          "time_step_limit": [0.001, 0.1]})",
      "inline");
  EXPECT_FLOAT_EQ(d.time_step_max_clamp, 0.1f);
  // transformers 5 writes non-finite floats as {"__float__": "Infinity"}.
  const ModelConfig e = parse_model_config(
      R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "state_size": 16,
          "num_heads": 2, "head_dim": 4, "time_step_limit": [0.0, {"__float__": "Infinity"}]})",
      "inline");
  EXPECT_TRUE(std::isinf(e.time_step_max_clamp));
}

TEST(ModelConfig, RejectsInconsistentConfigs) {
  EXPECT_THROW(parse_model_config("{not json", "c"), Error);
  EXPECT_THROW(parse_model_config(R"({"model_type": "llama"})", "c"), Error);
  // num_heads * head_dim != expand * hidden_size
  EXPECT_THROW(parse_model_config(R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1,
      "state_size": 16, "num_heads": 3, "head_dim": 4, "n_groups": 1})",
                                  "c"),
               Error);
  // heads not divisible by groups
  EXPECT_THROW(parse_model_config(R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1,
      "state_size": 16, "num_heads": 2, "head_dim": 4, "n_groups": 3})",
                                  "c"),
               Error);
  try {
    parse_model_config(R"({"vocab_size": 8})", "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
}

TEST(ModelLoader, LoadsFp32AndBf16) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 1);
  for (bool bf16 : {false, true}) {
    const std::string dir = temp_dir(bf16 ? "load_bf16" : "load_f32");
    testing::write_tiny_model(m, dir, bf16);
    const ModelWeights w = load_model(dir);
    EXPECT_EQ(w.layers.size(), 2u);
    EXPECT_EQ(w.embeddings.type, bf16 ? Matrix::Type::bf16 : Matrix::Type::f32);
    EXPECT_FALSE(w.tied);
    EXPECT_EQ(w.layers[1].conv_w, m.at("backbone.layers.1.mixer.conv1d.weight"));
    fs::remove_all(dir);
  }
}

TEST(ModelLoader, BadDirectoriesGetClearErrors) {
  expect_load_error("/nonexistent/replayssm/model", "does not exist");
  const std::string empty = temp_dir("empty");
  expect_load_error(empty, "config.json is missing");

  const TinyModel m = testing::make_tiny_model(TinySpec{}, 2);
  const std::string dir = temp_dir("bad");
  testing::write_tiny_model(m, dir, false);
  fs::remove(dir + "/model.safetensors");
  expect_load_error(dir, "no model.safetensors");

  auto write_without = [&](const std::string& drop, const std::string& reshape) {
    io::StFile file;
    for (const auto& [name, v] : m.values) {
      if (name == drop) continue;
      std::vector<int64_t> shape = m.shapes.at(name);
      if (name == reshape) shape = {int64_t(v.size())};
      file.tensors[name] = io::make_f32(shape, v);
    }
    io::write_safetensors(dir + "/model.safetensors", file);
  };
  write_without("backbone.layers.1.mixer.D", "");
  expect_load_error(dir, "'backbone.layers.1.mixer.D' is missing");
  write_without("", "backbone.layers.0.mixer.in_proj.weight");
  expect_load_error(dir, "'backbone.layers.0.mixer.in_proj.weight' has shape");
  write_without("lm_head.weight", "");
  expect_load_error(dir, "tie_word_embeddings");

  // Truncated weights file.
  write_without("", "");
  {
    const auto bytes = io::read_file_bytes(dir + "/model.safetensors");
    io::write_file_bytes(dir + "/model.safetensors",
                         std::span<const uint8_t>(bytes.data(), bytes.size() - 100));
  }
  EXPECT_THROW(load_model(dir), Error);

  // A checkpoint with more layers than config.json says.
  TinySpec three;
  three.layers = 3;
  testing::write_tiny_model(testing::make_tiny_model(three, 3), dir, false);
  testing::write_text(dir + "/config.json", testing::tiny_config_json(TinySpec{}));
  expect_load_error(dir, "backbone.layers.2");

  // Broken config.json.
  testing::write_text(dir + "/config.json", "{\"vocab_size\": 48,");
  expect_load_error(dir, "not valid JSON");
  fs::remove_all(dir);
  fs::remove_all(empty);
}

// Random byte corruption of config.json and of the weights file: every load either succeeds or
// throws replayssm::Error (never crashes, never another exception type).
TEST(ModelLoader, CorruptFilesNeverCrash) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 15);
  const std::string dir = temp_dir("fuzz");
  testing::write_tiny_model(m, dir, true);
  const std::vector<uint8_t> weights = io::read_file_bytes(dir + "/model.safetensors");
  const std::string config = testing::tiny_config_json(m.spec);
  std::mt19937_64 rng(16);
  int errors = 0, loads = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<uint8_t> w = weights;
    std::string c = config;
    const bool in_config = iter % 3 == 0;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      if (in_config) {
        c[size_t(rng() % c.size())] = char(rng() % 128);
      } else {
        // Mostly the header (where structure lives), sometimes anywhere, sometimes truncate.
        const size_t span = rng() % 4 == 0 ? w.size() : std::min<size_t>(w.size(), 600);
        w[size_t(rng() % span)] = uint8_t(rng());
        if (rng() % 10 == 0) w.resize(size_t(rng() % w.size()));
      }
    }
    testing::write_text(dir + "/config.json", c);
    io::write_file_bytes(dir + "/model.safetensors", w);
    try {
      load_model(dir);
      ++loads;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << iter << ": not a replayssm::Error: " << e.what();
    }
  }
  EXPECT_GT(errors, 100);
  fs::remove_all(dir);
}

TEST(ModelLoader, ShardedIndex) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 4);
  const std::string dir = temp_dir("sharded");
  testing::write_text(dir + "/config.json", testing::tiny_config_json(m.spec));
  io::StFile a, b;
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  bool first = true;
  for (const auto& [name, v] : m.values) {
    const bool in_a = name.find("layers.1") == std::string::npos;
    (in_a ? a : b).tensors[name] = io::make_f32(m.shapes.at(name), v);
    index += std::string(first ? "" : ", ") + "\"" + name + "\": \"" +
             (in_a ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") +
             "\"";
    first = false;
  }
  index += "}}";
  io::write_safetensors(dir + "/model-00001-of-00002.safetensors", a);
  io::write_safetensors(dir + "/model-00002-of-00002.safetensors", b);
  testing::write_text(dir + "/model.safetensors.index.json", index);
  const ModelWeights w = load_model(dir);
  EXPECT_EQ(w.layers[1].D, m.at("backbone.layers.1.mixer.D"));
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_load_error(dir, "model-00002-of-00002.safetensors");
  fs::remove_all(dir);
}

struct ForwardCase {
  bool bf16_weights;
  bool tie;
  int norm_groups;
};

class ModelForward : public ::testing::TestWithParam<ForwardCase> {};

// The runner's prefill logits (fp32 mode, fp32 activations) equal the FP64 reference.
TEST_P(ModelForward, PrefillMatchesFp64Reference) {
  TinySpec spec;
  spec.tie = GetParam().tie;
  spec.norm_groups = GetParam().norm_groups;
  const TinyModel m = testing::make_tiny_model(spec, 5);
  const std::string dir = temp_dir("fwd");
  testing::write_tiny_model(m, dir, GetParam().bf16_weights);
  auto weights = std::make_shared<const ModelWeights>(load_model(dir));
  fs::remove_all(dir);
  const std::vector<int32_t> tokens = random_tokens(40, spec.vocab, 6);
  const std::vector<double> want = testing::reference_logits(m, tokens);

  RunnerConfig rc;
  rc.prefill_chunk = 16;  // three chunks: conv history and state carry across prefill calls
  Mamba2Model model(weights, rc);
  const int slot = model.open(1);
  std::vector<float> logits;
  model.prefill(slot, tokens, logits, /*all_logits=*/true);
  ASSERT_EQ(logits.size(), want.size());
  EXPECT_LT(max_rel_error(logits, want, 0, want.size()), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ModelForward,
                         ::testing::Values(ForwardCase{false, false, 1},
                                           ForwardCase{true, false, 1}, ForwardCase{false, true, 1},
                                           ForwardCase{false, false, 2}),
                         [](const ::testing::TestParamInfo<ForwardCase>& info) {
                           return std::string(info.param.bf16_weights ? "bf16" : "fp32") +
                                  (info.param.tie ? "_tied" : "") + "_normgroups" +
                                  std::to_string(info.param.norm_groups);
                         });

// Verify windows with random accepted counts: each verified row equals the reference logits of
// the committed prefix plus the window up to that row, across flushes (L = 16, W up to 8).
TEST(ModelForward, VerifyCommitMatchesReference) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 7);
  const std::string dir = temp_dir("verify");
  testing::write_tiny_model(m, dir, false);
  auto weights = std::make_shared<const ModelWeights>(load_model(dir));
  fs::remove_all(dir);
  const int V = m.spec.vocab;
  const std::vector<int32_t> stream = random_tokens(120, V, 8);
  std::mt19937_64 rng(9);

  Mamba2Model model(weights, RunnerConfig{});
  const int slot = model.open(3);
  std::vector<float> logits;
  std::vector<int32_t> committed(stream.begin(), stream.begin() + 5);
  model.prefill(slot, committed, logits);
  const std::vector<double> full = testing::reference_logits(m, stream);
  double worst = 0;
  size_t pos = committed.size();
  while (pos + 8 < stream.size()) {
    const int W = 1 + int(rng() % 8);
    // The window: true continuation for a prefix, junk after it (those rows are not checked).
    std::vector<int32_t> window(stream.begin() + int64_t(pos), stream.begin() + int64_t(pos) + W);
    const int accept = 1 + int(rng() % uint64_t(W));
    for (int j = accept; j < W; ++j) window[size_t(j)] = int32_t(rng() % uint64_t(V));
    model.verify(slot, window, logits);
    ASSERT_EQ(logits.size(), size_t(W) * size_t(V));
    for (int j = 0; j < accept; ++j) {
      std::vector<float> row(logits.begin() + int64_t(j) * V, logits.begin() + int64_t(j + 1) * V);
      worst = std::max(worst, max_rel_error(row, full, (pos + size_t(j)) * size_t(V), size_t(V)));
    }
    model.commit(slot, accept);
    pos += size_t(accept);
  }
  EXPECT_LT(worst, 2e-5);
  EXPECT_GT(model.flushes_per_layer(), 0u);
}

// A window of drafts of which only the first token is accepted leaves every layer's cache and
// conv history bit-identical to a window that held that token alone.
TEST(ModelForward, RejectedDraftsLeaveNoTrace) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 10);
  const std::string dir = temp_dir("reject");
  testing::write_tiny_model(m, dir, true);
  auto weights = std::make_shared<const ModelWeights>(load_model(dir));
  fs::remove_all(dir);
  for (Mode mode : {Mode::fp32, Mode::separate_fp8}) {
    RunnerConfig rc;
    rc.mode = mode;
    rc.activation_dtype = mode == Mode::fp32 ? DType::f32 : DType::bf16;
    Mamba2Model a(weights, rc), b(weights, rc);
    const int sa = a.open(11), sb = b.open(11);
    const std::vector<int32_t> prompt = random_tokens(21, m.spec.vocab, 12);
    std::vector<float> la, lb;
    a.prefill(sa, prompt, la);
    b.prefill(sb, prompt, lb);
    const std::vector<int32_t> window = random_tokens(8, m.spec.vocab, 13);
    for (int step = 0; step < 5; ++step) {
      // a: one accepted token plus rejected drafts; b: the token alone.
      a.verify(sa, window, la);
      a.commit(sa, 1 + step % 2);
      b.verify(sb, std::span<const int32_t>(window.data(), size_t(1 + step % 2)), lb);
      b.commit(sb, 1 + step % 2);
      for (int l = 0; l < m.spec.layers; ++l) {
        EXPECT_EQ(a.cache(l).export_slot(sa), b.cache(l).export_slot(sb))
            << "layer " << l << " step " << step << " mode " << mode_name(mode);
        EXPECT_EQ(a.conv_state(l, sa).committed, b.conv_state(l, sb).committed)
            << "layer " << l << " step " << step;
      }
      // The next window's first row is the same distribution in both.
      ASSERT_EQ(la.size() >= size_t(m.spec.vocab), true);
    }
  }
}

TEST(ModelRunner, BadCallsGetClearErrors) {
  const TinyModel m = testing::make_tiny_model(TinySpec{}, 14);
  const std::string dir = temp_dir("calls");
  testing::write_tiny_model(m, dir, false);
  auto weights = std::make_shared<const ModelWeights>(load_model(dir));
  fs::remove_all(dir);
  Mamba2Model model(weights, RunnerConfig{});
  const int slot = model.open(1);
  std::vector<float> logits;
  EXPECT_THROW(model.prefill(slot, std::vector<int32_t>{}, logits), Error);
  EXPECT_THROW(model.prefill(slot, std::vector<int32_t>{1, 999}, logits), Error);
  EXPECT_THROW(model.commit(slot, 1), Error);  // nothing verified
  EXPECT_THROW(model.verify(slot, std::vector<int32_t>(9, 1), logits), Error);
  model.verify(slot, std::vector<int32_t>{1, 2, 3}, logits);
  EXPECT_THROW(model.verify(slot, std::vector<int32_t>{1}, logits), Error);  // pending
  EXPECT_THROW(model.commit(slot, 4), Error);
  EXPECT_THROW(model.commit(slot, 0), Error);
  model.commit(slot, 3);
  EXPECT_THROW(model.verify(5, std::vector<int32_t>{1}, logits), Error);
}

}  // namespace
}  // namespace replayssm::model

namespace replayssm::model {
namespace {

// The built-in model against transformers' own logits and greedy tokens on the same bf16 weights
// (tests/data/mamba2_byte_reference.safetensors, written by scripts/train_tiny_mamba2.py: fp32
// forward of transformers on the CPU). Measured: max |logit difference| 1.3e-5 at logits of
// magnitude ~18, every argmax and all 48 greedy tokens of every prompt equal.
TEST(BuiltinModel, MatchesTransformersLogitsAndGreedyTokens) {
  const std::string root = REPLAYSSM_SOURCE_DIR;
  auto weights =
      std::make_shared<const ModelWeights>(load_model(root + "/models/mamba2-byte-2.7m"));
  const io::StFile ref =
      io::read_safetensors(root + "/tests/data/mamba2_byte_reference.safetensors");
  const int V = weights->config.vocab_size;
  ASSERT_EQ(V, 256);
  int prompts = 0;
  for (int p = 0;; ++p) {
    std::string key = "p";
    key += std::to_string(p);
    if (!ref.tensors.count(key + ".tokens")) break;
    ++prompts;
    const std::vector<int32_t> tokens = ref.tensors.at(key + ".tokens").i32(key);
    const std::vector<float> want = ref.tensors.at(key + ".logits").f32(key);
    const std::vector<int32_t> greedy = ref.tensors.at(key + ".greedy").i32(key);
    RunnerConfig rc;
    rc.threads = 1;  // a 2.7M-parameter model gains nothing from threads
    Mamba2Model model(weights, rc);
    const int slot = model.open(1);
    std::vector<float> logits;
    model.prefill(slot, tokens, logits, /*all_logits=*/true);
    ASSERT_EQ(logits.size(), want.size());
    double max_abs = 0;
    for (size_t i = 0; i < want.size(); ++i)
      max_abs = std::max(max_abs, std::fabs(double(logits[i]) - double(want[i])));
    EXPECT_LT(max_abs, 2e-4) << "prompt " << p;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* g = logits.data() + t * size_t(V);
      const float* w = want.data() + t * size_t(V);
      const int ours = int(std::max_element(g, g + V) - g);
      // Equal argmax, or a tie within the logit tolerance.
      EXPECT_LT(*std::max_element(w, w + V) - w[ours], 4e-4f) << "prompt " << p << " pos " << t;
    }
    // Greedy continuation, one verify(1) + commit(1) per token.
    int32_t next = int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
    for (size_t i = 0; i < greedy.size(); ++i) {
      if (next != greedy[i]) {
        // Only a near-tie may diverge; after that the sequences differ and comparing stops.
        const float* last = logits.data() + (i == 0 ? logits.size() - size_t(V) : 0);
        EXPECT_LT(last[next] - last[greedy[i]], 4e-4f) << "prompt " << p << " token " << i;
        break;
      }
      model.verify(slot, std::span<const int32_t>(&next, 1), logits);
      model.commit(slot, 1);
      next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
  }
  EXPECT_GE(prompts, 3);
}

}  // namespace
}  // namespace replayssm::model

namespace replayssm::model {
namespace {

// The runner on the CUDA backend (the whole forward on the GPU: cuBLAS GEMMs, device conv and
// norms, the CUDA cache) against the CPU backend: logits of a prefill and of verify windows, fp32
// and separate-fp8. Skips without a GPU. More in test_model_cuda.cpp.
TEST(ModelCuda, LogitsMatchCpu) {
  if (!backend_available(BackendKind::cuda)) GTEST_SKIP() << "no CUDA backend or device";
  auto weights = std::make_shared<const ModelWeights>(
      load_model(std::string(REPLAYSSM_SOURCE_DIR) + "/models/mamba2-byte-2.7m"));
  const std::vector<int32_t> prompt = random_tokens(70, 256, 51);
  const std::vector<int32_t> window = random_tokens(8, 256, 52);
  for (Mode mode : {Mode::fp32, Mode::separate_fp8}) {
    std::vector<float> ref[2], got[2];
    for (BackendKind kind : {BackendKind::cpu, BackendKind::cuda}) {
      RunnerConfig rc;
      rc.mode = mode;
      rc.backend = kind;
      rc.activation_dtype = mode == Mode::fp32 ? DType::f32 : DType::bf16;
      Mamba2Model model(weights, rc);
      const int slot = model.open(7);
      auto& out = kind == BackendKind::cpu ? ref : got;
      model.prefill(slot, prompt, out[0]);
      for (int step = 0; step < 6; ++step) {
        model.verify(slot, window, out[1]);
        model.commit(slot, 1 + step % 3);
      }
    }
    for (int i = 0; i < 2; ++i) {
      double worst = 0;
      for (size_t j = 0; j < ref[i].size(); ++j)
        worst = std::max(worst, std::fabs(double(ref[i][j]) - got[i][j]));
      EXPECT_LT(worst, mode == Mode::fp32 ? 1e-3 : 5e-2) << mode_name(mode) << " part " << i;
    }
  }
}

}  // namespace
}  // namespace replayssm::model
