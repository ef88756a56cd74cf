// Bad input: every public reference function throws std::invalid_argument naming the
// argument, the value received and the value expected. One test per kind.
#include <gtest/gtest.h>

#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"
#include "test_support.h"

namespace dsa {
namespace {

using namespace dsa::reference;
using test::throws_naming;

// ---- indexer ----
struct IndexerArgs {
  Tensor q = Tensor(DType::F32, {2, 3, 4});
  Tensor k = Tensor(DType::BF16, {5, 4});
  Tensor w = Tensor(DType::F32, {2, 3});
  KeyWindows win = KeyWindows::causal(2, 5);
  Tensor dI = Tensor(DType::F32, {2, 5});
};

TEST(BadInputTest, IndexerValidArgumentsPass) {
  IndexerArgs a;
  EXPECT_NO_THROW(indexer_scores(a.q, a.k, a.w, a.win));
  EXPECT_NO_THROW(indexer_scores_backward(a.q, a.k, a.w, a.win, a.dI));
}
TEST(BadInputTest, IndexerQRank) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming([&] { indexer_scores(Tensor(DType::F32, {2, 12}), a.k, a.w, a.win); },
                            "q_idx"));
}
TEST(BadInputTest, IndexerQDtype) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q.to(DType::I32), a.k, a.w, a.win); }, "q_idx"));
}
TEST(BadInputTest, IndexerKeyWidthMismatch) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, Tensor(DType::F32, {5, 3}), a.w, a.win); },
                            "k_idx"));
}
TEST(BadInputTest, IndexerWeightShapeAndDtype) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, a.k, Tensor(DType::F32, {2, 4}), a.win); }, "w"));
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, a.k, a.w.to(DType::BF16), a.win); }, "w"));
}
TEST(BadInputTest, IndexerWindowsRowsAndKeys) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, a.k, a.w, KeyWindows::causal(3, 5)); },
                            "windows"));
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, a.k, a.w, KeyWindows::causal(2, 6)); },
                            "windows"));
  KeyWindows broken = a.win;
  broken.ke[1] = 9;  // built by hand past s_kv
  EXPECT_TRUE(throws_naming([&] { indexer_scores(a.q, a.k, a.w, broken); }, "windows"));
}
TEST(BadInputTest, IndexerBackwardUpstreamShape) {
  IndexerArgs a;
  EXPECT_TRUE(throws_naming(
      [&] { indexer_scores_backward(a.q, a.k, a.w, a.win, Tensor(DType::F32, {2, 4})); },
      "d_scores"));
}

// ---- top-k ----
TEST(BadInputTest, TopkScoresRankAndDtype) {
  EXPECT_TRUE(throws_naming([] { select_topk(Tensor(DType::F32, {6}), 2, TopkPolicy{}); }, "scores"));
  EXPECT_TRUE(throws_naming([] { select_topk(Tensor(DType::I32, {2, 3}), 2, TopkPolicy{}); },
                            "scores"));
}
TEST(BadInputTest, TopkNegativeK) {
  EXPECT_TRUE(throws_naming([] { select_topk(Tensor(DType::F32, {2, 3}), -1, TopkPolicy{}); }, "k"));
}
TEST(BadInputTest, TopkWindowsMismatch) {
  EXPECT_TRUE(throws_naming(
      [] { select_topk(Tensor(DType::F32, {2, 3}), 1, TopkPolicy{}, KeyWindows::full(2, 4)); },
      "windows"));
}

// ---- sparse MLA ----
SparseMlaInputs mla_args() {
  SparseMlaInputs in;
  in.q = Tensor(DType::BF16, {2, 4, 8});
  in.kv = Tensor(DType::BF16, {5, 8});
  in.indices = Tensor::from_i32({2, 3}, {0, 1, 2, 3, 4, -1});
  in.sm_scale = 0.5;
  in.d_v = 6;
  return in;
}

