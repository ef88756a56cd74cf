// Floor inputs of the local bound (SPEC §9): for every element of every output, the
// first-order rounding-error scale of that element's own computation, evaluated in float64
// over absolute values of the exact inputs. Nothing from another row and no tensor-wide
// maximum enters an element's floor. Sources: Higham, Accuracy and Stability of Numerical
// Algorithms (2nd ed.), ch. 3 (inner products, summation) and ch. 4 (summation orders);
// Higham & Mary, "A new approach to probabilistic rounding error analysis", SISC 2019
// (√n·u instead of n·u for sums of n terms).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsa/contract/dtype.h"
#include "dsa/contract/op_types.h"

namespace dsa::oracle {

/// Floor inputs of one output. Flat element i belongs to row i / row_len (SPEC §9 rows:
/// (t, h) for out/lse/max_logits/dq, key row s for dkv and dk_idx, head for dsink, query row
/// for scores, dq_idx, dw, d_scores; the scalar loss is one row). Vectors have numel entries.
struct OutputFloor {
  int64_t row_len = 1;
  /// Absolute first-order error scale at fp32 accumulation (already × u = 2^-24): logits,
  /// exp, products and √n-summation of the element's own terms.
  std::vector<double> acc;
  /// Absolute error scale of intermediates a kernel keeps in its 16-bit working dtype
  /// (P before P·V, dS before dS·K, Δ from its own 16-bit out; already × that dtype's u);
  /// all zero when the working dtype is fp32 or wider.
  std::vector<double> narrow;
  /// The part of `narrow` that covers a 16-bit Δ = out·dout taken from another 16-bit out
  /// than the baseline's (δΔ16: the candidate's P rounding before P·V and one-ulp flips of
  /// its out columns, sparse MLA dq/dkv/dsink; already × u16). When the baseline takes Δ
  /// from the candidate's own out (SPEC §9, op_check), the two share Δ and the judge leaves
  /// this part out (judge_tensor's `delta_shared`). Empty: no such part.
  std::vector<double> narrow_delta;
  /// Sparse MLA dq, dkv, dsink of a 16-bit kernel: what narrow_delta (δΔ16) grows by when the
  /// candidate's out follows a declared rounding model (RoundingModel, report.h), whose out
  /// lies further from the exact one than FlashMLA's: narrow_delta_pmax for the max key's
  /// probability rounded (normalized_p: Δ moves by δp_max·g_max, |δp_max| <= u16 b(p_max), and
  /// out's columns may flip within the wider window), narrow_delta_presink for the sink
  /// applied after rounding (sink_after_rounding: each column's first rounding r·u16
  /// b(out_c/r), independent over columns, and the flips it allows). Already × u16; through
  /// dq, dkv and dsink as narrow_delta. The judge adds them only when the model is declared
  /// and the baseline does not share the candidate's Δ (judge_tensor). Empty: not applicable.
  std::vector<double> narrow_delta_pmax, narrow_delta_presink;
  /// Underflow count of the element (unitless; the judge multiplies it by the table's eta,
  /// 2^-126): the operations of its chain whose result or input may lie below fp32's normal
  /// range (below 2^-120), each weighted by the magnitude of the factors applied after it (a
  /// flushed probability p_j counts |v_jc| in out_c), plus n + 1 for a sum of n terms one of
  /// which is below 2^-97 — Higham eq. (2.8) with flush-to-zero. 0 for an element made of
  /// normal-range terms. Empty: no underflow term.
  std::vector<double> underflow;
  /// Σ|terms| of the element (the magnitude it is made of): a row's scale for WEAK is
  /// max(max|ref|, κ·max terms), κ = 3√θ, so a row whose reference cancelled is measured
  /// against its terms (SPEC §9 WEAK guard, report.h).
  std::vector<double> terms;
  /// Logit-like outputs (scores, lse, max_logits): κ = 1. Their error is absolute at the
  /// scale of the products that form them; a value near 0 is an accident of the shift.
  bool logit_scale = false;
  /// The kernel's working dtype (sparse MLA: its out dtype). A 16-bit one makes the 16-bit
  /// detection threshold apply to this output even when it is returned in fp32 (e.g. dkv of
  /// a bf16 kernel: its Δ comes from a bf16 out).
  DType work_dtype = DType::F32;
  /// The baseline's error holds a 16-bit rounding of an input the candidate inherits (FP8 kv
  /// dequantized to the 16-bit working dtype, with its tile scales): such an error spreads
  /// over the row through the logits, not by each element's own scale, so a 16-bit
  /// candidate keeps ρ·E_row (judge_tensor) unless inherited16 below splits that rounding off.
  /// False: the baseline's error is fp32 arithmetic.
  bool e_row_inherited16 = false;
  /// Per element, the part of the baseline's error that is a 16-bit rounding the candidate
  /// inherits, measured exactly on the float64 reference R (judge_tensor then takes the
  /// per-element term inherited16_e + κ_row·s_e in place of E_row where smaller, and own term
  /// applies in the 16-bit classes). Empty: not applicable. Two uses:
  /// - FP8 sparse MLA 16-bit `out` (SPEC §10): kv dequantized to the working dtype, max over
  ///   the legal dequantizations D (fl16(fp8·scale), fl16(fp8·fl16(scale))) of
  ///   |R(kv_D)_e - R(kv)_e|: the element's own column values and the logit shifts weighted by
  ///   |v_jc - out_c|, so a huge tile's rounding stays on its own columns.
  /// - Sparse MLA dq, dkv, dsink of a 16-bit kernel judged without its own out (SPEC §5, §9:
  ///   the baseline's Δ from its own out rounded to 16 bits, the reference's from the exact
  ///   out): |R(Δ16)_e - R(Δ)_e|, linear in δΔ = Δ16 - Δ per row (t, h): sm·δΔ·Σ_j p_j kv_jc
  ///   for dq_c, Σ over (t,h,j→s) of sm·δΔ·p_j·q_c for dkv_c, Σ_t p_sink·δΔ for dsink, so a
  ///   huge column's share stays in that column.
  std::vector<double> inherited16;
  /// With inherited16: per element, the baseline's fp32 arithmetic error on those same
  /// inputs (|B(kv_D)_e - R(kv_D)_e| max over D; |B(Δ16)_e - R(Δ16)_e|, B the baseline): what
  /// κ_row is measured from, as in the 16-bit sparse MLA classes whose inputs are already
  /// 16-bit (and whose Δ the baseline shares).
  std::vector<double> inherited16_arith;
  /// With inherited16: what it measures (printed with the bound).
  std::string inherited16_source;
  /// Sparse MLA `out` with attn_sink: per row (t, h), the sink factor r = exp(lse) /
  /// (exp(lse) + exp(sink[h])) = 1 - p_sink of a row with a finite sink and a valid key, else 0
  /// (SPEC §4). A kernel that rounds out to its 16-bit dtype before applying the sink
  /// (out = fl16(fl32(fl16(o) · r)), CheckOptions::sink_after_rounding) pays that first
  /// rounding, r · half-ulp16(out / r), on top of the one rounding every 16-bit out pays.
  /// Empty: no sink (every other output).
  std::vector<double> sink_rescale;
  /// Sparse MLA `out` of a 16-bit kernel: per element, what `narrow` grows by when the max
  /// key's probability is rounded too (already × u16): a kernel that normalizes before
  /// rounding P to 16 bits (softmax in fp32, then P·V in bf16; u16 b(p_j), p_j = exp(P_j - L)
  /// with the sink, never the sink-after-rounding model's r·b(p~_j)), where FlashMLA's
  /// exp(P_max - max) = 1 is exact. Added only for a kernel so declared
  /// (CheckOptions::rounding.normalized_p). Empty: not applicable.
  std::vector<double> narrow_pmax;
  /// Where the floor came from (a formula, printed with every bound).
  std::string source;
  /// What the underflow count counts (a formula, printed with every bound).
  std::string underflow_source;
};

/// Floor inputs of every output of one op on one case, by output name.
using CaseFloors = std::map<std::string, OutputFloor>;

/// Adds one inherited 16-bit rounding to OutputFloor::inherited16 / inherited16_arith (both
/// resized to ref.numel(), 0-filled, and raised elementwise to the larger value, so several
/// legal roundings combine by max). ref: the float64 reference on the exact inputs; ref16: the
/// float64 reference on the rounded inputs (kv dequantized to 16 bits, or Δ from an out
/// rounded to 16 bits); base16: the baseline on those rounded inputs; any dtype, same numel,
/// same element order (dimensionless output units). Per element: inherited = |ref16 - ref|,
/// arith = |base16 - ref16|; a non-finite ref leaves 0 (judged by position only), a non-finite
/// ref16 or base16 gives +inf (the row then keeps E_row in judge_tensor). Throws
/// std::invalid_argument naming 'ref16' / 'base16' when a numel differs. Rule: SPEC §9, the
/// per-element split min(E_row, I_e + κ_row·s_e) (docs/SPEC.md §9).
void add_inherited16(std::vector<double>& inherited, std::vector<double>& arith, const Tensor& ref,
                     const Tensor& ref16, const Tensor& base16);

/// Unit roundoff u of a floating dtype: 2^-53 (F64), 2^-24 (F32), 2^-11 (F16), 2^-8 (BF16).
/// Throws std::invalid_argument for integer dtypes.
double unit_roundoff(DType dtype);

/// Indexer scores (SPEC §2), output "scores" [s_q, s_kv] (row = query row):
/// u·(Σ_j |w_j|(√d_I·Σ_d|q_jd k_d| + |r_j|) + √H_I·Σ_j|w_j r_j|), r_j = ReLU(q_j·k).
/// Same argument rules as reference::indexer_scores (std::invalid_argument).
CaseFloors indexer_scores_floors(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                 const KeyWindows& windows);

/// Indexer backward (SPEC §2): "dq_idx" (row t), "dk_idx" (row s), "dw" (row t). Terms whose
/// dot q·k is nonzero but within 8·u·√d_I·Σ|q k| of zero may flip ReLU' and enter whole.
CaseFloors indexer_backward_floors(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                   const KeyWindows& windows, const Tensor& d_scores);

/// Sparse MLA (SPEC §4-§5). Forward outputs "out", "lse", "max_logits"; with `dout`
/// (not null) also "dq", "dkv" and, with a sink, "dsink". `work_dtype`: the dtype of the
/// candidate's forward `out` (q's dtype by default, SPEC §4): a 16-bit one adds the narrow
/// terms (P rounded before P·V, dS before dS·K and dS^T·Q, Δ from the 16-bit out).
/// Per (t, h), p_j = exp(P_j - L), key j's logit error e_j = √d_qk|P_j| + |sm|Σ_d|q_d kv_jd|
/// and exp error c_j = max(|P_j - max|, |P_j - L|) + 1 (independent across keys: quadrature):
///   out_c: u(sqrt(Σ_j (p_j|v_jc - out_c|(e_j + c_j))^2) + √n|out_c| + Σ_j p_j|v_jc|)
///   lse:   u(sqrt(Σ_j (p~_j(e_j + c_j))^2) + √n + |max| + |ln Σ exp(P - max)|)
///   dS_j = p_j(g_j - Δ), g_j = dout·v_j: δp_j, δg_j per key, δL and δΔ common to the row;
///   dq, dkv, dsink: those errors through their sums, + u(√n|sum| + Σ|terms|).
/// dsink, per (t, h): a p_sink below 2^-120 (a flush-to-zero kernel may flush it) adds
/// 2^-126 Σ_c|out_c dout_c|; p_sink Σ_c|out_c dout_c| below 2^-100 adds (1 + d_v) 2^-126
/// (Δ's products and p_sink·Δ below the normal range). Rows in quadrature, as δp_sink.
/// Underflow counts (OutputFloor::underflow, × eta): for every p_j, dS_j, sm·dS_j or product
/// below 2^-120 the magnitude of the factors after it; n + 1 for a sum with a term below 2^-97;
/// out's underflow carried into Δ (columns in quadrature) and Δ's into dsink (rows in quadrature).
/// fp16 work_dtype: p_j and dS_j below 2^-14 add 2^-25 (fp16's gradual underflow) × the factors after them.
/// out's 16-bit P rounding skips a max key's exp(0) = 1 only where no key of another id can
/// be the kernel's running max (the sink in that max is not modelled): the kernel's logits lie within
/// 16u·e_j + kv_rel_shift·|sm|Σ|q kv_j| of P_j, so a key within that of the max makes the max key's exp
/// < 1 and rounded (min(u16 b, 1 - exp(-gap)) per p_j); the same in δΔ16's P part.
/// `kv_rel_shift` (dimensionless, default 0): the relative error of each kv element as the
/// kernel reads it against `in.kv` (FP8 kv dequantized to a 16-bit dtype: 2·u16, the tile
/// scale's and the product's roundings, SPEC §10); it reorders near-equal logits.
/// Same argument rules as reference::sparse_mla_backward; std::invalid_argument naming
/// 'kv_rel_shift' unless it is finite and in [0, 1).
CaseFloors sparse_mla_floors(const SparseMlaInputs& in, const Tensor* dout, DType work_dtype,
                             double kv_rel_shift = 0.0);

/// First-order error a correct sparse MLA backward adds when it recomputes P from its
/// forward's fp32 lse (SPEC §5 hands `lse` to the backward) with separately scaled fp32
/// logits, as FlashAttention-2/3 and FlashMLA-style backwards do:
/// p_j = exp2(fl(s_j·fl(sm·log2e)) - fl(L·fl(log2e))), L the row's lse (with the sink folded
/// in, in fp32, when there is one). Each of those roundings is relative to the value it
/// rounds (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §2.2 eq. (2.4),
/// first order as in ch. 3): L stored in fp32 (u|L|), fl(log2e) and the product L·log2e
/// (2u|L|), fl(log2e), fl(sm·log2e) and the product s_j·c (3u|P_j|), the sink's fold
/// (u(|L| + 1)): the exponent errs by u·τ_j, τ_j = 3|P_j| + 3|L| (+ |L| + 1 with a finite
/// sink), P_j = sm·q·kv_j, also on a row with one key (p = 1 in exact arithmetic: the
/// forward's own exp(0) is exact, this recomputation is not). p_sink = exp(sink - L) errs
/// by u·(3|sink| + 3|L| (+ |L| + 1)). Through dS_j = p_j(g_j - Δ) with Δ from out (not
/// moved by p): |δdq_c| <= |sm| Σ_j uτ_j|dS_j kv_jc|, |δdkv_sc| <= Σ_(t,h,j→s)
/// uτ_j(|sm dS_j q_c| + p_j|dout_c|), |δdsink_h| <= Σ_t uτ_sink p_sink|Δ|: linear sums (the
/// roundings of one row's L and the constants are shared by its keys and by every row).
/// Returns, for "dq", "dkv" and ("dsink" with a sink), one absolute term per element (the
/// outputs' shapes flattened). Not part of the floors: op_check adds it to them only to judge
/// again gradients that fail; when every element passes that bound the report is taken, WEAK
/// on the rows where it exceeds θ · row scale (named with their |L|), and a gradient over it
/// keeps the FAIL (docs/SPEC.md §9). `row_lse` (optional): filled with, per output row ("dq":
/// (t, h); "dkv": key row s; "dsink": head h), the largest |L| (natural log, float64) among
/// the query rows that feed it (0 where none does). Shapes and errors as
/// reference::sparse_mla_backward (dout [s_q,h_q,d_v]); std::invalid_argument names the
/// argument otherwise.
std::map<std::string, std::vector<double>> sparse_mla_lse_recompute_terms(
    const SparseMlaInputs& in, const Tensor& dout,
    std::map<std::string, std::vector<double>>* row_lse = nullptr);

/// sparse_mla_floors for `work_dtype` (first) and for F32 work (second), computed together:
/// each equal to its own sparse_mla_floors call, the parts that do not depend on the working
/// dtype (all but the 16-bit narrow terms) computed once (issue 13: a case judged for a
/// 16-bit kernel and an fp32/f64 one, e.g. the reference backend). A work_dtype that is not
/// 16-bit gives its floors twice. Same argument rules as sparse_mla_floors.
std::pair<CaseFloors, CaseFloors> sparse_mla_floors_and_f32(const SparseMlaInputs& in,
                                                            const Tensor* dout, DType work_dtype);

/// KL loss (SPEC §7): "loss" (one row) and "d_scores" (row t), from the teacher's logits
/// (as sparse MLA) and the student's log-softmax over the row's key set.
CaseFloors kl_floors(const IndexerKlInputs& in);

}  // namespace dsa::oracle
