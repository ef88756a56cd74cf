// Composite indexer KL loss and its gradient into the scores (SPEC §7).
#include "internal.h"
#include "kernels.h"

#include <limits>

namespace dsa::optimized::kernels {

std::tuple<at::Tensor, at::Tensor> indexer_kl_loss(
    const at::Tensor& scores, const at::Tensor& q, const at::Tensor& kv, double sm_scale,
    const c10::optional<at::Tensor>& ks, const c10::optional<at::Tensor>& ke,
    c10::string_view mode, const c10::optional<at::Tensor>& indices, double coeff) {
  const char* op = "dsa::indexer_kl_loss";
  using namespace detail;
  check_rank(op, "scores", scores, 2, "[s_q, s_kv]");
  check_float(op, "scores", scores, false);
  check_rank(op, "q", q, 3, "[s_q, h_q, d_qk]");
  check_rank(op, "kv", kv, 2, "[s_kv, d_qk]");
  check_float(op, "q", q, true);
  check_float(op, "kv", kv, true);
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  check_dim(op, "q", q, 0, s_q, "[s_q, h_q, d_qk]");
  check_dim(op, "kv", kv, 0, s_kv, "[s_kv, d_qk]");
  check_dim(op, "kv", kv, 1, q.size(2), "[s_kv, d_qk]");
  check_device(op, "q", q, scores.device());
  check_device(op, "kv", kv, scores.device());
  TORCH_CHECK(std::isfinite(sm_scale), op, ": argument 'sm_scale' is ", sm_scale,
              ", expected a finite value");
  TORCH_CHECK(std::isfinite(coeff), op, ": argument 'coeff' is ", coeff,
              ", expected a finite value");
  const std::string m(mode.data(), mode.size());
  TORCH_CHECK(m == "dense" || m == "sparse", op, ": argument 'mode' is '", m,
              "', expected \"dense\" or \"sparse\"");
  auto in_set = window_mask(op, ks, ke, s_q, s_kv, scores.device());  // S_t [s_q, s_kv]
  if (m == "sparse") {
    TORCH_CHECK(indices.has_value() && indices->defined(), op,
                ": argument 'indices' is missing, expected [s_q, k] int32 in mode \"sparse\"");
    const at::Tensor& idx = *indices;
    TORCH_CHECK(idx.dim() == 2 || (idx.dim() == 3 && idx.size(1) == 1), op,
                ": argument 'indices' has shape ", sizes_str(idx.sizes()),
                ", expected shape [s_q, k] or [s_q, 1, k]");
    check_dim(op, "indices", idx, 0, s_q, "[s_q, k]");
    check_int(op, "indices", idx, false);
    check_device(op, "indices", idx, scores.device());
    const auto ids2d = idx.reshape({s_q, idx.size(-1)});
    const auto vs = valid_slots(ids2d, s_kv, c10::nullopt);
    auto hits = at::zeros({s_q, s_kv}, scores.options().dtype(at::kInt));
    if (s_kv > 0 && ids2d.size(1) > 0)
      hits.scatter_add_(1, vs.second, vs.first.to(at::kInt));  // duplicates count once below
    in_set = in_set.logical_and(hits.gt(0));
  }
  // A key whose indexer score is -inf is not in S_t (SPEC §7): an all -inf row is empty.
  in_set = in_set.logical_and(scores.isneginf().logical_not());
  const auto cdt = compute_dtype({scores, q, kv});
  const double ninf = -std::numeric_limits<double>::infinity();
  const auto out_set = in_set.logical_not();
  const auto row_live = in_set.any(1, /*keepdim=*/true);                  // |S_t| > 0
  // Logits at the compute precision; softmaxes, logs and the KL sums in f64: KL = Σ p ln p -
  // Σ p ln q cancels, and fp32 there costs several times the fp32 baseline's error.
  constexpr auto kAcc = at::kDouble;
  const auto zero = at::zeros({}, scores.options().dtype(kAcc));
  // Teacher (detached): Σ_h softmax_S(P[t,h,:]), L1-normalised over s.
  auto P = at::matmul(q.to(cdt), kv.to(cdt).t()).mul_(sm_scale).to(kAcc);  // [s_q, h_q, s_kv]
  P.masked_fill_(out_set.unsqueeze(1), ninf);
  P.masked_fill_(row_live.logical_not().unsqueeze(1), 0);                  // empty rows: no NaN
  auto teacher = at::softmax(P, 2).masked_fill_(out_set.unsqueeze(1), 0).sum(1);
  teacher = teacher / teacher.sum(1, /*keepdim=*/true).clamp_min(
                          std::numeric_limits<double>::min());
  teacher.masked_fill_(out_set, 0);
  // Student log softmax over S_t.
  auto I = scores.to(kAcc).masked_fill(out_set, ninf).masked_fill(row_live.logical_not(), 0);
  const auto log_q = at::log_softmax(I, 1);
  const auto terms = at::where(teacher.gt(0), teacher * (teacher.log() - log_q), zero);
  const auto n_rows = row_live.sum().to(kAcc).clamp_min(1);
  const auto loss = (terms.sum() * coeff / n_rows).reshape({1});
  const auto d_scores =
      at::where(in_set, (log_q.exp() - teacher) * coeff / n_rows, zero);
  return {loss.to(cdt), d_scores.to(cdt)};
}

}  // namespace dsa::optimized::kernels
