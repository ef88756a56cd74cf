// Indexer scores and their backward (SPEC §2). Dense, float64 (or fp32 baseline), Eigen.
#pragma once

#include "dsa/contract/op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// I[t,s] = Σ_j w[t,j]·ReLU(q_idx[t,j,:]·k_idx[s,:]) inside windows, -inf outside. SPEC §2.
/// q_idx [s_q,H_I,d_I] and k_idx [s_kv,d_I]: BF16/F16/F32/F64; w [s_q,H_I] F32/F64;
/// windows: s_q rows over s_kv keys. Returns [s_q,s_kv] F64 (Reference) or F32 (Baseline).
/// Throws std::invalid_argument naming the argument on any shape/dtype/window mismatch, and on
/// values no fp32 kernel can compute (SPEC §6, §2): a non-finite or |v| > FLT_MAX element of a
/// q_idx/w row with a nonempty window or of a k_idx row inside a window (rows never read may
/// hold anything), Σ_d|q_idx·k_idx| > FLT_MAX, or Σ_j|w|·ReLU(q_idx·k_idx) > FLT_MAX (a score
/// an fp32 kernel can only return as +inf: 'w' named with the row, key and limit).
Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                      const KeyWindows& windows, Precision precision = Precision::Reference);

/// Gradients of indexer_scores for upstream d_scores [s_q,s_kv] (F32/F64; entries outside
/// the windows are ignored). ReLU'(0) = 0. SPEC §2.
/// Same arguments and errors as indexer_scores (but the score sum) plus `d_scores`: non-finite
/// or |v| > FLT_MAX inside a window, gradients past FLT_MAX, or a gradient element whose sum's
/// Σ|terms| (dw, dq_idx, dk_idx over the window keys and rows) exceeds FLT_MAX (an fp32 partial
/// sum may overflow where the float64 sum cancels; 'd_scores, w, q_idx, k_idx' named with the
/// element), are
/// std::invalid_argument. Outputs F64 or F32 (Baseline).
IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                     const KeyWindows& windows, const Tensor& d_scores,
                                     Precision precision = Precision::Reference);

}  // namespace dsa::reference
