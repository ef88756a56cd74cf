// Internal: the one-read cluster top-k kernels (topk_cluster.cu), SPEC §3.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsa::cuda::detail {

/// True when topk_cluster_launch takes (s_q, s_kv, k, sorted): a row slice of at most
/// s_kv/8 keys and, for sorted, a next_pow2(min(k, s_kv)) composite sort buffer fit in one
/// CTA's shared memory (s_kv up to 245760 keys: 15 16-byte chunks a thread; sorted k up to 16384).
bool topk_cluster_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted);

/// Top-k per row (SPEC §3) with the contract of select_topk_device; asynchronous on stream.
/// sorted with k <= 2048 and !fused_sort: the unsorted selection, then a second kernel sorts
/// each row's prefix (one CTA a row); otherwise CTA 0 of each cluster sorts (fused_sort, the
/// round-2 path). Throws std::invalid_argument when !topk_cluster_supported,
/// std::runtime_error on a CUDA launch failure.
void topk_cluster_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream, bool fused_sort = false);

/// True when topk_persist_launch takes (s_q, s_kv, k, sorted, wide): s_kv <= 131072 (a slice
/// of at most 16384 keys a CTA, 8192 when wide, kept in registers; 8 CTAs a row at most, 16
/// when wide) and, sorted, k <= 2048.
bool topk_persist_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted, bool wide);

/// Top-k per row (SPEC §3), contract of select_topk_device, with a persistent grid of as
/// many clusters as fit (wide: half-length slices over up to 16 CTAs a row, 2 CTAs an SM) (capped by DSA_CUDA_TOPK_MAX_CLUSTERS when set): each cluster runs
/// several rows and copies the next row's slice while it selects the current one; sorted
/// adds the per-row sort kernel. Throws std::invalid_argument when !topk_persist_supported,
/// std::runtime_error on a CUDA failure (or when no cluster fits on the device).
void topk_persist_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream, bool wide);

}  // namespace dsa::cuda::detail
