#include "dsa/oracle/report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

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

TensorCheck judge_tensor(const std::string& op, const std::string& name, const Tensor& candidate,
                         const Tensor& reference, const Tensor& baseline, double term_scale) {
  TensorCheck c;
  c.name = name;
  c.dtype = candidate.dtype();
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
  const Tolerance& tol = tolerance(op, name, candidate.dtype());
  const Tensor base = candidate.dtype() == DType::F64 ? baseline : baseline.to(candidate.dtype());
  c.baseline_err = base.shape() == reference.shape() ? max_abs_error(base, reference) : INFINITY;
  c.rho = tol.rho;
  c.term_scale = term_scale;
  c.floor = floor_abs(tol, c.metrics.ref_max_abs, term_scale);
  c.bound = c.rho * c.baseline_err + c.floor;
  const double err = c.metrics.max_abs;
  c.ratio = c.baseline_err > 0 ? err / c.baseline_err : (err > 0 ? INFINITY : 0.0);
  if (c.metrics.nonfinite_mismatches > 0) {
    c.message = std::to_string(c.metrics.nonfinite_mismatches) +
                " non-finite position mismatch(es), first " + c.metrics.first_mismatch;
    return c;
  }
  if (!(err <= c.bound)) {
    std::ostringstream os;
    os << "max abs error " << err << " > bound " << c.bound << " (rho " << c.rho
       << " x baseline " << c.baseline_err << " + floor " << c.floor << ")";
    c.message = os.str();
    return c;
  }
  c.passed = true;
  return c;
}

std::string format_tensor_checks(const std::vector<TensorCheck>& checks) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %-5s %10s %10s %10s %10s %8s %10s %s\n", "tensor",
                "dtype", "max_abs", "rel_fro", "cosine", "base_err", "ratio", "bound", "verdict");
  os << line;
  for (const auto& c : checks) {
    // Rows judged by metrics only (no baseline, no bound) show "-" and say so in the verdict.
    const bool metrics_only = std::isnan(c.bound);
    char base[16] = "-", ratio[16] = "-", bound[16] = "-";
    if (!metrics_only) {
      std::snprintf(base, sizeof base, "%.3e", c.baseline_err);
      std::snprintf(ratio, sizeof ratio, "%.3g", c.ratio);
      std::snprintf(bound, sizeof bound, "%.3e", c.bound);
    }
    std::snprintf(line, sizeof line, "  %-12s %-5s %10.3e %10.3e %10.7f %10s %8s %10s %s\n",
                  c.name.c_str(), dtype_name(c.dtype), c.metrics.max_abs, c.metrics.rel_fro,
                  c.metrics.cosine, base, ratio, bound,
                  c.passed ? (metrics_only ? "pass (non-finite positions only)" : "pass") : "FAIL");
    os << line;
    if (!c.passed) os << "    -> " << c.message << "\n";
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
