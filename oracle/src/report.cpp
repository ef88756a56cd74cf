#include "dsa/oracle/report.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <sstream>

#include "dsa/contract/errors.h"
#include "dsa/oracle/tolerances.h"

namespace dsa::oracle {

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::Fail: return "FAIL";
    case Verdict::Skip: return "skip";
    case Verdict::Weak: return "WEAK";
    case Verdict::Incomplete: return "INCOMPLETE";
  }
  return "?";
}

namespace {
int severity(Verdict v) {
  switch (v) {
    case Verdict::Skip: return 0;
    case Verdict::Pass: return 1;
    case Verdict::Weak: return 2;
    case Verdict::Incomplete: return 3;
    case Verdict::Fail: return 4;
  }
  return 4;
}
}  // namespace

void OpReport::fail(const std::string& why) { mark(Verdict::Fail, why); }

void OpReport::mark(Verdict v, const std::string& why) {
  if (severity(v) > severity(verdict) || verdict == Verdict::Skip) {
    verdict = v;
    reason = why;
  }
}

std::string OpReport::verdict_line() const { return dsa::oracle::verdict_line({*this}); }

std::vector<std::string> OpReport::failed_outputs() const {
  std::vector<std::string> names;
  for (const auto& t : tensors)
    if (!t.passed) names.push_back(t.name);
  return names;
}

std::string verdict_line(const std::vector<OpReport>& reports) {
  Verdict worst = Verdict::Skip;
  std::vector<std::string> not_judged;
  for (const auto& r : reports) {
    if (severity(r.verdict) > severity(worst)) worst = r.verdict;
    for (const auto& n : r.not_judged) not_judged.push_back(n);
  }
  switch (worst) {
    case Verdict::Skip: return "SKIPPED";
    case Verdict::Fail: return "DISAGREES";
    case Verdict::Weak: return "WEAK";
    case Verdict::Incomplete: return "INCOMPLETE";
    case Verdict::Pass: break;
  }
  if (not_judged.empty()) return "AGREES";
  std::string s = "AGREES (partial: ";
  for (size_t i = 0; i < not_judged.size(); ++i) s += (i ? ", " : "") + not_judged[i];
  return s + " not judged)";
}

