// Registration of the built-in backends with the oracle's registry.
#include "dsa/backends/builtin.h"

#include <mutex>

#include "dsa/oracle/reference_backend.h"
#ifdef DSA_BACKENDS_WITH_TORCH
#include "libtorch_backend.h"
#endif
#ifdef DSA_BACKENDS_WITH_CUDA
#include "dsa/cuda/backend.h"
#endif

namespace dsa::backends {

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    oracle::register_reference_backend();
#ifdef DSA_BACKENDS_WITH_TORCH
    oracle::register_backend("libtorch-cpu", [] { return make_libtorch_backend(false); });
    oracle::register_backend("libtorch-cuda", [] { return make_libtorch_backend(true); });
    oracle::register_backend("libtorch-composite",
                             [] { return make_libtorch_backend(true, true); });
#endif
#ifdef DSA_BACKENDS_WITH_CUDA
    cuda::register_cuda_backend();
#endif
  });
}

}  // namespace dsa::backends
