// torch::autograd::Function wrappers wiring each forward op to its backward op.
#include "dsa/optimized/autograd.h"

#include <torch/torch.h>

#include "autograd_nodes.h"
#include "dsa/optimized/indexer.h"
#include "dsa/optimized/kl_loss.h"
#include "dsa/optimized/sparse_mla.h"

#include "optional_tensor.h"

namespace dsa::optimized::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


struct IndexerScoresFn : torch::autograd::Function<IndexerScoresFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_idx, const at::Tensor& k_idx,
                            const at::Tensor& w, const OptT& ks, const OptT& ke) {
    ctx->save_for_backward({q_idx, k_idx, w, val(ks), val(ke)});
    return optimized::indexer_scores(q_idx, k_idx, w, ks, ke);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto g = optimized::indexer_scores_backward(s[0], s[1], s[2], grads[0].contiguous(),
                                                opt(s[3]), opt(s[4]));
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor()};
  }
};

struct SparseMlaFn : torch::autograd::Function<SparseMlaFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& kv,
                               const at::Tensor& indices, const OptT& topk_length,
                               const OptT& attn_sink, double sm_scale, int64_t d_v) {
    auto r = optimized::sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
    auto& out = std::get<0>(r);
    auto& lse = std::get<1>(r);
    auto& max_logits = std::get<2>(r);
    ctx->mark_non_differentiable({lse, max_logits});
    ctx->save_for_backward({q, kv, indices, val(topk_length), val(attn_sink), out, lse});
    ctx->saved_data["sm_scale"] = sm_scale;
    ctx->saved_data["d_v"] = d_v;
    return {out, lse, max_logits};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto& q = s[0];
    const auto& kv = s[1];
    const auto& sink = s[4];
    auto g = optimized::sparse_mla_bwd(q, kv, s[2], s[5], s[6], grads[0].contiguous(),
                                       ctx->saved_data["sm_scale"].toDouble(),
                                       ctx->saved_data["d_v"].toInt(), opt(s[3]), opt(sink));
    at::Tensor dsink;
    if (sink.defined()) dsink = std::get<2>(g).to(sink.scalar_type());
    return {std::get<0>(g), std::get<1>(g).to(kv.scalar_type()), at::Tensor(), at::Tensor(),
            dsink, at::Tensor(), at::Tensor()};
  }
};

struct IndexerKlFn : torch::autograd::Function<IndexerKlFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, const at::Tensor& q,
                            const at::Tensor& kv, const OptT& ks, const OptT& ke,
                            const OptT& indices, double sm_scale, const std::string& mode,
                            double coeff) {
    auto r = optimized::indexer_kl_loss(scores, q, kv, sm_scale, ks, ke, mode, indices, coeff);
    ctx->save_for_backward({std::get<1>(r)});
    ctx->saved_data["scores_dtype"] = static_cast<int64_t>(scores.scalar_type());
    return std::get<0>(r);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["scores_dtype"].toInt());
    auto d_scores = (s[0] * grads[0].to(s[0].scalar_type())).to(dtype);
    return {d_scores, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

template <class Fn>
bool append_saved(torch::autograd::Node* node, std::vector<at::Tensor>* saved) {
  auto* n = dynamic_cast<torch::autograd::CppNode<Fn>*>(node);
  if (n == nullptr) return false;
  for (auto& t : n->ctx_.get_saved_variables()) saved->push_back(t);
  return true;
}

}  // namespace

at::Tensor indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                          const at::Tensor& ks, const at::Tensor& ke) {
  return IndexerScoresFn::apply(q_idx, k_idx, w, opt(ks), opt(ke));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const at::Tensor& topk_length, const at::Tensor& attn_sink) {
  auto r = SparseMlaFn::apply(q, kv, indices, opt(topk_length), opt(attn_sink), sm_scale, d_v);
  return {r[0], r[1], r[2]};
}

at::Tensor indexer_kl_loss(const at::Tensor& scores, const at::Tensor& q, const at::Tensor& kv,
                           double sm_scale, const at::Tensor& ks, const at::Tensor& ke,
                           const std::string& mode, const at::Tensor& indices, double coeff) {
  return IndexerKlFn::apply(scores, q.detach(), kv.detach(), opt(ks), opt(ke), opt(indices),
                            sm_scale, mode, coeff);
}

}  // namespace dsa::optimized::autograd

namespace dsa::optimized::detail {

bool saved_tensors_of_op_node(torch::autograd::Node* node, std::vector<at::Tensor>* saved) {
  using namespace dsa::optimized::autograd;
  return append_saved<IndexerScoresFn>(node, saved) || append_saved<SparseMlaFn>(node, saved) ||
         append_saved<IndexerKlFn>(node, saved);
}

}  // namespace dsa::optimized::detail
