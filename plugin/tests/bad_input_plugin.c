/* A plugin of the SPEC §10 FP8 indexer and paged FP8 indexer (plain loops in double) whose
 * handling of bad input (a read scale that is not positive finite, a read block-table entry
 * outside the cache, a context longer than its table row) is chosen per call by the
 * environment variable DSA_BAD_INPUT_MODE (tests/bad_input_test.cpp, fresh-user F3/F3b):
 *   check    (default) returns DSA_STATUS_INVALID_ARGUMENT naming the input: the only pass;
 *   clamp    no error: a bad scale is used as 1, a bad table entry as block 0, a long context
 *            cut to its table row (a silent wrong answer, never a read outside the cache);
 *   crash    raises SIGSEGV (an unchecked GPU kernel's illegal address);
 *   hang     never returns;
 *   overrun  writes 8 bytes past the end of `scores`, then returns DSA_STATUS_INVALID_ARGUMENT;
 *   internal returns DSA_STATUS_INTERNAL_ERROR (an error, not the documented rejection).
 * Valid input is computed correctly in every mode. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsa/backend_abi.h"

enum { CHECK, CLAMP, CRASH, HANG, OVERRUN, INTERNAL };

static int bad_input_mode(void) {
  const char* m = getenv("DSA_BAD_INPUT_MODE");
  if (m == NULL) return CHECK;
  if (strcmp(m, "clamp") == 0) return CLAMP;
  if (strcmp(m, "crash") == 0) return CRASH;
  if (strcmp(m, "hang") == 0) return HANG;
  if (strcmp(m, "overrun") == 0) return OVERRUN;
  if (strcmp(m, "internal") == 0) return INTERNAL;
  return CHECK;
}

/* Exact value of one FP8 byte (OCP e4m3fn or e5m2). */
static double fp8_value(unsigned char b, int32_t format) {
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (format == DSA_FP8_FORMAT_E4M3FN) {
    const int e = (b >> 3) & 0xF, m = b & 0x7;
    if (e == 0xF && m == 0x7) return NAN;
    return sign * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
  }
  {
    const int e = (b >> 2) & 0x1F, m = b & 0x3;
    if (e == 0x1F) return m ? NAN : sign * INFINITY;
    return sign * (e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17));
  }
}

static int scale_ok(float s) { return s > 0.0f && isfinite(s); }

/* What the mode does with a bad input: a status to return (DSA_STATUS_OK: go on, `clamp`). */
static dsa_status on_bad_input(int mode, DLTensor* scores, const char* what, char* err, size_t err_size) {
  size_t n = 4;
  int i;
  switch (mode) {
    case CLAMP: return DSA_STATUS_OK;
    case CRASH: raise(SIGSEGV); return DSA_STATUS_INTERNAL_ERROR;
    case HANG: for (;;) pause();
    case OVERRUN:
      for (i = 0; i < scores->ndim; ++i) n *= (size_t)scores->shape[i];
      memset((char*)scores->data + n, 0x5A, 8);
      break;
    case INTERNAL: snprintf(err, err_size, "internal failure on %s", what); return DSA_STATUS_INTERNAL_ERROR;
    default: break;
  }
  snprintf(err, err_size, "%s", what);
  return DSA_STATUS_INVALID_ARGUMENT;
}

/* I = sum_j w[j] * ReLU(scale * (q_j . k)) over H heads of width d. */
static double score(const unsigned char* q, const unsigned char* k, const float* w, float scale, int64_t H,
                    int64_t d, int32_t format) {
  double I = 0;
  int64_t j, c;
  for (j = 0; j < H; ++j) {
    double dot = 0;
    for (c = 0; c < d; ++c) dot += fp8_value(q[j * d + c], format) * fp8_value(k[c], format);
    dot *= scale;
    if (dot > 0) I += w[j] * dot;
  }
  return I;
}

static dsa_status fp8_indexer(const dsa_fp8_indexer_scores_args* a, char* err, size_t err_size) {
  const int mode = bad_input_mode();
  const int64_t s_q = a->q_idx->shape[0], H = a->q_idx->shape[1], d = a->q_idx->shape[2];
  const int64_t s_kv = a->k_idx->shape[0];
  const unsigned char* q = (const unsigned char*)a->q_idx->data;
  const unsigned char* k = (const unsigned char*)a->k_idx->data;
  const float* k_scale = (const float*)a->k_scale->data;
  const float* w = (const float*)a->w->data;
  const int64_t* ks = (const int64_t*)a->ks->data;
  const int64_t* ke = (const int64_t*)a->ke->data;
  float* out = (float*)a->scores->data;
  int64_t t, s;
  for (t = 0; t < s_q; ++t)
    for (s = ks[t]; s < ke[t]; ++s)
      if (!scale_ok(k_scale[s])) {
        const dsa_status st = on_bad_input(mode, a->scores, "k_scale: a read scale is not positive finite", err, err_size);
        if (st != DSA_STATUS_OK) return st;
      }
  for (t = 0; t < s_q; ++t)
    for (s = 0; s < s_kv; ++s) {
      const float sc = scale_ok(k_scale[s]) ? k_scale[s] : 1.0f;
      out[t * s_kv + s] = (s < ks[t] || s >= ke[t]) ? -INFINITY
                                                   : (float)score(q + t * H * d, k + s * d, w + t * H, sc, H, d, a->fp8_format);
    }
  return DSA_STATUS_OK;
}

