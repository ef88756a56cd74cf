// Internal helpers shared by the property files: failing-case dumps and report assertions.
#pragma once

#include <rapidcheck.h>

#include <exception>
#include <functional>
#include <string>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/generators.h"
#include "dsa/property_tests/suite.h"

namespace dsa::props {

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

/// Fails the property with the whole formatted report unless it passed. A WEAK report judged
/// every element (WEAK is only set when every element is within its bound), so the draw
/// counts as judged, never discarded; the generators keep WEAK rows out of their draws
/// (test Detection.GeneratedCasesHaveNoWeakRows), and a property that needs every row
/// detectable asserts it itself.
#define DSA_PROP_ASSERT_PASSED(report)                                   \
  do {                                                                   \
    const auto& dsa_r_ = (report);                                       \
    if (dsa_r_.verdict == ::dsa::oracle::Verdict::Skip)                  \
      throw ::dsa::oracle::NotSupported(dsa_r_.reason);                  \
    if (dsa_r_.verdict != ::dsa::oracle::Verdict::Weak && !dsa_r_.passed()) \
      RC_FAIL(::dsa::oracle::format_op_report(dsa_r_));                  \
  } while (0)

void add_topk_properties(std::vector<Property>& out);
void add_indexer_properties(std::vector<Property>& out);
void add_sparse_mla_properties(std::vector<Property>& out);
void add_kl_loss_properties(std::vector<Property>& out);
void add_block_properties(std::vector<Property>& out);

}  // namespace dsa::props
