// The CUDA dispatch of the `dsa` operator library (optimized/cuda/src/torch_ops.cpp):
// TORCH_LIBRARY_IMPL(dsa, CUDA) registers the hand-written kernels, so torch.ops.dsa.* /
// the dispatcher run them on CUDA tensors: dsa::topk_indices (cluster top-k, SPEC §3),
// dsa::indexer_scores / dsa::indexer_scores_backward (tensor-core indexer, SPEC §2),
// dsa::sparse_mla_fwd (one-pass wgmma forward, §4) and dsa::sparse_mla_bwd (deterministic
// tensor-core backward, §5; also behind the autograd function of dsa/optimized/autograd.h).
// Built as libdsa_torch_ops.so (torch.ops.load_library from Python; link it from C++).
#pragma once

namespace dsa::cuda {

/// Always true; referencing it makes a C++ program link (and so load) the registration.
bool torch_ops_registered();

}  // namespace dsa::cuda
