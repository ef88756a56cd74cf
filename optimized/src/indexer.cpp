// Composite indexer scores and backward (SPEC §2) from ATen matmuls.
#include "internal.h"
#include "kernels.h"

namespace dsa::optimized::kernels {
namespace {

struct IndexerShapes {
  int64_t s_q, h_i, d_i, s_kv;
};

IndexerShapes check_indexer(const char* op, const at::Tensor& q_idx, const at::Tensor& k_idx,
                            const at::Tensor& w) {
  using namespace detail;
  check_rank(op, "q_idx", q_idx, 3, "[s_q, H_I, d_I]");
  check_rank(op, "k_idx", k_idx, 2, "[s_kv, d_I]");
  check_rank(op, "w", w, 2, "[s_q, H_I]");
  const IndexerShapes s{q_idx.size(0), q_idx.size(1), q_idx.size(2), k_idx.size(0)};
  check_dim(op, "k_idx", k_idx, 1, s.d_i, "[s_kv, d_I]");
  check_dim(op, "w", w, 0, s.s_q, "[s_q, H_I]");
  check_dim(op, "w", w, 1, s.h_i, "[s_q, H_I]");
  check_float(op, "q_idx", q_idx, true);
  check_float(op, "k_idx", k_idx, true);
  check_float(op, "w", w, false);
  check_device(op, "k_idx", k_idx, q_idx.device());
  check_device(op, "w", w, q_idx.device());
  return s;
}

// logits[t,j,s] = q_idx[t,j,:]·k_idx[s,:] at the compute dtype: [s_q, H_I, s_kv].
at::Tensor indexer_logits(const at::Tensor& qf, const at::Tensor& kf) {
  return at::matmul(qf, kf.t());
}

}  // namespace

at::Tensor indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                          const c10::optional<at::Tensor>& ks,
                          const c10::optional<at::Tensor>& ke) {
  const char* op = "dsa::indexer_scores";
  const auto s = check_indexer(op, q_idx, k_idx, w);
  const auto mask = detail::window_mask(op, ks, ke, s.s_q, s.s_kv, q_idx.device());
  const auto cdt = detail::compute_dtype({q_idx, k_idx, w});
  const auto qf = q_idx.to(cdt), kf = k_idx.to(cdt), wf = w.to(cdt);
  auto scores = indexer_logits(qf, kf).relu_().mul_(wf.unsqueeze(2)).sum(1);
  return scores.masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> indexer_scores_backward(
    const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
    const at::Tensor& d_scores, const c10::optional<at::Tensor>& ks,
    const c10::optional<at::Tensor>& ke) {
  const char* op = "dsa::indexer_scores_backward";
  const auto s = check_indexer(op, q_idx, k_idx, w);
  detail::check_rank(op, "d_scores", d_scores, 2, "[s_q, s_kv]");
  detail::check_dim(op, "d_scores", d_scores, 0, s.s_q, "[s_q, s_kv]");
  detail::check_dim(op, "d_scores", d_scores, 1, s.s_kv, "[s_q, s_kv]");
  detail::check_float(op, "d_scores", d_scores, false);
  detail::check_device(op, "d_scores", d_scores, q_idx.device());
  const auto mask = detail::window_mask(op, ks, ke, s.s_q, s.s_kv, q_idx.device());
  const auto cdt = detail::compute_dtype({q_idx, k_idx, w, d_scores});
  const auto qf = q_idx.to(cdt), kf = k_idx.to(cdt), wf = w.to(cdt);
  // Entries outside the window are ignored (even NaN): select, never multiply.
  const auto dI = at::where(mask, d_scores.to(cdt), at::zeros({}, qf.options()));
  const auto logits = indexer_logits(qf, kf);                      // [s_q, H_I, s_kv]
  const auto dI3 = dI.unsqueeze(1);                                // [s_q, 1, s_kv]
  // dw sums signed terms over s_kv and cancels: accumulate it in f64 (elementwise, cheap).
  const auto dw = (dI3.to(at::kDouble) * logits.relu().to(at::kDouble)).sum(2).to(cdt);
  const auto g = (dI3 * wf.unsqueeze(2)) * logits.gt(0).to(cdt);  // [s_q, H_I, s_kv]
  const auto dq = at::matmul(g, kf);                               // [s_q, H_I, d_I]
  const auto dk = at::matmul(g.reshape({s.s_q * s.h_i, s.s_kv}).t(),
                             qf.reshape({s.s_q * s.h_i, s.d_i}));  // [s_kv, d_I]
  return {dq.to(q_idx.scalar_type()), dk.to(k_idx.scalar_type()), dw.to(w.scalar_type())};
}

}  // namespace dsa::optimized::kernels
