// Python bindings of the replay cache (one layer). The C++ API (include/replayssm/cache.h) is the
// reference; this file only converts arrays and names. Built as the module `replayssm`
// (build/python/) when pybind11 is found; docs/python.md.
//
// Arrays: slots int32 [B]; x [B, T, H, P]; B, C [B, T, G, N]; dt float32 [B, T, H]; y float32
// [B, T, H, P]. numpy arrays are converted as needed (float32 inputs are rounded to bf16 here when
// the cache's activation dtype is bf16, as a model would hand them over); any other array with
// __dlpack__ (torch, cupy, jax) is passed without a copy and must be C-contiguous and already of
// the cache's activation dtype.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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

// The DLPack ABI (dmlc/dlpack, version 0.8: the legacy "dltensor" capsule of __dlpack__()).
struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA, 3 CUDA host (pinned)
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// One array argument: its view and whatever keeps its memory alive during the call.
struct Tensor {
  py::object keep;                // the capsule or the (converted) numpy array
  std::vector<uint16_t> rounded;  // the bf16 copy of a float32 numpy input
  TensorView view;
};

// An array with __dlpack__ that is not a numpy array: viewed in place (no copy).
Tensor from_dlpack(const py::handle obj, const char* name) {
  Tensor t;
  t.keep = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(t.keep.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    fail("replayssm: ", name, ": __dlpack__ did not return a 'dltensor' capsule");
  }
  const DLTensor& d = managed->dl_tensor;
  const DLDataType dt = d.dtype;
  check(dt.lanes == 1, "replayssm: ", name, ": vector dtypes are not supported");
  DType dtype;
  if (dt.code == 2 && dt.bits == 32)
    dtype = DType::f32;
  else if (dt.code == 2 && dt.bits == 16)
    dtype = DType::f16;
  else if (dt.code == 4 && dt.bits == 16)
    dtype = DType::bf16;
  else if (dt.code == 0 && dt.bits == 32)
    dtype = DType::i32;
  else
    fail("replayssm: ", name, ": dtype code ", int(dt.code), " bits ", int(dt.bits),
         " is not float32, float16, bfloat16 or int32");
  check(d.device.device_type == 1 || d.device.device_type == 2 || d.device.device_type == 3,
        "replayssm: ", name, ": device type ", d.device.device_type, " is not CPU or CUDA");
  std::vector<int64_t> shape(d.shape, d.shape + d.ndim);
  if (d.strides != nullptr) {
    int64_t expected = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      check(shape[size_t(i)] == 1 || d.strides[i] == expected, "replayssm: ", name,
            " must be C-contiguous (call .contiguous() first)");
      expected *= shape[size_t(i)];
    }
  }
  t.view = TensorView{static_cast<uint8_t*>(d.data) + d.byte_offset, dtype, std::move(shape),
                      d.device.device_type == 2 ? MemoryKind::cuda : MemoryKind::host};
  return t;
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

  py::object prefill(py::handle slots, py::handle x, py::handle B, py::handle C, py::handle dt,
                     py::handle y) {
    return run(Op::prefill, slots, x, B, C, dt, y);
  }
  py::object verify(py::handle slots, py::handle x, py::handle B, py::handle C, py::handle dt,
                    py::handle y) {
    return run(Op::verify, slots, x, B, C, dt, y);
  }
  py::object decode(py::handle slots, py::handle x, py::handle B, py::handle C, py::handle dt,
                    py::handle y) {
    return run(Op::decode, slots, x, B, C, dt, y);
  }
  void commit(py::handle slots, py::handle accepted) {
    const Tensor s = int_arg(slots, "slots"), a = int_arg(accepted, "accepted");
    py::gil_scoped_release unlocked;
    cache_.commit(s.view, a.view);
  }
  void flush(py::handle slots) {
    const Tensor s = int_arg(slots, "slots");
    py::gil_scoped_release unlocked;
    cache_.flush(s.view);
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
    const BackendKind kind = parse_backend(backend);
    check(backend_available(kind), "replayssm (Python): backend '", backend,
          "' is not available (not built with CUDA, or no GPU present)");
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
    return ReplayCache(s, params, config, kind);
  }

  static bool dlpack_only(py::handle obj) {
    return !py::isinstance<py::array>(obj) && py::hasattr(obj, "__dlpack__");
  }
  // slots, accepted: int32 [B].
  static Tensor int_arg(py::handle obj, const char* name) {
    if (dlpack_only(obj)) return from_dlpack(obj, name);
    Tensor t;
    const I32Array a = I32Array::ensure(obj);
    check(bool(a), "replayssm: ", name, " is not an array of integers");
    t.keep = a;
    t.view = TensorView{const_cast<int32_t*>(a.data()), DType::i32, shape_of(a), MemoryKind::host};
    return t;
  }
  // dt: float32; x, B, C (round = true): in the cache's activation dtype, a bf16 copy of float32
  // numpy values when that is bf16.
  Tensor float_arg(py::handle obj, const char* name, bool round) const {
    if (dlpack_only(obj)) return from_dlpack(obj, name);
    Tensor t;
    const F32Array a = F32Array::ensure(obj);
    check(bool(a), "replayssm: ", name, " is not an array of numbers");
    t.keep = a;
    if (round && cache_.config().activation_dtype == DType::bf16) {
      t.rounded.resize(size_t(a.size()));
      for (size_t i = 0; i < t.rounded.size(); ++i) t.rounded[i] = f32_to_bf16(a.data()[i]);
      t.view = TensorView{t.rounded.data(), DType::bf16, shape_of(a), MemoryKind::host};
    } else {
      t.view = TensorView{const_cast<float*>(a.data()), DType::f32, shape_of(a), MemoryKind::host};
    }
    return t;
  }

  enum class Op { prefill, verify, decode };

  // y: written into the given array (float32, C-contiguous, writable), or a new numpy array.
  py::object run(Op op, py::handle slots, py::handle x, py::handle B, py::handle C, py::handle dt,
                 py::handle y) {
    const Tensor ts = int_arg(slots, "slots"), tx = float_arg(x, "x", true),
                 tB = float_arg(B, "B", true), tC = float_arg(C, "C", true),
                 tdt = float_arg(dt, "dt", false);
    Tensor ty;
    py::object result;
    if (y.is_none()) {
      check(tx.view.memory == MemoryKind::host,
            "replayssm: x is in CUDA memory; pass y= (a CUDA float32 array) for the outputs");
      const size_t rank = tx.view.shape.size();
      check(rank == 4 || (op == Op::decode && rank == 3), "replayssm: x must be [B, T, H, P]",
            op == Op::decode ? " or [B, H, P]" : "", ", got ", tx.view.describe());
      F32Array out(tx.view.shape);
      ty.view = TensorView{out.mutable_data(), DType::f32, tx.view.shape, MemoryKind::host};
      result = out;
    } else if (dlpack_only(y)) {
      ty = from_dlpack(y, "y");
      result = py::reinterpret_borrow<py::object>(y);
    } else {
      const py::array a = py::reinterpret_borrow<py::array>(y);
      check(
          a.dtype().is(py::dtype::of<float>()) && (a.flags() & py::array::c_style) && a.writeable(),
          "replayssm: y must be a writable C-contiguous float32 array");
      ty.view = TensorView{const_cast<void*>(a.data()), DType::f32, shape_of(a), MemoryKind::host};
      result = py::reinterpret_borrow<py::object>(y);
    }
    py::gil_scoped_release unlocked;  // the cache's threads (or the GPU) do the work
    if (op == Op::prefill)
      cache_.prefill(ts.view, tx.view, tB.view, tC.view, tdt.view, ty.view);
    else if (op == Op::verify)
      cache_.verify(ts.view, tx.view, tB.view, tC.view, tdt.view, ty.view);
    else
      cache_.decode(ts.view, tx.view, tB.view, tC.view, tdt.view, ty.view);
    return result;
  }

  ReplayCache cache_;
};

}  // namespace
}  // namespace replayssm

