// FP8 indexer scores (SPEC §10, DeepGEMM fp8_mqa_logits semantics): dequantize, then the §2
// reference (dsa::reference::indexer_scores). No second indexer implementation.
#pragma once

#include "dsa/contract/fp8_op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// I[t,s] = Σ_j w[t,j]·ReLU(k_scale[s]·(q_idx[t,j,:]·k_idx[s,:])) inside the windows, -inf
/// outside. Shapes/dtypes: Fp8IndexerInputs (contract/fp8_op_types.h); w F32/F64.
/// Reference: exact decoded values (k·k_scale is exact in float64; ReLU(s·x) = s·ReLU(x) for
/// s > 0), float64 sums. Baseline (§9 for FP8): exact fp8 products, fp32 accumulation of
/// Σ_j w·ReLU(q·k), then one fp32 multiply by k_scale[s]. Returns [s_q,s_kv] F64 or F32.
/// Throws std::invalid_argument naming the argument on bad shapes/dtypes/windows, or
/// 'k_scale' when a key inside some window has a scale that is not positive finite (keys no
/// window reads may hold anything).
Tensor fp8_indexer_scores(const Fp8IndexerInputs& in, Precision precision = Precision::Reference);

}  // namespace dsa::reference
