// Sparse MLA forward/backward (SPEC §4-§6): hand cases, sinks, invariants, FD gradients.
#include "dsa/reference/sparse_mla.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstring>

#include "test_support.h"

namespace dsa {
namespace {

using reference::Precision;
using reference::sparse_mla_backward;
using reference::sparse_mla_forward;
using test::kInf;

const double kLn3 = std::log(3.0);

// kv0 = [0, 1, 7], kv1 = [ln 3, 5, -2], q = [1, 0, 0], sm_scale 1, d_v 2: logits (0, ln 3),
// softmax (1/4, 3/4), out = [3/4 ln 3, 4], lse = ln 4, max_logits = ln 3.
SparseMlaInputs hand_inputs(const std::vector<int32_t>& indices, int64_t k) {
  const int64_t s_q = static_cast<int64_t>(indices.size()) / k;
  SparseMlaInputs in;
  std::vector<double> q;
  for (int64_t t = 0; t < s_q; ++t) q.insert(q.end(), {1, 0, 0});
  in.q = Tensor::from_f64({s_q, 1, 3}, q);
  in.kv = Tensor::from_f64({2, 3}, {0, 1, 7, kLn3, 5, -2});
  in.indices = Tensor::from_i32({s_q, k}, indices);
  in.sm_scale = 1.0;
  in.d_v = 2;
  return in;
}

void expect_row(const SparseMlaForward& f, int64_t t, std::vector<double> out, double lse,
                double mx) {
  EXPECT_TRUE(test::close(Tensor::from_f64({2}, {f.out.get(2 * t), f.out.get(2 * t + 1)}),
                          Tensor::from_f64({2}, out), test::kHandRelTol))
      << "row " << t;
  EXPECT_TRUE(test::close(Tensor::from_f64({1}, {f.lse.get(t)}), Tensor::from_f64({1}, {lse}),
                          test::kHandRelTol))
      << "row " << t;
  EXPECT_EQ(f.max_logits.get(t), mx) << "row " << t;
}

TEST(SparseMlaTest, HandComputedRowsPaddingEmptyAndDuplicates) {
  const SparseMlaInputs in = hand_inputs({0, 1, -1, -1,    // plain, trailing padding
                                          -1, 7, 0, 1,     // leading padding, id >= s_kv
                                          -1, -1, 2, -9,   // no valid slot: empty row
                                          0, 0, 1, -1},    // duplicate id: separate terms
                                         4);
  const SparseMlaForward f = sparse_mla_forward(in);
  EXPECT_EQ(f.out.dtype(), DType::F64);
  EXPECT_EQ(f.out.shape(), (std::vector<int64_t>{4, 1, 2}));
  expect_row(f, 0, {0.75 * kLn3, 4}, std::log(4.0), kLn3);
  expect_row(f, 1, {0.75 * kLn3, 4}, std::log(4.0), kLn3);
  EXPECT_EQ(f.out.get(4), 0.0);  // SPEC §6
  EXPECT_EQ(f.out.get(5), 0.0);
  EXPECT_EQ(f.lse.get(2), kInf);
  EXPECT_EQ(f.max_logits.get(2), -kInf);
  expect_row(f, 3, {0.6 * kLn3, 3.4}, std::log(5.0), kLn3);
}

TEST(SparseMlaTest, TopkLengthInvalidatesTrailingSlots) {
  SparseMlaInputs in = hand_inputs({0, 0, 1, 1, 0, 1}, 3);
  in.topk_length = Tensor::from_i32({2}, {1, 0});  // row 0 keeps slot 0; row 1 empty
  const SparseMlaForward f = sparse_mla_forward(in);
  expect_row(f, 0, {0, 1}, 0.0, 0.0);
  EXPECT_EQ(f.lse.get(1), kInf);
}

TEST(SparseMlaTest, IndicesWithUnitMiddleDimensionAreAccepted) {
  SparseMlaInputs a = hand_inputs({0, 1, -1, 0}, 2);
  SparseMlaInputs b = a;
  b.indices = a.indices.reshaped({2, 1, 2});
  const SparseMlaForward fa = sparse_mla_forward(a), fb = sparse_mla_forward(b);
  EXPECT_TRUE(test::identical(fa.out, fb.out));
  EXPECT_TRUE(test::identical(fa.lse, fb.lse));
}

TEST(SparseMlaTest, SinkScalesOutAndLeavesLseUnchanged) {
  SparseMlaInputs in = hand_inputs({0, 1, -1, -1}, 2);  // row 1 empty
  const SparseMlaForward plain = sparse_mla_forward(in);
  // sink = ln 4 = lse: out *= 4 / (4 + 4) = 1/2.
  in.attn_sink = Tensor::from_f64({1}, {std::log(4.0)});
  SparseMlaForward f = sparse_mla_forward(in);
  expect_row(f, 0, {0.375 * kLn3, 2}, std::log(4.0), kLn3);
  EXPECT_EQ(f.lse.get(1), kInf);
  EXPECT_EQ(f.out.get(2), 0.0);
  // -inf sink: no effect at all.
  in.attn_sink = Tensor::from_f64({1}, {-kInf});
  f = sparse_mla_forward(in);
  EXPECT_TRUE(test::identical(f.out, plain.out));
  EXPECT_TRUE(test::identical(f.lse, plain.lse));
  // +inf sink: the sink takes all the mass; out 0, lse unchanged, no NaN.
  in.attn_sink = Tensor::from_f64({1}, {kInf}).to(DType::F32);
  f = sparse_mla_forward(in);
  EXPECT_EQ(f.out.get(0), 0.0);
  EXPECT_EQ(f.out.get(1), 0.0);
  EXPECT_TRUE(test::identical(f.lse, plain.lse));
}

TEST(SparseMlaTest, ExtremeSinksProduceNoNaNForwardOrBackward) {
  for (double sink : {80.0, -80.0, kInf, -kInf}) {
    for (Precision p : {Precision::Reference, Precision::Baseline}) {
      SparseMlaInputs in = hand_inputs({0, 1, -1, -1}, 2);
      in.attn_sink = Tensor::from_f64({1}, {sink}).to(DType::F32);
      const SparseMlaForward f = sparse_mla_forward(in, p);
      const SparseMlaGrads g = sparse_mla_backward(in, Tensor::from_f64({2, 1, 2}, {1, -1, 2, 3}), p);
      for (const Tensor* t : {&f.out, &g.dq, &g.dkv, &*g.dsink})
        for (int64_t i = 0; i < t->numel(); ++i)
          EXPECT_TRUE(std::isfinite(t->get(i))) << "sink " << sink << " entry " << i;
      // lse ignores the sink: ln 4 at either precision.
      EXPECT_TRUE(test::close(Tensor::from_f64({1}, {f.lse.get(0)}),
                              Tensor::from_f64({1}, {std::log(4.0)}), test::kBaselineRelTol));
      EXPECT_EQ(f.lse.get(1), kInf);
    }
  }
}

TEST(SparseMlaTest, EmptyRowBackwardIsZeroAndContributesNothing) {
  SparseMlaInputs in = hand_inputs({-1, -1, 0, 1}, 2);  // row 0 empty
  in.attn_sink = Tensor::from_f64({1}, {0.5});
  const Tensor dout = Tensor::from_f64({2, 1, 2}, {5, 6, 1, -1});
  const SparseMlaGrads g = sparse_mla_backward(in, dout);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(g.dq.get(i), 0.0);
  // The same with row 0's upstream gradient zeroed: row 0 adds nothing to dkv or dsink.
  const SparseMlaGrads g0 = sparse_mla_backward(in, Tensor::from_f64({2, 1, 2}, {0, 0, 1, -1}));
  EXPECT_TRUE(test::identical(g.dkv, g0.dkv));
  EXPECT_TRUE(test::identical(*g.dsink, *g0.dsink));
}

// Fills and frees tensors of each size in `nbytes`, so that the allocations that follow
// (of the same sizes) likely reuse memory holding 0xFF bytes (NaN as float64).
void dirty_heap(std::initializer_list<size_t> nbytes) {
  for (size_t n : nbytes) {
    Tensor t = Tensor::for_overwrite(DType::U8, {static_cast<int64_t>(n)});
    std::memset(t.raw(), 0xFF, n);
  }
}

// The outputs are allocated without a zero fill (Tensor::for_overwrite, issue 13): an empty
// row's out and dq, and the dkv rows of keys no row selects, must still be written as 0, even
// when the memory they get held other bytes (here NaN patterns) before.
TEST(SparseMlaTest, EmptyRowsAndUnselectedKeysAreZeroOnReusedMemory) {
  for (Precision p : {Precision::Reference, Precision::Baseline}) {
    SparseMlaInputs in = hand_inputs({-1, -1, 0, 0, -1, -1}, 2);  // rows 0 and 2 empty
    in.kv = Tensor::from_f64({4, 3}, {0, 1, 7, kLn3, 5, -2, 1, 1, 1, 2, 2, 2});  // keys 1-3 unused
    const Tensor dout = Tensor::from_f64({3, 1, 2}, {5, 6, 1, -1, 2, 2});
    const size_t w = p == Precision::Reference ? 8 : 4;
    for (int rep = 0; rep < 3; ++rep) {
      dirty_heap({3 * 2 * w, 3 * w});
      const SparseMlaForward f = sparse_mla_forward(in, p);
      for (int64_t i : {0, 1, 4, 5}) EXPECT_EQ(f.out.get(i), 0.0) << "out entry " << i;
      EXPECT_EQ(f.lse.get(0), kInf);
      EXPECT_EQ(f.max_logits.get(2), -kInf);
      dirty_heap({3 * 3 * w, 4 * 3 * w});
      const SparseMlaGrads g = sparse_mla_backward(in, dout, p);
      for (int64_t i : {0, 1, 2, 6, 7, 8}) EXPECT_EQ(g.dq.get(i), 0.0) << "dq entry " << i;
      for (int64_t i = 3; i < 12; ++i) EXPECT_EQ(g.dkv.get(i), 0.0) << "dkv entry " << i;
    }
  }
}

// Random case: s_q 4, h_q 3, d_qk 8, d_v 6, s_kv 10, k 6 (all slots valid, distinct).
struct RandomCase {
  SparseMlaInputs in;
  Tensor dout;
  RandomCase(bool sink) {
    in.q = test::random_f64({4, 3, 8}, 11);
    in.kv = test::random_f64({10, 8}, 12);
    in.indices = Tensor::from_i32({4, 6}, {0, 3, 5, 7, 9, 2,  //
                                           1, 2, 3, 4, 5, 6,  //
                                           9, 8, 0, 1, 4, 6,  //
                                           7, 0, 3, 8, 2, 5});
    in.sm_scale = 0.5;
    in.d_v = 6;
    if (sink) in.attn_sink = Tensor::from_f64({3}, {0.3, -1.2, 2.0});
    dout = test::random_f64({4, 3, 6}, 13);
  }
};

TEST(SparseMlaInvariantTest, SlotPermutationLeavesResultsUnchanged) {
  RandomCase c(true);
  const SparseMlaForward f = sparse_mla_forward(c.in);
  const SparseMlaGrads g = sparse_mla_backward(c.in, c.dout);
  SparseMlaInputs p = c.in;
  int32_t* ids = p.indices.data<int32_t>();
  for (int64_t t = 0; t < 4; ++t) std::reverse(ids + t * 6, ids + t * 6 + 6);
  std::swap(ids[1], ids[4]);
  const SparseMlaForward fp = sparse_mla_forward(p);
  const SparseMlaGrads gp = sparse_mla_backward(p, c.dout);
  EXPECT_GT(test::max_abs(f.out), 0.0);
  EXPECT_TRUE(test::close(fp.out, f.out, test::kReassocRelTol));
  EXPECT_TRUE(test::close(fp.lse, f.lse, test::kReassocRelTol));
  EXPECT_TRUE(test::identical(fp.max_logits, f.max_logits));
  EXPECT_TRUE(test::close(gp.dq, g.dq, test::kReassocRelTol));
  EXPECT_TRUE(test::close(gp.dkv, g.dkv, test::kReassocRelTol));
  EXPECT_TRUE(test::close(*gp.dsink, *g.dsink, test::kReassocRelTol));
}

TEST(SparseMlaInvariantTest, InvalidSlotsAnywhereChangeNothing) {
  RandomCase c(true);
  const SparseMlaForward f = sparse_mla_forward(c.in);
  const SparseMlaGrads g = sparse_mla_backward(c.in, c.dout);
  // Widen to k = 10: invalid values inserted before, between and after the valid ids, then
  // valid ids placed past topk_length (also invalid).
  SparseMlaInputs w = c.in;
  const std::vector<int32_t> junk = {-1, 10, INT_MAX, INT_MIN};
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < 4; ++t) {
    std::vector<int32_t> row;
    for (int64_t j = 0; j < 6; ++j) {
      if (j % 2 == t % 2) row.push_back(junk[(t + j) % 4]);
      row.push_back(c.in.indices.data<int32_t>()[t * 6 + j]);
    }
    while (row.size() < 10) row.push_back(row.size() % 2 ? 3 : -1);  // past topk_length
    ids.insert(ids.end(), row.begin(), row.end());
  }
  w.indices = Tensor::from_i32({4, 10}, ids);
  w.topk_length = Tensor::from_i32({4}, {9, 9, 9, 9});
  const SparseMlaForward fw = sparse_mla_forward(w);
  const SparseMlaGrads gw = sparse_mla_backward(w, c.dout);
  EXPECT_TRUE(test::identical(fw.out, f.out));
  EXPECT_TRUE(test::identical(fw.lse, f.lse));
  EXPECT_TRUE(test::identical(fw.max_logits, f.max_logits));
  EXPECT_TRUE(test::identical(gw.dq, g.dq));
  EXPECT_TRUE(test::identical(gw.dkv, g.dkv));
  EXPECT_TRUE(test::identical(*gw.dsink, *g.dsink));
}

// Adding c[t,h] to every logit of row (t,h): an extra q/kv column outside V (kv = 1 in it,
// q = c / sm_scale). out and the sink-free softmax must not move; lse and max_logits shift
// by c. Honest: the shift goes through the real logits, not through a test hook.
TEST(SparseMlaInvariantTest, ConstantLogitShiftMovesLseOnly) {
  RandomCase c(false);
  const double shifts[4][3] = {{3, -2.5, 10}, {0.25, 7, -6}, {1, 1, 1}, {-40, 40, 0.5}};
  SparseMlaInputs base = c.in, shifted = c.in;
  base.q = Tensor(DType::F64, {4, 3, 9});
  shifted.q = Tensor(DType::F64, {4, 3, 9});
  base.kv = Tensor(DType::F64, {10, 9});
  for (int64_t s = 0; s < 10; ++s) {
    for (int64_t e = 0; e < 8; ++e) base.kv.set(s * 9 + e, c.in.kv.get(s * 8 + e));
    base.kv.set(s * 9 + 8, 1.0);
  }
  shifted.kv = base.kv;
  for (int64_t r = 0; r < 12; ++r) {
    for (int64_t e = 0; e < 8; ++e) {
      base.q.set(r * 9 + e, c.in.q.get(r * 8 + e));
      shifted.q.set(r * 9 + e, c.in.q.get(r * 8 + e));
    }
    shifted.q.set(r * 9 + 8, shifts[r / 3][r % 3] / c.in.sm_scale);  // exact (sm_scale 0.5)
  }
  const SparseMlaForward fb = sparse_mla_forward(base), fs = sparse_mla_forward(shifted);
  EXPECT_TRUE(test::close(fb.out, sparse_mla_forward(c.in).out, test::kReassocRelTol));
  EXPECT_TRUE(test::close(fs.out, fb.out, test::kReassocRelTol));
  Tensor lse_expected = fb.lse, max_expected = fb.max_logits;
  for (int64_t r = 0; r < 12; ++r) {
    lse_expected.set(r, fb.lse.get(r) + shifts[r / 3][r % 3]);
    max_expected.set(r, fb.max_logits.get(r) + shifts[r / 3][r % 3]);
  }
  EXPECT_TRUE(test::close(fs.lse, lse_expected, test::kReassocRelTol));
  EXPECT_TRUE(test::close(fs.max_logits, max_expected, test::kReassocRelTol));
}

TEST(SparseMlaTest, DkvAccumulatesOverEveryQueryHeadAndDuplicate) {
  RandomCase c(true);
  c.in.indices.data<int32_t>()[1] = 0;  // row 0 now selects key 0 twice
  const SparseMlaGrads all = sparse_mla_backward(c.in, c.dout);
  // Sum of the dkv of each row run alone (other rows' dout zeroed).
  Tensor sum(DType::F64, {10, 8});
  for (int64_t t = 0; t < 4; ++t) {
    Tensor d(DType::F64, {4, 3, 6});
    for (int64_t i = 0; i < 18; ++i) d.set(t * 18 + i, c.dout.get(t * 18 + i));
    const SparseMlaGrads one = sparse_mla_backward(c.in, d);
    for (int64_t i = 0; i < sum.numel(); ++i) sum.set(i, sum.get(i) + one.dkv.get(i));
  }
  EXPECT_TRUE(test::close(all.dkv, sum, test::kReassocRelTol));
}

class SparseMlaFdTest : public ::testing::TestWithParam<bool> {};

TEST_P(SparseMlaFdTest, FiniteDifferenceGradients) {
  RandomCase c(GetParam());
  // Duplicates, holes, leading padding, an empty row and topk_length in one case.
  c.in.indices = Tensor::from_i32({4, 6}, {-1, 3, 3, 7, 11, 2,   //
                                           1, -1, 1, 4, 5, 6,    //
                                           -1, -1, -1, -1, -1, -1,  //
                                           7, 0, 3, 8, 2, 5});
  c.in.topk_length = Tensor::from_i32({4}, {6, 6, 6, 4});
  const SparseMlaGrads g = sparse_mla_backward(c.in, c.dout);
  auto f = [&] { return test::dot(sparse_mla_forward(c.in).out, c.dout); };
  EXPECT_TRUE(test::close(g.dq, test::fd_gradient(c.in.q, f), test::kFdRelTol));
  EXPECT_TRUE(test::close(g.dkv, test::fd_gradient(c.in.kv, f), test::kFdRelTol));
  EXPECT_GT(test::max_abs(g.dq), 0.0);
  EXPECT_GT(test::max_abs(g.dkv), 0.0);
  EXPECT_EQ(g.dsink.has_value(), GetParam());
  if (GetParam()) {
    EXPECT_TRUE(test::close(*g.dsink, test::fd_gradient(*c.in.attn_sink, f), test::kFdRelTol));
    EXPECT_GT(test::max_abs(*g.dsink), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutSink, SparseMlaFdTest, ::testing::Bool());

TEST(SparseMlaTest, BaselineIsCloseToReferenceButComputedInFloat) {
  RandomCase c(true);
  SparseMlaInputs in = c.in;
  in.q = in.q.to(DType::BF16);
  in.kv = in.kv.to(DType::BF16);
  const SparseMlaForward r = sparse_mla_forward(in), b = sparse_mla_forward(in, Precision::Baseline);
  EXPECT_EQ(b.out.dtype(), DType::F32);
  EXPECT_TRUE(test::close(b.out, r.out, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(b.lse, r.lse, test::kBaselineRelTol));
  EXPECT_FALSE(test::identical(b.out.to(DType::F64), r.out));
  const SparseMlaGrads gr = sparse_mla_backward(in, c.dout);
  const SparseMlaGrads gb = sparse_mla_backward(in, c.dout, Precision::Baseline);
  EXPECT_TRUE(test::close(gb.dq, gr.dq, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(gb.dkv, gr.dkv, test::kBaselineRelTol));
  EXPECT_TRUE(test::close(*gb.dsink, *gr.dsink, test::kBaselineRelTol));
}

}  // namespace
}  // namespace dsa
