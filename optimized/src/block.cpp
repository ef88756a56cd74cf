// The DSA block with recompute policies as a C++ checkpoint (SPEC §8).
#include "dsa/optimized/block.h"

#include <torch/torch.h>

#include <unordered_set>

#include "autograd_nodes.h"
#include "dsa/optimized/autograd.h"
#include "dsa/optimized/topk.h"

#include "optional_tensor.h"

namespace dsa::optimized {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// Tensor arguments of one block, in the checkpoint's argument order.
enum Slot { kQIdx, kKIdx, kW, kQ, kKv, kKs, kKe, kSink, kSharedIds, kNumInputs };

struct Run {
  at::Tensor out, loss, ids;
};

// One pass of the block in the current grad mode. `ids` undefined: run top-k on the
// indexer scores. `own_indexer` false: a layer sharing ids (no indexer, no loss).
Run run_block(const variable_list& x, const at::Tensor& ids, const DsaBlockConfig& cfg,
              bool own_indexer) {
  Run r;
  r.ids = ids;
  at::Tensor scores;
  if (own_indexer && (cfg.with_kl_loss || !r.ids.defined())) {
    scores = autograd::indexer_scores(x[kQIdx], x[kKIdx], x[kW], x[kKs], x[kKe]);
  }
  if (!r.ids.defined()) {
    torch::NoGradGuard no_grad;
    r.ids = topk_indices(scores.detach(), cfg.topk, cfg.topk_policy, opt(x[kKs]), opt(x[kKe]));
  }
  r.out = std::get<0>(autograd::sparse_mla(x[kQ], x[kKv], r.ids, cfg.sm_scale, cfg.d_v,
                                           at::Tensor(), x[kSink]));
  if (own_indexer && cfg.with_kl_loss) {
    r.loss = autograd::indexer_kl_loss(scores, x[kQ], x[kKv], cfg.sm_scale, x[kKs], x[kKe],
                                       to_string(cfg.kl_mode), r.ids, cfg.kl_coeff);
  }
  return r;
}

void put_config(AutogradContext* ctx, const DsaBlockConfig& c) {
  ctx->saved_data["topk"] = c.topk;
  ctx->saved_data["tie_break"] = static_cast<int64_t>(c.topk_policy.tie_break);
  ctx->saved_data["sorted"] = c.topk_policy.sorted;
  ctx->saved_data["sm_scale"] = c.sm_scale;
  ctx->saved_data["d_v"] = c.d_v;
  ctx->saved_data["recompute"] = static_cast<int64_t>(c.recompute);
  ctx->saved_data["with_kl_loss"] = c.with_kl_loss;
  ctx->saved_data["kl_mode"] = static_cast<int64_t>(c.kl_mode);
  ctx->saved_data["kl_coeff"] = c.kl_coeff;
}

DsaBlockConfig get_config(AutogradContext* ctx) {
  DsaBlockConfig c;
  c.topk = ctx->saved_data["topk"].toInt();
  c.topk_policy.tie_break = static_cast<TieBreak>(ctx->saved_data["tie_break"].toInt());
  c.topk_policy.sorted = ctx->saved_data["sorted"].toBool();
  c.sm_scale = ctx->saved_data["sm_scale"].toDouble();
  c.d_v = ctx->saved_data["d_v"].toInt();
  c.recompute = static_cast<RecomputePolicy>(ctx->saved_data["recompute"].toInt());
  c.with_kl_loss = ctx->saved_data["with_kl_loss"].toBool();
  c.kl_mode = static_cast<KlMode>(ctx->saved_data["kl_mode"].toInt());
  c.kl_coeff = ctx->saved_data["kl_coeff"].toDouble();
  return c;
}

// Checkpoint: forward runs without grad and saves only the inputs (plus the ids under
// save_dsa_indexer); backward replays the block with grad enabled and backpropagates.
struct DsaBlockCheckpointFn : torch::autograd::Function<DsaBlockCheckpointFn> {
  static variable_list forward(AutogradContext* ctx, const OptT& q_idx, const OptT& k_idx,
                               const OptT& w, const at::Tensor& q, const at::Tensor& kv,
                               const OptT& ks, const OptT& ke, const OptT& sink,
                               const OptT& shared, const DsaBlockConfig& cfg) {
    const variable_list x{val(q_idx), val(k_idx), val(w), q, kv, val(ks), val(ke), val(sink),
                          val(shared)};
    const at::Tensor& shared_ids = x[kSharedIds];
    int64_t requires_grad = 0;  // which inputs to differentiate in the replay
    for (int i = 0; i < kNumInputs; ++i)
      if (x[i].defined() && x[i].requires_grad()) requires_grad |= int64_t{1} << i;
    ctx->saved_data["requires_grad"] = requires_grad;
    const bool own = !shared_ids.defined();
    Run r = run_block(x, shared_ids, cfg, own);  // grad mode is off inside forward
    variable_list to_save = x;
    const bool keep_ids = own && cfg.recompute == RecomputePolicy::SaveDsaIndexer;
    to_save.push_back(keep_ids ? r.ids : at::Tensor());
    ctx->save_for_backward(to_save);
    put_config(ctx, cfg);
    const bool has_loss = r.loss.defined();
    ctx->saved_data["has_loss"] = has_loss;
    auto loss = has_loss ? r.loss : at::zeros({1}, r.out.options().dtype(at::kFloat));
    auto ids = own ? r.ids : at::empty({0}, r.out.options().dtype(at::kInt));
    if (has_loss) {
      ctx->mark_non_differentiable({ids});
    } else {
      ctx->mark_non_differentiable({loss, ids});
    }
    return {r.out, loss, ids};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto cfg = get_config(ctx);
    const bool own = !saved[kSharedIds].defined();
    variable_list x(saved.begin(), saved.begin() + kNumInputs);
    variable_list wrt;
    std::vector<int> wrt_slot;
    for (int i = 0; i < kNumInputs; ++i) {
      if (!x[i].defined()) continue;
      x[i] = x[i].detach();
      if ((ctx->saved_data["requires_grad"].toInt() >> i) & 1) {
        x[i].requires_grad_(true);
        wrt.push_back(x[i]);
        wrt_slot.push_back(i);
      }
    }
    variable_list result(kNumInputs + 1);
    if (wrt.empty()) return result;
    // Replay: under save_dsa_indexer the saved ids (no top-k); a sharing layer its given
    // ids; under full the replay runs top-k again.
    const at::Tensor ids = own ? saved[kNumInputs] : saved[kSharedIds];
    torch::AutoGradMode enable_grad(true);
    Run r = run_block(x, ids, cfg, own);
    variable_list outs{r.out}, douts{grads[0]};
    if (r.loss.defined() && ctx->saved_data["has_loss"].toBool()) {
      outs.push_back(r.loss);
      douts.push_back(grads[1]);
    }
    auto g = torch::autograd::grad(outs, wrt, douts, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t j = 0; j < wrt.size(); ++j) result[wrt_slot[j]] = g[j];
    return result;
  }
};

void check_inputs(const DsaBlockInputs& in, const DsaBlockConfig& cfg, bool own) {
  const char* op = "dsa::dsa_block";
  TORCH_CHECK(in.q.defined(), op, ": argument 'q' is undefined, expected [s_q, h_q, d_qk]");
  TORCH_CHECK(in.kv.defined(), op, ": argument 'kv' is undefined, expected [s_kv, d_qk]");
  if (own) {
    TORCH_CHECK(in.q_idx.defined(), op,
                ": argument 'q_idx' is undefined, expected [s_q, H_I, d_I] (or pass shared ids)");
    TORCH_CHECK(in.k_idx.defined(), op,
                ": argument 'k_idx' is undefined, expected [s_kv, d_I] (or pass shared ids)");
    TORCH_CHECK(in.w.defined(), op,
                ": argument 'w' is undefined, expected [s_q, H_I] (or pass shared ids)");
  }
  TORCH_CHECK(cfg.topk >= 0, op, ": argument 'topk' is ", cfg.topk, ", expected >= 0");
}

}  // namespace