static dsa_status paged_indexer(const dsa_paged_indexer_scores_args* a, char* err, size_t err_size) {
  const int mode = bad_input_mode();
  const int64_t B = a->q_idx->shape[0], next_n = a->q_idx->shape[1], H = a->q_idx->shape[2], d = a->q_idx->shape[3];
  const int64_t num_blocks = a->k_cache->shape[0], bs = a->k_cache->shape[1];
  const int64_t max_blocks = a->block_table->shape[1], W = a->scores->shape[1];
  const unsigned char* q = (const unsigned char*)a->q_idx->data;
  const unsigned char* cache = (const unsigned char*)a->k_cache->data;
  const float* scales = (const float*)a->k_scale_cache->data;
  const float* w = (const float*)a->w->data;
  const int32_t* table = (const int32_t*)a->block_table->data;
  const int32_t* lens = (const int32_t*)a->context_lens->data;
  float* out = (float*)a->scores->data;
  int64_t b, i, p;
  /* Validation pass: contexts, the entries they read, their scales. */
  for (b = 0; b < B; ++b) {
    const int64_t L = lens[b];
    if (L < 0 || L > max_blocks * bs) {
      const dsa_status st = on_bad_input(mode, a->scores, "context_lens: longer than the block table row", err, err_size);
      if (st != DSA_STATUS_OK) return st;
      continue;
    }
    for (p = 0; p < L; ++p) {
      const int32_t blk = table[b * max_blocks + p / bs];
      if (blk < 0 || blk >= num_blocks) {
        const dsa_status st = on_bad_input(mode, a->scores, "block_table: a read entry is outside the cache", err, err_size);
        if (st != DSA_STATUS_OK) return st;
      } else if (!scale_ok(scales[blk * bs + p % bs])) {
        const dsa_status st = on_bad_input(mode, a->scores, "k_scale_cache: a read scale is not positive finite", err, err_size);
        if (st != DSA_STATUS_OK) return st;
      }
    }
  }
  /* Compute (clamp: bad entries read block 0, contexts cut to the table row, bad scales 1). */
  for (b = 0; b < B; ++b) {
    int64_t L = lens[b] < 0 ? 0 : lens[b];
    if (L > max_blocks * bs) L = max_blocks * bs;
    for (i = 0; i < next_n; ++i) {
      const int64_t row = b * next_n + i;
      int64_t end = L - next_n + i + 1;
      if (end < 0) end = 0;
      for (p = 0; p < W; ++p) {
        int32_t blk;
        int64_t slot;
        float sc;
        if (p >= end || p >= L) {
          out[row * W + p] = -INFINITY;
          continue;
        }
        blk = table[b * max_blocks + p / bs];
        if (blk < 0 || blk >= num_blocks) blk = 0;
        slot = (int64_t)blk * bs + p % bs;
        sc = scale_ok(scales[slot]) ? scales[slot] : 1.0f;
        out[row * W + p] = (float)score(q + row * H * d, cache + slot * d, w + row * H, sc, H, d, a->fp8_format);
      }
    }
  }
  return DSA_STATUS_OK;
}

static const dsa_backend_v1 kTable = {
    DSA_BACKEND_ABI_VERSION,
    (uint32_t)sizeof(dsa_backend_v1),
    "bad_input",
    "1",
    {DSA_OP_FP8_INDEXER_SCORES | DSA_OP_PAGED_INDEXER_SCORES,
     DSA_DTYPE_BIT(DSA_DTYPE_F32) | DSA_DTYPE_BIT(DSA_DTYPE_BF16),
     DSA_DEVICE_CPU,
     0,
     0,
     1,
     {DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_AS_INPUT, DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_F32}},
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,
    DSA_FP8_CAP_E4M3FN | DSA_FP8_CAP_E5M2,
    fp8_indexer,
    paged_indexer,
    NULL};

DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t abi_version) {
  return abi_version == DSA_BACKEND_ABI_VERSION ? &kTable : NULL;
}
