// Sparse MLA forward over FlashMLA's FP8 KV cache (SPEC §10, §4-§6): gather and dequantize
// the token rows the valid ids read, then the §4 reference (dsa::reference::sparse_mla_forward).
#pragma once

#include <vector>

#include "dsa/contract/fp8_op_types.h"
#include "dsa/contract/op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// Outputs as sparse_mla_forward: out [s_q,h_q,512], lse and max_logits [s_q,h_q] (natural
/// log); F64 (Reference) or F32 unrounded (Baseline). Reference dequantizes exactly
/// (fp8·scale in float64, bf16 RoPE). Baseline dequantizes to q's dtype (FlashMLA converts
/// fp8·scale to bf16 before its bf16 MMAs) and accumulates in fp32.
/// Shapes/dtypes: SparseMlaFp8Inputs (contract/fp8_op_types.h). Only tokens addressed by
/// valid slots are read. Throws std::invalid_argument naming 'q' (last dim != 576),
/// 'kv_cache' (dtype, shape, or a read token with a scale that is not positive finite),
/// 'indices', 'topk_length', 'attn_sink', 'sm_scale'.
SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in,
                                        Precision precision = Precision::Reference);

/// The §4 problem the FP8 one reduces to: kv = the distinct tokens valid slots read,
/// dequantized (F64 for Reference, q's dtype for Baseline), in first-use order; indices
/// remapped into those rows, -1 for every invalid slot; q, topk_length, attn_sink, sm_scale
/// as given; d_v 512. `token_of_row[r]` is the cache token of kv row r. Same errors.
struct SparseMlaFp8Gather {
  SparseMlaInputs inputs;
  std::vector<int64_t> token_of_row;
};
SparseMlaFp8Gather gather_sparse_mla_fp8(const SparseMlaFp8Inputs& in,
                                         Precision precision = Precision::Reference);

/// The kv_cache's token count (numel / 656) after checking its dtype U8 and shape
/// [tokens,656], [num_blocks,block_size,656] or [num_blocks,block_size,1,656].
/// Throws std::invalid_argument naming 'kv_cache'.
int64_t mla_fp8_cache_tokens(const char* where, const Tensor& kv_cache);

}  // namespace dsa::reference
