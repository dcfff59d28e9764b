#include <algorithm>
#include <cmath>
#include <vector>

#include "cache/backend.h"
#include "cache/validate.h"
#include "cpu/cpu_backend.h"
#include "io/slot_file.h"
#include "replayssm/cache.h"
#include "replayssm/error.h"

#if defined(REPLAYSSM_WITH_CUDA) && __has_include("cuda/cuda_backend.h")
#include "cuda/cuda_backend.h"
#define REPLAYSSM_CUDA_BACKEND 1
#endif

namespace replayssm {

const char* backend_name(BackendKind kind) { return kind == BackendKind::cpu ? "cpu" : "cuda"; }

BackendKind parse_backend(std::string_view name) {
  if (name == "cpu") return BackendKind::cpu;
  if (name == "cuda") return BackendKind::cuda;
  fail("unknown backend '", name, "' (expected cpu or cuda)");
}

bool backend_available(BackendKind kind) {
  if (kind == BackendKind::cpu) return true;
#ifdef REPLAYSSM_CUDA_BACKEND
  return cuda_device_available();
#else
  return false;
#endif
}

void CacheConfig::validate(const SsmShape& shape) const {
  shape.validate();
  check(history >= 2 && (history & (history - 1)) == 0, "history ", history,
        " must be a power of two >= 2");
  check(max_window >= 1, "max_window ", max_window, " must be at least 1");
  check(max_window <= history / 2, "max_window ", max_window, " exceeds history/2: history ",
        history, " allows at most ", history / 2 - 1, " draft tokens (max_window ", history / 2,
        ")");
  check(num_slots >= 1, "num_slots ", num_slots, " must be at least 1");
  check(activation_dtype == DType::bf16 || activation_dtype == DType::f32 ||
            activation_dtype == DType::f16,
        "activation dtype must be bf16, fp16 or fp32, got ", dtype_name(activation_dtype));
  check(sr_bits >= 1 && sr_bits <= 13, "sr_bits ", sr_bits, " must be in 1..13");
  check(philox_rounds >= 1 && philox_rounds <= 16, "philox_rounds ", philox_rounds,
        " must be in 1..16");
  check(!(prefix_caching && is_separate(mode)),
        "prefix caching is not supported with separate checkpoints (mode ", mode_name(mode), ")");
  check(mode != Mode::separate_nvfp4 || shape.dstate % 16 == 0, "separate-nvfp4 needs dstate ",
        "to be a multiple of 16 (one e4m3 scale per 16 elements), got ", shape.dstate);
}

struct ReplayCache::Impl {
  SsmShape shape;
  LayerParams params;
  CacheConfig config;
  BackendKind kind;
  MemoryKind memory;
  std::unique_ptr<CacheBackend> backend;
  std::vector<uint8_t> live;  // host mirror of which slots are open

