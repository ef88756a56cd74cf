// The DSA block (SPEC §8): indexer (§2) → top-k (§3) → sparse MLA (§4), optionally the
// indexer KL loss (§7), with a recompute (checkpoint) policy: none | full | save_dsa_indexer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "dsa/contract/policies.h"

namespace dsa::optimized {

/// Static settings of one block.
struct DsaBlockConfig {
  int64_t topk = 2048;            ///< k of the top-k (k > s_kv legal)
  TopkPolicy topk_policy{};       ///< tie_break / sorted (SPEC §3)
  double sm_scale = 1.0;          ///< attention softmax scale
  int64_t d_v = 512;              ///< value width, V = kv[:, :d_v]
  RecomputePolicy recompute = RecomputePolicy::None;
  bool with_kl_loss = false;      ///< add the indexer KL loss (gradient into the indexer only)
  KlMode kl_mode = KlMode::Sparse;
  double kl_coeff = 1.0;
};

/// Inputs of one block. q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I] (bf16/f16/f32/f64), w [s_q,H_I]
/// f32/f64; q [s_q,h_q,d_qk], kv [s_kv,d_qk]; ks/ke [s_q] int32/int64 windows (SPEC §1);
/// attn_sink [h_q] f32 or undefined. All on one device (CPU or CUDA). The indexer tensors
/// may be undefined for a layer that receives shared ids.
struct DsaBlockInputs {
  at::Tensor q_idx, k_idx, w;
  at::Tensor q, kv;
  at::Tensor ks, ke;
  at::Tensor attn_sink;
};

/// out [s_q,h_q,d_v] (differentiable in q, kv, attn_sink); kl_loss [1] (differentiable in
/// q_idx, k_idx, w) or undefined without the loss; indices [s_q,topk] int32: the ids this
/// forward used (never differentiable) — pass them explicitly to layers that share them.
struct DsaBlockOutputs {
  at::Tensor out;
  at::Tensor kl_loss;
  at::Tensor indices;
};

/// Runs one block forward in the current grad mode.
/// - shared_indices undefined: the block owns its indexer and runs top-k once in forward.
///   none: ordinary autograd (intermediates saved); full: forward under no-grad saving only
///   the inputs, backward replays the whole block (top-k once); save_dsa_indexer: saves the
///   inputs and the int32 ids (s_q·k·4 bytes), backward replays with those ids and runs no
///   top-k. Gradients are bitwise identical across policies on deterministic devices.
/// - shared_indices [s_q,k] int32 given: the layer shares another layer's ids; it runs no
///   indexer, no top-k and no loss (SPEC §8: ids passed explicitly, never held globally).
/// The ids live only in this block's autograd node: interleaved micro-batches (F1, F2, B1,
/// B2) each replay with their own. Throws c10::Error naming the argument on bad input.
DsaBlockOutputs dsa_block(const DsaBlockInputs& in, const DsaBlockConfig& config,
                          const at::Tensor& shared_indices = at::Tensor());

/// Bytes the autograd graph of one block holds for backward, measured by walking the dsa
/// autograd nodes reachable from `outputs` (each distinct storage counted once, whole
/// storage). input_bytes: storages shared with a tensor of `in` (or `shared_indices`);
/// extra_bytes: everything else (e.g. the saved ids under save_dsa_indexer).
struct SavedBytes {
  int64_t input_bytes = 0;
  int64_t extra_bytes = 0;
  int64_t total() const { return input_bytes + extra_bytes; }
};
SavedBytes block_saved_bytes(const DsaBlockOutputs& outputs, const DsaBlockInputs& in,
                             const at::Tensor& shared_indices = at::Tensor());

}  // namespace dsa::optimized
