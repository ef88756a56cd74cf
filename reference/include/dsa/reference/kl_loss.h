// Indexer KL loss, the indexer's training objective (SPEC §7).
#pragma once

#include <optional>

#include "dsa/contract/op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// loss = coeff · mean over rows with |S_t|>0 of KL(p_t || softmax_S(I_t)); teacher p =
/// Σ_h softmax_S(P[t,h,·]) L1-normalised, detached; 0·ln 0 = 0; d_scores zero outside S_t.
/// A key whose score is -inf is not in S_t: a row of all -inf scores is empty (excluded
/// from the mean, d_scores 0), never NaN; partly -inf rows renormalise over the rest.
/// Outputs loss [1] and d_scores [s_q,s_kv], F64 or F32 (Baseline). SPEC §7.
/// Throws std::invalid_argument naming the argument on bad shapes, dtypes, windows, or a
/// Sparse mode without indices; and on values no fp32 kernel can compute (SPEC §6: no valid
/// input produces NaN): a +inf, NaN or |v| > FLT_MAX score on a key of a row's window (dense)
/// or selected ids (sparse), finite scores of one row spanning more than FLT_MAX, a non-finite
/// q row of a row with keys or kv row of some S_t, max(1,|sm_scale|)·Σ_d|q_d kv_d| > FLT_MAX,
/// sm_scale or coeff beyond FLT_MAX. Scores, q and kv the loss never reads may hold anything.
IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in,
                                Precision precision = Precision::Reference);

}  // namespace dsa::reference
