#include "model/tokenizer.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <unordered_map>

#include "io/safetensors.h"
#include "model/unicode_classes.h"
#include "replayssm/error.h"

namespace replayssm::model {

using json = nlohmann::json;

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += decode(id);
  return out;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(int32_t(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(int32_t id) const {
  // Ids above 255 exist only in padded vocabularies; they carry no text.
  if (id < 0 || id > 255) return std::string();
  return std::string(1, char(id));
}

namespace {

enum class Cls { letter, number, space, other };

bool in_ranges(std::span<const unicode::CodePointRange> ranges, uint32_t cp) {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                                   [](uint32_t v, const auto& r) { return v < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->last;
}

// The classes of GPT-2's split pattern: \p{L}, \p{N}, \s, anything else.
Cls classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Cls::letter;
    if (cp >= '0' && cp <= '9') return Cls::number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Cls::space;
    return Cls::other;
  }
  if (in_ranges(unicode::kWhiteSpace, cp)) return Cls::space;
  if (in_ranges(unicode::kLetters, cp)) return Cls::letter;
  if (in_ranges(unicode::kNumbers, cp)) return Cls::number;
  return Cls::other;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Splits UTF-8 into code points; invalid bytes come back as themselves (never thrown on).
// offsets (optional) gets the byte offset of each code point and, last, the text's length.
std::vector<uint32_t> code_points(std::string_view s, std::vector<size_t>* offsets = nullptr) {
  std::vector<uint32_t> cps;
  if (offsets) offsets->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    if (i + size_t(len) > s.size()) len = 1;
    uint32_t cp = len == 1 ? b : (b & (0x7F >> len));
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    cps.push_back(cp);
    if (offsets) offsets->push_back(i);
    i += size_t(len);
  }
  if (offsets) offsets->push_back(s.size());
  return cps;
}

// GPT-2's reversible byte -> printable character map (bytes_to_unicode in the GPT-2 code).
struct ByteMap {
  std::string to_char[256];  // UTF-8 of the mapped character
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
      append_utf8(to_char[b], cp);
      to_byte[cp] = uint8_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

class BpeTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  BpeTokenizer(const json& root, std::string_view what) {
    check(root.is_object() && root.contains("model") && root["model"].is_object(), what,
          ": no 'model' object (not a Hugging Face tokenizer.json)");
    const json& model = root["model"];
    const std::string type = model.value("type", std::string("BPE"));
    check(type == "BPE", what, ": tokenizer model type '", type,
          "' is not supported (only byte-level BPE)");
    check(!model.value("byte_fallback", false), what,
          ": byte_fallback BPE (SentencePiece style) is not supported");
    check(has_byte_level(root["pre_tokenizer"]), what,
          ": the pre-tokenizer is not ByteLevel; only GPT-2 / GPT-NeoX style byte-level BPE is ",
          "supported");
    check(model.contains("vocab") && model["vocab"].is_object(), what, ": model.vocab missing");
    for (const auto& [token, id] : model["vocab"].items()) {
      check(id.is_number_integer(), what, ": vocab entry '", token, "' has no integer id");
      add_token(token, id.get<int32_t>());
    }
    check(model.contains("merges") && model["merges"].is_array(), what, ": model.merges missing");
    int rank = 0;
    for (const json& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        check(sp != std::string::npos, what, ": merge '", s, "' is not 'left right'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), what,
              ": merge ", m.dump(), " is not a pair of strings");
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      }
      ranks_.emplace(a + ' ' + b, rank++);
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = vocab_.find(model["unk_token"].get<std::string>());
      if (it != vocab_.end()) unk_ = it->second;
    }
    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
      for (const json& t : root["added_tokens"]) {
        if (!t.contains("content") || !t.contains("id")) continue;
        const std::string content = t["content"].get<std::string>();
        const int32_t id = t["id"].get<int32_t>();
        added_.emplace_back(content, id);
        added_ids_[id] = content;
        if (id >= int32_t(id_to_token_.size())) id_to_token_.resize(size_t(id) + 1);
      }
      // Longest first, so that a token that prefixes another never shadows it.
      std::sort(added_.begin(), added_.end(),
                [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
    }
  }

  std::vector<int32_t> encode(std::string_view input) const override {
    // ByteLevel(add_prefix_space) makes the first word look like a word inside a sentence.
    std::string prefixed;
    if (add_prefix_space_ && !input.empty() && input.front() != ' ') {
      prefixed = " ";
      prefixed += input;
      input = prefixed;
    }
    const std::string_view text = input;
    std::vector<int32_t> ids;
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const auto hit = std::find_if(added_.begin(), added_.end(), [&](const auto& a) {
        return !a.first.empty() && text.substr(i, a.first.size()) == a.first;
      });
      if (hit == added_.end()) {
        ++i;
        continue;
      }
      encode_plain(text.substr(start, i - start), ids);
      ids.push_back(hit->second);
      i += hit->first.size();
      start = i;
    }
    encode_plain(text.substr(start), ids);
    return ids;
  }

  std::string decode(int32_t id) const override {
    if (auto it = added_ids_.find(id); it != added_ids_.end()) return it->second;
    if (id < 0 || size_t(id) >= id_to_token_.size()) return std::string();
    std::string out;
    for (uint32_t cp : code_points(id_to_token_[size_t(id)])) {
      auto it = byte_map().to_byte.find(cp);
      if (it != byte_map().to_byte.end()) {
        out += char(it->second);
      } else {
        append_utf8(out, cp);
      }
    }
    return out;
  }

  int vocab_size() const override { return int(id_to_token_.size()); }
  std::string name() const override { return "byte-level BPE"; }

 private:
  // Finds the ByteLevel pre-tokenizer (alone or inside a Sequence); remembers add_prefix_space.
  bool has_byte_level(const json& pre) {
    if (!pre.is_object()) return false;
    if (pre.value("type", std::string()) == "ByteLevel") {
      add_prefix_space_ = pre.value("add_prefix_space", false);
      return true;
    }
    if (pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
      for (const json& p : pre["pretokenizers"])
        if (has_byte_level(p)) return true;
    return false;
  }

  void add_token(const std::string& token, int32_t id) {
    vocab_[token] = id;
    if (id >= int32_t(id_to_token_.size())) id_to_token_.resize(size_t(id) + 1);
    id_to_token_[size_t(id)] = token;
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    for (const std::string& word : gpt2_pre_tokenize(text)) {
      std::vector<std::string> symbols;
      for (char c : word) symbols.push_back(byte_map().to_char[static_cast<unsigned char>(c)]);
      // Merge the lowest-ranked adjacent pair, all occurrences, until no pair has a rank.
      while (symbols.size() > 1) {
        int best = INT_MAX;
        for (size_t k = 0; k + 1 < symbols.size(); ++k) {
          auto it = ranks_.find(symbols[k] + ' ' + symbols[k + 1]);
          if (it != ranks_.end()) best = std::min(best, it->second);
        }
        if (best == INT_MAX) break;
        std::vector<std::string> merged;
        for (size_t k = 0; k < symbols.size(); ++k) {
          if (k + 1 < symbols.size()) {
            auto it = ranks_.find(symbols[k] + ' ' + symbols[k + 1]);
            if (it != ranks_.end() && it->second == best) {
              merged.push_back(symbols[k] + symbols[k + 1]);
              ++k;
              continue;
            }
          }
          merged.push_back(symbols[k]);
        }
        symbols.swap(merged);
      }
      for (const std::string& s : symbols) {
        auto it = vocab_.find(s);
        if (it != vocab_.end()) {
          ids.push_back(it->second);
        } else {
          check(unk_ >= 0, "tokenizer: piece '", s, "' is not in the vocabulary and there is ",
                "no unk_token");
          ids.push_back(unk_);
        }
      }
    }
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int> ranks_;
  std::vector<std::pair<std::string, int32_t>> added_;
  std::unordered_map<int32_t, std::string> added_ids_;
  int32_t unk_ = -1;
  bool add_prefix_space_ = false;
};

}  // namespace

std::vector<std::string> gpt2_pre_tokenize(std::string_view text) {
  std::vector<std::string> out;
  std::vector<size_t> at;  // byte offset of code point i
  const std::vector<uint32_t> cps = code_points(text, &at);
  const size_t n = cps.size();
  std::vector<Cls> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = classify(cps[i]);
  auto piece = [&](size_t from, size_t to) {
    out.emplace_back(text.substr(at[from], at[to] - at[from]));
  };
  size_t i = 0;
  while (i < n) {
    if (cps[i] == '\'') {
      bool done = false;
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        if (text.substr(at[i] + 1, suffix.size()) == suffix) {
          piece(i, i + 1 + suffix.size());  // ASCII: one code point per byte
          i += 1 + suffix.size();
          done = true;
          break;
        }
      }
      if (done) continue;
    }
    // " ?X+" for letters, numbers and other symbols.
    size_t j = i;
    if (cps[i] == ' ' && i + 1 < n && cls[i + 1] != Cls::space) j = i + 1;
    const Cls k = cls[j];
    if (k != Cls::space) {
      size_t end = j + 1;
      while (end < n && cls[end] == k) ++end;
      piece(i, end);
      i = end;
      continue;
    }
    // Whitespace: "\s+(?!\S)" leaves the last space to prefix the next word; else "\s+".
    size_t end = i;
    while (end < n && cls[end] == Cls::space) ++end;
    if (end < n && end - i >= 2) end -= 1;
    piece(i, end);
    i = end;
  }
  return out;
}

std::unique_ptr<Tokenizer> parse_bpe_tokenizer(std::string_view json_text, std::string_view what) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(what, ": not valid JSON: ", e.what());
  }
  return std::make_unique<BpeTokenizer>(root, what);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir, const ModelConfig& config) {
  if (config.tokenizer == "byte") {
    check(config.vocab_size >= 256, dir, ": a byte tokenizer needs vocab_size >= 256, got ",
          config.vocab_size);
    return std::make_unique<ByteTokenizer>();
  }
  check(config.tokenizer.empty(), dir, ": unknown replayssm_tokenizer '", config.tokenizer,
        "' (expected \"byte\")");
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  check(std::filesystem::exists(path), dir, ": no tokenizer.json (and config.json does not set ",
        "\"replayssm_tokenizer\": \"byte\")");
  const std::vector<uint8_t> bytes = io::read_file_bytes(path);
  return parse_bpe_tokenizer(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

}  // namespace replayssm::model
