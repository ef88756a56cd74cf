// The SPEC §10 inference ops as `dsa` operators (composite ATen, CPU/CUDA): the FP8 indexer,
// the paged FP8 indexer and sparse MLA over FlashMLA's 656-byte FP8 KV cache. FP8 tensors are
// uint8 bytes (decoded exactly through a 256-entry table: no float8 dtype is required).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace dsa::optimized {

/// I[t,s] = Σ_j w[t,j]·ReLU(k_scale[s]·(q_idx[t,j,:]·k_idx[s,:])) inside [ks, ke), -inf
/// outside (SPEC §10). q_idx [s_q,H_I,d_I] and k_idx [s_kv,d_I] uint8 fp8 bytes in
/// `fp8_format` ("e4m3fn" or "e5m2"); k_scale [s_kv] f32; w [s_q,H_I] f32/f64; ks/ke as in
/// indexer_scores. Exact fp8 products, fp32 accumulation, then the positive scale. Keys no
/// window reads are never used (NaN bytes, invalid scales allowed there). Returns [s_q,s_kv]
/// f32 (f64 with an f64 w). Throws c10::Error naming the argument; a read scale that is not
/// positive finite ('k_scale') is a c10::ValueError (Python ValueError). Calls the dispatcher op `dsa::fp8_indexer_scores`.
at::Tensor fp8_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx,
                              const at::Tensor& k_scale, const at::Tensor& w,
                              const c10::optional<at::Tensor>& ks = c10::nullopt,
                              const c10::optional<at::Tensor>& ke = c10::nullopt,
                              c10::string_view fp8_format = "e4m3fn");

/// Paged FP8 indexer (SPEC §10): q_idx [batch,next_n,H_I,d_I] uint8; k_cache
/// [num_blocks,block_size,d_I] uint8; k_scale_cache [num_blocks,block_size] f32; w
/// [batch·next_n,H_I] f32; block_table [batch,max_blocks] int32; context_lens [batch] int32;
/// max_context (-1: the largest context). Returns [batch·next_n, max_context] f32: row
/// b·next_n+i holds keys [0, L_b-next_n+i+1), -inf elsewhere. Only keys p < L_b are read.
/// Throws c10::ValueError (Python ValueError) naming 'block_table' (a read entry outside
/// [0, num_blocks)), 'context_lens' (negative or > max_blocks·block_size), 'max_context',
/// 'k_scale_cache' (a read scale not positive finite); c10::Error for shapes and dtypes.
/// Calls the dispatcher op `dsa::paged_indexer_scores`.
at::Tensor paged_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_cache,
                                const at::Tensor& k_scale_cache, const at::Tensor& w,
                                const at::Tensor& block_table, const at::Tensor& context_lens,
                                int64_t max_context = -1, c10::string_view fp8_format = "e4m3fn");

/// Sparse MLA forward over the FP8 KV cache (SPEC §10, §4-§6): q [s_q,h_q,576] bf16/f16/f32;
/// kv_cache uint8 [..., 656] (tokens = numel/656; ids address token rows); indices [s_q,k] or
/// [s_q,1,k] int32; topk_length, attn_sink as in sparse_mla_fwd. Tokens valid slots read are
/// dequantized (fp8·tile scale, bf16 RoPE) to q's dtype, then dsa::sparse_mla_fwd with d_v 512.
/// Returns (out [s_q,h_q,512] q's dtype, lse, max_logits [s_q,h_q] f32). Throws
/// c10::ValueError (Python ValueError) naming 'kv_cache' for a read token whose scale is not
/// positive finite; c10::Error for shapes and dtypes.
/// Calls the dispatcher op `dsa::sparse_mla_fp8_fwd`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fp8_fwd(
    const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& indices, double sm_scale,
    const c10::optional<at::Tensor>& topk_length = c10::nullopt,
    const c10::optional<at::Tensor>& attn_sink = c10::nullopt);

}  // namespace dsa::optimized
