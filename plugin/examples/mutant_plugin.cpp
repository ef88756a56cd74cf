// dsa_mutant_plugin_<i>: mutant number DSA_MUTANT_INDEX of the property suite
// (property_tests/mutants/, each imitating a fault the field has shipped) served through the
// plugin ABI, so the mutation score is also measured through the external path: dlopen →
// ABI → loader checks → child-process isolation. Outputs as the reference's (F64; ids I32).
#include "dsa/backend_abi.h"
#include "dsa/plugin/abi_adapter.h"
#include "dsa/property_tests/suite.h"

#define DSA_STR2(x) #x
#define DSA_STR(x) DSA_STR2(x)

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps{};
  caps.ops = DSA_OP_ALL_V1;
  caps.input_dtypes = DSA_DTYPE_BIT(DSA_DTYPE_F64) | DSA_DTYPE_BIT(DSA_DTYPE_F32) |
                      DSA_DTYPE_BIT(DSA_DTYPE_F16) | DSA_DTYPE_BIT(DSA_DTYPE_BF16);
  caps.devices = DSA_DEVICE_CPU;
  caps.tie_policies = DSA_TIE_ANY | DSA_TIE_SMALL | DSA_TIE_LARGE;
  caps.topk_orders = DSA_TOPK_SORTED | DSA_TOPK_UNSORTED;
  caps.deterministic = 1;
  caps.outputs.index_scores = DSA_DTYPE_F64;
  caps.outputs.indexer_grads = DSA_DTYPE_F64;
  caps.outputs.mla_out = DSA_DTYPE_F64;
  caps.outputs.mla_stats = DSA_DTYPE_F64;
  caps.outputs.mla_grads = DSA_DTYPE_F64;
  caps.outputs.kl = DSA_DTYPE_F64;
  return dsa::plugin::make_adapter_table("mutant_" DSA_STR(DSA_MUTANT_INDEX),
                                         "dsa-verify " DSA_CONTRACT_VERSION, caps, [] {
    return dsa::props::mutant_subjects().at(DSA_MUTANT_INDEX).make();
  });
}
