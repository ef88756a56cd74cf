// Contract Tensors <-> DLPack capsules ("dltensor", DLPack 0.6), the form in which the
// Python module hands tensors to torch.utils.dlpack and reads them back. No LibTorch.
#pragma once

#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "dsa/contract/tensor.h"

namespace dsa::python {

/// A capsule over a host tensor that shares `t`'s bytes (no copy; the capsule, then the torch
/// tensor made from it, keeps `t` alive). dtype as dsa::plugin::to_dl_dtype; compact row-major
/// strides; device kDLCPU.
pybind11::capsule to_capsule(std::shared_ptr<Tensor> t);

/// Copy of the tensor in a "dltensor" capsule (torch.utils.dlpack.to_dlpack of a host,
/// contiguous tensor of dtype float64/32/16, bfloat16, int64/32 or uint8); consumes the capsule.
/// Throws std::runtime_error "<what>: ..." for anything else: not a capsule, already consumed,
/// a device other than the host, a strided layout, an unknown dtype.
Tensor from_capsule(pybind11::handle capsule, const std::string& what);

}  // namespace dsa::python
