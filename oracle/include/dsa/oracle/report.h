// Judged tensors and op reports: the local rule of SPEC §9 applied to one output, and the
// compact tables every report prints (measured ratio, max abs, rel Frobenius, cosine, each
// bound with its parts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsa/contract/tensor.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/local_bounds.h"
#include "dsa/oracle/metrics.h"

namespace dsa::oracle {

/// The bound of one element and its parts (SPEC §9, with the per-element baseline term):
/// bound = rho_e_row + floor_acc + floor_underflow + floor_round + floor_presink,
/// rho_e_row = ρ · min(E_row, inherited + kappa_row · own_scale) (judge_tensor; inherited 0
/// except for the FP8 sparse MLA 16-bit out and the 16-bit sparse MLA gradients judged
/// without the candidate's own out).
struct ElementBound {
  int64_t flat = -1;
  std::string where;        ///< multi-index, e.g. "[3, 0, 17]"
  int64_t row = -1;         ///< SPEC §9 row (flat / row_len)
  double candidate = 0.0, reference = 0.0, err = 0.0;
  double rho_e_row = 0.0;   ///< ρ · the baseline term used: min(E_row, kappa_row · own_scale)
  double e_row = 0.0;       ///< E_row: the baseline's largest error over the row (SPEC §9)
  /// kappa_row: the baseline's largest error over the row in units of each element's own
  /// scale, max_i |base_i - ref_i| / own_scale_i (inf when some own_scale_i is 0 and the
  /// baseline errs there: the row then uses E_row)
  double kappa_row = 0.0;
  /// own_scale (s_e): the element's own first-order error scale at fp32 accumulation, the
  /// floor parts λ·acc + λ16·narrow + η·underflow + half an fp32 ulp at |ref| (unitless
  /// ratio above: any common factor cancels)
  double own_scale = 0.0;
  bool own_term = false;    ///< true: kappa_row · own_scale < E_row was used (stricter)
  /// FP8 sparse MLA 16-bit out, sparse MLA gradients of a 16-bit kernel judged without its
  /// own out: the exact shift of the float64 reference under the 16-bit rounding the
  /// candidate inherits (kv's dequantization; the baseline's 16-bit Δ), OutputFloor::
  /// inherited16, added to kappa_row · own_scale in the per-element term; else 0
  double inherited = 0.0;
  double floor_acc = 0.0;   ///< λ·acc + λ16·narrow (local_bounds.h; source in TensorCheck)
  double floor_underflow = 0.0;  ///< eta · underflow count (Higham eq. 2.8, flush-to-zero)
  double floor_round = 0.0; ///< half an ulp of the output dtype at |ref| + the other parts
  /// A sink applied after rounding out to 16 bits (judge_tensor's sink_after_rounding): the
  /// first rounding, r · half-ulp16((|ref| + the other parts) / r), r the row's sink factor
  /// (OutputFloor::sink_rescale); 0 otherwise.
  double floor_presink = 0.0;
  /// The max key's probability rounding of a declared normalized-P kernel (part of floor_acc:
  /// λ16 · OutputFloor::narrow_pmax); 0 otherwise.
  double floor_pmax = 0.0;
  double bound = 0.0;
};

/// One output judged by the local rule (SPEC §9).
struct TensorCheck {
  std::string name;           ///< output name, e.g. "dkv"
  DType dtype = DType::F32;   ///< candidate dtype
  DType precision = DType::F32;  ///< table row used: dtype, or the 16-bit working dtype
  TensorMetrics metrics;      ///< candidate vs float64 reference
  double baseline_err = 0.0;  ///< largest E_row (fp32 baseline vs reference)
  /// elements whose baseline term is kappa_row · own_scale (< E_row): the per-element term
  int64_t own_term_elements = 0;
  /// false in the 16-bit classes (precision BF16/F16): E_row everywhere (judge_tensor)
  bool own_term_applies = true;
  /// the per-element term is inherited16_e + kappa_row · own_scale (FP8 kv dequantized to the
  /// 16-bit working dtype, or the baseline's 16-bit Δ: OutputFloor::inherited16), not
  /// kappa_row · own_scale alone
  bool inherited16 = false;
  /// with inherited16: what it measures (OutputFloor::inherited16_source)
  std::string inherited16_source;
  double rho = 0.0, lambda = 0.0, theta = 0.0;  ///< tolerance(op, name, dtype)
  double ratio = 0.0;         ///< max abs error / baseline_err (inf if the baseline is exact)
  double worst = 0.0;         ///< max over elements of err / bound (> 1 fails; inf if bound 0)
  double bound = 0.0;         ///< bound at the worst element (NaN: metrics-only row)
  double max_bound = 0.0;     ///< largest element bound over the tensor (candidate-independent)
  ElementBound largest;       ///< the element with that bound, with its parts
  ElementBound at_worst;      ///< the element with the largest err / bound, with its parts
  std::string floor_source;   ///< where the floor came from (a formula)
  std::string underflow_source;  ///< what the underflow part counts (a formula)
  int64_t failed_elements = 0;
  std::vector<ElementBound> failures;  ///< the first few failing elements
  int64_t rows = 0;           ///< SPEC §9 rows of this output
  int64_t weak_rows = 0;      ///< rows whose bound exceeds theta · rowscale somewhere
  std::vector<int64_t> weak_row_ids;  ///< the first few weak rows
  double weakest = 0.0;       ///< max over rows of max bound / rowscale (≤ theta: not weak)
  ElementBound at_weakest;    ///< the largest bound of the weakest row, with its parts
  int64_t row_len = 1;                ///< elements per row (OutputFloor::row_len)
  std::vector<uint8_t> row_weak;      ///< per row: 1 when weak
  std::vector<double> row_scale;      ///< per row: the scale θ is measured against
  std::vector<double> row_max_bound;  ///< per row: the largest element bound
  double weakest_scale = 0.0; ///< that row's scale = max(max|ref|, κ·Σ|terms|) of the row
  double weakest_ref_max = 0.0, weakest_terms = 0.0;  ///< its parts
  /// The out of a kernel declared to apply the sink after rounding out to 16 bits
  /// (judge_tensor's sink_after_rounding): its bounds carry floor_presink.
  RoundingModel rounding;
  /// Failing elements that an undeclared rounding model would explain: the first rounding of
  /// a sink applied after rounding out (err <= bound + r·half-ulp16(out/r)), the max key's
  /// rounding of a normalized-P kernel, or both; when one of them is every failing element,
  /// the message names the flag that declares it (never a pass by itself).
  int64_t presink_explained = 0, pmax_explained = 0, both_explained = 0;
  bool passed = false;
  std::string message;        ///< why it failed ("" when passed)
};

/// Judges `candidate` (any floating dtype) against `reference` (float64 truth) element by
/// element (SPEC §9): |c - r| <= ρ·B_e + λ·acc_e + λ16·narrow_e + η·underflow_e + h_e
/// (η = the table's eta, underflow_e = OutputFloor::underflow), where
/// B_e = min(E_row, κ_row·s_e) <= SPEC §9's E_row (never looser than SPEC's rule), E_row is
/// the largest error over e's row (row = flat / floor.row_len) of `baseline` (F32, before
/// rounding to the candidate's dtype: that one rounding is h_e), s_e = λ·acc_e +
/// λ16·narrow_e + η·underflow_e + half an fp32 ulp at |r_e| (e's own first-order error scale),
/// κ_row = max over the row of |baseline_i - r_i| / s_i (inf, hence B_e = E_row, when some
/// s_i = 0 with a nonzero baseline error): the baseline's worst error in units of each
/// element's own scale, applied at e's own scale (Higham ch. 3: each element's
/// componentwise error is governed by its own Σ|terms|; one huge column no longer loosens
/// the others, issue 12 F1); in the 16-bit classes (precision BF16/F16) B_e = E_row (the
/// row error the candidate inherits from its 16-bit rounding), and (ρ, λ, θ) =
/// tolerance(op, name, precision), precision = the candidate's dtype, or the floor's 16-bit
/// working dtype when the candidate is wider, and h_e is half an ulp of the candidate's dtype at |r| plus the
/// other parts (its one output rounding). A row is weak when some element's bound exceeds θ·rowscale,
/// rowscale = max(max|ref| over the row, κ·the row's largest Σ|terms|), κ = 3√θ (1 for
/// logit-like outputs, OutputFloor::logit_scale, and at least 2^-100 where fp32 nears its
/// subnormals): a row whose reference cancelled (e.g. dq of a one-key row) is measured
/// against the magnitude of its terms. Fails (never throws) on shape
/// mismatch, non-floating candidate, any NaN/±inf position that differs from the reference,
/// or any element over its bound. Throws std::out_of_range if the table lacks the key and
/// std::invalid_argument if `floor` does not have one entry per element.
/// `delta_shared`: the baseline took Δ from the candidate's own 16-bit out (sparse MLA
/// backward, op_check), so both share Δ and the floor's narrow_delta part (δΔ16, the distance
/// between two 16-bit Δs) is left out of narrow_e; the baseline's E_row carries Δ's rounding.
/// `model.sink_after_rounding` (CheckOptions::rounding): the kernel rounds out to its
/// 16-bit dtype before applying attn_sink, out = fl16(fl32(fl16(o)·r)) with o = out/r and r
/// the row's sink factor (SPEC §4 `out *= exp(lse)/(exp(lse)+exp(sink))` as its own step):
/// on rows with floor.sink_rescale in (0, 1) a 16-bit candidate's bound adds that first
/// rounding, r · half-ulp16((|r_e| + the other parts) / r) (ElementBound::floor_presink), and
/// the WEAK rows are those of that bound. Off, a failure that term would explain is named in
/// the message (TensorCheck::presink_explained).
/// `model.normalized_p`: the max key's rounding, λ16 · floor.narrow_pmax, joins narrow_e.
/// Either model, when `delta_shared` is false: floor.narrow_delta_pmax (normalized_p) or
/// floor.narrow_delta_presink (sink_after_rounding) joins narrow_e (the model's shift of the
/// candidate's Δ, taken from its own out, when the baseline does not share that out); off, a
/// failure it would explain is named in the message (pmax_explained, presink_explained).
/// Throws std::invalid_argument if those have neither 0 nor one entry per element.
TensorCheck judge_tensor(const std::string& op, const std::string& name, const Tensor& candidate,
                         const Tensor& reference, const Tensor& baseline, const OutputFloor& floor,
                         bool delta_shared = false, const RoundingModel& model = {});

/// Verdict of one check of one backend (SPEC §9). Pass and Skip pass; Fail (a bound or a
/// contract rule broken), Weak (some rows' bounds exceed the detection threshold θ of the
/// tolerance table and CheckOptions::allow_weak is off) and Incomplete (an output the op
/// defines was not returned and CheckOptions::provided_outputs does not excuse it) fail.
/// Severity when several apply: Fail > Incomplete > Weak > Pass.
enum class Verdict { Pass, Fail, Skip, Weak, Incomplete };
/// "pass", "FAIL", "skip", "WEAK", "INCOMPLETE".
const char* to_string(Verdict v);

/// One row of a top-k violation list (SPEC §3): rule name, row, slot (-1: whole row/tensor),
/// and the values involved.
struct TopkViolation {
  std::string rule;
  int64_t row = -1;
  int64_t slot = -1;
  std::string detail;
};

/// Report of one op run on one backend: tensors judged, top-k violations, determinism.
struct OpReport {
  std::string backend;
  std::string op;               ///< to_string(Op) or a fixture/op label
  Verdict verdict = Verdict::Pass;
  std::string reason;           ///< skip reason or first failure
  std::vector<TensorCheck> tensors;
  std::vector<TopkViolation> topk_violations;
  bool determinism_checked = false;
  bool determinism_ok = true;
  std::vector<std::string> notes;  ///< conventions applied, counts, etc.
  /// Outputs of the op that were not judged because the user named the outputs the kernel
  /// provides (CheckOptions::provided_outputs) and these are not among them.
  std::vector<std::string> not_judged;
  /// Outputs the op defines that the candidate did not return (Incomplete; every one is named
  /// in `reason`, not only the first).
  std::vector<std::string> missing;
  /// True for a Skip because the check judged no element (reason "judged nothing: ..."): an
  /// empty case, or provided outputs this case does not define. Not a backend's decline.
  bool nothing_judged = false;
  /// True when the backend's call of this op threw NotSupported although it supports the op:
  /// it declined this case (a plugin's DSA_STATUS_UNSUPPORTED, a Python NotImplementedError),
  /// as opposed to an op it does not implement (supports() false: a plain skip). The verdict
  /// is Skip from check_op; judge_fixture_ops then settles it (INCOMPLETE for a proven decline
  /// of a SPEC-mandatory case, fixture_check.h).
  bool declined = false;

