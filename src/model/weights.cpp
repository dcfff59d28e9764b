#include "model/weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/formats.h"
#include "io/safetensors.h"
#include "replayssm/error.h"

namespace replayssm::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

void Matrix::row_f32(int64_t r, float* out) const {
  if (type == Type::f32) {
    std::memcpy(out, f32() + r * cols, size_t(cols) * sizeof(float));
  } else {
    const uint16_t* src = bf16() + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(src[c]);
  }
}

int64_t ModelWeights::parameter_count() const {
  int64_t n = embeddings.rows * embeddings.cols + (tied ? 0 : lm_head.rows * lm_head.cols) +
              int64_t(norm_f.size());
  for (const LayerWeights& l : layers) {
    n += int64_t(l.norm.size()) + l.in_proj.rows * l.in_proj.cols + int64_t(l.in_bias.size()) +
         int64_t(l.conv_w.size()) + int64_t(l.conv_b.size()) + 3 * int64_t(l.A_log.size()) +
         int64_t(l.gated_norm.size()) + l.out_proj.rows * l.out_proj.cols +
         int64_t(l.out_bias.size());
  }
  return n;
}

namespace {

// Maps the file read-only so that the only copy of the tensor bytes is the one the parser makes
// (a 2.7B-parameter checkpoint would otherwise sit in memory twice); falls back to reading.
io::StFile read_st_mapped(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, path, ": cannot open for reading (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return io::read_safetensors(path);  // empty or odd file: let the reader name the problem
  }
  void* map = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return io::read_safetensors(path);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size_t(st.st_size)};
  return io::parse_safetensors(
      std::span<const uint8_t>(static_cast<const uint8_t*>(map), size_t(st.st_size)), path);
}

// All tensors of a checkpoint by name, with the file each came from (for error messages).
class TensorSource {
 public:
  explicit TensorSource(const std::string& dir) : dir_(dir) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(single)) {
      add_file(single.string());
    } else if (fs::exists(index)) {
      const std::vector<uint8_t> bytes = io::read_file_bytes(index.string());
      json root;
      try {
        root = json::parse(bytes.begin(), bytes.end());
      } catch (const json::exception& e) {
        fail(index.string(), ": not valid JSON: ", e.what());
      }
      check(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
            index.string(), ": missing the 'weight_map' object");
      std::set<std::string> files;
      for (const auto& [name, file] : root["weight_map"].items()) {
        check(file.is_string(), index.string(), ": weight_map entry '", name,
              "' is not a file name");
        const std::string f = file.get<std::string>();
        check(f.find('/') == std::string::npos && f.find("..") == std::string::npos, index.string(),
              ": shard name '", f, "' must be a plain file name");
        files.insert(f);
      }
      for (const std::string& f : files) add_file((fs::path(dir) / f).string());
      for (const auto& [name, file] : root["weight_map"].items()) {
        check(tensors_.count(name) != 0, index.string(), ": tensor '", name, "' is listed in ",
              file.get<std::string>(), " but that shard does not contain it");
      }
    } else {
      fail(dir, ": no model.safetensors or model.safetensors.index.json (only the Hugging Face ",
           "safetensors layout is supported; convert pytorch_model.bin with transformers first)");
    }
  }

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::vector<int64_t>* shape(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second.tensor.shape;
  }

  io::StTensor take(const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors_.find(name);
    check(it != tensors_.end(), dir_, ": tensor '", name, "' is missing from the checkpoint");
    io::StTensor t = std::move(it->second.tensor);
    const std::string file = it->second.file;
    tensors_.erase(it);
    check(t.is_floating(), file, ": tensor '", name, "' has dtype ", io::st_dtype_name(t.dtype),
          ", expected a floating type");
    // nn.Conv1d stores [C, 1, K]; accept the squeezed [C, K] too.
    if (shape.size() == 3 && t.shape.size() == 2 && shape[1] == 1) shape = {shape[0], shape[2]};
    if (t.shape != shape) {
      std::string expected = "[";
      for (size_t i = 0; i < shape.size(); ++i) {
        if (i) expected += ',';
        expected += std::to_string(shape[i]);
      }
      fail(file, ": tensor '", name, "' has shape ", t.describe(), ", expected ", expected,
           "] from config.json");
    }
    return t;
  }

  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape) {
    io::StTensor t = take(name, std::move(shape));
    const std::vector<double> d = t.as_f64(name);
    std::vector<float> out(d.begin(), d.end());
    for (size_t i = 0; i < out.size(); ++i)
      check(std::isfinite(out[i]), dir_, ": tensor '", name, "' has a non-finite value at ", i);
    return out;
  }

  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    io::StTensor t = take(name, {rows, cols});
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    if (t.dtype == io::StDType::BF16) {
      m.type = Matrix::Type::bf16;
      m.bytes = std::move(t.data);
    } else if (t.dtype == io::StDType::F32) {
      m.type = Matrix::Type::f32;
      m.bytes = std::move(t.data);
    } else {  // F16 / F64: widen (or narrow) to fp32
      const std::vector<double> d = t.as_f64(name);
      m.type = Matrix::Type::f32;
      m.bytes.resize(d.size() * sizeof(float));
      float* out = reinterpret_cast<float*>(m.bytes.data());
      for (size_t i = 0; i < d.size(); ++i) out[i] = float(d[i]);
    }
    return m;
  }

  std::vector<std::string> leftover() const {
    std::vector<std::string> names;
    for (const auto& [name, entry] : tensors_) names.push_back(name);
    return names;
  }

 private:
  struct Entry {
    io::StTensor tensor;
    std::string file;
  };
  void add_file(const std::string& path) {
    check(fs::exists(path), dir_, ": shard ", path, " does not exist");
    io::StFile file = read_st_mapped(path);
    for (auto& [name, tensor] : file.tensors) {
      check(tensors_.count(name) == 0, path, ": tensor '", name, "' appears in two shards");
      tensors_.emplace(name, Entry{std::move(tensor), path});
    }
  }
  std::string dir_;
  std::map<std::string, Entry> tensors_;
};

}  // namespace

