// Top-k selection with explicit tie policies (SPEC §3). Exact: no arithmetic on scores.
#include "dsa/reference/topk.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "dsa/contract/parallel.h"
#include "internal.h"

namespace dsa::reference {

int64_t topk_rows_selected(int64_t s_q, int64_t s_kv, int64_t k) {
  return k == 0 || s_kv == 0 ? 0 : std::max<int64_t>(0, s_q);
}

Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                   const std::optional<KeyWindows>& windows) {
  const char* where = "select_topk";
  detail::check_rank2(where, "scores", scores, "[s_q, s_kv]");
  detail::check_wide_dtype(where, "scores", scores);
  check_arg(k >= 0, where, "k", std::to_string(k), ">= 0");
  check_arg(k <= std::numeric_limits<int32_t>::max(), where, "k", std::to_string(k),
            "<= 2^31 - 1");
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  check_arg(s_kv <= std::numeric_limits<int32_t>::max(), where, "scores",
            "s_kv = " + std::to_string(s_kv), "s_kv <= 2^31 - 1 (int32 ids)");
  if (windows) detail::check_windows(where, *windows, s_q, s_kv);

  // Any resolves as Small (SPEC §3.3 allows any subset; Small is one of them).
  const bool large = policy.tie_break == TieBreak::Large;
  // Total order: score descending (IEEE comparison: -0.0 == +0.0), then column id
  // ascending (small) or descending (large). The first k_eff entries in this order are
  // exactly the §3.3 set, and already in the §3.4 sorted order.
  auto before = [large](const std::pair<double, int32_t>& a,
                        const std::pair<double, int32_t>& b) {
    if (a.first != b.first) return a.first > b.first;
    return large ? a.second > b.second : a.second < b.second;
  };

  Tensor out(DType::I32, {s_q, k});
  int32_t* ids = out.data<int32_t>();
  std::fill(ids, ids + s_q * k, -1);
  const float* f32 = scores.dtype() == DType::F32 ? scores.data<float>() : nullptr;
  const double* f64 = scores.dtype() == DType::F64 ? scores.data<double>() : nullptr;
  // Rows are independent: each writes only its own row of ids.
  const double row_work = 64.0 * static_cast<double>(std::max<int64_t>(1, s_kv));
  parallel_for(topk_rows_selected(s_q, s_kv, k), row_work, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<double, int32_t>> cand;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ks = windows ? windows->ks[t] : 0;
      const int64_t ke = windows ? std::max(windows->ke[t], ks) : s_kv;
      cand.clear();
      for (int64_t s = ks; s < ke; ++s) {
        const int64_t i = t * s_kv + s;
        const double v = f32 ? static_cast<double>(f32[i]) : f64[i];  // exact
        if (std::isnan(v) || v == -std::numeric_limits<double>::infinity()) continue;
        cand.emplace_back(v, static_cast<int32_t>(s));
      }
      const int64_t k_eff = std::min<int64_t>(k, static_cast<int64_t>(cand.size()));
      std::partial_sort(cand.begin(), cand.begin() + k_eff, cand.end(), before);
      for (int64_t j = 0; j < k_eff; ++j) ids[t * k + j] = cand[j].second;
    }
  });
  return out;
}

}  // namespace dsa::reference
