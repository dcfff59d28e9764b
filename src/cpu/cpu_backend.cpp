#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cache/checkpoint_codec.h"
#include "cache/cursors.h"
#include "core/act.h"
#include "cpu/decode_tables.h"
#include "cpu/simd.h"
#include "replayssm/error.h"

namespace replayssm {
namespace {

// Threads only pay off above this many multiply-adds per parallel region; below it the cost of
// waking and joining OpenMP threads (large on a loaded machine) exceeds the work.
constexpr int64_t kParallelWork = int64_t(1) << 18;

class CpuBackend final : public CacheBackend {
 public:
  CpuBackend(const SsmShape& shape, const LayerParams& params, const CacheConfig& config)
      : shape_(shape),
        params_(params),
        config_(config),
        layout_(SlotLayout::make(shape, config)),
        cursors_(size_t(config.num_slots)),
        arena_(size_t(config.num_slots) * layout_.total, 0) {
    A_.resize(size_t(shape.nheads));
    for (int h = 0; h < shape.nheads; ++h) A_[h] = -std::exp(params.A_log[h]);
  }

  void open(int slot, uint64_t request_id) override {
    std::memset(base(slot), 0, layout_.total);
    cursors_[slot] = fresh_cursors(request_id);
  }

  void release(int slot) override { cursors_[slot] = SlotCursors{}; }

  void fork(int src, int dst, uint64_t dst_request_id) override {
    std::memcpy(base(dst), base(src), layout_.total);
    cursors_[dst] = cursors_[src];
    cursors_[dst].request_id = dst_request_id;
    cursors_[dst].pending = 0;
  }

  SlotCursors cursors(int slot) const override { return cursors_[slot]; }

  void prefill(const TokenBatch& batch) override;
  void verify(const TokenBatch& batch) override;
  void commit(const int32_t* slots, const int32_t* accepted, int batch) override;
  void flush(const int32_t* slots, int batch) override;
  void state(int slot, int at, float* out) const override { fold(slot, at, out); }

  SlotImage read_slot(int slot) const override {
    SlotImage image{cursors_[slot], {}};
    image.bytes.assign(base(slot), base(slot) + layout_.total);
    return image;
  }

  void write_slot(int slot, const SlotImage& image) override {
    std::memcpy(base(slot), image.bytes.data(), layout_.total);
    cursors_[slot] = image.cursors;
  }

  void import_state(int slot, uint64_t request_id, const float* state) override {
    open(slot, request_id);
    write_checkpoint(slot, state);
    cursors_[slot].flush_index += 1;
  }

  CacheStats stats() const override { return stats_; }

 private:
  uint8_t* base(int slot) { return arena_.data() + size_t(slot) * layout_.total; }
  const uint8_t* base(int slot) const { return arena_.data() + size_t(slot) * layout_.total; }
  uint8_t* section(int slot, SlotLayout::Section s) { return base(slot) + layout_.offset[s]; }
  const uint8_t* section(int slot, SlotLayout::Section s) const {
    return base(slot) + layout_.offset[s];
  }
  SlotCheckpoint checkpoint(int slot) const {
    auto* b = const_cast<uint8_t*>(base(slot));
    auto ptr = [&](SlotLayout::Section s) -> uint8_t* {
      return layout_.size[s] ? b + layout_.offset[s] : nullptr;
    };
    return SlotCheckpoint{ptr(SlotLayout::rec),
                          reinterpret_cast<float*>(ptr(SlotLayout::rec_scale)),
                          ptr(SlotLayout::read), ptr(SlotLayout::read_block_scale),
                          reinterpret_cast<float*>(ptr(SlotLayout::read_scale))};
  }
  const float* ring_delta(int slot) const {
    return reinterpret_cast<const float*>(section(slot, SlotLayout::ring_delta));
  }
  int rows() const { return shape_.nheads * shape_.headdim; }
  size_t act_bytes() const { return dtype_size(config_.activation_dtype); }