DsaBlockOutputs dsa_block(const DsaBlockInputs& in, const DsaBlockConfig& config,
                          const at::Tensor& shared_indices) {
  const bool own = !shared_indices.defined();
  check_inputs(in, config, own);
  DsaBlockOutputs o;
  if (config.recompute == RecomputePolicy::None) {
    const variable_list x{in.q_idx, in.k_idx, in.w, in.q, in.kv, in.ks, in.ke, in.attn_sink,
                          shared_indices};
    Run r = run_block(x, shared_indices, config, own);
    o.out = r.out;
    o.kl_loss = r.loss;
    o.indices = r.ids;
    return o;
  }
  auto r = DsaBlockCheckpointFn::apply(opt(in.q_idx), opt(in.k_idx), opt(in.w), in.q, in.kv,
                                       opt(in.ks), opt(in.ke), opt(in.attn_sink),
                                       opt(shared_indices), config);
  o.out = r[0];
  if (own && config.with_kl_loss) o.kl_loss = r[1];
  o.indices = own ? r[2] : shared_indices;
  return o;
}

SavedBytes block_saved_bytes(const DsaBlockOutputs& outputs, const DsaBlockInputs& in,
                             const at::Tensor& shared_indices) {
  std::unordered_set<const void*> input_storages;
  for (const auto* t : {&in.q_idx, &in.k_idx, &in.w, &in.q, &in.kv, &in.ks, &in.ke,
                        &in.attn_sink, &shared_indices}) {
    if (t->defined()) input_storages.insert(t->storage().data());
  }
  // Nodes that produced the inputs belong to earlier layers: never walk into them.
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto* t : {&in.q_idx, &in.k_idx, &in.w, &in.q, &in.kv, &in.attn_sink}) {
    if (t->defined() && t->grad_fn()) seen.insert(t->grad_fn().get());
  }
  std::vector<torch::autograd::Node*> stack;
  for (const auto* t : {&outputs.out, &outputs.kl_loss}) {
    if (t->defined() && t->grad_fn()) stack.push_back(t->grad_fn().get());
  }
  SavedBytes b;
  std::unordered_set<const void*> counted;
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    std::vector<at::Tensor> saved;
    if (auto* cp = dynamic_cast<torch::autograd::CppNode<DsaBlockCheckpointFn>*>(node)) {
      saved = cp->ctx_.get_saved_variables();
    } else if (!detail::saved_tensors_of_op_node(node, &saved)) {
      continue;  // not a dsa node: outside the block
    }
    for (const auto& t : saved) {
      if (!t.defined()) continue;
      const void* key = t.storage().data();
      if (!counted.insert(key).second) continue;
      const auto bytes = static_cast<int64_t>(t.storage().nbytes());
      (input_storages.count(key) ? b.input_bytes : b.extra_bytes) += bytes;
    }
    for (const auto& e : node->next_edges()) {
      if (e.function) stack.push_back(e.function.get());
    }
  }
  return b;
}

}  // namespace dsa::optimized
