#include "dsa/contract/fp8_op_types.h"

#include <algorithm>

namespace dsa {

std::vector<char> read_mask(const Fp8IndexerInputs& in) {
  const int64_t s_kv = in.k_idx.dim() > 0 ? in.k_idx.size(0) : 0;
  std::vector<char> read(static_cast<size_t>(s_kv), 0);
  for (size_t t = 0; t < in.windows.ks.size() && t < in.windows.ke.size(); ++t)
    for (int64_t s = std::max<int64_t>(0, in.windows.ks[t]); s < std::min<int64_t>(s_kv, in.windows.ke[t]); ++s)
      read[static_cast<size_t>(s)] = 1;
  return read;
}

std::vector<char> read_mask(const PagedIndexerInputs& in) {
  const int64_t num_blocks = in.k_cache.dim() > 0 ? in.k_cache.size(0) : 0;
  const int64_t bs = in.k_cache.dim() > 1 ? in.k_cache.size(1) : 0;
  std::vector<char> read(static_cast<size_t>(num_blocks * bs), 0);
  if (bs < 1 || in.block_table.dim() != 2) return read;
  const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
  for (int64_t b = 0; b < batch && b < in.context_lens.numel(); ++b) {
    const int64_t L = static_cast<int64_t>(in.context_lens.get(b));
    for (int64_t p = 0; p < std::min(L, max_blocks * bs); ++p) {
      const double blk = in.block_table.get(b * max_blocks + p / bs);
      if (blk >= 0 && blk < static_cast<double>(num_blocks))
        read[static_cast<size_t>(static_cast<int64_t>(blk) * bs + p % bs)] = 1;
    }
  }
  return read;
}

std::vector<char> read_mask(const SparseMlaFp8Inputs& in) {
  const int64_t tokens = in.kv_cache.numel() / kMlaFp8TokenBytes;
  std::vector<char> read(static_cast<size_t>(tokens), 0);
  if (in.indices.dim() < 1) return read;
  const int64_t s_q = in.indices.size(0), k = in.indices.size(-1);
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len =
        in.topk_length && t < in.topk_length->numel() ? static_cast<int64_t>(in.topk_length->get(t)) : k;
    for (int64_t j = 0; j < std::min(k, len); ++j) {
      const double id = in.indices.get(t * k + j);
      if (id >= 0 && id < static_cast<double>(tokens)) read[static_cast<size_t>(id)] = 1;
    }
  }
  return read;
}

}  // namespace dsa
