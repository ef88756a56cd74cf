// Internal: the tensor-core sparse MLA forward launchers (sparse_mla_tc.cu: two passes, wmma;
// sparse_mla_onepass.cu: one pass, mma.sync), called by sparse_mla_forward_device after
// argument checks.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsa::cuda::detail {

/// Dynamic shared memory of the tensor-core kernel for (d_qk, d_v), bytes.
size_t sparse_mla_tc_smem_bytes(int64_t d_qk, int64_t d_v);

/// Launches the tensor-core kernel (arguments as sparse_mla_forward_device, already checked).
void launch_sparse_mla_tc(int64_t blocks, cudaStream_t stream, const uint16_t* q,
                          const uint16_t* kv, const int32_t* indices, const int32_t* topk_length,
                          const float* attn_sink, int64_t h_q, int64_t d_qk, int64_t s_kv,
                          int64_t k, int64_t d_v, float sm_scale, uint16_t* out, float* lse,
                          float* max_logits);

/// Whether the one-pass kernel takes the shape: d_qk a multiple of 8 and at most 576, d_v at
/// most 512, q and kv 16-byte aligned (cp.async gathers whole 16-byte chunks of a row).
bool sparse_mla_onepass_takes(int64_t d_qk, int64_t d_v, const void* q, const void* kv);

/// Dynamic shared memory of the one-pass kernel for d_qk, bytes (231,424 at d_qk 576).
size_t sparse_mla_onepass_smem_bytes(int64_t d_qk);

/// Launches the one-pass kernel, one block per (query row, 64 heads) (arguments as
/// sparse_mla_forward_device, already checked, and sparse_mla_onepass_takes true).
void launch_sparse_mla_onepass(int64_t s_q, cudaStream_t stream, const uint16_t* q,
                               const uint16_t* kv, const int32_t* indices,
                               const int32_t* topk_length, const float* attn_sink, int64_t h_q,
                               int64_t d_qk, int64_t s_kv, int64_t k, int64_t d_v,
                               float sm_scale, uint16_t* out, float* lse, float* max_logits);

/// Whether the wgmma kernel (sparse_mla_wgmma.cu, built for sm_90a) takes the shape: d_qk a
/// multiple of 8 in (448, 576], d_v at most 512, q and kv 16-byte aligned, and the current
/// device of compute capability 9.0.
bool sparse_mla_wgmma_takes(int64_t d_qk, int64_t d_v, const void* q, const void* kv);

/// Launches the wgmma kernel, one block of two warpgroups per (query row, 64 heads)
/// (arguments as sparse_mla_forward_device, already checked, and sparse_mla_wgmma_takes true).
/// mode: 0 OnePassWgmma, 1 OnePassWgmmaSplitD, 2 OnePassWgmmaOwnHalfFirst; 10, 11, 12 are
/// benchmark-only timing variants of 0 with wrong results (no gather after the first tile, no
/// S products, no P V products; d_qk 513..576 only). Other values throw std::invalid_argument.
void launch_sparse_mla_wgmma(int64_t s_q, cudaStream_t stream, const uint16_t* q,
                             const uint16_t* kv, const int32_t* indices,
                             const int32_t* topk_length, const float* attn_sink, int64_t h_q,
                             int64_t d_qk, int64_t s_kv, int64_t k, int64_t d_v, float sm_scale,
                             uint16_t* out, float* lse, float* max_logits, int mode);

/// Benchmark-only variants of the fast Bf16 sparse MLA backward (sparse_mla_bwd.cu). Timing
/// only, results wrong: variant 1 leaves out the S = Q K^T and dP = dout V^T products, 2 the dq
/// product, 4 the dkv product and its stores, 8 the dkv stores (atomics). Same results as the
/// fast mode, which runs with both speed options: 16 with only the staggered dq / dkv products,
/// 32 with only the L2 cache policies (Q / dout evict-first, dkv reductions evict-last), 64
/// with neither. Arguments as
/// sparse_mla_backward_device with every slot of `indices` valid, no topk_length, no sink, no
/// scratch; other variants throw std::invalid_argument.
void sparse_mla_backward_timing_variant(int variant, const uint16_t* q, const uint16_t* kv,
                                        const int32_t* indices, const uint16_t* out,
                                        const float* lse, const uint16_t* dout, int64_t s_q,
                                        int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                                        int64_t d_v, float sm_scale, float* dq, float* dkv,
                                        cudaStream_t stream);

}  // namespace dsa::cuda::detail
