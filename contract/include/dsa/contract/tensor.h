// A dense, row-major, contiguous host tensor tagged with its dtype: the one value type
// that the reference, the oracle, the fixtures and the CLI exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa {

class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled tensor. Throws std::invalid_argument on a negative dimension.
  Tensor(DType dtype, std::vector<int64_t> shape);
  /// F64 tensor holding `values` (size must equal the product of `shape`).
  static Tensor from_f64(std::vector<int64_t> shape, const std::vector<double>& values);
  /// I32 tensor holding `values` (size must equal the product of `shape`).
  static Tensor from_i32(std::vector<int64_t> shape, const std::vector<int32_t>& values);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension d (negative d counts from the end). Throws std::out_of_range.
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return bytes_.size(); }
  bool defined() const { return !shape_.empty() || !bytes_.empty(); }

  std::byte* raw() { return bytes_.data(); }
  const std::byte* raw() const { return bytes_.data(); }
  /// Typed pointer; throws std::invalid_argument when T does not match dtype()
  /// (bf16 ↔ BF16, f16 ↔ F16, double ↔ F64, float ↔ F32, int64_t, int32_t, uint8_t ↔ U8/Bool).
  template <class T>
  T* data();
  template <class T>
  const T* data() const;

  /// Element `flat` (row-major) as double; exact for every dtype here.
  double get(int64_t flat) const;
  /// Stores `v` at `flat`, rounding to nearest even for F32/F16/BF16 (ints truncate toward 0).
  void set(int64_t flat, double v);
  /// Copy converted to `dtype` (one rounding from the exact value).
  Tensor to(DType dtype) const;
  /// All elements as doubles (exact).
  std::vector<double> to_f64() const;
  /// Same bytes, new shape of equal numel; throws std::invalid_argument otherwise.
  Tensor reshaped(std::vector<int64_t> shape) const;

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<std::byte> bytes_;
};

}  // namespace dsa
