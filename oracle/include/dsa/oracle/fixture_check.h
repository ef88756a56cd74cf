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
  /// expected.* tensors that are no output of the fixture's ops (op_output_names), e.g. a
  /// peer's `out_bf16`: never judged, so every route says so (a note on the first producer
  /// report; `fixtures check` a note line and JSON "not_outputs")
  std::vector<std::string> not_outputs;
  /// Tensors without the expected. prefix that the fixture's op never reads (fixture_input_
  /// names), e.g. a peer's unprefixed `out_bf16`: said alike (fresh21), never silently dropped
  std::vector<std::string> not_inputs;
  /// The producer's expected.* judged as a candidate by check_op, one report per op (the
  /// same rule as every backend); only the outputs it stores are judged.
  std::vector<OpReport> producer_vs_reference;
  /// check_op on the backend for each op the fixture covers; empty without a backend.
  std::vector<OpReport> backend_vs_reference;
  bool passed() const;
};

/// The input tensor names op `op` (a fixture's op string, e.g. "sparse_mla_fwd+bwd") reads,
/// optional ones included (docs/fixtures.md "Tensor names per op"); empty for an unknown op.
const std::vector<std::string>& fixture_input_names(const std::string& op);

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
/// INCOMPLETE when decline_cause(candidate, op, case, opt.unsupported) proves it is about the
/// values (the backend runs a twin with other values keeping every feature, the case's twin
/// without a SPEC-mandatory feature not named in opt.unsupported, or, with none, its twin with
/// other values); otherwise a Skip whose reason
/// begins "declined: " and says why it is not INCOMPLETE (a limit declared up front, named
/// unsupported, no mandatory feature, the twins declined too). An op the backend does not support is a Skip "op ... not supported". Throws
/// ResourceError (with the reports of the ops judged before) when judging an op runs out of
/// memory.
std::vector<OpReport> judge_fixture_ops(const fixtures::Fixture& f, Backend& candidate,
                                        const CheckOptions& opt = {});
/// Same on a case already built by op_case_from_fixture(f): a caller judging several
/// candidates on one file builds it once, so they share its reference results (issue 13).
std::vector<OpReport> judge_fixture_ops(const fixtures::Fixture& f, const OpCase& c,
                                        Backend& candidate, const CheckOptions& opt = {});

/// SPEC §10 clean twins: `in` with every part no valid read uses made ordinary, the parts read
/// kept bit for bit. FP8 indexer: keys outside every window (k_idx bytes 0, k_scale 1); paged
/// indexer: slots no context reads (k_cache bytes 0, k_scale_cache 1) and table entries past a
/// context (block 0); FP8 sparse MLA: cache tokens no valid slot reads (slot j < topk_length,
/// id in [0, tokens)), NoPE and RoPE bytes 0, tile scales 1. Shapes and dtypes as `in` (SPEC
/// §10 layouts; the inputs are assumed validated). No errors. The twin of the poisoned_unread
/// feature in decline_cause, and of the §10 properties' draws (property_tests/fp8_props.cpp).
Fp8IndexerInputs clean_unread(const Fp8IndexerInputs& in);
PagedIndexerInputs clean_unread(const PagedIndexerInputs& in);
SparseMlaFp8Inputs clean_unread(const SparseMlaFp8Inputs& in);

/// True when `in` differs from clean_unread(in) in some byte: its unread parts hold anything
/// but the ordinary values (SPEC §10 lets them hold anything; the feature poisoned_unread).
bool holds_poisoned_unread(const Fp8IndexerInputs& in);
bool holds_poisoned_unread(const PagedIndexerInputs& in);
bool holds_poisoned_unread(const SparseMlaFp8Inputs& in);

/// What the twin test found about a decline of a case (decline_cause).
/// Feature keys as the property suite's draw features (property_tests/src/suite.cpp kFeatures).
struct DeclineCause {
  /// The SPEC-mandatory features the case holds: top-k k_boundary_ties, neg_inf_scores,
  /// nan_scores (§3.1-§3.3); sparse MLA invalid_ids, empty_rows, duplicate_ids (§4, §6); KL loss
  /// neg_inf_scores, empty_windows (§1, §7); indexer and its backward empty_windows,
  /// negative_weights (§1, §2); FP8 indexer those and poisoned_unread; paged indexer
  /// short_context (a context shorter than next_n, §1, §10), negative_weights, poisoned_unread;
  /// FP8 sparse MLA those of sparse MLA and poisoned_unread (§10).
  std::vector<std::string> held;
  /// Features the decline depends on that `unsupported` does not name: the op is INCOMPLETE.
  std::vector<std::string> depends_on;
  /// Features the decline depends on that `unsupported` names (a skip naming them when
  /// depends_on is empty; beside depends_on otherwise).
  std::vector<std::string> waived;
  /// The backend ran a twin with other values that keeps every feature the case holds (or, with
  /// none, top-k's other finite scores, sparse MLA's one id of row 0 set to -1): INCOMPLETE,
  /// nothing to name.
  bool by_values = false;
  /// The twin the backend ran, in words ("" when none ran).
  std::string twin;
  /// When the decline depends on nothing: why not (the twin declined too, no twin, ...).
  std::string not_shown;
  /// True when the decline is proven to be about the values: by_values or depends_on.
  bool incomplete() const { return by_values || !depends_on.empty(); }
};

