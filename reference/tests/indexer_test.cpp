// Indexer scores (SPEC §2): hand case, backward by hand, FD gradients, baseline sanity.
#include "dsa/reference/indexer.h"
#include "dsa/reference/topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "test_support.h"

namespace dsa {
namespace {

using reference::indexer_scores;
using reference::indexer_scores_backward;
using reference::Precision;
using test::kInf;

struct HandCase {
  // Row 0 sees keys [0,3); row 1 sees [1,3). q_idx[1,0]·k_idx[1] = 0 exactly (ReLU kink).
  Tensor q = Tensor::from_f64({2, 2, 2}, {1, 0, 0, 1,  //
                                          1, 1, -1, 0});
  Tensor k = Tensor::from_f64({3, 2}, {2, -1, 1, -1, 0, 3});
  Tensor w = Tensor::from_f64({2, 2}, {0.5, -2, 1, 3});
  KeyWindows win = KeyWindows::explicit_windows({0, 1}, {3, 3}, 3);
};

TEST(IndexerTest, HandComputedForward) {
  HandCase c;
  const Tensor I = indexer_scores(c.q, c.k, c.w, c.win);
  EXPECT_EQ(I.dtype(), DType::F64);
  EXPECT_TRUE(test::identical(I, Tensor::from_f64({2, 3}, {1, 0.5, -6, -kInf, 0, 3})));
}

TEST(IndexerTest, HandComputedBackwardIgnoresOutsideWindowAndReluPrimeZeroIsZero) {
  HandCase c;
  // Upstream 1 inside the windows; 100 at (1, 0), outside row 1's window: ignored.
  const Tensor dI = Tensor::from_f64({2, 3}, {1, 1, 1, 100, 1, 1});
  const IndexerGrads g = indexer_scores_backward(c.q, c.k, c.w, c.win, dI);
  EXPECT_TRUE(test::identical(g.dw, Tensor::from_f64({2, 2}, {3, 3, 3, 0})));
  EXPECT_TRUE(test::identical(g.dq_idx, Tensor::from_f64({2, 2, 2}, {1.5, -1, 0, -6,  //
                                                                     0, 3, 0, 0})));
  EXPECT_TRUE(test::identical(g.dk_idx, Tensor::from_f64({3, 2}, {0.5, 0, 0.5, 0, 1, -1})));
}

TEST(IndexerTest, Bf16InputsAreReadExactly) {
  HandCase c;
  const Tensor I = indexer_scores(c.q.to(DType::BF16), c.k.to(DType::F16), c.w.to(DType::F32),
                                  c.win);
  EXPECT_TRUE(test::identical(I, indexer_scores(c.q, c.k, c.w, c.win)));
}

// Random inputs whose every q·k is at least kReluMargin away from 0.
struct FdCase {
  Tensor q, k, w, dI;
  KeyWindows win = KeyWindows::explicit_windows({0, 1, 2, 0}, {3, 5, 2, 5}, 5);  // row 2 empty
  FdCase() {
    for (uint64_t seed = 1;; ++seed) {
      q = test::random_f64({4, 3, 4}, seed);
      k = test::random_f64({5, 4}, seed + 1000);
      bool ok = true;
      for (int64_t i = 0; i < 12 && ok; ++i)
        for (int64_t s = 0; s < 5 && ok; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < 4; ++e) dot += q.get(i * 4 + e) * k.get(s * 4 + e);
          ok = std::fabs(dot) > test::kReluMargin;
        }
      if (ok) break;
    }
    w = test::random_f64({4, 3}, 77);  // mixed signs
    dI = test::random_f64({4, 5}, 78);
  }
  double objective() const {  // J = Σ_{s in window} I[t,s] · dI[t,s]
    const Tensor I = indexer_scores(q, k, w, win);
    double j = 0;
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t s = 0; s < 5; ++s)
        if (win.contains(t, s)) j += I.get(t * 5 + s) * dI.get(t * 5 + s);
    return j;
  }
};

