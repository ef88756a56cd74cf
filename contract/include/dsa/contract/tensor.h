// A dense, row-major, contiguous host tensor tagged with its dtype: the one value type
// that the reference, the oracle, the fixtures and the CLI exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa {

namespace detail {
/// std::allocator whose value-less construct() default-initialises (no zeroing for
/// std::byte), so that Tensor::for_overwrite can size its storage without a fill. Copies,
/// moves and every other construct() behave as std::allocator's.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
}  // namespace detail

class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled tensor. Throws std::invalid_argument on a negative dimension.
  Tensor(DType dtype, std::vector<int64_t> shape);
  /// Tensor of `dtype` and `shape` whose bytes are left unspecified (no zero fill), for a
  /// writer that stores every element before anything reads one: the reference's outputs,
  /// whose rows are written by the threads that compute them, so that their pages are first
  /// touched there in parallel instead of by a serial fill (issue 13). Reading an element
  /// before it is written reads indeterminate bytes. Throws std::invalid_argument on a
  /// negative dimension, like the constructor.
  static Tensor for_overwrite(DType dtype, std::vector<int64_t> shape);
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
  // Zeroed by the constructor; left as allocated only by for_overwrite.
  std::vector<std::byte, detail::DefaultInitAllocator<std::byte>> bytes_;
};

}  // namespace dsa
