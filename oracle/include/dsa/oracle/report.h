// Judged tensors and op reports: the ratio rule of SPEC §9 applied to one output, and the
// compact tables every report prints (measured ratio, max abs, rel Frobenius, cosine).
#pragma once

#include <string>
#include <vector>

#include "dsa/contract/tensor.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/metrics.h"

namespace dsa::oracle {

/// One output judged by the ratio rule (SPEC §9).
struct TensorCheck {
  std::string name;           ///< output name, e.g. "dkv"
  DType dtype = DType::F32;   ///< candidate dtype
  TensorMetrics metrics;      ///< candidate vs float64 reference
  double baseline_err = 0.0;  ///< max abs error of the baseline rounded to `dtype`
  double rho = 0.0;
  double floor = 0.0;         ///< absolute floor (tolerances.h: floor_abs)
  double term_scale = 0.0;    ///< term magnitude the floor was scaled by (0: none)
  double bound = 0.0;         ///< rho · baseline_err + floor
  double ratio = 0.0;         ///< measured err(candidate) / err(baseline) (inf if baseline exact)
  bool passed = false;
  std::string message;        ///< why it failed ("" when passed)
};

/// Judges `candidate` (any floating dtype) against `reference` (float64 truth) with the
/// baseline (Precision::Baseline output, F32, unrounded): the baseline is rounded to the
/// candidate's dtype (Tensor::to; kept as is when the candidate is F64), then
/// err(candidate) <= rho·err(baseline) + floor with (rho, floor) = tolerance(op, name, dtype).
/// Fails (never throws) on shape mismatch, non-floating candidate, or any NaN/±inf position
/// that differs from the reference. Throws std::out_of_range if the table lacks the key.
/// `term_scale`: bound on the magnitude of the terms summed into this output (see
/// tolerances.h); 0 = use the reference's own magnitude only.
TensorCheck judge_tensor(const std::string& op, const std::string& name, const Tensor& candidate,
                         const Tensor& reference, const Tensor& baseline, double term_scale = 0.0);

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
};

/// The verdict line of several reports (e.g. the forward and backward of one fixture): the
/// most severe verdict; AGREES lists every output not judged; SKIPPED only when all skipped.
std::string verdict_line(const std::vector<OpReport>& reports);

/// Compact table of judged tensors: name, dtype, max_abs, rel_fro, cosine, base_err, ratio,
/// bound, verdict (one line each).
std::string format_tensor_checks(const std::vector<TensorCheck>& checks);
/// Violations one per line ("rule row=r slot=j: detail"), at most `limit` then a count.
std::string format_violations(const std::vector<TopkViolation>& v, size_t limit = 20);
/// Header line + tensor table + violations + determinism for one OpReport.
std::string format_op_report(const OpReport& r);

}  // namespace dsa::oracle
