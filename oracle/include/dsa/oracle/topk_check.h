// Exact top-k checker on given scores (SPEC §3) and the fused indexer+top-k checker (§9),
// with explicit adapters for known peer conventions (§3.6).
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/policies.h"
#include "dsa/contract/tensor.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle {

/// Peer conventions the checker applies only when asked (SPEC §3.6), never by default.
struct TopkConventions {
  /// Output narrowed to min(k, s_kv) columns; adapt_topk_width pads it back to k with -1.
  bool narrowed_width = false;
  /// torch.topk ranks NaN above +inf: selected NaN entries are accepted and take slots first.
  bool nan_ranks_first = false;
  /// torch.topk orders +0.0 before -0.0 inside a sorted prefix (ids then free among them).
  bool positive_zero_first = false;
};

/// Reads a fixture's `conventions` JSON: "width" mentioning min(k, s_kv) → narrowed_width;
/// "nan" mentioning NaN ranked above +inf → nan_ranks_first; "ties" naming torch.topk →
/// positive_zero_first. Unknown keys are ignored.
TopkConventions topk_conventions_from_json(const nlohmann::json& conventions);

/// Pads a narrowed [s_q, min(k,s_kv)] output to [s_q, k] with -1 (the narrowed-width
/// adapter); returns `indices` unchanged when it already has k columns. Keeps the dtype.
Tensor adapt_topk_width(const Tensor& indices, int64_t k);

/// Checks `indices` against §3 exactly for `scores` [s_q,s_kv] (F32/F64), k, policy and
/// optional windows. Rules (violation names): dtype (I32), shape ([s_q,k]), id_out_of_range
/// (anything but -1 outside [0,s_kv)), not_compact (a valid id after -1), outside_window,
/// selected_nan, selected_neg_inf, duplicate, wrong_count (valid ids != k_eff), below_vstar,
/// missing_above_vstar, tie_policy (small/large picked the wrong tied ids), unsorted,
/// tie_order. Rows whose window contains NaN are listed in `nan_rows` when given.
/// Never throws for bad candidate data; throws std::invalid_argument on bad scores/windows.
std::vector<TopkViolation> check_topk(const Tensor& indices, const Tensor& scores, int64_t k,
                                      const TopkPolicy& policy,
                                      const std::optional<KeyWindows>& windows,
                                      const TopkConventions& conventions = {},
                                      std::vector<int64_t>* nan_rows = nullptr);

/// Fused indexer + top-k (SPEC §9): `indices` were selected from a backend's own scores;
/// `ref_scores` [s_q,s_kv] are the float64 reference scores (-inf outside windows) and
/// `score_bound` the accepted absolute score error (ratio-rule bound of the scores). The
/// structural rules of check_topk apply; the set may differ from the exact top-k only by
/// entries whose reference score lies within score_bound of v*: below_vstar_beyond_bound,
/// missing_beyond_bound, wrong_count.
std::vector<TopkViolation> check_fused_topk(const Tensor& indices, const Tensor& ref_scores,
                                            double score_bound, int64_t k,
                                            const KeyWindows& windows);

}  // namespace dsa::oracle
