// A correct FlashAttention-style sparse MLA kernel (the FlashMLA / FlashAttention-2/3 /
// TileLang scheme) written for the false-alarm tests: the control_flash_style backend
// (mutants.cpp, FalseAlarms) and the "computed another way" kernels of the oracle's detection
// property (oracle/tests/detection_test.cpp). Not a backend; no speed.
#pragma once

#include <vector>

#include "dsa/contract/op_types.h"

namespace dsa::props {

/// Order of every fp32 sum over slots or columns: a running sum in slot order, reversed, or
/// blocks of 4 summed first, then the block sums in order.
enum class SumOrder { Slot, Reversed, Blocked };

/// The fp32 sum of `terms` in `order` (empty: 0).
float sum_ordered(const std::vector<float>& terms, SumOrder order);

/// Which roundings the kernel makes and the dtypes it returns.
struct FlashStyleOptions {
  SumOrder order = SumOrder::Slot;
  /// dkv adds a row's slots in reverse slot order (else in slot order).
  bool dkv_reverse_slots = false;
  /// The 16-bit dtype P and dS are rounded to (BF16 or F16; F32: never rounded).
  DType work = DType::F32;
  bool round_p_before_pv = false;   ///< P = exp(logit - max) rounded to `work` before P·V
  bool round_ds_before_dq = false;  ///< dS = P∘(dP - Δ) rounded to `work` before dq = sm·dS·K
  bool round_before_dkv = false;    ///< P and dS rounded to `work` before dkv += sm·dSᵀ·Q + Pᵀ·dout
  DType out_dtype = DType::F32;     ///< dtype of out; Δ = rowsum(out·dout) is taken from it
  DType dq_dtype = DType::F32;      ///< dtype of dq (dkv and dsink are fp32)
  /// P normalized before it is rounded (RoundingModel::normalized_p, --normalized-p):
  /// p_j = exp(logit_j - L), L the log-normalizer with the sink, rounded to `work` before
  /// P·V and out = Σ_j p_j v_j (no division by the sum afterwards): the max key's probability
  /// is rounded too. Overrides round_p_before_pv.
  bool normalized_p = false;
  /// The sink applied after rounding out (RoundingModel::sink_after_rounding,
  /// --sink-after-rounding): out = fl_out(fl32(fl_out(o) · r)), o = P·V / Σ exp without the
  /// sink, r = exp(lse - L). Ignored with normalized_p (whose p already holds the sink).
  bool sink_after_rounding = false;
  /// The backward recomputes P from the forward's fp32 lse, FlashAttention-2/3 style:
  /// p_j = exp2(fl(s_j·fl(sm·log2e)) - fl(L·fl(log2e))), s_j = q·kv_j (fp32), L the fp32 lse
  /// with the sink folded in; p_sink = exp2(fl(sink·fl(log2e)) - fl(L·fl(log2e))). Else
  /// p_j = exp(logit_j - L) from the forward's own fp32 logits.
  bool p_exp2_from_lse = false;
  /// Mutants only (the declared-model liars, mutants.cpp): the first max key's P, as used in
  /// P·V, times this factor (1: none; the sum Σ exp is left alone), and on rows with a finite
  /// sink o = P·V / Σ exp times this factor before the sink (1: none). Not with normalized_p
  /// nor sink_after_rounding.
  float liar_pmax_factor = 1.0f;
  float liar_presink_factor = 1.0f;
};

struct FlashStyleResult {
  SparseMlaForward fwd;
  SparseMlaGrads grads;  ///< empty when no dout is given
};

/// Sparse MLA forward and (with `dout`) backward computed FlashAttention-style: fp32 products
/// and sums in `o.order`, the sink as an extra logit (lse without it), Δ from the returned out,
/// the roundings `o` names. Shapes: SPEC §4-§5 (q [s_q,h_q,d_qk], kv [s_kv,d_qk], indices
/// [s_q,k] or [s_q,1,k], topk_length and attn_sink optional, dout [s_q,h_q,d_v]); empty rows
/// out 0, lse +inf, max_logits -inf, no gradient (SPEC §6). lse and max_logits fp32 (natural
/// log). Inputs are assumed valid (test generators'); throws what Tensor conversions throw.
/// Source: FlashAttention-2 §3.1 (Dao 2023), FlashMLA `flash_mla_sparse_fwd`, TileLang sparse MLA.
FlashStyleResult flash_style_sparse_mla(const SparseMlaInputs& in, const Tensor* dout, const FlashStyleOptions& o);

}  // namespace dsa::props
