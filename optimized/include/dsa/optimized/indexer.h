// Indexer scores and their backward as `dsa` operators (SPEC §2), composite ATen, CPU/CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace dsa::optimized {

/// I[t,s] = Σ_j w[t,j]·ReLU(q_idx[t,j,:]·k_idx[s,:]) inside [ks[t], ke[t]), -inf outside. SPEC §2.
/// q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I]: bf16/f16/f32/f64; w [s_q,H_I] f32/f64 (may be
/// negative); ks/ke [s_q] int32/int64, both or neither (neither: every key), clamped to
/// [0, s_kv]. Returns [s_q,s_kv] f32 (f64 when an input is f64), fp32 accumulation.
/// Throws c10::Error naming the argument and the expected shape/dtype/device.
/// Calls the dispatcher op `dsa::indexer_scores`.
at::Tensor indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                          const c10::optional<at::Tensor>& ks = c10::nullopt,
                          const c10::optional<at::Tensor>& ke = c10::nullopt);

/// Gradients (dq_idx in q_idx's dtype, dk_idx in k_idx's dtype, dw in w's dtype) for
/// upstream d_scores [s_q,s_kv] f32/f64; entries outside the windows are ignored (NaN too);
/// ReLU'(0) = 0. SPEC §2. Same errors as indexer_scores plus d_scores'.
/// Calls the dispatcher op `dsa::indexer_scores_backward`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> indexer_scores_backward(
    const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
    const at::Tensor& d_scores, const c10::optional<at::Tensor>& ks = c10::nullopt,
    const c10::optional<at::Tensor>& ke = c10::nullopt);

/// The ATen composite kernels of dsa::indexer_scores / dsa::indexer_scores_backward called
/// directly, never a registered device kernel: the auditing baseline (backend
/// `libtorch-composite`). Same arguments, results and errors as above.
at::Tensor indexer_scores_composite(const at::Tensor& q_idx, const at::Tensor& k_idx,
                                    const at::Tensor& w,
                                    const c10::optional<at::Tensor>& ks = c10::nullopt,
                                    const c10::optional<at::Tensor>& ke = c10::nullopt);
std::tuple<at::Tensor, at::Tensor, at::Tensor> indexer_scores_backward_composite(
    const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
    const at::Tensor& d_scores, const c10::optional<at::Tensor>& ks = c10::nullopt,
    const c10::optional<at::Tensor>& ke = c10::nullopt);

}  // namespace dsa::optimized
