// Indexer scores forward and backward (SPEC §2), one template on the accumulation type.
#include "dsa/reference/indexer.h"

#include <algorithm>

#include "dsa/contract/parallel.h"
#include "internal.h"
#include "value_limits.h"

namespace dsa::reference {
namespace {

using detail::Mat;

struct IndexerDims {
  int64_t s_q, h_i, d_i, s_kv;
};

// Validates the arguments shared by forward and backward; returns the dimensions.
IndexerDims validate(const char* where, const Tensor& q_idx, const Tensor& k_idx,
                     const Tensor& w, const KeyWindows& windows) {
  detail::check_rank3(where, "q_idx", q_idx, "[s_q, H_I, d_I]");
  detail::check_activation_dtype(where, "q_idx", q_idx);
  const IndexerDims d{q_idx.size(0), q_idx.size(1), q_idx.size(2), 0};
  detail::check_rank2(where, "k_idx", k_idx, "[s_kv, d_I]");
  detail::check_same_last_dim(where, "q_idx", q_idx, "k_idx", k_idx, "d_I");
  detail::check_activation_dtype(where, "k_idx", k_idx);
  check_shape(where, "w", w, {d.s_q, d.h_i});
  detail::check_wide_dtype(where, "w", w);
  IndexerDims out = d;
  out.s_kv = k_idx.size(0);
  detail::check_windows(where, windows, out.s_q, out.s_kv);
  return out;
}

/// Values the indexer reads (SPEC §6: no valid input may produce NaN; §2: fp32 scores, fp32
/// accumulation). q_idx and w rows of rows with a nonempty window, and k_idx rows inside some
/// window, are finite within FLT_MAX (rows never read may hold anything). Each dot's terms
/// Σ_d |q_idx[t,j,d] · k_idx[s,d]| stay within FLT_MAX, and (`score_sums`, the forward) so do
/// each score's, Σ_j |w[t,j]| · ReLU(q_idx[t,j]·k_idx[s]): then no fp32 partial sum overflows
/// in any order, and an exact score past FLT_MAX (which an fp32 kernel can only return as +inf
/// or clamp) is rejected (fresh-user finding F5). A cheap bound d_I · max|q| · max|k| clears
/// ordinary rows; the exact sums run only for rows it does not clear. Throws
/// std::invalid_argument naming the argument, the element and the limit.
void check_values(const char* where, const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                  const KeyWindows& win, const IndexerDims& d, bool score_sums) {
  const int64_t hd = d.h_i * d.d_i;
  const std::vector<char> read = detail::keys_in_any_window(win);
  std::vector<double> kmax(static_cast<size_t>(d.s_kv), 0.0);
  for (int64_t s = 0; s < d.s_kv; ++s) {
    if (!read[static_cast<size_t>(s)]) continue;
    detail::check_range_values(where, "k_idx", k_idx, s * d.d_i, (s + 1) * d.d_i,
                               [&] { return "key " + std::to_string(s) + " lies in a window, SPEC §6"; });
    for (int64_t c = 0; c < d.d_i; ++c)
      kmax[static_cast<size_t>(s)] = std::max(kmax[static_cast<size_t>(s)], std::abs(k_idx.get(s * d.d_i + c)));
  }
  const double limit = detail::kFp32Max;
  const double width = static_cast<double>(d.d_i);
  for (int64_t t = 0; t < d.s_q; ++t) {
    const int64_t ks = win.ks[t], len = win.length(t);
    if (len == 0) continue;  // the row reads nothing
    auto why = [t] { return "row " + std::to_string(t) + " has a nonempty window, SPEC §6"; };
    detail::check_range_values(where, "q_idx", q_idx, t * hd, (t + 1) * hd, why);
    detail::check_range_values(where, "w", w, t * d.h_i, (t + 1) * d.h_i, why);
    double qm = 0, wq = 0, km = 0;
    for (int64_t j = 0; j < d.h_i; ++j) {
      double m = 0;
      for (int64_t c = 0; c < d.d_i; ++c) m = std::max(m, std::abs(q_idx.get(t * hd + j * d.d_i + c)));
      qm = std::max(qm, m);
      wq += std::abs(w.get(t * d.h_i + j)) * m;
    }
    for (int64_t s = ks; s < ks + len; ++s) km = std::max(km, kmax[static_cast<size_t>(s)]);
    if (width * qm * km <= limit && (!score_sums || width * wq * km <= limit)) continue;
    for (int64_t s = ks; s < ks + len; ++s) {
      double score_terms = 0;
      for (int64_t j = 0; j < d.h_i; ++j) {
        double dot = 0, terms = 0;
        for (int64_t c = 0; c < d.d_i; ++c) {
          const double x = q_idx.get(t * hd + j * d.d_i + c) * k_idx.get(s * d.d_i + c);
          dot += x;
          terms += std::abs(x);
        }
        if (!(terms <= limit))
          check_arg(false, where, "q_idx",
                  "row " + std::to_string(t) + " head " + std::to_string(j) + " against k_idx row " +
                      std::to_string(s) + ": Σ_d |q_idx · k_idx| = " + str(terms),
                  "at most FLT_MAX = 3.40282e+38 (q_idx · k_idx is accumulated in fp32, SPEC §2; "
                  "no fp32 kernel can form it)");
        score_terms += std::abs(w.get(t * d.h_i + j)) * std::max(0.0, dot);
      }
      if (score_sums && !(score_terms <= limit))
        check_arg(false, where, "w",
                "row " + std::to_string(t) + ", key " + std::to_string(s) +
                    ": Σ_j |w[t,j]| · ReLU(q_idx[t,j] · k_idx[s]) = " + str(score_terms),
                "at most FLT_MAX = 3.40282e+38 (the score I[t,s] is fp32 and accumulated in fp32, "
                "SPEC §2: an fp32 kernel can only return it as +inf; scale w down)");
    }
  }
}

/// Gradient sums past FLT_MAX (SPEC §2 backward: dq_idx, dk_idx and dw are accumulated in
/// fp32; §9: each element's floor is Σ|terms| of its sum). An fp32 kernel adds the terms in
/// its own order, so a partial sum can overflow to inf where the float64 sum cancels to a
/// finite value (three rows adding d_scores +2e38, +2e38, -2e38 into one dk_idx element: the
/// reference holds 2e38, a kernel adding in row order inf); when Σ|terms| <= FLT_MAX no
/// partial sum in any order can. Over the keys s of row t's window:
///   dw[t,j]: Σ_s |dI[t,s]| · ReLU(q_idx[t,j]·k_idx[s]),
///   dq_idx[t,j,c]: Σ_s |dI[t,s] · w[t,j]| · 1[q_idx[t,j]·k_idx[s] > 0] · |k_idx[s,c]|,
///   dk_idx[s,c]: Σ_t Σ_j |dI[t,s] · w[t,j]| · 1[q_idx[t,j]·k_idx[s] > 0] · |q_idx[t,j,c]|
/// must each be at most FLT_MAX. The error names the inputs that form the gradients, as the
/// float64 result guard does ('d_scores, w, q_idx, k_idx'), with the element and the sum; the
/// gradients are linear in d_scores, so scaling it down is always a fix. A cheap bound
/// clears ordinary inputs; the exact sums run only when it does not. Called after
/// check_values and the d_scores check (every value read is finite). Throws
/// std::invalid_argument.
void check_gradient_terms(const char* where, const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                          const KeyWindows& win, const Tensor& d_scores, const IndexerDims& d) {
  const double limit = detail::kFp32Max, width = static_cast<double>(d.d_i);
  const int64_t hd = d.h_i * d.d_i;
  {
    std::vector<double> kmax(static_cast<size_t>(d.s_kv), 0.0), key_bound(static_cast<size_t>(d.s_kv), 0.0);
    for (int64_t s = 0; s < d.s_kv; ++s)
      for (int64_t c = 0; c < d.d_i; ++c)
        kmax[static_cast<size_t>(s)] = std::max(kmax[static_cast<size_t>(s)], std::abs(k_idx.get(s * d.d_i + c)));
    bool ok = true;
    for (int64_t t = 0; t < d.s_q && ok; ++t) {
      const int64_t ks = win.ks[t], len = win.length(t);
      if (len == 0) continue;
      double qm = 0, wm = 0, wq = 0, km = 0, dsum = 0;
      for (int64_t j = 0; j < d.h_i; ++j) {
        double m = 0;
        for (int64_t c = 0; c < d.d_i; ++c) m = std::max(m, std::abs(q_idx.get(t * hd + j * d.d_i + c)));
        const double aw = std::abs(w.get(t * d.h_i + j));
        qm = std::max(qm, m);
        wm = std::max(wm, aw);
        wq += aw * m;
      }
      for (int64_t s = ks; s < ks + len; ++s) {
        km = std::max(km, kmax[static_cast<size_t>(s)]);
        dsum += std::abs(d_scores.get(t * d.s_kv + s));
      }
      ok = dsum * width * qm * km <= limit && dsum * wm * km <= limit;
      for (int64_t s = ks; s < ks + len && ok; ++s)
        ok = (key_bound[static_cast<size_t>(s)] += std::abs(d_scores.get(t * d.s_kv + s)) * wq) <= limit;
    }
    if (ok) return;
  }
  const std::string fix = " (an fp32 kernel's partial sums can overflow to inf where the float64 sum is finite; "
                          "scale d_scores down)";
  // Named like the result guard (indexer_scores_backward): the inputs that form the gradient.
  auto fail = [&](const std::string& got, const char* grad) {
    check_arg(false, where, "d_scores, w, q_idx, k_idx", "values for which " + got,
              std::string("at most FLT_MAX = 3.40282e+38 (") + grad + " is accumulated in fp32, SPEC §2/§9)" + fix);
  };
  std::vector<double> dk_terms(static_cast<size_t>(d.s_kv * d.d_i), 0.0), dq_terms(static_cast<size_t>(hd));
  std::vector<double> dw_terms(static_cast<size_t>(d.h_i));
  for (int64_t t = 0; t < d.s_q; ++t) {
    const int64_t ks = win.ks[t], len = win.length(t);
    if (len == 0) continue;
    std::fill(dq_terms.begin(), dq_terms.end(), 0.0);
    std::fill(dw_terms.begin(), dw_terms.end(), 0.0);
    for (int64_t s = ks; s < ks + len; ++s) {
      const double g = std::abs(d_scores.get(t * d.s_kv + s));
      if (g == 0) continue;
      for (int64_t j = 0; j < d.h_i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d.d_i; ++c) dot += q_idx.get(t * hd + j * d.d_i + c) * k_idx.get(s * d.d_i + c);
        if (!(dot > 0)) continue;
        dw_terms[static_cast<size_t>(j)] += g * dot;
        const double gw = g * std::abs(w.get(t * d.h_i + j));
        for (int64_t c = 0; c < d.d_i; ++c) {
          dq_terms[static_cast<size_t>(j * d.d_i + c)] += gw * std::abs(k_idx.get(s * d.d_i + c));
          dk_terms[static_cast<size_t>(s * d.d_i + c)] += gw * std::abs(q_idx.get(t * hd + j * d.d_i + c));
        }
      }
    }
    for (int64_t j = 0; j < d.h_i; ++j) {
      if (!(dw_terms[static_cast<size_t>(j)] <= limit))
        fail("dw[" + std::to_string(t) + ", " + std::to_string(j) + "] has terms Σ_s |d_scores[t,s]| · ReLU(q_idx·k_idx) = " +
                 str(dw_terms[static_cast<size_t>(j)]), "dw");
      for (int64_t c = 0; c < d.d_i; ++c)
        if (!(dq_terms[static_cast<size_t>(j * d.d_i + c)] <= limit))
          fail("dq_idx[" + std::to_string(t) + ", " + std::to_string(j) + ", " + std::to_string(c) +
                   "] has terms Σ_s |d_scores[t,s] · w[t,j] · k_idx[s,c]| over keys with q_idx·k_idx > 0 = " +
                   str(dq_terms[static_cast<size_t>(j * d.d_i + c)]), "dq_idx");
    }
  }
  for (int64_t i = 0; i < d.s_kv * d.d_i; ++i)
    if (!(dk_terms[static_cast<size_t>(i)] <= limit))
      fail("dk_idx[" + std::to_string(i / d.d_i) + ", " + std::to_string(i % d.d_i) +
               "] has terms Σ_t Σ_j |d_scores[t,s] · w[t,j] · q_idx[t,j,c]| over the rows and heads with q_idx·k_idx > 0 = " +
               str(dk_terms[static_cast<size_t>(i)]), "dk_idx");
}

/// Flops of one query row over its whole window (the cost hint of the row loops).
double row_flops(const IndexerDims& d) {
  return 2.0 * static_cast<double>(d.h_i) * static_cast<double>(d.d_i) *
         static_cast<double>(std::max<int64_t>(1, d.s_kv));
}

template <class A>
Tensor forward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
               const KeyWindows& win, const IndexerDims& d) {
  const Mat<A> Q = detail::to_mat<A>(q_idx, d.s_q * d.h_i, d.d_i);
  const Mat<A> K = detail::to_mat<A>(k_idx, d.s_kv, d.d_i);
  const Mat<A> W = detail::to_mat<A>(w, d.s_q, d.h_i);
  Mat<A> I = Mat<A>::Constant(d.s_q, d.s_kv, -detail::inf<A>());
  // Query rows are independent: each writes only its own row of I.
  parallel_for(d.s_q, row_flops(d), [&](int64_t begin, int64_t end) {
    Mat<A> logits;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = win.ks[t], len = win.length(t);
      if (len == 0) continue;
      // logits[s, j] = k_idx[ks+s] · q_idx[t, j]; ReLU before the head weight.
      logits.noalias() = K.middleRows(ks, len) * Q.middleRows(t * d.h_i, d.h_i).transpose();
      I.row(t).segment(ks, len).noalias() =
          (logits.cwiseMax(A(0)) * W.row(t).transpose()).transpose();
    }
  });
  return detail::to_tensor<A>(I, {d.s_q, d.s_kv});
}

