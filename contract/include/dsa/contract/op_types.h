// Inputs and outputs of the DSA ops as host tensors, shared by the reference, every
// backend adapter, the oracle and the fixtures. Shapes and dtypes: SPEC §2, §4, §5, §7.
#pragma once

#include <optional>
#include <vector>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/policies.h"
#include "dsa/contract/tensor.h"

namespace dsa {

/// Gradients of the indexer scores (SPEC §2).
struct IndexerGrads {
  Tensor dq_idx;  ///< [s_q,H_I,d_I]
  Tensor dk_idx;  ///< [s_kv,d_I]
  Tensor dw;      ///< [s_q,H_I]
};

/// Inputs of sparse MLA (SPEC §4). q [s_q,h_q,d_qk] and kv [s_kv,d_qk]: BF16/F16/F32/F64;
/// indices [s_q,k] or [s_q,1,k] I32 (any value; valid iff 0 <= id < s_kv and slot <
/// topk_length[t]); topk_length [s_q] I32 (optional); attn_sink [h_q] F32/F64 (optional,
/// ±inf allowed); sm_scale finite; 0 < d_v <= d_qk (V = first d_v columns of kv).
struct SparseMlaInputs {
  Tensor q;
  Tensor kv;
  Tensor indices;
  std::optional<Tensor> topk_length;
  std::optional<Tensor> attn_sink;
  double sm_scale = 1.0;
  int64_t d_v = 512;
};

/// The valid slots of query row t (SPEC §4): indices[t, j] for j < min(k, topk_length[t]) with
/// 0 <= id < s_kv = kv.size(0), in slot order, duplicates kept (an empty result is an empty
/// row, SPEC §6). Written into `ids`, cleared first, so a loop over rows reuses one buffer.
/// Requires 0 <= t < s_q and indices [s_q,k] or [s_q,1,k] (not checked); no errors.
void valid_slot_ids(const SparseMlaInputs& in, int64_t t, std::vector<int64_t>& ids);

/// out [s_q,h_q,d_v]; lse, max_logits [s_q,h_q] (natural log).
/// Empty rows: out 0, lse +inf, max_logits -inf (SPEC §6).
struct SparseMlaForward {
  Tensor out;
  Tensor lse;
  Tensor max_logits;
};

/// dq [s_q,h_q,d_qk], dkv [s_kv,d_qk] (accumulated over every query, head and repeated id),
/// dsink [h_q] when a sink is given (SPEC §5).
struct SparseMlaGrads {
  Tensor dq;
  Tensor dkv;
  std::optional<Tensor> dsink;
};

/// scores [s_q,s_kv] F32/F64 (indexer output I); q [s_q,h_q,d_qk], kv [s_kv,d_qk]
/// BF16/F16/F32/F64; windows s_q rows over s_kv; mode Dense (S_t = window keys) or Sparse
/// (S_t = distinct valid ids of indices[t] inside the window; indices [s_q,k] I32 required).
struct IndexerKlInputs {
  Tensor scores;
  Tensor q;
  Tensor kv;
  double sm_scale = 1.0;
  KeyWindows windows;
  KlMode mode = KlMode::Dense;
  std::optional<Tensor> indices;
  double coeff = 1.0;
};

/// loss [1] and d_scores [s_q,s_kv] (zero outside S_t). SPEC §7. A backend may return the loss
/// as [] (a 0-dim tensor, torch's usual loss): the same value on every route; any other shape
/// fails (oracle::scalar_loss_shape, the one rule).
struct IndexerKlResult {
  Tensor loss;
  Tensor d_scores;
};

}  // namespace dsa
