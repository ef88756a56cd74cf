// Shared helpers of dsa_reference_tests: the one tolerance table, seeded fills, closeness
// and finite-difference helpers, and the bad-input assertion.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/tensor.h"

namespace dsa::test {

// ---- Tolerances: every tolerance the reference tests use, each with its reason. ----
/// Central-difference step for float64 gradient checks on O(1) inputs.
constexpr double kFdStep = 1e-6;
/// FD error: truncation O(step^2) ~ 1e-12 plus cancellation O(eps/step) ~ 1e-10, relative
/// to the largest gradient entry; 1e-6 leaves margin for curvature of exp/log.
constexpr double kFdRelTol = 1e-6;
/// Inputs of indexer FD checks keep |q·k| above this so ±kFdStep never crosses ReLU's kink.
constexpr double kReluMargin = 1e-2;
/// float64 results that differ only by summation order (slot permutation, shifted logits).
constexpr double kReassocRelTol = 1e-12;
/// Hand-computed closed forms evaluated in double (a few exp/log roundings).
constexpr double kHandRelTol = 1e-14;
/// fp32 accumulation (Baseline) on O(10^2)-term sums of O(1) values: n·2^-24 ≈ 1e-5, with margin.
constexpr double kBaselineRelTol = 1e-4;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// F64 tensor of N(0, scale^2) values from a fixed seed.
inline Tensor random_f64(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  Tensor t(DType::F64, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

/// Max |x| over the finite entries of t.
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) m = std::max(m, std::fabs(t.get(i)));
  return m;
}

/// Non-finite positions identical (same value), finite entries within rel·max|expected|.
inline ::testing::AssertionResult close(const Tensor& got, const Tensor& expected, double rel) {
  if (got.shape() != expected.shape()) return ::testing::AssertionFailure() << "shape mismatch";
  const double scale = std::max(max_abs(expected), std::numeric_limits<double>::min());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.get(i), b = expected.get(i);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (std::isnan(a) || std::isnan(b) || a != b)
        return ::testing::AssertionFailure() << "non-finite mismatch at " << i << ": " << a
                                             << " vs " << b;
    } else if (std::fabs(a - b) > rel * scale) {
      return ::testing::AssertionFailure() << "at " << i << ": " << a << " vs " << b
                                           << " (|diff| " << std::fabs(a - b) << " > "
                                           << rel * scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

/// Bitwise-equal values (NaN never equal).
inline ::testing::AssertionResult identical(const Tensor& got, const Tensor& expected) {
  if (got.shape() != expected.shape() || got.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "shape or dtype mismatch";
  for (int64_t i = 0; i < got.numel(); ++i)
    if (!(got.get(i) == expected.get(i)))
      return ::testing::AssertionFailure() << "at " << i << ": " << got.get(i) << " vs "
                                           << expected.get(i);
  return ::testing::AssertionSuccess();
}

/// Central finite-difference gradient of `f` with respect to every entry of `x` (F64).
inline Tensor fd_gradient(Tensor& x, const std::function<double()>& f) {
  Tensor g(DType::F64, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = x.get(i);
    x.set(i, x0 + kFdStep);
    const double fp = f();
    x.set(i, x0 - kFdStep);
    const double fm = f();
    x.set(i, x0);
    g.set(i, (fp - fm) / (2 * kFdStep));
  }
  return g;
}

/// Σ a·b over all entries (the scalar objective J = <output, upstream>).
inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

/// Asserts `fn` throws std::invalid_argument whose message names argument 'arg'.
template <class Fn>
::testing::AssertionResult throws_naming(Fn&& fn, const std::string& arg) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    if (msg.find("'" + arg + "'") != std::string::npos && msg.find("expected") != std::string::npos)
      return ::testing::AssertionSuccess() << msg;
    return ::testing::AssertionFailure() << "message does not name '" << arg << "': " << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception (expected one naming '" << arg << "')";
}

}  // namespace dsa::test
