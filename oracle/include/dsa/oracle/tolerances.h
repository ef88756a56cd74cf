// The one tolerance table of the suite (SPEC §9, STYLE "Tolerances are data"): every ρ, λ
// and detection threshold θ, keyed by (op, output, dtype), each with a one-line reason.
// Nothing else in the code base (tests included) carries a literal tolerance.
#pragma once

#include <string>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa::oracle {

/// One row of the table. The local rule (SPEC §9) accepts a finite element e when
///   |cand_e - ref_e| <= rho · min(E_row, kappa_row · s_e) + floor_e,
///   floor_e = lambda · acc_e + lambda16 · narrow_e + eta · underflow_e
///             + half_ulp(dtype, |ref_e| + the other parts),
/// with E_row the baseline's largest error over e's row and kappa_row · s_e the stricter
/// per-element term (judge_tensor, report.h), acc_e/narrow_e the
/// element's first-order error scales (local_bounds.h), underflow_e the element's count of
/// operations that may underflow weighted by what multiplies them afterwards (local_bounds.h)
/// and the half ulp one rounding of the output. A row whose bound exceeds theta · rowscale for some element is WEAK (report.h).
/// Ops: the dsa::oracle::to_string(Op) names.
struct Tolerance {
  std::string op;
  std::string output;
  DType dtype;
  double rho;     ///< multiple of the baseline's row error
  double lambda;    ///< multiple of the fp32 first-order floor (Higham & Mary 2019 constant)
  double lambda16;  ///< multiple of the 16-bit working-dtype terms of the floor
  double theta;   ///< detection threshold: the published δ (docs/what-a-pass-means.md)
  /// Absolute error of one operation whose result or input lies below the normal range:
  /// Higham (2nd ed.) eq. (2.8) fl(x op y) = (x op y)(1 + δ) + η, |η| <= eta, with eta = the
  /// smallest normal 2^-126 of fp32/bf16 because GPUs flush subnormals (FTZ/DAZ).
  double eta;
  std::string reason;
};

/// λ of the 16-bit rounding sum of the sparse MLA dq floor (dS rounded to the 16-bit dtype
/// before dS·K): a sum Σ_j δ_j a_j of independent uniform roundings |δ_j| <= u16|x_j| is
/// bounded by min(u16 Σ|x_j a_j|, λ u16 sqrt(Σ(x_j a_j)^2)) (sub-Gaussian tail, Higham & Mary
/// 2019 model). Unitless; defined with its derivation in oracle/src/tolerances.cpp.
double quadrature16();

/// λ of the 16-bit P-rounding sum of the sparse MLA `out` floor (a FlashMLA-style kernel rounds
/// e_j = exp(P_j - m), m its running max, before P·V): min(u16 Σ_j p_j|v_jc|, λ u16
/// sqrt(Σ_j (p_j v_jc)^2)) over the non-max keys. quadrature16() times sqrt(3/(8 ln 2)), the rms
/// of b(e_j)/e_j with e_j's place in its binade log-uniform: the same sub-Gaussian tail, 2.1e-8
/// per element (derivation and what it assumes: oracle/src/tolerances.cpp). Unitless.
double quadrature_p16();

/// Margin of a logit's "at the max" test in the sparse MLA floors, in units of u·e_j (u the
/// accumulation unit roundoff, e_j = |sm| sum_error_scale of q·kv_j, at least Σ_d|q_d kv_jd| +
/// √d_qk|P_j|: the key's dot-product error scale, oracle/src/local_bounds.cpp): a key within
/// margin_j of the max may be the kernel's max (max_logits' error floor; the out floor's max-key
/// P rounding). λ u·e_j bounds a logit's probabilistic rounding error in its partial sums'
/// walk (Higham & Mary 2019, λ = 3 in the floors); 16 leaves a wide margin over it, so no key
/// a kernel may take for the max is missed (a larger margin only loosens bounds). Unitless.
double logit_max_margin_u();

/// Relative error of each kv element as a kernel reads FP8 kv dequantized to the working
/// dtype `work` (fp8 · scale rounded once, the scale itself maybe rounded once more,
/// fp8_scale_rounded_problem): 2·unit_roundoff(work) for a 16-bit `work`, 0 for fp32 (the
/// products fp8 · scale are exact there). The `kv_rel_shift` of sparse_mla_floors. Unitless.
double fp8_dequantized_kv_rel_shift(DType work);

/// θ of a 16-bit sparse MLA `out` judged under a declared rounding model (--sink-after-rounding,
/// --normalized-p; oracle::RoundingModel), and of that kernel's gradients judged without its own
/// out (their Δ comes from that out): such a kernel rounds twice, so its own error
/// reaches one 16-bit ulp (2^-8 of the value for bf16) on top of P's rounding, and its bound
/// reaches past 1e-2 of the row scale on ordinary generated rows. Unitless (relative to the row
/// scale); the value and its measurements are in oracle/src/tolerances.cpp. Only the WEAK
/// label uses θ: the bound itself is unchanged.
double theta_declared_rounding16();

/// The entry for (op, output, dtype). Throws std::out_of_range naming the key when absent
/// (a missing entry is a bug in the table, never silently a default).
const Tolerance& tolerance(const std::string& op, const std::string& output, DType dtype);

/// Every entry, in table order (for `dsa-verify tolerances` and docs).
const std::vector<Tolerance>& tolerance_table();

}  // namespace dsa::oracle
