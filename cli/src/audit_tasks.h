// The units of work of `dsa-verify audit`, shared with the Python module (python/): one task
// per property of the suite and one per fixture file, each yielding the CaseResults that the
// summary table, the JSON and the JUnit report print. Judgement: check_fixture / run_property.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/report.h"
#include "dsa/property_tests/suite.h"
#include "report.h"

namespace dsa::cli {

/// A fixture task that ran out of memory (oracle::ResourceError): no verdict on the kernel.
/// `results`: the cases of the ops judged before it (kept, never lost); what(): the
/// ResourceError's message (file, op, backend, input shapes). The audit reports both, exit 2.
struct TaskResourceError : std::runtime_error {
  TaskResourceError(const std::string& what, std::vector<CaseResult> done)
      : std::runtime_error(what), results(std::move(done)) {}
  std::vector<CaseResult> results;
};

/// One unit of audit work: produces one or more case results when run.
struct AuditTask {
  std::string op, property;
  std::function<std::vector<CaseResult>()> run;
};

/// How reproduction lines name the audited kernel (the CLI: `--backend NAME` / `--plugin PATH`;
/// the Python module: `python3 -m dsa_verify ... module:Class`).
struct ReproCommands {
  /// Prefix of a property re-run, e.g. "dsa-verify audit --backend reference"; the task
  /// appends " --only PROPERTY --level N".
  std::string audit;
  /// Command re-running one fixture file, e.g. "dsa-verify replay F --backend reference".
  std::function<std::string(const std::string& fixture)> replay;
};

/// Report status of an oracle verdict: "pass" | "fail" | "skip".
std::string status_of(oracle::Verdict v);
/// Largest finite measured ratio over the judged tensors (0 when none).
double worst_ratio(const oracle::OpReport& r);
/// Largest err / bound over the judged tensors' elements (TensorCheck::worst; 0 when none).
double worst_err_over_bound(const oracle::OpReport& r);
/// Non-finite position mismatches over the judged tensors (TensorMetrics::nonfinite_mismatches
/// summed; SPEC §9: a pass needs 0). 0 when none or no tensor was judged.
int64_t nonfinite_mismatches(const oracle::OpReport& r);
/// Sets the measured columns of `c` from the judged op `r`: worst_ratio, worst_err_over_bound,
/// nonfinite_mismatches, and has_ratio (true when r judged a tensor). Throws nothing.
void set_measured(CaseResult& c, const oracle::OpReport& r);
/// Outputs of `p`'s ops that `provided` (--outputs, a plugin's declaration) leaves out, in
/// op_output_names order: what a passing property did not judge. Empty when `provided` is unset;
/// an op none of whose outputs it names adds nothing (judged in full: oracle::provided_outputs_for).
std::vector<std::string> not_judged_outputs(const props::Property& p,
                                            const std::optional<std::set<std::string>>& provided);
/// The .safetensors files of `dir`, sorted (empty when `dir` is not a directory).
std::vector<std::string> list_fixtures(const std::string& dir);
/// Checks the fixture directories an audit judges, before it runs: each must be a directory
/// and at least one must hold a fixture (a *.safetensors file, list_fixtures), else
/// std::invalid_argument naming both and DSA_FIXTURES_DIR: an audit whose fixtures all went
/// missing is a wrong DSA_FIXTURES_DIR, never a silent pass of the properties alone (fresh-user
/// F9; --only runs properties without fixtures). Returns one note per directory that holds none
/// while the other does ("no golden fixture (*.safetensors) in DIR: ..."), for the caller to print.
std::vector<std::string> check_fixture_dirs(const FixtureDirs& dirs);
/// True when `op` is selected by --ops (every op when empty).
bool op_selected(const AuditOptions& o, const std::string& op);
/// The ops --ops selects (empty when --ops is not given: every op), for SuiteOptions::ops.
std::vector<oracle::Op> selected_ops(const AuditOptions& o);
/// True when property `p` is selected by --only and --ops (every op it needs is selected).
bool property_selected(const AuditOptions& o, const props::Property& p);

/// Fixture tasks: one per file of `dir`; each yields one case per selected op the fixture
/// covers (check_fixture on `backend`), plus a failed case when the reference disagrees with
/// the producer. A task that runs out of memory throws TaskResourceError with the cases judged
/// before it. `backend` and `opts` must outlive the tasks.
void add_fixture_tasks(std::vector<AuditTask>& tasks, const std::string& dir, const std::string& kind,
                       oracle::Backend& backend, const AuditOptions& opts, const ReproCommands& repro);
/// Property tasks: one per selected property of the suite (run_property on `subject`).
/// `subject` and `opts` must outlive the tasks.
void add_property_tasks(std::vector<AuditTask>& tasks, const props::Subject& subject,
                        const AuditOptions& opts, const ReproCommands& repro);

/// Unknown op or property names are usage errors (std::invalid_argument naming the argument
/// '--ops' / '--only' and the expected values), not an empty (and green) audit; so is an
/// --only property whose ops --ops does not all select (naming both, the ops missing and the
/// properties --ops leaves to choose from).
void validate_selection(const AuditOptions& o);

}  // namespace dsa::cli
