/* Compiled with -std=c99 -pedantic -Werror (target dsa_plugin_abi_c99_check): the plugin
 * ABI header must stay plain C99. Also checks a few layout facts plugins rely on. */
#include "dsa/backend_abi.h"

typedef char abi_version_is_1[DSA_BACKEND_ABI_VERSION == 1u ? 1 : -1];
typedef char all_ops_cover_six_bits[DSA_OP_ALL_V1 == 0x3Fu ? 1 : -1];
/* ABI 1.1 appends the §10 ops after the 1.0 fields (old plugins keep their layout). */
typedef char abi_1_1_ops_cover_nine_bits[DSA_OP_ALL_V1_1 == 0x1FFu ? 1 : -1];
typedef char abi_1_1_fields_are_appended[DSA_BACKEND_V1_PRE_FP8_SIZE ==
                                                 offsetof(dsa_backend_v1, provided_outputs) +
                                                     sizeof(uint32_t)
                                             ? 1
                                             : -1];

/* ABI 1.2 appends rounding_models after the last §10 op (1.1 plugins keep their layout). */
typedef char abi_1_2_field_is_appended[DSA_BACKEND_V1_PRE_ROUNDING_SIZE ==
                                               offsetof(dsa_backend_v1, sparse_mla_fp8_fwd) +
                                                   sizeof(void (*)(void))
                                           ? 1
                                           : -1];

static dsa_status no_topk(const dsa_topk_args* a, char* err, size_t err_size) {
  (void)a;
  (void)err;
  (void)err_size;
  return DSA_STATUS_UNSUPPORTED;
}

int main(void) {
  dsa_backend_v1 t;
  dsa_topk_args a;
  char err[16];
  t.abi_version = DSA_BACKEND_ABI_VERSION;
  t.struct_size = (uint32_t)sizeof t;
  t.topk_indices = no_topk;
  a.k = 0;
  return t.topk_indices(&a, err, sizeof err) == DSA_STATUS_UNSUPPORTED ? 0 : 1;
}
