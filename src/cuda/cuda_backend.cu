// CacheBackend on the GPU: slot storage and cursors in device memory, every operation a short
// fixed sequence of launches on the backend's stream (src/cuda/replay_kernels.cuh).
#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/replay_launch.h"
#include "cuda/slot_kernels.cuh"

namespace replayssm {

namespace cuda {

HeadParams make_head_params(const SsmShape& shape, const LayerParams& params) {
  check(shape.nheads <= kMaxHeads, "cuda backend: nheads ", shape.nheads, " exceeds ", kMaxHeads);
  HeadParams head{};
  for (int h = 0; h < shape.nheads; ++h) {
    head.A[h] = -std::exp(params.A_log[h]);
    head.dt_bias[h] = params.dt_bias[h];
    head.D[h] = params.D[h];
  }
  head.dt_min = params.dt_min;
  head.dt_max = params.dt_max;
  return head;
}

}  // namespace cuda

namespace {

using cuda::DeviceError;
using cuda::DeviceStats;
using cuda::ReplayParams;

template <typename T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  RSSM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  RSSM_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T, DeviceFree>;

const char* error_text(int32_t code) {
  switch (code) {
    case cuda::kErrSlotClosed:
      return "operation on a slot that is not open";
    case cuda::kErrNonFiniteInput:
      return "NaN or Inf in the inputs (x, B, C or dt); the slot was left unchanged";
    case cuda::kErrCommitRange:
      return "commit count outside 1..pending; the slot was left unchanged";
    case cuda::kErrPending:
      return "the slot has uncommitted entries from its last verify; commit them first (the slot "
             "was left unchanged)";
    default:
      return "unknown device error";
  }
}

class CudaBackend final : public CacheBackend {
 public:
  CudaBackend(const SsmShape& shape, const LayerParams& params, const CacheConfig& config)
      : shape_(shape), config_(config) {
    shape.validate();
    params.validate(shape);
    config.validate(shape);
    const int N = shape.dstate;
    check(N == 64 || N == 128 || N == 256, "cuda backend: dstate ", N,
          " is not supported (64, 128 or 256)");
    check(shape.headdim % 8 == 0, "cuda backend: headdim ", shape.headdim,
          " must be a multiple of 8");
    check(!has_bf16_readout(config.mode) || shape.headdim % 16 == 0, "cuda backend: headdim ",
          shape.headdim, " must be a multiple of 16 in mode ", mode_name(config.mode),
          " (the readout runs on 16-row tensor-core tiles)");
    check(config.max_window <= cuda::kMaxWindow, "cuda backend: max_window ", config.max_window,
          " exceeds ", cuda::kMaxWindow);
    check(config.history <= cuda::kMaxHistory, "cuda backend: history ", config.history,
          " exceeds ", cuda::kMaxHistory);
    int devices = 0;
    check(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0,
          "cuda backend: no CUDA device is available");
    layout_ = SlotLayout::make(shape, config);
    // A blocking stream: work the caller enqueues on the legacy default stream (input uploads,
    // cudaMemset, ...) is ordered with the backend's launches.
    RSSM_CUDA_CHECK(cudaStreamCreate(&stream_));
    storage_.reset(device_alloc<uint8_t>(layout_.total * size_t(config.num_slots)));
    cursors_.reset(device_alloc<SlotCursors>(config.num_slots));
    error_.reset(device_alloc<DeviceError>(1));
    stats_.reset(device_alloc<DeviceStats>(1));
    dense_.reset(device_alloc<float>(size_t(shape.state_elements())));
    ensure_status(2 * config.num_slots + 64);
    RSSM_CUDA_CHECK(cudaDeviceSynchronize());  // the zero fills of device_alloc are done

    base_ = ReplayParams{};
    base_.geo.storage = storage_.get();
    base_.geo.slot_bytes = layout_.total;
    for (int s = 0; s < SlotLayout::kSections; ++s) base_.geo.offset[s] = layout_.offset[s];
    base_.geo.N = N;
    base_.cursors = cursors_.get();
    base_.error = error_.get();
    base_.stats = stats_.get();
    base_.H = shape.nheads;
    base_.P = shape.headdim;
    base_.N = N;
    base_.G = shape.ngroups;
    base_.L = config.history;
    base_.lanes_per_row = N / 8;
    base_.by_heads = FastDiv::make(uint32_t(shape.nheads));
    base_.by_group_heads = FastDiv::make(uint32_t(shape.nheads / shape.ngroups));
    // The kernels index a slot's checkpoint elements in 32 bits (load_raw8, encode8).
    check(int64_t(shape.nheads) * shape.headdim * N < (int64_t(1) << 31),
          "cuda backend: ", shape.nheads, " x ", shape.headdim, " x ", N,
          " state elements per slot exceed 2^31");
    base_.act_f16 = config.activation_dtype == DType::f16;
    base_.key = philox_key(config.seed, config.layer);
    base_.keys10 = philox_keys10(base_.key);
    base_.sr_bits = config.sr_bits;
    base_.philox_rounds = config.philox_rounds;
    base_.head = cuda::make_head_params(shape, params);
    smem_fold_ = cuda::FoldSmem::bytes(config.history, N, shape.headdim);
    verify_stage_bytes_ =
        cuda::VerifyStage::make(config.mode, int(dtype_size(config.activation_dtype)),
                                shape.headdim, N, config.history)
            .bytes;
    const int group_heads = shape.nheads / shape.ngroups;
    smem_verify_ = 0;
    for (int windows : {1, 4, 8})
      smem_verify_ =
          std::max(smem_verify_, cuda::StepSmem::bytes(config.history, N, windows, group_heads,
                                                       has_bf16_readout(config.mode)) +
                                     cuda::verify_stages(windows) * verify_stage_bytes_);
    if (cuda::verify_direct_ok(config.mode, shape.headdim, N))
      for (int windows : {1, cuda::kDirectMaxWindow, 8})
        smem_verify_ = std::max(
            smem_verify_, std::min(cuda::verify_direct_smem_any(config.history, N, shape.headdim,
                                                                group_heads, windows),
                                   cuda::kDirectMaxSmem));  // larger blocks keep the staged readout
    // verify_kernel: each of the N/8 lanes of a row owns history / (N/8) ring entries
    entries_per_lane_ = (config.history + N / 8 - 1) / (N / 8);
    check(entries_per_lane_ <= 2, "cuda backend: history ", config.history, " with dstate ", N,
          " is not supported (at most ", 2 * (N / 8), ")");
    int device = 0, smem_limit = 0;
    RSSM_CUDA_CHECK(cudaGetDevice(&device));
    RSSM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
    int sm_shared = 0, reserved = 0;
    RSSM_CUDA_CHECK(
        cudaDeviceGetAttribute(&sm_shared, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    RSSM_CUDA_CHECK(
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
    step_need_device_ = {size_t(sm_shared), size_t(reserved)};
    RSSM_CUDA_CHECK(
        cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    // small_step_kernel copies its head's ring x.
    const size_t smem_step = cuda::RingXStage::end(config.history, shape.headdim,
                                                   int(dtype_size(config.activation_dtype)));
    // The tensor-core fold of the flush (flush_head_mma) stages its B fragments beside the fold's.
    const bool fold_mma = cuda::flush_fold_mma_ok(
        config.mode, int(dtype_size(config.activation_dtype)),
        config.activation_dtype == DType::f16, config.sr_bits <= kSrByteMaxBits && N % 16 == 0,
        shape.headdim, N, config.history);
    const size_t smem_fold_mma =
        fold_mma ? cuda::flush_fold_mma_smem(config.history, N, shape.headdim) : 0;
    const size_t smem = std::max({smem_fold_, smem_fold_mma, smem_verify_, smem_step});
    check(smem <= size_t(smem_limit), "cuda backend: history ", config.history, ", dstate ", N,
          ", headdim ", shape.headdim, " and ", shape.nheads, " heads need ", smem,
          " bytes of shared memory per block; this device allows ", smem_limit);
    ensure_flush_list(config.num_slots);
    const cuda::LaunchConfig lc = launch_config();
    cuda::with_mode(config.mode, [&]<Mode kMode>() {
      cuda::ModeLaunchers<kMode>::prepare(lc, config.history, N, shape.headdim, group_heads);
    });
    // The slot kernels, shared by the modes.
    cuda::load_kernel(cuda::commit_kernel);
    cuda::load_kernel(cuda::validate_slots_kernel);
    cuda::load_kernel(cuda::flush_finalize_kernel);
    cuda::load_kernel(cuda::prefill_finalize_kernel);
    cuda::load_kernel(cuda::set_cursors_kernel);
    cuda::load_kernel(cuda::fork_cursors_kernel);
    cuda::with_act(lc,
                   [&]<typename ActT>() { cuda::load_kernel(cuda::validate_tokens_kernel<ActT>); });
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }

  // Waits for the stream and throws the first device-side error recorded since the last check.
  void synchronize() const {
    RSSM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DeviceError err{};
    RSSM_CUDA_CHECK(cudaMemcpy(&err, error_.get(), sizeof(err), cudaMemcpyDeviceToHost));
    if (err.code == cuda::kErrNone) return;
    RSSM_CUDA_CHECK(cudaMemset(error_.get(), 0, sizeof(DeviceError)));
    std::string detail;
    if (err.code == cuda::kErrCommitRange) detail = ", accepted " + std::to_string(err.value);
    if (err.code == cuda::kErrPending) detail = ", pending " + std::to_string(err.value);
    fail("cuda backend: ", error_text(err.code), " (slot ", err.slot, detail, "; ", err.count,
         " device-side error(s) since the last synchronising call)");
  }

  void open(int slot, uint64_t request_id) override {
    check_slot(slot);
    RSSM_CUDA_CHECK(cudaMemsetAsync(slot_ptr(slot), 0, layout_.total, stream_));
    cuda::set_cursors_kernel<<<1, 1, 0, stream_>>>(cursors_.get(), slot, fresh_cursors(request_id));
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void release(int slot) override {
    check_slot(slot);
    cuda::set_cursors_kernel<<<1, 1, 0, stream_>>>(cursors_.get(), slot, SlotCursors{});
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void fork(int src, int dst, uint64_t dst_request_id) override {
    check_slot(src);
    check_slot(dst);
    RSSM_CUDA_CHECK(cudaMemcpyAsync(slot_ptr(dst), slot_ptr(src), layout_.total,
                                    cudaMemcpyDeviceToDevice, stream_));
    cuda::fork_cursors_kernel<<<1, 1, 0, stream_>>>(cursors_.get(), src, dst, dst_request_id);
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  SlotCursors cursors(int slot) const override {
    check_slot(slot);
    synchronize();
    SlotCursors c;
    RSSM_CUDA_CHECK(cudaMemcpy(&c, cursors_.get() + slot, sizeof(c), cudaMemcpyDeviceToHost));
    return c;
  }

  void prefill(const TokenBatch& batch) override {
    check(batch.tokens >= 1, "cuda backend: prefill needs at least one token, got ", batch.tokens);
    if (batch.batch == 0) return;
    ReplayParams p = token_params(batch);
    const cuda::LaunchConfig lc = launch_config();
    cuda::with_act(lc, [&]<typename ActT>() {
      cuda::validate_tokens_kernel<ActT>
          <<<dim3(p.batch, cuda::kValidateSplit), 256, 0, stream_>>>(p);
    });
    cuda::with_mode(config_.mode,
                    [&]<Mode kMode>() { cuda::ModeLaunchers<kMode>::prefill(p, lc); });
    cuda::prefill_finalize_kernel<<<(p.batch + 127) / 128, 128, 0, stream_>>>(p);
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void verify(const TokenBatch& batch) override { launch_verify(batch, false); }

  // The verify kernel's block that advances an entry's cursors commits the token too:
  // three launches per step (validate, flush, verify; no commit kernel), one at small batches.
  void decode(const TokenBatch& batch) override {
    check(batch.tokens == 1, "cuda backend: decode takes one token, got ", batch.tokens);
    launch_verify(batch, true);
  }

  void launch_verify(const TokenBatch& batch, bool commit_window) {
    check(batch.tokens >= 1 && batch.tokens <= config_.max_window, "cuda backend: window ",
          batch.tokens, " outside 1..max_window (", config_.max_window, ")");
    if (batch.batch == 0) return;
    check(batch.batch <= kMaxVerifyBatch, "cuda backend: a verify of ", batch.batch,
          " entries exceeds ", kMaxVerifyBatch, " (the verify grid's third dimension)");
    ReplayParams p = token_params(batch);
    p.commit_window = commit_window;
    p.list_flushes = true;
    p.heads_per_block = cuda::verify_heads_per_block(p.batch, p.H, p.G, p.tokens, sm_count_,
                                                     cuda::has_direct_readout(config_.mode));
    const bool one_launch = cuda::verify_in_one_launch(p, config_.mode, sm_count_);
    // small_verify_kernel folds the entries that flush itself: nothing to list for flush_kernel.
    const bool small_window = cuda::verify_small_window(p, sm_count_, config_.mode);
    p.small_window = small_window;
    if (small_window) p.list_flushes = false;
    // verify_kernel's blocks take their entries in the order validate_tokens gives them, or in
    // entry order (verify_order_pays).
    if (!one_launch && !small_window) {
      p.verify_order = verify_order_.get();
      p.verify_in_place = !cuda::verify_order_pays(p.batch, p.tokens);
    }
    const cuda::LaunchConfig lc = launch_config();
    if (!one_launch)
      cuda::with_act(lc, [&]<typename ActT>() {
        const dim3 grid(p.batch, cuda::kValidateSplit);
        if (small_window)  // its launch overlaps the kernel before it (slot_kernels.cuh)
          cuda::launch_dependent(cuda::validate_tokens_kernel<ActT>, grid, dim3(256), 0, stream_,
                                 p);
        else
          cuda::validate_tokens_kernel<ActT><<<grid, 256, 0, stream_>>>(p);
      });
    cuda::with_mode(config_.mode, [&]<Mode kMode>() {
      // Flush and verify are launched dependent on the kernel before them (cuda_common.cuh).
      // Small batches are a chain of short kernels whose launch latency shows (H200: about 1 us
      // of the 15-16 us of a batch-1 step). At every batch the flush lets the verify start at
      // once, and only the verify blocks of flushing entries wait for it (verify_kernel): with
      // the slots' flush phases spread, as in service, the few flushing entries' items and the
      // other entries' readout share the GPU (H200, session 12, spread, batch 64: separate-nvfp4
      // W = 1 87.4 -> 81.2 us, W = 8 234.0 -> 227.9, separate-fp8 W = 8 185.7 -> 181.0, batch
      // 256 W = 1 203.4 -> 197.5; separate-fp8 W = 1 batch 64 60.5 -> 61.5).
      cuda::LaunchConfig chained = lc;
      chained.dependent = true;
      if (!one_launch && !small_window) {
        // Both in one shared-memory configuration (cuda::step_carveout), planned once per
        // (batch, window): the kernels chosen depend on nothing else of a step.
        auto [known, fresh] = step_carveouts_.try_emplace({p.batch, p.tokens}, -1);
        if (fresh && cuda::step_carveout_pays(kMode, p.tokens)) {
          cuda::SmemNeed need = step_need_device_;
          cuda::LaunchConfig plan = chained;
          plan.plan = &need;
          cuda::ModeLaunchers<kMode>::flush(p, plan);
          cuda::ModeLaunchers<kMode>::verify(p, plan);
          known->second = cuda::step_carveout(need);
        }
        chained.smem_carveout = known->second;
        cuda::ModeLaunchers<kMode>::flush(p, chained);
      }
      cuda::ModeLaunchers<kMode>::verify(p, chained);  // ends with the ring B append, cursors
    });
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void commit(const int32_t* slots, const int32_t* accepted, int batch) override {
    if (batch == 0) return;
    slots = device_ints(slots, batch, staged_slots_);
    accepted = device_ints(accepted, batch, staged_accepted_);
    cuda::launch_dependent(cuda::commit_kernel, dim3((batch + 127) / 128), dim3(128), 0, stream_,
                           cursors_.get(), slots, accepted, batch, error_.get());
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void flush(const int32_t* slots, int batch) override {
    if (batch == 0) return;
    ensure_status(batch);
    ensure_flush_list(batch);
    ReplayParams p = base_;
    p.slots = device_ints(slots, batch, staged_slots_);
    p.batch = batch;
    p.tokens = 0;
    p.status = status_.get();
    cuda::validate_slots_kernel<<<(batch + 127) / 128, 128, 0, stream_>>>(p);
    const cuda::LaunchConfig lc = launch_config();
    cuda::with_mode(config_.mode, [&]<Mode kMode>() { cuda::ModeLaunchers<kMode>::flush(p, lc); });
    cuda::flush_finalize_kernel<<<(batch + 127) / 128, 128, 0, stream_>>>(p);
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  void state(int slot, int at, float* out) const override {
    const SlotCursors c = cursors(slot);
    check(c.live, "cuda backend: state of slot ", slot, " which is not open");
    if (at < 0) at = c.committed;
    check(at <= c.committed, "cuda backend: state at ", at, " beyond the ", c.committed,
          " committed entries of slot ", slot);
    ReplayParams p = base_;
    p.dense = dense_.get();
    p.at = at;
    run_dense(p, slot, false);
    RSSM_CUDA_CHECK(cudaMemcpyAsync(out, dense_.get(), shape_.state_elements() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }

  SlotImage read_slot(int slot) const override {
    SlotImage image;
    image.cursors = cursors(slot);
    image.bytes.resize(layout_.total);
    RSSM_CUDA_CHECK(
        cudaMemcpy(image.bytes.data(), slot_ptr(slot), layout_.total, cudaMemcpyDeviceToHost));
    return image;
  }

  void write_slot(int slot, const SlotImage& image) override {
    check_slot(slot);
    check(image.bytes.size() == layout_.total, "cuda backend: slot image of ", image.bytes.size(),
          " bytes, expected ", layout_.total);
    synchronize();
    RSSM_CUDA_CHECK(
        cudaMemcpy(slot_ptr(slot), image.bytes.data(), layout_.total, cudaMemcpyHostToDevice));
    RSSM_CUDA_CHECK(cudaMemcpy(cursors_.get() + slot, &image.cursors, sizeof(SlotCursors),
                               cudaMemcpyHostToDevice));
  }

  void import_state(int slot, uint64_t request_id, const float* state) override {
    check_slot(slot);
    synchronize();
    RSSM_CUDA_CHECK(cudaMemcpy(dense_.get(), state, shape_.state_elements() * sizeof(float),
                               cudaMemcpyHostToDevice));
    open(slot, request_id);
    ReplayParams p = base_;
    p.dense = dense_.get();
    run_dense(p, slot, true);
    SlotCursors c = fresh_cursors(request_id);
    c.flush_index = 1;  // one checkpoint write (flush index 0) happened
    cuda::set_cursors_kernel<<<1, 1, 0, stream_>>>(cursors_.get(), slot, c);
    RSSM_CUDA_CHECK(cudaGetLastError());
    writes_by_import_ += 1;
    synchronize();
  }

  CacheStats stats() const override {
    synchronize();
    DeviceStats d{};
    RSSM_CUDA_CHECK(cudaMemcpy(&d, stats_.get(), sizeof(d), cudaMemcpyDeviceToHost));
    CacheStats s;
    s.flushes = d.flushes;
    s.saturated = d.saturated;
    s.checkpoint_writes = d.checkpoint_writes + writes_by_import_;
    s.nonfinite = d.nonfinite;
    return s;
  }

 private:
  void check_slot(int slot) const {
    check(slot >= 0 && slot < config_.num_slots, "cuda backend: slot ", slot, " outside 0..",
          config_.num_slots - 1);
  }
  uint8_t* slot_ptr(int slot) const { return storage_.get() + size_t(slot) * layout_.total; }

  void ensure_status(int batch) {
    if (batch <= status_capacity_) return;
    if (status_) RSSM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // not while capturing
    status_.reset(device_alloc<int32_t>(size_t(batch) * cuda::kValidateSplit));
    status_capacity_ = batch;
  }

  // The list of flushing entries for `batch` entries. Sized for num_slots at construction, so a
  // captured step of at most num_slots entries never reallocates.
  void ensure_flush_list(int batch) {
    if (batch <= flush_list_capacity_) return;
    if (flush_list_) RSSM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // not while capturing
    flush_list_.reset(device_alloc<int32_t>(size_t(batch) + 1));       // zeroed
    flush_entries_.reset(device_alloc<cuda::ValidatedEntry>(size_t(batch)));
    verify_order_.reset(device_alloc<cuda::ValidatedEntry>(size_t(batch)));
    order_words_.reset(device_alloc<uint32_t>(size_t(batch) + 1));  // zeroed
    flush_list_capacity_ = batch;
    base_.flush_count = flush_list_.get();
    base_.arrivals = flush_list_.get() + 1;
    base_.flush_list = flush_entries_.get();
    base_.order_counts = order_words_.get();
    base_.validate_arrivals = order_words_.get() + 1;
  }

  struct Staging {
    DevicePtr<int32_t> buffer;
    int capacity = 0;
  };

  // Slot lists and accepted counts may be in host memory (the facade allows it): they are copied
  // to a staging buffer in stream order. Device arrays (the graph-capturable path) pass through.
  const int32_t* device_ints(const int32_t* values, int count, Staging& staging) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, values) == cudaSuccess &&
        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged))
      return values;
    (void)cudaGetLastError();
    if (count > staging.capacity) {
      RSSM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      staging.buffer.reset(device_alloc<int32_t>(size_t(count)));
      staging.capacity = count;
    }
    RSSM_CUDA_CHECK(cudaMemcpyAsync(staging.buffer.get(), values, size_t(count) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
    return staging.buffer.get();
  }

  ReplayParams token_params(const TokenBatch& batch) {
    check(batch.y_dtype == DType::f32 || batch.y_dtype == config_.activation_dtype,
          "cuda backend: y dtype ", dtype_name(batch.y_dtype), " must be f32 or the activation",
          " dtype");
    ensure_status(batch.batch);
    ensure_flush_list(batch.batch);
    ReplayParams p = base_;
    p.slots = device_ints(batch.slots, batch.batch, staged_slots_);
    p.batch = batch.batch;
    p.tokens = batch.tokens;
    p.x = batch.x;
    p.B = batch.B;
    p.C = batch.C;
    p.dt = batch.dt;
    p.y = batch.y;
    p.y_dtype = batch.y_dtype;
    p.status = status_.get();
    return p;
  }

  cuda::LaunchConfig launch_config() const {
    return cuda::LaunchConfig{
        stream_,    sm_count_,           entries_per_lane_, config_.activation_dtype == DType::f32,
        smem_fold_, verify_stage_bytes_, flush_grid_};
  }

  void run_dense(ReplayParams& p, int slot, bool encode) const {
    cuda::with_mode(config_.mode, [&]<Mode kMode>() {
      cuda::ModeLaunchers<kMode>::dense(p, launch_config(), slot, encode);
    });
    RSSM_CUDA_CHECK(cudaGetLastError());
  }

  SsmShape shape_;
  CacheConfig config_;
  SlotLayout layout_;
  cudaStream_t stream_ = nullptr;
  static constexpr int kMaxVerifyBatch = 65535;  // the verify grid's z dimension
  DevicePtr<uint8_t> storage_;
  DevicePtr<SlotCursors> cursors_;
  DevicePtr<DeviceError> error_;
  DevicePtr<DeviceStats> stats_;
  DevicePtr<float> dense_;
  DevicePtr<int32_t> status_;
  int status_capacity_ = 0;
  Staging staged_slots_, staged_accepted_;
  uint64_t writes_by_import_ = 0;
  ReplayParams base_;
  size_t smem_fold_ = 0;           // kernels that fold (flush, prefill, dense)
  size_t smem_verify_ = 0;         // verify_kernel, the most over the windows
  size_t verify_stage_bytes_ = 0;  // its checkpoint staging
  // [1 + batch]: the flush count and the arrival counters of verify_kernel; and the listed
  // flushing entries [batch]
  DevicePtr<int32_t> flush_list_;
  DevicePtr<cuda::ValidatedEntry> flush_entries_;
  DevicePtr<cuda::ValidatedEntry> verify_order_;  // [batch] every entry, in verify_kernel's order
  DevicePtr<uint32_t> order_words_;               // [1 + batch] order_counts, validate_arrivals
  int flush_list_capacity_ = 0;
  int sm_count_ = 1;
  cuda::SmemNeed step_need_device_;  // the device's figures a step's plan starts from
  std::map<std::pair<int, int>, int> step_carveouts_;  // (batch, window) -> step_carveout
  // Blocks of flush_kernel resident on the device at once, per shape (replay_launch.cuh).
  mutable int flush_grid_[2] = {0, 0};
  int entries_per_lane_ = 1;  // ring entries per lane of a row in verify_kernel
};

}  // namespace

std::unique_ptr<CacheBackend> make_cuda_backend(const SsmShape& shape, const LayerParams& params,
                                                const CacheConfig& config) {
  return std::make_unique<CudaBackend>(shape, params, config);
}

bool cuda_device_available() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

cudaStream_t cuda_backend_stream(CacheBackend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  check(cuda != nullptr, "cuda_backend_stream: not a CUDA backend");
  return cuda->stream();
}

void cuda_backend_synchronize(CacheBackend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  check(cuda != nullptr, "cuda_backend_synchronize: not a CUDA backend");
  cuda->synchronize();
}

}  // namespace replayssm
