// Moving a drawn case's key rows past 16 bits (outside tester F3: no sparse MLA, FP8 sparse
// MLA, indexer, FP8 or paged indexer draw had a key id >= 65536, so a kernel keeping ids in 16 bits passed). The
// rows [0, n) of a key tensor move to [off, off + n) of a taller one and every id follows its
// row, so values, sums and roundings are those of the drawn case; only where the rows sit
// changes. Shared by generators.cpp and fp8_generators.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/key_windows.h"
#include "dsa/contract/tensor.h"

namespace dsa::props::detail {

/// The draw of a run (draw_index()) whose sparse MLA, FP8 sparse MLA, indexer and FP8 indexer
/// cases select keys past 65535 (the paged indexer's: physical blocks past 65535), and the
/// indexer draw whose keys lie past 2^17.
constexpr int kWideIdsDraw = 3;
constexpr int kWideIds17Draw = 5;
/// The paged indexer draw of a run with one request's context past 65536 keys.
constexpr int kLongContextDraw = 5;
constexpr int64_t kIds16 = int64_t{1} << 16;

/// Id `id` of a table over `n` rows after the rows moved to [off, off + n) of `n2` rows: a row
/// id moves by off; an invalid id past the end (n .. n + 2^20) keeps its distance past the new
/// end (s_kv stays s_kv, s_kv + 7 stays s_kv + 7); negative ids and INT32_MAX are kept.
inline int64_t relocated_id(int64_t id, int64_t n, int64_t off, int64_t n2) {
  if (id >= 0 && id < n) return id + off;
  if (id >= n && id - n <= (int64_t{1} << 20)) return n2 + (id - n);
  return id;
}

/// Copy of `t` (rows first: [n, ...]) with `n2` rows: its rows at [off, off + n), the others
/// zero bytes. Throws std::invalid_argument when off + n > n2 or t has no rows dimension.
inline Tensor relocate_rows(const Tensor& t, int64_t off, int64_t n2) {
  if (t.dim() < 1 || off < 0 || off + t.size(0) > n2)
    throw std::invalid_argument("relocate_rows: rows [off, off + n) must fit in n2 rows");
  std::vector<int64_t> shape = t.shape();
  const int64_t n = shape[0];
  shape[0] = n2;
  Tensor out(t.dtype(), shape);
  if (n == 0) return out;
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(n);
  std::memcpy(out.raw() + static_cast<size_t>(off) * row_bytes, t.raw(), t.nbytes());
  return out;
}

/// The largest key id a window of `w` shows (ke - 1 of its non-empty windows), -1 when every
/// window is empty. The draw moving keys past 16 bits picks its first moved key at or below it.
inline int64_t largest_window_key(const KeyWindows& w) {
  int64_t top = -1;
  for (size_t t = 0; t < w.ks.size(); ++t)
    if (w.ke[t] > w.ks[t]) top = std::max(top, w.ke[t] - 1);
  return top;
}

/// A query row whose window shows key `top` (the largest key some window shows), -1 when none.
inline int64_t row_showing(const KeyWindows& w, int64_t top) {
  for (size_t t = 0; t < w.ks.size(); ++t)
    if (w.ks[t] <= top && top < w.ke[t]) return static_cast<int64_t>(t);
  return -1;
}

/// Rewrites every element of the int32 id tensor `ids` with relocated_id.
inline void relocate_ids(Tensor& ids, int64_t n, int64_t off, int64_t n2) {
  int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) p[i] = static_cast<int32_t>(relocated_id(p[i], n, off, n2));
}

}  // namespace dsa::props::detail