TEST(IndexerTest, FiniteDifferenceGradients) {
  FdCase c;
  const IndexerGrads g = indexer_scores_backward(c.q, c.k, c.w, c.win, c.dI);
  auto f = [&] { return c.objective(); };
  EXPECT_TRUE(test::close(g.dq_idx, test::fd_gradient(c.q, f), test::kFdRelTol));
  EXPECT_TRUE(test::close(g.dk_idx, test::fd_gradient(c.k, f), test::kFdRelTol));
  EXPECT_TRUE(test::close(g.dw, test::fd_gradient(c.w, f), test::kFdRelTol));
  EXPECT_GT(test::max_abs(g.dq_idx), 0.0);
  EXPECT_GT(test::max_abs(g.dk_idx), 0.0);
  EXPECT_GT(test::max_abs(g.dw), 0.0);
}

TEST(IndexerTest, BaselineIsCloseToReferenceButComputedInFloat) {
  const Tensor q = test::random_f64({8, 4, 64}, 3).to(DType::BF16);
  const Tensor k = test::random_f64({32, 64}, 4).to(DType::BF16);
  const Tensor w = test::random_f64({8, 4}, 5, 0.1).to(DType::F32);
  const KeyWindows win = KeyWindows::causal(8, 32);
  const Tensor ref = indexer_scores(q, k, w, win);
  const Tensor base = indexer_scores(q, k, w, win, Precision::Baseline);
  EXPECT_EQ(base.dtype(), DType::F32);
  EXPECT_TRUE(test::close(base, ref, test::kBaselineRelTol));
  EXPECT_FALSE(test::identical(base.to(DType::F64), ref));
  const Tensor dI = test::random_f64({8, 32}, 6).to(DType::F32);
  const IndexerGrads gr = indexer_scores_backward(q, k, w, win, dI);
  const IndexerGrads gb = indexer_scores_backward(q, k, w, win, dI, Precision::Baseline);
  EXPECT_TRUE(test::close(gb.dq_idx, gr.dq_idx, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(gb.dk_idx, gr.dk_idx, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(gb.dw, gr.dw, test::kBaselineRelTol));
}


// Exact tier (SPEC §9): small integers make every sum exact in fp32, so the baseline equals
// the reference bit for bit, and ReLU zeros build tie plateaus that top-k resolves identically.
TEST(IndexerTest, IntegerGridIsBitExactAtBothPrecisionsAndTopkAgrees) {
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int> small(-4, 4), weight(-3, 3);
  Tensor q(DType::BF16, {6, 4, 32}), k(DType::BF16, {40, 32}), w(DType::F32, {6, 4});
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, small(rng));
  for (int64_t i = 0; i < k.numel(); ++i) k.set(i, small(rng));
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, weight(rng));
  const KeyWindows win = KeyWindows::causal(6, 40);
  const Tensor ref = indexer_scores(q, k, w, win);
  const Tensor base = indexer_scores(q, k, w, win, Precision::Baseline);
  EXPECT_GT(test::max_abs(ref), 0.0);
  EXPECT_TRUE(test::identical(base.to(DType::F64), ref));
  const TopkPolicy policy{TieBreak::Small, true};
  EXPECT_TRUE(test::identical(reference::select_topk(base, 16, policy, win),
                              reference::select_topk(ref, 16, policy, win)));
}


