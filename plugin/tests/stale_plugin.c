/* dsa_stale_plugin: the shipped example plugin (plugin/examples/example_plugin.c) with state
 * carried between calls, as a kernel with a CUDA graph captured on its first call and replayed
 * with a stale input buffer (or a result cache keyed by shape) has it: the first call of each op
 * computes and keeps its outputs; a later call of that op with the same output shapes copies
 * the kept outputs back without reading its inputs. Alone in a process every call is a first
 * call and correct, so only a second call in one process can tell (outside tester fresh17,
 * F5). The plugin route's determinism re-run makes that second call (plugin_backend.cpp,
 * Impl::run); plugin_vs_reference_test.cpp asserts the oracle fails every op here. C99. */
#define dsa_backend_get_v1 dsa_example_backend_get_v1
#include "../examples/example_plugin.c"
#undef dsa_backend_get_v1

/* Bytes of a row-major tensor (shape product x element size). */
static size_t tensor_size(const DLTensor* t) {
  size_t n = (size_t)t->dtype.bits / 8u * t->dtype.lanes;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)t->shape[i];
  return n;
}

/* The outputs one op kept from its first call: up to three tensors (sparse MLA's out, lse,
 * max_logits), with their byte sizes as the key (the "shape" of the call). */
typedef struct {
  int kept;
  size_t size[3];
  unsigned char* bytes[3];
} kept_outputs;

static kept_outputs kept_indexer, kept_topk, kept_mla;

/* Replays `k` into outs[0..n) when their sizes match the kept ones (returns 1), else 0. */
static int replay(kept_outputs* k, DLTensor* const* outs, int n) {
  int i;
  if (!k->kept) return 0;
  for (i = 0; i < n; ++i)
    if ((outs[i] == NULL ? 0u : tensor_size(outs[i])) != k->size[i]) return 0;
  for (i = 0; i < n; ++i)
    if (outs[i] != NULL) memcpy((char*)outs[i]->data + outs[i]->byte_offset, k->bytes[i], k->size[i]);
  return 1;
}

/* Keeps outs[0..n) of a successful first call in `k` (a failed allocation keeps nothing). */
static void keep(kept_outputs* k, DLTensor* const* outs, int n) {
  int i;
  if (k->kept) return;
  for (i = 0; i < n; ++i) {
    k->size[i] = outs[i] == NULL ? 0u : tensor_size(outs[i]);
    k->bytes[i] = (unsigned char*)malloc(k->size[i] > 0 ? k->size[i] : 1u);
    if (k->bytes[i] == NULL) return;
    if (outs[i] != NULL) memcpy(k->bytes[i], (const char*)outs[i]->data + outs[i]->byte_offset, k->size[i]);
  }
  k->kept = 1;
}

static dsa_status stale_indexer_scores(const dsa_indexer_scores_args* a, char* err, size_t err_size) {
  DLTensor* outs[1];
  dsa_status st;
  outs[0] = a->scores;
  if (replay(&kept_indexer, outs, 1)) return DSA_STATUS_OK;
  st = example_indexer_scores(a, err, err_size);
  if (st == DSA_STATUS_OK) keep(&kept_indexer, outs, 1);
  return st;
}

static dsa_status stale_topk(const dsa_topk_args* a, char* err, size_t err_size) {
  DLTensor* outs[1];
  dsa_status st;
  outs[0] = a->indices;
  if (replay(&kept_topk, outs, 1)) return DSA_STATUS_OK;
  st = example_topk(a, err, err_size);
  if (st == DSA_STATUS_OK) keep(&kept_topk, outs, 1);
  return st;
}

static dsa_status stale_sparse_mla_fwd(const dsa_sparse_mla_fwd_args* a, char* err, size_t err_size) {
  DLTensor* outs[3];
  dsa_status st;
  outs[0] = a->out;
  outs[1] = a->lse;
  outs[2] = a->max_logits;
  if (replay(&kept_mla, outs, 3)) return DSA_STATUS_OK;
  st = example_sparse_mla_fwd(a, err, err_size);
  if (st == DSA_STATUS_OK) keep(&kept_mla, outs, 3);
  return st;
}

static dsa_backend_v1 stale_table;

DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  const dsa_backend_v1* example = dsa_example_backend_get_v1(loader_abi_version);
  if (example == NULL) return NULL;
  stale_table = *example;
  stale_table.name = "example-stale";
  stale_table.indexer_scores = stale_indexer_scores;
  stale_table.topk_indices = stale_topk;
  stale_table.sparse_mla_fwd = stale_sparse_mla_fwd;
  return &stale_table;
}
