// Paged FP8 indexer (SPEC §10): gather each request's context through its block table into
// one packed key tensor, run the FP8 indexer with packed MTP windows, scatter to positions.
#include "dsa/reference/paged_indexer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "dsa/contract/paged_kv.h"
#include "dsa/reference/fp8_indexer.h"
#include "internal.h"
#include "value_limits.h"

namespace dsa::reference {

PagedGather gather_paged_indexer(const PagedIndexerInputs& in) {
  const char* where = "paged_indexer_scores";
  check_arg(in.q_idx.dim() == 4, where, "q_idx", "shape " + shape_str(in.q_idx.shape()),
            "4 dimensions [batch, next_n, H_I, d_I] (fp8 bytes)");
  check_dtype(where, "q_idx", in.q_idx, {DType::U8});
  const int64_t batch = in.q_idx.size(0), next_n = in.q_idx.size(1), h_i = in.q_idx.size(2),
                d_i = in.q_idx.size(3);
  check_arg(in.k_cache.dim() == 3, where, "k_cache", "shape " + shape_str(in.k_cache.shape()),
            "3 dimensions [num_blocks, block_size, d_I] (fp8 bytes)");
  check_dtype(where, "k_cache", in.k_cache, {DType::U8});
  check_shape(where, "k_cache", in.k_cache, {-1, -1, d_i});
  const int64_t num_blocks = in.k_cache.size(0), block_size = in.k_cache.size(1);
  check_shape(where, "k_scale_cache", in.k_scale_cache, {num_blocks, block_size});
  check_dtype(where, "k_scale_cache", in.k_scale_cache, {DType::F32});
  check_shape(where, "w", in.w, {batch * next_n, h_i});
  check_shape(where, "block_table", in.block_table, {batch, -1});
  const PagedKv kv = make_paged_kv(where, in.block_table, in.context_lens, block_size, num_blocks);
  const int64_t max_context = in.max_context < 0 ? kv.max_context() : in.max_context;
  const KeyWindows win = paged_mtp_windows(kv, next_n, max_context);

  // Gather: keys p < L_b of request b packed at rows off[b] + p.
  std::vector<int64_t> off(static_cast<size_t>(batch) + 1, 0);
  for (int64_t b = 0; b < batch; ++b) off[b + 1] = off[b] + kv.context_lens[static_cast<size_t>(b)];
  const int64_t total = off[static_cast<size_t>(batch)];
  Fp8IndexerInputs f;
  // q_idx finite (SPEC §6), named in its own [batch, next_n, H_I, d_I] index: the scores'
  // check sees the [batch·next_n, H_I, d_I] reshape (fresh20: q_idx[3, 1, 2, 5] was reported
  // "at [7, 2, 5]")
  const Tensor q_decoded = fp8_decode(in.q_idx, in.format);
  detail::check_range_values(where, "q_idx", q_decoded, 0, q_decoded.numel(),
                     [] { return std::string("fp8 queries, SPEC §6 and §10"); });
  f.q_idx = in.q_idx.reshaped({batch * next_n, h_i, d_i});
  f.k_idx = Tensor(DType::U8, {total, d_i});
  f.k_scale = Tensor(DType::F32, {total});
  f.w = in.w;
  f.format = in.format;
  const uint8_t* cache = in.k_cache.data<uint8_t>();
  const float* scales = in.k_scale_cache.data<float>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < kv.context_lens[static_cast<size_t>(b)]; ++p) {
      const int64_t row = kv.token_row(b, p), dst = off[b] + p;
      // (the message is formatted only for a bad scale: a context of 65537 keys formatted it
      // 65537 times a call, most of a paged property draw's time)
      if (!(std::isfinite(scales[row]) && scales[row] > 0.0f))
        check_arg(false, where, "k_scale_cache",
                  "k_scale_cache[" + str(row / block_size) + ", " + str(row % block_size) + "] = " +
                      str(scales[row]) + " (key " + str(p) + " of request " + str(b) + ")",
                  "a positive finite fp32 scale (SPEC §10)");
      // SPEC §6/§10: a key a context reads is finite (e4m3fn S.1111.111 is NaN, e5m2 has
      // inf/NaN); bytes past every context may hold anything. Named in the cache's own index.
      for (int64_t c = 0; c < d_i; ++c) {
        const double v = fp8_to_double(cache[row * d_i + c], in.format);
        if (!std::isfinite(v))
          check_arg(false, where, "k_cache",
                  "k_cache[" + str(row / block_size) + ", " + str(row % block_size) + ", " + str(c) +
                      "] = " + str(v) + " (key " + str(p) + " of request " + str(b) + ")",
                  "a finite fp8 value in every key a context reads (SPEC §6: no valid input may "
                  "produce NaN; §10)");
      }
      std::memcpy(f.k_idx.data<uint8_t>() + dst * d_i, cache + row * d_i, static_cast<size_t>(d_i));
      f.k_scale.data<float>()[dst] = scales[row];
    }
  f.windows.s_kv = total;
  for (int64_t r = 0; r < batch * next_n; ++r) {
    const int64_t b = r / next_n;
    f.windows.ks.push_back(off[b]);
    f.windows.ke.push_back(off[b] + win.ke[r]);
  }
  return PagedGather{std::move(f), std::move(off), win, max_context};
}

Tensor paged_indexer_scores(const PagedIndexerInputs& in, Precision precision) {
  const PagedGather g = gather_paged_indexer(in);
  const Tensor packed = fp8_indexer_scores(g.packed, precision);
  const int64_t rows = g.packed.q_idx.size(0), total = g.packed.k_idx.size(0);
  const int64_t next_n = in.q_idx.size(1), max_context = g.max_context;
  const std::vector<int64_t>& off = g.offsets;
  const KeyWindows& win = g.windows;

  // Scatter: column p of row r is packed column off[b] + p inside the window, -inf outside.
  Tensor out(packed.dtype(), {rows, max_context});
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / next_n;
    for (int64_t p = 0; p < max_context; ++p)
      out.set(r * max_context + p, p < win.ke[r] ? packed.get(r * total + off[b] + p)
                                                : -std::numeric_limits<double>::infinity());
  }
  return out;
}

}  // namespace dsa::reference
