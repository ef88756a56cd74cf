// Top-k selection with explicit tie policies as the `dsa::topk_indices` operator (SPEC §3).
#pragma once

#include <ATen/core/Tensor.h>

#include "dsa/contract/policies.h"

namespace dsa::optimized {

/// indices [s_q,k] int32 contiguous: per row k_eff = min(k, #selectable) column ids as a
/// compact prefix, then -1. Selectable = inside [ks,ke), not NaN, not -inf. Ties at v* by
/// `tie_break` ("small": smallest ids, "large": largest, "any": resolved as small); the prefix
/// is always sorted by score descending, equal scores by id in the tie order; -0.0 == +0.0.
/// Stable sort, deterministic on CPU and CUDA. SPEC §3.
/// scores [s_q,s_kv] f32/f64; k >= 0 (k > s_kv legal); ks/ke [s_q] int32/int64 or absent.
/// Throws c10::Error naming the argument (scores rank/dtype, k < 0, tie_break, ks/ke).
/// Every call goes through the dispatcher op `dsa::topk_indices` (counted by TopkCounter).
at::Tensor topk_indices(const at::Tensor& scores, int64_t k,
                        const c10::optional<at::Tensor>& ks = c10::nullopt,
                        const c10::optional<at::Tensor>& ke = c10::nullopt,
                        c10::string_view tie_break = "small", bool sorted = true);

/// Same with the contract's policy type.
at::Tensor topk_indices(const at::Tensor& scores, int64_t k, const TopkPolicy& policy,
                        const c10::optional<at::Tensor>& ks = c10::nullopt,
                        const c10::optional<at::Tensor>& ke = c10::nullopt);

/// The ATen composite kernel of dsa::topk_indices called directly (not counted, never a
/// registered device kernel): the auditing baseline (backend `libtorch-composite`).
at::Tensor topk_indices_composite(const at::Tensor& scores, int64_t k, const TopkPolicy& policy,
                                  const c10::optional<at::Tensor>& ks = c10::nullopt,
                                  const c10::optional<at::Tensor>& ke = c10::nullopt);

}  // namespace dsa::optimized
