// DSA block / recompute properties (SPEC §8) on the oracle's block runner, and the judgement
// of one block run they share with the block detection property (block_check.h).
#include "dsa/property_tests/block_check.h"

#include <cmath>
#include <memory>

#include "dsa/oracle/case_memo.h"
#include "dsa/oracle/report.h"
#include "dsa/reference/sparse_mla.h"
#include "src/props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

const std::vector<Op> kBlockOps = {Op::IndexerScores, Op::Topk, Op::SparseMlaFwd, Op::SparseMlaBwd};

const RecomputePolicy kPolicies[] = {RecomputePolicy::None, RecomputePolicy::Full,
                                     RecomputePolicy::SaveDsaIndexer};

// Asserts a block judgement: each report as the sparse MLA properties do (a skip declines the
// draw, a draw that judged nothing is redrawn, a WEAK draw fails unless --allow-weak:
// draw_block_case keeps its rows detectable, Detection.GeneratedBlockCasesHaveNoWeakRows),
// then the bytes against the run they must equal. `conditioned` false: a case whose rows the
// generator did not condition (a second micro-batch's ids) is judged with WEAK rows passing
// (every element within its bound), as DSA_PROP_ASSERT_PASSED does.
void assert_block_passed(const BlockJudgement& j, const std::string& what, bool conditioned = true) {
  if (conditioned) {
    DSA_PROP_ASSERT_DETECTABLE(j.fwd);
    DSA_PROP_ASSERT_DETECTABLE(j.bwd);
  } else {
    DSA_PROP_ASSERT_PASSED(j.fwd);
    DSA_PROP_ASSERT_PASSED(j.bwd);
  }
  if (!j.recompute_difference.empty()) {
    note_failing_op("dsa_block");
    RC_FAIL(what + ": bytes differ from the run they must equal (SPEC §8): " + j.recompute_difference);
  }
}

// Top-k runs once in forward; in backward zero times under save_dsa_indexer and none, once
// under full.
void save_dsa_indexer_zero_topk_in_replay(Backend& b, const BlockFactory& make_block) {
  const BlockCase c = draw_block_case();
  DumpOnFailure dump([&] { return to_fixture(c); });
  for (RecomputePolicy p : kPolicies) {
    const BlockRun r = run_block(b, make_block, p, c);
    RC_ASSERT(r.counters.topk_forward == 1);
    RC_ASSERT(r.counters.topk_backward == (p == RecomputePolicy::Full ? 1 : 0));
  }
}

// Every policy's run judged (block_check.h): out, lse, max_logits, dq, dkv and dsink by the
// local rule on the block's own ids, and on a deterministic backend every byte equal to the
// run under policy none (SPEC §8: identical gradients across the three policies).
void gradients_equal_across_policies(Backend& b, const BlockFactory& make_block) {
  const BlockCase c = draw_block_case();
  DumpOnFailure dump([&] { return to_fixture(c); });
  RC_ASSERT(!all_zero(c.in.q) && !all_zero(c.in.kv) && !all_zero(c.dout));
  std::vector<BlockRun> runs;
  for (RecomputePolicy p : kPolicies) runs.push_back(run_block(b, make_block, p, c));
  // dq may be 0 (one key: dS = 0); dkv carries p·dout unless a +inf sink takes every head's
  // weight (every p = 0, SPEC §4)
  bool all_heads_inf_sink = c.in.attn_sink.has_value();
  for (int64_t h = 0; c.in.attn_sink && h < c.in.attn_sink->numel(); ++h)
    all_heads_inf_sink = all_heads_inf_sink && c.in.attn_sink->get(h) == INFINITY;
  RC_ASSERT(all_heads_inf_sink || !all_zero(runs[0].grads.dkv));
  const oracle::OpCase oc = block_op_case(b, c);
  for (const BlockRun& r : runs)
    assert_block_passed(judge_block_run(oc, r, r.policy != RecomputePolicy::None && b.deterministic() ? &runs[0] : nullptr),
                        std::string("policy ") + to_string(r.policy));
}

