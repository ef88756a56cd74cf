// Indexer KL loss, dense and sparse (SPEC §7), one template on the accumulation type.
#include "dsa/reference/kl_loss.h"

#include <algorithm>
#include <cmath>

#include "dsa/contract/parallel.h"
#include "internal.h"
#include "value_limits.h"

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
  check_arg(detail::fits_fp32(in.sm_scale), where, "sm_scale", str(in.sm_scale), detail::fp32_limit_text());
  check_arg(detail::fits_fp32(in.coeff), where, "coeff", str(in.coeff), detail::fp32_limit_text());
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

/// Values the loss reads (SPEC §6: no valid input may produce NaN; §7; §9 fp32 accumulation).
/// Over each row's candidate keys (its window's keys, or its valid selected ids inside the
/// window) a score is -inf (not in S_t) or finite within FLT_MAX: +inf and NaN have no softmax
/// and no valid §2 indexer returns them (its fp32 scores are finite inside the window). The
/// finite scores of a row span at most FLT_MAX (the student's I - max is formed in fp32). The
/// q rows of rows with keys and the kv rows of every S_t are finite, and each teacher logit's
/// terms, max(1, |sm_scale|) · Σ_d |q_d · kv_d|, stay within FLT_MAX (P in fp32, any order).
/// Throws std::invalid_argument naming the argument, the element and the limit.
void check_values(const IndexerKlInputs& in, const KlDims& d) {
  const char* where = "indexer_kl_loss";
  const std::string limit = detail::fp32_limit_text();
  std::vector<char> kv_read(static_cast<size_t>(d.s_kv), 0);
  std::vector<std::vector<int32_t>> sets(static_cast<size_t>(d.s_q));
  for (int64_t t = 0; t < d.s_q; ++t) {
    std::vector<int32_t> keys;  // candidate keys of row t: S_t before the -inf rule
    const int64_t ks = in.windows.ks[t], ke = in.windows.ke[t];
    if (in.mode == KlMode::Dense) {
      for (int64_t s = ks; s < ke; ++s) keys.push_back(static_cast<int32_t>(s));
    } else {
      const int32_t* row = in.indices->data<int32_t>() + t * d.k;
      for (int64_t j = 0; j < d.k; ++j)
        if (row[j] >= 0 && row[j] < d.s_kv && in.windows.contains(t, row[j])) keys.push_back(row[j]);
    }
    double lo = detail::kFp32Max, hi = -detail::kFp32Max;
    auto& S = sets[static_cast<size_t>(t)];
    for (int32_t s : keys) {
      const double v = in.scores.get(t * d.s_kv + s);
      if (std::isinf(v) && v < 0) continue;  // not in S_t (SPEC §7)
      if (!detail::fits_fp32(v))
        check_arg(false, where, "scores",
                str(v) + " at [" + std::to_string(t) + ", " + std::to_string(s) + "] (a key of row " +
                    std::to_string(t) + (in.mode == KlMode::Dense ? "'s window" : "'s selected ids") + ")",
                limit + ", or -inf for a key outside S_t (SPEC §7: +inf and NaN have no softmax; "
                        "a §2 indexer's fp32 scores are finite inside the window)");
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      S.push_back(s);
    }
    if (S.empty()) continue;
    if (!(hi - lo <= detail::kFp32Max))
      check_arg(false, where, "scores",
              "row " + std::to_string(t) + " spanning [" + str(lo) + ", " + str(hi) + "] over S_t",
              "finite scores of one row within FLT_MAX = 3.40282e+38 of each other (the student's "
              "log-softmax forms I - max in fp32, SPEC §7/§9)");
    detail::check_range_values(where, "q", in.q, t * d.h_q * d.d_qk, (t + 1) * d.h_q * d.d_qk,
                               [t] { return "row " + std::to_string(t) + " has keys in S_t, SPEC §6"; });
    for (int32_t s : S) kv_read[static_cast<size_t>(s)] = 1;
  }
  std::vector<double> kvmax(static_cast<size_t>(d.s_kv), 0.0);
  for (int64_t s = 0; s < d.s_kv; ++s) {
    if (!kv_read[static_cast<size_t>(s)]) continue;  // never read: may hold anything
    detail::check_range_values(where, "kv", in.kv, s * d.d_qk, (s + 1) * d.d_qk,
                               [s] { return "key " + std::to_string(s) + " is in some S_t, SPEC §6"; });
    for (int64_t c = 0; c < d.d_qk; ++c)
      kvmax[static_cast<size_t>(s)] = std::max(kvmax[static_cast<size_t>(s)], std::abs(in.kv.get(s * d.d_qk + c)));
  }
  // Teacher logits: a cheap bound d_qk · max|q| · max|kv| first; the exact Σ|terms| only
  // for rows that bound does not clear.
  const double scale = std::max(1.0, std::abs(in.sm_scale));
  for (int64_t t = 0; t < d.s_q; ++t) {
    const auto& S = sets[static_cast<size_t>(t)];
    if (S.empty()) continue;
    double qm = 0, km = 0;
    for (int64_t i = t * d.h_q * d.d_qk; i < (t + 1) * d.h_q * d.d_qk; ++i) qm = std::max(qm, std::abs(in.q.get(i)));
    for (int32_t s : S) km = std::max(km, kvmax[static_cast<size_t>(s)]);
    if (scale * static_cast<double>(d.d_qk) * qm * km <= detail::kFp32Max) continue;
    for (int64_t h = 0; h < d.h_q; ++h)
      for (int32_t s : S) {
        double terms = 0;
        for (int64_t c = 0; c < d.d_qk; ++c)
          terms += std::abs(in.q.get((t * d.h_q + h) * d.d_qk + c) * in.kv.get(s * d.d_qk + c));
        if (!(scale * terms <= detail::kFp32Max))
          check_arg(false, where, "q",
                  "row " + std::to_string(t) + " head " + std::to_string(h) + " against kv row " +
                      std::to_string(s) + ": max(1, |sm_scale|) · Σ_d |q_d · kv_d| = " + str(scale * terms),
                  "at most FLT_MAX = 3.40282e+38 (the teacher logit P = sm_scale · q · kv is "
                  "accumulated in fp32, SPEC §7/§9; scale q, kv or sm_scale down)");
      }
  }
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
  check_values(in, d);
  if (precision != Precision::Reference) return compute<float>(in, d);
  IndexerKlResult r = compute<double>(in, d);
  // Inputs the checks above let through never reach these (a guard, e.g. a huge coeff).
  detail::check_result_values("indexer_kl_loss", "scores, q, kv, coeff", "loss", r.loss);
  detail::check_result_values("indexer_kl_loss", "scores, q, kv, coeff", "d_scores", r.d_scores);
  return r;
}

}  // namespace dsa::reference
