// The judgement of one DSA block run under a recompute policy (SPEC §8, §9): what the block
// properties (property_tests/block_props.cpp) and the block detection property
// (oracle/tests/block_detection_test.cpp) assert. A block run's attention outputs are judged
// by the local rule on the block's own ids, and, for a deterministic backend, compared bit for
// bit with a run that must give the same bytes (the same case under recompute policy none).
#pragma once

#include <string>

#include "dsa/oracle/dsa_block.h"
#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/generators.h"

namespace dsa::props {

/// One micro-batch's forward outputs (out [s_q,h_q,d_v], lse and max_logits [s_q,h_q]) and
/// backward gradients (dq, dkv, dsink) from a block runner, with its top-k counts.
struct BlockRun {
  RecomputePolicy policy = RecomputePolicy::None;
  SparseMlaForward fwd;
  SparseMlaGrads grads;
  oracle::BlockCounters counters;
};

/// Runs micro-batch 1 of `c` (forward, then backward with c.dout) on a fresh
/// make_block(b, policy). Errors: what the block runner and the backend throw.
BlockRun run_block(oracle::Backend& b, const oracle::BlockFactory& make_block, RecomputePolicy policy,
                   const BlockCase& c);

/// The sparse MLA case of a block (SPEC §8): c's attention inputs with the ids `b` selects on
/// c's indexer inputs (b.indexer_scores, then b.select_topk with c's k, policy and windows:
/// the ids of the block's forward, re-selected; a deterministic top-k gives the same ids), and
/// c.dout. The case carries a memo, so the judgements of several runs on it share one
/// reference. Errors: what the backend throws (NotSupported for an op it lacks).
oracle::OpCase block_op_case(oracle::Backend& b, const BlockCase& c);

/// The judgement of one block run.
struct BlockJudgement {
  oracle::OpReport fwd;  ///< sparse_mla_fwd: out, lse, max_logits by the local rule (SPEC §9)
  oracle::OpReport bwd;  ///< sparse_mla_bwd: dq, dkv, dsink (Δ from the run's own out, SPEC §5)
  /// "" or where the run's bytes differ from the run it must equal (oracle::run_difference
  /// over out, lse, max_logits, dq, dkv, dsink; SPEC §8: identical across policies).
  std::string recompute_difference;
  /// Pass when both reports pass (WEAK counts as passed only under opt.allow_weak, as
  /// OpReport::passed says) and no byte differs.
  bool passed() const;
  /// Every failing part, for a failure message (the formatted reports and the difference).
  std::string describe() const;
};

/// Judges `run` on `oc` (block_op_case of its case): forward and backward by the local rule
/// (judge_outputs with `opt`; the backward takes Δ from the run's own out), and when
/// `must_equal` is given (a run of the same case that must give the same bytes, e.g. policy
/// none) the bytes of all six outputs against it. Pass must_equal only for a deterministic
/// backend (Backend::deterministic: SPEC §8 "bitwise with deterministic kernels"). Same errors
/// as judge_outputs.
BlockJudgement judge_block_run(const oracle::OpCase& oc, const BlockRun& run, const BlockRun* must_equal,
                               const oracle::CheckOptions& opt = oracle::default_check_options());

}  // namespace dsa::props
