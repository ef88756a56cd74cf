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
  double worst_ratio = 0.0;  ///< worst measured err(candidate)/err(baseline) over judged tensors
  bool has_ratio = false;    ///< false when the case measures no ratio (properties)
  int64_t cases = 0;     ///< generated cases (properties) or tensors (fixtures)
  std::string message;   ///< failure or skip reason
  std::string repro;     ///< one-line reproduction command
  std::string fixture;   ///< path of the dumped failing case, if any
  double seconds = 0.0;
};

/// A case with op, property and status set, everything else empty.
CaseResult make_case(std::string op, std::string property, std::string status);

/// Progress on stderr: a redrawn bar on a terminal, one plain line per case otherwise.
class Progress {
 public:
  explicit Progress(size_t total);
  void update(const CaseResult& finished);
  void finish();

 private:
  size_t total_, done_ = 0, failed_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

/// Summary table (op × property → status, worst ratio, cases) then every failure with its
/// reproduction and dumped fixture. Written to `out`.
void print_summary(std::FILE* out, const std::string& backend, const std::vector<CaseResult>& cases);
/// The full report as JSON.
nlohmann::json to_json(const std::string& backend, const std::vector<CaseResult>& cases);
/// JUnit XML (testsuites/testsuite/testcase with failure/skipped elements), one testsuite per op.
std::string to_junit(const std::string& backend, const std::vector<CaseResult>& cases);
/// Writes text to a file; throws std::runtime_error naming the path on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace dsa::cli
