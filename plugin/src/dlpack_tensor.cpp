#include "dsa/plugin/dlpack_tensor.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/errors.h"

namespace dsa::plugin {

DLDataType to_dl_dtype(DType dtype) {
  DLDataType t{};
  t.lanes = 1;
  switch (dtype) {
    case DType::F64: t.code = kDLFloat; t.bits = 64; break;
    case DType::F32: t.code = kDLFloat; t.bits = 32; break;
    case DType::F16: t.code = kDLFloat; t.bits = 16; break;
    case DType::BF16: t.code = kDLBfloat; t.bits = 16; break;
    case DType::I64: t.code = kDLInt; t.bits = 64; break;
    case DType::I32: t.code = kDLInt; t.bits = 32; break;
    case DType::U8: case DType::Bool: t.code = kDLUInt; t.bits = 8; break;
  }
  return t;
}

std::optional<DType> from_dl_dtype(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 64) return DType::F64;
      if (t.bits == 32) return DType::F32;
      if (t.bits == 16) return DType::F16;
      return std::nullopt;
    case kDLBfloat:
      if (t.bits == 16) return DType::BF16;
      return std::nullopt;
    case kDLInt:
      if (t.bits == 64) return DType::I64;
      if (t.bits == 32) return DType::I32;
      return std::nullopt;
    case kDLUInt:
      if (t.bits == 8) return DType::U8;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

std::string dl_dtype_name(DLDataType t) {
  std::string lanes = t.lanes == 1 ? "" : "x" + std::to_string(t.lanes);
  switch (t.code) {
    case kDLFloat: return "float" + std::to_string(t.bits) + lanes;
    case kDLBfloat: return "bfloat" + std::to_string(t.bits) + lanes;
    case kDLInt: return "int" + std::to_string(t.bits) + lanes;
    case kDLUInt: return "uint" + std::to_string(t.bits) + lanes;
    default:
      return "code" + std::to_string(t.code) + "bits" + std::to_string(t.bits) + "x" +
             std::to_string(t.lanes);
  }
}

namespace {

std::vector<int64_t> shape_of(const DLTensor& t) {
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) return {-1};
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

bool is_compact(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expect = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

void check_host_compact(const DLTensor& t, const char* where, const char* arg) {
  check_arg(t.device.device_type == kDLCPU, where, arg,
            "device type " + std::to_string(static_cast<int>(t.device.device_type)),
            "host memory (kDLCPU)");
  check_arg(t.ndim >= 0 && (t.ndim == 0 || t.shape != nullptr), where, arg,
            "ndim " + std::to_string(t.ndim) + (t.shape ? "" : " with a NULL shape"),
            "a valid shape");
  check_arg(is_compact(t), where, arg, "strided (non-contiguous) layout",
            "compact row-major (strides NULL)");
}

}  // namespace

Tensor tensor_from_dl(const DLTensor& t, const char* where, const char* arg) {
  check_host_compact(t, where, arg);
  auto dtype = from_dl_dtype(t.dtype);
  check_arg(dtype.has_value(), where, arg, "dtype " + dl_dtype_name(t.dtype),
            "float64/float32/float16/bfloat16/int64/int32/uint8");
  Tensor out(*dtype, shape_of(t));
  check_arg(out.nbytes() == 0 || t.data != nullptr, where, arg, "NULL data", "a data pointer");
  if (out.nbytes())
    std::memcpy(out.raw(), static_cast<const std::byte*>(t.data) + t.byte_offset, out.nbytes());
  return out;
}

void copy_to_dl(const Tensor& src, DLTensor& dst, const char* where, const char* arg) {
  check_host_compact(dst, where, arg);
  auto dtype = from_dl_dtype(dst.dtype);
  check_arg(dtype.has_value(), where, arg, "dtype " + dl_dtype_name(dst.dtype),
            "float64/float32/float16/bfloat16/int64/int32/uint8");
  check_arg(shape_of(dst) == src.shape(), where, arg, shape_str(shape_of(dst)),
            "shape " + shape_str(src.shape()) + " of the result");
  Tensor converted = src.dtype() == *dtype ? Tensor() : src.to(*dtype);
  const Tensor& from = src.dtype() == *dtype ? src : converted;
  check_arg(from.nbytes() == 0 || dst.data != nullptr, where, arg, "NULL data",
            "a data pointer");
  if (from.nbytes())
    std::memcpy(static_cast<std::byte*>(dst.data) + dst.byte_offset, from.raw(), from.nbytes());
}

}  // namespace dsa::plugin