// Interleaved micro-batches F1, F2, B1, B2 each replay with their own ids: each micro-batch's
// run is judged on its own ids, and on a deterministic backend its bytes equal those of the
// isolated schedule (F1, B1, F2, B2).
void interleaved_microbatches_own_ids(Backend& b, const BlockFactory& make_block) {
  const BlockCase c1 = draw_block_case();
  BlockCase c2 = c1;
  // Second micro-batch: same shapes, reversed indexer queries, so its ids differ (its rows are
  // not conditioned on those ids: WEAK rows pass there).
  const int64_t s_q = c1.in.q_idx.size(0), row = c1.in.q_idx.numel() / s_q;
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t i = 0; i < row; ++i)
      c2.in.q_idx.set(t * row + i, -c1.in.q_idx.get((s_q - 1 - t) * row + i));
  DumpOnFailure dump([&] { return to_fixture(c1); });
  const oracle::OpCase oc1 = block_op_case(b, c1), oc2 = block_op_case(b, c2);
  for (RecomputePolicy p : kPolicies) {
    BlockRun iso1, iso2, mix1, mix2;
    iso1.policy = iso2.policy = mix1.policy = mix2.policy = p;
    auto iso = make_block(b, p);
    iso1.fwd = iso->forward(1, c1.in);
    iso1.grads = iso->backward(1, c1.dout);
    iso2.fwd = iso->forward(2, c2.in);
    iso2.grads = iso->backward(2, c2.dout);
    auto mixed = make_block(b, p);
    mix1.fwd = mixed->forward(1, c1.in);
    mix2.fwd = mixed->forward(2, c2.in);
    mix1.grads = mixed->backward(1, c1.dout);
    mix2.grads = mixed->backward(2, c2.dout);
    const bool det = b.deterministic();
    assert_block_passed(judge_block_run(oc1, mix1, det ? &iso1 : nullptr),
                        std::string("micro-batch 1 after F1 F2 B1, policy ") + to_string(p));
    assert_block_passed(judge_block_run(oc2, mix2, det ? &iso2 : nullptr),
                        std::string("micro-batch 2 after F1 F2 B1 B2, policy ") + to_string(p), false);
  }
}

}  // namespace

BlockRun run_block(Backend& b, const BlockFactory& make_block, RecomputePolicy policy, const BlockCase& c) {
  auto block = make_block(b, policy);
  BlockRun r;
  r.policy = policy;
  r.fwd = block->forward(1, c.in);
  r.grads = block->backward(1, c.dout);
  r.counters = block->counters();
  return r;
}

oracle::OpCase block_op_case(Backend& b, const BlockCase& c) {
  oracle::OpCase oc;
  oc.mla.q = c.in.q;
  oc.mla.kv = c.in.kv;
  oc.mla.attn_sink = c.in.attn_sink;
  oc.mla.sm_scale = c.in.sm_scale;
  oc.mla.d_v = c.in.d_v;
  oc.mla.indices = b.select_topk(b.indexer_scores(c.in.q_idx, c.in.k_idx, c.in.w, c.in.windows), c.in.k,
                                 c.in.policy, c.in.windows);
  oc.dout = c.dout;
  oc.memo = std::make_shared<oracle::CaseMemo>();
  return oc;
}

bool BlockJudgement::passed() const { return fwd.passed() && bwd.passed() && recompute_difference.empty(); }

std::string BlockJudgement::describe() const {
  std::string s;
  if (!fwd.passed()) s += oracle::format_op_report(fwd);
  if (!bwd.passed()) s += oracle::format_op_report(bwd);
  if (!recompute_difference.empty()) s += "bytes differ from the run they must equal: " + recompute_difference + "\n";
  return s;
}

BlockJudgement judge_block_run(const oracle::OpCase& oc, const BlockRun& run, const BlockRun* must_equal,
                               const oracle::CheckOptions& opt) {
  const std::string label = std::string("block (recompute ") + to_string(run.policy) + ")";
  BlockJudgement j;
  oracle::NamedOutputs f{{"out", run.fwd.out}, {"lse", run.fwd.lse}, {"max_logits", run.fwd.max_logits}};
  j.fwd = oracle::judge_outputs(Op::SparseMlaFwd, oc, f, opt, label);
  oracle::NamedOutputs g{{"dq", run.grads.dq}, {"dkv", run.grads.dkv}};
  if (run.grads.dsink) g["dsink"] = *run.grads.dsink;
  if (run.fwd.out.defined()) g["out"] = run.fwd.out;  // Δ from the block's own out (SPEC §5)
  j.bwd = oracle::judge_outputs(Op::SparseMlaBwd, oc, g, opt, label);
  if (must_equal) {
    const std::string a = oracle::run_difference(must_equal->fwd, run.fwd);
    const std::string d = oracle::run_difference(must_equal->grads, run.grads);
    j.recompute_difference = a.empty() ? d : d.empty() ? a : a + "; " + d;
  }
  return j;
}

void add_block_properties(std::vector<Property>& out) {
  out.push_back({"block.save_dsa_indexer_zero_topk_in_replay", kBlockOps, 2, save_dsa_indexer_zero_topk_in_replay});
  out.push_back({"block.gradients_equal_across_policies", kBlockOps, 2, gradients_equal_across_policies});
  out.push_back({"block.interleaved_microbatches_own_ids", kBlockOps, 2, interleaved_microbatches_own_ids});
}

}  // namespace dsa::props
