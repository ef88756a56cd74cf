/* Misbehaving test plugins: one source, compiled once per DSA_BAD_KIND into its own MODULE
 * (plugin/CMakeLists.txt). Each declares topk_indices only and breaks exactly one rule of
 * dsa/backend_abi.h, so the loader's tests can check that every failure becomes a clear
 * error or finding and never crashes the test process. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsa/backend_abi.h"

#define KIND_SEGFAULT 1       /* dereferences NULL */
#define KIND_ABORT 2          /* calls abort() */
#define KIND_HANG 3           /* never returns (writes its pid to $DSA_HANG_PIDFILE first) */
#define KIND_OVERRUN 4        /* writes 16 int32 past the end of indices */
#define KIND_WRONG_ABI 5      /* abi_version 99 */
#define KIND_ERROR_STATUS 6   /* returns DSA_STATUS_INTERNAL_ERROR with a message */
#define KIND_WRONG_DTYPE 7    /* rewrites indices to int64 (dtype in the descriptor too) */
#define KIND_NON_CONTIGUOUS 8 /* sets strides on the output */
#define KIND_UNWRITTEN 9      /* returns OK without writing */
#define KIND_BAD_CAPS 10      /* declares sparse_mla_fwd without a function, bf16 stats */
#define KIND_MODIFIES_INPUT 11 /* writes into scores */
#define KIND_NO_ENTRY 12      /* a shared library without the entry symbol */
#define KIND_UNSUPPORTED 13   /* returns DSA_STATUS_UNSUPPORTED */
#define KIND_OVERRUN_THEN_ERROR 14 /* writes past the end, then returns an error status */
#define KIND_UNDERRUN 15      /* writes one int32 8 bytes before the start of indices */
#define KIND_OLD_HEADER 16    /* a correct plugin built against the first ABI 1 header (its
                                 struct_size ends before provided_outputs): must still load */
#define KIND_ABI_1_1_HEADER 17 /* a correct plugin built against the ABI 1.1 header: struct_size
                                  ends before rounding_models, whose bytes here hold garbage
                                  (all bits set) the loader must not read: loads, declares none */
#define KIND_BAD_ROUNDING 18  /* rounding_models with an unknown bit and normalized P on a
                                 top-k-only plugin (no sparse MLA op): a load error */

#ifndef DSA_BAD_KIND
#error "define DSA_BAD_KIND"
#endif

/* Fills indices with -1 (a legal "nothing selected" answer), then misbehaves. */
static dsa_status bad_topk(const dsa_topk_args* a, char* err, size_t err_size) {
  int64_t n = a->indices->shape[0] * a->indices->shape[1], i;
  int32_t* out = (int32_t*)a->indices->data;
#if DSA_BAD_KIND != KIND_UNWRITTEN && DSA_BAD_KIND != KIND_WRONG_DTYPE
  for (i = 0; i < n; ++i) out[i] = -1;
#endif
#if DSA_BAD_KIND == KIND_SEGFAULT
  *(volatile int*)(void*)0 = 1;
#elif DSA_BAD_KIND == KIND_ABORT
  abort();
#elif DSA_BAD_KIND == KIND_HANG
  {
    /* cli/tests/audit_interrupt.sh waits for this file: a call is running (rename: whole). */
    const char* path = getenv("DSA_HANG_PIDFILE");
    if (path) {
      char tmp[4096];
      FILE* f;
      snprintf(tmp, sizeof tmp, "%s.tmp", path);
      f = fopen(tmp, "w");
      if (f) {
        fprintf(f, "%ld\n", (long)getpid());
        if (fclose(f) == 0) rename(tmp, path);
      }
    }
  }
  for (;;) pause();
#elif DSA_BAD_KIND == KIND_OVERRUN
  for (i = n; i < n + 16; ++i) out[i] = -1;
#elif DSA_BAD_KIND == KIND_UNDERRUN
  out[-2] = 5;
#elif DSA_BAD_KIND == KIND_OVERRUN_THEN_ERROR
  out[n + 3] = 7;
  strncpy(err, "gave up", err_size - 1);
  return DSA_STATUS_INTERNAL_ERROR;
#elif DSA_BAD_KIND == KIND_ERROR_STATUS
  strncpy(err, "simulated device failure: out of memory", err_size - 1);
  return DSA_STATUS_INTERNAL_ERROR;
#elif DSA_BAD_KIND == KIND_UNSUPPORTED
  strncpy(err, "k > 2048 not implemented", err_size - 1);
  return DSA_STATUS_UNSUPPORTED;
#elif DSA_BAD_KIND == KIND_WRONG_DTYPE
  {
    int64_t* wide = (int64_t*)a->indices->data;
    a->indices->dtype.bits = 64;
    for (i = 0; i < n; ++i) wide[i] = -1;
  }
#elif DSA_BAD_KIND == KIND_NON_CONTIGUOUS
  {
    static int64_t strides[2];
    strides[0] = 1;
    strides[1] = a->indices->shape[0];
    a->indices->strides = strides;
  }
#elif DSA_BAD_KIND == KIND_MODIFIES_INPUT
  ((float*)a->scores->data)[0] = 42.0f;
#endif
  (void)err;
  (void)err_size;
  (void)out;
  (void)i;
  return DSA_STATUS_OK;
}

#if DSA_BAD_KIND != KIND_NO_ENTRY
static const dsa_backend_v1 bad_table = {
#if DSA_BAD_KIND == KIND_WRONG_ABI
    99u,
#else
    DSA_BACKEND_ABI_VERSION,
#endif
#if DSA_BAD_KIND == KIND_OLD_HEADER
    (uint32_t)offsetof(dsa_backend_v1, provided_outputs),
#elif DSA_BAD_KIND == KIND_ABI_1_1_HEADER
    (uint32_t)DSA_BACKEND_V1_PRE_ROUNDING_SIZE,
#else
    (uint32_t)sizeof(dsa_backend_v1),
#endif
    "bad",
    "0",
    {
#if DSA_BAD_KIND == KIND_BAD_CAPS
        DSA_OP_TOPK_INDICES | DSA_OP_SPARSE_MLA_FWD,
#else
        DSA_OP_TOPK_INDICES,
#endif
        DSA_DTYPE_BIT(DSA_DTYPE_F32),
        DSA_DEVICE_CPU,
        DSA_TIE_SMALL,
        DSA_TOPK_SORTED,
        1,
#if DSA_BAD_KIND == KIND_BAD_CAPS
        {DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_BF16, DSA_DTYPE_F32, DSA_DTYPE_F32},
#else
        {DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32},
#endif
    },
    NULL,
    NULL,
    NULL,
    bad_topk,
    NULL,
    NULL,
    NULL,
    0,
    0u,
    NULL,
    NULL,
    NULL,
#if DSA_BAD_KIND == KIND_ABI_1_1_HEADER
    0xFFFFFFFFu,
#elif DSA_BAD_KIND == KIND_BAD_ROUNDING
    DSA_ROUNDING_NORMALIZED_P | 0x8u,
#else
    0u,
#endif
};

DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  (void)loader_abi_version;
  return &bad_table;
}
#else
DSA_BACKEND_EXPORT dsa_status not_the_entry_point(const dsa_topk_args* a, char* err, size_t n) {
  return bad_topk(a, err, n);
}
#endif
