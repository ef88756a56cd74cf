// Differentiable wrappers (torch::autograd::Function) around the `dsa` operators: forward
// calls the forward op, backward the backward op with what forward saved (SPEC §2, §4-§5, §7).
// Indices are never differentiable and the backward never reselects.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>

namespace dsa::optimized::autograd {

/// indexer_scores (dsa/optimized/indexer.h) differentiable in q_idx, k_idx, w; backward runs
/// dsa::indexer_scores_backward. Saves the inputs only. ks/ke may be undefined (no windows).
at::Tensor indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                          const at::Tensor& ks, const at::Tensor& ke);

/// sparse_mla_fwd (dsa/optimized/sparse_mla.h) returning (out, lse, max_logits): out is
/// differentiable in q, kv and attn_sink (dkv and dsink cast to their dtypes); lse and
/// max_logits are not differentiable. Backward runs dsa::sparse_mla_bwd with the saved
/// indices, out and lse. topk_length / attn_sink may be undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const at::Tensor& topk_length, const at::Tensor& attn_sink);

/// indexer_kl_loss (dsa/optimized/kl_loss.h) returning loss [1], differentiable in `scores`
/// only (the teacher built from q, kv is detached, SPEC §7). Saves d_scores [s_q,s_kv].
/// `mode` "dense" | "sparse"; indices may be undefined in dense mode.
at::Tensor indexer_kl_loss(const at::Tensor& scores, const at::Tensor& q, const at::Tensor& kv,
                           double sm_scale, const at::Tensor& ks, const at::Tensor& ke,
                           const std::string& mode, const at::Tensor& indices, double coeff);

}  // namespace dsa::optimized::autograd
