// Tokenizers of the model runner (docs/model.md lists what is supported):
//  * byte: token id = byte value, for the built-in model (config.json "replayssm_tokenizer":
//    "byte");
//  * byte-level BPE from a Hugging Face tokenizer.json (GPT-2 / GPT-NeoX style, as used by the
//    public Mamba-2 checkpoints): ByteLevel pre-tokenizer with the GPT-2 split pattern, BPE
//    merges by rank, added tokens matched literally, ByteLevel decoding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace replayssm::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes of one token (a UTF-8 character may span tokens: concatenate before display).
  virtual std::string decode(int32_t id) const = 0;
  virtual int vocab_size() const = 0;
  virtual std::string name() const = 0;
  std::string decode(const std::vector<int32_t>& ids) const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(int32_t id) const override;
  int vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

// Parses tokenizer.json text; throws replayssm::Error naming what is not supported.
std::unique_ptr<Tokenizer> parse_bpe_tokenizer(std::string_view json_text, std::string_view what);

// The model directory's tokenizer: byte-level when config says so, else tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir, const ModelConfig& config);

// GPT-2's pre-tokenizer split ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
// \s+(?!\S)|\s+) over code points, with Unicode's letter, number and White_Space classes
// (unicode_classes.h).
std::vector<std::string> gpt2_pre_tokenize(std::string_view text);

}  // namespace replayssm::model
