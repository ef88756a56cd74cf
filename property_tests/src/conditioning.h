// Per-row conditioning of generated sparse MLA draws at the bf16 class (SPEC §9 WEAK, θ =
// 1e-2), shared by the regular, extreme-row and production generators (generators.cpp) and the
// FP8 one (fp8_generators.cpp). Internal to the property suite.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "dsa/contract/tensor.h"
#include "dsa/oracle/report.h"

namespace dsa::props::detail {

/// Judges the draw's forward as it stands (the caller's q included) and returns the report;
/// its "out" tensor gives each (t, h) row's largest bound, θ and row scale.
using JudgeForward = std::function<oracle::OpReport()>;

/// Redraws q[t, h, :] (q [s_q, h_q, d_qk], any float dtype; values uniform(-1, 1), columns in
/// `keep_cols` kept) for every row of `redraw_rows` (one flag per (t, h), size s_q·h_q) whose
/// largest `out` bound in `judge()`'s report exceeds 0.8 θ of its row scale, until none does,
/// at most 12 judgements; a row still above keeps its best draw. Row (t, h) of out depends
/// only on q[t, h, :], the keys row t selects and sink[h], so the rows are independent.
/// Deterministic in `r`. Returns without change when the report has no "out" with one row per
/// flag. Source of the rule: SPEC §9 (WEAK), docs/what-a-pass-means.md (measured counts).
void condition_bf16_out_rows(Tensor& q, const std::vector<uint8_t>& redraw_rows,
                             const std::vector<int64_t>& keep_cols, std::mt19937_64& r,
                             const JudgeForward& judge);

}  // namespace dsa::props::detail
