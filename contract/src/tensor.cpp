#include "dsa/contract/tensor.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dsa/contract/errors.h"

namespace dsa {

namespace {
int64_t checked_numel(const char* where, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    check_arg(s >= 0, where, "shape", shape_str(shape), "non-negative sizes");
    n *= s;
  }
  return n;
}
}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = checked_numel("Tensor", shape_);
  bytes_.assign(static_cast<size_t>(numel_) * dtype_size(dtype_), std::byte{0});
}

Tensor Tensor::for_overwrite(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = checked_numel("Tensor::for_overwrite", t.shape_);
  t.bytes_.resize(static_cast<size_t>(t.numel_) * dtype_size(dtype));  // default-init: no fill
  return t;
}

Tensor Tensor::from_f64(std::vector<int64_t> shape, const std::vector<double>& values) {
  Tensor t(DType::F64, std::move(shape));
  check_arg(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::from_f64", "values",
            std::to_string(values.size()) + " values", std::to_string(t.numel()));
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t(DType::I32, std::move(shape));
  check_arg(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::from_i32", "values",
            std::to_string(values.size()) + " values", std::to_string(t.numel()));
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  if (d < 0 || d >= n) throw std::out_of_range("Tensor::size: dimension " + std::to_string(d) +
                                               " out of range for rank " + std::to_string(n));
  return shape_[static_cast<size_t>(d)];
}

namespace {
template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<f16>() { return DType::F16; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
}  // namespace

template <class T>
T* Tensor::data() {
  DType want = dtype_of<T>();
  bool ok = dtype_ == want || (want == DType::U8 && dtype_ == DType::Bool);
  check_arg(ok, "Tensor::data", "T", dtype_name(want), std::string("dtype ") + dtype_name(dtype_));
  return reinterpret_cast<T*>(bytes_.data());
}
template <class T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}

#define DSA_INSTANTIATE(T) \
  template T* Tensor::data<T>(); \
  template const T* Tensor::data<T>() const;
DSA_INSTANTIATE(double)
DSA_INSTANTIATE(float)
DSA_INSTANTIATE(f16)
DSA_INSTANTIATE(bf16)
DSA_INSTANTIATE(int64_t)
DSA_INSTANTIATE(int32_t)
DSA_INSTANTIATE(uint8_t)
#undef DSA_INSTANTIATE

double Tensor::get(int64_t i) const {
  const std::byte* p = bytes_.data() + static_cast<size_t>(i) * dtype_size(dtype_);
  switch (dtype_) {
    case DType::F64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::F16: { f16 v; std::memcpy(&v.bits, p, 2); return f16_to_float(v); }
    case DType::BF16: { bf16 v; std::memcpy(&v.bits, p, 2); return bf16_to_float(v); }
    case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::U8: case DType::Bool: return static_cast<double>(static_cast<uint8_t>(*p));
  }
  return 0.0;
}

void Tensor::set(int64_t i, double v) {
  std::byte* p = bytes_.data() + static_cast<size_t>(i) * dtype_size(dtype_);
  switch (dtype_) {
    case DType::F64: std::memcpy(p, &v, 8); return;
    case DType::F32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::F16: { f16 h = double_to_f16(v); std::memcpy(p, &h.bits, 2); return; }
    case DType::BF16: { bf16 b = double_to_bf16(v); std::memcpy(p, &b.bits, 2); return; }
    case DType::I64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); return; }
    case DType::I32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); return; }
    case DType::U8: case DType::Bool: *p = static_cast<std::byte>(static_cast<uint8_t>(v)); return;
  }
}

Tensor Tensor::to(DType dtype) const {
  Tensor out = for_overwrite(dtype, shape_);  // every element is stored below
  if (dtype == dtype_) { out.bytes_ = bytes_; return out; }
  for (int64_t i = 0; i < numel_; ++i) out.set(i, get(i));
  return out;
}

std::vector<double> Tensor::to_f64() const {
  std::vector<double> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[static_cast<size_t>(i)] = get(i);
  return v;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  Tensor out = for_overwrite(dtype_, shape);  // its bytes are replaced below
  check_arg(out.numel() == numel_, "Tensor::reshaped", "shape", shape_str(shape),
            "a shape with " + std::to_string(numel_) + " elements");
  out.bytes_ = bytes_;
  return out;
}

}  // namespace dsa
