// Indexer scores forward and backward (SPEC §2), one template on the accumulation type.
#include "dsa/reference/indexer.h"

#include <algorithm>

#include "dsa/contract/parallel.h"
#include "internal.h"

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
  return precision == Precision::Reference
             ? backward<double>(q_idx, k_idx, w, windows, d_scores, d)
             : backward<float>(q_idx, k_idx, w, windows, d_scores, d);
}

}  // namespace dsa::reference
