// A one-op library for python.runtime (test_runtime.py): linked the way the GPU machine's
// toolchain links by default (libstdc++ and libgcc static) plus dsa_shared_cxx_runtime, as
// libdsa_torch_ops.so is. dsa_runtime_probe::reject(x) returns x when x[0] > 0, else raises a
// TORCH_CHECK whose message formats the double x[0]: with a second, partly interposed
// libstdc++ in the library that message lost its text (here) or crashed (H200).
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {
at::Tensor reject(const at::Tensor& x) {
  const double v = x.reshape({-1}).index({0}).item<double>();
  TORCH_CHECK(v > 0, "dsa_runtime_probe::reject: argument 'x' got x[0] = ", v,
              ", expected a positive scale");
  return x;
}
}  // namespace

TORCH_LIBRARY(dsa_runtime_probe, m) { m.def("reject(Tensor x) -> Tensor", &reject); }
