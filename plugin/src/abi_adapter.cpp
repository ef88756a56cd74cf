#include "dsa/plugin/abi_adapter.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/errors.h"
#include "dsa/plugin/dlpack_tensor.h"

namespace dsa::plugin {
namespace {

using dsa::oracle::Backend;

struct AdapterState {
  dsa_backend_v1 table{};
  std::function<std::unique_ptr<Backend>()> factory;
  std::unique_ptr<Backend> backend;
  std::once_flag created;

  Backend& get() {
    std::call_once(created, [this] { backend = factory(); });
    if (!backend) throw std::runtime_error("adapter plugin: the backend factory returned null");
    return *backend;
  }
};

AdapterState& state() {
  static AdapterState s;
  return s;
}

void write_err(char* err, size_t n, const std::string& msg) {
  if (err == nullptr || n == 0) return;
  size_t len = std::min(n - 1, msg.size());
  std::memcpy(err, msg.data(), len);
  err[len] = '\0';
}

// Runs body, mapping exceptions to a status and a message.
template <class F>
dsa_status guarded(char* err, size_t n, F&& body) {
  try {
    body();
    return DSA_STATUS_OK;
  } catch (const dsa::oracle::NotSupported& e) {
    write_err(err, n, e.what());
    return DSA_STATUS_UNSUPPORTED;
  } catch (const std::invalid_argument& e) {
    write_err(err, n, e.what());
    return DSA_STATUS_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    write_err(err, n, e.what());
    return DSA_STATUS_INTERNAL_ERROR;
  } catch (...) {
    write_err(err, n, "non-standard exception");
    return DSA_STATUS_INTERNAL_ERROR;
  }
}

Tensor in(const DLTensor* t, const char* where, const char* arg) {
  check_arg(t != nullptr, where, arg, "NULL", "a tensor");
  return tensor_from_dl(*t, where, arg);
}
std::optional<Tensor> in_opt(const DLTensor* t, const char* where, const char* arg) {
  if (t == nullptr) return std::nullopt;
  return tensor_from_dl(*t, where, arg);
}
void out(const Tensor& src, DLTensor* dst, const char* where, const char* arg) {
  if (dst == nullptr) return;  // not among the table's provided_outputs: the loader passed NULL
  // Float outputs are converted to the declared dtype with one rounding; integer outputs
  // (top-k ids) are never converted: a backend returning I64 ids breaks the ABI's I32
  // contract (SPEC §3) and must surface as an error, not be narrowed silently.
  const auto want = from_dl_dtype(dst->dtype);
  if (!is_floating(src.dtype()) || (want && !is_floating(*want)))
    check_arg(want && *want == src.dtype(), where, arg,
              std::string("dtype ") + dtype_name(src.dtype()) + " from the backend",
              std::string("dtype ") + (want ? dtype_name(*want) : dl_dtype_name(dst->dtype).c_str()) +
                  " (integer outputs are not converted)");
  copy_to_dl(src, *dst, where, arg);
}

KeyWindows windows(const DLTensor* ks, const DLTensor* ke, int64_t s_kv, const char* where) {
  Tensor a = in(ks, where, "ks"), b = in(ke, where, "ke");
  check_arg(a.dtype() == DType::I64 && b.dtype() == DType::I64, where, "ks/ke",
            dtype_name(a.dtype()), "I64");
  std::vector<int64_t> s(a.data<int64_t>(), a.data<int64_t>() + a.numel());
  std::vector<int64_t> e(b.data<int64_t>(), b.data<int64_t>() + b.numel());
  return KeyWindows::explicit_windows(std::move(s), std::move(e), s_kv);
}

dsa_status indexer_scores(const dsa_indexer_scores_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "indexer_scores";
    Tensor k_idx = in(a->k_idx, op, "k_idx");
    Tensor r = state().get().indexer_scores(in(a->q_idx, op, "q_idx"), k_idx, in(a->w, op, "w"),
                                            windows(a->ks, a->ke, k_idx.size(0), op));
    out(r, a->scores, op, "scores");
  });
}

dsa_status indexer_scores_backward(const dsa_indexer_scores_backward_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "indexer_scores_backward";
    Tensor k_idx = in(a->k_idx, op, "k_idx");
    IndexerGrads g = state().get().indexer_scores_backward(
        in(a->q_idx, op, "q_idx"), k_idx, in(a->w, op, "w"),
        windows(a->ks, a->ke, k_idx.size(0), op), in(a->d_scores, op, "d_scores"));
    out(g.dq_idx, a->dq_idx, op, "dq_idx");
    out(g.dk_idx, a->dk_idx, op, "dk_idx");
    out(g.dw, a->dw, op, "dw");
  });
}

