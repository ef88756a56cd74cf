// The audit report: case results, the terminal progress line, the summary table, and the
// JSON and JUnit XML writers used by `dsa-verify audit`.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsa::cli {

/// One audited case: a property run, a golden fixture or a peer fixture for one op.
struct CaseResult {
  std::string op;        ///< e.g. "sparse_mla_fwd"
  std::string property;  ///< e.g. "empty_rows", "golden:smla_sink"
  std::string status;    ///< "pass" | "fail" | "skip" | "interrupted" (SIGINT/SIGTERM, no verdict)
  /// Outputs of the op that were not judged (--outputs, a plugin's provided_outputs): a pass
  /// with any is partial, and the table, progress line, JSON and JUnit say so.
  std::vector<std::string> not_judged;
  /// Worst measured err(candidate) / err(baseline) over the judged tensors (the "ratio" column
  /// of compare's tables; SPEC §9 "measured ratio"), not err / bound.
  double worst_ratio = 0.0;
  bool has_ratio = false;    ///< false when the case measures no ratio (properties)
  /// Worst err / bound over the judged tensors' elements (SPEC §9; > 1 fails); valid with has_ratio.
  double worst_err_over_bound = 0.0;
  /// Positions of the judged tensors whose NaN/+inf/-inf class differs from the reference's
  /// (TensorMetrics::nonfinite_mismatches summed; SPEC §9: must be 0). When > 0 the ratio and
  /// err/bound above, measured over the positions that match, do not show the failure: the
  /// table prints "nonfinite" in their columns (fresh18 F4).
  int64_t nonfinite_mismatches = 0;
  int64_t cases = 0;     ///< generated cases (properties) or tensors (fixtures)
  std::string message;   ///< failure or skip reason
  std::string repro;     ///< one-line reproduction command
  std::string fixture;   ///< path of the dumped failing case, if any
  double seconds = 0.0;
};

/// A case with op, property and status set, everything else empty.
CaseResult make_case(std::string op, std::string property, std::string status);

/// "partial: lse, max_logits not judged" for a pass with outputs not judged, else "".
std::string partial_note(const CaseResult& c);

/// Progress on stderr: a redrawn bar on a terminal, one plain line per case otherwise. A
/// pass carries its partial note ("(partial: max_logits not judged)") and, when its message
/// starts with "skip: ", the ops of the task that did not run ("(skip: sparse_mla_bwd)").
class Progress {
 public:
  explicit Progress(size_t total);
  void update(const CaseResult& finished);
  void finish();

 private:
  size_t total_, done_ = 0, failed_ = 0, partial_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

/// Summary table (op × property → result, worst err/base_err ratio, worst err/bound, cases;
/// result "partial" for a pass with outputs not judged; "nonfinite" in both error columns of a
/// case with non-finite position mismatches), the skip and partial reasons, then every failure
/// with its reproduction and dumped fixture. Written to `out`.
void print_summary(std::FILE* out, const std::string& backend, const std::vector<CaseResult>& cases);
/// The full report as JSON.
nlohmann::json to_json(const std::string& backend, const std::vector<CaseResult>& cases);
/// JUnit XML (testsuites/testsuite/testcase with failure/skipped elements), one testsuite per op.
/// A partial pass is named "PROPERTY [partial: X not judged]" and carries the same note in
/// its system-out, so a CI reader sees it.
std::string to_junit(const std::string& backend, const std::vector<CaseResult>& cases);
/// Writes text to a file atomically (a temporary file beside it, renamed over it: the file holds
/// the whole previous or the whole new text, never a truncated one); a path that exists and is
/// not a regular file (/dev/stdout, a pipe) is written in place. Throws std::runtime_error
/// naming the path on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace dsa::cli
