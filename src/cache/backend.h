// The interface every backend implements. ReplayCache (src/cache/replay_cache.cpp) validates the
// tensor views and the slot bookkeeping it can check on the host, then calls one of these; a
// backend checks what depends on the slot state (cursors, finite inputs) before it changes
// anything, so an operation either completes or changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/layout.h"
#include "replayssm/cache.h"

namespace replayssm {

// Raw pointers of one batched token operation (shapes as in replayssm/cache.h), all in the
// backend's memory. T = tokens per slot (W for verify, the chunk length for prefill).
struct TokenBatch {
  const int32_t* slots;  // [B], kPaddingSlot skipped
  int batch;             // B
  int tokens;            // T
  const void* x;         // [B, T, H, P] activation dtype
  const void* B;         // [B, T, G, N] activation dtype
  const void* C;         // [B, T, G, N] activation dtype
  const float* dt;       // [B, T, H]
  void* y;               // [B, T, H, P] y_dtype
  DType y_dtype;
};

// One slot's cursors and storage bytes (SlotLayout order), on the host.
struct SlotImage {
  SlotCursors cursors;
  std::vector<uint8_t> bytes;  // SlotLayout::total
};

class CacheBackend {
 public:
  virtual ~CacheBackend() = default;

  virtual void open(int slot, uint64_t request_id) = 0;
  virtual void release(int slot) = 0;
  virtual void fork(int src, int dst, uint64_t dst_request_id) = 0;
  virtual SlotCursors cursors(int slot) const = 0;

  virtual void prefill(const TokenBatch& batch) = 0;
  virtual void verify(const TokenBatch& batch) = 0;
  virtual void commit(const int32_t* slots /*[B]*/, const int32_t* accepted /*[B]*/, int batch) = 0;
  virtual void flush(const int32_t* slots /*[B]*/, int batch) = 0;
  // verify of one token (batch.tokens == 1), then commit(1) of every slot. A backend may fuse
  // the two (the CUDA backend advances the cursors in the verify kernel: one launch less).
  virtual void decode(const TokenBatch& batch) {
    verify(batch);
    const std::vector<int32_t> ones(size_t(batch.batch), 1);
    commit(batch.slots, ones.data(), batch.batch);
  }

  virtual void state(int slot, int at, float* out /*[H,P,N] host*/) const = 0;
  virtual SlotImage read_slot(int slot) const = 0;
  virtual void write_slot(int slot, const SlotImage& image) = 0;  // slot must be free
  virtual void import_state(int slot, uint64_t request_id, const float* state /*host*/) = 0;
  virtual CacheStats stats() const = 0;
};

}  // namespace replayssm
