// Internal: the one-read cluster top-k kernel (topk_cluster.cu), SPEC §3.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsa::cuda::detail {

/// True when topk_cluster_launch takes (s_q, s_kv, k, sorted): a row slice of at most
/// s_kv/8 keys and, for sorted, a next_pow2(min(k, s_kv)) composite sort buffer fit in one
/// CTA's shared memory (s_kv up to 245760 keys: 15 16-byte chunks a thread; sorted k up to 16384).
bool topk_cluster_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted);

/// Top-k per row (SPEC §3) with the contract of select_topk_device; asynchronous on stream.
/// Throws std::invalid_argument when !topk_cluster_supported, std::runtime_error on a CUDA
/// launch failure.
void topk_cluster_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream);

}  // namespace dsa::cuda::detail