  /// True for Pass and Skip; Fail, Weak and Incomplete fail (exit 1 in the CLI).
  bool passed() const { return verdict == Verdict::Pass || verdict == Verdict::Skip; }
  /// Records a failure (keeps the first reason of the most severe verdict).
  void fail(const std::string& why);
  /// Raises the verdict to `v` (Weak or Incomplete) unless a more severe one is set; the
  /// reason is kept from the first verdict of the highest severity.
  void mark(Verdict v, const std::string& why);
  /// One verdict word for a user: "AGREES", "AGREES (partial: max_logits not judged)",
  /// "DISAGREES", "WEAK", "INCOMPLETE", "SKIPPED".
  std::string verdict_line() const;
  /// Names of the judged tensors whose check failed (TensorCheck::passed false: over a bound,
  /// a non-finite position mismatch, a wrong shape or dtype), in the order they were judged.
  /// Empty when every judged tensor passed: a Fail from a top-k rule or a determinism
  /// difference, a Weak or an Incomplete verdict may name none. Throws nothing else than
  /// std::bad_alloc.
  std::vector<std::string> failed_outputs() const;
};

/// The verdict line of several reports (e.g. the forward and backward of one fixture): the
/// most severe verdict; AGREES lists every output not judged; SKIPPED only when all skipped.
std::string verdict_line(const std::vector<OpReport>& reports);

/// Compact table of judged tensors: name, dtype, max_abs, rel_fro, cosine, base_err, ratio,
/// err/bound, verdict (one line each), then per tensor the bound at its worst element with
/// its parts (ρ·E_row, floor and its source, one rounding), failing elements, weak rows.
/// max_abs, rel_fro, cosine, ratio and err/bound are measured over the positions whose
/// NaN/±inf class matches the reference's; a tensor with mismatched positions shows
/// "nonfinite" as its ratio and err/bound and "FAIL (N non-finite position mismatch(es))".
std::string format_tensor_checks(const std::vector<TensorCheck>& checks);
/// Violations one per line ("rule row=r slot=j: detail"), at most `limit` then a count.
std::string format_violations(const std::vector<TopkViolation>& v, size_t limit = 20);
/// Header line + tensor table + violations + determinism for one OpReport.
std::string format_op_report(const OpReport& r);

}  // namespace dsa::oracle
