// Top-k selection with explicit tie policies (SPEC §3).
#pragma once

#include <optional>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/policies.h"
#include "dsa/contract/tensor.h"

namespace dsa::reference {

/// topk_indices [s_q,k] I32 contiguous: per row the k_eff = min(k, #selectable) selected
/// column ids as a compact prefix, then -1. Selectable: inside the window, not NaN, not -inf.
/// Ties at v* resolved by policy.tie_break (Any resolves as Small here); sorted prefix is
/// by score descending, equal scores by the tie order. -0.0 == +0.0. SPEC §3.
/// scores [s_q,s_kv] F32/F64; k >= 0 (k > s_kv legal); windows (optional) s_q rows, s_kv keys.
/// Throws std::invalid_argument naming the argument on bad shape, dtype, k or windows.
Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                   const std::optional<KeyWindows>& windows = std::nullopt);

/// The query rows select_topk selects in one by one: s_q (negative: 0), or 0 when no row has a
/// slot to fill or a key to select (k = 0: the output has no element; s_kv = 0: every slot is
/// -1 padding, written in one fill), so 2^31 - 1 empty rows cost nothing (fresh-user finding
/// 8: they took 15 s). Same shapes as select_topk.
int64_t topk_rows_selected(int64_t s_q, int64_t s_kv, int64_t k);

}  // namespace dsa::reference
