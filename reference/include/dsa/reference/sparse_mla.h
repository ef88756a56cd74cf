// Sparse MLA forward and backward, MQA/absorbed mode with one KV head (SPEC §4-§6).
#pragma once

#include <optional>

#include "dsa/contract/op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// Forward of SPEC §4 (sink scaling included). Throws std::invalid_argument naming the
/// argument on bad shapes, dtypes, d_v, or a non-finite sm_scale.
SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in,
                                    Precision precision = Precision::Reference);

/// Backward of SPEC §5 for upstream dout [s_q,h_q,d_v] (F32/F64/BF16/F16). Recomputes the
/// forward at the same precision; uses the given indices (never reselects). Same errors as
/// sparse_mla_forward plus dout's shape/dtype.
SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout,
                                   Precision precision = Precision::Reference);

}  // namespace dsa::reference
