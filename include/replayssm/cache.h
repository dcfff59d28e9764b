// The replay cache of one Mamba-2 layer: per slot a checkpoint (or two, by mode), a ring of the
// last `history` per-token inputs, and cursors. See SPEC sections 3-5 and docs/design.md.
//
// All batched operations take `slots`, an i32 tensor [B] of slot indices (kPaddingSlot entries
// are skipped), and per-token tensors whose leading dimension is B:
//   x  [B, T, H, P]  activation dtype      B, C [B, T, G, N]  activation dtype
//   dt [B, T, H]     fp32 (raw, before softplus)   y [B, T, H, P]  fp32 or activation dtype
// Every operation validates all of its inputs before it changes anything: when it throws
// replayssm::Error, no slot has changed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "replayssm/types.h"

namespace replayssm {

inline constexpr int32_t kPaddingSlot = -1;

enum class BackendKind : uint8_t { cpu, cuda };
const char* backend_name(BackendKind kind);
BackendKind parse_backend(std::string_view name);
bool backend_available(BackendKind kind);  // cuda: built with CUDA and a device is present

struct CacheConfig {
  Mode mode = Mode::fp32;
  int history = 16;    // ring capacity L, a power of two
  int max_window = 8;  // largest verify window W (1 + drafts), <= history / 2
  int num_slots = 1;
  DType activation_dtype = DType::bf16;  // ring x and B; bf16 or fp32
  int sr_bits = 7;                       // random bits of stochastic rounding, 1..13
  int philox_rounds = 10;
  uint64_t seed = 0;  // Philox key = (low 32 bits of seed, high 32 bits of seed ^ layer)
  int layer = 0;      // layer index, part of the Philox key
  bool prefix_caching = false;
  void validate(const SsmShape& shape) const;
};

// Cursors of one slot (SPEC section 4).
struct SlotCursors {
  int32_t committed = 0;     // c: ring entries since the checkpoint
  int32_t pending = 0;       // p: entries of the last verify not yet committed
  int32_t origin = 0;        // physical ring index of logical entry 0
  uint32_t flush_index = 0;  // number of checkpoint writes so far (Philox counter)
  uint64_t request_id = 0;   // logical identity for random numbers
  int32_t live = 0;          // 1 while the slot is open
  int32_t reserved = 0;
};

// Counters since construction, summed over slots.
struct CacheStats {
  uint64_t flushes = 0;            // checkpoint writes by flush (prefill and import not counted)
  uint64_t saturated = 0;          // elements clamped to +-65504 by an fp16 encode
  uint64_t checkpoint_writes = 0;  // all checkpoint writes (flush, prefill, import)
  uint64_t nonfinite = 0;  // Inf/NaN fold results, written as +-max float / 0 before encoding
};

class CacheBackend;  // src/cache/backend.h

class ReplayCache {
 public:
  ReplayCache(const SsmShape& shape, const LayerParams& params, const CacheConfig& config,
              BackendKind backend = BackendKind::cpu);
  ~ReplayCache();
  ReplayCache(ReplayCache&&) noexcept;
  ReplayCache& operator=(ReplayCache&&) noexcept;

  const SsmShape& shape() const;
  const CacheConfig& config() const;
  BackendKind backend() const;

  // --- slot lifecycle --------------------------------------------------------------------------
  void open(int slot, uint64_t request_id);  // empty ring, zero checkpoint; slot must be free
  int allocate(uint64_t request_id);         // opens the lowest free slot and returns it
  void release(int slot);
  void fork(int src, int dst, uint64_t dst_request_id);  // dst (free) becomes a copy of src
  bool is_open(int slot) const;
  SlotCursors cursors(int slot) const;

  // --- batched operations (shapes in the header comment) --------------------------------------
  // Folds committed entries, runs the FP32 recurrence over the T tokens, writes the checkpoint(s).
  void prefill(const TensorView& slots, const TensorView& x, const TensorView& B,
               const TensorView& C, const TensorView& dt, const TensorView& y);
  // Flushes slots with c + W > history, appends W pending entries, writes y for each of them.
  void verify(const TensorView& slots, const TensorView& x, const TensorView& B,
              const TensorView& C, const TensorView& dt, const TensorView& y);
  // accepted: i32 [B], 1 <= accepted[b] <= pending.
  void commit(const TensorView& slots, const TensorView& accepted);
  // verify with W = 1, then commit 1. x [B,1,H,P] or [B,H,P] (likewise B, C, dt, y). Slots may
  // be in device memory; the CUDA backend does both in one pass (no commit launch).
  void decode(const TensorView& slots, const TensorView& x, const TensorView& B,
              const TensorView& C, const TensorView& dt, const TensorView& y);
  void flush(const TensorView& slots);

  // --- inspection and hand-off ----------------------------------------------------------------
  // The fp32 state after the first `at` committed entries (0 <= at <= c; -1 means c).
  void state(int slot, int at, float* out /*[H,P,N] host*/) const;
  std::vector<float> state(int slot, int at = -1) const;
  std::vector<uint8_t> export_slot(int slot) const;  // versioned, checksummed (docs/design.md)
  void import_slot(int slot, std::span<const uint8_t> bytes);  // slot must be free
  // Opens `slot` with a plain fp32 state, encoded in this cache's mode (prefix reuse, hand-off).
  void import_state(int slot, uint64_t request_id, const float* state /*[H,P,N] host*/);

  CacheStats stats() const;
  CacheBackend& impl();  // for backend-specific tests and tools

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace replayssm
