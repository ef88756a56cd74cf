// Inputs of the FP8 / paged inference ops (SPEC §10), shared by the reference, the backends,
// the oracle, the fixtures and the plugin ABI. FP8 tensors are U8 bytes with a format tag.
#pragma once

#include <optional>
#include <vector>

#include "dsa/contract/fp8.h"
#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"

namespace dsa {

/// FP8 indexer (DeepGEMM fp8_mqa_logits): q_idx U8 [s_q,H_I,d_I] and k_idx U8 [s_kv,d_I] in
/// `format`; k_scale F32 [s_kv] (positive finite, only window keys are read); w F32 [s_q,H_I]
/// (carries q's scale, may be negative); windows s_q rows over s_kv.
/// I[t,s] = Σ_j w[t,j]·ReLU(k_scale[s]·(q_idx[t,j,:]·k_idx[s,:])) inside, -inf outside; F32.
struct Fp8IndexerInputs {
  Tensor q_idx;
  Tensor k_idx;
  Tensor k_scale;
  Tensor w;
  KeyWindows windows;
  Fp8Format format = Fp8Format::E4M3FN;
};

/// Paged FP8 indexer (DeepGEMM fp8_paged_mqa_logits): q_idx U8 [batch,next_n,H_I,d_I];
/// k_cache U8 [num_blocks,block_size,d_I]; k_scale_cache F32 [num_blocks,block_size];
/// w F32 [batch·next_n,H_I]; block_table I32 [batch,max_blocks]; context_lens I32 [batch];
/// max_context (output width, >= every context; -1: the largest context).
/// Output F32 [batch·next_n, max_context]: row b·next_n+i holds the §10 FP8 scores of logical
/// keys p in its MTP window [0, L-next_n+i+1), -inf elsewhere. Only keys p < context_lens[b]
/// are read; table entries, slots and scales past a context may hold anything.
struct PagedIndexerInputs {
  Tensor q_idx;
  Tensor k_cache;
  Tensor k_scale_cache;
  Tensor w;
  Tensor block_table;
  Tensor context_lens;
  int64_t max_context = -1;
  Fp8Format format = Fp8Format::E4M3FN;
};

/// Sparse MLA forward over FlashMLA's FP8 KV cache (SPEC §10 + §4-§6): q BF16/F16/F32
/// [s_q,h_q,576]; kv_cache U8 [num_blocks,block_size,656] (or [tokens,656], or
/// [num_blocks,block_size,1,656]); indices I32 [s_q,k] or [s_q,1,k] addressing token rows
/// (block·block_size + slot), valid iff 0 <= id < tokens and slot < topk_length[t];
/// topk_length [s_q] I32 and attn_sink [h_q] F32 optional; d_v = 512. Outputs as §4.
struct SparseMlaFp8Inputs {
  Tensor q;
  Tensor kv_cache;
  Tensor indices;
  std::optional<Tensor> topk_length;
  std::optional<Tensor> attn_sink;
  double sm_scale = 1.0;
};

// ---- Read masks (SPEC §10: "only window keys / keys p < context_lens[b] / valid slots are
// read; everything else may hold anything") ---------------------------------------------------
// The one definition of what a §10 kernel may read, shared by the oracle's clean twins and
// poison re-runs, the property generators and the fixture generator. None of them requires
// validated inputs: window bounds, contexts, table entries and ids are clamped or skipped, so
// none raises an error. Each mask holds 1 for a read row, 0 for one the kernel must not read.

/// Over k_idx's rows, [s_kv = k_idx.size(0)]: 1 iff some query row's window [ks[t], ke[t])
/// holds key s.
std::vector<char> read_mask(const Fp8IndexerInputs& in);

/// Over the cache's flat slots (block · block_size + slot), [num_blocks · block_size]: 1 iff
/// some request b reads it, i.e. a logical key p < context_lens[b] lives there through
/// block_table[b, p / block_size] (entries outside [0, num_blocks) are skipped).
std::vector<char> read_mask(const PagedIndexerInputs& in);

/// Over the FP8 cache's token rows, [tokens = kv_cache bytes / kMlaFp8TokenBytes (656)]: 1 iff
/// some query row t holds that id in a slot j < min(k, topk_length[t]).
std::vector<char> read_mask(const SparseMlaFp8Inputs& in);

}  // namespace dsa
