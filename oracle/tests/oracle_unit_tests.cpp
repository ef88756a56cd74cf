// Unit tests of the oracle's own machinery: registry, metrics, ratio rule, top-k checker.
#include <gtest/gtest.h>

#include <cmath>

#include "dsa/contract/fp8.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/dsa_block.h"
#include "dsa/oracle/metrics.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/oracle/tolerances.h"
#include "dsa/oracle/topk_check.h"
#include "dsa/reference/indexer.h"

namespace dsa::oracle {
namespace {

bool has_rule(const std::vector<TopkViolation>& v, const std::string& rule) {
  for (const auto& x : v)
    if (x.rule == rule) return true;
  return false;
}

TEST(Registry, ReferenceIsRegisteredAndUnknownNamesThrow) {
  register_reference_backend();
  auto names = backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "reference"), names.end());
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  EXPECT_THROW(make_backend("no-such-backend"), std::invalid_argument);
}

TEST(Registry, DefaultOpsThrowNotSupported) {
  struct Empty : Backend {
    std::string name() const override { return "empty"; }
    bool supports(Op) const override { return false; }
  } b;
  EXPECT_THROW(b.select_topk(Tensor(DType::F32, {1, 1}), 1, {}, std::nullopt), NotSupported);
  OpCase c;
  EXPECT_EQ(check_op(b, Op::Topk, c).verdict, Verdict::Skip);
}

TEST(Tolerances, EveryEntryHasAReasonAndLookupThrowsOnMissingKey) {
  for (const auto& t : tolerance_table()) {
    EXPECT_FALSE(t.reason.empty()) << t.op << "/" << t.output;
    EXPECT_GT(t.rho, 0.0);
  }
  EXPECT_NO_THROW(tolerance("sparse_mla_bwd", "dkv", DType::BF16));
  EXPECT_GT(tolerance("sparse_mla_bwd", "dkv", DType::F32).theta, 0.0);
  EXPECT_THROW(tolerance("sparse_mla_bwd", "nope", DType::F32), std::out_of_range);
}

TEST(Metrics, NonFinitePositionsMustMatch) {
  Tensor a = Tensor::from_f64({4}, {1.0, NAN, INFINITY, -INFINITY});
  Tensor b = Tensor::from_f64({4}, {1.0, NAN, INFINITY, 0.0});
  EXPECT_EQ(compare_tensors(a, a).nonfinite_mismatches, 0);
  EXPECT_EQ(compare_tensors(a, b).nonfinite_mismatches, 1);
  auto p = nonfinite_positions(a);
  EXPECT_EQ(p.nan, std::vector<int64_t>{1});
  EXPECT_EQ(p.neg_inf, std::vector<int64_t>{3});
}

TEST(Metrics, CosineAndRelFrobenius) {
  Tensor r = Tensor::from_f64({2}, {3.0, 4.0});
  Tensor c = Tensor::from_f64({2}, {3.0, 4.5});
  auto m = compare_tensors(c, r);
  EXPECT_DOUBLE_EQ(m.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(m.rel_fro, 0.1);
  EXPECT_LT(m.cosine, 1.0);
}

TEST(LocalRule, ExactCandidatePassesAndNaNAndOffElementsFail) {
  Tensor r = Tensor::from_f64({1, 1, 3}, {1.0, 2.0, 3.0});
  Tensor base = r.to(DType::F32);
  OutputFloor floor;  // exact data: no rounding to propagate
  floor.row_len = 3;
  floor.acc.assign(3, 0.0);
  floor.narrow.assign(3, 0.0);
  floor.terms.assign(3, 0.0);
  EXPECT_TRUE(judge_tensor("sparse_mla_fwd", "out", r.to(DType::F32), r, base, floor).passed);
  Tensor bad = r.to(DType::F32);
  bad.set(1, NAN);
  EXPECT_FALSE(judge_tensor("sparse_mla_fwd", "out", bad, r, base, floor).passed);
  Tensor off = r.to(DType::F32);
  off.set(2, 3.5);
  const TensorCheck c = judge_tensor("sparse_mla_fwd", "out", off, r, base, floor);
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.failed_elements, 1);
  EXPECT_EQ(c.failures.at(0).where, "[0, 0, 2]");
  OutputFloor short_floor = floor;
  short_floor.acc.pop_back();
  EXPECT_THROW(judge_tensor("sparse_mla_fwd", "out", off, r, base, short_floor),
               std::invalid_argument);
}

