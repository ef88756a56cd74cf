// Exact top-k checker on given scores (SPEC §3) and the fused indexer+top-k checker (§9),
// Conventions of other kernels (§3.6, §9) are converted before a check (CandidateBackend),
// never inside it.
#pragma once

#include <optional>
#include <vector>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/policies.h"
#include "dsa/contract/tensor.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle {

/// Pads a narrowed [s_q, min(k,s_kv)] output to [s_q, k] with -1 (the representation named by
/// the convention topk_width_min_k_s_kv); returns `indices` unchanged when it already has k
/// columns. Keeps the dtype. Throws std::invalid_argument for rank != 2 or more than k columns.
Tensor adapt_topk_width(const Tensor& indices, int64_t k);

/// The query rows check_topk and check_fused_topk check one by one: s_q (negative: 0), or 0
/// when no row holds a slot or a score (k = 0 and s_kv = 0: the dtype and shape checks are the
/// whole check, however many rows; fresh-user finding 8: 2^31 - 1 such rows took 15 s). A row
/// with a slot or a score is checked (k = 0 with s_kv > 0: its NaN scores are listed).
int64_t topk_rows_checked(int64_t s_q, int64_t s_kv, int64_t k);

/// Checks `indices` against §3 exactly for `scores` [s_q,s_kv] (F32/F64), k, policy and
/// optional windows. Rules (violation names): dtype (I32), shape ([s_q,k]), id_out_of_range
/// (anything but -1 outside [0,s_kv)), not_compact (a valid id after -1), outside_window,
/// selected_nan, selected_neg_inf, duplicate, wrong_count (valid ids != k_eff), below_vstar,
/// missing_above_vstar, tie_policy (small/large picked the wrong tied ids), unsorted,
/// tie_order. No convention relaxes a rule: a selected NaN or -inf is always a violation.
/// Scores in details print with 9 significant digits (F32; 17 for F64), plus their hex bits
/// when two printed values would look equal. Rows whose window contains NaN are listed in
/// `nan_rows` when given. Only the rows topk_rows_checked counts are visited. Never throws
/// for bad candidate data; throws std::invalid_argument on bad scores/windows.
std::vector<TopkViolation> check_topk(const Tensor& indices, const Tensor& scores, int64_t k,
                                      const TopkPolicy& policy,
                                      const std::optional<KeyWindows>& windows,
                                      std::vector<int64_t>* nan_rows = nullptr);

/// True for the rules that break the output contract whatever the representation (SPEC §9):
/// selected_nan, selected_neg_inf, duplicate, id_out_of_range, not_compact, outside_window.
bool is_contract_violation(const std::string& rule);

/// The reason line of a failing top-k check. With contract violations: "deviates from the
/// contract: selected NaN in rows 0, 3, 6; duplicate id in rows 2" (rows ascending, at most
/// 10 then "and N more"); then, or otherwise, the first other violation as
/// "<rule> row=r slot=j: detail". "" for an empty list.
std::string summarize_topk_violations(const std::vector<TopkViolation>& v);

/// Fused indexer + top-k (SPEC §9): `indices` were selected from a backend's own scores;
/// `ref_scores` [s_q,s_kv] are the float64 reference scores (-inf outside windows) and
/// `score_bound` the accepted absolute score error (ratio-rule bound of the scores). The
/// structural rules of check_topk apply; the set may differ from the exact top-k only by
/// entries whose reference score lies within score_bound of v*: below_vstar_beyond_bound,
/// missing_beyond_bound, wrong_count.
std::vector<TopkViolation> check_fused_topk(const Tensor& indices, const Tensor& ref_scores,
                                            double score_bound, int64_t k,
                                            const KeyWindows& windows);

/// Same with one band per query row (SPEC §9 local bounds): row t's set may differ from the
/// exact top-k only by entries whose reference score lies within row_bounds[t] of the row's
/// v*. `row_bounds` has s_q finite non-negative entries (std::invalid_argument otherwise).
std::vector<TopkViolation> check_fused_topk(const Tensor& indices, const Tensor& ref_scores,
                                            const std::vector<double>& row_bounds, int64_t k,
                                            const KeyWindows& windows);

}  // namespace dsa::oracle