dsa_status topk_indices(const dsa_topk_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "topk_indices";
    Tensor scores = in(a->scores, op, "scores");
    TopkPolicy policy;
    policy.tie_break = a->tie_break == DSA_TIE_BREAK_SMALL   ? TieBreak::Small
                       : a->tie_break == DSA_TIE_BREAK_LARGE ? TieBreak::Large
                                                             : TieBreak::Any;
    policy.sorted = a->sorted != 0;
    std::optional<KeyWindows> w;
    if (a->ks != nullptr || a->ke != nullptr) w = windows(a->ks, a->ke, scores.size(1), op);
    out(state().get().select_topk(scores, a->k, policy, w), a->indices, op, "indices");
  });
}

SparseMlaInputs mla_inputs(const DLTensor* q, const DLTensor* kv, const DLTensor* indices,
                           const DLTensor* topk_length, const DLTensor* attn_sink,
                           double sm_scale, int64_t d_v, const char* op) {
  SparseMlaInputs in_;
  in_.q = in(q, op, "q");
  in_.kv = in(kv, op, "kv");
  in_.indices = in(indices, op, "indices");
  in_.topk_length = in_opt(topk_length, op, "topk_length");
  in_.attn_sink = in_opt(attn_sink, op, "attn_sink");
  in_.sm_scale = sm_scale;
  in_.d_v = d_v;
  return in_;
}

dsa_status sparse_mla_fwd(const dsa_sparse_mla_fwd_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "sparse_mla_fwd";
    SparseMlaForward f = state().get().sparse_mla_forward(mla_inputs(
        a->q, a->kv, a->indices, a->topk_length, a->attn_sink, a->sm_scale, a->d_v, op));
    out(f.out, a->out, op, "out");
    out(f.lse, a->lse, op, "lse");
    out(f.max_logits, a->max_logits, op, "max_logits");
  });
}

dsa_status sparse_mla_bwd(const dsa_sparse_mla_bwd_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "sparse_mla_bwd";
    SparseMlaGrads g = state().get().sparse_mla_backward(
        mla_inputs(a->q, a->kv, a->indices, a->topk_length, a->attn_sink, a->sm_scale, a->d_v, op),
        in(a->dout, op, "dout"));
    out(g.dq, a->dq, op, "dq");
    out(g.dkv, a->dkv, op, "dkv");
    if (a->dsink != nullptr) {
      check_arg(g.dsink.has_value(), op, "dsink", "no dsink from the backend", "dsink [h_q]");
      out(*g.dsink, a->dsink, op, "dsink");
    }
  });
}

dsa_status indexer_kl_loss(const dsa_indexer_kl_loss_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "indexer_kl_loss";
    IndexerKlInputs kin;
    kin.scores = in(a->scores, op, "scores");
    kin.q = in(a->q, op, "q");
    kin.kv = in(a->kv, op, "kv");
    kin.sm_scale = a->sm_scale;
    kin.windows = windows(a->ks, a->ke, kin.scores.size(1), op);
    kin.mode = a->mode == DSA_KL_SPARSE ? KlMode::Sparse : KlMode::Dense;
    kin.indices = in_opt(a->indices, op, "indices");
    kin.coeff = a->coeff;
    IndexerKlResult r = state().get().indexer_kl_loss(kin);
    out(r.loss, a->loss, op, "loss");
    out(r.d_scores, a->d_scores, op, "d_scores");
  });
}

Fp8Format fp8_format(int32_t code, const char* op) {
  check_arg(code == DSA_FP8_FORMAT_E4M3FN || code == DSA_FP8_FORMAT_E5M2, op, "fp8_format",
            std::to_string(code), "DSA_FP8_FORMAT_E4M3FN or DSA_FP8_FORMAT_E5M2");
  return code == DSA_FP8_FORMAT_E4M3FN ? Fp8Format::E4M3FN : Fp8Format::E5M2;
}

dsa_status fp8_indexer_scores(const dsa_fp8_indexer_scores_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "fp8_indexer_scores";
    Fp8IndexerInputs fin;
    fin.q_idx = in(a->q_idx, op, "q_idx");
    fin.k_idx = in(a->k_idx, op, "k_idx");
    fin.k_scale = in(a->k_scale, op, "k_scale");
    fin.w = in(a->w, op, "w");
    fin.windows = windows(a->ks, a->ke, fin.k_idx.dim() > 0 ? fin.k_idx.size(0) : 0, op);
    fin.format = fp8_format(a->fp8_format, op);
    out(state().get().fp8_indexer_scores(fin), a->scores, op, "scores");
  });
}