// Row: scores 5, 0, 0, -0.0, NaN, -inf; k = 3 small: expect {0, 1, 2}.
Tensor row_scores() {
  return Tensor::from_f64({1, 6}, {5.0, 0.0, 0.0, -0.0, NAN, -INFINITY}).to(DType::F32);
}

TEST(TopkCheck, AcceptsTheContractAnswer) {
  TopkPolicy small{TieBreak::Small, true};
  EXPECT_TRUE(check_topk(Tensor::from_i32({1, 3}, {0, 1, 2}), row_scores(), 3, small, {}).empty());
  TopkPolicy any{TieBreak::Any, true};
  EXPECT_TRUE(check_topk(Tensor::from_i32({1, 3}, {0, 3, 1}), row_scores(), 3, any, {}).empty());
  // k > #selectable: 4 selectable (NaN and -inf are not) → one -1.
  EXPECT_TRUE(
      check_topk(Tensor::from_i32({1, 5}, {0, 1, 2, 3, -1}), row_scores(), 5, small, {}).empty());
}

// Rows with neither a slot nor a score (k = 0, s_kv = 0) are not checked one by one: 2^31 - 1
// of them took 15 s before the same SKIPPED (fresh-user finding 8). Rows with either still
// are: an id in a row of no key is out of range, a NaN in a row of no slot is listed.
TEST(TopkCheck, EmptyRowsAreNotVisited) {
  const int64_t most = 2147483647;
  EXPECT_EQ(topk_rows_checked(most, 0, 0), 0);
  EXPECT_EQ(topk_rows_checked(4, 0, 3), 4);
  EXPECT_EQ(topk_rows_checked(4, 3, 0), 4);
  EXPECT_EQ(topk_rows_checked(-2, 0, 0), 0);
  const TopkPolicy small{TieBreak::Small, true};
  const Tensor empty(DType::F32, {most, 0});
  EXPECT_TRUE(check_topk(Tensor(DType::I32, {most, 0}), empty, 0, small, {}).empty());
  EXPECT_TRUE(has_rule(check_topk(Tensor(DType::I32, {most, 0}), empty, 1, small, {}), "shape"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 1}, {0}), Tensor(DType::F32, {1, 0}), 1, small, {}),
                       "id_out_of_range"));
  std::vector<int64_t> nan_rows;
  EXPECT_TRUE(check_topk(Tensor(DType::I32, {2, 0}), Tensor::from_f64({2, 1}, {1.0, NAN}).to(DType::F32), 0,
                         small, {}, &nan_rows)
                  .empty());
  EXPECT_EQ(nan_rows, (std::vector<int64_t>{1}));
  // The whole op on the reference: judged nothing (SPEC §9: an empty case holds no evidence).
  OpCase c;
  c.scores = empty;
  c.k = 0;
  c.policy = small;
  EXPECT_EQ(check_topk_op(*make_reference_backend(), c).verdict, Verdict::Skip);
}

TEST(TopkCheck, NamesEachViolation) {
  TopkPolicy small{TieBreak::Small, true};
  auto s = row_scores();
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {0, 2, 3}), s, 3, small, {}),
                       "tie_policy"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {0, 2, 1}), s, 3, small, {}),
                       "tie_order"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {1, 0, 2}), s, 3, small, {}),
                       "unsorted"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {0, 4, 1}), s, 3, small, {}),
                       "selected_nan"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 6}, {0, 1, 2, 3, 5, -1}), s, 6, small, {}),
                       "selected_neg_inf"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 5}, {0, 1, 2, 3, 0}), s, 5, small, {}),
                       "duplicate"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 5}, {0, 1, -1, 2, 3}), s, 5, small, {}),
                       "not_compact"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {0, 1, 6}), s, 3, small, {}),
                       "id_out_of_range"));
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {1, 2, 3}), s, 3, small, {}),
                       "missing_above_vstar"));
  Tensor i64 = Tensor::from_i32({1, 3}, {0, 1, 2}).to(DType::I64);
  EXPECT_TRUE(has_rule(check_topk(i64, s, 3, small, {}), "dtype"));
  auto w = KeyWindows::explicit_windows({1}, {6}, 6);
  EXPECT_TRUE(has_rule(check_topk(Tensor::from_i32({1, 3}, {0, 1, 2}), s, 3, small, w),
                       "outside_window"));
}

