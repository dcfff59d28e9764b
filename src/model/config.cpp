#include "model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "replayssm/error.h"

namespace replayssm::model {

using json = nlohmann::json;

namespace {

// Python's json module writes float('inf') as a bare Infinity, which strict JSON parsers reject.
// Rewrite the three non-standard literals outside strings as strings that as_float() maps back.
std::string quote_nonstandard_literals(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool replaced = false;
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, word.size()) == word) {
        out += '"';
        out += word;
        out += '"';
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

float as_float(const json& value, std::string_view key, std::string_view what) {
  if (value.is_number()) return value.get<float>();
  // transformers 5 writes non-finite floats as {"__float__": "Infinity"}.
  const json& v = value.is_object() && value.contains("__float__") ? value["__float__"] : value;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "Infinity") return INFINITY;
    if (s == "-Infinity") return -INFINITY;
  }
  if (v.is_number()) return v.get<float>();
  fail(what, ": field '", key, "' must be a number, got ", value.dump());
}

int get_int(const json& root, const char* key, std::string_view what, int fallback, bool required) {
  if (!root.contains(key) || root[key].is_null()) {
    check(!required, what, ": required field '", key, "' is missing");
    return fallback;
  }
  const json& v = root[key];
  check(v.is_number_integer(), what, ": field '", key, "' must be an integer, got ", v.dump());
  const int64_t value = v.get<int64_t>();
  check(value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(), what,
        ": field '", key, "' is out of range: ", value);
  return int(value);
}

bool get_bool(const json& root, const char* key, std::string_view what, bool fallback) {
  if (!root.contains(key) || root[key].is_null()) return fallback;
  check(root[key].is_boolean(), what, ": field '", key, "' must be true or false, got ",
        root[key].dump());
  return root[key].get<bool>();
}

// eos_token_id may be an int or a list of ints (the first is used).
int get_token_id(const json& root, const char* key, std::string_view what) {
  if (!root.contains(key) || root[key].is_null()) return -1;
  const json& v = root[key];
  if (v.is_array()) return v.empty() ? -1 : get_int(json{{key, v[0]}}, key, what, -1, false);
  return get_int(root, key, what, -1, false);
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](int v, const char* name) {
    check(v > 0, "model config: ", name, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_hidden_layers");
  positive(state_size, "state_size");
  positive(num_heads, "num_heads");
  positive(head_dim, "head_dim");
  positive(n_groups, "n_groups");
  positive(conv_kernel, "conv_kernel");
  positive(norm_groups, "replayssm_norm_groups");
  check(num_heads % n_groups == 0, "model config: num_heads ", num_heads,
        " is not a multiple of n_groups ", n_groups);
  check(d_inner() % norm_groups == 0, "model config: the inner width ", d_inner(),
        " (num_heads * head_dim) is not a multiple of replayssm_norm_groups ", norm_groups);
  const double width = double(expand) * hidden_size;
  check(std::fabs(width - d_inner()) < 0.5, "model config: expand * hidden_size = ", width,
        " differs from num_heads * head_dim = ", d_inner());
  check(layer_norm_epsilon > 0 && std::isfinite(layer_norm_epsilon),
        "model config: layer_norm_epsilon must be positive, got ", layer_norm_epsilon);
  check(time_step_min_clamp >= 0 && time_step_min_clamp <= time_step_max_clamp,
        "model config: time_step_limit [", time_step_min_clamp, ", ", time_step_max_clamp,
        "] is not an interval of non-negative values");
  check(eos_token_id < vocab_size, "model config: eos_token_id ", eos_token_id,
        " is outside the vocabulary of ", vocab_size);
}

ModelConfig parse_model_config(std::string_view json_text, std::string_view what) {
  json root;
  try {
    root = json::parse(quote_nonstandard_literals(json_text));
  } catch (const json::exception& e) {
    fail(what, ": not valid JSON: ", e.what());
  }
  check(root.is_object(), what, ": expected a JSON object");
  if (root.contains("model_type") && root["model_type"].is_string()) {
    const std::string type = root["model_type"].get<std::string>();
    check(type == "mamba2", what, ": model_type is '", type,
          "'; only Hugging Face Mamba2ForCausalLM checkpoints (model_type mamba2) are supported");
  }
  ModelConfig c;
  c.vocab_size = get_int(root, "vocab_size", what, 0, true);
  c.hidden_size = get_int(root, "hidden_size", what, 0, true);
  c.num_layers = get_int(root, "num_hidden_layers", what, 0, true);
  c.state_size = get_int(root, "state_size", what, 0, true);
  c.num_heads = get_int(root, "num_heads", what, 0, true);
  c.head_dim = get_int(root, "head_dim", what, 0, true);
  c.n_groups = get_int(root, "n_groups", what, 1, false);
  c.conv_kernel = get_int(root, "conv_kernel", what, 4, false);
  if (root.contains("expand")) c.expand = as_float(root["expand"], "expand", what);
  if (root.contains("layer_norm_epsilon"))
    c.layer_norm_epsilon = as_float(root["layer_norm_epsilon"], "layer_norm_epsilon", what);
  c.use_bias = get_bool(root, "use_bias", what, false);
  c.use_conv_bias = get_bool(root, "use_conv_bias", what, true);
  c.tie_word_embeddings = get_bool(root, "tie_word_embeddings", what, false);
  if (root.contains("time_step_limit") && !root["time_step_limit"].is_null()) {
    const json& limit = root["time_step_limit"];
    check(limit.is_array() && limit.size() == 2, what,
          ": time_step_limit must be a list of two numbers, got ", limit.dump());
    c.time_step_min_clamp = as_float(limit[0], "time_step_limit[0]", what);
    c.time_step_max_clamp = as_float(limit[1], "time_step_limit[1]", what);
  }
  c.norm_groups = get_int(root, "replayssm_norm_groups", what, 1, false);
  c.eos_token_id = get_token_id(root, "eos_token_id", what);
  c.bos_token_id = get_token_id(root, "bos_token_id", what);
  if (root.contains("replayssm_tokenizer") && root["replayssm_tokenizer"].is_string())
    c.tokenizer = root["replayssm_tokenizer"].get<std::string>();
  try {
    c.validate();
  } catch (const Error& e) {
    fail(what, ": ", e.what());
  }
  return c;
}

ModelConfig read_model_config(const std::string& path) {
  const std::vector<uint8_t> bytes = io::read_file_bytes(path);
  return parse_model_config(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

}  // namespace replayssm::model
