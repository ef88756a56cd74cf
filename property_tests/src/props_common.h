// Internal helpers shared by the property files: failing-case dumps and report assertions.
#pragma once

#include <rapidcheck.h>

#include <exception>
#include <functional>
#include <optional>
#include <vector>
#include <string>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/generators.h"
#include "dsa/property_tests/suite.h"

namespace dsa::props {

/// Ops the running property may judge (SuiteOptions::ops; empty: every op). Set by run_property.
void set_selected_ops(const std::vector<oracle::Op>& ops);
/// True when the property should judge `op`: the backend supports it and the run selected it
/// (--ops). A forward property's optional backward part asks this, not Backend::supports.
bool judges(const oracle::Backend& b, oracle::Op op);
/// The op of the report assertion that failed last in this thread (reset by run_property per
/// execution of a property body; read after a failing run). Set by DSA_PROP_ASSERT_*.
void note_failing_op(const std::string& op);
void reset_failing_op();
const std::string& failing_op();
/// The reason of the last draw in this thread that judged nothing (OpReport::nothing_judged),
/// noted by DSA_PROP_ASSERT_* before it discards the draw; take_judged_nothing returns it and
/// clears it ("" when none). run_property counts such draws apart from the backend's declines.
void note_judged_nothing(const std::string& why);
std::string take_judged_nothing();

/// Notes that the backend declined the running draw but ran its twin without the mandatory
/// feature `feature` (the same draw with that feature's values made ordinary, e.g. the unread
/// §10 parts clean): the decline was about `feature`. run_property counts such a draw as
/// declined for the noted features only, and as a declined mandatory case even when other
/// draws with it were judged or none of the property was (fresh-user F4b, F6).
/// take_declined_for returns the features noted since the last call and clears them.
void note_declined_for(const std::string& feature);
std::vector<std::string> take_declined_for();

/// The --unsupported names of the running property (SuiteOptions::unsupported), which
/// fail_if_declined_by_value hands to the twin test. Set by run_property.
void set_unsupported_names(const std::vector<std::string>& names);

/// The twin test of a draw `c` that `b` declined (`why`: the decline's reason) for `op` (top-k:
/// c.scores, c.k, c.policy, c.topk_windows; sparse MLA forward or backward: c.mla, c.dout;
/// indexer: c.q_idx, c.k_idx, c.w, c.windows, as the fused indexer + top-k property hands it):
/// oracle::decline_cause with the running property's --unsupported names, the judgement of the
/// fixture routes. A draw whose twin with other values `b` runs (one keeping every feature, or,
/// with none, top-k's other finite scores / sparse MLA's id set to -1) fails (RC_FAIL, filed
/// under `op`): "INCOMPLETE: backend declined this <op> draw but ran the same draw with <twin>:
/// the decline depends on the values", which its dump replays to. The
/// features the decline depends on (a twin without them `b` runs), named or not, are noted
/// (note_declined_for): run_property counts the draw as declined for them alone, and INCOMPLETE
/// for those not named. Returns otherwise (the caller goes on with the decline: the draw is
/// redrawn); a limit declared up front (oracle::declared_limitation): returns at once. Runs `b`
/// once per twin (not judged, at most one per feature plus two). Rule:
/// docs/what-a-pass-means.md Verdicts (fresh11 F10, F2, F6).
void fail_if_declined_by_value(oracle::Backend& b, oracle::Op op, const oracle::OpCase& c, const std::string& why);

/// Where a failing case of the running property is dumped ("" = off). Set by run_property.
void set_dump_target(const std::string& path);
const std::string& dump_target();

/// Keeps the case (built lazily) as this execution's pending dump when the property body exits
/// by exception; run_property saves it (save_pending_dump) only when the execution failed
/// (RC_ASSERT / RC_FAIL, any other exception), never for a discarded draw (RC_DISCARD: a case
/// that judged nothing, e.g. k = 0) nor a declined one (NotSupported): a clean run leaves no
/// dump (fresh-user F12). During shrinking the last dump saved is the minimal case.
class DumpOnFailure {
 public:
  explicit DumpOnFailure(std::function<fixtures::Fixture()> build)
      : build_(std::move(build)), uncaught_(std::uncaught_exceptions()) {}
  ~DumpOnFailure();
  DumpOnFailure(const DumpOnFailure&) = delete;
  DumpOnFailure& operator=(const DumpOnFailure&) = delete;

