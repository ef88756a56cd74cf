// Internal: the tensor-core sparse MLA forward launcher (sparse_mla_tc.cu), called by
// sparse_mla_forward_device after argument checks.
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

}  // namespace dsa::cuda::detail
