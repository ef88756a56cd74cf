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

// Ids past 16 bits and indexer dtypes (outside tester F3, F4): each mutant is caught first on
// the draw that holds its input (draw 3: keys past 65535; draw 1: fp32 indexer inputs), so the
// draws before it, which held none, passed it. On every other draw of these properties (as on
// every draw before, main 996ea09) ids stay below 65536 and the indexer's inputs are bf16 or
// fp16, where each mutant computes the reference's own bits for ids < 65536 / bf16 inputs.
// The indexer draws past 16 bits make one row score a moved key nonzero by construction
// (make_row_score_key): before, a draw whose heads cancelled on the moved keys passed the
// 16-bit mutant at level 1 (paged positions at seed 2, the FP8 exact tier at seeds 3 and 8).
TEST(SpecialInputs, WideIdAndDtypeMutantsAreCaughtOnTheirDraw) {
  struct Case {
    const char* mutant;
    const char* property;
    int draw;  // the failing draw's index (draw_index()); r.drawn counts it too
  };
  for (const Case& c : {Case{"smla_ids_16bit", "smla.forward_ratio", 3},
                        Case{"smla_ids_16bit", "smla.duplicates_accumulate_in_dkv", 3},
                        Case{"smla_fp8_token_ids_16bit", "smla_fp8.forward_ratio", 3},
                        Case{"indexer_keys_16bit", "indexer.scores_ratio", 3},
                        Case{"indexer_rounds_inputs_to_bf16", "indexer.scores_ratio", 1},
                        // FP8 indexer keys / paged blocks past 65535 on draw 3; a paged context
                        // past 65536 keys on draw 5 of the exact tier (draw 3's contexts hold
                        // <= 5 keys: the positions mutant passes it)
                        Case{"fp8_indexer_keys_16bit", "fp8.indexer_ratio", 3},
                        Case{"fp8_indexer_keys_16bit", "fp8.indexer_exact_tier", 3},
                        Case{"paged_block_ids_16bit", "paged.indexer_ratio", 3},
                        Case{"paged_block_ids_16bit", "paged.indexer_exact_tier", 3},
                        Case{"paged_positions_16bit", "paged.indexer_exact_tier", 5}})
    for (int level : {0, 1})  // Mutation.EveryMutantIsCaught runs level 1
      for (uint64_t seed : {1u, 2u, 3u}) {
        SuiteOptions o = level0(seed);
        o.level = level;
        const PropertyResult r = run_property(test::mutant_named(c.mutant), test::property_named(c.property), o);
        EXPECT_EQ(r.verdict, oracle::Verdict::Fail)
            << c.mutant << " passed " << c.property << " at level " << level << ", seed " << seed;
        EXPECT_EQ(r.drawn, c.draw + 1)
            << c.mutant << " on " << c.property << " at level " << level << ", seed " << seed << ": " << r.message;
      }
}

// fresh18 F1, F2: subnormal top-k scores (a run's first draw and one in three: a boundary row
// decided by subnormals against +0/-0) and finite in-window KL scores of -65504, -1e5, -1e30.
TEST(SpecialInputs, TopkFlushingSubnormalsFailsTheSmallTopkProperties) {
  expect_fails_each("topk_flushes_subnormals", {"topk.contract_exact", "topk.neg_inf_to_minus_one",
                                                "topk.ties_resolved_bitwise", "topk.nan_never_selected"});
}

TEST(SpecialInputs, KlFiniteSentinelMaskedFailsEveryKlProperty) {
  expect_fails_each("kl_finite_sentinel_masked", {"kl.loss_and_gradient_ratio", "kl.neg_inf_scores",
                                                  "kl.many_rows", "kl.production_shapes"});
}

}  // namespace
}  // namespace dsa::props
