// The sparse MLA forward gathers its keys by slot blocks (issue 13, SlotBlocks in
// reference/src/sparse_mla.cpp) and must give the same bytes as the products on the whole
// gathered keys. The unblocked forward is kept here as it was written before the blocks
// (one gather, P = Q_t Kg^T, the softmax, out = P Kg[:, :d_v]); both precisions, rows long
// enough for several blocks and several depth panels, odd sizes (no multiple of the GEMM
// micro-kernel), -1 holes, duplicates, topk_length and a sink. A logits block or a P·V
// column block that is not a multiple of the micro-kernel's rows, or P·V blocks other than
// Eigen's own depth panels, change the bytes (checked by hand with the three mutants) and
// fail this test.
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "dsa/contract/parallel.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa {
namespace {

using reference::Precision;

template <class A>
using Mat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using Vec = Eigen::Matrix<A, Eigen::Dynamic, 1>;

// `t`'s first rows·cols values as a row-major [rows, cols] matrix of A.
template <class A>
Mat<A> mat_of(const Tensor& t, int64_t rows, int64_t cols) {
  Mat<A> m(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = static_cast<A>(t.get(i));
  return m;
}

// The valid ids of query row t in slot order (SPEC §4: in [0, s_kv) and before topk_length).
std::vector<int32_t> valid_ids(const SparseMlaInputs& in, int64_t t) {
  const int64_t s_kv = in.kv.size(0), k = in.indices.size(-1);
  std::vector<int32_t> ids;
  int64_t limit = k;
  if (in.topk_length) limit = std::min<int64_t>(limit, in.topk_length->data<int32_t>()[t]);
  for (int64_t j = 0; j < limit; ++j) {
    const int32_t id = in.indices.data<int32_t>()[t * k + j];
    if (id >= 0 && id < s_kv) ids.push_back(id);
  }
  return ids;
}

// The forward before slot blocks, one query row at a time (same expressions, same order).
template <class A>
SparseMlaForward unblocked_forward(const SparseMlaInputs& in) {
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d_qk = in.q.size(2), d_v = in.d_v;
  const int64_t s_kv = in.kv.size(0);
  const Mat<A> Q = mat_of<A>(in.q, s_q * h_q, d_qk), KV = mat_of<A>(in.kv, s_kv, d_qk);
  Vec<A> sink;
  if (in.attn_sink) sink = mat_of<A>(*in.attn_sink, h_q, 1);
  const DType dt = sizeof(A) == 8 ? DType::F64 : DType::F32;
  SparseMlaForward f{Tensor(dt, {s_q, h_q, d_v}), Tensor(dt, {s_q, h_q}), Tensor(dt, {s_q, h_q})};
  Eigen::Map<Mat<A>> out(f.out.data<A>(), s_q * h_q, d_v), lse(f.lse.data<A>(), s_q, h_q),
      mx(f.max_logits.data<A>(), s_q, h_q);
  lse.setConstant(std::numeric_limits<A>::infinity());
  mx.setConstant(-std::numeric_limits<A>::infinity());
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int32_t> ids = valid_ids(in, t);
    if (ids.empty()) continue;
    const int64_t n = static_cast<int64_t>(ids.size());
    const Eigen::Ref<const Mat<A>> Qt = Q.middleRows(t * h_q, h_q);
    Mat<A> Kg(n, d_qk);
    for (int64_t j = 0; j < n; ++j) Kg.row(j) = KV.row(ids[static_cast<size_t>(j)]);
    Mat<A> P;
    P.noalias() = Qt * Kg.transpose();
    P *= static_cast<A>(in.sm_scale);
    const Vec<A> m = P.rowwise().maxCoeff();
    P.colwise() -= m;
    P = P.array().exp().matrix();
    const Vec<A> l = m.array() + P.rowwise().sum().array().log();
    Vec<A> r = Vec<A>::Ones(h_q);
    if (in.attn_sink) r = (A(1) + (sink.array() - l.array()).exp()).inverse();
    const Vec<A> scale = r.array() * (m.array() - l.array()).exp();
    P = scale.asDiagonal() * P;
    out.middleRows(t * h_q, h_q).noalias() = P * Kg.leftCols(d_v);
    lse.row(t) = l.transpose();
    mx.row(t) = m.transpose();
  }
  return f;
}

// The backward before its rows were split in units (issue 13), one query row at a time on
// the whole gathered keys, dkv and dsink summed in (row, slot) order: the same expressions
// as the reference's short rows.
template <class A>
SparseMlaGrads unsplit_backward(const SparseMlaInputs& in, const Tensor& dout, const Tensor* given_out) {
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d_qk = in.q.size(2), d_v = in.d_v;
  const int64_t s_kv = in.kv.size(0);
  const Mat<A> Q = mat_of<A>(in.q, s_q * h_q, d_qk), KV = mat_of<A>(in.kv, s_kv, d_qk);
  const Mat<A> dO = mat_of<A>(dout, s_q * h_q, d_v);
  Mat<A> Og;
  if (given_out) Og = mat_of<A>(*given_out, s_q * h_q, d_v);
  Vec<A> sink;
  if (in.attn_sink) sink = mat_of<A>(*in.attn_sink, h_q, 1);
  const A sm = static_cast<A>(in.sm_scale);
  const DType dt = sizeof(A) == 8 ? DType::F64 : DType::F32;
  SparseMlaGrads g{Tensor(dt, {s_q, h_q, d_qk}), Tensor(dt, {s_kv, d_qk}), std::nullopt};
  Eigen::Map<Mat<A>> dQ(g.dq.data<A>(), s_q * h_q, d_qk), dKV(g.dkv.data<A>(), s_kv, d_qk);
  Vec<A> dsink = Vec<A>::Zero(h_q);
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int32_t> ids = valid_ids(in, t);
    if (ids.empty()) continue;
    const int64_t n = static_cast<int64_t>(ids.size());
    const auto Qt = Q.middleRows(t * h_q, h_q);
    const auto dOt = dO.middleRows(t * h_q, h_q);
    Mat<A> Kg(n, d_qk);
    for (int64_t j = 0; j < n; ++j) Kg.row(j) = KV.row(ids[static_cast<size_t>(j)]);
    Mat<A> P;
    P.noalias() = Qt * Kg.transpose();
    P *= sm;
    const Vec<A> m = P.rowwise().maxCoeff();
    P.colwise() -= m;
    P = P.array().exp().matrix();
    const Vec<A> l = m.array() + P.rowwise().sum().array().log();
    Vec<A> r = Vec<A>::Ones(h_q), psink = Vec<A>::Zero(h_q);
    if (in.attn_sink) {
      r = (A(1) + (sink.array() - l.array()).exp()).inverse();
      psink = (A(1) + (l.array() - sink.array()).exp()).inverse();
    }
    const Vec<A> scale = r.array() * (m.array() - l.array()).exp();
    P = scale.asDiagonal() * P;
    const auto Vg = Kg.leftCols(d_v);
    Mat<A> O, dS, dKg;
    if (given_out) O = Og.middleRows(t * h_q, h_q);
    else O.noalias() = P * Vg;
    const Vec<A> delta = O.cwiseProduct(dOt).rowwise().sum();
    dS.noalias() = dOt * Vg.transpose();
    dS = P.cwiseProduct(dS - delta.replicate(1, dS.cols()));
    dQ.middleRows(t * h_q, h_q).noalias() = sm * (dS * Kg);
    dKg.noalias() = sm * (dS.transpose() * Qt);
    dKg.leftCols(d_v).noalias() += P.transpose() * dOt;
    for (int64_t j = 0; j < n; ++j) dKV.row(ids[static_cast<size_t>(j)]) += dKg.row(j);
    if (in.attn_sink) dsink -= psink.cwiseProduct(delta);
  }
  if (in.attn_sink) {
    g.dsink = Tensor(dt, {h_q});
    std::memcpy(g.dsink->raw(), dsink.data(), g.dsink->nbytes());
  }
  return g;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// Rows of 0 to k valid slots: a full row, long rows (several logits blocks and depth panels),
// rows just below and at two logits blocks, short rows, an empty row.
SparseMlaInputs inputs(int64_t h_q, int64_t d_qk, int64_t d_v, int64_t k, int64_t s_kv, bool sink,
                       DType dtype) {
  const int64_t s_q = 9;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  SparseMlaInputs in;
  in.q = Tensor(dtype, {s_q, h_q, d_qk});
  in.kv = Tensor(dtype, {s_kv, d_qk});
  for (int64_t i = 0; i < in.q.numel(); ++i) in.q.set(i, 2.0 * normal(rng));
  for (int64_t i = 0; i < in.kv.numel(); ++i) in.kv.set(i, normal(rng));
  in.indices = Tensor(DType::I32, {s_q, k});
  int32_t* ids = in.indices.data<int32_t>();
  for (int64_t i = 0; i < s_q * k; ++i) {
    const uint64_t u = rng() % 100;  // 3% holes, 3% repeats of 8 keys
    ids[i] = u < 3 ? -1 : u < 6 ? static_cast<int32_t>(rng() % 8) : static_cast<int32_t>(rng() % s_kv);
  }
  const std::vector<int32_t> len = {static_cast<int32_t>(k), static_cast<int32_t>(k - 1), 1000, 777,
                                    383, 192, 191, 40, 0};
  in.topk_length = Tensor::from_i32({s_q}, len);
  in.sm_scale = 1.0 / std::sqrt(static_cast<double>(d_qk));
  in.d_v = d_v;
  if (sink) {
    in.attn_sink = Tensor(DType::F32, {h_q});
    for (int64_t h = 0; h < h_q; ++h) in.attn_sink->set(h, normal(rng));
  }
  return in;
}

void expect_unblocked_bytes(const SparseMlaInputs& in) {
  for (int threads : {1, 3, 16}) {  // units of one row on several threads; more threads than rows
    const int saved = max_threads();
    set_max_threads(threads);
    const SparseMlaForward f = reference::sparse_mla_forward(in, Precision::Reference);
    const SparseMlaForward g = reference::sparse_mla_forward(in, Precision::Baseline);
    set_max_threads(saved);
    const SparseMlaForward f0 = unblocked_forward<double>(in), g0 = unblocked_forward<float>(in);
    EXPECT_TRUE(same_bytes(f.out, f0.out)) << "float64 out, " << threads << " threads";
    EXPECT_TRUE(same_bytes(f.lse, f0.lse)) << "float64 lse, " << threads << " threads";
    EXPECT_TRUE(same_bytes(f.max_logits, f0.max_logits)) << "float64 max_logits";
    EXPECT_TRUE(same_bytes(g.out, g0.out)) << "fp32 out, " << threads << " threads";
    EXPECT_TRUE(same_bytes(g.lse, g0.lse)) << "fp32 lse, " << threads << " threads";
    EXPECT_TRUE(same_bytes(g.max_logits, g0.max_logits)) << "fp32 max_logits";
  }
}

// The backward's long rows are split in units shared by the threads (logits and dS by
// slot blocks, out and dq by column blocks, dKg by slot blocks): the same bytes as the
// unsplit rows, with and without the kernel's out, 1, 3 and 7 threads.
void expect_unsplit_backward_bytes(const SparseMlaInputs& in) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor dout(in.q.dtype(), {in.q.size(0), in.q.size(1), in.d_v});
  for (int64_t i = 0; i < dout.numel(); ++i) dout.set(i, normal(rng));
  const Tensor given = reference::sparse_mla_forward(in, Precision::Baseline).out;  // an fp32 out
  for (const Tensor* out : {static_cast<const Tensor*>(nullptr), &given}) {
    const std::optional<Tensor> out_arg = out ? std::optional<Tensor>(*out) : std::nullopt;
    const SparseMlaGrads f0 = unsplit_backward<double>(in, dout, out);
    const SparseMlaGrads g0 = unsplit_backward<float>(in, dout, out);
    for (int threads : {1, 3, 16}) {  // 16: more threads than rows (9)
      const int saved = max_threads();
      set_max_threads(threads);
      const SparseMlaGrads f = reference::sparse_mla_backward(in, dout, Precision::Reference, out_arg);
      const SparseMlaGrads g = reference::sparse_mla_backward(in, dout, Precision::Baseline, out_arg);
      set_max_threads(saved);
      const char* with = out ? "with out" : "without out";
      EXPECT_TRUE(same_bytes(f.dq, f0.dq)) << "float64 dq, " << with << ", " << threads << " threads";
      EXPECT_TRUE(same_bytes(f.dkv, f0.dkv)) << "float64 dkv, " << with << ", " << threads << " threads";
      EXPECT_TRUE(same_bytes(g.dq, g0.dq)) << "fp32 dq, " << with << ", " << threads << " threads";
      EXPECT_TRUE(same_bytes(g.dkv, g0.dkv)) << "fp32 dkv, " << with << ", " << threads << " threads";
      EXPECT_EQ(f.dsink.has_value(), in.attn_sink.has_value());
      if (f.dsink && f0.dsink) {
        EXPECT_TRUE(same_bytes(*f.dsink, *f0.dsink)) << "float64 dsink";
      }
      if (g.dsink && g0.dsink) {
        EXPECT_TRUE(same_bytes(*g.dsink, *g0.dsink)) << "fp32 dsink";
      }
    }
  }
}

