#include "dsa/contract/paged_kv.h"

#include <algorithm>

#include "dsa/contract/checks.h"
#include "dsa/contract/errors.h"

namespace dsa {

int64_t PagedKv::blocks_read(int64_t b) const {
  const int64_t L = context_lens[static_cast<size_t>(b)];
  return (L + block_size - 1) / block_size;
}

int64_t PagedKv::token_row(int64_t b, int64_t p) const {
  const int32_t block = block_table[static_cast<size_t>(b * max_blocks + p / block_size)];
  return static_cast<int64_t>(block) * block_size + p % block_size;
}

int64_t PagedKv::max_context() const {
  int64_t m = 0;
  for (int32_t L : context_lens) m = std::max<int64_t>(m, L);
  return m;
}

PagedKv make_paged_kv(const char* where, const Tensor& block_table, const Tensor& context_lens,
                      int64_t block_size, int64_t num_blocks) {
  check_arg(block_size >= 1, where, "block_size", str(block_size), ">= 1");
  check_arg(num_blocks >= 0, where, "num_blocks", str(num_blocks), ">= 0");
  check_rank(where, "block_table", block_table, 2);
  check_dtype(where, "block_table", block_table, {DType::I32});
  check_dtype(where, "context_lens", context_lens, {DType::I32});
  PagedKv kv;
  kv.batch = block_table.size(0);
  kv.max_blocks = block_table.size(1);
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  check_shape(where, "context_lens", context_lens, {kv.batch});
  kv.block_table.assign(block_table.data<int32_t>(), block_table.data<int32_t>() + block_table.numel());
  kv.context_lens.assign(context_lens.data<int32_t>(), context_lens.data<int32_t>() + context_lens.numel());
  const int64_t capacity = kv.max_blocks * block_size;
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t L = kv.context_lens[static_cast<size_t>(b)];
    check_arg(L >= 0 && L <= capacity, where, "context_lens",
              "context_lens[" + str(b) + "] = " + str(L),
              "0 <= context_lens[b] <= block_table.size(1) · block_size = " + str(capacity));
    for (int64_t i = 0; i < kv.blocks_read(b); ++i) {
      const int64_t id = kv.block_table[static_cast<size_t>(b * kv.max_blocks + i)];
      // (the message is formatted only for a bad entry: once per read block it was most of the
      // time of a call over a context of 65537 blocks of size 1)
      if (!(id >= 0 && id < num_blocks))
        check_arg(false, where, "block_table",
                  "block_table[" + str(b) + ", " + str(i) + "] = " + str(id) + " (read for context_lens[" +
                      str(b) + "] = " + str(L) + ", block_size " + str(block_size) + ")",
                  "a block id in [0, " + str(num_blocks) + ")");
    }
  }
  return kv;
}

KeyWindows paged_mtp_windows(const PagedKv& kv, int64_t next_n, int64_t max_context) {
  const char* where = "paged_mtp_windows";
  check_arg(next_n >= 1, where, "next_n", str(next_n), ">= 1");
  check_arg(max_context >= kv.max_context(), where, "max_context", str(max_context),
            ">= the largest context length " + str(kv.max_context()));
  KeyWindows w;
  w.s_kv = max_context;
  for (int64_t b = 0; b < kv.batch; ++b) {
    const int64_t L = kv.context_lens[static_cast<size_t>(b)];
    for (int64_t i = 0; i < next_n; ++i) {
      w.ks.push_back(0);
      w.ke.push_back(std::clamp<int64_t>(L - next_n + i + 1, 0, L));
    }
  }
  return w;
}

}  // namespace dsa