  void check_slot_index(int slot, const char* op) const {
    check(slot >= 0 && slot < config.num_slots, op, ": slot ", slot, " is out of range 0..",
          config.num_slots - 1);
  }
  void check_live(int slot, const char* op) const {
    check_slot_index(slot, op);
    check(live[slot], op, ": slot ", slot, " is not open (never opened or released)");
  }
  void check_free(int slot, const char* op) const {
    check_slot_index(slot, op);
    check(!live[slot], op, ": slot ", slot, " is already open; release it first");
  }
  // Batch slot lists in host memory: in range or padding, open, no duplicates. Device lists are
  // checked by the backend.
  void check_slots(const TensorView& slots, const char* op) const {
    check(slots.dtype == DType::i32 && slots.shape.size() == 1, op,
          ": slots must be a 1-D i32 tensor, got ", slots.describe());
    check(slots.memory == MemoryKind::host || memory == MemoryKind::cuda, op,
          ": slots must be in host memory for the cpu backend, got ", slots.describe());
    if (slots.memory != MemoryKind::host) return;
    std::vector<uint8_t> seen(size_t(config.num_slots), 0);
    for (int64_t b = 0; b < slots.shape[0]; ++b) {
      const int slot = slots.as<const int32_t>()[b];
      if (slot == kPaddingSlot) continue;
      check_live(slot, op);
      check(!seen[slot], op, ": slot ", slot, " appears twice in one batch");
      seen[slot] = 1;
    }
  }
  TokenBatch token_batch(const TensorView& slots, const TensorView& x, const TensorView& B,
                         const TensorView& C, const TensorView& dt, const TensorView& y) const {
    return TokenBatch{
        slots.as<const int32_t>(), int(x.shape[0]), int(x.shape[1]), x.data, B.data, C.data,
        dt.as<const float>(),      y.data,          y.dtype};
  }
};

ReplayCache::ReplayCache(const SsmShape& shape, const LayerParams& params,
                         const CacheConfig& config, BackendKind backend)
    : impl_(std::make_unique<Impl>()) {
  config.validate(shape);
  params.validate(shape);
  impl_->shape = shape;
  impl_->params = params;
  impl_->config = config;
  impl_->kind = backend;
  impl_->live.assign(size_t(config.num_slots), 0);
  if (backend == BackendKind::cpu) {
    impl_->memory = MemoryKind::host;
    impl_->backend = make_cpu_backend(shape, params, config);
  } else {
#ifdef REPLAYSSM_CUDA_BACKEND
    impl_->memory = MemoryKind::cuda;
    impl_->backend = make_cuda_backend(shape, params, config);
#else
    fail("the cuda backend is not available in this build (configure with -DREPLAYSSM_CUDA=ON)");
#endif
  }
}

ReplayCache::~ReplayCache() = default;
ReplayCache::ReplayCache(ReplayCache&&) noexcept = default;
ReplayCache& ReplayCache::operator=(ReplayCache&&) noexcept = default;

const SsmShape& ReplayCache::shape() const { return impl_->shape; }
const CacheConfig& ReplayCache::config() const { return impl_->config; }
BackendKind ReplayCache::backend() const { return impl_->kind; }
CacheBackend& ReplayCache::impl() { return *impl_->backend; }
CacheStats ReplayCache::stats() const { return impl_->backend->stats(); }

void ReplayCache::open(int slot, uint64_t request_id) {
  impl_->check_free(slot, "open");
  impl_->backend->open(slot, request_id);
  impl_->live[slot] = 1;
}

int ReplayCache::allocate(uint64_t request_id) {
  const auto it = std::find(impl_->live.begin(), impl_->live.end(), 0);
  check(it != impl_->live.end(), "allocate: all ", impl_->config.num_slots, " slots are open");
  const int slot = int(it - impl_->live.begin());
  open(slot, request_id);
  return slot;
}

void ReplayCache::release(int slot) {
  impl_->check_live(slot, "release");
  impl_->backend->release(slot);
  impl_->live[slot] = 0;
}

void ReplayCache::fork(int src, int dst, uint64_t dst_request_id) {
  impl_->check_live(src, "fork");
  impl_->check_free(dst, "fork");
  impl_->backend->fork(src, dst, dst_request_id);
  impl_->live[dst] = 1;
}

bool ReplayCache::is_open(int slot) const {
  return slot >= 0 && slot < impl_->config.num_slots && impl_->live[slot];
}

SlotCursors ReplayCache::cursors(int slot) const {
  impl_->check_live(slot, "cursors");
  return impl_->backend->cursors(slot);
}

void ReplayCache::prefill(const TensorView& slots, const TensorView& x, const TensorView& B,
                          const TensorView& C, const TensorView& dt, const TensorView& y) {
  impl_->check_slots(slots, "prefill");
  check(x.shape.size() == 4 && x.shape[1] >= 1, "prefill: x must be [B, T, H, P] with T >= 1, got ",
        x.describe());
  check_token_views("prefill", impl_->shape, impl_->config.activation_dtype, impl_->memory,
                    slots.shape[0], x.shape[1], x, B, C, dt, y);
  impl_->backend->prefill(impl_->token_batch(slots, x, B, C, dt, y));
}

void ReplayCache::verify(const TensorView& slots, const TensorView& x, const TensorView& B,
                         const TensorView& C, const TensorView& dt, const TensorView& y) {
  impl_->check_slots(slots, "verify");
  check(x.shape.size() == 4, "verify: x must be [B, W, H, P], got ", x.describe());
  const int64_t window = x.shape[1];
  check(window >= 1 && window <= impl_->config.max_window, "verify: window ", window,
        " is outside 1..max_window (", impl_->config.max_window, ")");
  check_token_views("verify", impl_->shape, impl_->config.activation_dtype, impl_->memory,
                    slots.shape[0], window, x, B, C, dt, y);
  impl_->backend->verify(impl_->token_batch(slots, x, B, C, dt, y));
}

void ReplayCache::commit(const TensorView& slots, const TensorView& accepted) {
  impl_->check_slots(slots, "commit");
  check_view(accepted, "commit", "accepted", {DType::i32}, {slots.shape[0]}, slots.memory);
  impl_->backend->commit(slots.as<const int32_t>(), accepted.as<const int32_t>(),
                         int(slots.shape[0]));
}

void ReplayCache::decode(const TensorView& slots, const TensorView& x, const TensorView& B,
                         const TensorView& C, const TensorView& dt, const TensorView& y) {
  // Accept [B, H, P] views as [B, 1, H, P].
  auto with_window = [](TensorView v, size_t rank) {
    if (v.shape.size() == rank - 1 && !v.shape.empty()) {
      std::vector<int64_t> shape{v.shape[0], 1};
      shape.insert(shape.end(), v.shape.begin() + 1, v.shape.end());
      v.shape = std::move(shape);
    }
    return v;
  };
  const TensorView x1 = with_window(x, 4), B1 = with_window(B, 4), C1 = with_window(C, 4),
                   dt1 = with_window(dt, 3), y1 = with_window(y, 4);
  impl_->check_slots(slots, "decode");
  check(x1.shape.size() == 4 && x1.shape[1] == 1,
        "decode: x must be [B, H, P] or [B, 1, H, P] (one token), got ", x.describe());
  check_token_views("decode", impl_->shape, impl_->config.activation_dtype, impl_->memory,
                    slots.shape[0], 1, x1, B1, C1, dt1, y1);
  impl_->backend->decode(impl_->token_batch(slots, x1, B1, C1, dt1, y1));
}

void ReplayCache::flush(const TensorView& slots) {
  impl_->check_slots(slots, "flush");
  impl_->backend->flush(slots.as<const int32_t>(), int(slots.shape[0]));
}

void ReplayCache::state(int slot, int at, float* out) const {
  impl_->check_live(slot, "state");
  const SlotCursors cur = impl_->backend->cursors(slot);
  if (at < 0) at = cur.committed;
  check(at <= cur.committed, "state: position ", at, " is beyond the ", cur.committed,
        " committed entries of slot ", slot);
  impl_->backend->state(slot, at, out);
}

std::vector<float> ReplayCache::state(int slot, int at) const {
  std::vector<float> out(size_t(impl_->shape.state_elements()));
  state(slot, at, out.data());
  return out;
}

std::vector<uint8_t> ReplayCache::export_slot(int slot) const {
  impl_->check_live(slot, "export");
  SlotImage image = impl_->backend->read_slot(slot);
  canonicalize_ring(impl_->shape, impl_->config, image);
  return encode_slot_file(impl_->shape, impl_->config, image);
}

void ReplayCache::import_slot(int slot, std::span<const uint8_t> bytes) {
  impl_->check_free(slot, "import");
  const SlotImage image = decode_slot_file(impl_->shape, impl_->config, bytes);
  impl_->backend->write_slot(slot, image);
  impl_->live[slot] = 1;
}

void ReplayCache::import_state(int slot, uint64_t request_id, const float* state) {
  impl_->check_free(slot, "import_state");
  const int64_t n = impl_->shape.state_elements();
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(state[i]), "import_state: state element ", i, " is not finite");
  impl_->backend->import_state(slot, request_id, state);
  impl_->live[slot] = 1;
}

}  // namespace replayssm