// SPEC §6 (no valid input may produce NaN), §2 (fp32 scores, fp32 accumulation): values no
// fp32 kernel can compute are input errors naming the argument, on both precisions (fresh-user
// finding F5: scores past FLT_MAX were judged, and no fp32 kernel could pass). Rows and keys
// never read may hold anything; a score just inside FLT_MAX is computed, finite at fp32.
TEST(IndexerTest, ValuesNoFp32KernelCanComputeAreInputErrorsNamingTheArgument) {
  const double big = static_cast<double>(std::numeric_limits<float>::max());
  HandCase c;
  const Tensor dI = Tensor::from_f64({2, 3}, {1, 1, 1, 100, 1, 1});
  // Row 0's key 2 is formed of |w[0,1]| · 3 = 6 (times the scale of w's row 0).
  auto scaled_w = [&](double f) { return Tensor::from_f64({2, 2}, {0.5 * f, -2 * f, 1, 3}); };
  for (Precision p : {Precision::Reference, Precision::Baseline}) {
    EXPECT_TRUE(test::throws_naming([&] { indexer_scores(c.q, c.k, scaled_w(big / 5), c.win, p); }, "w"));
    const Tensor fits = indexer_scores(c.q, c.k, scaled_w(big / 7), c.win, p);
    EXPECT_TRUE(std::isfinite(fits.get(2))) << fits.get(2);
    EXPECT_LT(fits.get(2), -big / 2);
  }
  EXPECT_NO_THROW(indexer_scores_backward(c.q, c.k, scaled_w(big / 7), c.win, dI));
  // A dot past FLT_MAX: q_idx[0,1] · k_idx[2] = 3 · 1.2e38 (2 · 1.2e38 is computed).
  Tensor q = c.q.to(DType::F64), k = c.k.to(DType::F64);
  k.set(5, 1.2e38);
  q.set(3, 3);
  EXPECT_TRUE(test::throws_naming([&] { indexer_scores(q, k, c.w, c.win); }, "q_idx"));
  EXPECT_TRUE(test::throws_naming([&] { indexer_scores_backward(q, k, c.w, c.win, dI); }, "q_idx"));
  q.set(3, 2);
  EXPECT_NO_THROW(indexer_scores(q, k, Tensor::from_f64({2, 2}, {0.5, -0.5, 1, 1}), c.win));
  // Non-finite values: read (row 1 reads keys 1 and 2) or not (row 0's window emptied, key 0).
  const KeyWindows one_row = KeyWindows::explicit_windows({0, 1}, {0, 3}, 3);
  for (double v : {kInf, -kInf, test::kNaN}) {
    Tensor q = c.q.to(DType::F64), kk = c.k.to(DType::F64), w = c.w.to(DType::F64), d = dI;
    q.set(0, v);
    w.set(0, v);
    kk.set(0, v);
    d.set(0, v);
    d.set(3, v);  // row 1, key 0: outside row 1's window
    const Tensor I = indexer_scores(q, kk, w, one_row);
    EXPECT_TRUE(test::identical(I, indexer_scores(c.q, c.k, c.w, one_row)));
    EXPECT_TRUE(test::identical(indexer_scores_backward(q, kk, w, one_row, d).dq_idx,
                                indexer_scores_backward(c.q, c.k, c.w, one_row, dI).dq_idx));
    EXPECT_TRUE(test::throws_naming([&] { indexer_scores(q, kk, w, c.win); }, "k_idx")) << v;
    EXPECT_TRUE(test::throws_naming([&] { indexer_scores(q, c.k, c.w, c.win); }, "q_idx")) << v;
    EXPECT_TRUE(test::throws_naming([&] { indexer_scores(c.q, c.k, w, c.win); }, "w")) << v;
    EXPECT_TRUE(test::throws_naming([&] { indexer_scores_backward(c.q, c.k, c.w, c.win, d); }, "d_scores"))
        << v;
  }
  // Gradients past FLT_MAX (a huge upstream d_scores): no fp32 kernel can return them.
  const Tensor huge = Tensor::from_f64({2, 3}, {big, big, big, 0, 1, 1});
  try {
    indexer_scores_backward(c.q, c.k, c.w, c.win, huge);
    ADD_FAILURE() << "no error for gradients past FLT_MAX";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FLT_MAX"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'d_scores, w, q_idx, k_idx'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsa
