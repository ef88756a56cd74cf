/* dsa_example_plugin: a small, self-contained kernel library written directly against the
 * plugin ABI (dsa/backend_abi.h), in C99 with plain loops. It implements
 *   - indexer_scores (SPEC §2): F32 or BF16 q_idx/k_idx, F32 w, F32 scores;
 *   - topk_indices   (SPEC §3): every tie policy, sorted and unsorted (always sorts);
 *   - sparse_mla_fwd (SPEC §4, §6): F32 or BF16 q/kv, out in q's dtype, lse/max_logits F32.
 * Accumulation is in double; the only rounding is the final store. It is the skeleton a
 * kernel author copies (docs/auditing-a-kernel.md): replace the loops by a call into your
 * kernel, keep the argument checks and the status/error handling.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsa/backend_abi.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* Writes a formatted message into the caller's error buffer; returns `status`. */
static dsa_status fail(dsa_status status, char* err, size_t err_size, const char* fmt, ...) {
  va_list ap;
  if (err != NULL && err_size > 0) {
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
  }
  return status;
}

static int is_dtype(const DLTensor* t, uint8_t code, uint8_t bits) {
  return t->dtype.code == code && t->dtype.bits == bits && t->dtype.lanes == 1;
}

/* bfloat16 is the upper half of a binary32. */
static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round-to-nearest-even binary32 → bfloat16; NaN stays (quiet) NaN. */
static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Element i (row-major) of a float tensor as double: F64, F32 or BF16. */
static double load_float(const DLTensor* t, int64_t i) {
  const char* base = (const char*)t->data + t->byte_offset;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 64) return ((const double*)base)[i];
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) return ((const float*)base)[i];
  return bf16_to_float(((const uint16_t*)base)[i]);
}

/* Stores v (rounded once from double through float) into a F32 or BF16 tensor. */
static void store_float(DLTensor* t, int64_t i, double v) {
  char* base = (char*)t->data + t->byte_offset;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32)
    ((float*)base)[i] = (float)v;
  else
    ((uint16_t*)base)[i] = float_to_bf16((float)v);
}

/* ---- indexer_scores (SPEC §2) ------------------------------------------------------- */

static dsa_status example_indexer_scores(const dsa_indexer_scores_args* a, char* err,
                                         size_t err_size) {
  const DLTensor* q = a->q_idx;
  const DLTensor* k = a->k_idx;
  const int64_t* ks = (const int64_t*)a->ks->data;
  const int64_t* ke = (const int64_t*)a->ke->data;
  float* scores = (float*)a->scores->data;
  int64_t s_q, h_i, d_i, s_kv, t, s, j, c;
  if (!(is_dtype(q, kDLFloat, 32) || is_dtype(q, kDLBfloat, 16)) ||
      !(is_dtype(k, kDLFloat, 32) || is_dtype(k, kDLBfloat, 16)) || !is_dtype(a->w, kDLFloat, 32))
    return fail(DSA_STATUS_UNSUPPORTED, err, err_size,
                "indexer_scores: q_idx/k_idx must be F32 or BF16 and w F32");
  s_q = q->shape[0];
  h_i = q->shape[1];
  d_i = q->shape[2];
  s_kv = k->shape[0];
  for (t = 0; t < s_q; ++t)
    for (s = 0; s < s_kv; ++s) {
      double acc = 0.0;
      if (s < ks[t] || s >= ke[t]) { /* outside the window */
        scores[t * s_kv + s] = -INFINITY;
        continue;
      }
      for (j = 0; j < h_i; ++j) { /* ReLU before the (possibly negative) weight */
        double dot = 0.0;
        for (c = 0; c < d_i; ++c)
          dot += load_float(q, (t * h_i + j) * d_i + c) * load_float(k, s * d_i + c);
        if (dot > 0.0) acc += load_float(a->w, t * h_i + j) * dot;
      }
      scores[t * s_kv + s] = (float)acc;
    }
  return DSA_STATUS_OK;
}

/* ---- topk_indices (SPEC §3) --------------------------------------------------------- */

typedef struct {
  double value;
  int64_t col;
} candidate;

/* Score descending; equal scores (IEEE ==, so -0.0 == +0.0) by column ascending. */
static int by_score_then_small(const void* a, const void* b) {
  const candidate* x = (const candidate*)a;
  const candidate* y = (const candidate*)b;
  if (x->value > y->value) return -1;
  if (x->value < y->value) return 1;
  return (x->col > y->col) - (x->col < y->col);
}

