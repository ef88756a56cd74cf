// Paged KV cache descriptors (SPEC §10): block_table, context_lens, block_size. Logical key
// p of request b lives at block block_table[b, p / block_size], slot p % block_size; table
// entries past a request's context are never read (they may hold -1 or garbage).
// Sources: vLLM PagedAttention block tables; DeepGEMM fp8_paged_mqa_logits.
#pragma once

#include <cstdint>
#include <vector>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"

namespace dsa {

/// A validated paged-KV descriptor (host copies of the I32 tensors).
struct PagedKv {
  int64_t batch = 0;
  int64_t max_blocks = 0;  ///< block_table.size(1)
  int64_t block_size = 0;
  int64_t num_blocks = 0;  ///< blocks in the cache
  std::vector<int32_t> block_table;   ///< [batch, max_blocks], row-major
  std::vector<int32_t> context_lens;  ///< [batch]

  /// Number of table entries request b reads: ceil(context_lens[b] / block_size).
  int64_t blocks_read(int64_t b) const;
  /// Flat token row (block · block_size + slot) of logical key p < context_lens[b].
  int64_t token_row(int64_t b, int64_t p) const;
  /// Largest context length (0 for an empty batch).
  int64_t max_context() const;
};

/// Validates and copies a paged-KV description. Requirements, each failing with
/// std::invalid_argument("<where>: argument '<arg>' got ..., expected ..."):
/// block_size >= 1 ('block_size'); num_blocks >= 0; block_table I32 [batch, max_blocks]
/// ('block_table'); context_lens I32 [batch] ('context_lens') with
/// 0 <= context_lens[b] <= max_blocks · block_size; every entry a request reads
/// (column < blocks_read(b)) in [0, num_blocks) ('block_table', naming [b, i] and the value).
/// Entries past a context are not inspected. SPEC §10.
PagedKv make_paged_kv(const char* where, const Tensor& block_table, const Tensor& context_lens,
                      int64_t block_size, int64_t num_blocks);

/// The MTP windows of SPEC §1/§10 over logical positions: row b·next_n + i sees
/// [0, clamp(L - next_n + i + 1, 0, L)) with L = context_lens[b], over `max_context` columns
/// (max_context >= every L). A context shorter than next_n gives empty leading rows.
/// Throws std::invalid_argument naming 'next_n' (< 1) or 'max_context' (< a context).
KeyWindows paged_mtp_windows(const PagedKv& kv, int64_t next_n, int64_t max_context);

}  // namespace dsa
