// Composite ATen kernels of the `dsa` operator library (registered in ops.cpp). Public
// documentation of each op: dsa/optimized/<op>.h. Each kernel runs on CPU and CUDA tensors.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace dsa::optimized::kernels {

at::Tensor indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                          const c10::optional<at::Tensor>& ks, const c10::optional<at::Tensor>& ke);

std::tuple<at::Tensor, at::Tensor, at::Tensor> indexer_scores_backward(
    const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
    const at::Tensor& d_scores, const c10::optional<at::Tensor>& ks,
    const c10::optional<at::Tensor>& ke);

at::Tensor topk_indices(const at::Tensor& scores, int64_t k, const c10::optional<at::Tensor>& ks,
                        const c10::optional<at::Tensor>& ke, c10::string_view tie_break,
                        bool sorted);

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const c10::optional<at::Tensor>& topk_length,
    const c10::optional<at::Tensor>& attn_sink);

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_bwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, double sm_scale, int64_t d_v,
    const c10::optional<at::Tensor>& topk_length, const c10::optional<at::Tensor>& attn_sink);

std::tuple<at::Tensor, at::Tensor> indexer_kl_loss(
    const at::Tensor& scores, const at::Tensor& q, const at::Tensor& kv, double sm_scale,
    const c10::optional<at::Tensor>& ks, const c10::optional<at::Tensor>& ke,
    c10::string_view mode, const c10::optional<at::Tensor>& indices, double coeff);

}  // namespace dsa::optimized::kernels