TEST(TopkCheck, NarrowedWidthIsAShapeViolationUntilConverted) {
  Tensor scores = Tensor::from_f64({1, 2}, {1.0, 2.0}).to(DType::F32);
  Tensor narrowed = Tensor::from_i32({1, 2}, {1, 0});
  TopkPolicy p{TieBreak::Any, true};
  EXPECT_TRUE(has_rule(check_topk(narrowed, scores, 4, p, {}), "shape"));
  EXPECT_TRUE(check_topk(adapt_topk_width(narrowed, 4), scores, 4, p, {}).empty());
}

TEST(TopkCheck, FusedAcceptsSwapsWithinTheBoundOnly) {
  Tensor ref = Tensor::from_f64({1, 4}, {4.0, 3.0, 2.0, 1.0});
  auto w = KeyWindows::full(1, 4);
  EXPECT_TRUE(check_fused_topk(Tensor::from_i32({1, 2}, {0, 2}), ref, 1.5, 2, w).empty());
  EXPECT_FALSE(check_fused_topk(Tensor::from_i32({1, 2}, {0, 2}), ref, 0.5, 2, w).empty());
}

// The fused top-k band is per query row (SPEC §9 local bounds): a row of scores ~5e7 (bound
// ~40) must not let a row of scores 3, 2, 1 swap its top entry for one a whole unit below.
class SwapRow1Topk : public Backend {
 public:
  std::string name() const override { return "swap-row-1"; }
  bool supports(Op op) const override { return op == Op::IndexerScores || op == Op::Topk; }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, k, w, win);
  }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& win) override {
    Tensor ids = ref_->select_topk(scores, k, p, win);
    if (swap) ids.set(1 * k + 0, 1.0);  // row 1: id 1 (score 2) instead of id 0 (score 3)
    return ids;
  }
  bool swap = true;

 private:
  std::unique_ptr<Backend> ref_ = make_reference_backend();
};

TEST(TopkCheck, FusedBandIsPerRow) {
  OpCase c;
  c.q_idx = Tensor::from_f64({2, 1, 1}, {16384.0, 1.0 / 1024}).to(DType::BF16);
  c.k_idx = Tensor::from_f64({3, 1}, {3072, 2048, 1024}).to(DType::BF16);
  c.w = Tensor::from_f64({2, 1}, {1, 1}).to(DType::F32);
  c.windows = KeyWindows::full(2, 3);
  c.k = 1;
  SwapRow1Topk b;
  b.swap = false;
  EXPECT_EQ(check_fused_indexer_topk(b, c).verdict, Verdict::Pass);
  b.swap = true;
  const OpReport r = check_fused_indexer_topk(b, c);
  ASSERT_EQ(r.verdict, Verdict::Fail) << format_op_report(r);
  EXPECT_EQ(r.topk_violations.front().row, 1);
  // the tensor-wide band (2x the largest bound, row 0's) would have accepted the swap
  ASSERT_FALSE(r.tensors.empty());
  const Tensor ref = reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
  EXPECT_TRUE(check_fused_topk(Tensor::from_i32({2, 1}, {0, 1}), ref, 2 * r.tensors.front().max_bound,
                               1, c.windows).empty());
}

