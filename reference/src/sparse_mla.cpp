// Sparse MLA forward and backward (SPEC §4-§6), one template on the accumulation type.
// Per query row t: gather the valid selected kv rows into Kg [n, d_qk], then
// P = sm_scale · Q_t Kg^T [h_q, n] and out = softmax(P) · Kg[:, :d_v] with Eigen GEMMs.
#include "dsa/reference/sparse_mla.h"

#include <algorithm>
#include <cmath>

#include "dsa/contract/parallel.h"
#include "internal.h"

namespace dsa::reference {
namespace {

using detail::Mat;
using detail::Vec;

struct MlaDims {
  int64_t s_q, h_q, d_qk, d_v, s_kv, k;
};

MlaDims validate(const char* where, const SparseMlaInputs& in) {
  detail::check_rank3(where, "q", in.q, "[s_q, h_q, d_qk]");
  detail::check_activation_dtype(where, "q", in.q);
  MlaDims d{in.q.size(0), in.q.size(1), in.q.size(2), in.d_v, 0, 0};
  detail::check_rank2(where, "kv", in.kv, "[s_kv, d_qk]");
  check_shape(where, "kv", in.kv, {-1, d.d_qk});
  detail::check_activation_dtype(where, "kv", in.kv);
  d.s_kv = in.kv.size(0);
  check_arg(in.d_v > 0 && in.d_v <= d.d_qk, where, "d_v", std::to_string(in.d_v),
            "0 < d_v <= d_qk = " + std::to_string(d.d_qk));
  check_arg(std::isfinite(in.sm_scale), where, "sm_scale", str(in.sm_scale), "a finite value");
  const bool idx_ok = (in.indices.dim() == 2 && in.indices.size(0) == d.s_q) ||
                      (in.indices.dim() == 3 && in.indices.size(0) == d.s_q &&
                       in.indices.size(1) == 1);
  check_arg(idx_ok, where, "indices", "shape " + shape_str(in.indices.shape()),
            "shape [" + std::to_string(d.s_q) + ", k] or [" + std::to_string(d.s_q) +
                ", 1, k]");
  check_dtype(where, "indices", in.indices, {DType::I32});
  d.k = in.indices.size(-1);
  if (in.topk_length) {
    check_shape(where, "topk_length", *in.topk_length, {d.s_q});
    check_dtype(where, "topk_length", *in.topk_length, {DType::I32});
  }
  if (in.attn_sink) {
    check_shape(where, "attn_sink", *in.attn_sink, {d.h_q});
    detail::check_wide_dtype(where, "attn_sink", *in.attn_sink);
    for (int64_t h = 0; h < d.h_q; ++h)
      check_arg(!std::isnan(in.attn_sink->get(h)), where, "attn_sink",
                "NaN at head " + std::to_string(h), "a non-NaN value (±inf allowed)");
  }
  return d;
}

/// Valid ids of row t in slot order (SPEC §4): 0 <= id < s_kv and slot < topk_length[t].
/// Duplicates are kept (separate terms).
void valid_ids(const SparseMlaInputs& in, const MlaDims& d, int64_t t, std::vector<int32_t>& ids) {
  ids.clear();
  const int32_t* row = in.indices.data<int32_t>() + t * d.k;
  int64_t limit = d.k;
  if (in.topk_length) limit = std::min<int64_t>(limit, in.topk_length->data<int32_t>()[t]);
  for (int64_t j = 0; j < limit; ++j)
    if (row[j] >= 0 && row[j] < d.s_kv) ids.push_back(row[j]);
}

/// Shared per-row state: the gathered keys and the logits with their row statistics.
template <class A>
struct RowSoftmax {
  Mat<A> Kg;     // [n, d_qk] gathered kv rows
  Mat<A> P;      // [h_q, n] logits, then probabilities
  Vec<A> m;      // [h_q] max logits
  Vec<A> lse;    // [h_q] natural-log sum exp
  Vec<A> r;      // [h_q] sink scale exp(lse) / (exp(lse) + exp(sink)); 1 without sink
  Vec<A> psink;  // [h_q] sink probability exp(sink - L); 0 without sink

