// Input dtypes of the KL properties (SPEC §7: q and kv are the §4 attention inputs, bf16 or
// fp32). Fresh-user F17: a KL kernel forming its teacher from bf16 logits (a bf16 GEMM output)
// passed every KL property, which drew fp32 q/kv only; only the bf16 golden fixtures caught
// it. The properties now draw bf16 q/kv too (the run's first draw always), judged at the
// outputs' fp32 class, so the mutant doing so fails each of them at level 0, and the
// reference passes.
#include <gtest/gtest.h>

#include <rapidcheck.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "dsa/property_tests/generators.h"
#include "dsa/property_tests/suite.h"
#include "prop_test_util.h"

namespace dsa::props {
namespace {

using test::level0;

const char* const kKlProperties[] = {"kl.loss_and_gradient_ratio", "kl.neg_inf_scores", "kl.many_rows",
                                     "kl.production_shapes"};

// Level 0 on seeds 1, 2, 3, without shrinking (as an audit of a plugin runs): every KL
// property fails the 16-bit-logit teacher, on a draw with bf16 q/kv.
TEST(KlInputDtypes, Teacher16BitLogitsFailsEveryKlPropertyAtLevel0) {
  for (const char* name : kKlProperties)
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult r =
          run_property(test::mutant_named("kl_teacher_16bit_logits"), test::property_named(name), level0(seed));
      EXPECT_EQ(r.verdict, oracle::Verdict::Fail) << "kl_teacher_16bit_logits passed " << name << " at seed " << seed;
      EXPECT_NE(r.message.find("q/kv=BF16"), std::string::npos)
          << name << " seed " << seed << ": the failing case is not a bf16 one: " << r.message.substr(0, 400);
    }
}

// The reference passes the same properties on those seeds.
TEST(KlInputDtypes, ReferencePassesEveryKlProperty) {
  for (const char* name : kKlProperties)
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult r = run_property(backend_subject("reference"), test::property_named(name), level0(seed));
      EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << name << " seed " << seed << ": " << r.message;
    }
}

// The generators: a forced dtype is used for q and kv and named; without one both fp32 and bf16
// are drawn (RapidCheck's own seeds, 60 draws of draw_kl_case); another dtype is refused by name.
TEST(KlInputDtypes, GeneratorsDrawFp32AndBf16) {
  int f32 = 0, bf16 = 0;
  const auto prop = [&] {
    const KlCase c = draw_kl_case();
    RC_ASSERT(c.in.q.dtype() == c.in.kv.dtype());
    f32 += c.in.q.dtype() == DType::F32;
    bf16 += c.in.q.dtype() == DType::BF16;
    RC_ASSERT(c.desc.find(std::string(" q/kv=") + dtype_name(c.in.q.dtype())) != std::string::npos);
    for (const DType d : {DType::BF16, DType::F16, DType::F32}) {
      const KlCase m = draw_kl_many_rows_case(d);
      RC_ASSERT(m.in.q.dtype() == d && m.in.kv.dtype() == d);
      RC_ASSERT(m.desc.find(std::string(" q/kv=") + dtype_name(d)) != std::string::npos);
    }
    bool refused = false;
    try {
      draw_kl_case(DType::F64);
    } catch (const std::invalid_argument& e) {
      refused = std::string(e.what()).find("'dtype'") != std::string::npos;
    }
    RC_ASSERT(refused);
  };
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = 60;
  rc::detail::TestMetadata md;
  md.id = "KlInputDtypes/GeneratorsDrawFp32AndBf16";
  md.description = md.id;
  const auto result = rc::detail::checkTestable(prop, md, params);
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  EXPECT_TRUE(result.is<rc::detail::SuccessResult>()) << msg.str();
  EXPECT_GT(f32, 0);
  EXPECT_GT(bf16, 0);
}

}  // namespace
}  // namespace dsa::props
