// Exact top-k checker (SPEC §3) and fused checker (§9).
#include "dsa/oracle/topk_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"

#include "check_start.h"

namespace dsa::oracle {
namespace {

// Scores print so that they round-trip: 9 significant digits for F32 scores, 17 for F64.
struct ValueFormat {
  bool f64 = false;

  std::string operator()(double v) const {
    if (v == 0 && std::signbit(v)) return "-0.0";
    std::ostringstream os;
    os << std::setprecision(f64 ? 17 : 9) << v;
    return os.str();
  }
  std::string bits(double v) const {
    std::ostringstream os;
    os << "0x" << std::hex << std::setfill('0');
    if (f64) {
      uint64_t u;
      std::memcpy(&u, &v, sizeof u);
      os << std::setw(16) << u;
    } else {
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      os << std::setw(8) << u;
    }
    return os.str();
  }
  // Two values as printed; when the printed forms are equal but the values differ (or one
  // is -0.0 and the other +0.0), each carries its hex bits.
  std::pair<std::string, std::string> pair(double a, double b) const {
    std::string x = (*this)(a), y = (*this)(b);
    if (x == y && (a != b || std::signbit(a) != std::signbit(b) || bits(a) != bits(b))) {
      x += " (" + bits(a) + ")";
      y += " (" + bits(b) + ")";
    }
    return {x, y};
  }
};

// Shared structural pass over one row: range, padding, compactness, window, duplicates.
// Returns the valid ids of the prefix in slot order.
std::vector<int64_t> structural_row(const Tensor& idx, int64_t t, int64_t width, int64_t s_kv,
                                    const std::optional<KeyWindows>& windows,
                                    std::vector<TopkViolation>& out) {
  std::vector<int64_t> ids;
  std::set<int64_t> seen;
  bool tail = false;
  for (int64_t j = 0; j < width; ++j) {
    const double raw = idx.get(t * width + j);
    const int64_t id = static_cast<int64_t>(raw);
    if (id == -1) {
      tail = true;
      continue;
    }
    if (id < 0 || id >= s_kv) {
      out.push_back({"id_out_of_range", t, j,
                     "id " + std::to_string(id) + " (padding must be -1, ids in [0," +
                         std::to_string(s_kv) + "))"});
      continue;
    }
    if (tail)
      out.push_back({"not_compact", t, j, "valid id " + std::to_string(id) + " after a -1 slot"});
    if (windows && !windows->contains(t, id))
      out.push_back({"outside_window", t, j,
                     "id " + std::to_string(id) + " outside [" + std::to_string(windows->ks[t]) +
                         "," + std::to_string(windows->ke[t]) + ")"});
    if (!seen.insert(id).second)
      out.push_back({"duplicate", t, j, "id " + std::to_string(id) + " appears twice"});
    ids.push_back(id);
  }
  return ids;
}

bool structural_header(const Tensor& indices, int64_t s_q, int64_t k,
                       std::vector<TopkViolation>& out) {
  if (!detail::dtype_meets_contract(indices.dtype(), DType::I32))  // the one message (check_start.h)
    out.push_back({"dtype", -1, -1, detail::contract_dtype_message("indices", "", indices.dtype(), DType::I32)});
  if (indices.dim() != 2 || indices.size(0) != s_q || indices.size(1) != k) {
    out.push_back({"shape", -1, -1,
                   "indices shape " + shape_str(indices.shape()) + ", expected [" +
                       std::to_string(s_q) + ", " + std::to_string(k) + "]"});
    return false;
  }
  if (is_floating(indices.dtype())) {
    out.push_back({"dtype", -1, -1, "floating indices cannot be checked"});
    return false;
  }
  return true;
}

}  // namespace

int64_t topk_rows_checked(int64_t s_q, int64_t s_kv, int64_t k) {
  return k == 0 && s_kv == 0 ? 0 : std::max<int64_t>(0, s_q);
}

Tensor adapt_topk_width(const Tensor& indices, int64_t k) {
  check_arg(indices.dim() == 2, "adapt_topk_width", "indices", shape_str(indices.shape()),
            "rank 2");
  const int64_t s_q = indices.size(0), w = indices.size(1);
  if (w == k) return indices;
  check_arg(w < k, "adapt_topk_width", "indices", shape_str(indices.shape()),
            "at most k=" + std::to_string(k) + " columns");
  Tensor out(indices.dtype(), {s_q, k});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < k; ++j) out.set(t * k + j, j < w ? indices.get(t * w + j) : -1.0);
  return out;
}

