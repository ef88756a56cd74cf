/* dsa_row_limit_plugin_<kind>: the shipped example plugin (plugin/examples/example_plugin.c)
 * with one limit that kernels ship (fresh-user finding 7), for the audit tests:
 *   DSA_ROW_LIMIT=n  query rows t >= n come back empty: top-k all -1, indexer scores -inf,
 *                    sparse MLA out 0, lse +inf, max_logits -inf (a grid of n rows);
 *   DSA_K_CAP=n      top-k slots j >= n hold -1 (a kernel written for k <= n).
 * Every other output is the example's own. `dsa-verify audit --plugin` must fail it at every
 * level and seed (cli/tests/audit_row_limits.sh). C99, like the example. */
#define dsa_backend_get_v1 dsa_example_backend_get_v1
#include "../examples/example_plugin.c"
#undef dsa_backend_get_v1

#ifndef DSA_ROW_LIMIT
#define DSA_ROW_LIMIT -1 /* no row limit */
#endif
#ifndef DSA_K_CAP
#define DSA_K_CAP -1 /* no width limit */
#endif

static char* tensor_bytes(const DLTensor* t) { return (char*)t->data + t->byte_offset; }

/* Elements of one row (the product of shape[1..]) of a row-major tensor. */
static int64_t row_elements(const DLTensor* t) {
  int64_t n = 1;
  int i;
  for (i = 1; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

static int row_cut(int64_t t) { return DSA_ROW_LIMIT >= 0 && t >= DSA_ROW_LIMIT; }

/* Sets rows t >= DSA_ROW_LIMIT of an F32 tensor to v. */
static void cut_f32_rows(const DLTensor* x, float v) {
  const int64_t per_row = row_elements(x);
  float* p = (float*)tensor_bytes(x);
  int64_t t, i;
  for (t = 0; t < x->shape[0]; ++t)
    if (row_cut(t))
      for (i = 0; i < per_row; ++i) p[t * per_row + i] = v;
}

static dsa_status limited_topk(const dsa_topk_args* a, char* err, size_t err_size) {
  const dsa_status st = example_topk(a, err, err_size);
  int32_t* ids = (int32_t*)tensor_bytes(a->indices);
  int64_t t, j;
  if (st != DSA_STATUS_OK) return st;
  for (t = 0; t < a->indices->shape[0]; ++t)
    for (j = 0; j < a->k; ++j)
      if (row_cut(t) || (DSA_K_CAP >= 0 && j >= DSA_K_CAP)) ids[t * a->k + j] = -1;
  return DSA_STATUS_OK;
}

static dsa_status limited_indexer_scores(const dsa_indexer_scores_args* a, char* err,
                                         size_t err_size) {
  const dsa_status st = example_indexer_scores(a, err, err_size);
  if (st != DSA_STATUS_OK) return st;
  cut_f32_rows(a->scores, -INFINITY);
  return DSA_STATUS_OK;
}

static dsa_status limited_sparse_mla_fwd(const dsa_sparse_mla_fwd_args* a, char* err,
                                         size_t err_size) {
  const dsa_status st = example_sparse_mla_fwd(a, err, err_size);
  int64_t t;
  if (st != DSA_STATUS_OK) return st;
  if (a->out != NULL) {  /* F32 or BF16: a zero is all zero bytes in both */
    const int64_t bytes = row_elements(a->out) * (a->out->dtype.bits / 8);
    for (t = 0; t < a->out->shape[0]; ++t)
      if (row_cut(t)) memset(tensor_bytes(a->out) + t * bytes, 0, (size_t)bytes);
  }
  if (a->lse != NULL) cut_f32_rows(a->lse, INFINITY);
  if (a->max_logits != NULL) cut_f32_rows(a->max_logits, -INFINITY);
  return DSA_STATUS_OK;
}

static dsa_backend_v1 limited_table;

DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  const dsa_backend_v1* example = dsa_example_backend_get_v1(loader_abi_version);
  if (example == NULL) return NULL;
  limited_table = *example;
  limited_table.name = "example-row-limit";
  limited_table.indexer_scores = limited_indexer_scores;
  limited_table.topk_indices = limited_topk;
  limited_table.sparse_mla_fwd = limited_sparse_mla_fwd;
  return &limited_table;
}