TEST(SlotBlocks, BackwardBytesEqualTheUnsplitRows) {
  // The glm5 widths with 8 heads, and odd sizes everywhere (~1 s in all).
  expect_unsplit_backward_bytes(inputs(8, 576, 512, 2048, 2500, true, DType::BF16));
  expect_unsplit_backward_bytes(inputs(7, 72, 41, 1100, 1300, true, DType::F32));
  expect_unsplit_backward_bytes(inputs(13, 37, 37, 1500, 1600, false, DType::F64));
}

TEST(SlotBlocks, ForwardBytesEqualTheUnblockedProducts) {
  // The glm5 widths (d_qk 576, d_v 512) with 16 heads, and odd sizes everywhere.
  expect_unblocked_bytes(inputs(16, 576, 512, 2048, 2500, false, DType::BF16));
  expect_unblocked_bytes(inputs(7, 72, 41, 1100, 1300, true, DType::F32));
  expect_unblocked_bytes(inputs(13, 37, 37, 1500, 1600, true, DType::F64));
  // GEMV-shaped products (one head, or d_v 1) are never blocked.
  expect_unblocked_bytes(inputs(1, 40, 24, 1100, 1200, false, DType::F64));
  expect_unblocked_bytes(inputs(5, 33, 1, 1100, 1200, true, DType::F16));
}

}  // namespace
}  // namespace dsa