TEST(BadInputTest, SparseMlaValidArgumentsPass) {
  SparseMlaInputs in = mla_args();
  in.topk_length = Tensor::from_i32({2}, {3, 2});
  in.attn_sink = Tensor(DType::F32, {4});
  EXPECT_NO_THROW(sparse_mla_forward(in));
  EXPECT_NO_THROW(sparse_mla_backward(in, Tensor(DType::F32, {2, 4, 6})));
}
TEST(BadInputTest, SparseMlaQRankAndKvWidth) {
  SparseMlaInputs in = mla_args();
  in.q = Tensor(DType::BF16, {8, 8});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "q"));
  in = mla_args();
  in.kv = Tensor(DType::BF16, {5, 7});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "kv"));
}
TEST(BadInputTest, SparseMlaKvDtype) {
  SparseMlaInputs in = mla_args();
  in.kv = Tensor(DType::U8, {5, 8});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "kv"));
}
TEST(BadInputTest, SparseMlaDvOutOfRange) {
  SparseMlaInputs in = mla_args();
  in.d_v = 0;
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "d_v"));
  in.d_v = 9;
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "d_v"));
  try {
    sparse_mla_forward(in);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "sparse_mla_forward: argument 'd_v' got 9, expected 0 < d_v <= d_qk = 8");
  }
}
TEST(BadInputTest, SparseMlaNonFiniteScale) {
  SparseMlaInputs in = mla_args();
  in.sm_scale = test::kNaN;
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "sm_scale"));
  in.sm_scale = test::kInf;
  EXPECT_TRUE(throws_naming([&] { sparse_mla_backward(in, Tensor(DType::F32, {2, 4, 6})); },
                            "sm_scale"));
}
TEST(BadInputTest, SparseMlaIndicesShapeAndDtype) {
  SparseMlaInputs in = mla_args();
  in.indices = Tensor(DType::I32, {3, 3});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "indices"));
  in.indices = Tensor(DType::I32, {2, 2, 3});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "indices"));
  in.indices = Tensor(DType::I64, {2, 3});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "indices"));
}
TEST(BadInputTest, SparseMlaTopkLengthShapeAndDtype) {
  SparseMlaInputs in = mla_args();
  in.topk_length = Tensor(DType::I32, {3});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "topk_length"));
  in.topk_length = Tensor(DType::I64, {2});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "topk_length"));
}
TEST(BadInputTest, SparseMlaAttnSinkShapeDtypeAndNaN) {
  SparseMlaInputs in = mla_args();
  in.attn_sink = Tensor(DType::F32, {1});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "attn_sink"));
  in.attn_sink = Tensor(DType::BF16, {4});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "attn_sink"));
  in.attn_sink = Tensor::from_f64({4}, {0, test::kNaN, 0, 0});
  EXPECT_TRUE(throws_naming([&] { sparse_mla_forward(in); }, "attn_sink"));
}
TEST(BadInputTest, SparseMlaBackwardDoutShape) {
  EXPECT_TRUE(throws_naming(
      [] { sparse_mla_backward(mla_args(), Tensor(DType::F32, {2, 4, 8})); }, "dout"));
}

// ---- KL loss ----
IndexerKlInputs kl_args() {
  IndexerKlInputs in;
  in.scores = Tensor(DType::F32, {2, 5});
  in.q = Tensor(DType::BF16, {2, 4, 8});
  in.kv = Tensor(DType::BF16, {5, 8});
  in.windows = KeyWindows::causal(2, 5);
  return in;
}

TEST(BadInputTest, KlValidArgumentsPass) {
  IndexerKlInputs in = kl_args();
  EXPECT_NO_THROW(indexer_kl_loss(in));
  in.mode = KlMode::Sparse;
  in.indices = Tensor::from_i32({2, 1, 2}, {0, 1, 2, 3});
  EXPECT_NO_THROW(indexer_kl_loss(in));
}
TEST(BadInputTest, KlScoresDtype) {
  IndexerKlInputs in = kl_args();
  in.scores = in.scores.to(DType::BF16);
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "scores"));
}
TEST(BadInputTest, KlQAndKvShapes) {
  IndexerKlInputs in = kl_args();
  in.q = Tensor(DType::BF16, {3, 4, 8});
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "q"));
  in = kl_args();
  in.kv = Tensor(DType::BF16, {4, 8});
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "kv"));
}
TEST(BadInputTest, KlWindowsMismatch) {
  IndexerKlInputs in = kl_args();
  in.windows = KeyWindows::causal(2, 4);
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "windows"));
}
TEST(BadInputTest, KlSparseWithoutIndices) {
  IndexerKlInputs in = kl_args();
  in.mode = KlMode::Sparse;
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "indices"));
  in.indices = Tensor(DType::I32, {3, 2});
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "indices"));
}
TEST(BadInputTest, KlNonFiniteScaleAndCoeff) {
  IndexerKlInputs in = kl_args();
  in.sm_scale = test::kInf;
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "sm_scale"));
  in = kl_args();
  in.coeff = test::kNaN;
  EXPECT_TRUE(throws_naming([&] { indexer_kl_loss(in); }, "coeff"));
}

}  // namespace
}  // namespace dsa
