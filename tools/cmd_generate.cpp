// replayssm generate: text generation with a Mamba-2 model (docs/model.md). The generated text
// (only the text) streams to stdout; one statistics line goes to stderr at the end.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "io/safetensors.h"
#include "model/builtin.h"
#include "model/generate.h"
#include "model/mamba2.h"
#include "model/synthetic.h"
#include "model/tokenizer.h"
#include "model/weights.h"
#include "replayssm/error.h"
#include "replayssm/presets.h"

namespace replayssm::cli {

namespace {

// Below this many parameters --threads 0 means one thread (see run_generate).
constexpr int64_t kSmallModelParams = 50'000'000;

struct GenerateArgs {
  std::string model_dir;
  std::vector<std::string> prompts;  // several -p: a batch (generate_batch), one line each
  std::string prompt_file;
  int max_new_tokens = 128;
  ModeArgs mode;
  int draft_max = 7;
  int ngram_max = 3;
  std::string backend = "cpu";
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int history = 16;
  std::string activation_dtype = "auto";
  int threads = 0;
  bool ignore_eos = false;
  // --synthetic PRESET: random weights and a synthetic acceptance process (e2e measurement).
  std::string synthetic;
  int prompt_len = 512;
  // --capture FILE: one layer's SSM operations and inputs as a trace (docs/trace-format.md).
  std::string capture;
  int capture_layer = 0;
  double accept_mean = 4.3;
};

// Random weights of a preset's shape, random prompt, synthetic acceptance: decode tokens/s with
// full verify windows through every layer, no trained model needed (docs/model.md).
void run_synthetic(const GenerateArgs& args, const model::RunnerConfig& rc_in) {
  const ModelPreset& preset = find_preset(args.synthetic);
  const model::ModelConfig config = model::config_for_preset(preset);
  auto weights = std::make_shared<const model::ModelWeights>(model::random_weights(config, 1));
  model::Mamba2Model runner(weights, rc_in);
  model::SyntheticOptions opt;
  opt.prompt_tokens = args.prompt_len;
  opt.new_tokens = args.max_new_tokens;
  opt.window = args.draft_max + 1;
  opt.mean_accepted_length = opt.window > 1 ? args.accept_mean : 1.0;
  opt.seed = args.seed + 1;
  const model::SyntheticResult r = model::run_synthetic(runner, opt);
  fmt::print(stderr,
             "[generate --synthetic] {} ({:.0f}M params, random) | mode {} | prompt {} tok, "
             "prefill {:.1f} tok/s | {} tok in {:.2f}s: {:.2f} tok/s | window {}: mean accepted "
             "length {:.2f} (target {:.2f}), {} verify steps | flushes {} per layer\n",
             preset.name, double(weights->parameter_count()) / 1e6, mode_name(rc_in.mode),
             opt.prompt_tokens, r.prefill_seconds > 0 ? opt.prompt_tokens / r.prefill_seconds : 0.0,
             r.generated, r.decode_seconds, r.tokens_per_second(), opt.window,
             r.mean_accepted_length(), opt.mean_accepted_length, r.steps, r.flushes);
}

// TEXT on one line: backslash, and control bytes as \n, \t, \r or \xNN (UTF-8 kept).
std::string escape_line(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto b = static_cast<unsigned char>(ch);
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (b < 0x20 || b == 0x7f) {
      out += fmt::format("\\x{:02x}", b);
    } else {
      out += ch;
    }
  }
  return out;
}

void run_generate(const GenerateArgs& args) {
  using clock = std::chrono::steady_clock;
  if (!args.synthetic.empty()) {
    check(args.model_dir.empty() && args.prompts.empty() && args.prompt_file.empty(),
          "--synthetic uses random weights and a random prompt: drop -m, -p and -f");
  }
  model::RunnerConfig rc;
  rc.mode = resolve_mode(args.mode).value_or(Mode::fp32);
  rc.history = args.history;
  rc.max_window = std::max(1, std::min(args.history / 2, 8));
  rc.backend = resolve_backend(args.backend);
  rc.seed = args.seed;
  rc.threads = args.threads;
  // fp32 activations keep the fp32 mode exact; the low-precision modes store bf16 (SPEC default).
  rc.activation_dtype = args.activation_dtype == "auto"
                            ? (rc.mode == Mode::fp32 ? DType::f32 : DType::bf16)
                            : parse_dtype(args.activation_dtype);
  check(args.draft_max >= 0 && args.draft_max <= rc.max_window - 1, "--draft-max ", args.draft_max,
        " is outside 0..", rc.max_window - 1,
        " (a verify window holds at most min(8, history/2) = ", rc.max_window, " tokens)");
  if (!args.synthetic.empty()) return run_synthetic(args, rc);

  const auto t_load = clock::now();
  const std::string dir = args.model_dir.empty() ? model::builtin_model_dir() : args.model_dir;
  auto weights = std::make_shared<const model::ModelWeights>(model::load_model(dir));
  const std::unique_ptr<model::Tokenizer> tokenizer = model::load_tokenizer(dir, weights->config);
  const double load_seconds = std::chrono::duration<double>(clock::now() - t_load).count();

  check(!args.prompts.empty() || !args.prompt_file.empty(),
        "no prompt: give it with -p TEXT or -f FILE");
  std::vector<std::string> texts = args.prompts;
  if (!args.prompt_file.empty()) {
    const std::vector<uint8_t> bytes = io::read_file_bytes(args.prompt_file);
    texts.assign(1, std::string(bytes.begin(), bytes.end()));
  }
  const bool batch = texts.size() > 1;
  if (batch) rc.num_slots = int(texts.size());
  // A small model decodes fastest on one thread: its steps are shorter than a thread team's
  // wake-up, and on a busy machine spinning teams cost 10-20x (measured on the built-in model).
  if (args.threads == 0 && weights->parameter_count() < kSmallModelParams) rc.threads = 1;
  model::Mamba2Model runner(weights, rc);
  if (!args.capture.empty()) runner.capture_layer(args.capture_layer);

  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string which = batch ? fmt::format("prompt {}", i) : std::string("the prompt");
    check(!texts[i].empty(), which, " is empty (-p TEXT or -f FILE)");
    prompts.push_back(tokenizer->encode(texts[i]));
    check(!prompts.back().empty(), which, " encodes to no tokens");
    for (int32_t id : prompts.back())
      check(id >= 0 && id < weights->config.vocab_size, "prompt token id ", id,
            " is outside the model's vocabulary (", weights->config.vocab_size,
            "): tokenizer and model do not match");
  }

