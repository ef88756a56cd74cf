// Indexer properties (SPEC §2): exact tier bit-exact, random tier by the ratio rule, causal
// windows exactly at ke, gradient parity.
#include <cmath>

#include "dsa/oracle/metrics.h"
#include "dsa/reference/indexer.h"
#include "src/props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

oracle::OpCase as_op_case(const IndexerCase& c) {
  oracle::OpCase oc;
  oc.q_idx = c.q_idx;
  oc.k_idx = c.k_idx;
  oc.w = c.w;
  oc.windows = c.windows;
  oc.d_scores = c.d_scores;
  return oc;
}

void check_inputs(const IndexerCase& c) {
  RC_ASSERT(!all_zero(c.q_idx));
  RC_ASSERT(!all_zero(c.k_idx));
  RC_ASSERT(!all_zero(c.w));
}

// Integer grids: every path is exact, so the candidate equals the float64 reference bit for
// bit (ReLU before the weight, fp32+ accumulation, windows all visible here).
void scores_exact_tier(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_case(Tier::Exact);
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  const Tensor ref = reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
  const Tensor got = call_twin_tested(b, Op::IndexerScores, as_op_case(c),
                                      [&] { return b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows); });
  const auto m = oracle::compare_tensors(got, ref);
  RC_ASSERT(m.shape_ok);
  RC_ASSERT(m.nonfinite_mismatches == 0);
  RC_ASSERT(m.max_abs == 0.0);
}

// Random tier: ratio rule against the float64 reference.
void scores_ratio(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_case(Tier::Random);
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScores, as_op_case(c), oracle::check_indexer_scores);
}

// Causal windows: key ke-1 visible (finite), key ke and ks-1 masked (-inf).
void causal_window_exact_at_ke(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_case(std::nullopt, "causal");
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  const Tensor got = call_twin_tested(b, Op::IndexerScores, as_op_case(c),
                                      [&] { return b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows); });
  const int64_t s_kv = c.k_idx.size(0);
  RC_ASSERT(got.shape() == std::vector<int64_t>({c.q_idx.size(0), s_kv}));
  for (int64_t t = 0; t < c.q_idx.size(0); ++t) {
    const int64_t ks = c.windows.ks[t], ke = c.windows.ke[t];
    if (ke > ks) RC_ASSERT(std::isfinite(got.get(t * s_kv + ke - 1)));
    if (ke < s_kv) RC_ASSERT(got.get(t * s_kv + ke) == -INFINITY);
    if (ks > 0) RC_ASSERT(got.get(t * s_kv + ks - 1) == -INFINITY);
  }
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScores, as_op_case(c), oracle::check_indexer_scores);
}

// Gradient parity: dq_idx, dk_idx, dw by the ratio rule for the same upstream d_scores. Keys
// past 2^16 on draw 3, not past 2^17 (a backward over 131073+ key rows costs ~1 s CPU a draw).
void backward_parity(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_case(std::nullopt, nullptr, false);
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  RC_ASSERT(!all_zero(c.d_scores));
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScoresBackward, as_op_case(c), oracle::check_indexer_backward);
}

// Many query rows (s_q 257-1100; the first draw of a run > 1024; finding 7): the scores by
// the ratio rule, exact or random tier. The gradients are indexer.backward_many_rows's, so a
// fault of one direction fails the property of that direction only.
void many_rows(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_many_rows_case();
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScores, as_op_case(c), oracle::check_indexer_scores);
}

// The backward alone over many query rows (fresh-user finding F7: the many-row draw of the
// backward lived in indexer.many_rows, which runs only with indexer_scores selected, so a
// backward-only audit of a kernel dropping d_scores rows past 128 passed): exact tier.
void backward_many_rows(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_many_rows_case(Tier::Exact);
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScoresBackward, as_op_case(c), oracle::check_indexer_backward);
}

// Production indexer shapes (H_I 64, d_I 128, keys past 128; finding F8): the scores.
void production_shapes(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_production_case();
  DumpOnFailure dump([&] { return to_fixture(c, false); });
  check_inputs(c);
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScores, as_op_case(c), oracle::check_indexer_scores);
}

// The same shapes for the backward alone (d_scores NaN/inf outside the windows as drawn).
void backward_production_shapes(Backend& b, const BlockFactory&) {
  const IndexerCase c = draw_indexer_production_case();
  DumpOnFailure dump([&] { return to_fixture(c, true); });
  check_inputs(c);
  DSA_PROP_JUDGE_DETECTABLE(b, Op::IndexerScoresBackward, as_op_case(c), oracle::check_indexer_backward);
}

}  // namespace

void add_indexer_properties(std::vector<Property>& out) {
  out.push_back({"indexer.scores_exact_tier", {Op::IndexerScores}, 1, scores_exact_tier});
  out.push_back({"indexer.scores_ratio", {Op::IndexerScores}, 1, scores_ratio});
  out.push_back({"indexer.causal_window_exact_at_ke", {Op::IndexerScores}, 1, causal_window_exact_at_ke});
  out.push_back({"indexer.many_rows", {Op::IndexerScores}, 8, many_rows});
  out.push_back({"indexer.backward_parity", {Op::IndexerScoresBackward}, 1, backward_parity});
  out.push_back({"indexer.production_shapes", {Op::IndexerScores}, 34, production_shapes});
  out.push_back({"indexer.backward_many_rows", {Op::IndexerScoresBackward}, 8, backward_many_rows});
  out.push_back({"indexer.backward_production_shapes", {Op::IndexerScoresBackward}, 34, backward_production_shapes});
}

}  // namespace dsa::props
