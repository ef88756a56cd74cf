// Conversions between the suite's host tensor (dsa::Tensor) and at::Tensor, used by the
// libtorch backends and the LibTorch properties. Built only with DSA_WITH_TORCH.
#pragma once

#include <ATen/core/Tensor.h>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"

namespace dsa::backends {

/// Copy of `t` on `device` with the matching scalar type (F64→double, F32→float,
/// F16→half, BF16→bfloat16, I64→long, I32→int, U8→byte, Bool→bool); bytes are copied
/// exactly (no rounding). Contiguous.
at::Tensor to_torch(const Tensor& t, const at::Device& device);
/// Host copy of `t` (any device, any strides) as a dsa::Tensor with the same bytes.
/// Throws std::invalid_argument naming the scalar type when it has no DType.
Tensor from_torch(const at::Tensor& t);
/// Window bounds as two int64 [s_q] tensors (ks, ke) on `device` (SPEC §1).
std::pair<at::Tensor, at::Tensor> windows_to_torch(const KeyWindows& w, const at::Device& device);

}  // namespace dsa::backends
