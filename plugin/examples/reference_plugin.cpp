// dsa_reference_plugin: the float64 reference (dsa::reference, through the oracle's
// `reference` backend) served through the plugin ABI, so the external path
// (dlopen → ABI → loader checks → isolation) is exercised end to end by the tests.
// Every output is F64, the reference's exact truth; top-k indices are I32.
#include "dsa/backend_abi.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/abi_adapter.h"

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  const dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  return dsa::plugin::make_adapter_table("reference", "dsa-verify " DSA_CONTRACT_VERSION, caps,
                                         [] { return dsa::oracle::make_reference_backend(); });
}
