// Top-k selection (SPEC §3): hand cases for every rule.
#include "dsa/reference/topk.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace dsa {
namespace {

using reference::select_topk;
using test::kInf;
using test::kNaN;

Tensor row_scores(const std::vector<double>& v, DType dtype = DType::F32) {
  return Tensor::from_f64({1, static_cast<int64_t>(v.size())}, v).to(dtype);
}

std::vector<int32_t> ids_of(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

TEST(TopkTest, OutputIsInt32ContiguousOfWidthK) {
  const Tensor out = select_topk(row_scores({1, 2, 3}), 2, TopkPolicy{});
  EXPECT_EQ(out.dtype(), DType::I32);
  EXPECT_EQ(out.shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ids_of(out), (std::vector<int32_t>{2, 1}));
}

TEST(TopkTest, TiePlateauSmallLargeAny) {
  // v* = 3 with four entries equal to it; two slots left after the 5.
  const Tensor s = row_scores({3, 5, 3, 1, 3, 3});
  EXPECT_EQ(ids_of(select_topk(s, 3, {TieBreak::Small, true})), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(ids_of(select_topk(s, 3, {TieBreak::Large, true})), (std::vector<int32_t>{1, 5, 4}));
  // any resolves as small in the reference.
  EXPECT_EQ(ids_of(select_topk(s, 3, {TieBreak::Any, true})), (std::vector<int32_t>{1, 0, 2}));
}

TEST(TopkTest, ReluZeroPlateauAndSignedZeroAreEqual) {
  // -0.0 == +0.0: the plateau is {1, 2, 3}; small takes 1, 2.
  const Tensor s = row_scores({-1, 0.0, -0.0, 0.0, 2});
  EXPECT_EQ(ids_of(select_topk(s, 3, {TieBreak::Small, true})), (std::vector<int32_t>{4, 1, 2}));
  EXPECT_EQ(ids_of(select_topk(s, 3, {TieBreak::Large, true})), (std::vector<int32_t>{4, 3, 2}));
}

TEST(TopkTest, NanAndNegInfNeverSelectedAndKGreaterThanSkv) {
  const Tensor s = row_scores({kNaN, -kInf, 1, kInf, -2});
  // 3 selectable (1, +inf, -2); k = 7 > s_kv = 5: compact prefix then -1.
  EXPECT_EQ(ids_of(select_topk(s, 7, TopkPolicy{})),
            (std::vector<int32_t>{3, 2, 4, -1, -1, -1, -1}));
}

TEST(TopkTest, KZeroGivesEmptyRows) {
  const Tensor out = select_topk(row_scores({1, 2}), 0, TopkPolicy{});
  EXPECT_EQ(out.shape(), (std::vector<int64_t>{1, 0}));
}

// Rows with no slot (k = 0) or no key (s_kv = 0) are not selected in one by one: 2^31 - 1 of
// them took 15 s (fresh-user finding 8); the output is the same ([s_q, 0], or all -1).
TEST(TopkTest, EmptyRowsAreNotVisited) {
  const int64_t most = 2147483647;
  EXPECT_EQ(reference::topk_rows_selected(most, 0, 0), 0);
  EXPECT_EQ(reference::topk_rows_selected(5, 3, 0), 0);
  EXPECT_EQ(reference::topk_rows_selected(5, 0, 4), 0);
  EXPECT_EQ(reference::topk_rows_selected(5, 3, 2), 5);
  EXPECT_EQ(reference::topk_rows_selected(-1, 3, 2), 0);
  const Tensor out = select_topk(Tensor(DType::F32, {most, 0}), 0, TopkPolicy{});
  EXPECT_EQ(out.shape(), (std::vector<int64_t>{most, 0}));
  const Tensor pad = select_topk(Tensor(DType::F32, {3, 0}), 2, TopkPolicy{});
  EXPECT_EQ(ids_of(pad), (std::vector<int32_t>(6, -1)));
}

TEST(TopkTest, WindowsRestrictSelectionAndEmptyWindowIsAllMinusOne) {
  const Tensor s = Tensor::from_f64({3, 4}, {9, 1, 2, 3,  //
                                             9, 8, 7, 6,  //
                                             1, 2, 3, 4});
  const KeyWindows w = KeyWindows::explicit_windows({1, 0, 2}, {4, 2, 2}, 4);
  EXPECT_EQ(ids_of(select_topk(s, 2, TopkPolicy{}, w)),
            (std::vector<int32_t>{3, 2,  //
                                  0, 1,  //
                                  -1, -1}));
}

TEST(TopkTest, CausalWindowWithLeadingRowsShorterThanK) {
  const Tensor s = Tensor::from_f64({3, 3}, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_EQ(ids_of(select_topk(s, 2, TopkPolicy{}, KeyWindows::causal(3, 3))),
            (std::vector<int32_t>{0, -1, 0, 1, 0, 1}));
}

TEST(TopkTest, SortedOrderIsScoreDescendingThenTieOrder) {
  const Tensor s = row_scores({2, 7, 2, 7, 5}, DType::F64);
  EXPECT_EQ(ids_of(select_topk(s, 5, {TieBreak::Small, true})),
            (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(ids_of(select_topk(s, 5, {TieBreak::Large, true})),
            (std::vector<int32_t>{3, 1, 4, 2, 0}));
}

TEST(TopkTest, UnsortedSelectsTheSameSet) {
  const Tensor s = row_scores({2, 7, 2, 7, 5, 2});
  std::vector<int32_t> got = ids_of(select_topk(s, 4, {TieBreak::Small, false}));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 3, 4}));
}

TEST(TopkTest, DeterministicBytes) {
  const Tensor s = test::random_f64({4, 50}, 7).to(DType::F32);
  EXPECT_TRUE(test::identical(select_topk(s, 9, TopkPolicy{}), select_topk(s, 9, TopkPolicy{})));
}

TEST(TopkTest, F32ScoresAreComparedExactly) {
  // Two values one float ulp apart must not tie.
  const float a = 1.0f, b = std::nextafter(1.0f, 2.0f);
  const Tensor s = row_scores({a, b, a});
  EXPECT_EQ(ids_of(select_topk(s, 1, TopkPolicy{})), (std::vector<int32_t>{1}));
}

}  // namespace
}  // namespace dsa
