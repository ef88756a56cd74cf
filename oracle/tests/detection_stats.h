// Shared by the oracle's detection properties (detection_test.cpp, block_detection_test.cpp):
// the measured figures each prints per key, and the perturbation step both use.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>

#include "dsa/contract/tensor.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle::detection {

struct Stat {
  double max_rel_bound = 0;  // max over non-WEAK rows of bound / rowscale
  int64_t rows = 0, weak_rows = 0;
  double worst_ratio = 0;  // max err/bound of correct outputs (computed another way, a correct run)
  int64_t perturbations = 0, caught = 0;
  // perturbations that passed only under --allow-weak because the sparse MLA backward's
  // lse-recompute re-judge declared their row WEAK (the row was not WEAK in the correct run);
  // without --allow-weak their verdict is not a pass (passes_only_as_weak_on_rejudge)
  int64_t weak_on_rejudge = 0;
};
using StatTable = std::map<std::string, Stat>;

/// Adds each output of `r` to `table` under "<key> <output> <precision class>": rows, WEAK
/// rows, worst err/bound and the largest bound / row scale of a non-WEAK row.
inline void record_into(StatTable& table, const std::string& key, const OpReport& r) {
  for (const auto& t : r.tensors) {
    Stat& s = table[key + " " + t.name + " " + dtype_name(t.precision)];
    s.rows += t.rows;
    s.weak_rows += t.weak_rows;
    s.worst_ratio = std::max(s.worst_ratio, t.worst);
    for (size_t i = 0; i < t.row_weak.size(); ++i)
      if (!t.row_weak[i] && t.row_scale[i] > 0)
        s.max_rel_bound = std::max(s.max_rel_bound, t.row_max_bound[i] / t.row_scale[i]);
  }
}

// The figures of the including test file: an unnamed namespace, so detection_test.cpp and
// block_detection_test.cpp (one executable) each keep their own table, printed and cleared by
// that file alone.
namespace {
/// This file's table (function-local: built on first use, lives to the process's end).
inline StatTable& stats() {
  static StatTable table;
  return table;
}
/// record_into(stats(), key, r).
inline void record(const std::string& key, const OpReport& r) { record_into(stats(), key, r); }
}  // namespace

/// True when report `r` marks row `row` of output `name` WEAK.
inline bool row_weak_in(const OpReport& r, const std::string& name, int64_t row) {
  for (const auto& t : r.tensors)
    if (t.name == name && row >= 0 && static_cast<size_t>(row) < t.row_weak.size() &&
        t.row_weak[static_cast<size_t>(row)])
      return true;
  return false;
}

/// The one accepted way for a perturbation of a row that was not WEAK in the correct output
/// not to be caught: the sparse MLA backward's re-judge with P recomputed from the fp32 lse
/// (op_check.cpp, lse_recompute) runs only for gradients failing the floors and declares WEAK
/// the rows where its widened bound exceeds θ x row scale (a dsink row of scale 4e-30 at |L| 80,
/// level 2, seed 12002), so the perturbation passes only under --allow-weak. True when
///   - `passed_allowing_weak`: the perturbed outputs' judgement under --allow-weak passed,
///   - one of `reports` (that judgement's op reports) names row `row` of output `name` WEAK, and
///   - `strict_passes()` (the same outputs judged without --allow-weak, same declared models and
///     outputs; called only when both hold above, as it judges again) returns false.
/// The caller counts such a perturbation apart (Stat::weak_on_rejudge), never as caught; any
/// other perturbation that is not a FAIL fails its property.
template <class StrictPasses>
bool passes_only_as_weak_on_rejudge(bool passed_allowing_weak, std::initializer_list<const OpReport*> reports,
                                    const std::string& name, int64_t row, StrictPasses strict_passes) {
  if (!passed_allowing_weak) return false;
  bool weak = false;
  for (const OpReport* r : reports) weak = weak || row_weak_in(*r, name, row);
  return weak && !strict_passes();
}

/// Moves `t` at flat i outward by at least |amount| from `ref` (rounded away from the
/// reference, so the error after rounding to t's dtype is >= |amount|).
inline void push(Tensor& t, int64_t i, double ref, double amount) {
  double x = ref + amount;
  for (int guard = 0; guard < 64; ++guard) {
    t.set(i, x);
    if (std::abs(t.get(i) - ref) >= std::abs(amount)) return;
    x += amount * 0x1p-6;
  }
}

}  // namespace dsa::oracle::detection