dsa_status paged_indexer_scores(const dsa_paged_indexer_scores_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "paged_indexer_scores";
    check_arg(a->scores != nullptr && a->scores->ndim == 2, op, "scores", "NULL or not rank 2",
              "an output [batch·next_n, max_context]");
    PagedIndexerInputs pin;
    pin.q_idx = in(a->q_idx, op, "q_idx");
    pin.k_cache = in(a->k_cache, op, "k_cache");
    pin.k_scale_cache = in(a->k_scale_cache, op, "k_scale_cache");
    pin.w = in(a->w, op, "w");
    pin.block_table = in(a->block_table, op, "block_table");
    pin.context_lens = in(a->context_lens, op, "context_lens");
    pin.max_context = a->scores->shape[1];
    pin.format = fp8_format(a->fp8_format, op);
    out(state().get().paged_indexer_scores(pin), a->scores, op, "scores");
  });
}

dsa_status sparse_mla_fp8_fwd(const dsa_sparse_mla_fp8_fwd_args* a, char* err, size_t n) {
  return guarded(err, n, [&] {
    const char* op = "sparse_mla_fp8_fwd";
    SparseMlaFp8Inputs min;
    min.q = in(a->q, op, "q");
    min.kv_cache = in(a->kv_cache, op, "kv_cache");
    min.indices = in(a->indices, op, "indices");
    min.topk_length = in_opt(a->topk_length, op, "topk_length");
    min.attn_sink = in_opt(a->attn_sink, op, "attn_sink");
    min.sm_scale = a->sm_scale;
    SparseMlaForward f = state().get().sparse_mla_fp8_forward(min);
    out(f.out, a->out, op, "out");
    out(f.lse, a->lse, op, "lse");
    out(f.max_logits, a->max_logits, op, "max_logits");
  });
}

dsa_status is_available(char* err, size_t n) {
  try {
    std::string why = state().get().unavailable_reason();
    if (why.empty()) return DSA_STATUS_OK;
    write_err(err, n, why);
    return DSA_STATUS_UNAVAILABLE;
  } catch (const std::exception& e) {
    write_err(err, n, e.what());
    return DSA_STATUS_UNAVAILABLE;
  }
}

}  // namespace

dsa_capabilities reference_like_capabilities() {
  dsa_capabilities caps{};
  caps.ops = DSA_OP_ALL_V1_1;
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
  return caps;
}

const dsa_backend_v1* make_adapter_table(const char* name, const char* version,
                                         const dsa_capabilities& caps,
                                         std::function<std::unique_ptr<Backend>()> factory,
                                         uint32_t provided_outputs, uint32_t rounding_models,
                                         uint32_t fp8_declarations) {
  static std::once_flag built;
  std::call_once(built, [&] {
    AdapterState& s = state();
    s.factory = std::move(factory);
    dsa_backend_v1& t = s.table;
    t.abi_version = DSA_BACKEND_ABI_VERSION;
    t.struct_size = sizeof(dsa_backend_v1);
    t.name = name;
    t.version = version;
    t.caps = caps;
    t.provided_outputs = provided_outputs;
    t.is_available = &is_available;
    const uint32_t ops = caps.ops;
    t.indexer_scores = (ops & DSA_OP_INDEXER_SCORES) ? &indexer_scores : nullptr;
    t.indexer_scores_backward =
        (ops & DSA_OP_INDEXER_SCORES_BACKWARD) ? &indexer_scores_backward : nullptr;
    t.topk_indices = (ops & DSA_OP_TOPK_INDICES) ? &topk_indices : nullptr;
    t.sparse_mla_fwd = (ops & DSA_OP_SPARSE_MLA_FWD) ? &sparse_mla_fwd : nullptr;
    t.sparse_mla_bwd = (ops & DSA_OP_SPARSE_MLA_BWD) ? &sparse_mla_bwd : nullptr;
    t.indexer_kl_loss = (ops & DSA_OP_INDEXER_KL_LOSS) ? &indexer_kl_loss : nullptr;
    t.fp8_caps = (ops & ~DSA_OP_ALL_V1) ? (DSA_FP8_CAP_E4M3FN | DSA_FP8_CAP_E5M2 | fp8_declarations) : 0u;
    t.fp8_indexer_scores = (ops & DSA_OP_FP8_INDEXER_SCORES) ? &fp8_indexer_scores : nullptr;
    t.paged_indexer_scores = (ops & DSA_OP_PAGED_INDEXER_SCORES) ? &paged_indexer_scores : nullptr;
    t.sparse_mla_fp8_fwd = (ops & DSA_OP_SPARSE_MLA_FP8_FWD) ? &sparse_mla_fp8_fwd : nullptr;
    t.rounding_models = rounding_models;
  });
  return &state().table;
}

}  // namespace dsa::plugin
