// dsa::Tensor <-> at::Tensor conversions (exact byte copies).
#include "dsa/backends/torch_tensor.h"

#include <ATen/ATen.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace dsa::backends {
namespace {

at::ScalarType scalar_type_of(DType d) {
  switch (d) {
    case DType::F64: return at::kDouble;
    case DType::F32: return at::kFloat;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::U8: return at::kByte;
    case DType::Bool: return at::kBool;
  }
  throw std::invalid_argument("to_torch: unknown DType");
}

DType dtype_of(at::ScalarType s) {
  switch (s) {
    case at::kDouble: return DType::F64;
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kLong: return DType::I64;
    case at::kInt: return DType::I32;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::Bool;
    default: break;
  }
  throw std::invalid_argument(std::string("from_torch: argument 't' has scalar type ") +
                              c10::toString(s) + ", expected one of the suite's dtypes");
}

}  // namespace

at::Tensor to_torch(const Tensor& t, const at::Device& device) {
  auto cpu = at::empty(t.shape(), at::TensorOptions().dtype(scalar_type_of(t.dtype())));
  if (t.nbytes() > 0) std::memcpy(cpu.data_ptr(), t.raw(), t.nbytes());
  return device.is_cpu() ? cpu : cpu.to(device);
}

Tensor from_torch(const at::Tensor& t) {
  const auto cpu = t.detach().to(at::kCPU).contiguous();
  Tensor out(dtype_of(cpu.scalar_type()), cpu.sizes().vec());
  if (out.nbytes() > 0) std::memcpy(out.raw(), cpu.data_ptr(), out.nbytes());
  return out;
}

std::pair<at::Tensor, at::Tensor> windows_to_torch(const KeyWindows& w, const at::Device& device) {
  const int64_t n = w.s_q();
  auto ks = at::empty({n}, at::kLong), ke = at::empty({n}, at::kLong);
  if (n > 0) {
    std::memcpy(ks.data_ptr(), w.ks.data(), n * sizeof(int64_t));
    std::memcpy(ke.data_ptr(), w.ke.data(), n * sizeof(int64_t));
  }
  return {ks.to(device), ke.to(device)};
}

}  // namespace dsa::backends
