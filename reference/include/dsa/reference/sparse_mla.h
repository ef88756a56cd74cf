// Sparse MLA forward and backward, MQA/absorbed mode with one KV head (SPEC §4-§6).
#pragma once

#include <optional>

#include "dsa/contract/op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// Forward of SPEC §4 (sink scaling included). Shapes/dtypes: SparseMlaInputs (op_types.h).
/// Returns out [s_q,h_q,d_v], lse and max_logits [s_q,h_q] (natural log), all F64
/// (Reference) or F32 unrounded (Baseline); empty rows give out 0, lse +inf, max -inf (§6).
/// Throws std::invalid_argument naming the argument on bad shapes, dtypes, d_v, a non-finite
/// sm_scale, or a NaN attn_sink entry (±inf sinks are legal).
SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in,
                                    Precision precision = Precision::Reference);

/// Backward of SPEC §5 for upstream dout [s_q,h_q,d_v] (F32/F64/BF16/F16). Recomputes the
/// forward at the same precision; uses the given indices (never reselects). `out`: the
/// forward's (sink-scaled) out [s_q,h_q,d_v], any floating dtype, as a kernel's backward
/// receives it (e.g. bf16): Δ = out·dout is taken from it (SPEC §5, §9 baseline at the
/// candidate's precision); absent = Δ from this precision's own recomputed out. Returns dq
/// [s_q,h_q,d_qk], dkv [s_kv,d_qk] (summed over every query, head and duplicate slot) and
/// dsink [h_q] iff attn_sink is given; F64 or F32 (Baseline). Same errors as
/// sparse_mla_forward plus dout's and out's shape/dtype, non-finite values read (dout, out),
/// Σ_c|dout_c·v_c| past FLT_MAX, gradients past FLT_MAX, and a gradient element whose sum's
/// Σ|terms| (dq over the row's slots, dkv over every (row, head, slot) adding into the key,
/// dsink over the rows, dS's dout·v - Δ) exceeds FLT_MAX: an fp32 kernel's partial sums may
/// overflow where the float64 sum cancels (the inputs that form it named with the element, as
/// the result guard does; SPEC §5/§9).
SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout,
                                   Precision precision = Precision::Reference,
                                   const std::optional<Tensor>& out = std::nullopt);

}  // namespace dsa::reference