  model::GenerateOptions opt;
  opt.max_new_tokens = args.max_new_tokens;
  opt.draft_max = args.draft_max;
  opt.sampling.temperature = args.temperature;
  opt.sampling.top_k = args.top_k;
  opt.sampling.top_p = args.top_p;
  opt.sampling.seed = args.seed;
  opt.drafter.max_ngram = args.ngram_max;
  opt.eos_token_id = args.ignore_eos ? -1 : weights->config.eos_token_id;

  model::GenerateStats stats;
  if (batch) {
    // Several requests decode together, so their text cannot stream: each completion is printed
    // at the end on one line, "INDEX: TEXT", with control characters escaped to keep it one line.
    const std::vector<std::vector<int32_t>> outs =
        model::generate_batch(runner, prompts, opt, &stats);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string text;
      for (int32_t id : outs[i]) text += tokenizer->decode(id);
      fmt::print(stdout, "{}: {}\n", i, escape_line(text));
    }
  } else {
    model::generate(
        runner, prompts.front(), opt,
        [&](std::span<const int32_t> tokens) {
          for (int32_t id : tokens) {
            const std::string bytes = tokenizer->decode(id);
            std::fwrite(bytes.data(), 1, bytes.size(), stdout);
          }
          std::fflush(stdout);
        },
        &stats);
    if (isatty(fileno(stdout))) std::fputc('\n', stdout);
  }
  std::fflush(stdout);

  fmt::print(stderr,
             "[generate] {} ({}, {:.2f}M params, load {:.2f}s) | mode {} | {}prompt {} tok, "
             "prefill {:.1f} tok/s | {} tok in {:.2f}s: {:.1f} tok/s | drafts <= {}: mean "
             "accepted length {:.2f}, acceptance {:.1f}% ({}/{}), {} verify steps | flushes {} "
             "per layer\n",
             dir, tokenizer->name(), double(weights->parameter_count()) / 1e6, load_seconds,
             mode_name(rc.mode),
             batch ? fmt::format("batch of {}, {} passes, {} padded | ", prompts.size(),
                                 stats.passes, stats.padded)
                   : std::string(),
             stats.prompt_tokens,
             stats.prefill_seconds > 0 ? stats.prompt_tokens / stats.prefill_seconds : 0.0,
             stats.generated, stats.decode_seconds, stats.decode_tokens_per_second(),
             args.draft_max, stats.mean_accepted_length(), 100.0 * stats.acceptance_rate(),
             stats.accepted, stats.drafted, stats.steps, stats.flushes);
  if (!args.capture.empty()) {
    io::write_safetensors(args.capture, io::trace_to_file(runner.captured()));
    fmt::print(stderr, "[generate] layer {} captured: {} operations -> {}\n", args.capture_layer,
               runner.captured().ops.size(), args.capture);
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "generate text with a Mamba-2 model (Hugging Face Mamba2ForCausalLM directory, or the "
      "built-in byte-level model), speculative decoding with prompt lookup");
  cmd->add_option("-m,--model", args->model_dir,
                  "model directory: config.json + model.safetensors (or a sharded index) + "
                  "tokenizer.json; default: the built-in model");
  auto* prompt = cmd->add_option("-p,--prompt", args->prompts,
                                 "prompt text; several -p decode as one batch and print each "
                                 "completion on one line, INDEX: TEXT (escaped)");
  auto* prompt_file =
      cmd->add_option("-f,--prompt-file", args->prompt_file, "read the prompt from a file");
  prompt->excludes(prompt_file);
  cmd->add_option("-n,--max-new-tokens", args->max_new_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_mode_options(cmd, &args->mode, "checkpoint mode of every layer's cache (default fp32)");
  cmd->add_option("--draft-max", args->draft_max,
                  "prompt-lookup drafts per step, 0 (plain decoding) .. history/2 - 1")
      ->capture_default_str();
  cmd->add_option("--ngram-max", args->ngram_max, "longest n-gram the drafter matches")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  add_backend_option(cmd, &args->backend, "cpu");
  cmd->add_option("--temp,--temperature", args->temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "keep the k most likely tokens; 0 = all")
      ->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "nucleus sampling mass; 1 = all")->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling and stochastic-rounding seed")
      ->capture_default_str();
  cmd->add_option("--history", args->history, "replay ring length per layer (power of two)")
      ->capture_default_str();
  cmd->add_option("--activation-dtype", args->activation_dtype,
                  "ring x/B dtype: auto (fp32 in the fp32 mode, else bf16), fp32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  cmd->add_option(
         "--threads", args->threads,
         "OpenMP threads; 0 = one for models under 50M parameters, else the OpenMP default")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--ignore-eos", args->ignore_eos, "keep generating past the EOS token");
  cmd->add_option("--synthetic", args->synthetic,
                  "measure instead: random weights in the shape of a preset (" + preset_names() +
                      "), random prompt, synthetic acceptance; prints the statistics line only");
  cmd->add_option("--prompt-len", args->prompt_len, "--synthetic: prompt tokens (prefill)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--accept-mean", args->accept_mean,
                  "--synthetic: mean tokens committed per verify, 1..draft-max+1")
      ->capture_default_str();
  cmd->add_option("--capture", args->capture,
                  "write one layer's SSM operations and inputs as a trace file (replay it with "
                  "`trace run`, study it with `drift --trace`)");
  cmd->add_option("--capture-layer", args->capture_layer, "the layer --capture records")
      ->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace replayssm::cli
