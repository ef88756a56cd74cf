// Internal: factory of the libtorch backends (registered by builtin.cpp).
#pragma once

#include <memory>

#include "dsa/oracle/backend.h"

namespace dsa::backends {

/// `libtorch-cuda` when cuda (unavailable_reason "no CUDA device" without one), else
/// `libtorch-cpu`. Every op of SPEC §2-§7 through the `dsa` operator library.
std::unique_ptr<oracle::Backend> make_libtorch_backend(bool cuda);

}  // namespace dsa::backends
