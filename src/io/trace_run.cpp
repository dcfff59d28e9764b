// Replays a parsed trace through ReplayCache and collects the outputs (docs/trace-format.md,
// "Output files").
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cache/backend.h"
#include "io/checkpoint_view.h"
#include "io/staging.h"
#include "io/trace.h"
#include "replayssm/error.h"

namespace replayssm::io {
namespace {

// Inputs are stored as fp32; a bf16 cache takes them rounded to nearest even, exactly what a
// model would hand over after its own bf16 cast.
uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// Owns the activation-dtype copy of one input tensor and views it with the op's shape.
struct Activation {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  TensorView view(const std::vector<float>& values, DType dtype, std::vector<int64_t> shape) {
    if (dtype == DType::bf16) {
      bf16.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) bf16[i] = to_bf16(values[i]);
      return TensorView{bf16.data(), DType::bf16, std::move(shape), MemoryKind::host};
    }
    f32 = values;
    return TensorView{f32.data(), DType::f32, std::move(shape), MemoryKind::host};
  }
};

}  // namespace

StFile run_trace(const Trace& trace, const RunOptions& options, RunSummary* summary) {
  const auto start = std::chrono::steady_clock::now();
  CacheConfig config = trace.cache;
  if (options.mode) config.mode = *options.mode;
  ReplayCache cache(trace.shape, trace.params, config, options.backend);
  const int K = config.num_slots;
  for (int slot = 0; slot < K; ++slot) cache.open(slot, uint64_t(slot));
  uint64_t next_request = uint64_t(K);

  const int64_t H = trace.shape.nheads, P = trace.shape.headdim, N = trace.shape.dstate,
                G = trace.shape.ngroups;
  const DType act = config.activation_dtype;
  StFile out;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    try {
      std::vector<int32_t> slots(op.slots.begin(), op.slots.end());
      const int64_t S = int64_t(slots.size());
      const TensorView slots_view{slots.data(), DType::i32, {S}, MemoryKind::host};
      switch (op.kind) {
        case OpKind::prefill:
        case OpKind::decode:
        case OpKind::verify: {
          const TokenInputs& in = trace.inputs.at(op.input);
          // A prefill of n tokens is a batch of one slot with T = n.
          const int64_t T = op.window;
          Activation ax, aB, aC;
          const TensorView hx = ax.view(in.x, act, {S, T, H, P});
          const TensorView hB = aB.view(in.B, act, {S, T, G, N});
          const TensorView hC = aC.view(in.C, act, {S, T, G, N});
          const Staged x(options.backend, hx.data, act, hx.shape);
          const Staged B(options.backend, hB.data, act, hB.shape);
          const Staged C(options.backend, hC.data, act, hC.shape);
          const Staged dt(options.backend, in.dt.data(), DType::f32, {S, T, H});
          std::vector<float> y(size_t(S * T * H * P));
          const Staged yv(options.backend, y.data(), DType::f32, {S, T, H, P});
          if (op.kind == OpKind::prefill)
            cache.prefill(slots_view, x.view(), B.view(), C.view(), dt.view(), yv.view());
          if (op.kind == OpKind::decode)
            cache.decode(slots_view, x.view(), B.view(), C.view(), dt.view(), yv.view());
          if (op.kind == OpKind::verify)
            cache.verify(slots_view, x.view(), B.view(), C.view(), dt.view(), yv.view());
          yv.copy_to_host(y.data());
          std::vector<int64_t> y_shape = op.kind == OpKind::prefill
                                             ? std::vector<int64_t>{T, H, P}
                                             : std::vector<int64_t>{S, T, H, P};
          out.tensors["y." + std::to_string(i)] = make_f32(y_shape, y);
          break;
        }
        case OpKind::commit: {
          std::vector<int32_t> accepted(op.accepted.begin(), op.accepted.end());
          cache.commit(slots_view, TensorView{accepted.data(), DType::i32, {S}, MemoryKind::host});
          break;
        }
        case OpKind::flush:
          cache.flush(slots_view);
          break;
        case OpKind::fork:
          cache.fork(op.src, op.dst, op.request ? *op.request : next_request++);
          break;
        case OpKind::release:
          cache.release(op.slot());
          break;
        case OpKind::open:
          cache.open(op.slot(), op.request ? *op.request : next_request++);
          break;
        case OpKind::state:
          out.tensors["snapshot." + std::to_string(i)] =
              make_f32({H, P, N}, cache.state(op.slot(), op.at));
          break;
        case OpKind::export_slot: {
          const std::vector<uint8_t> bytes = cache.export_slot(op.slot());
          out.tensors["export." + std::to_string(i)] = make_u8({int64_t(bytes.size())}, bytes);
          break;
        }
      }
    } catch (const Error& e) {
      fail("op ", i, " (", op_name(op.kind), "): ", e.what());
    }
  }
  for (int slot = 0; slot < K; ++slot) {
    if (!cache.is_open(slot)) continue;
    const std::string s = std::to_string(slot);
    out.tensors["state." + s] = make_f32({H, P, N}, cache.state(slot));
    out.tensors["read." + s] = make_f32(
        {H, P, N}, decode_read_checkpoint(trace.shape, config, cache.impl().read_slot(slot)));
    const SlotCursors c = cache.cursors(slot);
    const int32_t cursors[3] = {c.committed, c.pending, int32_t(c.flush_index)};
    out.tensors["cursors." + s] = make_i32({3}, cursors);
  }
  const CacheStats stats = cache.stats();
  nlohmann::json meta = {
      {"version", kTraceVersion},       {"backend", backend_name(options.backend)},
      {"mode", mode_name(config.mode)}, {"flushes", stats.flushes},
      {"saturated", stats.saturated},   {"checkpoint_writes", stats.checkpoint_writes}};
  out.metadata[kOutputMetadataKey] = meta.dump();
  if (summary) {
    summary->stats = stats;
    summary->ops = int(trace.ops.size());
    summary->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return out;
}

}  // namespace replayssm::io
