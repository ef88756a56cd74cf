// Indexer KL loss (SPEC §7): hand cases dense/sparse, 0·ln 0, FD gradient, baseline sanity.
#include "dsa/reference/kl_loss.h"

#include <gtest/gtest.h>

#include <limits>

#include "test_support.h"

namespace dsa {
namespace {

using reference::indexer_kl_loss;
using reference::Precision;

// Row 0 sees keys {0, 1}; row 1 has an empty window (excluded from the mean).
// Heads: logits (0, ln 3) and (0, 0) -> softmaxes (1/4, 3/4) and (1/2, 1/2); teacher
// p = (3/8, 5/8). Student scores (0, 0) -> q = (1/2, 1/2).
IndexerKlInputs hand_inputs() {
  IndexerKlInputs in;
  in.scores = Tensor::from_f64({2, 3}, {0, 0, 4, 1, 2, 3});
  in.q = Tensor::from_f64({2, 2, 1}, {1, 0, 1, 0});
  in.kv = Tensor::from_f64({3, 1}, {0, std::log(3.0), 9});
  in.sm_scale = 1.0;
  in.windows = KeyWindows::explicit_windows({0, 2}, {2, 2}, 3);
  in.coeff = 2.0;
  return in;
}

TEST(KlLossTest, HandComputedDense) {
  const IndexerKlResult r = indexer_kl_loss(hand_inputs());
  const double loss = 2.0 * (3.0 / 8 * std::log(3.0 / 4) + 5.0 / 8 * std::log(5.0 / 4));
  EXPECT_EQ(r.loss.shape(), (std::vector<int64_t>{1}));
  EXPECT_TRUE(test::close(r.loss, Tensor::from_f64({1}, {loss}), test::kHandRelTol));
  // d_scores = coeff / n_rows · (q - p) on S_0, zero elsewhere (n_rows = 1).
  EXPECT_TRUE(test::close(r.d_scores, Tensor::from_f64({2, 3}, {0.25, -0.25, 0, 0, 0, 0}),
                          test::kHandRelTol));
}

TEST(KlLossTest, HandComputedSparseUsesDistinctValidIdsInsideTheWindow) {
  IndexerKlInputs in = hand_inputs();
  in.mode = KlMode::Sparse;
  // Row 0: id 1 twice, -1 invalid, 2 outside the window -> S_0 = {1}: p = q = (1), loss 0.
  in.indices = Tensor::from_i32({2, 4}, {1, -1, 1, 2, 0, 1, 2, 5});
  IndexerKlResult r = indexer_kl_loss(in);
  EXPECT_EQ(r.loss.get(0), 0.0);
  EXPECT_EQ(test::max_abs(r.d_scores), 0.0);
  // S_0 = {0, 1} through junk ids equals the dense result.
  in.indices = Tensor::from_i32({2, 4}, {7, 1, -3, 0, 0, 1, 2, 5});
  r = indexer_kl_loss(in);
  const IndexerKlResult dense = indexer_kl_loss(hand_inputs());
  EXPECT_TRUE(test::identical(r.loss, dense.loss));
  EXPECT_TRUE(test::identical(r.d_scores, dense.d_scores));
}

TEST(KlLossTest, ZeroTeacherMassContributesZeroNotNaN) {
  IndexerKlInputs in = hand_inputs();
  in.q = Tensor::from_f64({2, 1, 1}, {1, 1});
  in.kv = Tensor::from_f64({3, 1}, {0, -1000, 0});  // p = (1, 0) exactly: exp(-1000) = 0
  in.coeff = 1.0;
  const IndexerKlResult r = indexer_kl_loss(in);
  EXPECT_TRUE(test::close(r.loss, Tensor::from_f64({1}, {std::log(2.0)}), test::kHandRelTol));
  EXPECT_TRUE(test::close(r.d_scores, Tensor::from_f64({2, 3}, {-0.5, 0.5, 0, 0, 0, 0}),
                          test::kHandRelTol));
}

TEST(KlLossTest, NoRowWithKeysGivesZeroLoss) {
  IndexerKlInputs in = hand_inputs();
  in.windows = KeyWindows::explicit_windows({0, 0}, {0, 0}, 3);
  const IndexerKlResult r = indexer_kl_loss(in);
  EXPECT_EQ(r.loss.get(0), 0.0);
  EXPECT_EQ(test::max_abs(r.d_scores), 0.0);
}

// SPEC §7: a key whose score is -inf is not in S_t. Row 0 sees all three keys but key 2 scores
// -inf: S_0 = {0, 1}, the hand case's row (the teacher renormalised without key 2's large
// logit). Row 1's scores are all -inf: empty, out of the mean (n_rows = 1), d_scores 0.
TEST(KlLossTest, NegInfScoresAreNotInTheKeySet) {
  const double ninf = -std::numeric_limits<double>::infinity();
  IndexerKlInputs in = hand_inputs();
  in.scores = Tensor::from_f64({2, 3}, {0, 0, ninf, ninf, ninf, ninf});
  in.windows = KeyWindows::explicit_windows({0, 0}, {3, 3}, 3);
  const IndexerKlResult hand = indexer_kl_loss(hand_inputs());
  for (KlMode mode : {KlMode::Dense, KlMode::Sparse}) {
    in.mode = mode;
    in.indices = Tensor::from_i32({2, 4}, {2, 0, -1, 1, 1, 2, 0, -1});
    for (Precision p : {Precision::Reference, Precision::Baseline}) {
      const IndexerKlResult r = indexer_kl_loss(in, p);
      const double tol = p == Precision::Reference ? test::kHandRelTol : test::kBaselineRelTol;
      EXPECT_TRUE(test::close(r.loss.to(DType::F64), hand.loss, tol)) << to_string(mode);
      EXPECT_TRUE(test::close(r.d_scores.to(DType::F64), hand.d_scores, tol)) << to_string(mode);
    }
  }
  // Every score -inf: no row has keys, loss 0 (not NaN).
  in.scores = Tensor::from_f64({2, 3}, {ninf, ninf, ninf, ninf, ninf, ninf});
  const IndexerKlResult none = indexer_kl_loss(in);
  EXPECT_EQ(none.loss.get(0), 0.0);
  EXPECT_EQ(test::max_abs(none.d_scores), 0.0);
}

class KlLossFdTest : public ::testing::TestWithParam<KlMode> {};

TEST_P(KlLossFdTest, FiniteDifferenceGradientOfScores) {
  IndexerKlInputs in;
  in.scores = test::random_f64({4, 6}, 21);
  in.q = test::random_f64({4, 2, 5}, 22);
  in.kv = test::random_f64({6, 5}, 23);
  in.sm_scale = 0.7;
  in.windows = KeyWindows::explicit_windows({0, 0, 3, 1}, {3, 6, 3, 5}, 6);  // row 2 empty
  in.mode = GetParam();
  in.indices = Tensor::from_i32({4, 4}, {2, 0, 0, -1,  //
                                         5, 1, 3, 9,   //
                                         0, 1, 2, 3,   //
                                         4, 4, 0, 2});
  in.coeff = 0.3;
  const IndexerKlResult r = indexer_kl_loss(in);
  const Tensor fd = test::fd_gradient(in.scores, [&] { return indexer_kl_loss(in).loss.get(0); });
  EXPECT_GT(r.loss.get(0), 0.0);
  EXPECT_GT(test::max_abs(r.d_scores), 0.0);
  EXPECT_TRUE(test::close(r.d_scores, fd, test::kFdRelTol));
}

INSTANTIATE_TEST_SUITE_P(DenseAndSparse, KlLossFdTest,
                         ::testing::Values(KlMode::Dense, KlMode::Sparse));

TEST(KlLossTest, BaselineIsCloseToReferenceButComputedInFloat) {
  IndexerKlInputs in;
  in.scores = test::random_f64({8, 32}, 31).to(DType::F32);
  in.q = test::random_f64({8, 4, 16}, 32).to(DType::BF16);
  in.kv = test::random_f64({32, 16}, 33).to(DType::BF16);
  in.sm_scale = 0.25;
  in.windows = KeyWindows::causal(8, 32);
  const IndexerKlResult r = indexer_kl_loss(in);
  const IndexerKlResult b = indexer_kl_loss(in, Precision::Baseline);
  EXPECT_EQ(b.loss.dtype(), DType::F32);
  EXPECT_TRUE(test::close(b.loss, r.loss, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(b.d_scores, r.d_scores, test::kBaselineRelTol));
  EXPECT_FALSE(test::identical(b.d_scores.to(DType::F64), r.d_scores));
}


// SPEC §6 (no valid input produces NaN), §7 (-inf marks a key outside S_t), §9 (fp32 kernels):
// values no fp32 kernel can compute are input errors naming the argument, on both precisions
// (fresh-user finding F15: a +inf score inside the window made the reference NaN, and a NaN
// candidate agreed). Values the loss never reads may hold anything; values just inside the
// limits are computed.
TEST(KlLossTest, ValuesNoFp32KernelCanComputeAreInputErrorsNamingTheArgument) {
  const double big = static_cast<double>(std::numeric_limits<float>::max());
  for (KlMode mode : {KlMode::Dense, KlMode::Sparse}) {
    SCOPED_TRACE(to_string(mode));
    IndexerKlInputs ok = hand_inputs();
    ok.mode = mode;
    ok.indices = Tensor::from_i32({2, 2}, {0, 1, 2, -1});  // row 0: S_0 = {0, 1}
    const IndexerKlResult hand = indexer_kl_loss(ok);
    auto with_score = [&](int64_t i, double v) {
      IndexerKlInputs in = ok;
      in.scores = ok.scores.to(DType::F64);
      in.scores.set(i, v);
      return in;
    };
    for (Precision p : {Precision::Reference, Precision::Baseline})
      for (double v : {test::kInf, test::kNaN, 2 * big, -2 * big}) {
        const IndexerKlInputs in = with_score(1, v);  // row 0, key 1: in S_0
        EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(in, p); }, "scores")) << v;
      }
    // One row's finite scores spanning more than FLT_MAX (I - max overflows fp32); at FLT_MAX
    // apart they are computed.
    IndexerKlInputs span = with_score(0, -big);
    span.scores.set(1, big);
    EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(span); }, "scores"));
    span.scores.set(0, 0.0);
    EXPECT_NO_THROW(indexer_kl_loss(span));
    // Keys outside row 0's window and the empty row 1 are never read: anything goes there.
    for (double v : {test::kInf, test::kNaN}) {
      IndexerKlInputs in = with_score(2, v);
      in.scores.set(4, v);
      const IndexerKlResult r = indexer_kl_loss(in);
      EXPECT_TRUE(test::identical(r.loss, hand.loss));
      in.q = ok.q.to(DType::F64);
      in.q.set(2, v);  // q row 1: its window is empty
      in.kv = ok.kv.to(DType::F64);
      in.kv.set(2, v);  // kv row 2: in no S_t
      EXPECT_TRUE(test::identical(indexer_kl_loss(in).loss, hand.loss));
      in.q.set(0, v);  // q row 0 is read
      EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(in); }, "q"));
      in.q = ok.q;
      in.kv.set(1, v);  // kv row 1 is in S_0
      EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(in); }, "kv"));
    }
    // Teacher logits past fp32's range (1e20 · 1e19): an fp32 P overflows; 1e19 · 1e19 fits.
    IndexerKlInputs logit = ok;
    logit.q = Tensor::from_f64({2, 2, 1}, {1e20, 0, 1, 0});
    logit.kv = Tensor::from_f64({3, 1}, {1e19, 1, 9});
    EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(logit); }, "q"));
    logit.q.set(0, 1e19);
    EXPECT_NO_THROW(indexer_kl_loss(logit));
    IndexerKlInputs coeff = ok;
    coeff.coeff = 2 * big;
    EXPECT_TRUE(test::throws_naming([&] { indexer_kl_loss(coeff); }, "coeff"));
  }
}

}  // namespace
}  // namespace dsa