  // Gathers kv rows `ids`, computes logits of Qt [h_q, d_qk] and softmax statistics;
  // leaves P = exp(P - lse) · r, i.e. the §5 probabilities p_j = exp(P_j - L).
  void compute(const Mat<A>& KV, const Eigen::Ref<const Mat<A>>& Qt,
               const std::vector<int32_t>& ids, A sm_scale, const Vec<A>* sink) {
    const int64_t n = static_cast<int64_t>(ids.size());
    Kg.resize(n, KV.cols());
    for (int64_t j = 0; j < n; ++j) Kg.row(j) = KV.row(ids[j]);
    P.noalias() = Qt * Kg.transpose();
    P *= sm_scale;
    m = P.rowwise().maxCoeff();
    P.colwise() -= m;  // max-subtract: every row has a finite max (n > 0, finite inputs)
    P = P.array().exp().matrix();
    lse = m.array() + P.rowwise().sum().array().log();
    r.setOnes(P.rows());
    psink.setZero(P.rows());
    if (sink) {
      // Stable in both directions: sink = -inf gives r = 1, sink = +inf gives r = 0.
      r = (A(1) + (sink->array() - lse.array()).exp()).inverse();
      psink = (A(1) + (lse.array() - sink->array()).exp()).inverse();
    }
    // P currently holds exp(P - m); divide by Σ exp(P - m) = exp(lse - m), scale by r.
    const Vec<A> scale = r.array() * (m.array() - lse.array()).exp();
    P = scale.asDiagonal() * P;
  }
};

/// Flops of one query row's two GEMMs (the cost hint of the row loops).
double row_flops(const MlaDims& d) {
  return 2.0 * static_cast<double>(d.h_q) * static_cast<double>(d.k) *
         static_cast<double>(d.d_qk + d.d_v);
}

template <class A>
SparseMlaForward forward(const SparseMlaInputs& in, const MlaDims& d) {
  const Mat<A> Q = detail::to_mat<A>(in.q, d.s_q * d.h_q, d.d_qk);
  const Mat<A> KV = detail::to_mat<A>(in.kv, d.s_kv, d.d_qk);
  Vec<A> sink;
  if (in.attn_sink) sink = detail::to_mat<A>(*in.attn_sink, d.h_q, 1);
  Mat<A> out = Mat<A>::Zero(d.s_q * d.h_q, d.d_v);
  Mat<A> lse = Mat<A>::Constant(d.s_q, d.h_q, detail::inf<A>());
  Mat<A> mx = Mat<A>::Constant(d.s_q, d.h_q, -detail::inf<A>());
  // Query rows are independent: each writes only its own rows of out, lse and mx.
  parallel_for(d.s_q, row_flops(d), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> ids;
    RowSoftmax<A> rs;
    for (int64_t t = begin; t < end; ++t) {
      valid_ids(in, d, t, ids);
      if (ids.empty()) continue;  // SPEC §6: out 0, lse +inf, max_logits -inf
      rs.compute(KV, Q.middleRows(t * d.h_q, d.h_q), ids, static_cast<A>(in.sm_scale),
                 in.attn_sink ? &sink : nullptr);
      out.middleRows(t * d.h_q, d.h_q).noalias() = rs.P * rs.Kg.leftCols(d.d_v);
      lse.row(t) = rs.lse.transpose();
      mx.row(t) = rs.m.transpose();
    }
  });
  return SparseMlaForward{detail::to_tensor<A>(out, {d.s_q, d.h_q, d.d_v}),
                          detail::to_tensor<A>(lse, {d.s_q, d.h_q}),
                          detail::to_tensor<A>(mx, {d.s_q, d.h_q})};
}

/// What one query row of the backward hands to the ordered reductions.
template <class A>
struct RowGrads {
  std::vector<int32_t> ids;  // valid ids in slot order
  Mat<A> dKg;                // [n, d_qk] gradient of the gathered kv rows
  Vec<A> dsink;              // [h_q] exp(sink - L) Δ (with attn_sink)
};

template <class A>
SparseMlaGrads backward(const SparseMlaInputs& in, const Tensor& dout, const MlaDims& d,
                        const std::optional<Tensor>& given_out) {
  const Mat<A> Q = detail::to_mat<A>(in.q, d.s_q * d.h_q, d.d_qk);
  Mat<A> Ogiven;
  if (given_out) Ogiven = detail::to_mat<A>(*given_out, d.s_q * d.h_q, d.d_v);
  const Mat<A> KV = detail::to_mat<A>(in.kv, d.s_kv, d.d_qk);
  const Mat<A> dO = detail::to_mat<A>(dout, d.s_q * d.h_q, d.d_v);
  Vec<A> sink;
  if (in.attn_sink) sink = detail::to_mat<A>(*in.attn_sink, d.h_q, 1);
  const A sm = static_cast<A>(in.sm_scale);
  Mat<A> dQ = Mat<A>::Zero(d.s_q * d.h_q, d.d_qk);
  Mat<A> dKV = Mat<A>::Zero(d.s_kv, d.d_qk);
  Vec<A> dsink = Vec<A>::Zero(d.h_q);
  // Query rows run in parallel in blocks; each block's dkv and dsink contributions are then
  // added in query-row, then slot order (the serial order), in parallel over key rows, so
  // every element is the same sum whatever the thread count. The block size bounds memory
  // (~256 MiB of dKg) and never changes a result.
  const int64_t row_bytes = std::max<int64_t>(1, d.k * d.d_qk * static_cast<int64_t>(sizeof(A)));
  const int64_t block = std::clamp<int64_t>(4 * max_threads(), 1,
                                            std::max<int64_t>(1, (int64_t{256} << 20) / row_bytes));
  std::vector<RowGrads<A>> rows(static_cast<size_t>(std::min(block, std::max<int64_t>(d.s_q, 1))));
  for (int64_t t0 = 0; t0 < d.s_q; t0 += block) {
    const int64_t nb = std::min(block, d.s_q - t0);
    parallel_for(nb, 3 * row_flops(d), [&](int64_t begin, int64_t end) {
      RowSoftmax<A> rs;
      Mat<A> O, dS;
      Vec<A> delta;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t = t0 + i;
        RowGrads<A>& g = rows[static_cast<size_t>(i)];
        valid_ids(in, d, t, g.ids);
        if (g.ids.empty()) continue;  // SPEC §6: dq = 0, no dkv / dsink contribution
        const auto Qt = Q.middleRows(t * d.h_q, d.h_q);
        const auto dOt = dO.middleRows(t * d.h_q, d.h_q);
        rs.compute(KV, Qt, g.ids, sm, in.attn_sink ? &sink : nullptr);
        const auto Vg = rs.Kg.leftCols(d.d_v);
        if (given_out) O = Ogiven.middleRows(t * d.h_q, d.h_q);    // out as the kernel got it
        else O.noalias() = rs.P * Vg;                              // sink-scaled out [h_q, d_v]
        delta = O.cwiseProduct(dOt).rowwise().sum();               // Δ = out · dout
        dS.noalias() = dOt * Vg.transpose();                       // dout · v_j
        dS = rs.P.cwiseProduct(dS - delta.replicate(1, dS.cols()));  // p_j (dout·v_j - Δ)
        dQ.middleRows(t * d.h_q, d.h_q).noalias() = sm * (dS * rs.Kg);
        g.dKg.noalias() = sm * (dS.transpose() * Qt);
        g.dKg.leftCols(d.d_v).noalias() += rs.P.transpose() * dOt;
        if (in.attn_sink) g.dsink = rs.psink.cwiseProduct(delta);  // exp(sink - L) Δ
      }
    });
    // Scattered row adds are memory-bound: one counts as ~8 GEMM flops.
    const double adds_per_key = 8.0 * static_cast<double>(nb * d.k * d.d_qk) /
                                static_cast<double>(std::max<int64_t>(1, d.s_kv));
    parallel_for(d.s_kv, adds_per_key, [&](int64_t k0, int64_t k1) {
      for (int64_t i = 0; i < nb; ++i) {
        const RowGrads<A>& g = rows[static_cast<size_t>(i)];
        for (size_t j = 0; j < g.ids.size(); ++j)
          if (g.ids[j] >= k0 && g.ids[j] < k1) dKV.row(g.ids[j]) += g.dKg.row(static_cast<int64_t>(j));
      }
    });
    if (in.attn_sink)
      for (int64_t i = 0; i < nb; ++i)
        if (!rows[static_cast<size_t>(i)].ids.empty()) dsink -= rows[static_cast<size_t>(i)].dsink;
  }
  SparseMlaGrads g{detail::to_tensor<A>(dQ, {d.s_q, d.h_q, d.d_qk}),
                   detail::to_tensor<A>(dKV, {d.s_kv, d.d_qk}), std::nullopt};
  if (in.attn_sink) g.dsink = detail::to_tensor<A>(dsink.transpose(), {d.h_q});
  return g;
}

}  // namespace

SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in, Precision precision) {
  const MlaDims d = validate("sparse_mla_forward", in);
  return precision == Precision::Reference ? forward<double>(in, d) : forward<float>(in, d);
}

SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout,
                                   Precision precision, const std::optional<Tensor>& out) {
  const char* where = "sparse_mla_backward";
  const MlaDims d = validate(where, in);
  check_shape(where, "dout", dout, {d.s_q, d.h_q, d.d_v});
  detail::check_activation_dtype(where, "dout", dout);
  if (out) {
    check_shape(where, "out", *out, {d.s_q, d.h_q, d.d_v});
    detail::check_activation_dtype(where, "out", *out);
  }
  return precision == Precision::Reference ? backward<double>(in, dout, d, out)
                                           : backward<float>(in, dout, d, out);
}

}  // namespace dsa::reference
