// A minimal DSA block runner with recompute policies (SPEC §8): indexer → top-k → sparse
// MLA on any Backend, with an op-level top-k execution counter and per-micro-batch saved
// state. The oracle's model of recompute: no backend exposes a block/recompute API yet, so
// the properties of §8 (zero top-k in replay under save_dsa_indexer, one under full, equal
// gradients across policies, own ids per interleaved micro-batch) are checked on this runner
// and on faulty variants of it (mutants).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "dsa/oracle/backend.h"

namespace dsa::oracle {

/// Inputs of one block forward. Indexer: q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I], w [s_q,H_I],
/// windows; top-k: k, policy; attention: q [s_q,h_q,d_qk], kv [s_kv,d_qk], sm_scale, d_v,
/// optional attn_sink [h_q].
struct BlockInputs {
  Tensor q_idx, k_idx, w;
  KeyWindows windows;
  int64_t k = 0;
  TopkPolicy policy;
  Tensor q, kv;
  double sm_scale = 1.0;
  int64_t d_v = 0;
  std::optional<Tensor> attn_sink;
};

/// Top-k executions counted at the op level, split by phase.
struct BlockCounters {
  int64_t topk_forward = 0;
  int64_t topk_backward = 0;
};

/// Runs blocks on `backend` under `policy`. Micro-batches are keyed by an integer id so
/// interleaved schedules (F1, F2, B1, B2) are expressible. Errors: backward of a micro-batch
/// without a forward throws std::logic_error; backend exceptions propagate.
class DsaBlock {
 public:
  DsaBlock(Backend& backend, RecomputePolicy policy) : backend_(backend), policy_(policy) {}
  virtual ~DsaBlock() = default;
  /// Forward of micro-batch `mb`: returns the attention output; saves what `policy` saves
  /// (none: inputs + ids; full: inputs only; save_dsa_indexer: inputs + int32 ids).
  virtual SparseMlaForward forward(int mb, const BlockInputs& in);
  /// Backward of micro-batch `mb` for dout [s_q,h_q,d_v]: under `full` replays indexer and
  /// top-k (one top-k), otherwise uses the saved ids (zero top-k). Returns dq, dkv, dsink.
  virtual SparseMlaGrads backward(int mb, const Tensor& dout);
  const BlockCounters& counters() const { return counters_; }
  RecomputePolicy policy() const { return policy_; }

 protected:
  struct Saved {
    BlockInputs in;
    std::optional<Tensor> ids;
  };
  /// indexer_scores + select_topk on the backend, counting the top-k in the given phase.
  Tensor select_ids(const BlockInputs& in, bool in_backward);
  SparseMlaInputs attention_inputs(const BlockInputs& in, const Tensor& ids) const;
  Backend& backend_;
  RecomputePolicy policy_;
  BlockCounters counters_;
  std::map<int, Saved> saved_;
};

/// Creates a block runner (the correct one, or a mutant's).
using BlockFactory = std::function<std::unique_ptr<DsaBlock>(Backend&, RecomputePolicy)>;
/// Factory of the correct DsaBlock.
BlockFactory default_block_factory();

}  // namespace dsa::oracle