template <class A>
IndexerGrads backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                      const KeyWindows& win, const Tensor& d_scores, const IndexerDims& d) {
  const Mat<A> Q = detail::to_mat<A>(q_idx, d.s_q * d.h_i, d.d_i);
  const Mat<A> K = detail::to_mat<A>(k_idx, d.s_kv, d.d_i);
  const Mat<A> W = detail::to_mat<A>(w, d.s_q, d.h_i);
  const Mat<A> dI = detail::to_mat<A>(d_scores, d.s_q, d.s_kv);
  Mat<A> dQ = Mat<A>::Zero(d.s_q * d.h_i, d.d_i);
  Mat<A> dK = Mat<A>::Zero(d.s_kv, d.d_i);
  Mat<A> dW = Mat<A>::Zero(d.s_q, d.h_i);
  // Query rows run in parallel in blocks; each row's dk_idx term G·q_idx[t] is then added in
  // query-row order (the serial order), in parallel over key rows, so every element is the
  // same sum whatever the thread count. The block size bounds memory (~256 MiB) only.
  const int64_t row_bytes =
      std::max<int64_t>(1, d.s_kv * d.d_i * static_cast<int64_t>(sizeof(A)));
  const int64_t block = std::clamp<int64_t>(4 * max_threads(), 1,
                                            std::max<int64_t>(1, (int64_t{256} << 20) / row_bytes));
  std::vector<Mat<A>> dKt(static_cast<size_t>(std::min(block, std::max<int64_t>(d.s_q, 1))));
  for (int64_t t0 = 0; t0 < d.s_q; t0 += block) {
    const int64_t nb = std::min(block, d.s_q - t0);
    parallel_for(nb, 3 * row_flops(d), [&](int64_t begin, int64_t end) {
      Mat<A> logits, G;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t t = t0 + i;
        const int64_t ks = win.ks[t], len = win.length(t);
        if (len == 0) continue;
        const auto Kw = K.middleRows(ks, len);
        const auto Qt = Q.middleRows(t * d.h_i, d.h_i);
        logits.noalias() = Kw * Qt.transpose();  // [len, H_I]
        const auto g = dI.row(t).segment(ks, len).transpose();  // [len]
        dW.row(t).noalias() = (logits.cwiseMax(A(0)).transpose() * g).transpose();
        // G[s, j] = dI[t, s] · w[t, j] · 1[logit > 0]  (ReLU'(0) = 0)
        G = (logits.array() > A(0)).select((g * W.row(t)).array(), A(0)).matrix();
        dQ.middleRows(t * d.h_i, d.h_i).noalias() = G.transpose() * Kw;
        dKt[static_cast<size_t>(i)].noalias() = G * Qt;  // [len, d_I], added to dK below
      }
    });
    // Row adds are memory-bound: one counts as ~8 GEMM flops.
    const double adds_per_key = 8.0 * static_cast<double>(nb * d.d_i);
    parallel_for(d.s_kv, adds_per_key, [&](int64_t k0, int64_t k1) {
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t t = t0 + i;
        const int64_t lo = std::max<int64_t>(k0, win.ks[t]);
        const int64_t hi = std::min<int64_t>(k1, win.ks[t] + win.length(t));
        if (lo < hi)
          dK.middleRows(lo, hi - lo) +=
              dKt[static_cast<size_t>(i)].middleRows(lo - win.ks[t], hi - lo);
      }
    });
  }
  return IndexerGrads{detail::to_tensor<A>(dQ, {d.s_q, d.h_i, d.d_i}),
                      detail::to_tensor<A>(dK, {d.s_kv, d.d_i}),
                      detail::to_tensor<A>(dW, {d.s_q, d.h_i})};
}

}  // namespace

Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                      const KeyWindows& windows, Precision precision) {
  const IndexerDims d = validate("indexer_scores", q_idx, k_idx, w, windows);
  check_values("indexer_scores", q_idx, k_idx, w, windows, d, /*score_sums=*/true);
  return precision == Precision::Reference ? forward<double>(q_idx, k_idx, w, windows, d)
                                           : forward<float>(q_idx, k_idx, w, windows, d);
}

IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                     const KeyWindows& windows, const Tensor& d_scores,
                                     Precision precision) {
  const char* where = "indexer_scores_backward";
  const IndexerDims d = validate(where, q_idx, k_idx, w, windows);
  check_shape(where, "d_scores", d_scores, {d.s_q, d.s_kv});
  detail::check_wide_dtype(where, "d_scores", d_scores);
  check_values(where, q_idx, k_idx, w, windows, d, /*score_sums=*/false);
  for (int64_t t = 0; t < d.s_q; ++t)  // inside the window only: the rest is ignored (SPEC §2)
    detail::check_range_values(where, "d_scores", d_scores, t * d.s_kv + windows.ks[t],
                               t * d.s_kv + windows.ks[t] + windows.length(t),
                               [t] { return "inside row " + std::to_string(t) + "'s window, SPEC §2/§6"; });
  check_gradient_terms(where, q_idx, k_idx, w, windows, d_scores, d);
  if (precision != Precision::Reference) return backward<float>(q_idx, k_idx, w, windows, d_scores, d);
  IndexerGrads g = backward<double>(q_idx, k_idx, w, windows, d_scores, d);
  // Gradients past FLT_MAX (huge d_scores or w): no fp32 kernel can return them.
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"dq_idx", &g.dq_idx},
                                {"dk_idx", &g.dk_idx}, {"dw", &g.dw}})
    detail::check_result_values(where, "d_scores, w, q_idx, k_idx", name, *t);
  return g;
}

}  // namespace dsa::reference
