// Indexer KL loss, dense and sparse (SPEC §7), one template on the accumulation type.
#include "dsa/reference/kl_loss.h"

#include <algorithm>
#include <cmath>

#include "dsa/contract/parallel.h"
#include "internal.h"

namespace dsa::reference {
namespace {

using detail::Mat;
using detail::Vec;

struct KlDims {
  int64_t s_q, s_kv, h_q, d_qk, k;
};

KlDims validate(const IndexerKlInputs& in) {
  const char* where = "indexer_kl_loss";
  detail::check_rank2(where, "scores", in.scores, "[s_q, s_kv]");
  detail::check_wide_dtype(where, "scores", in.scores);
  KlDims d{in.scores.size(0), in.scores.size(1), 0, 0, 0};
  detail::check_rank3(where, "q", in.q, "[s_q, h_q, d_qk]");
  check_shape(where, "q", in.q, {d.s_q, -1, -1});
  detail::check_activation_dtype(where, "q", in.q);
  d.h_q = in.q.size(1);
  d.d_qk = in.q.size(2);
  detail::check_rank2(where, "kv", in.kv, "[s_kv, d_qk]");
  detail::check_same_last_dim(where, "q", in.q, "kv", in.kv, "d_qk");
  check_shape(where, "kv", in.kv, {d.s_kv, d.d_qk});
  detail::check_activation_dtype(where, "kv", in.kv);
  check_arg(std::isfinite(in.sm_scale), where, "sm_scale", str(in.sm_scale), "a finite value");
  check_arg(std::isfinite(in.coeff), where, "coeff", str(in.coeff), "a finite value");
  detail::check_windows(where, in.windows, d.s_q, d.s_kv);
  if (in.mode == KlMode::Sparse) {
    check_arg(in.indices.has_value(), where, "indices", "none",
              "an I32 [s_q, k] tensor (mode is sparse)");
    const Tensor& idx = *in.indices;
    const bool ok = (idx.dim() == 2 && idx.size(0) == d.s_q) ||
                    (idx.dim() == 3 && idx.size(0) == d.s_q && idx.size(1) == 1);
    check_arg(ok, where, "indices", "shape " + shape_str(idx.shape()),
              "shape [" + std::to_string(d.s_q) + ", k] or [" + std::to_string(d.s_q) +
                  ", 1, k]");
    check_dtype(where, "indices", idx, {DType::I32});
    d.k = idx.size(-1);
  }
  return d;
}

/// True when the indexer score of key s in row t is -inf: such a key is not in S_t (SPEC §7).
/// Read from the scores as given (F32 or F64), so both precisions agree on S_t.
bool neg_inf_score(const Tensor& scores, int64_t s_kv, int64_t t, int64_t s) {
  const double v = scores.get(t * s_kv + s);
  return std::isinf(v) && v < 0;
}

/// S_t: the window keys (dense) or the distinct valid selected ids inside the window
/// (sparse), without keys whose score is -inf, ascending.
void key_set(const IndexerKlInputs& in, const KlDims& d, int64_t t, std::vector<int32_t>& S) {
  S.clear();
  const int64_t ks = in.windows.ks[t], ke = in.windows.ke[t];
  if (in.mode == KlMode::Dense) {
    for (int64_t s = ks; s < ke; ++s)
      if (!neg_inf_score(in.scores, d.s_kv, t, s)) S.push_back(static_cast<int32_t>(s));
    return;
  }
  const int32_t* row = in.indices->data<int32_t>() + t * d.k;
  for (int64_t j = 0; j < d.k; ++j)
    if (row[j] >= 0 && row[j] < d.s_kv && in.windows.contains(t, row[j]) &&
        !neg_inf_score(in.scores, d.s_kv, t, row[j]))
      S.push_back(row[j]);
  std::sort(S.begin(), S.end());
  S.erase(std::unique(S.begin(), S.end()), S.end());
}

template <class A>
IndexerKlResult compute(const IndexerKlInputs& in, const KlDims& d) {
  const Mat<A> Q = detail::to_mat<A>(in.q, d.s_q * d.h_q, d.d_qk);
  const Mat<A> KV = detail::to_mat<A>(in.kv, d.s_kv, d.d_qk);
  const Mat<A> I = detail::to_mat<A>(in.scores, d.s_q, d.s_kv);
  const A sm = static_cast<A>(in.sm_scale);
  std::vector<int32_t> S;
  int64_t n_rows = 0;
  for (int64_t t = 0; t < d.s_q; ++t) {
    key_set(in, d, t, S);
    n_rows += S.empty() ? 0 : 1;
  }
  Mat<A> dI = Mat<A>::Zero(d.s_q, d.s_kv);
  if (n_rows == 0) return IndexerKlResult{detail::to_tensor<A>(Mat<A>::Zero(1, 1), {1}),
                                          detail::to_tensor<A>(dI, {d.s_q, d.s_kv})};
  const A g = static_cast<A>(in.coeff) / static_cast<A>(n_rows);
  // Query rows are independent: each writes its own row of dI and its own KL term; the
  // terms are then summed in row order, so the loss does not depend on the thread count.
  std::vector<A> kl_rows(static_cast<size_t>(d.s_q), A(0));
  const double row_flops = 2.0 * static_cast<double>(d.h_q) * static_cast<double>(d.d_qk) *
                           static_cast<double>(std::max<int64_t>(1, d.s_kv));
  parallel_for(d.s_q, row_flops, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> S;
    Mat<A> Kg, P;
    Vec<A> p, logq, rowmax;
    for (int64_t t = begin; t < end; ++t) {
      key_set(in, d, t, S);
      const int64_t n = static_cast<int64_t>(S.size());
      if (n == 0) continue;  // excluded from the mean
      // Teacher: Σ_h softmax_S(P[t,h,·]), L1-normalised (detached).
      Kg.resize(n, d.d_qk);
      for (int64_t j = 0; j < n; ++j) Kg.row(j) = KV.row(S[j]);
      P.noalias() = Q.middleRows(t * d.h_q, d.h_q) * Kg.transpose();
      P *= sm;
      rowmax = P.rowwise().maxCoeff();  // evaluated first: P is modified next
      P.colwise() -= rowmax;
      P = P.array().exp().matrix();
      rowmax = P.rowwise().sum().cwiseInverse();  // evaluated first (no aliasing with P)
      P = rowmax.asDiagonal() * P;
      p = P.colwise().sum().transpose();
      p /= p.sum();
      // Student: log softmax_S(I[t, ·]).
      logq.resize(n);
      for (int64_t j = 0; j < n; ++j) logq[j] = I(t, S[j]);
      logq.array() -= detail::log_sum_exp<A>(logq);
      A kl = 0;
      for (int64_t j = 0; j < n; ++j)
        if (p[j] > A(0)) kl += p[j] * (std::log(p[j]) - logq[j]);  // 0 · ln 0 = 0
      kl_rows[static_cast<size_t>(t)] = kl;
      for (int64_t j = 0; j < n; ++j) dI(t, S[j]) = g * (std::exp(logq[j]) - p[j]);
    }
  });
  A total = 0;
  for (int64_t t = 0; t < d.s_q; ++t) total += kl_rows[static_cast<size_t>(t)];
  Mat<A> loss(1, 1);
  loss(0, 0) = static_cast<A>(in.coeff) * total / static_cast<A>(n_rows);
  return IndexerKlResult{detail::to_tensor<A>(loss, {1}),
                         detail::to_tensor<A>(dI, {d.s_q, d.s_kv})};
}

}  // namespace

IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in, Precision precision) {
  const KlDims d = validate(in);
  return precision == Precision::Reference ? compute<double>(in, d) : compute<float>(in, d);
}

}  // namespace dsa::reference