  // Running sums L_k = delta_0 + ... + delta_k of head h over logical entries 0..count-1.
  void running_sums(int slot, int h, int count, float* sums /*[count]*/) const {
    const float* deltas = ring_delta(slot);
    float total = 0.0f;
    for (int k = 0; k < count; ++k) {
      total += deltas[ring_index(cursors_[slot], k, config_.history) * shape_.nheads + h];
      sums[k] = total;
    }
  }

  // S = exp(A L_{m-1}) S0 + sum_{k<m} delta_k exp(A (L_{m-1} - L_k)) x_k B_k^T over the first
  // `count` committed entries, in FP32, from the decoded recurrence checkpoint.
  void fold(int slot, int count, float* out /*[H,P,N]*/) const;
  // Encodes the fp32 state into the checkpoint(s) with the slot's current flush_index as the
  // Philox counter (the caller advances it); non-finite values are sanitised and counted.
  void write_checkpoint(int slot, const float* state /*[H,P,N]*/);
  // Validation shared by prefill and verify: live slots, nothing pending, finite inputs.
  void check_token_batch(const TokenBatch& batch, const char* op) const;

  SsmShape shape_;
  LayerParams params_;
  CacheConfig config_;
  SlotLayout layout_;
  std::vector<float> A_;  // [H] = -exp(A_log)
  std::vector<SlotCursors> cursors_;
  std::vector<uint8_t> arena_;  // [S, layout.total]
  CacheStats stats_;
};

void CpuBackend::fold(int slot, int count, float* out) const {
  const SlotCheckpoint ck = checkpoint(slot);
  const int P = shape_.headdim, N = shape_.dstate, H = shape_.nheads;
  const int heads_per_group = shape_.heads_per_group();
  const DType act = config_.activation_dtype;
  const void* ring_x = section(slot, SlotLayout::ring_x);
  const void* ring_B = section(slot, SlotLayout::ring_B);
  const float* deltas = ring_delta(slot);
  const cpu::TableDecoder& dec = cpu::table_decoder();
  const bool parallel = shape_.state_elements() * (count + 1) >= kParallelWork;
#pragma omp parallel for schedule(static) if (parallel)
  for (int h = 0; h < H; ++h) {
    std::vector<float> sums(static_cast<size_t>(std::max(count, 1)));
    std::vector<float> b_row(static_cast<size_t>(N));
    running_sums(slot, h, count, sums.data());
    const float total = count > 0 ? sums[count - 1] : 0.0f;
    const float decay0 = decay(A_[h] * total);
    float* S = out + size_t(h) * P * N;
    for (int p = 0; p < P; ++p) {
      decode_recurrence_row(config_.mode, ck, h * P + p, N, S + size_t(p) * N, dec);
      for (int n = 0; n < N; ++n) S[size_t(p) * N + n] *= decay0;
    }
    const int g = h / heads_per_group;
    for (int k = 0; k < count; ++k) {
      const int phys = ring_index(cursors_[slot], k, config_.history);
      const float weight = deltas[phys * H + h] * decay(A_[h] * (total - sums[k]));
      for (int n = 0; n < N; ++n)
        b_row[n] = load_act(ring_B, act, (int64_t(phys) * shape_.ngroups + g) * N + n);
      for (int p = 0; p < P; ++p) {
        const float wx = weight * load_act(ring_x, act, (int64_t(phys) * H + h) * P + p);
        float* row = S + size_t(p) * N;
        for (int n = 0; n < N; ++n) row[n] += wx * b_row[n];
      }
    }
  }
}

void CpuBackend::write_checkpoint(int slot, const float* state) {
  const SlotCheckpoint ck = checkpoint(slot);
  const int N = shape_.dstate;
  const SrContext sr =
      make_sr_context(philox_key(config_.seed, config_.layer), cursors_[slot].request_id,
                      cursors_[slot].flush_index, config_.sr_bits, config_.philox_rounds);
  uint64_t saturated = 0, nonfinite = 0;
#pragma omp parallel for schedule(static) reduction(+ : saturated, nonfinite) \
    if (shape_.state_elements() >= kParallelWork)
  for (int row = 0; row < rows(); ++row) {
    std::vector<float> values(state + size_t(row) * N, state + size_t(row + 1) * N);
    for (float& v : values) {
      if (std::isfinite(v)) continue;
      ++nonfinite;
      v = std::isnan(v) ? 0.0f : std::copysign(std::numeric_limits<float>::max(), v);
    }
    saturated += uint64_t(encode_checkpoint_row(config_.mode, ck, row, N, values.data(), sr));
  }
  stats_.saturated += saturated;
  stats_.nonfinite += nonfinite;
  stats_.checkpoint_writes += 1;
}

void CpuBackend::check_token_batch(const TokenBatch& batch, const char* op) const {
  const int H = shape_.nheads, P = shape_.headdim, G = shape_.ngroups, N = shape_.dstate;
  const DType act = config_.activation_dtype;
  for (int b = 0; b < batch.batch; ++b) {
    const int slot = batch.slots[b];
    if (slot == kPaddingSlot) continue;
    check(cursors_[slot].pending == 0, op, ": slot ", slot, " has ", cursors_[slot].pending,
          " uncommitted entries from its last verify; commit them first");
    const int64_t T = batch.tokens;
    auto finite = [&](const void* data, DType dtype, int64_t per_slot, const char* name) {
      for (int64_t i = 0; i < T * per_slot; ++i) {
        if (!std::isfinite(load_act(data, dtype, b * T * per_slot + i)))
          fail(op, ": input ", name, " of batch row ", b, " (slot ", slot,
               ") is not finite at element ", i);
      }
    };
    finite(batch.x, act, int64_t(H) * P, "x");
    finite(batch.B, act, int64_t(G) * N, "B");
    finite(batch.C, act, int64_t(G) * N, "C");
    finite(batch.dt, DType::f32, H, "dt");
  }
}

void CpuBackend::flush(const int32_t* slots, int batch) {
  std::vector<float> state(static_cast<size_t>(shape_.state_elements()));
  for (int b = 0; b < batch; ++b) {
    const int slot = slots[b];
    if (slot == kPaddingSlot || cursors_[slot].committed == 0) continue;
    fold(slot, cursors_[slot].committed, state.data());
    write_checkpoint(slot, state.data());
    apply_flush(cursors_[slot], config_.history);
    stats_.flushes += 1;
  }
}

void CpuBackend::prefill(const TokenBatch& batch) {
  check_token_batch(batch, "prefill");
  const int H = shape_.nheads, P = shape_.headdim, G = shape_.ngroups, N = shape_.dstate;
  const int T = batch.tokens, heads_per_group = shape_.heads_per_group();
  const DType act = config_.activation_dtype;
  std::vector<float> state(static_cast<size_t>(shape_.state_elements()));
  for (int b = 0; b < batch.batch; ++b) {
    const int slot = batch.slots[b];
    if (slot == kPaddingSlot) continue;
    fold(slot, cursors_[slot].committed, state.data());
    // The exact per-token recurrence in FP32: S = a S + delta x B^T, y = S C + D x.
#pragma omp parallel for schedule(static) if (shape_.state_elements() * T >= kParallelWork)
    for (int h = 0; h < H; ++h) {
      const int g = h / heads_per_group;
      std::vector<float> b_row(static_cast<size_t>(N)), c_row(static_cast<size_t>(N));
      float* S = state.data() + size_t(h) * P * N;
      for (int t = 0; t < T; ++t) {
        const int64_t token = int64_t(b) * T + t;
        const float delta =
            process_dt(batch.dt[token * H + h], params_.dt_bias[h], params_.dt_min, params_.dt_max);
        const float a = std::exp(delta * A_[h]);
        for (int n = 0; n < N; ++n) {
          b_row[n] = load_act(batch.B, act, (token * G + g) * N + n);
          c_row[n] = load_act(batch.C, act, (token * G + g) * N + n);
        }
        for (int p = 0; p < P; ++p) {
          const float x = load_act(batch.x, act, (token * H + h) * P + p);
          const float acc =
              cpu::update_and_dot(S + size_t(p) * N, a, delta * x, b_row.data(), c_row.data(), N);
          store_act(batch.y, batch.y_dtype, (token * H + h) * P + p, acc + params_.D[h] * x);
        }
      }
    }
    // The ring is empty afterwards: the folded entries are consumed with the checkpoint write.
    SlotCursors& cur = cursors_[slot];
    cur.origin = (cur.origin + cur.committed) & (config_.history - 1);
    cur.committed = 0;
    write_checkpoint(slot, state.data());
    cur.flush_index += 1;
  }
}

void CpuBackend::verify(const TokenBatch& batch) {
  check_token_batch(batch, "verify");
  const int H = shape_.nheads, P = shape_.headdim, G = shape_.ngroups, N = shape_.dstate;
  const int W = batch.tokens, L = config_.history, heads_per_group = shape_.heads_per_group();
  const DType act = config_.activation_dtype;
  const size_t x_bytes = size_t(H) * P * act_bytes(), b_bytes = size_t(G) * N * act_bytes();

  // Phase 1, per slot: flush when the window does not fit, then append the W pending entries.
  std::vector<int32_t> flushing;
  for (int b = 0; b < batch.batch; ++b) {
    const int slot = batch.slots[b];
    if (slot != kPaddingSlot && verify_needs_flush(cursors_[slot], W, L)) flushing.push_back(slot);
  }
  flush(flushing.data(), int(flushing.size()));
  for (int b = 0; b < batch.batch; ++b) {
    const int slot = batch.slots[b];
    if (slot == kPaddingSlot) continue;
    SlotCursors& cur = cursors_[slot];
    float* deltas = reinterpret_cast<float*>(section(slot, SlotLayout::ring_delta));
    for (int j = 0; j < W; ++j) {
      const int64_t token = int64_t(b) * W + j;
      const int phys = ring_index(cur, cur.committed + j, L);
      std::memcpy(section(slot, SlotLayout::ring_x) + phys * x_bytes,
                  static_cast<const uint8_t*>(batch.x) + token * x_bytes, x_bytes);
      std::memcpy(section(slot, SlotLayout::ring_B) + phys * b_bytes,
                  static_cast<const uint8_t*>(batch.B) + token * b_bytes, b_bytes);
      for (int h = 0; h < H; ++h)
        deltas[phys * H + h] =
            process_dt(batch.dt[token * H + h], params_.dt_bias[h], params_.dt_min, params_.dt_max);
    }
    apply_verify(cur, W);
  }

  // Phase 2, per (slot, group): the inner products B_k . C_j, shared by the group's heads.
  // bc[b][g][j][k] for k <= m = c + j (count = c + W <= L after the flush above).
  std::vector<float> bc(size_t(batch.batch) * G * W * L, 0.0f);
  const int64_t work = int64_t(batch.batch) * shape_.state_elements() * W;
#pragma omp parallel for collapse(2) schedule(static) if (work >= kParallelWork)
  for (int b = 0; b < batch.batch; ++b) {
    for (int g = 0; g < G; ++g) {
      const int slot = batch.slots[b];
      if (slot == kPaddingSlot) continue;
      const SlotCursors& cur = cursors_[slot];
      const int c = cur.committed, count = c + W;
      const void* ring_B = section(slot, SlotLayout::ring_B);
      std::vector<float> c_rows(static_cast<size_t>(W) * N), b_row(static_cast<size_t>(N));
      for (int j = 0; j < W; ++j)
        for (int n = 0; n < N; ++n)
          c_rows[size_t(j) * N + n] =
              load_act(batch.C, act, ((int64_t(b) * W + j) * G + g) * N + n);
      float* out = bc.data() + (size_t(b) * G + g) * W * L;
      for (int k = 0; k < count; ++k) {
        const int phys = ring_index(cur, k, L);
        for (int n = 0; n < N; ++n)
          b_row[n] = load_act(ring_B, act, (int64_t(phys) * G + g) * N + n);
        for (int j = std::max(0, k - c); j < W; ++j)
          out[size_t(j) * L + k] = cpu::dot(b_row.data(), c_rows.data() + size_t(j) * N, N);
      }
    }
  }

  // Phase 3, per (slot, head): y_j = exp(A L_m) (S0 C_j) + sum_{k<=m} delta_k exp(A (L_m - L_k))
  // (B_k . C_j) x_k + D x_j at logical position m = c + j (SPEC section 3). The checkpoint row
  // is decoded once and read for all W outputs.
  const bool bf16_readout = has_bf16_readout(config_.mode);
  const cpu::TableDecoder& dec = cpu::table_decoder();
#pragma omp parallel for collapse(2) schedule(static) if (work >= kParallelWork)
  for (int b = 0; b < batch.batch; ++b) {
    for (int h = 0; h < H; ++h) {
      const int slot = batch.slots[b];
      if (slot == kPaddingSlot) continue;
      const SlotCursors& cur = cursors_[slot];
      const int c = cur.committed, count = c + W, g = h / heads_per_group;
      const SlotCheckpoint ck = checkpoint(slot);
      const void* ring_x = section(slot, SlotLayout::ring_x);
      const float* deltas = ring_delta(slot);
      std::vector<float> sums(static_cast<size_t>(count)), readout_c(static_cast<size_t>(W) * N);
      std::vector<float> coef(static_cast<size_t>(W) * count, 0.0f),
          xs(static_cast<size_t>(count) * P);
      std::vector<float> values(static_cast<size_t>(N)), readout(static_cast<size_t>(W) * P);
      running_sums(slot, h, count, sums.data());
      for (int j = 0; j < W; ++j) {
        for (int n = 0; n < N; ++n) {
          const float cv = load_act(batch.C, act, ((int64_t(b) * W + j) * G + g) * N + n);
          readout_c[size_t(j) * N + n] = bf16_readout ? bf16_to_f32(f32_to_bf16(cv)) : cv;
        }
      }
      // coef[j][k] = delta_k exp(A (L_m - L_k)) (B_k . C_j), causal: k <= m.
      const float* bcg = bc.data() + (size_t(b) * G + g) * W * L;
      for (int k = 0; k < count; ++k) {
        const int phys = ring_index(cur, k, L);
        for (int p = 0; p < P; ++p)
          xs[size_t(k) * P + p] = load_act(ring_x, act, (int64_t(phys) * H + h) * P + p);
        for (int j = std::max(0, k - c); j < W; ++j)
          coef[size_t(j) * count + k] = deltas[phys * H + h] *
                                        decay(A_[h] * (sums[c + j] - sums[k])) *
                                        bcg[size_t(j) * L + k];
      }
      for (int p = 0; p < P; ++p) {
        const float scale = decode_read_row(config_.mode, ck, h * P + p, N, values.data(), dec);
        for (int j = 0; j < W; ++j)
          readout[size_t(j) * P + p] =
              scale * cpu::dot(values.data(), readout_c.data() + size_t(j) * N, N);
      }
      for (int j = 0; j < W; ++j) {
        const int m = c + j;
        const float decay_m = decay(A_[h] * sums[m]);
        for (int p = 0; p < P; ++p) {
          float y = decay_m * readout[size_t(j) * P + p];
          for (int k = 0; k <= m; ++k) y += coef[size_t(j) * count + k] * xs[size_t(k) * P + p];
          store_act(batch.y, batch.y_dtype, ((int64_t(b) * W + j) * H + h) * P + p,
                    y + params_.D[h] * xs[size_t(m) * P + p]);
        }
      }
    }
  }
}

void CpuBackend::commit(const int32_t* slots, const int32_t* accepted, int batch) {
  for (int b = 0; b < batch; ++b) {
    const int slot = slots[b];
    if (slot == kPaddingSlot) continue;
    check(commit_is_valid(cursors_[slot], accepted[b]), "commit: slot ", slot, " accepts ",
          accepted[b], " entries but has ", cursors_[slot].pending,
          " pending (must be 1..pending)");
  }
  for (int b = 0; b < batch; ++b) {
    if (slots[b] != kPaddingSlot) apply_commit(cursors_[slots[b]], accepted[b]);
  }
}

}  // namespace

std::unique_ptr<CacheBackend> make_cpu_backend(const SsmShape& shape, const LayerParams& params,
                                               const CacheConfig& config) {
  return std::make_unique<CpuBackend>(shape, params, config);
}

}  // namespace replayssm
