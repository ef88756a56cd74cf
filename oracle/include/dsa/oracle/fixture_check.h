// Fixture runner (target dsa_oracle_fixtures): one judgement on every route (SPEC §9). A
// fixture's op runs on a candidate (a backend, a plugin, a candidate file, or the fixture's
// own expected.* served by CandidateBackend) and check_op judges it against the float64
// reference on the same OpCase. Backs `dsa-verify fixtures check`, `compare`, `replay` and
// `audit`. Format: docs/fixtures.md.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle {

/// Judging a fixture ran out of memory (std::bad_alloc in the reference, the baseline, the
/// floors or the candidate's run): not a verdict on the candidate, so never a Fail. what():
/// "<file>: out of memory (std::bad_alloc) judging op <op> of <backend> on <inputs and shapes>
/// ...". `partial`: the reports of the fixture's ops judged before it (a failure never loses
/// results already computed); the CLI prints them and exits 2.
class ResourceError : public std::runtime_error {
 public:
  ResourceError(const std::string& what, std::vector<OpReport> partial_reports)
      : std::runtime_error(what), partial(std::move(partial_reports)) {}
  std::vector<OpReport> partial;
};

/// Result of one fixture.
struct FixtureReport {
  std::string case_name, op, producer;
  std::string path;                  ///< the fixture file ("" when built in memory)
  std::vector<std::string> conventions;  ///< convention names applied to expected.*
  /// The producer's expected.* judged as a candidate by check_op, one report per op (the
  /// same rule as every backend); only the outputs it stores are judged.
  std::vector<OpReport> producer_vs_reference;
  /// check_op on the backend for each op the fixture covers; empty without a backend.
  std::vector<OpReport> backend_vs_reference;
  bool passed() const;
};

/// Builds the OpCase of a fixture (windows from ks/ke when present, else full; params
/// sm_scale, d_v, k, tie_break, sorted, mode, coeff, each required by its op: none has a
/// default, since each changes the judgement) with its own memo (OpCase::memo: every
/// candidate judged on it shares the reference results, baselines and floors). Throws fixtures::FileError naming the
/// fixture's path (its case name when built in memory) and a missing tensor or parameter.
OpCase op_case_from_fixture(const fixtures::Fixture& f);

/// Ops a fixture's `op` string covers ("sparse_mla_fwd+bwd" → fwd, bwd). Throws
/// fixtures::FileError on an unknown op string.
std::vector<Op> fixture_ops(const fixtures::Fixture& f);

/// The fixture's expected.* served as a candidate ("producer" backend) with the fixture's
/// structured conventions; free-text convention_notes are never applied.
CandidateBackend expected_candidate(const fixtures::Fixture& f);

/// check_op of `candidate` for every op of `f` on op_case_from_fixture(f) with `opt`: the
/// one judging function behind every route. Backend::provided_outputs (a plugin's
/// declaration) narrows opt.provided_outputs (intersection); Backend::rounding_model (a
/// plugin's rounding_models) joins opt.rounding (either declares). For a CandidateBackend (stored outputs), an op
/// of which it stores no output is Incomplete, or not judged (Skip, names in not_judged)
/// when opt.provided_outputs names none of that op's outputs. An op the backend declines
/// (NotSupported from its call although it supports the op: OpReport::declined) is
/// INCOMPLETE when the case holds SPEC-mandatory features (top-k: ties at the k-th value, NaN
/// or -inf scores; sparse MLA: invalid ids, empty rows, duplicate ids; keys as the property
/// suite's) not named in opt.unsupported and the backend runs the case's twin without them
/// (the decline is about them); otherwise a Skip whose reason begins "declined: " and says why
/// it is not INCOMPLETE (a limit declared up front, no mandatory feature, the twin declined
/// too). An op the backend does not support is a Skip "op ... not supported". Throws
/// ResourceError (with the reports of the ops judged before) when judging an op runs out of
/// memory.
std::vector<OpReport> judge_fixture_ops(const fixtures::Fixture& f, Backend& candidate,
                                        const CheckOptions& opt = {});
/// Same on a case already built by op_case_from_fixture(f): a caller judging several
/// candidates on one file builds it once, so they share its reference results (issue 13).
std::vector<OpReport> judge_fixture_ops(const fixtures::Fixture& f, const OpCase& c,
                                        Backend& candidate, const CheckOptions& opt = {});

/// True when a decline of op on case `c` by `b` (NotSupported from its call) depends on the
/// values, not on a limit of the kernel: `c` is a sparse MLA forward or backward case (inputs
/// c.mla, and c.dout for the backward) of k >= 1 slots holding no SPEC-mandatory feature
/// (invalid ids, empty rows, duplicate ids), and `b` runs its twin: the same case (shapes,
/// dtypes, optional inputs) with the last slot of row 0 set to -1 (SPEC §4: an invalid id
/// contributes nothing). Runs that twin once on `b` (not judged; any result counts as run, a
/// decline or any other error as not run). False for other ops, k = 0, or a case with a
/// mandatory feature (those have twins without them: judge_fixture_ops). Used by
/// judge_fixture_ops (the op is INCOMPLETE) and the property suite (the draw fails,
/// docs/what-a-pass-means.md Verdicts; fresh11 F10). Throws std::bad_alloc when the twin's run
/// runs out of memory; nothing else.
bool decline_depends_on_values(Backend& b, Op op, const OpCase& c);

/// Judges the producer's expected.* (judge_fixture_ops on expected_candidate with
/// provided_outputs = the stored expected names, no determinism run) and, when `backend` is not
/// null, the backend (judge_fixture_ops with `opt`). Never throws for numeric disagreement;
/// throws FileError on malformed fixtures.
FixtureReport check_fixture(const fixtures::Fixture& f, Backend* backend = nullptr,
                            const CheckOptions& opt = {});
/// Same on a case already built by op_case_from_fixture(f) (shared with later
/// judge_fixture_ops calls on the same file).
FixtureReport check_fixture(const fixtures::Fixture& f, const OpCase& c, Backend* backend,
                            const CheckOptions& opt = {});

/// The most severe verdict of one candidate's op reports (Fail > Incomplete > Weak > Pass >
/// Skip): Skip only when every op was skipped. The matching words: verdict_line (report.h).
Verdict overall_verdict(const std::vector<OpReport>& reports);

/// Multi-line report: one header, then each op report (producer first, then backend).
std::string format_fixture_report(const FixtureReport& r);

}  // namespace dsa::oracle
