// Value limits shared by the reference ops (not installed, not public). An input that no
// correct fp32 kernel can compute is invalid input, rejected with std::invalid_argument naming
// the argument, the offending element and the limit: a non-finite value the op reads (SPEC §6:
// no valid input may produce NaN) and sums past fp32's range (SPEC §2/§4/§7: fp32 outputs,
// fp32 accumulation; an overflow to +inf cannot match a finite reference, a clamp cannot be
// judged). Inputs a kernel never reads (outside every window) may hold anything.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dsa/contract/errors.h"
#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"
#include "internal.h"

namespace dsa::reference::detail {

/// fp32's largest finite value (FLT_MAX = (2 - 2^-23) · 2^127), as a double.
constexpr double kFp32Max = 3.4028234663852886e38;

/// The limit as messages state it.
inline std::string fp32_limit_text() {
  return "a finite value of magnitude at most 3.40282e+38 (FLT_MAX)";
}

/// True when `v` is a finite value an fp32 computation can hold (|v| <= FLT_MAX; false for NaN).
inline bool fits_fp32(double v) { return std::abs(v) <= kFp32Max; }

/// Index [a, b] or [a, b, c] of flat element i of `shape` (for messages).
inline std::string index_str(const std::vector<int64_t>& shape, int64_t i) {
  std::vector<int64_t> ix(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    const int64_t n = shape[k] > 0 ? shape[k] : 1;
    ix[k] = i % n;
    i /= n;
  }
  return shape_str(ix);
}

/// Requires elements [i0, i1) of `t` (any floating dtype) to be finite with |v| <= FLT_MAX.
/// Throws std::invalid_argument naming `arg`, the element's index and value, and `why()` (the
/// rule, e.g. "row 5 has a valid slot, SPEC §6"; built only on failure: a callable returning
/// std::string).
template <class Why>
void check_range_values(const char* where, const char* arg, const Tensor& t, int64_t i0,
                        int64_t i1, const Why& why) {
  for (int64_t i = i0; i < i1; ++i) {
    const double v = t.get(i);
    if (fits_fp32(v)) continue;
    check_arg(false, where, arg, str(v) + " at " + index_str(t.shape(), i),
              fp32_limit_text() + " in every element the op reads (" + why() + ")");
  }
}

/// check_range_values over elements [i0, i1), returning their largest magnitude; `buf` is
/// scratch (the elements are converted once, by type, not one get() each).
template <class Why>
double checked_max_abs(const char* where, const char* arg, const Tensor& t, int64_t i0, int64_t i1,
                       const Why& why, std::vector<double>& buf) {
  buf.resize(static_cast<size_t>(i1 - i0));
  convert_range<double>(t, buf.data(), i0, i1);
  double m = 0;
  for (double v : buf) {
    if (!fits_fp32(v)) check_range_values(where, arg, t, i0, i1, why);  // throws, naming it
    m = std::max(m, std::abs(v));
  }
  return m;
}

/// Keys [0, s_kv) that lie inside at least one row's window (the key rows a kernel reads).
inline std::vector<char> keys_in_any_window(const KeyWindows& w) {
  std::vector<int64_t> diff(static_cast<size_t>(w.s_kv) + 1, 0);
  for (int64_t t = 0; t < w.s_q(); ++t) {
    if (w.ke[t] <= w.ks[t]) continue;
    ++diff[static_cast<size_t>(w.ks[t])];
    --diff[static_cast<size_t>(w.ke[t])];
  }
  std::vector<char> in(static_cast<size_t>(w.s_kv), 0);
  int64_t run = 0;
  for (int64_t s = 0; s < w.s_kv; ++s) in[static_cast<size_t>(s)] = (run += diff[static_cast<size_t>(s)]) > 0;
  return in;
}

/// Guard on a float64 result (F64 tensor): no element is NaN and no finite element exceeds
/// FLT_MAX (±inf is left to the op's own rules, e.g. lse = +inf of an empty row). Throws
/// std::invalid_argument naming `args` (the inputs that form the output), the output element
/// and the rule; reached only by inputs the op's up-front checks let through.
inline void check_result_values(const char* where, const char* args, const char* output,
                                const Tensor& out) {
  const double* p = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double v = p[i];
    if (fits_fp32(v) || std::isinf(v)) continue;
    check_arg(false, where, args,
              std::string("values for which ") + output + index_str(out.shape(), i) + " = " + str(v),
              std::string(output) + " " + fp32_limit_text() +
                  " (no valid input may produce NaN, SPEC §6; fp32 outputs and accumulation, "
                  "SPEC §9: a correct fp32 kernel cannot return it)");
  }
}

}  // namespace dsa::reference::detail
