// Helpers shared by the reference ops (not installed, not public): dsa::Tensor <-> Eigen
// row-major matrices at the accumulation type A (double = Reference, float = Baseline),
// argument validation, and the precision dispatch. Every op is written once as a template
// on A (SPEC §9: the baseline is the reference algorithm at fp32 accumulation).
#pragma once

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"
#include "dsa/contract/key_windows.h"
#include "dsa/contract/parallel.h"
#include "dsa/contract/tensor.h"
#include "dsa/reference/precision.h"

namespace dsa::reference::detail {

/// Row-major dynamic matrix / column vector at accumulation type A.
template <class A>
using Mat = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class A>
using Vec = Eigen::Matrix<A, Eigen::Dynamic, 1>;

/// Output dtype of an op computed at A: F64 for double, F32 for float.
template <class A>
constexpr DType out_dtype() {
  return sizeof(A) == 8 ? DType::F64 : DType::F32;
}

template <class A>
constexpr A inf() {
  return std::numeric_limits<A>::infinity();
}

/// Converts elements [i0, i1) of tensor `t` (any floating dtype) to A into dst[0, i1 - i0).
/// Upcasts are exact (bf16/f16/f32 -> float or double, f64 -> double); an F64 input read at
/// float (Baseline) rounds to nearest even once.
template <class A>
void convert_range(const Tensor& t, A* dst, int64_t i0, int64_t i1) {
  switch (t.dtype()) {
    case DType::F64: {
      const double* src = t.data<double>();
      for (int64_t i = i0; i < i1; ++i) dst[i - i0] = static_cast<A>(src[i]);
      break;
    }
    case DType::F32: {
      const float* src = t.data<float>();
      for (int64_t i = i0; i < i1; ++i) dst[i - i0] = static_cast<A>(src[i]);
      break;
    }
    case DType::BF16: {
      // bf16_to_float inlined (the upper 16 bits of a float), so the loop vectorizes.
      const bf16* src = t.data<bf16>();
      for (int64_t i = i0; i < i1; ++i) {
        const uint32_t u = static_cast<uint32_t>(src[i].bits) << 16;
        float f;
        std::memcpy(&f, &u, sizeof f);
        dst[i - i0] = static_cast<A>(f);
      }
      break;
    }
    case DType::F16: {
      const f16* src = t.data<f16>();
      for (int64_t i = i0; i < i1; ++i) dst[i - i0] = static_cast<A>(f16_to_float(src[i]));
      break;
    }
    default:
      for (int64_t i = i0; i < i1; ++i) dst[i - i0] = static_cast<A>(t.get(i));
  }
}

/// Rows of a [rows, cols] tensor (any floating dtype) read at A on demand, converted as by
/// convert_range: the typed pointer is looked up once, so reading a few rows costs no more
/// than converting them.
template <class A>
class RowReader {
 public:
  RowReader(const Tensor& t, int64_t cols) : t_(t), cols_(cols) {}
  /// Copies columns [c0, c1) of rows ids[j0, j1) into dst, a [j1 - j0, c1 - c0] row-major
  /// buffer (0 <= c0 <= c1 <= cols).
  void gather(const std::vector<int32_t>& ids, int64_t j0, int64_t j1, int64_t c0, int64_t c1,
              A* dst) const {
    switch (t_.dtype()) {
      case DType::F64: return gather_typed(t_.data<double>(), ids, j0, j1, c0, c1, dst);
      case DType::F32: return gather_typed(t_.data<float>(), ids, j0, j1, c0, c1, dst);
      case DType::BF16: return gather_typed(t_.data<bf16>(), ids, j0, j1, c0, c1, dst);
      default:
        for (int64_t j = j0; j < j1; ++j, dst += c1 - c0) {
          const int64_t r = ids[static_cast<size_t>(j)];
          convert_range<A>(t_, dst, r * cols_ + c0, r * cols_ + c1);
        }
    }
  }