// Small op cases on the reference backend: every checker passes the reference itself.
TEST(CheckOp, ReferencePassesEveryOp) {
  auto b = make_reference_backend();
  OpCase c;
  c.q_idx = Tensor::from_f64({2, 1, 2}, {1, -1, 2, 1}).to(DType::BF16);
  c.k_idx = Tensor::from_f64({3, 2}, {1, 0, 0, 1, 1, 1}).to(DType::BF16);
  c.w = Tensor::from_f64({2, 1}, {0.5, -1}).to(DType::F32);
  c.windows = KeyWindows::causal(2, 3);
  c.d_scores = Tensor::from_f64({2, 3}, {1, 2, 3, -1, 0.5, 2}).to(DType::F32);
  c.scores = Tensor::from_f64({2, 3}, {0, 0, 1, -INFINITY, 2, 2}).to(DType::F32);
  c.k = 2;
  c.mla.q = Tensor::from_f64({2, 1, 2}, {0.5, -1, 1, 0.25}).to(DType::BF16);
  c.mla.kv = Tensor::from_f64({3, 2}, {1, 2, -1, 0.5, 0.25, 1}).to(DType::BF16);
  c.mla.indices = Tensor::from_i32({2, 3}, {0, -1, 2, 5, 1, 1});
  c.mla.d_v = 1;
  c.mla.sm_scale = 0.5;
  c.dout = Tensor::from_f64({2, 1, 1}, {1, -2}).to(DType::F32);
  c.kl.scores = Tensor::from_f64({2, 3}, {0.5, -INFINITY, -INFINITY, 1, 2, -INFINITY}).to(DType::F32);
  c.kl.q = Tensor::from_f64({2, 2, 2}, {1, 0, 0, 1, 1, 1, -1, 0}).to(DType::F32);
  c.kl.kv = Tensor::from_f64({3, 2}, {1, 0, 0, 1, 1, 1}).to(DType::F32);
  c.kl.windows = KeyWindows::causal(2, 2 + 1, 0);
  // §10 ops: tiny FP8 / paged / FP8-cache cases.
  c.fp8_indexer.q_idx = fp8_encode(Tensor::from_f64({2, 1, 2}, {1, -1, 2, 1}), Fp8Format::E4M3FN);
  c.fp8_indexer.k_idx = fp8_encode(Tensor::from_f64({3, 2}, {1, 0, 0, 1, 1, 1}), Fp8Format::E4M3FN);
  c.fp8_indexer.k_scale = Tensor::from_f64({3}, {0.5, 1, 2}).to(DType::F32);
  c.fp8_indexer.w = Tensor::from_f64({2, 1}, {0.5, 1}).to(DType::F32);
  c.fp8_indexer.windows = KeyWindows::causal(2, 3);
  c.paged_indexer.q_idx = c.fp8_indexer.q_idx.reshaped({1, 2, 1, 2});
  c.paged_indexer.k_cache = fp8_encode(Tensor::from_f64({2, 2, 2}, {1, 0, 0, 1, 1, 1, -1, 2}), Fp8Format::E4M3FN);
  c.paged_indexer.k_scale_cache = Tensor::from_f64({2, 2}, {1, 0.5, 2, 1}).to(DType::F32);
  c.paged_indexer.w = c.fp8_indexer.w;
  c.paged_indexer.block_table = Tensor::from_i32({1, 2}, {1, 0});
  c.paged_indexer.context_lens = Tensor::from_i32({1}, {3});
  std::vector<double> kv576(2 * 576), q576(576);
  for (size_t i = 0; i < kv576.size(); ++i) kv576[i] = static_cast<double>(i % 5) - 2.0;
  for (size_t i = 0; i < q576.size(); ++i) q576[i] = static_cast<double>(i % 3) - 1.0;
  c.mla_fp8.q = Tensor::from_f64({1, 1, 576}, q576).to(DType::BF16);
  c.mla_fp8.kv_cache = encode_mla_fp8_cache(Tensor::from_f64({2, 576}, kv576), Fp8ScaleRule::Pow2);
  c.mla_fp8.indices = Tensor::from_i32({1, 3}, {0, -1, 1});
  c.mla_fp8.sm_scale = 0.05;
  for (Op op : all_ops()) {
    const OpReport r = check_op(*b, op, c);
    EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  }
  EXPECT_EQ(check_fused_indexer_topk(*b, c).verdict, Verdict::Pass);
}

TEST(DsaBlock, TopkRunsOncePerForwardAndOnlyFullReplaysIt) {
  auto b = make_reference_backend();
  BlockInputs in;
  in.q_idx = Tensor::from_f64({2, 1, 2}, {1, -1, 2, 1}).to(DType::BF16);
  in.k_idx = Tensor::from_f64({3, 2}, {1, 0, 0, 1, 1, 1}).to(DType::BF16);
  in.w = Tensor::from_f64({2, 1}, {0.5, 1}).to(DType::F32);
  in.windows = KeyWindows::causal(2, 3);
  in.k = 2;
  in.q = Tensor::from_f64({2, 1, 2}, {0.5, -1, 1, 0.25}).to(DType::BF16);
  in.kv = Tensor::from_f64({3, 2}, {1, 2, -1, 0.5, 0.25, 1}).to(DType::BF16);
  in.d_v = 1;
  const Tensor dout = Tensor::from_f64({2, 1, 1}, {1, -2}).to(DType::F32);
  for (RecomputePolicy p : {RecomputePolicy::None, RecomputePolicy::Full, RecomputePolicy::SaveDsaIndexer}) {
    auto block = default_block_factory()(*b, p);
    block->forward(7, in);
    block->backward(7, dout);
    EXPECT_EQ(block->counters().topk_forward, 1);
    EXPECT_EQ(block->counters().topk_backward, p == RecomputePolicy::Full ? 1 : 0);
    EXPECT_THROW(block->backward(7, dout), std::logic_error);
  }
}

}  // namespace
}  // namespace dsa::oracle
