// Internal helpers shared by the property files: failing-case dumps and report assertions.
#pragma once

#include <rapidcheck.h>

#include <exception>
#include <functional>
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

/// Where a failing case of the running property is dumped ("" = off). Set by run_property.
void set_dump_target(const std::string& path);
const std::string& dump_target();

/// Dumps the case (built lazily) as a fixture when the property body exits by exception
/// (RC_ASSERT / RC_FAIL throw). During shrinking the last dump is the minimal case.
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

fixtures::Fixture to_fixture(const TopkCase& c);
fixtures::Fixture to_fixture(const IndexerCase& c, bool backward);
fixtures::Fixture to_fixture(const SmlaCase& c, bool backward);
fixtures::Fixture to_fixture(const KlCase& c);
fixtures::Fixture to_fixture(const BlockCase& c);

/// True when every WEAK output of `r` is judged at a 16-bit class (BF16/F16 precision, θ =
/// 1e-2): before the generators conditioned bf16 draws row by row about 1 sparse MLA draw in
/// 130 had one (a bf16 out row at 1.0-1.2 θ), none in 8000 since (Detection.
/// GeneratedCasesHaveNoWeakRowsBf16Out; docs/what-a-pass-means.md); still possible on shapes
/// the generators do not condition (production shapes, FP8). False if an fp32-class output is WEAK.
inline bool weak_only_in_16bit(const ::dsa::oracle::OpReport& r) {
  for (const auto& t : r.tensors)
    if (t.weak_rows > 0 && t.precision != ::dsa::DType::BF16 && t.precision != ::dsa::DType::F16)
      return false;
  return true;
}

/// Fails the property with the whole formatted report unless it passed. A WEAK report judged
/// every element (WEAK is only set when every element is within its bound), so the draw
/// counts as judged, never discarded; a property that needs every row detectable asserts it
/// itself (DSA_PROP_ASSERT_DETECTABLE).
#define DSA_PROP_ASSERT_PASSED(report)                                   \
  do {                                                                   \
    const auto& dsa_r_ = (report);                                       \
    if (dsa_r_.verdict == ::dsa::oracle::Verdict::Skip)                  \
      throw ::dsa::oracle::NotSupported(dsa_r_.reason);                  \
    if (dsa_r_.verdict != ::dsa::oracle::Verdict::Weak && !dsa_r_.passed()) \
    {                                                                    \
      ::dsa::props::note_failing_op(dsa_r_.op);                       \
      RC_FAIL(::dsa::oracle::format_op_report(dsa_r_));                  \
    }                                                                    \
  } while (0)

/// As DSA_PROP_ASSERT_PASSED, but a draw WEAK in an fp32-class output fails: the sparse MLA
/// generators keep those out (Detection.GeneratedCasesHaveNoWeakRows). A draw WEAK only in
/// 16-bit-class outputs still counts as judged (the generators' bf16 draws have none since
/// their per-row conditioning, Detection.GeneratedCasesHaveNoWeakRowsBf16Out; a backend's own
/// bf16 out and the unconditioned production/FP8 shapes are not measured so). The indexer
/// properties use it too: draw_indexer_case keeps random-tier logits q·k off 0
/// (Detection.GeneratedIndexerCasesHaveNoWeakRows). So do the KL properties: draw_kl_case
/// draws have no WEAK row unconditioned (Detection.GeneratedKlCasesHaveNoWeakRows).
#define DSA_PROP_ASSERT_DETECTABLE(report)                               \
  do {                                                                   \
    const auto& dsa_r_ = (report);                                       \
    if (dsa_r_.verdict == ::dsa::oracle::Verdict::Skip)                  \
      throw ::dsa::oracle::NotSupported(dsa_r_.reason);                  \
    const bool dsa_weak16_ = dsa_r_.verdict == ::dsa::oracle::Verdict::Weak && \
                             ::dsa::props::weak_only_in_16bit(dsa_r_);   \
    if (!dsa_weak16_ && !dsa_r_.passed()) {                              \
      ::dsa::props::note_failing_op(dsa_r_.op);                       \
      RC_FAIL(::dsa::oracle::format_op_report(dsa_r_));                  \
    }                                                                    \
  } while (0)

void add_topk_properties(std::vector<Property>& out);
void add_indexer_properties(std::vector<Property>& out);
void add_sparse_mla_properties(std::vector<Property>& out);
void add_kl_loss_properties(std::vector<Property>& out);
void add_block_properties(std::vector<Property>& out);

}  // namespace dsa::props
