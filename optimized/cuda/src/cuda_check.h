// Internal: CUDA error checking for the kernels' host side.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

namespace dsa::cuda::detail {

/// Throws std::runtime_error("<where>: <call> failed: <CUDA error string>") when err != success.
inline void check_cuda(cudaError_t err, const char* where, const char* call) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(where) + ": " + call + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace dsa::cuda::detail

#define DSA_CUDA_CHECK(where, call) ::dsa::cuda::detail::check_cuda((call), (where), #call)
