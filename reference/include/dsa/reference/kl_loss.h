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
/// Sparse mode without indices.
IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in,
                                Precision precision = Precision::Reference);

}  // namespace dsa::reference
