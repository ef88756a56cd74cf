// Serves any dsa::oracle::Backend through the plugin ABI (dsa/backend_abi.h), so built-in
// backends, the reference and oracle mutants can be built as plugins and audited through
// the external path (issue 6). Used by plugin/examples/reference_plugin.cpp.
#pragma once

#include <functional>
#include <memory>

#include "dsa/backend_abi.h"
#include "dsa/oracle/backend.h"

namespace dsa::plugin {

/// Builds the function table of an adapter plugin around the backend `factory` creates
/// (lazily, on the first op call, so dsa_backend_get_v1 stays cheap). The table and the
/// backend live until the process ends. One adapter per shared library: a second call
/// returns the first table. `name`/`version` must be string literals (static storage).
/// `caps.outputs` must name the dtypes the backend returns (they are converted with one
/// rounding otherwise). Each op converts DLTensors to contract Tensors (copies), calls the
/// backend, copies results into the caller's outputs and maps exceptions to statuses:
/// NotSupported → DSA_STATUS_UNSUPPORTED, std::invalid_argument → DSA_STATUS_INVALID_ARGUMENT,
/// anything else → DSA_STATUS_INTERNAL_ERROR, with what() in err.
/// Capabilities of an adapter around a reference-like backend: every ABI 1.1 op (the §10 ops
/// with both FP8 formats, fp8_caps set by make_adapter_table), F64/F32/F16/BF16
/// inputs, CPU, all tie policies and orders, deterministic, every float output F64.
dsa_capabilities reference_like_capabilities();

/// `provided_outputs`: the table's DSA_OUTPUT_* bits (0: every output); outputs the loader
/// passes as NULL (not provided) are not written. `rounding_models`: the table's DSA_ROUNDING_*
/// bits (ABI 1.2; 0: neither model), what the wrapped kernel does, for the loader to validate.
/// `fp8_declarations`: fp8_caps bits added to the table's formats (DSA_FP8_REDUCED_ACCUMULATION
/// for a kernel whose FP8 products accumulate in ~14 bits: Backend::fp8_reduced_accumulation);
/// used only when the table declares a §10 op.
const dsa_backend_v1* make_adapter_table(
    const char* name, const char* version, const dsa_capabilities& caps,
    std::function<std::unique_ptr<dsa::oracle::Backend>()> factory,
    uint32_t provided_outputs = 0, uint32_t rounding_models = 0, uint32_t fp8_declarations = 0);

}  // namespace dsa::plugin