namespace {

std::string coords(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t n = std::max<int64_t>(1, shape[d]);
    idx[d] = flat % n;
    flat /= n;
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

constexpr double kUnderflowScale = 0x1p-100;
// A row whose reference cancelled below kKappa·√θ of its largest Σ|terms| is measured
// against that (detection relative to what the row is made of).
constexpr double kKappa = 3.0;

// Half an ulp at x of `dtype` (the largest rounding error of a value of magnitude <= x):
// 2^(floor(log2 x)) · u, at least half the subnormal spacing; 0 for x = 0.
double half_ulp(double x, DType dtype) {
  if (!(x > 0)) return 0.0;
  int e = 0;
  std::frexp(x, &e);  // x = f · 2^e, f in [0.5, 1)
  // below the normal range the spacing stops shrinking (subnormals)
  const double tiny = dtype == DType::F64 ? 0x1p-1074 * 0.5 : dtype == DType::F16 ? 0x1p-25 : 0x1p-150;
  const double half_sub = dtype == DType::BF16 ? 0x1p-134 : tiny;
  return std::max(std::ldexp(unit_roundoff(dtype), e - 1), half_sub);
}

}  // namespace

TensorCheck judge_tensor(const std::string& op, const std::string& name, const Tensor& candidate,
                         const Tensor& reference, const Tensor& baseline, const OutputFloor& floor,
                         bool delta_shared, const RoundingModel& model) {
  TensorCheck c;
  int64_t ulp_explained = 0;  // failures within one more half ulp of the output dtype (message only)
  c.name = name;
  c.dtype = candidate.dtype();
  c.floor_source = floor.source;
  c.underflow_source = floor.underflow_source;
  if (!is_floating(candidate.dtype())) {
    c.message = std::string("candidate dtype ") + dtype_name(candidate.dtype()) +
                " is not floating";
    return c;
  }
  c.metrics = compare_tensors(candidate, reference);
  if (!c.metrics.shape_ok) {
    c.message = c.metrics.first_mismatch;
    return c;
  }
  const int64_t numel = reference.numel();
  check_arg(static_cast<int64_t>(floor.acc.size()) == numel &&
                static_cast<int64_t>(floor.terms.size()) == numel &&
                (floor.narrow.empty() || static_cast<int64_t>(floor.narrow.size()) == numel) &&
                (floor.underflow.empty() || static_cast<int64_t>(floor.underflow.size()) == numel) &&
                (floor.narrow_delta.empty() || floor.narrow_delta.size() == floor.narrow.size()) &&
                floor.row_len > 0,
            "judge_tensor", "floor", std::to_string(floor.acc.size()) + " entries",
            std::to_string(numel) + " entries (one per element of '" + name + "')");
  // The table row follows the kernel's precision: a 16-bit output, else a 16-bit working
  // dtype (e.g. fp32 dkv of a kernel whose Δ comes from its bf16 out), else the output's.
  const bool work16 = floor.work_dtype == DType::BF16 || floor.work_dtype == DType::F16;
  const bool out16 = candidate.dtype() == DType::BF16 || candidate.dtype() == DType::F16;
  c.precision = work16 && !out16 ? floor.work_dtype : candidate.dtype();
  const Tolerance& tol = tolerance(op, name, c.precision);
  c.rho = tol.rho;
  c.lambda = tol.lambda;
  c.theta = tol.theta;
  // E_row is measured before the baseline's own output rounding: the one rounding a 16-bit
  // candidate pays is the half-ulp term, counted once (a rounded baseline would count it in
  // E_row and again in the candidate).
  const Tensor& base = baseline;
  if (base.shape() != reference.shape()) {
    c.message = "baseline shape " + shape_str(base.shape()) + " differs from the reference";
    return c;
  }
  const int64_t row_len = floor.row_len;
  const int64_t n_rows = numel == 0 ? 0 : (numel + row_len - 1) / row_len;
  c.rows = n_rows;
  check_arg(floor.sink_rescale.empty() || static_cast<int64_t>(floor.sink_rescale.size()) == n_rows,
            "judge_tensor", "floor.sink_rescale", std::to_string(floor.sink_rescale.size()) + " entries",
            std::to_string(n_rows) + " (one per row of '" + name + "') or none");
  // A sink applied after rounding out to 16 bits (SPEC §4's `out *=` as its own step, on the
  // 16-bit out): fl16(fl32(fl16(o)·r)), o = out/r. Its first rounding errs by up to
  // half-ulp16(o), scaled by r, on top of the one rounding every 16-bit out pays (h_e);
  // the binade is taken at the element's reference plus its other bound parts (the kernel's
  // o may lie that far up). Only 16-bit outputs round twice.
  const bool presink_possible = out16 && !floor.sink_rescale.empty();
  check_arg(floor.narrow_pmax.empty() || floor.narrow_pmax.size() == floor.acc.size(), "judge_tensor",
            "floor.narrow_pmax", std::to_string(floor.narrow_pmax.size()) + " entries",
            std::to_string(numel) + " (one per element of '" + name + "') or none");
  // A kernel that normalizes before rounding P to 16 bits rounds the max key's probability
  // too (OutputFloor::narrow_pmax); FlashMLA's exp(0) = 1 is exact. Only a 16-bit out.
  const bool pmax_possible = out16 && !floor.narrow_pmax.empty();
  // The backward of such a kernel (dq, dkv, dsink) judged without its own out: its Δ comes
  // from that out, further from the baseline's than δΔ16 allows by the model's extra
  // (OutputFloor::narrow_delta_pmax, _presink). With a shared Δ the baseline holds it.
  const bool dpmax_possible = !delta_shared && !floor.narrow_delta_pmax.empty();
  const bool dpresink_possible = !delta_shared && !floor.narrow_delta_presink.empty();
  check_arg((floor.narrow_delta_pmax.empty() || floor.narrow_delta_pmax.size() == floor.acc.size()) &&
                (floor.narrow_delta_presink.empty() || floor.narrow_delta_presink.size() == floor.acc.size()),
            "judge_tensor", "floor.narrow_delta_pmax/_presink",
            std::to_string(floor.narrow_delta_pmax.size()) + "/" + std::to_string(floor.narrow_delta_presink.size()) +
                " entries",
            std::to_string(numel) + " (one per element of '" + name + "') or none");
  c.rounding.normalized_p = model.normalized_p && (pmax_possible || dpmax_possible);
  c.rounding.sink_after_rounding = model.sink_after_rounding && (presink_possible || dpresink_possible);
  const bool add_dpmax = dpmax_possible && model.normalized_p,
             add_dpresink = dpresink_possible && model.sink_after_rounding;
  // A declared model's kernel errs by up to one more 16-bit rounding in its out: the out's
  // detection δ is its own (theta_declared_rounding16, measured); the bound itself is
  // unchanged. Its backward judged without its own out takes Δ from that out, so its
  // gradients carry the same extra rounding (through δΔ16 above) and take the same θ; with its
  // out handed over (Δ shared) they keep the table's θ.
  if ((model.sink_after_rounding && presink_possible) || (model.normalized_p && pmax_possible) ||
      add_dpmax || add_dpresink)
    c.theta = std::max(c.theta, theta_declared_rounding16());
  // E_row: the baseline's largest error over the row (a non-finite baseline where the
  // reference is finite makes the row's bound infinite: reported weak, never a silent pass).
  std::vector<double> e_row(static_cast<size_t>(n_rows), 0.0), scale(e_row.size(), 0.0),
      terms(e_row.size(), 0.0), row_bound(e_row.size(), 0.0);
  std::vector<ElementBound> row_max(e_row.size());
  for (int64_t i = 0; i < numel; ++i) {
    const double r = reference.get(i);
    if (!std::isfinite(r)) continue;
    const size_t row = static_cast<size_t>(i / row_len);
    const double b = base.get(i);
    e_row[row] = std::max(e_row[row], std::isfinite(b) ? std::abs(b - r) : INFINITY);
    scale[row] = std::max(scale[row], std::abs(r));
    terms[row] = std::max(terms[row], floor.terms[static_cast<size_t>(i)]);
  }
  for (double e : e_row) c.baseline_err = std::max(c.baseline_err, e);
  // The per-element baseline term (stricter than SPEC §9's ρ·E_row, never looser: the
  // minimum of the two). SPEC's E_row is the row's worst baseline error wherever it
  // occurred, so one column of huge magnitude (kv column 0 = ±65536 with q column 0 = 0:
  // logits unchanged) loosens every other column of the row by orders of magnitude (issue
  // 12, F1). A first-order rounding-error analysis bounds each element's error by its own
  // scale: |fl(Σ_j x_j) - Σ_j x_j| <= γ_n Σ_j |x_j| componentwise (Higham, Accuracy and
  // Stability of Numerical Algorithms, 2nd ed., §3.1 and §3.5, eq. (3.2)-(3.5); √n·u instead
  // of γ_n: Higham & Mary 2019), so a correct kernel's error at e scales with e's own floor
  // parts, not with another column's. s_e is that scale, the same parts as the floor (λ·acc +
  // λ16·narrow + η·underflow) plus half an fp32 ulp at |r_e| (the baseline's own output
  // rounding, whose error E_row includes); κ_row = max_i |base_i - r_i| / s_i is how many of
  // its own scales the baseline erred by, at worst, in the row (candidate-independent), and
  // κ_row·s_e is that at e's scale: at every element of the row it covers the baseline's own
  // error there (κ_row·s_i >= |base_i - r_i|). A row with an element of zero scale but a
  // nonzero baseline error (a part the floor does not model) keeps E_row (κ_row = inf).
  // The 16-bit classes (precision BF16/F16, ρ = 1) take the per-element term too where the
  // baseline's error is fp32 arithmetic on the candidate's own inputs (sparse MLA forward; the
  // backward when the baseline and the reference take Δ from the same out, judge_tensor's
  // delta_shared, or no 16-bit Δ enters). They keep E_row where the baseline holds a 16-bit
  // rounding the candidate inherits, which spreads over the row by signed sums rather than
  // by each element's floor: a 16-bit Δ taken from another out than the reference's
  // (δΔ·Σ_j p_j kv_jc for dq; measured, detection_test seed 12002 level 2: κ_row 100 on a
  // bf16 dq row, a FlashAttention-style bf16 dq at 1.0006 of the per-element bound), and FP8
  // kv dequantized to bf16 (OutputFloor::e_row_inherited16) unless the check splits that
  // rounding off exactly (OutputFloor::inherited16, the FP8 sparse MLA out: below); κ_row·s_e
  // alone there put the libtorch-cpu and FlashMLA-style controls' bf16 FP8 out at 1.03-1.18 of
  // it (FalseAlarms level 1, 2026-12-01). Without it, one huge column (kv column 0 = ±2^24, q column 0 = 0)
  // made a bf16 out row's E_row 0.26 and an out row with every ordinary column 3× its
  // value AGREED (LocalRuleHugeColumn.Bf16SparseMlaOutAndDq).
  // FP8 kv dequantized to 16 bits, split (OutputFloor::inherited16): cand - ref =
  // (cand - R(kv_D)) + (R(kv_D) - ref) for the dequantization D the candidate used; the second
  // part is at most inherited16_e, exactly, for either legal D; the first is fp32 arithmetic
  // on the candidate's own (16-bit) inputs, judged as in the 16-bit sparse MLA classes, with
  // κ_row measured from the baseline's arithmetic error on those inputs (inherited16_arith).
  // The term is inherited16_e + κ_row·s_e, never above E_row (the minimum of the two), and
  // κ_row is raised where needed so the baseline passes its own bound at every element.
  // Before it, one tile of huge scale made E_row large for every column of the row
  // (fresh15 F3: the other 384 columns 5 % off AGREED; LocalRuleHugeColumn.Fp8Bf16Out).
  // A 16-bit Δ from another out, split the same way (OutputFloor::inherited16, sparse MLA
  // dq/dkv/dsink judged without the candidate's own out): cand - R(Δ) = (cand - R(Δc)) +
  // (R(Δc) - R(Δ16)) + (R(Δ16) - R(Δ)), Δc the candidate's 16-bit Δ, Δ16 the baseline's. The
  // last part is inherited16_e exactly; the middle one, the distance between two 16-bit Δs
  // through the element's own sum, is the floor's δΔ16 (narrow_delta, kept in the floor);
  // the first is arithmetic on the candidate's own Δ, judged as with a shared Δ: κ_row from
  // the baseline's arithmetic error on Δ16 (inherited16_arith) and s_e without the δΔ16
  // parts (the scale of the shared-Δ judge). Before it, one huge kv column made E_row of a dq
  // row (a huge q column: of a dkv row) large for every column and the others 5 % off AGREED
  // (LocalRuleHugeColumn.Bf16BackwardWithoutOwnOut).
  const bool inherited_split = static_cast<int64_t>(floor.inherited16.size()) == numel &&
                               floor.inherited16_arith.size() == floor.inherited16.size();
  const bool out16_class = c.precision == DType::BF16 || c.precision == DType::F16;
  const bool split16 = inherited_split && out16_class;
  const bool own_term_applies =
      !out16_class || split16 || (!floor.e_row_inherited16 && (delta_shared || floor.narrow_delta.empty()));
  auto inherited_e = [&](int64_t i) { return split16 ? floor.inherited16[static_cast<size_t>(i)] : 0.0; };
  c.own_term_applies = own_term_applies;
  c.inherited16 = split16;
  c.inherited16_source = split16 ? floor.inherited16_source : std::string();
  const double eta_f = tol.eta;
  // narrow_e: without its δΔ16 part when the baseline shares the candidate's Δ (delta_shared)
  const bool drop_delta = delta_shared && !floor.narrow_delta.empty();
  auto narrow_e = [&](size_t k) {
    if (floor.narrow.empty()) return 0.0;
    return (drop_delta ? std::max(0.0, floor.narrow[k] - floor.narrow_delta[k]) : floor.narrow[k]) +
           (add_dpmax ? floor.narrow_delta_pmax[k] : 0.0) + (add_dpresink ? floor.narrow_delta_presink[k] : 0.0);
  };
  if (drop_delta)
    c.floor_source += " (δΔ16 left out: the baseline takes Δ from the candidate's own 16-bit out)";
  if (add_dpmax)
    c.floor_source += " + declared --normalized-p in δΔ16: u16 Σ_(max j) b(p_j)|g_j| and out's flips "
                      "within its wider window (Δ from the kernel's own out, not handed over)";
  if (add_dpresink)
    c.floor_source += " + declared --sink-after-rounding in δΔ16: min(Σ_c, 3.5 sqrt(Σ_c (.)^2)) of "
                      "|dout_c| r u16 b(out_c/r) and out's flips within its wider window (Δ from the "
                      "kernel's own out, not handed over)";
  // s_e; split16: without the δΔ16 parts (the floor keeps them; the shared-Δ judge's scale)
  auto own_scale = [&](int64_t i, double r) {
    const size_t k = static_cast<size_t>(i);
    const double nar = !split16 ? narrow_e(k)
                       : floor.narrow.empty() ? 0.0
                       : std::max(0.0, floor.narrow[k] - (floor.narrow_delta.empty() ? 0.0 : floor.narrow_delta[k]));
    return tol.lambda * floor.acc[k] + tol.lambda16 * nar +
           (floor.underflow.empty() ? 0.0 : eta_f * floor.underflow[k]) + half_ulp(std::abs(r), DType::F32);
  };
  std::vector<double> kappa(e_row.size(), own_term_applies ? 0.0 : INFINITY);
  for (int64_t i = 0; i < numel && own_term_applies; ++i) {
    const double r = reference.get(i);
    if (!std::isfinite(r)) continue;
    const size_t row = static_cast<size_t>(i / row_len);
    const double b = base.get(i);
    const double err = std::isfinite(b) ? std::abs(b - r) : INFINITY;
    const double s = own_scale(i, r);
    if (split16) {
      const double inh = inherited_e(i), arith = floor.inherited16_arith[static_cast<size_t>(i)];
      // the arithmetic error on the dequantized inputs, and what of the baseline's own error
      // the exact inherited part leaves (the baseline passes its own bound)
      const double need = std::isfinite(inh) && std::isfinite(arith) ? std::max(arith, err - inh) : INFINITY;
      if (need > 0) kappa[row] = std::max(kappa[row], s > 0 ? need / s : INFINITY);
      continue;
    }
    if (!(err > 0)) continue;
    kappa[row] = std::max(kappa[row], s > 0 ? err / s : INFINITY);
  }
  const double err_max = c.metrics.max_abs;
  c.ratio = c.baseline_err > 0 ? err_max / c.baseline_err : (err_max > 0 ? INFINITY : 0.0);
  c.at_worst.flat = -1;
  for (int64_t i = 0; i < numel; ++i) {
    const double r = reference.get(i), x = candidate.get(i);
    if (!std::isfinite(r) || !std::isfinite(x)) continue;  // positions: compare_tensors
    const size_t row = static_cast<size_t>(i / row_len);
    ElementBound eb;
    eb.flat = i;
    eb.row = static_cast<int64_t>(row);
    eb.candidate = x;
    eb.reference = r;
    eb.err = std::abs(x - r);
    eb.e_row = e_row[row];
    eb.kappa_row = kappa[row];
    eb.own_scale = own_scale(i, r);
    eb.inherited = inherited_e(i);
    double term = e_row[row];
    if (std::isfinite(kappa[row]) && eb.inherited + kappa[row] * eb.own_scale < term) {
      term = eb.inherited + kappa[row] * eb.own_scale;
      eb.own_term = true;
      ++c.own_term_elements;
    }
    eb.rho_e_row = tol.rho * term;
    eb.floor_acc = tol.lambda * floor.acc[static_cast<size_t>(i)] + tol.lambda16 * narrow_e(static_cast<size_t>(i));
    const double pmax = pmax_possible ? tol.lambda16 * floor.narrow_pmax[static_cast<size_t>(i)] : 0.0;
    if (c.rounding.normalized_p) {
      eb.floor_pmax = pmax;
      eb.floor_acc += pmax;
    }
    if (add_dpmax) eb.floor_pmax = tol.lambda16 * floor.narrow_delta_pmax[static_cast<size_t>(i)];  // in narrow_e
    // the backward's δΔ16 part of an undeclared model (explains a failure, never a pass)
    const double dpmax = dpmax_possible && !add_dpmax ? tol.lambda16 * floor.narrow_delta_pmax[static_cast<size_t>(i)] : 0.0,
                 dpresink = dpresink_possible && !add_dpresink
                                ? tol.lambda16 * floor.narrow_delta_presink[static_cast<size_t>(i)] : 0.0;
    // operations below the normal range (flush-to-zero): absolute, its own part
    eb.floor_underflow =
        floor.underflow.empty() ? 0.0 : tol.eta * floor.underflow[static_cast<size_t>(i)];
    // an F64 candidate is judged as an fp32 kernel (fp32 accumulation, SPEC §9): one fp32
    // rounding, so a result upcast to F64 gets the same bound as the F32 one
    eb.floor_round = half_ulp(std::abs(r) + eb.rho_e_row + eb.floor_acc + eb.floor_underflow,
                              candidate.dtype() == DType::F64 ? DType::F32 : candidate.dtype());
    double presink = 0.0;
    if (presink_possible) {
      const double rs = floor.sink_rescale[row];
      if (rs > 0 && rs < 1)
        presink = rs * half_ulp((std::abs(r) + eb.rho_e_row + eb.floor_acc + eb.floor_underflow) / rs,
                                candidate.dtype());
    }
    if (c.rounding.sink_after_rounding) eb.floor_presink = presink;
    eb.bound = eb.rho_e_row + eb.floor_acc + eb.floor_underflow + eb.floor_round + eb.floor_presink;
    if (eb.bound > c.max_bound || c.largest.flat < 0) {
      c.max_bound = std::max(c.max_bound, eb.bound);
      c.largest = eb;
    }
    if (eb.bound >= row_bound[row]) {
      row_bound[row] = eb.bound;
      row_max[row] = eb;
    }
    const double w = eb.bound > 0 ? eb.err / eb.bound : (eb.err > 0 ? INFINITY : 0.0);
    if (c.at_worst.flat < 0 || w > c.worst) {
      c.worst = w;
      c.at_worst = eb;
    }
    if (!(eb.err <= eb.bound)) {
      ++c.failed_elements;
      // within one ulp of the output dtype (twice floor_round): an out not rounded to nearest
      if (eb.floor_round > 0 && eb.err <= eb.bound + eb.floor_round) ++ulp_explained;
      const double extra_s = (c.rounding.sink_after_rounding ? 0.0 : presink) + dpresink,
                   extra_p = (c.rounding.normalized_p ? 0.0 : pmax) + dpmax;
      if (extra_s > 0 && eb.err <= eb.bound + extra_s) ++c.presink_explained;
      if (extra_p > 0 && eb.err <= eb.bound + extra_p) ++c.pmax_explained;
      if (extra_s + extra_p > 0 && eb.err <= eb.bound + extra_s + extra_p) ++c.both_explained;
      if (c.failures.size() < 5) {
        eb.where = coords(reference.shape(), i);
        c.failures.push_back(eb);
      }
    }
  }
  if (c.at_worst.flat >= 0) c.at_worst.where = coords(reference.shape(), c.at_worst.flat);
  if (c.largest.flat >= 0) c.largest.where = coords(reference.shape(), c.largest.flat);
  c.bound = c.at_worst.bound;
  // WEAK rows (SPEC §9 "a pass must be able to fail").
  c.row_len = row_len;
  c.row_weak.assign(static_cast<size_t>(n_rows), 0);
  c.row_scale.assign(static_cast<size_t>(n_rows), 0.0);
  c.row_max_bound = row_bound;
  for (int64_t row = 0; row < n_rows; ++row) {
    const size_t r = static_cast<size_t>(row);
    const double kappa = floor.logit_scale ? 1.0 : kKappa * std::sqrt(c.theta);
    // Below 2^-100 fp32 nears its subnormal range (products and exps lose relative
    // precision; flush-to-zero kernels lose them): such rows are measured against 2^-100.
    const double rs = std::max({scale[r], kappa * terms[r], row_bound[r] > 0 ? kUnderflowScale : 0.0});
    c.row_scale[r] = rs;
    const double rel = row_bound[r] > 0 ? (rs > 0 ? row_bound[r] / rs : INFINITY) : 0.0;
    if (rel > c.weakest || (row == 0 && rel >= c.weakest)) {
      c.weakest = rel;
      c.at_weakest = row_max[r];
      c.at_weakest.where = coords(reference.shape(), row_max[r].flat < 0 ? 0 : row_max[r].flat);
      c.weakest_scale = rs;
      c.weakest_ref_max = scale[r];
      c.weakest_terms = terms[r];
    }
    if (rel > c.theta) {
      c.row_weak[r] = 1;
      ++c.weak_rows;
      if (c.weak_row_ids.size() < 8) c.weak_row_ids.push_back(row);
    }
  }
  if (c.metrics.nonfinite_mismatches > 0) {
    c.message = std::to_string(c.metrics.nonfinite_mismatches) +
                " non-finite position mismatch(es), first " + c.metrics.first_mismatch;
    return c;
  }
  if (c.failed_elements > 0) {
    const ElementBound& f = c.failures.front();
    std::ostringstream os;
    os << c.failed_elements << " element(s) over their bound; first " << f.where << ": |"
       << f.candidate << " - " << f.reference << "| = " << f.err << " > bound " << f.bound
       << " (rho x " << (f.own_term ? "kappa_row x s_e " : "E_row ") << f.rho_e_row
       << " + floor " << f.floor_acc << " + underflow "
       << f.floor_underflow << " + rounding " << f.floor_round;
    if (f.floor_presink > 0) os << " + pre-sink rounding " << f.floor_presink;
    os << ")";
    // A failure an undeclared rounding model explains names the flag (never a pass by itself).
    const char* sink_hint =
        "one more 16-bit rounding, r x half-ulp(out / r), of a kernel that rounds out before "
        "applying attn_sink (fl16(fl16(o) r)): if yours does, judge it with --sink-after-rounding";
    const char* pmax_hint =
        "the rounding of the max key's probability, u16 b(p_max)|v_c|, of a kernel that rounds "
        "the normalized softmax(P) to 16 bits before P·V (FlashMLA's exp(P - max) = 1 is exact): "
        "if yours does, judge it with --normalized-p";
    // Both alone explain every failure (a kernel with few keys per row and a sink): name both,
    // as alternatives, not the first one that matched.
    if (c.pmax_explained == c.failed_elements && c.presink_explained == c.failed_elements)
      os << "; every failing element lies within either " << sink_hint << ", or " << pmax_hint
         << " (SPEC §4, §9)";
    else if (c.pmax_explained == c.failed_elements)
      os << "; every failing element lies within " << pmax_hint << " (SPEC §4, §9)";
    else if (c.presink_explained == c.failed_elements)
      os << "; every failing element lies within " << sink_hint << " (SPEC §4, §9)";
    else if (c.both_explained == c.failed_elements)
      os << "; every failing element lies within " << sink_hint << ", plus " << pmax_hint
         << " (SPEC §4, §9)";
    // The rounding mode: one more half ulp of the output's dtype explains every failure (as it
    // may the models above): name that first cause too, so a flag is not taken for it.
    if (ulp_explained == c.failed_elements)
      os << "; every failing element also lies within one ulp of " << dtype_name(candidate.dtype())
         << " at the reference instead of half: an output rounded toward zero (e.g. "
            "__float2bfloat16_rz, a bit shift) or otherwise not to nearest errs so, which SPEC §9 "
            "does not admit (half an ulp, round to nearest); check the conversion first";
    c.message = os.str();
    return c;
  }
  c.passed = true;
  return c;
}

std::string format_tensor_checks(const std::vector<TensorCheck>& checks) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "  %-12s %-5s %10s %10s %10s %10s %8s %9s %s\n", "tensor",
                "dtype", "max_abs", "rel_fro", "cosine", "base_err", "ratio", "err/bound",
                "verdict");
  os << line;
  for (const auto& c : checks) {
    // Rows judged by metrics only (no baseline, no bound) show "-" and say so in the verdict.
    const bool metrics_only = std::isnan(c.bound);
    // A candidate of another shape or a non-floating dtype is never measured: "-", not 0.
    const bool measured = c.metrics.shape_ok && is_floating(c.dtype);
    char base[16] = "-", ratio[16] = "-", worst[16] = "-", max_abs[16] = "-", rel_fro[16] = "-",
         cosine[16] = "-";
    if (measured) {
      std::snprintf(max_abs, sizeof max_abs, "%.3e", c.metrics.max_abs);
      std::snprintf(rel_fro, sizeof rel_fro, "%.3e", c.metrics.rel_fro);
      std::snprintf(cosine, sizeof cosine, "%.7f", c.metrics.cosine);
    }
    if (measured && !metrics_only) {
      std::snprintf(base, sizeof base, "%.3e", c.baseline_err);
      std::snprintf(ratio, sizeof ratio, "%.3g", c.ratio);
      std::snprintf(worst, sizeof worst, "%.3g", c.worst);
    }
    // NaN/±inf where the reference differs (SPEC §9: must match) has no finite error: the
    // ratio and err/bound, measured over the positions that match, would read 0 on a FAIL
    // (fresh18 F4). The error columns say "nonfinite" and the verdict counts them; the
    // line below names the first position.
    const int64_t nonfinite = measured ? c.metrics.nonfinite_mismatches : 0;
    if (nonfinite > 0) {
      std::snprintf(ratio, sizeof ratio, "%s", "nonfinite");
      std::snprintf(worst, sizeof worst, "%s", "nonfinite");
    }
    char failed[96] = "FAIL";
    if (nonfinite > 0)
      std::snprintf(failed, sizeof failed, "FAIL (%lld non-finite position mismatch(es))",
                    static_cast<long long>(nonfinite));
    const char* verdict = !c.passed ? failed
                          : metrics_only ? "pass (non-finite positions only)"
                          : c.weak_rows > 0 ? "pass, WEAK rows"
                                            : "pass";
    std::snprintf(line, sizeof line, "  %-12s %-5s %10s %10s %10s %10s %8s %9s %s\n",
                  c.name.c_str(), dtype_name(c.dtype), max_abs, rel_fro, cosine, base, ratio, worst,
                  verdict);
    os << line;
    if (!c.passed) os << "    -> " << c.message << "\n";
    if (metrics_only || !measured) continue;
    auto parts = [&os, &c](const char* label, const ElementBound& e) {
      // The baseline term used: SPEC §9's E_row, or the stricter per-element κ_row·s_e.
      char term[200];
      if (e.own_term && e.inherited > 0)
        std::snprintf(term, sizeof term,
                      "(inherited16 %.3e + kappa_row %.3g x s_e %.3e) = %.3e (per-element; E_row %.3e)",
                      e.inherited, e.kappa_row, e.own_scale, c.rho > 0 ? e.rho_e_row / c.rho : 0.0, e.e_row);
      else if (e.own_term)
        std::snprintf(term, sizeof term,
                      "kappa_row %.3g x s_e %.3e = %.3e (per-element; E_row %.3e)", e.kappa_row,
                      e.own_scale, c.rho > 0 ? e.rho_e_row / c.rho : 0.0, e.e_row);
      else
        std::snprintf(term, sizeof term, "E_row %.3e", c.rho > 0 ? e.rho_e_row / c.rho : 0.0);
      char presink[200] = "", pmax[100] = "";
      if (e.floor_presink > 0)
        std::snprintf(presink, sizeof presink, " + pre-sink rounding %.3e (--sink-after-rounding)",
                      e.floor_presink);
      if (e.floor_pmax > 0)
        std::snprintf(pmax, sizeof pmax, "; floor incl. max-key P rounding %.3e (--normalized-p)",
                      e.floor_pmax);
      std::strncat(presink, pmax, sizeof presink - std::strlen(presink) - 1);
      char l[760];
      std::snprintf(l, sizeof l,
                    "    %s %s: err %.3e %s bound %.3e = rho %.3g x %s + floor %.3e "
                    "(lambda x first-order, source below) + underflow %.3e (eta x ops that "
                    "may flush) + rounding %.3e%s\n",
                    label, e.where.c_str(), e.err, e.err <= e.bound ? "<=" : ">", e.bound, c.rho,
                    term, e.floor_acc, e.floor_underflow, e.floor_round, presink);
      os << l;
    };
    if (c.at_worst.flat >= 0) parts("bound at worst element", c.at_worst);
    for (const auto& f : c.failures) parts("FAILED", f);
    if (!c.floor_source.empty()) os << "    floor source: " << c.floor_source << "\n";
    if (!c.underflow_source.empty())
      os << "    underflow source (eta 2^-126 each, Higham eq. 2.8 with flush-to-zero): "
         << c.underflow_source << "\n";
    if (c.own_term_applies && c.inherited16)
      os << "    baseline term: min(E_row, inherited16 + kappa_row x s_e), inherited16 = "
         << c.inherited16_source
         << ", s_e = the element's own floor parts (without δΔ16) + half an fp32 ulp at |ref|, "
            "kappa_row = max over the row of the baseline's arithmetic error on those 16-bit "
            "values / s_e; per-element term on "
         << c.own_term_elements << " element(s), E_row on the others\n";
    else if (c.own_term_applies)
      os << "    baseline term: min(E_row, kappa_row x s_e), s_e = the element's own floor parts + "
            "half an fp32 ulp at |ref|, kappa_row = max over the row of |baseline - ref| / s_e; "
            "per-element term on "
         << c.own_term_elements << " element(s), E_row on the others\n";
    else
      os << "    baseline term: E_row (16-bit class whose baseline error holds a 16-bit rounding "
            "the candidate inherits: a 16-bit Δ from another out, or FP8 kv dequantized to "
            "16 bits; it spreads over the row, not by each element's own scale)\n";
    if (c.weak_rows > 0) {
      os << "    WEAK: " << c.weak_rows << " of " << c.rows << " rows have a bound above theta "
         << c.theta << " x row scale (largest " << c.weakest << "); rows";
      for (int64_t r : c.weak_row_ids) os << " " << r;
      os << (c.weak_rows > static_cast<int64_t>(c.weak_row_ids.size()) ? " ..." : "") << "\n";
      os << "    weakest row scale " << c.weakest_scale << " (max |ref| " << c.weakest_ref_max
         << ", largest Σ|terms| " << c.weakest_terms << ");";
      parts(" its largest bound", c.at_weakest);
    }
  }
  return os.str();
}

std::string format_violations(const std::vector<TopkViolation>& v, size_t limit) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size() && i < limit; ++i)
    os << "  " << v[i].rule << " row=" << v[i].row << " slot=" << v[i].slot << ": " << v[i].detail
       << "\n";
  if (v.size() > limit) os << "  ... " << (v.size() - limit) << " more violation(s)\n";
  return os.str();
}

std::string format_op_report(const OpReport& r) {
  std::ostringstream os;
  os << "[" << to_string(r.verdict) << "] " << r.backend << " " << r.op;
  if (!r.reason.empty()) os << ": " << r.reason;
  os << "\n";
  if (!r.tensors.empty()) os << format_tensor_checks(r.tensors);
  if (!r.topk_violations.empty()) os << format_violations(r.topk_violations);
  if (r.determinism_checked)
    os << "  determinism (two runs, bitwise): " << (r.determinism_ok ? "identical" : "DIFFER")
       << "\n";
  for (const auto& n : r.not_judged) os << "  not judged: " << n << " (not among the provided outputs)\n";
  for (const auto& n : r.notes) os << "  note: " << n << "\n";
  return os.str();
}

}  // namespace dsa::oracle
