// dsa_bf16_out_plugin: Bf16FlashStyleKernel (bf16_out_kernel.h) through the plugin ABI: a
// correct FlashAttention-style bf16 kernel declaring bf16 inputs only, a bf16 out and fp32 stats
// and gradients. The loader runs its forward and hands that out to its backward (a->out); the
// adapter recomputes it instead (same bytes). Built for the route tests, whose audit of it must
// pass (RouteIdentity.Bf16FlashStylePluginPassesTheAudit).
//
// Built again as dsa_normalized_p{,_undeclared,_sink}_plugin with DSA_NORMALIZED_P=1 (the
// kernel rounds softmax(P) to bf16 before P·V), named DSA_PLUGIN_NAME and declaring
// DSA_ROUNDING_BITS in rounding_models (ABI 1.2): DSA_ROUNDING_NORMALIZED_P (judged with that
// model it agrees), 0 or only DSA_ROUNDING_SINK_AFTER_ROUNDING (its out fails by up to about
// one bf16 ulp, the report naming --normalized-p). SPEC §9; RoundingModels.* in
// cli/tests/routes_test.cpp.
#include "bf16_out_kernel.h"
#include "dsa/backend_abi.h"
#include "dsa/plugin/abi_adapter.h"

#ifndef DSA_NORMALIZED_P
#define DSA_NORMALIZED_P 0
#endif
#ifndef DSA_ROUNDING_BITS
#define DSA_ROUNDING_BITS 0u
#endif
#ifndef DSA_PLUGIN_NAME
#define DSA_PLUGIN_NAME "bf16_flash_style"
#endif

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  caps.ops = DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD;
  caps.input_dtypes = DSA_DTYPE_BIT(DSA_DTYPE_BF16);
  caps.outputs.mla_out = DSA_DTYPE_BF16;
  caps.outputs.mla_stats = DSA_DTYPE_F32;
  caps.outputs.mla_grads = DSA_DTYPE_F32;
  return dsa::plugin::make_adapter_table(
      DSA_PLUGIN_NAME, "dsa-verify " DSA_CONTRACT_VERSION, caps,
      [] { return std::make_unique<dsa::test::Bf16FlashStyleKernel>(DSA_NORMALIZED_P != 0); }, 0,
      DSA_ROUNDING_BITS);
}
