// dsa_mutant_plugin_<i>: mutant number DSA_MUTANT_INDEX of the property suite
// (property_tests/mutants/, each imitating a fault the field has shipped) served through the
// plugin ABI, so the mutation score is also measured through the external path: dlopen →
// ABI → loader checks → child-process isolation. Outputs as the reference's (F64; ids I32); a
// mutant declaring fp8_reduced_accumulation declares it in fp8_caps too, one declaring a
// rounding model (Backend::rounding_model) declares it in rounding_models and returns out in
// q's dtype (DSA_DTYPE_AS_INPUT).
#include "dsa/backend_abi.h"
#include "dsa/plugin/abi_adapter.h"
#include "dsa/property_tests/suite.h"

#define DSA_STR2(x) #x
#define DSA_STR(x) DSA_STR2(x)

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  auto make = [] { return dsa::props::mutant_subjects().at(DSA_MUTANT_INDEX).make(); };
  const uint32_t fp8 = make()->fp8_reduced_accumulation() ? DSA_FP8_REDUCED_ACCUMULATION : 0u;
  const dsa::oracle::RoundingModel m = make()->rounding_model();
  const uint32_t rounding = (m.sink_after_rounding ? DSA_ROUNDING_SINK_AFTER_ROUNDING : 0u) |
                            (m.normalized_p ? DSA_ROUNDING_NORMALIZED_P : 0u);
  // A declared rounding model is about a 16-bit out: such a mutant returns out in q's dtype.
  if (rounding) caps.outputs.mla_out = DSA_DTYPE_AS_INPUT;
  return dsa::plugin::make_adapter_table("mutant_" DSA_STR(DSA_MUTANT_INDEX),
                                         "dsa-verify " DSA_CONTRACT_VERSION, caps, make, 0, rounding, fp8);
}