 private:
  std::function<fixtures::Fixture()> build_;
  int uncaught_;
};

/// Drops the pending dump (an execution that starts, or ends without failing).
void clear_pending_dump();
/// Saves the pending dump at dump_target() and clears it; true when a file was written (false:
/// none pending, no target, or the write failed: a failed dump never masks the failure).
bool save_pending_dump();

fixtures::Fixture to_fixture(const TopkCase& c);
fixtures::Fixture to_fixture(const IndexerCase& c, bool backward);
fixtures::Fixture to_fixture(const SmlaCase& c, bool backward);
fixtures::Fixture to_fixture(const KlCase& c);
fixtures::Fixture to_fixture(const BlockCase& c);

// The body of both assertions below: discard a draw that judged nothing, decline on a skip,
// fail with the formatted report unless it passed (a WEAK report passes when weak_passes).
#define DSA_PROP_ASSERT_REPORT_(report, weak_passes)                     \
  do {                                                                   \
    const auto& dsa_r_ = (report);                                       \
    if (dsa_r_.nothing_judged) {                                         \
      ::dsa::props::note_judged_nothing(dsa_r_.reason);                  \
      RC_DISCARD(dsa_r_.reason);                                         \
    }                                                                    \
    if (dsa_r_.verdict == ::dsa::oracle::Verdict::Skip)                  \
      throw ::dsa::oracle::NotSupported(dsa_r_.reason);                  \
    const bool dsa_weak_ok_ = (weak_passes) && dsa_r_.verdict == ::dsa::oracle::Verdict::Weak; \
    if (!dsa_weak_ok_ && !dsa_r_.passed()) {                             \
      ::dsa::props::note_failing_op(dsa_r_.op);                          \
      RC_FAIL(::dsa::oracle::format_op_report(dsa_r_));                  \
    }                                                                    \
  } while (0)

/// Fails the property with the whole formatted report unless it passed. A draw that judged
/// nothing (OpReport::nothing_judged: an empty case such as k = 0, or provided outputs the draw
/// does not define) holds no evidence: it is discarded and redrawn, not counted as the
/// backend's decline; a backend's skip (NotSupported) is a decline. A WEAK report judged
/// every element (WEAK is only set when every element is within its bound), so the draw
/// counts as judged, never discarded; a property that needs every row detectable asserts it
/// itself (DSA_PROP_ASSERT_DETECTABLE).
#define DSA_PROP_ASSERT_PASSED(report) DSA_PROP_ASSERT_REPORT_(report, true)

/// As DSA_PROP_ASSERT_PASSED, but a WEAK draw fails, whatever the precision class of its WEAK
/// output (SPEC §9: WEAK fails unless --allow-weak; issue 12: no generated case at level 1 is
/// WEAK). The generators keep their draws detectable: sparse MLA at the fp32 class
/// (Detection.GeneratedCasesHaveNoWeakRows) and, conditioned row by row, at the bf16 class
/// (...HaveNoWeakRowsBf16Out; production shapes ...ProductionCasesHaveNoWeakRows; the FP8
/// cache ...Fp8SmlaCasesHaveNoWeakRows); indexer (...GeneratedIndexerCasesHaveNoWeakRows), KL
/// (...GeneratedKlCasesHaveNoWeakRows), FP8 and paged indexer
/// (...GeneratedFp8IndexerCasesHaveNoWeakRows). docs/what-a-pass-means.md has the counts.
#define DSA_PROP_ASSERT_DETECTABLE(report) DSA_PROP_ASSERT_REPORT_(report, false)

/// When `r` (the report of `op` on draw `oc` by `b`) is a decline (a Skip with
/// OpReport::declined), the twin test of the fixture routes (fail_if_declined_by_value): the draw
/// fails as INCOMPLETE when the decline depends on its values, and the mandatory features it is
/// laid to are noted; otherwise nothing. Every op's properties call it through
/// DSA_PROP_JUDGE_DETECTABLE, so no property passes on draws declined for a mandatory feature
/// (fresh15 F1: the FP8 sparse MLA properties passed a kernel declining every draw with a -1 id).
void twin_test_if_declined(oracle::Backend& b, oracle::Op op, const oracle::OpCase& oc, const oracle::OpReport& r);

/// DSA_PROP_ASSERT_DETECTABLE of `check(b, oc)` (an oracle check function of `op`, called with
/// its default options), after twin_test_if_declined of its report.
#define DSA_PROP_JUDGE_DETECTABLE(b, op, oc, check)                   \
  do {                                                                \
    const ::dsa::oracle::OpCase& dsa_oc_ = (oc);                      \
    const ::dsa::oracle::OpReport dsa_rep_ = check((b), dsa_oc_);     \
    ::dsa::props::twin_test_if_declined((b), (op), dsa_oc_, dsa_rep_); \
    DSA_PROP_ASSERT_DETECTABLE(dsa_rep_);                             \
  } while (0)

/// Returns `call()`, a direct call of `b` on draw `oc` for `op`; a decline (NotSupported) gets
/// the twin test (fail_if_declined_by_value) and is rethrown (the draw is redrawn).
template <class Call>
auto call_twin_tested(oracle::Backend& b, oracle::Op op, const oracle::OpCase& oc, Call call) -> decltype(call()) {
  try {
    return call();
  } catch (const oracle::NotSupported& e) {
    fail_if_declined_by_value(b, op, oc, e.what());
    throw;
  }
}

void add_topk_properties(std::vector<Property>& out);
void add_indexer_properties(std::vector<Property>& out);
void add_sparse_mla_properties(std::vector<Property>& out);
void add_kl_loss_properties(std::vector<Property>& out);
void add_block_properties(std::vector<Property>& out);
/// smla.normalized_p_exact_tier, smla.sink_after_rounding_exact_tier (declared_model_props.cpp):
/// a declared rounding model checked bit for bit where it is exactly known.
void add_declared_model_properties(std::vector<Property>& out);

}  // namespace dsa::props