ModelWeights load_model(const std::string& dir) {
  check(fs::is_directory(dir), "model directory '", dir, "' does not exist or is not a directory");
  const fs::path config_path = fs::path(dir) / "config.json";
  check(fs::exists(config_path), dir, ": config.json is missing (expected a Hugging Face ",
        "Mamba2ForCausalLM directory)");
  ModelWeights w;
  w.config = read_model_config(config_path.string());
  const ModelConfig& c = w.config;
  TensorSource src(dir);

  const int64_t d = c.hidden_size, V = c.vocab_size, H = c.num_heads, K = c.conv_kernel;
  const int64_t conv_dim = c.conv_dim(), d_inner = c.d_inner();
  // Older exports name the embedding "embedding" (Mamba2Model's load hook renames it too).
  const std::string embed_name =
      src.has("backbone.embeddings.weight")
          ? "backbone.embeddings.weight"
          : (src.has("backbone.embedding.weight") ? "backbone.embedding.weight"
                                                  : "backbone.embeddings.weight");
  w.embeddings = src.matrix(embed_name, V, d);
  w.norm_f = src.vec("backbone.norm_f.weight", {d});
  if (src.has("lm_head.weight")) {
    w.lm_head = src.matrix("lm_head.weight", V, d);
  } else {
    check(c.tie_word_embeddings, dir, ": tensor 'lm_head.weight' is missing and config.json ",
          "does not set tie_word_embeddings");
    w.tied = true;
  }

  // The in_proj row count tells whether the checkpoint carries the (unused) d_mlp rows that
  // Hugging Face's split discards: rows = 2 * d_mlp + d_inner + conv_dim + H.
  const std::string first_in = "backbone.layers.0.mixer.in_proj.weight";
  int64_t in_rows = c.in_proj_size();
  if (const std::vector<int64_t>* shape = src.shape(first_in);
      shape && shape->size() == 2 && (*shape)[0] > in_rows && ((*shape)[0] - in_rows) % 2 == 0) {
    in_rows = (*shape)[0];
  }
  w.d_mlp = int((in_rows - c.in_proj_size()) / 2);

  w.layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[size_t(i)];
    l.norm = src.vec(p + "norm.weight", {d});
    l.in_proj = src.matrix(p + "mixer.in_proj.weight", in_rows, d);
    if (c.use_bias) l.in_bias = src.vec(p + "mixer.in_proj.bias", {in_rows});
    l.conv_w = src.vec(p + "mixer.conv1d.weight", {conv_dim, 1, K});
    l.conv_b = c.use_conv_bias ? src.vec(p + "mixer.conv1d.bias", {conv_dim})
                               : std::vector<float>(size_t(conv_dim), 0.0f);
    l.A_log = src.vec(p + "mixer.A_log", {H});
    l.dt_bias = src.vec(p + "mixer.dt_bias", {H});
    l.D = src.vec(p + "mixer.D", {H});
    l.gated_norm = src.vec(p + "mixer.norm.weight", {d_inner});
    l.out_proj = src.matrix(p + "mixer.out_proj.weight", d, d_inner);
    if (c.use_bias) l.out_bias = src.vec(p + "mixer.out_proj.bias", {d});
  }
  // Anything left over means the checkpoint is not the layout this runner computes (more layers
  // than the config says, a different architecture): refuse rather than ignore weights.
  const std::vector<std::string> extra = src.leftover();
  check(extra.empty(), dir, ": ", extra.size(), " tensor(s) the Mamba2ForCausalLM layout does ",
        "not use, first '", extra.empty() ? "" : extra[0], "' (does num_hidden_layers match?)");
  return w;
}

}  // namespace replayssm::model