/// The twin test of a decline (NotSupported) of op on case `c` by `b`: one judgement for every
/// route (fixtures check, replay, the audit's fixture tasks and properties; plugin, in-process,
/// Python). Ops: Topk (c.scores [s_q, s_kv] f32/bf16, c.k, c.policy, c.topk_windows),
/// SparseMlaFwd / SparseMlaBwd (c.mla, c.dout), SparseMlaFp8Fwd (c.mla_fp8), IndexerKlLoss
/// (c.kl), Fp8IndexerScores, PagedIndexerScores, IndexerScores and IndexerScoresBackward
/// (c.q_idx, c.k_idx, c.w, c.windows, c.d_scores). Twins keep shapes, dtypes, optional inputs,
/// k, policy and (but for the empty_windows / short_context twins) windows.
/// 1. Paged indexer and FP8 sparse MLA, whose checks also run the case with unread parts
///    poisoned: when `b` runs the case as given, the decline is laid to poisoned_unread.
/// 2. A twin with other values keeping every feature the case holds (top-k: window entries
///    reversed, finite scores replaced by their ranks; sparse MLA: key rows / tokens moved by
///    one with ids relabelled, query rows reversed; KL: finite scores times -1/2, heads reversed; indexers:
///    heads reversed, w times -1/2 when it holds both signs else 1/2 (negative_weights
///    kept), paged blocks moved by one, the backward's d_scores times -1/2): run → by_values
///    (fresh11 F2).
/// 3. No feature: the value twin (top-k: distinct finite scores s_kv - s; sparse MLA: the last
///    slot of row 0 set to -1, SPEC §4); run → by_values; else not shown (a limit).
/// 4. One twin per feature, that feature taken out and every other kept as far as it can be
///    (top-k: -inf or NaN entries made distinct finite values below every finite score, or
///    finite entries made distinct in row order; sparse MLA: repeated ids, invalid slots or
///    empty rows' slot 0 given ids unused in the row, of finite kv rows / ordinary tokens first,
///    topk_length widened; KL: -inf scores made finite; §10: unread parts cleaned, FP8 bytes 0,
///    scales 1, entries past a context 0; negative_weights: w made |w|; empty_windows: each
///    empty window widened to one key (KL: its score -inf, the row still without a term; FP8: a
///    key another window reads, else one made ordinary); short_context: each context shorter
///    than next_n lengthened to next_n, the added positions reading ordinary slots; fresh15
///    F2); the features a twin the backend runs no longer holds
///    are what the decline depends on (indexer and KL ops: but for another feature such a twin
///    had to take out with its own whose own twin the backend declined). When no such twin runs, the twin without them all (top-k:
///    distinct finite scores; sparse MLA: ids 0..k-1, non-finite q, kv, dout zeroed; indexers
///    and KL: each feature's change in turn) lays it to all of them.
/// A twin run whose features `unsupported` (--unsupported keys; empty_rows through invalid_ids as
/// unsupported_covers) covers waives the decline; else depends_on lists the features of the
/// twins run that it does not cover. Runs `b` once per twin (not judged; a result counts as run,
/// a decline or any other error as not run), at most one per feature plus three. Throws
/// std::bad_alloc when a twin's run runs out of memory; nothing else. Rule:
/// docs/what-a-pass-means.md Verdicts (fresh11 F10, F2, fresh12 F8, F6).
DeclineCause decline_cause(Backend& b, Op op, const OpCase& c, const std::vector<std::string>& unsupported = {});

/// The words for a mandatory feature key of DeclineCause ("-inf scores (never selected, -1
/// slots; SPEC §3.1-§3.2)"); the key itself for an unknown one. Throws nothing.
std::string decline_feature_words(const std::string& key);

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
