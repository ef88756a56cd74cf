// Paged FP8 indexer scores (SPEC §10, DeepGEMM fp8_paged_mqa_logits semantics, MTP next_n
// 1..4 and more): gather the keys each request reads through its block table, then the FP8
// indexer (dsa::reference::fp8_indexer_scores), then scatter to logical positions.
#pragma once

#include <vector>

#include "dsa/contract/fp8_op_types.h"
#include "dsa/reference/precision.h"

namespace dsa::reference {

/// Output [batch·next_n, max_context] (F64, or F32 for Baseline): row b·next_n+i holds the
/// FP8 scores of logical keys p in [0, L_b - next_n + i + 1) (clamped; L_b = context_lens[b]),
/// -inf elsewhere. Shapes/dtypes: PagedIndexerInputs (contract/fp8_op_types.h).
/// Reads only keys p < L_b: table entries, slots and scales past a context are never read.
/// Throws std::invalid_argument naming the argument: 'q_idx', 'k_cache', 'k_scale_cache',
/// 'w', 'block_table' (a read entry outside [0, num_blocks), batch mismatch), 'context_lens'
/// (negative or > max_blocks·block_size), 'max_context' (< a context), and 'k_scale_cache'
/// naming [block, slot] for a read scale that is not positive finite.
Tensor paged_indexer_scores(const PagedIndexerInputs& in,
                            Precision precision = Precision::Reference);

/// The dense FP8 indexer problem a paged one reduces to: the keys p < L_b of request b
/// packed at rows offsets[b] + p (bytes and scales copied through the block table), queries
/// [batch·next_n, H_I, d_I], windows [offsets[b], offsets[b] + ke) over the packed keys.
/// `windows` are the logical MTP windows over max_context columns. Same checks and errors.
struct PagedGather {
  Fp8IndexerInputs packed;
  std::vector<int64_t> offsets;  ///< [batch + 1]
  KeyWindows windows;
  int64_t max_context = 0;
};
PagedGather gather_paged_indexer(const PagedIndexerInputs& in);

}  // namespace dsa::reference
