// Composite top-k selection with explicit tie policies (SPEC §3) from a stable ATen sort.
#include "internal.h"
#include "kernels.h"

#include <limits>

namespace dsa::optimized::kernels {

at::Tensor topk_indices(const at::Tensor& scores, int64_t k, const c10::optional<at::Tensor>& ks,
                        const c10::optional<at::Tensor>& ke, c10::string_view tie_break,
                        bool sorted) {
  const char* op = "dsa::topk_indices";
  detail::check_rank(op, "scores", scores, 2, "[s_q, s_kv]");
  detail::check_float(op, "scores", scores, false);
  TORCH_CHECK(k >= 0, op, ": argument 'k' is ", k, ", expected k >= 0");
  const std::string tb(tie_break.data(), tie_break.size());
  TORCH_CHECK(tb == "any" || tb == "small" || tb == "large", op, ": argument 'tie_break' is '",
              tb, "', expected \"any\", \"small\" or \"large\"");
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  const auto mask = detail::window_mask(op, ks, ke, s_q, s_kv, scores.device());
  const auto ids_opts = scores.options().dtype(at::kInt);
  if (k == 0 || s_kv == 0 || s_q == 0) return at::full({s_q, k}, -1, ids_opts);

  // Excluded: outside the window, NaN, -inf (SPEC §3.1). Normalise -0.0 to +0.0 so the sort
  // sees IEEE equality (§3.3); excluded entries become -inf and sort last.
  const double ninf = -std::numeric_limits<double>::infinity();
  const auto selectable = mask.logical_and(scores.isnan().logical_not())
                              .logical_and(scores.ne(ninf));
  auto v = at::where(scores.eq(0), at::zeros({}, scores.options()), scores);
  v = v.masked_fill(selectable.logical_not(), ninf);
  // Stable descending sort keeps equal scores in column order: ids ascending (small, any).
  // For large, sort the reversed row so equal scores come out with ids descending.
  const bool large = tb == "large";
  if (large) v = v.flip({1});
  const int64_t width = std::min(k, s_kv);
  auto order = std::get<1>(at::sort(v, /*stable=*/true, /*dim=*/1, /*descending=*/true))
                   .narrow(1, 0, width);
  if (large) order = (s_kv - 1) - order;
  // Compact prefix of k_eff = min(k, #selectable) ids, then -1 (SPEC §3.2).
  const auto k_eff = selectable.sum(1, /*keepdim=*/true).clamp_max(k);
  const auto slot = at::arange(width, order.options()).unsqueeze(0);
  order = order.masked_fill(slot.ge(k_eff), -1);
  auto out = at::full({s_q, k}, -1, ids_opts);
  out.narrow(1, 0, width).copy_(order);
  (void)sorted;  // The sorted order also satisfies sorted=false (prefix order unspecified).
  return out;
}

}  // namespace dsa::optimized::kernels
