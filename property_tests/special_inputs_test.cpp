// Inputs no generated case held (fresh17 F1, F2): +inf top-k scores and a KL sm_scale other
// than 1/sqrt(d_qk). Before, a top-k dropping +inf (a !isfinite filter) passed 9 of 13 level-0
// top-k audits (only topk.long_rows' rare "specials" rows drew +inf), and a KL kernel
// recomputing sm_scale from q's width passed every KL draw, golden and peer file (all used
// 1/sqrt(d_qk)). Now the small top-k draws hold +inf on every run's first draw and one other
// draw in three (also topk.row_windows and topk.many_rows), and every KL draw scales by a
// factor other than 1 (generators.cpp, scale_kl_case). Each mutant fails each listed property
// at level 0 on seeds 1-3 without shrinking, as an audit runs; the reference passing them is
// Prop_reference.* (every property at the suite's seed) and FalseAlarms.*.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "dsa/property_tests/suite.h"
#include "prop_test_util.h"

namespace dsa::props {
namespace {

using test::level0;

void expect_fails_each(const std::string& mutant, std::initializer_list<const char*> properties) {
  for (const char* name : properties)
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult r = run_property(test::mutant_named(mutant), test::property_named(name), level0(seed));
      EXPECT_EQ(r.verdict, oracle::Verdict::Fail) << mutant << " passed " << name << " at seed " << seed;
    }
}

TEST(SpecialInputs, TopkDroppingPosInfFailsTheSmallTopkProperties) {
  expect_fails_each("topk_drops_pos_inf", {"topk.contract_exact", "topk.neg_inf_to_minus_one",
                                           "topk.ties_resolved_bitwise", "topk.nan_never_selected",
                                           "topk.row_windows", "topk.many_rows"});
}

TEST(SpecialInputs, KlHardcodedSmScaleFailsEveryKlProperty) {
  expect_fails_each("kl_hardcoded_sm_scale", {"kl.loss_and_gradient_ratio", "kl.neg_inf_scores",
                                              "kl.many_rows", "kl.production_shapes"});
}

}  // namespace
}  // namespace dsa::props
