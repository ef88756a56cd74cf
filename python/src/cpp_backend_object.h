// The other direction of py_backend.h: a C++ dsa::oracle::Backend (a built-in backend, a
// mutant) offered to Python as an object whose calls take and return DLPack capsules, so
// the Python route can audit the project's own backends and be compared with the CLI.
#pragma once

#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "dsa/oracle/backend.h"

namespace dsa::python {

/// Binds class `CppBackend` in `m`: name, deterministic, unavailable_reason(), supports(op),
/// call(op, tensors, scalars) -> {output name: capsule}. `tensors`: SPEC argument names ->
/// capsule of a host contiguous tensor or None; `scalars`: k, tie_break, sorted, sm_scale,
/// d_v, mode, coeff as the op needs (dsa_verify._builtin.BuiltinBackend passes them).
/// oracle::NotSupported becomes NotImplementedError; std::invalid_argument ValueError.
void bind_cpp_backend(pybind11::module_& m);

/// The wrapper bound by bind_cpp_backend.
struct CppBackend {
  std::shared_ptr<oracle::Backend> backend;
};

}  // namespace dsa::python
