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

// Normalised attention weights with the sink as an extra logit of zero value (SPEC §4-§5):
// p_j = exp(P_j - m) / (Σ_i exp(P_i - m) + exp(sink - m)), w_sink = exp(sink - m) / (same),
// m = max(max_j P_j, sink). Normalising (rather than exp(P - lse)) keeps equal logits exactly
// equal weights (duplicates, ties), so exact cancellations stay exact. A +inf sink takes all
// the mass (p = 0, w_sink = 1), a -inf sink none; empty rows get p = 0 and w_sink = 0.
struct Weights {
  at::Tensor e;       // [s_q, h_q, k] unnormalised exp(P - m), 0 where p is forced to 0
  at::Tensor denom;   // [s_q, h_q, 1] Σ e (+ exp(sink - m)); 1 where p is forced to 0
  at::Tensor p;       // [s_q, h_q, k]
  at::Tensor w_sink;  // [s_q, h_q], undefined without a sink
};

Weights attention_weights(const at::Tensor& P, const at::Tensor& empty,
                          const c10::optional<at::Tensor>& attn_sink, at::ScalarType cdt) {
  const auto empty3 = empty.unsqueeze(2);
  auto m = std::get<0>(P.max(2, /*keepdim=*/true)).masked_fill(empty3, 0);  // [s_q, h_q, 1]
  const bool has_sink = attn_sink.has_value() && attn_sink->defined();
  at::Tensor sink, sink_finite, sink_posinf;
  if (has_sink) {
    sink = attn_sink->to(cdt).view({1, -1, 1});
    sink_finite = sink.isfinite();
    m = at::where(sink_finite, at::maximum(m, sink), m);
  }
  const auto e = (P - m).exp_();
  auto denom = e.sum(2, /*keepdim=*/true);
  at::Tensor es;
  if (has_sink) {
    es = at::where(sink_finite, (sink - m).exp(), at::zeros({}, e.options()));
    denom = denom + es;
  }
  Weights w;
  auto forced_zero = empty3;  // rows whose p is 0 by rule: empty, or a +inf sink
  if (has_sink) {
    sink_posinf = sink.eq(kInf);
    forced_zero = forced_zero.logical_or(sink_posinf);
    w.w_sink = (es / denom).masked_fill_(sink_posinf, 1).masked_fill_(empty3, 0).squeeze(2);
  }
  w.e = e.masked_fill(forced_zero, 0);
  w.denom = denom.masked_fill(forced_zero, 1);
  w.p = w.e / w.denom;
  return w;
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
  // Sink-scaled weights: exp(P - lse)·exp(lse)/(exp(lse)+exp(sink)) = softmax over P ∪ {sink}.
  const auto w = attention_weights(g.P, empty, attn_sink, cdt);
  const auto out = at::matmul(w.p, g.kvg.narrow(2, 0, d_v));       // [s_q, h_q, d_v], 0 if empty
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
  // L = ln(exp(lse) + exp(sink)); p_j = exp(P_j - L), recomputed normalised (see above).
  const auto w = attention_weights(g.P, empty, attn_sink, cdt);
  const auto& p = w.p;
  const auto& w_sink = w.w_sink;  // exp(sink - L)
  const auto doutf = dout.to(cdt);
  const auto vg = g.kvg.narrow(2, 0, d_v);                                        // [s_q, k, d_v]
  const auto dpv = at::matmul(doutf, vg.transpose(1, 2));                         // [s_q, h_q, k]
  // Δ = out·dout recomputed as (Σ_j e_j (dout·v_j)) / denom at the compute precision: the
  // sink-scaled out·dout without the rounding of a bf16 out, and exactly dout·v when every
  // valid slot holds the same row (duplicates), so dS cancels to exactly 0 there.
  const auto delta = (w.e * dpv).sum(2, /*keepdim=*/true).div_(w.denom).squeeze(2);
  const auto dS = p * (dpv - delta.unsqueeze(2));                                 // [s_q, h_q, k]
  const auto dq = at::matmul(dS, g.kvg).mul_(sm_scale);                           // [s_q, h_q, d_qk]
  auto dkvg = at::matmul(dS.transpose(1, 2), g.qf).mul_(sm_scale);               // [s_q, k, d_qk]
  dkvg.narrow(2, 0, d_v).add_(at::matmul(p.transpose(1, 2), doutf));
  dkvg.masked_fill_(g.valid.logical_not().unsqueeze(2), 0);
  // Every selecting (query, head, slot) adds into its key row; duplicates accumulate.
  auto dkv = at::zeros({s.s_kv, s.d_qk}, q.options().dtype(cdt));
  if (s.s_kv > 0) dkv.index_add_(0, g.safe.reshape({-1}), dkvg.reshape({-1, s.d_qk}));
  if (has_sink) {
    // dsink sums Δ of either sign over rows and cancels: Δ and the sum are taken in f64.
    const auto d64 = at::matmul(dout.to(at::kDouble), vg.to(at::kDouble).transpose(1, 2));
    const auto delta64 =
        (w.e.to(at::kDouble) * d64).sum(2, /*keepdim=*/true).div_(w.denom.to(at::kDouble)).squeeze(2);
    dsink = (w_sink.to(at::kDouble) * delta64).sum(0).neg().to(cdt);
  }
  return {dq.to(q.scalar_type()), dkv, dsink};
}

}  // namespace dsa::optimized::kernels