PYBIND11_MODULE(replayssm, m) {
  using replayssm::PyCache;
  m.doc() =
      "replayssm: the replay cache of one Mamba-2 layer (CPU or CUDA backend; numpy or DLPack "
      "arrays)";
  m.attr("__version__") = replayssm::version();
  m.attr("build_commit") = replayssm::build_commit();  // as `replayssm --version` prints it
  py::register_exception<replayssm::Error>(m, "Error", PyExc_ValueError);
  m.def(
      "backend_available",
      [](const std::string& backend) {
        return replayssm::backend_available(replayssm::parse_backend(backend));
      },
      py::arg("backend"),
      "Whether a backend ('cpu' or 'cuda') can be used here: cuda needs a CUDA build and a GPU");
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
           py::arg("dt"), py::arg("y") = py::none(),
           "folds committed entries, runs the tokens; returns y (written into y= if given)")
      .def("verify", &PyCache::verify, py::arg("slots"), py::arg("x"), py::arg("B"), py::arg("C"),
           py::arg("dt"), py::arg("y") = py::none(),
           "appends the window as pending entries; returns y of every position")
      .def("decode", &PyCache::decode, py::arg("slots"), py::arg("x"), py::arg("B"), py::arg("C"),
           py::arg("dt"), py::arg("y") = py::none(),
           "verify of one token and commit of it; x [B, H, P] or [B, 1, H, P]; returns y "
           "(the CUDA backend does both in one pass)")
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
