// The property suite as a library: properties written once against dsa::oracle::Backend and
// run for any subject (a registered backend or a mutant), plus the mutation analysis. The
// gtest executables (label prop) and the CLI (`dsa-verify audit`) both call this API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dsa/oracle/backend.h"
#include "dsa/oracle/dsa_block.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"

namespace dsa::props {

/// What the suite runs against: a backend factory and the block runner used for §8.
struct Subject {
  std::string name;
  std::function<std::unique_ptr<oracle::Backend>()> make;
  oracle::BlockFactory block = oracle::default_block_factory();
  std::string fault;  ///< mutants: the field fault imitated (one line); empty for real backends
  std::string focus;  ///< property-name prefix to run first ("topk.", "smla.", ...)
};

/// One property: a RapidCheck body (uses RC_ASSERT) over a live backend and block factory.
struct Property {
  std::string name;              ///< "<op family>.<rule>", e.g. "topk.neg_inf_to_minus_one"
  std::vector<oracle::Op> ops;   ///< ops the backend must support, else the property is skipped
  int cost = 1;                  ///< divides the case count (expensive properties run fewer)
  std::function<void(oracle::Backend&, const oracle::BlockFactory&)> body;
  int min_level = 0;             ///< below this DSA_TEST_LEVEL the property is a skip (cost)
  /// A draw feature (draw_feature_keys()) the property is about, e.g. "k_boundary_ties" for
  /// topk.ties_resolved_bitwise: a run that judged no draw with it is a skip saying so, never a
  /// pass (fresh-user F4). Empty: none. Value-initialised (`{}`), so an aggregate initialiser
  /// that stops before it ({name, ops, cost, body}) leaves no member without an initialiser
  /// (-Wmissing-field-initializers).
  std::string needs{};
  /// A rounding model (oracle::RoundingModel field name: "normalized_p", "sink_after_rounding")
  /// the property checks: it runs only for a subject that declares it (Backend::rounding_model
  /// or SuiteOptions::check.rounding), else it is a skip saying so. Empty: runs for every subject.
  std::string declared_model{};
};

/// True when `m` declares the model named `name` ("normalized_p", "sink_after_rounding"); an
/// empty name is declared by every model. Throws std::invalid_argument naming an unknown name.
bool declares(const oracle::RoundingModel& m, const std::string& name);

/// The draw feature keys (note_draw_feature) in a fixed order, mandatory ones first.
const std::vector<std::string>& draw_feature_keys();
/// True for SPEC behaviour every kernel must handle (invalid_ids, empty_rows, duplicate_ids: §4/§6;
/// neg_inf_scores, nan_scores: §3.1; k_boundary_ties: §3.3; poisoned_unread: §10; empty_windows:
/// §1/§6/§7; negative_weights: §2; short_context: §1/§10); false for optional inputs.
bool mandatory_feature(const std::string& key);
/// One line naming the feature and its SPEC rule, e.g. "invalid ids (-1, negative, >= s_kv;
/// SPEC §4)". Throws std::invalid_argument naming an unknown key.
std::string feature_description(const std::string& key);
/// Checks a list of what a kernel leaves out (--unsupported): each entry a feature key, a
/// property name or a family ("smla"). Throws std::invalid_argument naming the first unknown
/// entry and the accepted keys.
void validate_unsupported(const std::vector<std::string>& names);

/// Every property, in file order (topk, indexer, sparse MLA, KL loss, block).
const std::vector<Property>& all_properties();

/// Case count per property at a level: DSA_TEST_LEVEL 0 (CI) / 1 / 2 (soak).
int cases_for_level(int level, int cost);
/// DSA_TEST_LEVEL from the environment (default 0; clamped to 0..2).
int env_test_level();

struct SuiteOptions {
  int level = 0;
  uint64_t seed = 0;          ///< 0: RapidCheck's configured seed (RC_PARAMS) or a random one
  bool shrink = true;
  bool dump = true;           ///< dump failing cases as fixtures into dump_dir
  std::string dump_dir;       ///< "" → $DSA_DUMP_DIR or build/failures
  bool stop_at_first_failure = false;
  bool quiet = false;         ///< no RapidCheck end-of-process reproduce summary (mutants)
  std::vector<std::string> only;  ///< property names or families ("topk") to run (empty: all)
  std::string repro_command;  ///< printed in repro lines (e.g. the test binary + filter)
  std::ostream* log = nullptr;    ///< progress and failure messages
  /// Options of every check a property makes (oracle::ScopedCheckDefaults): the audit's
  /// --outputs and --allow-weak.
  oracle::CheckOptions check;
  /// Ops the run may judge (the audit's --ops; empty: every op). A property judges an
  /// optional op (a forward property's backward part) only when it is listed here.
  std::vector<oracle::Op> ops;
  /// What the user says the kernel leaves out (the audit's --unsupported): feature keys
  /// (draw_feature_keys) or property names / families. A declined mandatory behaviour so named
  /// does not make the property INCOMPLETE; the message still says it was not judged.
  std::vector<std::string> unsupported;
  /// Polled at the start of every draw and every shrink step (e.g. the audit's "a SIGINT or
  /// SIGTERM arrived"). Once it returns true, each remaining draw and shrink step returns at
  /// once, without drawing a case or calling the backend, so the property ends after the call
  /// that was running. The result is then `stopped`: a failure found before the stop stays a
  /// Fail (its case is a real counterexample, possibly less shrunk); anything else is a Skip
  /// ("stopped ... not a verdict"). Empty: never stops. Must not throw.
  std::function<bool()> stop_requested;
};

struct PropertyResult {
  std::string subject, property;
  oracle::Verdict verdict = oracle::Verdict::Pass;
  int cases = 0;
  std::string message;  ///< RapidCheck's failure description (shrunk case, assertion)
  std::string repro;    ///< one-line reproduction (RC_PARAMS + DSA_TEST_LEVEL + command)
  std::string dumped;   ///< path of the dumped fixture, if any
  /// The op whose check failed in the reported (last failing) case when a report assertion
  /// failed (e.g. sparse_mla_bwd inside a forward property); unset for other failures.
  std::string failed_op;
  /// Draws made before any failure (judged + declined; shrinking not counted) and the draws
  /// the backend declined (NotSupported: discarded, another drawn; RapidCheck gives up after
  /// 10 declines per required draw, and stops drawing after 100 declines with none judged).
  int drawn = 0, declined = 0;
  /// Draws that judged nothing (an empty case such as top-k k = 0, or only outputs the draw
  /// does not define): discarded and redrawn, not counted in `drawn` nor as declines.
  int judged_nothing = 0;
  /// Why draws were declined: the most frequent reasons with their counts.
  std::string declined_why;
  /// SPEC-mandatory behaviour the backend declined and the user did not name as unsupported
  /// (feature keys): the property judged some draws, but every draw with the feature that the
  /// backend declined without an optional input in it, and none with it was judged. Non-empty
  /// makes the verdict Fail with a message beginning "INCOMPLETE:". A property of which no draw
  /// was judged is a Skip (reasons in the message), never INCOMPLETE.
  std::vector<std::string> mandatory_declined;
  /// Declined mandatory behaviour the user named (--unsupported): not judged, not a failure.
  std::vector<std::string> waived;
  /// SuiteOptions::stop_requested returned true before the property finished its draws.
  bool stopped = false;
};

/// Runs one property against a subject (skip when unavailable / op not supported / a rounding
/// model the property checks not declared). Its checks judge with the models either
/// SuiteOptions::check.rounding or the subject's backend declares (Backend::rounding_model), as
/// the audit does.
PropertyResult run_property(const Subject& s, const Property& p, const SuiteOptions& o);
/// Runs every property (the subject's focus prefix first when stop_at_first_failure).
std::vector<PropertyResult> run_suite(const Subject& s, const SuiteOptions& o);
/// Compact table: subject, property, verdict, cases, first line of message.
std::string format_results(const std::vector<PropertyResult>& r);

/// One row of the mutation table.
struct MutantResult {
  std::string mutant, fault;
  bool caught = false;
  std::string caught_by;  ///< first property that failed
  std::string message;    ///< its first line
  double seconds = 0;
  std::vector<std::string> kills;  ///< every failing property (full_matrix runs only)
};
/// Every mutant (property_tests/mutants/), wrapping the reference backend.
std::vector<Subject> mutant_subjects();
/// Correct controls for the false-alarm check: the reference rounded to kernel output dtypes
/// ("control_rounded_f64") and the fp32 baseline algorithm ("control_fp32_baseline").
std::vector<Subject> control_subjects();
/// Runs the suite against every mutant (stops at the first failing property per mutant,
/// shrinking and dumping off) and returns the table. Mutation score = caught / total.
/// full_matrix: run every property on every mutant (no early stop) and fill `kills`.
std::vector<MutantResult> run_mutation_analysis(const SuiteOptions& o, bool full_matrix = false);
/// The same over `mutants` only (e.g. a share of mutant_subjects() for one ctest entry, so that
/// the shares run in parallel); rows in the order of `mutants`.
std::vector<MutantResult> run_mutation_analysis(const SuiteOptions& o, bool full_matrix,
                                                const std::vector<Subject>& mutants);
/// The score table plus a "mutation score: c/n" line (and kill counts when filled).
std::string format_mutation_table(const std::vector<MutantResult>& rows);
/// Kill matrix of a full_matrix run: one line per property with the mutants it catches;
/// properties that catch none are listed as such.
std::string format_kill_matrix(const std::vector<MutantResult>& rows);

/// A subject for a registered backend name (oracle::make_backend).
Subject backend_subject(const std::string& name);

/// A subject of default-constructed backends of type B, named by their name(); `fault` and
/// `focus` as in Subject (mutants, controls and the tests' faulty backends).
template <class B>
Subject subject_of(const std::string& fault = "", const std::string& focus = "") {
  Subject s;
  s.make = [] { return std::unique_ptr<oracle::Backend>(new B()); };
  s.name = s.make()->name();
  s.fault = fault;
  s.focus = focus;
  return s;
}

}  // namespace dsa::props