/* Score descending; equal scores by column descending. */
static int by_score_then_large(const void* a, const void* b) {
  const candidate* x = (const candidate*)a;
  const candidate* y = (const candidate*)b;
  if (x->value > y->value) return -1;
  if (x->value < y->value) return 1;
  return (x->col < y->col) - (x->col > y->col);
}

static dsa_status example_topk(const dsa_topk_args* a, char* err, size_t err_size) {
  const DLTensor* s = a->scores;
  int64_t s_q, s_kv, t, j;
  int32_t* out;
  const int64_t* ks = NULL;
  const int64_t* ke = NULL;
  candidate* cand;
  if (!is_dtype(s, kDLFloat, 32) && !is_dtype(s, kDLFloat, 64))
    return fail(DSA_STATUS_UNSUPPORTED, err, err_size, "topk_indices: scores must be F32/F64");
  if (s->ndim != 2 || a->indices->ndim != 2 || a->k < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, err, err_size, "topk_indices: bad rank or k");
  s_q = s->shape[0];
  s_kv = s->shape[1];
  if (a->ks != NULL) {
    ks = (const int64_t*)a->ks->data;
    ke = (const int64_t*)a->ke->data;
  }
  out = (int32_t*)a->indices->data;
  cand = (candidate*)malloc((size_t)(s_kv > 0 ? s_kv : 1) * sizeof *cand);
  if (cand == NULL) return fail(DSA_STATUS_INTERNAL_ERROR, err, err_size, "out of memory");
  for (t = 0; t < s_q; ++t) {
    int64_t lo = ks ? ks[t] : 0, hi = ke ? ke[t] : s_kv, n = 0, k_eff;
    for (j = lo; j < hi; ++j) {
      double v = load_float(s, t * s_kv + j);
      if (isnan(v) || v == -INFINITY) continue; /* never selectable (§3.1) */
      cand[n].value = v;
      cand[n].col = j;
      ++n;
    }
    /* "any" is served as "small"; sorted order is also a valid unsorted order. */
    qsort(cand, (size_t)n, sizeof *cand,
          a->tie_break == DSA_TIE_BREAK_LARGE ? by_score_then_large : by_score_then_small);
    k_eff = n < a->k ? n : a->k;
    for (j = 0; j < a->k; ++j) out[t * a->k + j] = j < k_eff ? (int32_t)cand[j].col : -1;
  }
  free(cand);
  return DSA_STATUS_OK;
}

/* ---- sparse_mla_fwd (SPEC §4, §6) --------------------------------------------------- */

static dsa_status example_sparse_mla_fwd(const dsa_sparse_mla_fwd_args* a, char* err,
                                         size_t err_size) {
  const DLTensor* q = a->q;
  const DLTensor* kv = a->kv;
  int64_t s_q, h_q, d_qk, s_kv, k, d_v = a->d_v, t, h, j, c;
  const int32_t* idx = (const int32_t*)a->indices->data;
  const int32_t* len = a->topk_length ? (const int32_t*)a->topk_length->data : NULL;
  double* logits;
  double* acc;
  if (!(is_dtype(q, kDLFloat, 32) || is_dtype(q, kDLBfloat, 16)) ||
      q->dtype.code != kv->dtype.code || q->dtype.bits != kv->dtype.bits)
    return fail(DSA_STATUS_UNSUPPORTED, err, err_size, "sparse_mla_fwd: q/kv must be F32 or BF16");
  if (a->attn_sink != NULL && !is_dtype(a->attn_sink, kDLFloat, 32))
    return fail(DSA_STATUS_UNSUPPORTED, err, err_size, "sparse_mla_fwd: attn_sink must be F32");
  s_q = q->shape[0];
  h_q = q->shape[1];
  d_qk = q->shape[2];
  s_kv = kv->shape[0];
  k = a->indices->shape[1];
  if (d_v <= 0 || d_v > d_qk)
    return fail(DSA_STATUS_INVALID_ARGUMENT, err, err_size, "sparse_mla_fwd: d_v=%lld",
                (long long)d_v);
  logits = (double*)malloc((size_t)(k > 0 ? k : 1) * sizeof *logits);
  acc = (double*)malloc((size_t)d_v * sizeof *acc);
  if (logits == NULL || acc == NULL) {
    free(logits);
    free(acc);
    return fail(DSA_STATUS_INTERNAL_ERROR, err, err_size, "out of memory");
  }
  for (t = 0; t < s_q; ++t) {
    for (h = 0; h < h_q; ++h) {
      const int64_t row = t * h_q + h;
      double m = -INFINITY, sum = 0.0, lse, scale = 1.0;
      int64_t n_valid = 0;
      for (j = 0; j < k; ++j) { /* logits of valid slots; invalid ones never touch kv */
        const int64_t id = idx[t * k + j];
        logits[j] = NAN;
        if (id < 0 || id >= s_kv || (len != NULL && j >= len[t])) continue;
        {
          double dot = 0.0;
          for (c = 0; c < d_qk; ++c) dot += load_float(q, row * d_qk + c) * load_float(kv, id * d_qk + c);
          logits[j] = a->sm_scale * dot;
        }
        if (logits[j] > m) m = logits[j];
        ++n_valid;
      }
      for (c = 0; c < d_v; ++c) acc[c] = 0.0;
      if (n_valid == 0) { /* empty row (§6): out 0, lse +inf, max_logits -inf */
        for (c = 0; c < d_v; ++c) store_float(a->out, row * d_v + c, 0.0);
        ((float*)a->lse->data)[row] = INFINITY;
        ((float*)a->max_logits->data)[row] = -INFINITY;
        continue;
      }
      for (j = 0; j < k; ++j)
        if (!isnan(logits[j])) sum += exp(logits[j] - m);
      lse = m + log(sum);
      for (j = 0; j < k; ++j) {
        double p;
        if (isnan(logits[j])) continue;
        p = exp(logits[j] - lse);
        for (c = 0; c < d_v; ++c) acc[c] += p * load_float(kv, (int64_t)idx[t * k + j] * d_qk + c);
      }
      if (a->attn_sink != NULL) /* out *= exp(lse) / (exp(lse) + exp(sink)) */
        scale = 1.0 / (1.0 + exp((double)((const float*)a->attn_sink->data)[h] - lse));
      for (c = 0; c < d_v; ++c) store_float(a->out, row * d_v + c, acc[c] * scale);
      ((float*)a->lse->data)[row] = (float)lse;
      ((float*)a->max_logits->data)[row] = (float)m;
    }
  }
  free(logits);
  free(acc);
  return DSA_STATUS_OK;
}

