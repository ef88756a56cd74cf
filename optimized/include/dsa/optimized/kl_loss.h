// Indexer KL loss as the `dsa::indexer_kl_loss` operator (SPEC §7), composite ATen, CPU/CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace dsa::optimized {

/// (loss [1], d_scores [s_q,s_kv]) at f32 (f64 when an input is f64). Per row t over S_t
/// (mode "dense": window keys; "sparse": distinct valid ids of indices[t] inside the window;
/// never a key whose score is -inf, so an all -inf row is empty: no NaN, d_scores 0):
/// teacher p = Σ_h softmax_S(sm_scale·q[t,h]·kv) L1-normalised (detached); student
/// log softmax_S(scores[t]); loss = coeff·mean over rows with |S_t|>0 of KL(p‖q), 0·ln0 = 0;
/// d_scores = coeff/n_rows·(softmax_S(scores) - p), 0 outside S_t. SPEC §7.
/// scores [s_q,s_kv] f32/f64; q [s_q,h_q,d_qk], kv [s_kv,d_qk] bf16/f16/f32/f64; ks/ke [s_q]
/// or absent; indices [s_q,k] or [s_q,1,k] int32 (required for "sparse"). Throws c10::Error naming the
/// argument. Calls the dispatcher op `dsa::indexer_kl_loss`.
std::tuple<at::Tensor, at::Tensor> indexer_kl_loss(
    const at::Tensor& scores, const at::Tensor& q, const at::Tensor& kv, double sm_scale,
    const c10::optional<at::Tensor>& ks = c10::nullopt,
    const c10::optional<at::Tensor>& ke = c10::nullopt, c10::string_view mode = "dense",
    const c10::optional<at::Tensor>& indices = c10::nullopt, double coeff = 1.0);

}  // namespace dsa::optimized
