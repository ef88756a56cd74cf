// Composite sparse MLA forward and backward (SPEC §4-§6): mask before gather, index_add
// for dkv, natural-log LSE, sink as an extra logit with a zero value vector.
#include "internal.h"
#include "kernels.h"

#include <limits>

namespace dsa::optimized::kernels {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct MlaShapes {
  int64_t s_q, h_q, d_qk, s_kv, k;
};

struct MlaArgs {
  MlaShapes s;
  at::Tensor ids2d;  // [s_q, k] as given (int32)
};

MlaArgs check_mla(const char* op, const at::Tensor& q, const at::Tensor& kv,
                  const at::Tensor& indices, double sm_scale, int64_t d_v,
                  const c10::optional<at::Tensor>& topk_length,
                  const c10::optional<at::Tensor>& attn_sink) {
  using namespace detail;
  check_rank(op, "q", q, 3, "[s_q, h_q, d_qk]");
  check_rank(op, "kv", kv, 2, "[s_kv, d_qk]");
  check_float(op, "q", q, true);
  check_float(op, "kv", kv, true);
  check_device(op, "kv", kv, q.device());
  MlaShapes s{q.size(0), q.size(1), q.size(2), kv.size(0), 0};
  check_dim(op, "kv", kv, 1, s.d_qk, "[s_kv, d_qk]");
  TORCH_CHECK(indices.defined(), op, ": argument 'indices' is undefined, expected shape [s_q, k]");
  TORCH_CHECK(indices.dim() == 2 || (indices.dim() == 3 && indices.size(1) == 1), op,
              ": argument 'indices' has shape ", sizes_str(indices.sizes()),
              ", expected shape [s_q, k] or [s_q, 1, k]");
  check_dim(op, "indices", indices, 0, s.s_q, "[s_q, k]");
  check_int(op, "indices", indices, false);
  check_device(op, "indices", indices, q.device());
  s.k = indices.size(-1);
  TORCH_CHECK(d_v > 0 && d_v <= s.d_qk, op, ": argument 'd_v' is ", d_v,
              ", expected 0 < d_v <= d_qk = ", s.d_qk);
  TORCH_CHECK(std::isfinite(sm_scale), op, ": argument 'sm_scale' is ", sm_scale,
              ", expected a finite value");
  if (topk_length.has_value() && topk_length->defined()) {
    check_rank(op, "topk_length", *topk_length, 1, "[s_q]");
    check_dim(op, "topk_length", *topk_length, 0, s.s_q, "[s_q]");
    check_int(op, "topk_length", *topk_length, false);
    check_device(op, "topk_length", *topk_length, q.device());
  }
  if (attn_sink.has_value() && attn_sink->defined()) {
    check_rank(op, "attn_sink", *attn_sink, 1, "[h_q]");
    check_dim(op, "attn_sink", *attn_sink, 0, s.h_q, "[h_q]");
    check_float(op, "attn_sink", *attn_sink, false);
    check_device(op, "attn_sink", *attn_sink, q.device());
  }
  return {s, indices.reshape({s.s_q, s.k})};
}

// Everything the forward and the backward share: gathered kv rows (invalid slots read the
// safe id 0 and are masked), masked logits P (-inf on invalid slots), per-row emptiness.
struct Gathered {
  at::Tensor valid;    // [s_q, k] bool
  at::Tensor safe;     // [s_q, k] int64, invalid → 0
  at::Tensor kvg;      // [s_q, k, d_qk] compute dtype, zero rows on invalid slots
  at::Tensor qf;       // [s_q, h_q, d_qk] compute dtype
  at::Tensor P;        // [s_q, h_q, k] sm_scale·q·kv, -inf on invalid slots
  at::Tensor empty;    // [s_q, 1] bool: no valid slot
};

Gathered gather(const MlaShapes& s, const at::Tensor& q, const at::Tensor& kv,
                const at::Tensor& ids2d, double sm_scale,
                const c10::optional<at::Tensor>& topk_length, at::ScalarType cdt) {
  Gathered g;
  std::tie(g.valid, g.safe) = detail::valid_slots(ids2d, s.s_kv, topk_length);
  g.qf = q.to(cdt);
  if (s.s_kv == 0) {
    g.kvg = at::zeros({s.s_q, s.k, s.d_qk}, g.qf.options());
  } else {
    g.kvg = kv.to(cdt).index_select(0, g.safe.reshape({-1})).reshape({s.s_q, s.k, s.d_qk});
    g.kvg = g.kvg.masked_fill(g.valid.logical_not().unsqueeze(2), 0);
  }
  g.P = at::matmul(g.qf, g.kvg.transpose(1, 2)).mul_(sm_scale);
  g.P.masked_fill_(g.valid.logical_not().unsqueeze(1), -kInf);
  g.empty = g.valid.logical_not().all(1, /*keepdim=*/true);
  return g;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const c10::optional<at::Tensor>& topk_length,
    const c10::optional<at::Tensor>& attn_sink) {
  const char* op = "dsa::sparse_mla_fwd";
  const auto a = check_mla(op, q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  const auto& s = a.s;
  const auto cdt = detail::compute_dtype({q, kv});
  const auto fopts = q.options().dtype(cdt);
  if (s.k == 0) {  // every row empty (SPEC §6)
    return {at::zeros({s.s_q, s.h_q, d_v}, q.options()), at::full({s.s_q, s.h_q}, kInf, fopts),
            at::full({s.s_q, s.h_q}, -kInf, fopts)};
  }
  const auto g = gather(s, q, kv, a.ids2d, sm_scale, topk_length, cdt);
  const auto empty = g.empty.expand({s.s_q, s.h_q});
  const auto max_logits = std::get<0>(g.P.max(2));                  // -inf on empty rows
  auto lse = at::logsumexp(g.P, 2).masked_fill(empty, kInf);        // natural log; +inf empty
  const auto p = (g.P - lse.unsqueeze(2)).exp_();                   // 0 on invalid / empty
  auto out = at::matmul(p, g.kvg.narrow(2, 0, d_v));                // [s_q, h_q, d_v]
  if (attn_sink.has_value() && attn_sink->defined()) {
    // exp(lse)/(exp(lse)+exp(sink)) = sigmoid(lse - sink); ±inf sinks give 0 / 1.
    const auto factor = (lse - attn_sink->to(cdt).unsqueeze(0)).sigmoid_();
    out = out * factor.masked_fill(empty, 0).unsqueeze(2);
  }
  out = out.masked_fill(empty.unsqueeze(2), 0);
  return {out.to(q.scalar_type()), lse, max_logits};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_bwd(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, double sm_scale, int64_t d_v,
    const c10::optional<at::Tensor>& topk_length, const c10::optional<at::Tensor>& attn_sink) {
  const char* op = "dsa::sparse_mla_bwd";
  const auto a = check_mla(op, q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  const auto& s = a.s;
  using namespace detail;
  for (const auto* p : {&out, &dout}) {
    const char* name = p == &out ? "out" : "dout";
    check_rank(op, name, *p, 3, "[s_q, h_q, d_v]");
    check_dim(op, name, *p, 0, s.s_q, "[s_q, h_q, d_v]");
    check_dim(op, name, *p, 1, s.h_q, "[s_q, h_q, d_v]");
    check_dim(op, name, *p, 2, d_v, "[s_q, h_q, d_v]");
    check_float(op, name, *p, true);
    check_device(op, name, *p, q.device());
  }
  check_rank(op, "lse", lse, 2, "[s_q, h_q]");
  check_dim(op, "lse", lse, 0, s.s_q, "[s_q, h_q]");
  check_dim(op, "lse", lse, 1, s.h_q, "[s_q, h_q]");
  check_float(op, "lse", lse, false);
  check_device(op, "lse", lse, q.device());

  const bool has_sink = attn_sink.has_value() && attn_sink->defined();
  const auto cdt = compute_dtype({q, kv});
  const auto fopts = q.options().dtype(cdt);
  auto dsink = has_sink ? at::zeros({s.h_q}, fopts) : at::zeros({0}, fopts);
  if (s.k == 0) return {at::zeros_like(q), at::zeros({s.s_kv, s.d_qk}, fopts), dsink};

  const auto g = gather(s, q, kv, a.ids2d, sm_scale, topk_length, cdt);
  const auto empty = g.empty.expand({s.s_q, s.h_q});
  const auto lsec = lse.to(cdt);
  // p_j = exp(P_j - L) with L = ln(exp(lse) + exp(sink)): exp(P_j - lse)·sigmoid(lse - sink).
  auto p = (g.P - lsec.unsqueeze(2)).exp_();
  at::Tensor w_sink;  // exp(sink - L) = sigmoid(sink - lse), 0 on empty rows
  if (has_sink) {
    const auto sink = attn_sink->to(cdt).unsqueeze(0);
    p = p * (lsec - sink).sigmoid().masked_fill(empty, 0).unsqueeze(2);
    w_sink = (sink - lsec).sigmoid().masked_fill(empty, 0);
  }
  p = p.masked_fill(g.valid.logical_not().unsqueeze(1).logical_or(empty.unsqueeze(2)), 0);
  const auto doutf = dout.to(cdt);
  const auto delta = (out.to(cdt) * doutf).sum(2).masked_fill(empty, 0);       // [s_q, h_q]
  const auto vg = g.kvg.narrow(2, 0, d_v);                                        // [s_q, k, d_v]
  const auto dpv = at::matmul(doutf, vg.transpose(1, 2));                         // [s_q, h_q, k]
  const auto dS = p * (dpv - delta.unsqueeze(2));                                 // [s_q, h_q, k]
  const auto dq = at::matmul(dS, g.kvg).mul_(sm_scale);                           // [s_q, h_q, d_qk]
  auto dkvg = at::matmul(dS.transpose(1, 2), g.qf).mul_(sm_scale);               // [s_q, k, d_qk]
  dkvg.narrow(2, 0, d_v).add_(at::matmul(p.transpose(1, 2), doutf));
  dkvg.masked_fill_(g.valid.logical_not().unsqueeze(2), 0);
  // Every selecting (query, head, slot) adds into its key row; duplicates accumulate.
  auto dkv = at::zeros({s.s_kv, s.d_qk}, q.options().dtype(cdt));
  if (s.s_kv > 0) dkv.index_add_(0, g.safe.reshape({-1}), dkvg.reshape({-1, s.d_qk}));
  if (has_sink) dsink = (w_sink * delta).sum(0).neg();
  return {dq.to(q.scalar_type()), dkv, dsink};
}

}  // namespace dsa::optimized::kernels