/* ---- the function table ------------------------------------------------------------- */

static const dsa_backend_v1 example_table = {
    DSA_BACKEND_ABI_VERSION,
    (uint32_t)sizeof(dsa_backend_v1),
    "example",
    "1.0",
    {
        /* ops */ DSA_OP_INDEXER_SCORES | DSA_OP_TOPK_INDICES | DSA_OP_SPARSE_MLA_FWD,
        /* input_dtypes */ DSA_DTYPE_BIT(DSA_DTYPE_F32) | DSA_DTYPE_BIT(DSA_DTYPE_BF16),
        /* devices */ DSA_DEVICE_CPU,
        /* tie_policies */ DSA_TIE_ANY | DSA_TIE_SMALL | DSA_TIE_LARGE,
        /* topk_orders */ DSA_TOPK_SORTED | DSA_TOPK_UNSORTED,
        /* deterministic */ 1,
        /* outputs: index_scores, indexer_grads (unused), mla_out, mla_stats,
           mla_grads (unused), kl (unused) */
        {DSA_DTYPE_F32, DSA_DTYPE_F32, DSA_DTYPE_AS_INPUT, DSA_DTYPE_F32, DSA_DTYPE_F32,
         DSA_DTYPE_F32},
    },
    /* is_available */ NULL,
    /* indexer_scores */ example_indexer_scores,
    /* indexer_scores_backward */ NULL,
    /* topk_indices */ example_topk,
    /* sparse_mla_fwd */ example_sparse_mla_fwd,
    /* sparse_mla_bwd */ NULL,
    /* indexer_kl_loss */ NULL,
    /* provided_outputs: 0 = every output of each declared op (e.g. DSA_OUTPUT_OUT |
       DSA_OUTPUT_LSE for a forward without max_logits, which is then not judged) */ 0,
    /* ABI 1.1 (SPEC §10): fp8_caps, fp8_indexer_scores, paged_indexer_scores,
       sparse_mla_fp8_fwd: not implemented here */
    0u,
    NULL,
    NULL,
    NULL,
    /* ABI 1.2: rounding_models, how a 16-bit sparse MLA rounds where SPEC §4 leaves it free:
       DSA_ROUNDING_NORMALIZED_P for a kernel that rounds softmax(P) to 16 bits before P.V,
       DSA_ROUNDING_SINK_AFTER_ROUNDING for one that rounds out before applying attn_sink.
       This one rounds neither (fp32 P.V, out rounded once). */
    0u,
};

DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  return loader_abi_version == DSA_BACKEND_ABI_VERSION ? &example_table : NULL;
}
