// dsa_partial_outputs_plugin: the float64 reference's sparse MLA forward through the plugin
// ABI, declaring in provided_outputs that it writes only `out` and `lse` (SPEC §9 complete
// outputs: max_logits is then "not judged", never missing). Built for the tests only.
#include "dsa/backend_abi.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/abi_adapter.h"

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  caps.ops = DSA_OP_SPARSE_MLA_FWD;
  return dsa::plugin::make_adapter_table("partial_outputs", "dsa-verify " DSA_CONTRACT_VERSION, caps,
                                         [] { return dsa::oracle::make_reference_backend(); },
                                         DSA_OUTPUT_OUT | DSA_OUTPUT_LSE);
}