 private:
  static A up(double v) { return static_cast<A>(v); }
  static A up(float v) { return static_cast<A>(v); }
  static A up(bf16 v) {
    const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return static_cast<A>(f);
  }
  template <class S>
  void gather_typed(const S* src, const std::vector<int32_t>& ids, int64_t j0, int64_t j1,
                    int64_t c0, int64_t c1, A* dst) const {
    for (int64_t j = j0; j < j1; ++j, dst += c1 - c0) {
      const S* row = src + static_cast<int64_t>(ids[static_cast<size_t>(j)]) * cols_;
      for (int64_t c = c0; c < c1; ++c) dst[c - c0] = up(row[c]);
    }
  }
  const Tensor& t_;
  int64_t cols_;
};

/// Elements per chunk of the parallel element-wise copies below, and their cost hint in
/// flops per element (memory-bound: a converted element costs about as much as ~16 flops of
/// GEMM), so that only copies of more than ~16k elements per thread start threads.
constexpr int64_t kCopyChunk = int64_t{1} << 15;
constexpr double kCopyWorkPerElement = 16.0;

/// Reads tensor `t` (any floating dtype, numel == rows*cols) as a [rows, cols] matrix at A,
/// converting in parallel chunks (each element is converted alone: no thread dependence).
template <class A>
Mat<A> to_mat(const Tensor& t, int64_t rows, int64_t cols) {
  Mat<A> m(rows, cols);
  const int64_t n = rows * cols;
  A* dst = m.data();
  parallel_for((n + kCopyChunk - 1) / kCopyChunk, kCopyChunk * kCopyWorkPerElement,
               [&](int64_t c0, int64_t c1) {
                 convert_range<A>(t, dst + c0 * kCopyChunk, c0 * kCopyChunk, std::min(n, c1 * kCopyChunk));
               });
  return m;
}

/// Copies `n` elements from src to dst in parallel chunks.
template <class A>
void copy_parallel(const A* src, A* dst, int64_t n) {
  parallel_for((n + kCopyChunk - 1) / kCopyChunk, kCopyChunk * kCopyWorkPerElement / 2,
               [&](int64_t c0, int64_t c1) {
                 const int64_t i0 = c0 * kCopyChunk, i1 = std::min(n, c1 * kCopyChunk);
                 std::memcpy(dst + i0, src + i0, static_cast<size_t>(i1 - i0) * sizeof(A));
               });
}

/// A tensor of dtype out_dtype<A>() and `shape` holding m's elements in row-major order.
/// A plain Mat<A> is copied in parallel without an intermediate; other expressions are
/// evaluated into a row-major temporary first.
template <class A, class Derived>
Tensor to_tensor(const Eigen::MatrixBase<Derived>& m, std::vector<int64_t> shape) {
  Tensor t(out_dtype<A>(), std::move(shape));
  if constexpr (std::is_same_v<Derived, Mat<A>>) {
    copy_parallel<A>(m.derived().data(), reinterpret_cast<A*>(t.raw()), t.numel());
  } else {
    Mat<A> tmp = m;  // row-major, contiguous
    std::memcpy(t.raw(), tmp.data(), t.nbytes());
  }
  return t;
}

/// Row-major [rows, cols] view of a tensor's storage at A (t.dtype() == out_dtype<A>(),
/// t.numel() == rows * cols, checked by data<A>() and the caller): results are written in
/// place, with no copy at the end.
template <class A>
Eigen::Map<Mat<A>> mat_view(Tensor& t, int64_t rows, int64_t cols) {
  return Eigen::Map<Mat<A>>(t.data<A>(), rows, cols);
}

/// Floating dtypes accepted for activations (q, kv, q_idx, k_idx).
inline void check_activation_dtype(const char* where, const char* arg, const Tensor& t) {
  check_dtype(where, arg, t, {DType::BF16, DType::F16, DType::F32, DType::F64});
}
/// Dtypes accepted for fp32-or-wider inputs (w, scores, sinks, upstream gradients).
inline void check_wide_dtype(const char* where, const char* arg, const Tensor& t) {
  check_dtype(where, arg, t, {DType::F32, DType::F64});
}

/// Requires `windows` to describe exactly s_q rows over s_kv keys with 0 <= ks, ke <= s_kv.
inline void check_windows(const char* where, const KeyWindows& w, int64_t s_q, int64_t s_kv) {
  check_arg(w.ks.size() == w.ke.size(), where, "windows",
            "ks of " + std::to_string(w.ks.size()) + " rows and ke of " +
                std::to_string(w.ke.size()) + " rows",
            "ks and ke of equal length");
  check_arg(w.s_q() == s_q, where, "windows", std::to_string(w.s_q()) + " rows",
            std::to_string(s_q) + " rows (s_q)");
  check_arg(w.s_kv == s_kv, where, "windows", "s_kv = " + std::to_string(w.s_kv),
            "s_kv = " + std::to_string(s_kv));
  for (int64_t t = 0; t < s_q; ++t) {
    const bool ok = w.ks[t] >= 0 && w.ks[t] <= s_kv && w.ke[t] >= 0 && w.ke[t] <= s_kv;
    check_arg(ok, where, "windows",
              "row " + std::to_string(t) + " = [" + std::to_string(w.ks[t]) + ", " +
                  std::to_string(w.ke[t]) + ")",
              "ks and ke within [0, " + std::to_string(s_kv) + "]");
  }
}

/// Requires a rank-3 tensor, reporting the expected layout in the message.
inline void check_rank3(const char* where, const char* arg, const Tensor& t, const char* layout) {
  check_arg(t.dim() == 3, where, arg, "shape " + shape_str(t.shape()),
            std::string("3 dimensions ") + layout);
}
inline void check_rank2(const char* where, const char* arg, const Tensor& t, const char* layout) {
  check_arg(t.dim() == 2, where, arg, "shape " + shape_str(t.shape()),
            std::string("2 dimensions ") + layout);
}

/// Requires the last dimension of `b` to equal that of `a` (a width both share, e.g. d_qk of
/// q and kv). Neither is presumed right: the std::invalid_argument names both arguments,
/// their shapes and the shared width, e.g. "sparse_mla_forward: arguments 'q' and 'kv' disagree
/// on d_qk: q shape [24, 8, 79] ends in 79, kv shape [72, 80] ends in 80; expected both to end
/// in the same d_qk".
inline void check_same_last_dim(const char* where, const char* a_name, const Tensor& a,
                                const char* b_name, const Tensor& b, const char* width) {
  const int64_t x = a.size(-1), y = b.size(-1);
  if (x == y) return;
  throw std::invalid_argument(std::string(where) + ": arguments '" + a_name + "' and '" + b_name +
                              "' disagree on " + width + ": " + a_name + " shape " + shape_str(a.shape()) +
                              " ends in " + std::to_string(x) + ", " + b_name + " shape " +
                              shape_str(b.shape()) + " ends in " + std::to_string(y) + "; expected both to end in the same " +
                              width);
}

/// Numerically stable ln Σ exp(x) over a row; -inf for an empty row or all -inf.
template <class A, class Derived>
A log_sum_exp(const Eigen::MatrixBase<Derived>& x) {
  if (x.size() == 0) return -inf<A>();
  const A m = x.maxCoeff();
  if (m == -inf<A>()) return -inf<A>();
  return m + std::log((x.array() - m).exp().sum());
}

}  // namespace dsa::reference::detail
