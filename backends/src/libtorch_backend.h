// Internal: factory of the libtorch backends (registered by builtin.cpp).
#pragma once

#include <memory>

#include "dsa/oracle/backend.h"

namespace dsa::backends {

/// `libtorch-cuda` when cuda (unavailable_reason "no CUDA device" without one), else
/// `libtorch-cpu`. Every op of SPEC §2-§7 through the `dsa` operator library's dispatcher (a
/// registered CUDA kernel runs when its library is loaded, e.g. libdsa_torch_ops).
/// composite (with cuda): `libtorch-composite`, the same on CUDA but the indexer and top-k ops
/// call their ATen composite kernels directly (the auditing baseline of the CUDA kernels).
std::unique_ptr<oracle::Backend> make_libtorch_backend(bool cuda, bool composite = false);

}  // namespace dsa::backends
