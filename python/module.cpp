// Python bindings of the replay cache (one layer), for prototyping and testing from Python with
// numpy arrays on the CPU backend. The C++ API (include/replayssm/cache.h) is the reference; this
// file only converts arrays and names. Built as the module `replayssm` (build/python/) when
// pybind11 is found; docs/python.md.
//
// Arrays: slots int32 [B]; x float32 [B, T, H, P]; B, C float32 [B, T, G, N]; dt float32
// [B, T, H]; outputs float32 [B, T, H, P]. With activation="bf16" (the default, as in C++) the
// float32 inputs are rounded to bf16 here, as a model would hand them over.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/formats.h"
#include "replayssm/cache.h"
#include "replayssm/error.h"
#include "replayssm/version.h"

namespace py = pybind11;

namespace replayssm {
namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

std::vector<int64_t> shape_of(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

// Per-head parameters: float32 [H].
std::vector<float> vector_of(const F32Array& a, const char* name) {
  check(a.ndim() == 1, "replayssm: ", name, " must be one-dimensional, got ", a.ndim(),
        " dimensions");
  return std::vector<float>(a.data(), a.data() + a.size());
}

class PyCache {
 public:
  PyCache(std::vector<int> shape, const F32Array& A_log, const F32Array& dt_bias, const F32Array& D,
          const std::string& mode, int num_slots, int history, int max_window,
          const std::string& activation, uint64_t seed, int layer, const std::string& backend)
      : cache_(make(shape, A_log, dt_bias, D, mode, num_slots, history, max_window, activation,
                    seed, layer, backend)) {}

  int allocate(uint64_t request_id) { return cache_.allocate(request_id); }
  void open(int slot, uint64_t request_id) { cache_.open(slot, request_id); }
  void release(int slot) { cache_.release(slot); }
  void fork(int src, int dst, uint64_t request_id) { cache_.fork(src, dst, request_id); }
  bool is_open(int slot) const { return cache_.is_open(slot); }

  F32Array prefill(const I32Array& slots, const F32Array& x, const F32Array& B, const F32Array& C,
                   const F32Array& dt) {
    return run(true, slots, x, B, C, dt);
  }
  F32Array verify(const I32Array& slots, const F32Array& x, const F32Array& B, const F32Array& C,
                  const F32Array& dt) {
    return run(false, slots, x, B, C, dt);
  }
  void commit(const I32Array& slots, const I32Array& accepted) {
    cache_.commit(host_view(slots.data(), DType::i32, {slots.size()}),
                  TensorView{const_cast<int32_t*>(accepted.data()), DType::i32, shape_of(accepted),
                             MemoryKind::host});
  }
  void flush(const I32Array& slots) {
    cache_.flush(host_view(slots.data(), DType::i32, {slots.size()}));
  }

  F32Array state(int slot, int at) const {
    const SsmShape& s = cache_.shape();
    F32Array out({s.nheads, s.headdim, s.dstate});
    cache_.state(slot, at, out.mutable_data());
    return out;
  }
  py::bytes export_slot(int slot) const {
    const std::vector<uint8_t> bytes = cache_.export_slot(slot);
    return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void import_slot(int slot, const py::bytes& bytes) {
    const std::string data = bytes;
    cache_.import_slot(slot, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  void import_state(int slot, uint64_t request_id, const F32Array& state) {
    const SsmShape& s = cache_.shape();
    check(state.size() == s.state_elements(), "replayssm: import_state needs ", s.state_elements(),
          " values [H, P, N], got ", state.size());
    cache_.import_state(slot, request_id, state.data());
  }

  py::dict cursors(int slot) const {
    const SlotCursors c = cache_.cursors(slot);
    py::dict d;
    d["committed"] = c.committed;
    d["pending"] = c.pending;
    d["origin"] = c.origin;
    d["flush_index"] = c.flush_index;
    d["request_id"] = c.request_id;
    return d;
  }
  py::dict stats() const {
    const CacheStats s = cache_.stats();
    py::dict d;
    d["flushes"] = s.flushes;
    d["checkpoint_writes"] = s.checkpoint_writes;
    d["saturated"] = s.saturated;
    d["nonfinite"] = s.nonfinite;
    return d;
  }
  std::string repr() const {
    const SsmShape& s = cache_.shape();
    const CacheConfig& c = cache_.config();
    return "ReplayCache(shape=(" + std::to_string(s.nheads) + ", " + std::to_string(s.headdim) +
           ", " + std::to_string(s.dstate) + ", " + std::to_string(s.ngroups) + "), mode='" +
           mode_name(c.mode) + "', slots=" + std::to_string(c.num_slots) +
           ", history=" + std::to_string(c.history) + ")";
  }

 private:
  static ReplayCache make(const std::vector<int>& shape, const F32Array& A_log,
                          const F32Array& dt_bias, const F32Array& D, const std::string& mode,
                          int num_slots, int history, int max_window, const std::string& activation,
                          uint64_t seed, int layer, const std::string& backend) {
    check(shape.size() == 4, "replayssm: shape must be (heads, headdim, dstate, groups)");
    check(backend == "cpu", "replayssm (Python): backend '", backend,
          "' is not supported here; the bindings pass numpy arrays, so only 'cpu'");
    const SsmShape s{shape[0], shape[1], shape[2], shape[3]};
    LayerParams params;
    params.A_log = vector_of(A_log, "A_log");
    params.dt_bias = vector_of(dt_bias, "dt_bias");
    params.D = vector_of(D, "D");
    CacheConfig config;
    config.mode = parse_mode(mode);
    config.num_slots = num_slots;
    config.history = history;
    config.max_window = max_window;
    config.activation_dtype = parse_dtype(activation);
    check(config.activation_dtype == DType::f32 || config.activation_dtype == DType::bf16,
          "replayssm (Python): activation must be 'fp32' or 'bf16', got '", activation, "'");
    config.seed = seed;
    config.layer = layer;
    return ReplayCache(s, params, config, BackendKind::cpu);
  }

  // An input in the cache's activation dtype: the array itself (fp32), or a bf16 copy.
  TensorView activation(const F32Array& a, std::vector<uint16_t>& bf16) const {
    if (cache_.config().activation_dtype == DType::f32)
      return TensorView{const_cast<float*>(a.data()), DType::f32, shape_of(a), MemoryKind::host};
    bf16.resize(size_t(a.size()));
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(a.data()[i]);
    return TensorView{bf16.data(), DType::bf16, shape_of(a), MemoryKind::host};
  }

  F32Array run(bool prefill, const I32Array& slots, const F32Array& x, const F32Array& B,
               const F32Array& C, const F32Array& dt) {
    check(x.ndim() == 4, "replayssm: x must be [B, T, H, P], got ", x.ndim(), " dimensions");
    F32Array y({x.shape(0), x.shape(1), x.shape(2), x.shape(3)});
    std::vector<uint16_t> xb, Bb, Cb;
    const TensorView sv = host_view(slots.data(), DType::i32, {slots.size()});
    const TensorView dv{const_cast<float*>(dt.data()), DType::f32, shape_of(dt), MemoryKind::host};
    const TensorView yv{y.mutable_data(), DType::f32, shape_of(y), MemoryKind::host};
    const TensorView xv = activation(x, xb), Bv = activation(B, Bb), Cv = activation(C, Cb);
    py::gil_scoped_release unlocked;  // the cache's OpenMP threads do the work
    if (prefill)
      cache_.prefill(sv, xv, Bv, Cv, dv, yv);
    else
      cache_.verify(sv, xv, Bv, Cv, dv, yv);
    return y;
  }

  ReplayCache cache_;
};

}  // namespace
}  // namespace replayssm

PYBIND11_MODULE(replayssm, m) {
  using replayssm::PyCache;
  m.doc() = "replayssm: the replay cache of one Mamba-2 layer (CPU backend, numpy arrays)";
  m.attr("__version__") = replayssm::version();
  py::register_exception<replayssm::Error>(m, "Error", PyExc_ValueError);
  py::class_<PyCache>(m, "ReplayCache")
      .def(py::init<std::vector<int>, const replayssm::F32Array&, const replayssm::F32Array&,
                    const replayssm::F32Array&, const std::string&, int, int, int,
                    const std::string&, uint64_t, int, const std::string&>(),
           py::arg("shape"), py::arg("A_log"), py::arg("dt_bias"), py::arg("D"),
           py::arg("mode") = "fp32", py::arg("num_slots") = 1, py::arg("history") = 16,
           py::arg("max_window") = 8, py::arg("activation") = "bf16", py::arg("seed") = 0,
           py::arg("layer") = 0, py::arg("backend") = "cpu",
           "shape = (heads, headdim, dstate, groups); A_log, dt_bias, D: float32 [heads]")
      .def("allocate", &PyCache::allocate, py::arg("request_id"),
           "opens the lowest free slot and returns it")
      .def("open", &PyCache::open, py::arg("slot"), py::arg("request_id"))
      .def("release", &PyCache::release, py::arg("slot"))
      .def("fork", &PyCache::fork, py::arg("src"), py::arg("dst"), py::arg("request_id"))
      .def("is_open", &PyCache::is_open, py::arg("slot"))
      .def("prefill", &PyCache::prefill, py::arg("slots"), py::arg("x"), py::arg("B"), py::arg("C"),
           py::arg("dt"), "folds committed entries, runs the tokens; returns y")
      .def("verify", &PyCache::verify, py::arg("slots"), py::arg("x"), py::arg("B"), py::arg("C"),
           py::arg("dt"), "appends the window as pending entries; returns y of every position")
      .def("commit", &PyCache::commit, py::arg("slots"), py::arg("accepted"))
      .def("flush", &PyCache::flush, py::arg("slots"))
      .def("state", &PyCache::state, py::arg("slot"), py::arg("at") = -1,
           "the fp32 state [H, P, N] after the first `at` committed entries (-1: all)")
      .def("export_slot", &PyCache::export_slot, py::arg("slot"))
      .def("import_slot", &PyCache::import_slot, py::arg("slot"), py::arg("data"))
      .def("import_state", &PyCache::import_state, py::arg("slot"), py::arg("request_id"),
           py::arg("state"))
      .def("cursors", &PyCache::cursors, py::arg("slot"))
      .def("stats", &PyCache::stats)
      .def("__repr__", &PyCache::repr);
}
