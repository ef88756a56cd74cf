#include "dlpack_capsule.h"

#include <stdexcept>
#include <vector>

#include <dlpack/dlpack.h>

#include "dsa/plugin/dlpack_tensor.h"

namespace py = pybind11;

namespace dsa::python {
namespace {

// Owns what a DLManagedTensor points at; freed by its deleter (the consumer calls it).
struct Owned {
  std::shared_ptr<Tensor> tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_owned(DLManagedTensor* m) { delete static_cast<Owned*>(m->manager_ctx); }

// A capsule nobody consumed still owns its tensor (DLPack: the name stays "dltensor").
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

}  // namespace

py::capsule to_capsule(std::shared_ptr<Tensor> t) {
  auto* o = new Owned;
  o->tensor = std::move(t);
  o->shape = o->tensor->shape();
  o->strides.assign(o->shape.size(), 1);
  for (int d = static_cast<int>(o->shape.size()) - 2; d >= 0; --d)
    o->strides[static_cast<size_t>(d)] = o->strides[static_cast<size_t>(d) + 1] * o->shape[static_cast<size_t>(d) + 1];
  DLTensor& d = o->managed.dl_tensor;
  d.data = o->tensor->raw();
  d.device = DLDevice{kDLCPU, 0};
  d.ndim = static_cast<int32_t>(o->shape.size());
  d.dtype = plugin::to_dl_dtype(o->tensor->dtype());
  d.shape = o->shape.data();
  d.strides = o->strides.data();
  d.byte_offset = 0;
  o->managed.manager_ctx = o;
  o->managed.deleter = delete_owned;
  PyObject* cap = PyCapsule_New(&o->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete o;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

Tensor from_capsule(py::handle capsule, const std::string& what) {
  if (!PyCapsule_CheckExact(capsule.ptr()))
    throw std::runtime_error(what + ": expected a DLPack capsule, got " +
                             std::string(py::str(py::type::of(capsule).attr("__name__"))));
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw std::runtime_error(what + ": the DLPack capsule was already consumed");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  const DLTensor& t = m->dl_tensor;
  auto release = [&] {
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    if (m->deleter) m->deleter(m);
  };
  try {
    if (t.device.device_type != kDLCPU)
      throw std::runtime_error("is on device type " + std::to_string(static_cast<int>(t.device.device_type)) +
                               ", expected host memory (the module moves device outputs with .cpu())");
    if (!plugin::from_dl_dtype(t.dtype))
      throw std::runtime_error("has dtype " + plugin::dl_dtype_name(t.dtype) +
                               ", expected float64/float32/float16/bfloat16/int64/int32/uint8");
    // An empty tensor has no layout (torch reports strides such as [1, 1] for [n, 0]).
    DLTensor view = t;
    int64_t numel = 1;
    for (int32_t d = 0; d < t.ndim; ++d) numel *= t.shape[d];
    if (numel == 0) view.strides = nullptr;
    Tensor out = plugin::tensor_from_dl(view, what.c_str(), "tensor");
    release();
    return out;
  } catch (const std::exception& e) {
    release();
    const std::string msg = e.what();
    throw std::runtime_error(msg.rfind(what, 0) == 0 ? msg : what + " " + msg);
  }
}

}  // namespace dsa::python