std::vector<TopkViolation> check_topk(const Tensor& indices, const Tensor& scores, int64_t k,
                                      const TopkPolicy& policy,
                                      const std::optional<KeyWindows>& windows,
                                      std::vector<int64_t>* nan_rows) {
  check_arg(scores.dim() == 2, "check_topk", "scores", shape_str(scores.shape()), "[s_q, s_kv]");
  check_dtype("check_topk", "scores", scores, {DType::F32, DType::F64});
  check_arg(k >= 0, "check_topk", "k", std::to_string(k), ">= 0");
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  if (windows)
    check_arg(windows->s_q() == s_q && windows->s_kv == s_kv, "check_topk", "windows",
              std::to_string(windows->s_q()) + " rows over " + std::to_string(windows->s_kv),
              std::to_string(s_q) + " rows over " + std::to_string(s_kv));
  std::vector<TopkViolation> out;
  const ValueFormat fmt{scores.dtype() == DType::F64};
  const Tensor& idx = indices;
  if (!structural_header(idx, s_q, k, out)) return out;

  const int64_t rows = topk_rows_checked(s_q, s_kv, k);
  for (int64_t t = 0; t < rows; ++t) {
    auto score = [&](int64_t s) { return scores.get(t * s_kv + s); };
    auto in_window = [&](int64_t s) { return !windows || windows->contains(t, s); };
    std::vector<int64_t> ids = structural_row(idx, t, k, s_kv, windows, out);

    // Selectable entries and NaN bookkeeping.
    std::vector<double> sel_vals;
    int64_t n_nan = 0;
    for (int64_t s = 0; s < s_kv; ++s) {
      if (!in_window(s)) continue;
      const double v = score(s);
      if (std::isnan(v)) ++n_nan;
      else if (v != -INFINITY) sel_vals.push_back(v);
    }
    if (n_nan > 0 && nan_rows) nan_rows->push_back(t);
    const int64_t k_eff = std::min<int64_t>(k, static_cast<int64_t>(sel_vals.size()));

    // Per-slot selectability: NaN and -inf are never selectable (§3.1).
    std::vector<int64_t> picks;  // selectable ids, slot order
    std::vector<int64_t> pick_slots;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = static_cast<int64_t>(idx.get(t * k + j));
      if (id < 0 || id >= s_kv) continue;
      const double v = score(id);
      if (std::isnan(v)) {
        out.push_back({"selected_nan", t, j, "id " + std::to_string(id) + " has score NaN"});
        continue;
      }
      if (v == -INFINITY) {
        out.push_back({"selected_neg_inf", t, j,
                       "id " + std::to_string(id) + " has score -inf (must be -1)"});
        continue;
      }
      picks.push_back(id);
      pick_slots.push_back(j);
    }
    const int64_t valid_count = static_cast<int64_t>(ids.size());
    if (valid_count != k_eff)
      out.push_back({"wrong_count", t, -1,
                     std::to_string(valid_count) + " valid ids, expected k_eff=" +
                         std::to_string(k_eff) + " (" +
                         std::to_string(sel_vals.size()) + " selectable, k=" + std::to_string(k) +
                         ")"});
    if (k_eff == 0) continue;

    std::vector<double> sorted_vals = sel_vals;
    std::nth_element(sorted_vals.begin(), sorted_vals.begin() + (k_eff - 1), sorted_vals.end(),
                     std::greater<double>());
    const double vstar = sorted_vals[static_cast<size_t>(k_eff - 1)];

    std::set<int64_t> chosen(picks.begin(), picks.end());
    for (size_t i = 0; i < picks.size(); ++i) {
      const double v = score(picks[i]);
      if (in_window(picks[i]) && v < vstar) {
        const auto [pv, ps] = fmt.pair(v, vstar);
        out.push_back({"below_vstar", t, pick_slots[i],
                       "id " + std::to_string(picks[i]) + " score " + pv + " < v*=" + ps});
      }
    }
    std::vector<int64_t> tied;  // selectable ids with score == v*, ascending
    int64_t n_above = 0;
    for (int64_t s = 0; s < s_kv; ++s) {
      if (!in_window(s)) continue;
      const double v = score(s);
      if (std::isnan(v) || v == -INFINITY) continue;
      if (v > vstar) {
        ++n_above;
        if (!chosen.count(s)) {
          const auto [pv, ps] = fmt.pair(v, vstar);
          out.push_back({"missing_above_vstar", t, -1,
                         "id " + std::to_string(s) + " score " + pv + " > v*=" + ps +
                             " not selected"});
        }
      } else if (v == vstar) {
        tied.push_back(s);
      }
    }
    // Tie policy: which tied ids fill the remaining k_eff - n_above slots.
    const int64_t need = k_eff - n_above;
    if (policy.tie_break != TieBreak::Any && need > 0 && need < static_cast<int64_t>(tied.size())) {
      std::vector<int64_t> want;
      if (policy.tie_break == TieBreak::Small) want.assign(tied.begin(), tied.begin() + need);
      else want.assign(tied.end() - need, tied.end());
      for (int64_t s : want)
        if (!chosen.count(s))
          out.push_back({"tie_policy", t, -1,
                         std::string("tie_break=") + to_string(policy.tie_break) + ": tied id " +
                             std::to_string(s) + " (score " + fmt(vstar) + ") not selected"});
    }
    // Sorted prefix order.
    if (policy.sorted) {
      for (size_t i = 1; i < picks.size(); ++i) {
        const double a = score(picks[i - 1]), b = score(picks[i]);
        if (a < b) {
          const auto [pb, pa] = fmt.pair(b, a);
          out.push_back({"unsorted", t, pick_slots[i], "score " + pb + " after " + pa});
        } else if (a == b) {
          const bool asc = picks[i - 1] < picks[i];
          if ((policy.tie_break == TieBreak::Small && !asc) ||
              (policy.tie_break == TieBreak::Large && asc))
            // -0.0 and +0.0 are equal (IEEE) but print apart: both are shown
            out.push_back({"tie_order", t, pick_slots[i],
                           std::string("equal scores ") +
                               (std::signbit(a) == std::signbit(b) ? fmt(a)
                                                                   : fmt(a) + " and " + fmt(b) + " (IEEE equal)") +
                               ": id " +
                               std::to_string(picks[i - 1]) + " before " +
                               std::to_string(picks[i]) + " under tie_break=" +
                               to_string(policy.tie_break)});
        }
      }
    }
  }
  return out;
}

