// DSA block / recompute properties (SPEC §8) on the oracle's block runner.
#include "dsa/oracle/report.h"
#include "dsa/reference/sparse_mla.h"
#include "src/props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

const std::vector<Op> kBlockOps = {Op::IndexerScores, Op::Topk, Op::SparseMlaFwd, Op::SparseMlaBwd};

bool grads_equal(const SparseMlaGrads& a, const SparseMlaGrads& b) {
  return oracle::bitwise_equal(a.dq, b.dq) && oracle::bitwise_equal(a.dkv, b.dkv);
}

// Top-k runs once in forward; in backward zero times under save_dsa_indexer and none, once
// under full.
void save_dsa_indexer_zero_topk_in_replay(Backend& b, const BlockFactory& make_block) {
  const BlockCase c = draw_block_case();
  DumpOnFailure dump([&] { return to_fixture(c); });
  for (RecomputePolicy p : {RecomputePolicy::None, RecomputePolicy::Full, RecomputePolicy::SaveDsaIndexer}) {
    auto block = make_block(b, p);
    block->forward(1, c.in);
    block->backward(1, c.dout);
    RC_ASSERT(block->counters().topk_forward == 1);
    RC_ASSERT(block->counters().topk_backward == (p == RecomputePolicy::Full ? 1 : 0));
  }
}

// Gradients are identical across the three policies (bitwise on a deterministic backend).
void gradients_equal_across_policies(Backend& b, const BlockFactory& make_block) {
  const BlockCase c = draw_block_case();
  DumpOnFailure dump([&] { return to_fixture(c); });
  RC_ASSERT(!all_zero(c.in.q) && !all_zero(c.in.kv) && !all_zero(c.dout));
  std::vector<SparseMlaGrads> g;
  for (RecomputePolicy p : {RecomputePolicy::None, RecomputePolicy::Full, RecomputePolicy::SaveDsaIndexer}) {
    auto block = make_block(b, p);
    block->forward(1, c.in);
    g.push_back(block->backward(1, c.dout));
  }
  RC_ASSERT(!all_zero(g[0].dkv));  // dq may be 0 (one key: dS = 0); dkv carries p·dout
  if (b.deterministic()) {
    RC_ASSERT(grads_equal(g[0], g[1]));
    RC_ASSERT(grads_equal(g[0], g[2]));
  }
}

// Interleaved micro-batches F1, F2, B1, B2 each replay with their own ids: gradients equal
// those of the isolated schedule.
void interleaved_microbatches_own_ids(Backend& b, const BlockFactory& make_block) {
  const BlockCase c1 = draw_block_case();
  BlockCase c2 = c1;
  // Second micro-batch: same shapes, reversed indexer queries, so its ids differ.
  const int64_t s_q = c1.in.q_idx.size(0), row = c1.in.q_idx.numel() / s_q;
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t i = 0; i < row; ++i)
      c2.in.q_idx.set(t * row + i, -c1.in.q_idx.get((s_q - 1 - t) * row + i));
  DumpOnFailure dump([&] { return to_fixture(c1); });
  for (RecomputePolicy p : {RecomputePolicy::None, RecomputePolicy::Full, RecomputePolicy::SaveDsaIndexer}) {
    auto iso = make_block(b, p);
    iso->forward(1, c1.in);
    const SparseMlaGrads g1 = iso->backward(1, c1.dout);
    iso->forward(2, c2.in);
    const SparseMlaGrads g2 = iso->backward(2, c2.dout);
    auto mixed = make_block(b, p);
    mixed->forward(1, c1.in);
    mixed->forward(2, c2.in);
    const SparseMlaGrads m1 = mixed->backward(1, c1.dout);
    const SparseMlaGrads m2 = mixed->backward(2, c2.dout);
    if (b.deterministic()) {
      RC_ASSERT(grads_equal(g1, m1));
      RC_ASSERT(grads_equal(g2, m2));
    } else {
      // Non-deterministic kernels: the interleaved gradients by the ratio rule against the
      // reference run with this micro-batch's own ids (policy small fixes the set).
      SparseMlaInputs a;
      a.q = c1.in.q;
      a.kv = c1.in.kv;
      a.sm_scale = c1.in.sm_scale;
      a.d_v = c1.in.d_v;
      a.indices = b.select_topk(b.indexer_scores(c1.in.q_idx, c1.in.k_idx, c1.in.w, c1.in.windows),
                                c1.in.k, c1.in.policy, c1.in.windows);
      oracle::OpCase oc;
      oc.mla = a;
      oc.dout = c1.dout;
      oracle::CheckOptions only;
      only.provided_outputs = std::set<std::string>{"dq", "dkv"};
      const oracle::OpReport r = oracle::judge_outputs(
          oracle::Op::SparseMlaBwd, oc, {{"dq", m1.dq}, {"dkv", m1.dkv}}, only, b.name());
      DSA_PROP_ASSERT_PASSED(r);
    }
  }
}

}  // namespace

void add_block_properties(std::vector<Property>& out) {
  out.push_back({"block.save_dsa_indexer_zero_topk_in_replay", kBlockOps, 2, save_dsa_indexer_zero_topk_in_replay});
  out.push_back({"block.gradients_equal_across_policies", kBlockOps, 2, gradients_equal_across_policies});
  out.push_back({"block.interleaved_microbatches_own_ids", kBlockOps, 2, interleaved_microbatches_own_ids});
}

}  // namespace dsa::props
