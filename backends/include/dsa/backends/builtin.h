// Registers the built-in backends with the oracle's registry: `reference` always,
// `libtorch-cpu`, `libtorch-cuda` and `libtorch-composite` (CUDA, the indexer and top-k ATen
// composites called directly) when built with LibTorch, `cuda` when built with CUDA.
#pragma once

namespace dsa::backends {

/// Idempotent; call before dsa::oracle::make_backend / backend_names.
void register_builtin_backends();

}  // namespace dsa::backends
