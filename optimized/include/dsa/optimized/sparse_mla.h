// Sparse MLA forward and backward as `dsa` operators (SPEC §4-§6), composite ATen, CPU/CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace dsa::optimized {

/// (out [s_q,h_q,d_v] in q's dtype, lse [s_q,h_q] natural log, max_logits [s_q,h_q]); lse and
/// max_logits f32 (f64 when q or kv is f64). Slot j of row t is valid iff 0 <= id < s_kv and
/// j < topk_length[t]; invalid slots anywhere are masked before the gather (kv never read
/// through them). Sink scales out by exp(lse)/(exp(lse)+exp(sink)); ±inf sinks allowed.
/// Empty rows: out 0, lse +inf, max_logits -inf. SPEC §4, §6.
/// q [s_q,h_q,d_qk], kv [s_kv,d_qk] bf16/f16/f32/f64; indices [s_q,k] or [s_q,1,k] int32;
/// sm_scale finite; 0 < d_v <= d_qk; topk_length [s_q] int32; attn_sink [h_q] f32/f64.
/// Throws c10::Error naming the argument. Calls the dispatcher op `dsa::sparse_mla_fwd`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const c10::optional<at::Tensor>& topk_length = c10::nullopt,
    const c10::optional<at::Tensor>& attn_sink = c10::nullopt);

/// (dq [s_q,h_q,d_qk] in q's dtype, dkv [s_kv,d_qk] f32 (f64 for f64 inputs) accumulated with index_add over every
/// query, head and duplicate id, dsink [h_q] at dkv's dtype — a [0] tensor when no sink). Uses the given
/// indices; never reselects. `out` and `lse` are shape-checked only: the weights are
/// recomputed as a normalised softmax over the valid slots and the sink, and Δ = out·dout as
/// Σ_j p_j·(dout·v_j), at fp32 (no bf16 rounding of out; equal logits keep exactly equal
/// weights, so exact cancellations stay exact). Empty rows: dq 0, no dkv/dsink
/// contribution. SPEC §5-§6. out/dout [s_q,h_q,d_v], lse [s_q,h_q] f32/f64; other arguments
/// as sparse_mla_fwd. Throws c10::Error naming the argument. Op `dsa::sparse_mla_bwd`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_bwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, double sm_scale, int64_t d_v,
    const c10::optional<at::Tensor>& topk_length = c10::nullopt,
    const c10::optional<at::Tensor>& attn_sink = c10::nullopt);

}  // namespace dsa::optimized