bool is_contract_violation(const std::string& rule) {
  return rule == "selected_nan" || rule == "selected_neg_inf" || rule == "duplicate" ||
         rule == "id_out_of_range" || rule == "not_compact" || rule == "outside_window";
}

std::string summarize_topk_violations(const std::vector<TopkViolation>& v) {
  static const std::vector<std::pair<std::string, std::string>> phrases = {
      {"selected_nan", "selected NaN"},
      {"selected_neg_inf", "selected -inf"},
      {"duplicate", "duplicate id"},
      {"id_out_of_range", "id out of range"},
      {"not_compact", "valid id after -1"},
      {"outside_window", "id outside the window"}};
  std::map<std::string, std::set<int64_t>> rows;
  const TopkViolation* first_other = nullptr;
  for (const auto& x : v) {
    if (is_contract_violation(x.rule)) rows[x.rule].insert(x.row);
    else if (!first_other) first_other = &x;
  }
  std::string s;
  for (const auto& [rule, phrase] : phrases) {
    auto it = rows.find(rule);
    if (it == rows.end()) continue;
    s += s.empty() ? "deviates from the contract: " : "; ";
    s += phrase + " in row" + (it->second.size() > 1 ? "s " : " ");
    size_t n = 0;
    for (int64_t r : it->second) {
      if (n == 10) {
        s += " and " + std::to_string(it->second.size() - 10) + " more";
        break;
      }
      s += (n++ ? ", " : "") + std::to_string(r);
    }
  }
  if (first_other) {
    if (!s.empty()) s += "; ";
    s += first_other->rule + " row=" + std::to_string(first_other->row) +
         " slot=" + std::to_string(first_other->slot) + ": " + first_other->detail;
  }
  return s;
}

