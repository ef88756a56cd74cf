// dsa_verify._backends: the project's registered backends (reference, libtorch-cpu,
// libtorch-cuda, cuda) as CppBackend objects, so they can be audited through the Python route
// and compared with `dsa-verify audit --backend NAME`. A separate module because it links
// LibTorch (the same shared libtorch as the torch package: Debian's, or PyTorch's own on the
// GPU machine), which dsa_verify._core never does.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cpp_backend_object.h"
#include "dsa/backends/builtin.h"

namespace py = pybind11;

PYBIND11_MODULE(_backends, m) {
  using namespace dsa::python;
  dsa::backends::register_builtin_backends();
  bind_cpp_backend(m);
  m.def("names", &dsa::oracle::backend_names, "Registered backend names");
  m.def("make", [](const std::string& name) {
    return CppBackend{std::shared_ptr<dsa::oracle::Backend>(dsa::oracle::make_backend(name))};
  }, py::arg("name"), "The registered backend `name` (ValueError naming the known names otherwise)");
}
