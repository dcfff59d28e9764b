// The cursor rules of SPEC section 4, written once for the CPU backend and the CUDA kernels.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "replayssm/cache.h"

namespace replayssm {

// Physical ring index of logical entry `logical` (history is a power of two).
RSSM_HD int ring_index(const SlotCursors& cursors, int logical, int history) {
  return (cursors.origin + logical) & (history - 1);
}

// A verify of `window` tokens flushes first when the window would not fit behind the committed
// entries: c + W > L. This also schedules autoregressive flushes once every L tokens.
RSSM_HD bool verify_needs_flush(const SlotCursors& cursors, int window, int history) {
  return cursors.committed + window > history;
}

// After the checkpoint absorbed the c committed entries. An empty ring writes nothing and keeps
// flush_index (so the Philox counters of the next real flush do not depend on empty flushes).
RSSM_HD void apply_flush(SlotCursors& cursors, int history) {
  if (cursors.committed == 0) return;
  cursors.origin = (cursors.origin + cursors.committed) & (history - 1);
  cursors.committed = 0;
  cursors.flush_index += 1;
}

RSSM_HD void apply_verify(SlotCursors& cursors, int window) { cursors.pending = window; }

RSSM_HD bool commit_is_valid(const SlotCursors& cursors, int accepted) {
  return accepted >= 1 && accepted <= cursors.pending;
}

RSSM_HD void apply_commit(SlotCursors& cursors, int accepted) {
  cursors.committed += accepted;
  cursors.pending = 0;
}

// A fresh slot: empty ring, zero checkpoint, no checkpoint written yet.
RSSM_HD SlotCursors fresh_cursors(uint64_t request_id) {
  SlotCursors cursors{};
  cursors.request_id = request_id;
  cursors.live = 1;
  return cursors;
}

}  // namespace replayssm
