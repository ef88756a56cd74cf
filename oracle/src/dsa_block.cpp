#include "dsa/oracle/dsa_block.h"

#include <stdexcept>
#include <string>

namespace dsa::oracle {

Tensor DsaBlock::select_ids(const BlockInputs& in, bool in_backward) {
  const Tensor scores = backend_.indexer_scores(in.q_idx, in.k_idx, in.w, in.windows);
  (in_backward ? counters_.topk_backward : counters_.topk_forward) += 1;
  return backend_.select_topk(scores, in.k, in.policy, in.windows);
}

SparseMlaInputs DsaBlock::attention_inputs(const BlockInputs& in, const Tensor& ids) const {
  SparseMlaInputs a;
  a.q = in.q;
  a.kv = in.kv;
  a.indices = ids;
  a.attn_sink = in.attn_sink;
  a.sm_scale = in.sm_scale;
  a.d_v = in.d_v;
  return a;
}

SparseMlaForward DsaBlock::forward(int mb, const BlockInputs& in) {
  Tensor ids = select_ids(in, false);
  SparseMlaForward out = backend_.sparse_mla_forward(attention_inputs(in, ids));
  Saved s{in, std::nullopt};
  if (policy_ != RecomputePolicy::Full) s.ids = std::move(ids);
  saved_[mb] = std::move(s);
  return out;
}

SparseMlaGrads DsaBlock::backward(int mb, const Tensor& dout) {
  auto it = saved_.find(mb);
  if (it == saved_.end())
    throw std::logic_error("DsaBlock::backward: micro-batch " + std::to_string(mb) +
                           " has no saved forward");
  Saved s = std::move(it->second);
  saved_.erase(it);
  const Tensor ids = s.ids ? *s.ids : select_ids(s.in, true);
  return backend_.sparse_mla_backward(attention_inputs(s.in, ids), dout);
}

BlockFactory default_block_factory() {
  return [](Backend& b, RecomputePolicy p) { return std::make_unique<DsaBlock>(b, p); };
}

}  // namespace dsa::oracle
