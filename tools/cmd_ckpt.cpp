// replayssm ckpt inspect | convert: exported slots (ReplayCache::export_slot, io/slot_file.h),
// either as raw files or as U8 tensors `export.<op>` of a trace output file.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "cache/layout.h"
#include "cli_common.h"
#include "io/checkpoint_view.h"
#include "io/safetensors.h"
#include "replayssm/error.h"

namespace replayssm::cli {
namespace {

constexpr const char* kSectionNames[SlotLayout::kSections] = {
    "rec", "rec_scale", "read", "read_block_scale", "read_scale", "ring_x", "ring_B", "ring_delta"};

// The bytes of an exported slot: the file itself, or one U8 tensor of a safetensors file.
std::vector<uint8_t> load_export(const std::string& path, const std::string& tensor) {
  std::vector<uint8_t> bytes = io::read_file_bytes(path);
  if (bytes.size() >= 8 && std::equal(bytes.begin(), bytes.begin() + 8, "RSSMSLOT")) {
    check(tensor.empty(), path, " is a raw slot file; --tensor applies to safetensors files");
    return bytes;
  }
  const io::StFile file = io::parse_safetensors(bytes, path);
  std::vector<std::string> exports;
  for (const auto& [name, t] : file.tensors)
    if (t.dtype == io::StDType::U8 && name.starts_with("export.")) exports.push_back(name);
  std::string name = tensor;
  if (name.empty()) {
    check(!exports.empty(), path, " holds no export.* tensor (run a trace with an export op)");
    check(exports.size() == 1, path, " holds ", exports.size(),
          " exported slots; pick one with --tensor (e.g. ", exports.front(), ")");
    name = exports.front();
  }
  auto it = file.tensors.find(name);
  check(it != file.tensors.end(), path, ": no tensor '", name, "'");
  check(it->second.dtype == io::StDType::U8 && it->second.shape.size() == 1, path, ": tensor '",
        name, "' is ", it->second.describe(), ", expected U8[bytes]");
  return it->second.data;
}

struct Stats {
  double rms = 0, amax = 0;
  int64_t nonfinite = 0;
};

Stats stats_of(const std::vector<float>& v) {
  Stats s;
  double sum = 0;
  for (float x : v) {
    if (!std::isfinite(x)) {
      ++s.nonfinite;
      continue;
    }
    sum += double(x) * x;
    s.amax = std::max(s.amax, double(std::fabs(x)));
  }
  s.rms = v.empty() ? 0 : std::sqrt(sum / double(v.size()));
  return s;
}

struct InspectArgs {
  std::string file, tensor;
  OutputFormat format;
};

void run_inspect(const InspectArgs& a) {
  const std::vector<uint8_t> bytes = load_export(a.file, a.tensor);
  const io::SlotFileInfo info = io::inspect_slot_file(bytes);
  const SsmShape& s = info.shape;
  const CacheConfig& c = info.config;
  const SlotLayout layout = SlotLayout::make(s, c);
  const std::vector<float> rec = io::decode_recurrence_checkpoint(s, c, info.image);
  const std::vector<float> read = io::decode_read_checkpoint(s, c, info.image);
  const Stats rs = stats_of(rec), ds = stats_of(read);
  double read_err = 0;
  for (size_t i = 0; i < rec.size(); ++i)
    read_err = std::max(read_err, double(std::fabs(read[i] - rec[i])));
  const double per_element = double(layout.checkpoint_bytes()) / double(s.state_elements());
  const SlotCursors& cur = info.image.cursors;

  if (a.format.json()) {
    nlohmann::json j = nlohmann::json::parse(info.header_json);
    j["bytes"] = bytes.size();
    j["format_version"] = info.version;
    j["checkpoint_bytes"] = layout.checkpoint_bytes();
    j["read_checkpoint_bytes"] = layout.read_checkpoint_bytes(c.mode);
    j["stored_bytes_per_element"] = per_element;
    j["recurrence"] = {{"rms", rs.rms}, {"amax", rs.amax}, {"nonfinite", rs.nonfinite}};
    j["read"] = {{"rms", ds.rms},
                 {"amax", ds.amax},
                 {"nonfinite", ds.nonfinite},
                 {"max_abs_diff_vs_recurrence", read_err}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}: replayssm slot file v{}, {} bytes, checksum ok\n", a.file, info.version,
             bytes.size());
  fmt::print("  mode              {}\n", mode_name(c.mode));
  fmt::print("  shape             H={} P={} N={} G={} ({} state elements)\n", s.nheads, s.headdim,
             s.dstate, s.ngroups, s.state_elements());
  fmt::print("  ring              history {}, activation dtype {}, {} committed entries\n",
             c.history, dtype_name(c.activation_dtype), cur.committed);
  fmt::print("  cursors           origin {}, flush_index {}, request id {}\n", cur.origin,
             cur.flush_index, cur.request_id);
  fmt::print("  random bits       seed {}, layer {}, {} SR bits, {} Philox rounds\n", c.seed,
             c.layer, c.sr_bits, c.philox_rounds);
  fmt::print("  checkpoint        {} bytes ({:.4g} bytes per state element), readout reads {}\n",
             layout.checkpoint_bytes(), per_element, layout.read_checkpoint_bytes(c.mode));
  fmt::print("  recurrence ckpt   rms {}, max |x| {}, non-finite {}\n", sci(rs.rms), sci(rs.amax),
             rs.nonfinite);
  fmt::print("  read ckpt         rms {}, max |x| {}, max |read - recurrence| {}\n", sci(ds.rms),
             sci(ds.amax), sci(read_err));
  Table table({"section", "offset", "bytes"});
  for (int i = 0; i < SlotLayout::kSections; ++i) {
    if (layout.size[i] == 0) continue;
    table.add({kSectionNames[i], std::to_string(layout.offset[i]), std::to_string(layout.size[i])});
  }
  fmt::print("\n{}", table.render());
}

struct ConvertArgs {
  std::string in, tensor, out, params;
  ModeArgs mode;
};

void run_convert(const ConvertArgs& a) {
  const std::optional<Mode> target = resolve_mode(a.mode);
  check(target.has_value(), "ckpt convert needs a target mode (--mode M)");
  const std::vector<uint8_t> bytes = load_export(a.in, a.tensor);
  const io::SlotFileInfo info = io::inspect_slot_file(bytes);
  const SsmShape& s = info.shape;
  LayerParams params;
  if (!a.params.empty()) {
    const io::StFile file = io::read_safetensors(a.params);
    for (auto [name, dst] : {std::pair{"A_log", &params.A_log},
                             std::pair{"dt_bias", &params.dt_bias}, std::pair{"D", &params.D}}) {
      auto it = file.tensors.find(name);
      check(it != file.tensors.end(), a.params, ": no tensor '", name, "'");
      check(it->second.shape == std::vector<int64_t>{s.nheads}, a.params, ": tensor '", name,
            "' is ", it->second.describe(), ", expected F32[", s.nheads, "]");
      *dst = it->second.f32(name);
    }
  } else {
    // Folding committed ring entries needs the decay A = -exp(A_log); an empty ring does not.
    check(info.image.cursors.committed == 0, a.in, ": the slot has ", info.image.cursors.committed,
          " committed ring entries; folding them needs the layer's A_log, dt_bias and D: pass "
          "--params FILE (e.g. the trace the slot came from)");
    params.A_log.assign(size_t(s.nheads), 0.0f);
    params.dt_bias.assign(size_t(s.nheads), 0.0f);
    params.D.assign(size_t(s.nheads), 0.0f);
  }
  ReplayCache source(s, params, info.config, BackendKind::cpu);
  source.import_slot(0, bytes);
  const std::vector<float> state = source.state(0);  // fp32 fold of checkpoint + committed ring
  CacheConfig config = info.config;
  config.mode = *target;
  ReplayCache dest(s, params, config, BackendKind::cpu);
  dest.import_state(0, info.image.cursors.request_id, state.data());
  const std::vector<uint8_t> out = dest.export_slot(0);
  io::write_file_bytes(a.out, out);
  fmt::print("converted {} ({}, {} committed entries folded) to {}: {} bytes -> {}\n", a.in,
             mode_name(info.config.mode), info.image.cursors.committed, mode_name(*target),
             out.size(), a.out);
  if (info.config.mode != Mode::fp32 && info.config.mode != Mode::fp16 &&
      info.config.mode != Mode::fp16_sr && info.config.mode != Mode::bf16) {
    fmt::print(stderr,
               "note: the source is a {}-mode checkpoint; its quantisation error is "
               "carried into the result\n",
               mode_name(info.config.mode));
  }
}

}  // namespace

void register_ckpt(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect and convert exported slot checkpoints");
  ckpt->require_subcommand(1);

  auto inspect = std::make_shared<InspectArgs>();
  CLI::App* i = ckpt->add_subcommand("inspect", "print what an exported slot holds");
  i->add_option("FILE", inspect->file, "raw slot file, or a trace output holding export.* tensors")
      ->required();
  i->add_option("--tensor", inspect->tensor, "which export.<op> tensor of a safetensors file");
  add_format_option(i, &inspect->format);
  i->callback([inspect] { run_inspect(*inspect); });

  auto convert = std::make_shared<ConvertArgs>();
  CLI::App* c = ckpt->add_subcommand(
      "convert", "re-encode an exported slot in another mode (state folded in fp32, empty ring)");
  c->add_option("IN", convert->in, "raw slot file, or a trace output holding export.* tensors")
      ->required();
  c->add_option("--tensor", convert->tensor, "which export.<op> tensor of a safetensors file");
  add_mode_options(c, &convert->mode, "target mode");
  c->add_option("--params", convert->params,
                "safetensors file with the layer's A_log, dt_bias, D (needed when the ring holds "
                "committed entries)");
  c->add_option("-o,--output", convert->out, "slot file to write")->required();
  c->callback([convert] { run_convert(*convert); });
}

}  // namespace replayssm::cli