std::vector<TopkViolation> check_fused_topk(const Tensor& indices, const Tensor& ref_scores,
                                            double score_bound, int64_t k,
                                            const KeyWindows& windows) {
  check_arg(ref_scores.dim() == 2, "check_fused_topk", "ref_scores",
            shape_str(ref_scores.shape()), "[s_q, s_kv]");
  return check_fused_topk(indices, ref_scores,
                          std::vector<double>(static_cast<size_t>(ref_scores.size(0)), score_bound),
                          k, windows);
}

std::vector<TopkViolation> check_fused_topk(const Tensor& indices, const Tensor& ref_scores,
                                            const std::vector<double>& row_bounds, int64_t k,
                                            const KeyWindows& windows) {
  check_arg(ref_scores.dim() == 2, "check_fused_topk", "ref_scores",
            shape_str(ref_scores.shape()), "[s_q, s_kv]");
  const int64_t s_q = ref_scores.size(0), s_kv = ref_scores.size(1);
  check_arg(static_cast<int64_t>(row_bounds.size()) == s_q, "check_fused_topk", "row_bounds",
            std::to_string(row_bounds.size()) + " entries", std::to_string(s_q) + " (one per query row)");
  for (double b : row_bounds)
    check_arg(std::isfinite(b) && b >= 0, "check_fused_topk", "row_bounds", std::to_string(b),
              "finite and >= 0");
  check_arg(windows.s_q() == s_q && windows.s_kv == s_kv, "check_fused_topk", "windows",
            std::to_string(windows.s_q()) + " rows", std::to_string(s_q) + " rows");
  std::vector<TopkViolation> out;
  const ValueFormat fmt{true};  // reference scores are float64
  if (!structural_header(indices, s_q, k, out)) return out;
  std::optional<KeyWindows> w = windows;
  const int64_t rows = topk_rows_checked(s_q, s_kv, k);
  for (int64_t t = 0; t < rows; ++t) {
    auto score = [&](int64_t s) { return ref_scores.get(t * s_kv + s); };
    std::vector<int64_t> ids = structural_row(indices, t, k, s_kv, w, out);
    std::vector<double> vals;
    for (int64_t s = windows.ks[t]; s < windows.ke[t]; ++s) {
      const double v = score(s);
      if (!std::isnan(v) && v != -INFINITY) vals.push_back(v);
    }
    const int64_t k_eff = std::min<int64_t>(k, static_cast<int64_t>(vals.size()));
    if (static_cast<int64_t>(ids.size()) != k_eff)
      out.push_back({"wrong_count", t, -1,
                     std::to_string(ids.size()) + " valid ids, expected k_eff=" +
                         std::to_string(k_eff)});
    if (k_eff == 0) continue;
    std::nth_element(vals.begin(), vals.begin() + (k_eff - 1), vals.end(), std::greater<double>());
    const double vstar = vals[static_cast<size_t>(k_eff - 1)];
    const double score_bound = row_bounds[static_cast<size_t>(t)];
    std::set<int64_t> chosen(ids.begin(), ids.end());
    for (int64_t id : ids) {
      const double v = score(id);
      if (windows.contains(t, id) && v < vstar - score_bound)
        out.push_back({"below_vstar_beyond_bound", t, -1,
                       "id " + std::to_string(id) + " ref score " + fmt(v) + " < v*=" +
                           fmt(vstar) + " - bound " + fmt(score_bound)});
    }
    for (int64_t s = windows.ks[t]; s < windows.ke[t]; ++s) {
      const double v = score(s);
      if (v > vstar + score_bound && !chosen.count(s))
        out.push_back({"missing_beyond_bound", t, -1,
                       "id " + std::to_string(s) + " ref score " + fmt(v) + " > v*=" + fmt(vstar) +
                           " + bound " + fmt(score_bound) + " not selected"});
    }
  }
  return out;
}

}  // namespace dsa::oracle
