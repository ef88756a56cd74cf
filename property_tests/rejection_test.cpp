// The SPEC §10 rejection properties in process (fresh-user F2/F3): every read scale of the
// paged indexer and of the FP8 sparse MLA cache is checked (paged.invalid_scale_rejected,
// smla_fp8.invalid_scale_rejected catch the kernels that never validate them), and only the
// documented argument error counts as a rejection: another exception, a crash, a hang or a
// write past a buffer (as a route reports them, Backend::classify_failure) fails the draw
// naming what happened; a route that refused the input itself makes it a skip. The plugin
// route: plugin/tests/bad_input_test.cpp.
#include <gtest/gtest.h>

#include <iostream>
#include <stdexcept>
#include <string>

#include "dsa/property_tests/suite.h"
#include "prop_test_util.h"
#include "src/props_common.h"
#include "src/reference_wrap.h"

namespace dsa::props {
namespace {

using oracle::CallFailure;
using oracle::Verdict;
using test::level0;
using test::mutant_named;
using test::property_named;

const char* const kRejectionProperties[] = {"fp8.invalid_scale_rejected", "paged.bad_table_rejected",
                                            "paged.invalid_scale_rejected", "smla_fp8.invalid_scale_rejected"};

// The reference's §10 ops, whose argument errors (std::invalid_argument) are rethrown as
// `Thrown` and reported by the route as `how` (what a plugin or Python route tells).
template <class Thrown>
class RethrowsAs final : public ReferenceWrap {
 public:
  explicit RethrowsAs(CallFailure how) : ReferenceWrap("rethrows_as"), how_(how) {}
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    return wrap([&] { return ref_->fp8_indexer_scores(in); });
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    return wrap([&] { return ref_->paged_indexer_scores(in); });
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    return wrap([&] { return ref_->sparse_mla_fp8_forward(in); });
  }
  CallFailure classify_failure(const std::exception&) const override { return how_; }

 private:
  template <class F>
  auto wrap(F f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::invalid_argument& e) {
      throw Thrown(e.what());
    }
  }
  CallFailure how_;
};

template <class Thrown>
Subject rethrowing(CallFailure how) {
  Subject s;
  s.make = [how] { return std::unique_ptr<oracle::Backend>(new RethrowsAs<Thrown>(how)); };
  s.name = "rethrows_as_" + std::string(oracle::to_string(how));
  return s;
}

TEST(RejectionProperties, ReferenceRejectsEveryBadRead) {
  for (const char* prop : kRejectionProperties) {
    const PropertyResult r = run_property(backend_subject("reference"), property_named(prop), level0(7));
    EXPECT_EQ(r.verdict, Verdict::Pass) << prop << ": " << r.message;
    EXPECT_GT(r.cases, 0) << prop;
  }
}

// F2: a paged indexer / FP8 sparse MLA that uses a bad read scale without a check fails.
TEST(RejectionProperties, UncheckedReadScalesFail) {
  const struct {
    const char* mutant;
    const char* prop;
  } cases[] = {{"paged_read_scale_not_validated", "paged.invalid_scale_rejected"},
               {"smla_fp8_read_scale_not_validated", "smla_fp8.invalid_scale_rejected"}};
  for (const auto& c : cases)
    for (uint64_t seed : {1u, 2u, 7u}) {
      const PropertyResult r = run_property(mutant_named(c.mutant), property_named(c.prop), level0(seed));
      EXPECT_EQ(r.verdict, Verdict::Fail) << c.mutant << " seed " << seed << ": " << r.message;
      EXPECT_NE(r.message.find("accepted "), std::string::npos) << r.message;
      if (seed == 7) std::cout << "  " << c.mutant << ": " << r.message.substr(0, 200) << "\n";
    }
}

// F3: only the documented argument error is a rejection; each other outcome fails saying which.
TEST(RejectionProperties, OnlyTheDocumentedArgumentErrorIsARejection) {
  const struct {
    Subject subject;
    Verdict verdict;
    const char* says;
  } cases[] = {
      {rethrowing<std::invalid_argument>(CallFailure::ArgumentError), Verdict::Pass, ""},
      {rethrowing<std::runtime_error>(CallFailure::OtherError), Verdict::Fail, "failed with another error on "},
      {rethrowing<std::runtime_error>(CallFailure::Crashed), Verdict::Fail, "crashed on "},
      {rethrowing<std::runtime_error>(CallFailure::TimedOut), Verdict::Fail, "hung on "},
      {rethrowing<std::runtime_error>(CallFailure::MemoryViolation), Verdict::Fail, "wrote outside its buffers on "},
      {rethrowing<std::invalid_argument>(CallFailure::RejectedByRoute), Verdict::Skip, "not applicable on this route"},
  };
  for (const auto& c : cases)
    for (const char* prop : kRejectionProperties) {
      const PropertyResult r = run_property(c.subject, property_named(prop), level0(11));
      EXPECT_EQ(r.verdict, c.verdict) << c.subject.name << " " << prop << ": " << r.message;
      EXPECT_NE(r.message.find(c.says), std::string::npos) << c.subject.name << " " << prop << ": " << r.message;
    }
  // The in-process default: std::invalid_argument is the argument error, nothing else is.
  const auto ref = oracle::make_backend("reference");
  EXPECT_EQ(ref->classify_failure(std::invalid_argument("x")), CallFailure::ArgumentError);
  EXPECT_EQ(ref->classify_failure(std::runtime_error("x")), CallFailure::OtherError);
}

}  // namespace
}  // namespace dsa::props
