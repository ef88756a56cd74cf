// Conversions between contract Tensors and DLPack DLTensors (host memory, compact
// row-major), used by the loader and by adapter plugins. Rules: dsa/backend_abi.h.
#pragma once

#include <optional>

#include <dlpack/dlpack.h>

#include "dsa/contract/tensor.h"

namespace dsa::plugin {

/// DLPack type of a contract dtype: F64/F32/F16 → kDLFloat 64/32/16, BF16 → kDLBfloat 16,
/// I64/I32 → kDLInt 64/32, U8 and Bool → kDLUInt 8; lanes 1.
DLDataType to_dl_dtype(DType dtype);
/// Contract dtype of a DLPack type (lanes must be 1); std::nullopt when there is none.
std::optional<DType> from_dl_dtype(DLDataType dtype);
/// "float32", "bfloat16", "int64", ... or "code<c>bits<b>x<l>" for anything else.
std::string dl_dtype_name(DLDataType dtype);

/// Copy of a host (kDLCPU), compact (strides NULL or row-major) DLTensor of a known dtype.
/// Throws std::invalid_argument("<where>: argument '<arg>' ...") otherwise or for NULL data
/// with non-zero elements.
Tensor tensor_from_dl(const DLTensor& t, const char* where, const char* arg);

/// Copies `src` into `dst` (host, compact, same shape). When dtypes differ the values are
/// converted with one rounding (Tensor::to). Throws std::invalid_argument naming
/// `where`/`arg` on a shape mismatch, a non-host or non-compact dst, or an unknown dtype.
void copy_to_dl(const Tensor& src, DLTensor& dst, const char* where, const char* arg);

}  // namespace dsa::plugin
