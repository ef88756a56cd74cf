#include "dsa/property_tests/fp8_generators.h"

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <tuple>

#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/generators.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "src/conditioning.h"
#include "src/relocate.h"

namespace dsa::props {
namespace {

using Rng = std::mt19937_64;

Rng draw_rng() { return Rng(*rc::gen::arbitrary<uint64_t>()); }
int64_t draw_in(int64_t lo, int64_t hi_inclusive) {
  return *rc::gen::inRange<int64_t>(lo, hi_inclusive + 1);
}
double uni(Rng& r, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(r); }
int64_t irand(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }

constexpr uint8_t kNanByte = 0x7F;  // NaN in e4m3fn and e5m2

// Scale of one row: a power of two, the amax rule, or an arbitrary positive fp32.
enum class ScaleKind { Pow2, Amax, Arbitrary };
const char* to_string(ScaleKind k) {
  return k == ScaleKind::Pow2 ? "pow2" : k == ScaleKind::Amax ? "amax" : "arbitrary";
}
ScaleKind draw_scale_kind() {
  return *rc::gen::element(ScaleKind::Pow2, ScaleKind::Amax, ScaleKind::Arbitrary);
}

// One row of `d` FP8 bytes and its scale: random values, then special bytes (±max, subnormal,
// zero). Exact rows: small integers with scale a power of two.
float fill_row(uint8_t* bytes, int64_t d, Fp8Format f, ScaleKind kind, bool exact, Rng& r) {
  if (exact) {
    for (int64_t c = 0; c < d; ++c) bytes[c] = double_to_fp8(static_cast<double>(irand(r, -3, 3)), f);
    if (std::all_of(bytes, bytes + d, [](uint8_t b) { return (b & 0x7F) == 0; })) bytes[0] = double_to_fp8(1.0, f);
    return static_cast<float>(std::ldexp(1.0, static_cast<int>(irand(r, -3, 3))));
  }
  const double amp = std::ldexp(1.0, static_cast<int>(irand(r, -6, 6)));
  std::vector<double> v(static_cast<size_t>(d));
  double amax = 0;
  for (auto& x : v) amax = std::max(amax, std::fabs(x = uni(r, -amp, amp)));
  float s = kind == ScaleKind::Arbitrary ? static_cast<float>(std::exp2(uni(r, -12, 4)))
                                         : fp8_tile_scale(amax, f, kind == ScaleKind::Pow2 ? Fp8ScaleRule::Pow2 : Fp8ScaleRule::Amax);
  for (int64_t c = 0; c < d; ++c) bytes[c] = double_to_fp8(v[static_cast<size_t>(c)] / s, f);
  // Special bytes: ±max, subnormals, zeros.
  const uint8_t max_byte = double_to_fp8(fp8_max(f), f);
  for (int64_t n = irand(r, 0, 3); n > 0; --n) {
    const int64_t c = irand(r, 0, d - 1);
    switch (irand(r, 0, 2)) {
      case 0: bytes[c] = static_cast<uint8_t>(max_byte | (irand(r, 0, 1) ? 0x80 : 0)); break;
      case 1: bytes[c] = static_cast<uint8_t>(irand(r, 1, 3) | (irand(r, 0, 1) ? 0x80 : 0)); break;
      default: bytes[c] = 0;
    }
  }
  return s;
}

Fp8Format draw_format() {
  return *rc::gen::weightedOneOf<Fp8Format>({{4, rc::gen::just(Fp8Format::E4M3FN)},
                                             {1, rc::gen::just(Fp8Format::E5M2)}});
}

// Head weights carrying q's per-(t,j) scale, may be negative.
Tensor draw_weights(int64_t rows, int64_t h, bool exact, Rng& r) {
  Tensor w(DType::F32, {rows, h});
  for (int64_t i = 0; i < w.numel(); ++i)
    w.set(i, exact ? static_cast<double>(irand(r, -2, 2)) : uni(r, -1, 1) * std::exp2(uni(r, -4, 2)));
  if (rows * h > 0 && all_zero(w)) w.set(0, 1.0);
  return w;
}

// The number format and scale rule of a draw. The exact tier ("exact" flavors of both FP8
// indexer ops): e4m3fn with power-of-two scales, so every decoded value, product and sum of
// the integer rows fill_row draws is exact in fp32 (and in a ~14-bit FP8 tensor-core
// accumulator: |q·k| <= 9·d_I <= 1152 < 2^14).
struct Fp8Grid {
  Fp8Format format;
  ScaleKind kind;
};
Fp8Format draw_grid_format(bool exact) { return exact ? Fp8Format::E4M3FN : draw_format(); }
ScaleKind draw_grid_kind(bool exact) { return exact ? ScaleKind::Pow2 : draw_scale_kind(); }

// Head weights `w` [rows, h] (draw_weights) and the FP8 query rows `q` [rows, h, d] (fill_row),
// in that order from `r`. Outside the exact tier w carries q's per-(row, head) scale (SPEC §10);
// in it w stays a small integer and q's scale is dropped (the integer q row is the value).
Tensor fill_queries(uint8_t* q, int64_t rows, int64_t h, int64_t d, const Fp8Grid& g, bool exact, Rng& r) {
  Tensor w = draw_weights(rows, h, exact, r);
  for (int64_t i = 0; i < rows * h; ++i) {
    const float qs = fill_row(q + i * d, d, g.format, g.kind, exact, r);
    if (!exact) w.set(i, w.get(i) * qs);
  }
  return w;
}

// s_kv of a production-shape draw: keys past 128 (DeepSeek-V3.2 contexts are far longer;
// fresh-user finding F8: a kernel scoring keys past 128 as 0 passed): 129, 257 or 1025 at
// level 0, up to 4097 above; the run's first draw 1025.
int64_t production_keys(int level) {
  if (draw_index() == 0) return 1025;
  return level == 0 ? *rc::gen::element<int64_t>(129, 257, 1025) : *rc::gen::element<int64_t>(129, 1025, 2049, 4097);
}

// Windows of a many-row draw: full, or per-row windows of >= 1 key.
KeyWindows draw_row_windows(int64_t s_q, int64_t s_kv, std::string* drawn) {
  const bool per_row = *rc::gen::arbitrary<bool>();
  *drawn = per_row ? "per_row" : "full";
  if (!per_row) return KeyWindows::full(s_q, s_kv);
  Rng r = draw_rng();
  std::vector<int64_t> ks, ke;
  for (int64_t t = 0; t < s_q; ++t) {
    ks.push_back(irand(r, 0, s_kv - 1));
    ke.push_back(irand(r, ks.back() + 1, s_kv));
  }
  return KeyWindows::explicit_windows(ks, ke, s_kv);
}

// Windows in which every row sees most keys: full, a prefix (causal, offset s_kv - s_q) or MTP.
KeyWindows draw_long_windows(int64_t s_q, int64_t s_kv, std::string* drawn) {
  *drawn = *rc::gen::element<std::string>("full", "prefix", "mtp");
  if (*drawn == "full") return KeyWindows::full(s_q, s_kv);
  if (*drawn == "prefix") return KeyWindows::causal(s_q, s_kv, s_kv - s_q);
  return draw_windows(s_q, s_kv, "mtp");
}

// A limit row of a many-row draw scores its key > 0: head 0's q bytes become the key's bytes
// (q·k = Σ k_c² > 0 for a nonzero key row) and its weight w[w_at] positive.
void make_row_live(uint8_t* q_head0, const uint8_t* key, int64_t d, Tensor& w, int64_t w_at) {
  std::memcpy(q_head0, key, static_cast<size_t>(d));
  const double wv = std::fabs(w.get(w_at));
  w.set(w_at, wv > 0 ? wv : 1.0);
}

// Query row `q_row` (h heads of d FP8 bytes; weights w[w_at, w_at + h)) scores the key of bytes
// `key` (an all-zero key gets its first byte 1.0) through head 0 with q_0 = k (x_0 = q_0·k =
// Σ_c k_c² > 0) and w_0 > 0 (make_row_live), then |Σ_j w_j x_j| >= |w_0 x_0|/2: a row whose
// heads cancel on that key gets w_0 x4 (|4a + b| >= 2.5|a| when |a + b| < |a|/2; exact-tier
// weights stay small integers). The key's score then depends on its bytes' signs:
// Σ_j w_j ReLU(x_j) - Σ_j w_j ReLU(-x_j) = Σ_j w_j x_j != 0 (times its scale > 0), so a kernel
// reading the key's sign-flipped alias row (the draws past 16 bits) is wrong on this row.
// Without it a draw whose weights or products cancelled passed such a kernel (paged positions,
// level 1 seed 2; FP8 keys, exact tier, level 1 seeds 3 and 8).
void make_row_score_key(uint8_t* q_row, int64_t h, uint8_t* key, int64_t d, Fp8Format f, Tensor& w,
                        int64_t w_at) {
  // an all-zero key (±0 bytes) scores 0 read either way: its first byte becomes 1.0
  if (std::all_of(key, key + d, [](uint8_t b) { return (b & 0x7F) == 0; })) key[0] = double_to_fp8(1.0, f);
  make_row_live(q_row, key, d, w, w_at);
  double sum = 0, head0 = 0;
  for (int64_t j = 0; j < h; ++j) {
    double x = 0;
    for (int64_t c = 0; c < d; ++c) x += fp8_to_double(q_row[j * d + c], f) * fp8_to_double(key[c], f);
    sum += w.get(w_at + j) * x;
    if (j == 0) head0 = w.get(w_at) * x;
  }
  if (std::abs(sum) < 0.5 * std::abs(head0)) w.set(w_at, 4 * w.get(w_at));
}

double bad_scale(Rng& r) {
  const double v[] = {0.0, -1.0, -0.25, std::numeric_limits<double>::quiet_NaN(),
                      std::numeric_limits<double>::infinity(), -0.0};
  return v[irand(r, 0, 5)];
}

}  // namespace

namespace {
// FP8 indexer keys past 2^16 (outside tester F3, as the bf16 indexer's widen_indexer_keys in
// generators.cpp: no FP8 indexer draw had a key >= 65536, so a kernel addressing k_idx /
// k_scale rows in 16 bits passed). The key rows [0, s_kv) move to [off, off + s_kv), off =
// 65536 - m with m drawn in [0, the largest key a window shows], and the windows with them, so
// that key (and every window key >= m) lies past 65535 while the others stay below. The new
// row s & 0xFFFF = s - 65536 of each key s past 65535 holds that key's bytes with their sign
// bits flipped (0x80; NaN bytes stay NaN) and its scale: a kernel reading it scores
// Σ_j w_j·scale·ReLU(-x_j) for Σ_j w_j·scale·ReLU(x_j) (x_j = q_j·k), which differs whenever
// Σ_j w_j x_j != 0 (a NaN row would not do: ReLU as max(x, 0) maps NaN to 0). The other new
// rows hold NaN bytes and scale 0 (unread: SPEC §10 lets them hold anything). Returns the
// description.
std::string widen_fp8_indexer_keys(Fp8IndexerInputs& in, Rng& r) {
  const int64_t s_kv = in.k_idx.size(0), d = in.k_idx.size(1), h = in.q_idx.size(1);
  const int64_t top = detail::largest_window_key(in.windows);
  if (top >= 0) {  // a row showing key `top` (moved past 65535 whatever m is) scores it nonzero
    const int64_t t = detail::row_showing(in.windows, top);
    make_row_score_key(in.q_idx.data<uint8_t>() + t * h * d, h, in.k_idx.data<uint8_t>() + top * d, d, in.format,
                       in.w, t * h);
  }
  const int64_t m = top >= 0 ? irand(r, 0, top) : 0;
  const int64_t off = detail::kIds16 - m, n2 = s_kv + off;
  Tensor k = detail::relocate_rows(in.k_idx, off, n2);
  Tensor scale = detail::relocate_rows(in.k_scale, off, n2);
  uint8_t* kb = k.data<uint8_t>();
  std::memset(kb, kNanByte, static_cast<size_t>(off * d));
  for (int64_t s = m; s < s_kv; ++s) {  // key s sits at s + off >= 65536; its alias row s - m
    for (int64_t c = 0; c < d; ++c) kb[(s - m) * d + c] = static_cast<uint8_t>(kb[(s + off) * d + c] ^ 0x80);
    scale.data<float>()[s - m] = scale.data<float>()[s + off];
  }
  in.k_idx = k;
  in.k_scale = scale;
  std::vector<int64_t> ks = in.windows.ks, ke = in.windows.ke;
  for (auto& x : ks) x += off;
  for (auto& x : ke) x += off;
  in.windows = KeyWindows::explicit_windows(ks, ke, n2);
  return " keys_past_65536(k_idx rows moved by " + std::to_string(off) + " to s_kv=" + std::to_string(n2) +
         ", largest window key " + std::to_string(top >= 0 ? top + off : -1) + ")";
}
}  // namespace

Fp8IndexerCase draw_fp8_indexer_case(const std::string& flavor, bool wide_keys) {
  Fp8IndexerCase c;
  if (!flavor.empty() && flavor != "exact" && flavor != "bad_scale" && flavor != "many_rows" && flavor != "production")
    throw std::invalid_argument("draw_fp8_indexer_case: unknown flavor \"" + flavor + "\"");
  const bool exact = flavor == "exact", many = flavor == "many_rows", prod = flavor == "production";
  // Keys past 65535 on a run's draw detail::kWideIdsDraw (widen_fp8_indexer_keys), "" and
  // "exact" only; such a draw has d_I 16 (case cost: every decode spans 65537+ key rows).
  const bool wide = wide_keys && (flavor.empty() || exact) && draw_index() == detail::kWideIdsDraw;
  const int level = generation_level();
  const int64_t s_q = many ? draw_many_row_count() : prod ? draw_in(1, level == 0 ? 2 : 4) : draw_in(1, 6);
  const int64_t h = prod ? 64 : many ? *rc::gen::element<int64_t>(1, 2) : *rc::gen::element<int64_t>(1, 2, 4, 8);
  const int64_t d_drawn = prod ? 128 : many ? *rc::gen::element<int64_t>(16, 32) : *rc::gen::element<int64_t>(16, 32, 64, 128);
  const int64_t d = wide ? 16 : d_drawn;
  const int64_t s_kv = many ? *rc::gen::element<int64_t>(1, 2, 5, 8, 13, 64, 65)
                       : prod ? production_keys(level)
                              : *rc::gen::weightedOneOf<int64_t>(
                                    {{4, rc::gen::inRange<int64_t>(1, 24)}, {1, rc::gen::element<int64_t>(63, 64, 65)}});
  Fp8IndexerInputs& in = c.in;
  const Fp8Format format = draw_grid_format(exact);
  std::string wkind;
  if (many) in.windows = draw_row_windows(s_q, s_kv, &wkind);
  else if (prod) in.windows = draw_long_windows(s_q, s_kv, &wkind);
  else in.windows = draw_windows(s_q, s_kv, flavor == "bad_scale" ? "causal" : nullptr, &wkind);
  if (wide) {  // the wide draw shows a key: when every window is empty, row 0's becomes [0, s_kv)
    bool any_key = false;
    for (int64_t t = 0; t < s_q; ++t) any_key = any_key || in.windows.length(t) > 0;
    if (!any_key) {
      std::vector<int64_t> ks = in.windows.ks, ke = in.windows.ke;
      ks[0] = 0;
      ke[0] = s_kv;
      in.windows = KeyWindows::explicit_windows(ks, ke, s_kv);
      wkind += "+row0_full";
    }
  }
  const Fp8Grid grid{format, draw_grid_kind(exact)};  // drawn after the windows (reproducible draws)
  const ScaleKind kind = grid.kind;
  in.format = format;
  Rng r = draw_rng();
  in.q_idx = Tensor(DType::U8, {s_q, h, d});
  in.k_idx = Tensor(DType::U8, {s_kv, d});
  in.k_scale = Tensor(DType::F32, {s_kv});
  in.w = fill_queries(in.q_idx.data<uint8_t>(), s_q, h, d, grid, exact, r);
  for (int64_t s = 0; s < s_kv; ++s)
    in.k_scale.data<float>()[s] = fill_row(in.k_idx.data<uint8_t>() + s * d, d, in.format, kind, exact, r);
  if (many)  // each limit row: head 0 scores its first window key > 0 (q row = that key's bytes)
    for (const int64_t t : many_row_limit_rows(s_q))
      make_row_live(in.q_idx.data<uint8_t>() + t * h * d, in.k_idx.data<uint8_t>() + in.windows.ks[t] * d, d,
                    in.w, t * h);
  // Keys no window reads: NaN bytes and garbage scales.
  const std::vector<char> read = read_mask(in);
  int64_t unread = 0;
  for (int64_t s = 0; s < s_kv; ++s)
    if (!read[static_cast<size_t>(s)]) {
      ++unread;
      std::memset(in.k_idx.data<uint8_t>() + s * d, kNanByte, static_cast<size_t>(d));
      in.k_scale.set(s, bad_scale(r));
    }
  if (flavor == "bad_scale") {
    std::vector<int64_t> keys;
    for (int64_t s = 0; s < s_kv; ++s)
      if (read[static_cast<size_t>(s)]) keys.push_back(s);
    RC_PRE(!keys.empty());
    c.bad_key = keys[static_cast<size_t>(irand(r, 0, static_cast<int64_t>(keys.size()) - 1))];
    in.k_scale.set(c.bad_key, bad_scale(r));
  }
  const std::string wide_desc = wide ? widen_fp8_indexer_keys(in, r) : "";
  c.desc = "fp8 indexer s_q=" + std::to_string(s_q) + " H_I=" + std::to_string(h) + " d_I=" +
           std::to_string(d) + " s_kv=" + std::to_string(s_kv) + " " + to_string(in.format) +
           " scales=" + to_string(kind) + " windows=" + wkind + " unread_nan_keys=" + std::to_string(unread) +
           (c.bad_key >= 0 ? " bad_scale_key=" + std::to_string(c.bad_key) : "") +
           (many || prod ? " flavor=" + flavor : "") + wide_desc;
  return c;
}

namespace {
// Physical pages past 2^16 (outside tester F3: no paged draw had a block id >= 65536, so a
// kernel keeping block_table entries in 16 bits passed). Block size 1 (so the cache grows by
// 65536 - m rows, not blocks of 16 or 64). The cache's blocks [0, nb) move to [off, off + nb),
// off = 65536 - m with m drawn in [0, the largest block id a read entry holds], so that block
// (and every read block >= m) lies past 65535 while the others stay below; every table entry
// follows its block (detail::relocated_id: -1 stays -1, an id past the end keeps its distance
// past the new end, a stale valid id moves). The new block e & 0xFFFF = e - 65536 of each
// block e past 65535 holds e's keys with their sign bits flipped and e's scales: a kernel
// reading it scores Σ_j w_j·scale·ReLU(-x_j) for Σ_j w_j·scale·ReLU(x_j), different whenever
// Σ_j w_j x_j != 0 (see widen_fp8_indexer_keys). The other new blocks hold NaN bytes and scale
// 0, as unread slots do. Returns the description.
std::string widen_paged_blocks(PagedIndexerInputs& in, Rng& r) {
  const int64_t nb = in.k_cache.size(0), bs = in.k_cache.size(1), d = in.k_cache.size(2);
  const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
  const int32_t* tab = in.block_table.data<int32_t>();
  const int32_t* lens = in.context_lens.data<int32_t>();
  const int64_t next_n = in.q_idx.size(1), h = in.q_idx.size(2);
  int64_t top = -1, top_b = -1, top_i = 0;  // the largest block id a read entry holds, its entry
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i)
      if (tab[b * max_blocks + i] > top) std::tie(top, top_b, top_i) = std::make_tuple(tab[b * max_blocks + i], b, i);
  if (top >= 0) {  // the request's last row (its window holds the whole context) scores the
    // block's first key nonzero: that key moves past 65535 whatever m is
    const int64_t row = top_b * next_n + next_n - 1;
    make_row_score_key(in.q_idx.data<uint8_t>() + row * h * d, h, in.k_cache.data<uint8_t>() + top * bs * d, d,
                       in.format, in.w, row * h);
  }
  const int64_t m = top >= 0 ? irand(r, 0, top) : 0;
  const int64_t off = detail::kIds16 - m, nb2 = nb + off, row = bs * d;
  Tensor cache = detail::relocate_rows(in.k_cache, off, nb2);
  Tensor scales = detail::relocate_rows(in.k_scale_cache, off, nb2);
  uint8_t* cb = cache.data<uint8_t>();
  float* sc = scales.data<float>();
  std::memset(cb, kNanByte, static_cast<size_t>(off * row));
  for (int64_t e = m; e < nb; ++e) {  // block e sits at e + off >= 65536; its alias block e - m
    for (int64_t x = 0; x < row; ++x) cb[(e - m) * row + x] = static_cast<uint8_t>(cb[(e + off) * row + x] ^ 0x80);
    for (int64_t x = 0; x < bs; ++x) sc[(e - m) * bs + x] = sc[(e + off) * bs + x];
  }
  in.k_cache = cache;
  in.k_scale_cache = scales;
  detail::relocate_ids(in.block_table, nb, off, nb2);
  return " blocks_past_65536(cache blocks moved by " + std::to_string(off) + " to num_blocks=" + std::to_string(nb2) +
         ", largest read block " + std::to_string(top >= 0 ? top + off : -1) + ")";
}
}  // namespace

PagedIndexerCase draw_paged_indexer_case(const std::string& flavor, bool wide_keys) {
  PagedIndexerCase c;
  PagedIndexerInputs& in = c.in;
  if (!flavor.empty() && flavor != "mtp" && flavor != "bad_table" && flavor != "many_rows" && flavor != "production" &&
      flavor != "exact")
    throw std::invalid_argument("draw_paged_indexer_case: unknown flavor \"" + flavor + "\"");
  const bool many = flavor == "many_rows", prod = flavor == "production", exact = flavor == "exact";
  // Past 16 bits (with `wide_keys`; outside tester F3): a run's draw detail::kWideIdsDraw of
  // the "" and "exact" flavors has its physical blocks past 65535 (widen_paged_blocks), draw
  // detail::kLongContextDraw of "exact" one request's context past 65536 keys. Both use block
  // size 1 (the long context's logical block index is its key position) and d_I <= 32; the long
  // context d_I 16, batch, next_n and H_I <= 2. Case cost: every call scores 65537+ keys per row
  // of that request; the ratio check calls the kernel and the two references on three runs
  // (poisoned twins), ~1.5 s CPU a draw, the exact tier once (~0.3 s), so "" does not draw it.
  const bool wide_blocks = wide_keys && (flavor.empty() || exact) && draw_index() == detail::kWideIdsDraw;
  const bool long_ctx = wide_keys && exact && draw_index() == detail::kLongContextDraw;
  const int level = generation_level();
  // Many rows: batch · next_n >= 257 query rows (finding F8: rows past 64 returned 0 passed);
  // production: H_I 64, d_I 128, contexts past 192 keys (up to 1100 at level 0, 4097 above).
  const int64_t next_n_drawn = flavor == "mtp" ? draw_in(2, 4) : prod ? draw_in(1, 2) : draw_in(1, 4);
  const int64_t batch_drawn =
      many ? (draw_many_row_count() + next_n_drawn - 1) / next_n_drawn : prod ? draw_in(1, 2) : draw_in(1, 4);
  // (the long context: batch and next_n <= 2, every row's floors and outputs span 65537+ columns)
  const int64_t next_n = long_ctx ? std::min<int64_t>(next_n_drawn, 2) : next_n_drawn;
  const int64_t batch = long_ctx ? std::min<int64_t>(batch_drawn, 2) : batch_drawn;
  const int64_t bs_drawn = prod ? 64 : *rc::gen::element<int64_t>(1, 16, 64);
  const int64_t h_drawn = prod ? 64 : many ? *rc::gen::element<int64_t>(1, 2) : *rc::gen::element<int64_t>(1, 2, 4);
  const int64_t d_drawn = prod ? 128 : *rc::gen::element<int64_t>(16, 32, 64);
  const int64_t bs = wide_blocks || long_ctx ? 1 : bs_drawn;
  const int64_t h = long_ctx ? std::min<int64_t>(h_drawn, 2) : h_drawn;
  const int64_t d = long_ctx ? 16 : wide_blocks ? std::min<int64_t>(d_drawn, 32) : d_drawn;
  std::vector<int32_t> lens;
  if (many || prod) {
    Rng lr = draw_rng();
    for (int64_t b = 0; b < batch; ++b)  // every row's window holds >= 1 key
      lens.push_back(static_cast<int32_t>(
          many ? irand(lr, next_n, next_n + std::min<int64_t>(2 * bs, 40))
               : b == 0 && draw_index() == 0 ? 1025 : irand(lr, 193, level == 0 ? 1100 : 4097)));
  } else {
    for (int64_t b = 0; b < batch; ++b)
      lens.push_back(static_cast<int32_t>(*rc::gen::weightedOneOf<int64_t>(
          {{1, rc::gen::just<int64_t>(0)},
           {1, rc::gen::inRange<int64_t>(1, next_n + 1)},
           {4, rc::gen::inRange<int64_t>(1, std::min<int64_t>(3 * bs, 130) + 1)},
           {1, rc::gen::just<int64_t>(int64_t{bs})}})));
  }
  // The long-context draw: request long_b's context holds 65536 + x keys (x in [1, 48]); the
  // blocks-past-16-bits draw reads at least one key.
  int64_t long_b = -1;
  if (long_ctx) {
    long_b = draw_in(0, batch - 1);
    lens[static_cast<size_t>(long_b)] = static_cast<int32_t>(detail::kIds16 + draw_in(1, 48));
  }
  if (wide_blocks && std::all_of(lens.begin(), lens.end(), [](int32_t L) { return L == 0; })) lens[0] = 1;
  const Fp8Grid grid{draw_grid_format(exact), draw_grid_kind(exact)};
  in.format = grid.format;
  const ScaleKind kind = grid.kind;
  Rng r = draw_rng();
  int64_t max_blocks = 1, used = 0;
  for (int32_t L : lens) {
    max_blocks = std::max<int64_t>(max_blocks, (L + bs - 1) / bs + irand(r, 0, 2));
    used += (L + bs - 1) / bs;
  }
  const int64_t num_blocks = used + irand(r, 0, 3);
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r);
  // Entries past a context: -1, an out-of-range id, or a stale (valid) id.
  std::vector<int32_t> table(static_cast<size_t>(batch * max_blocks));
  for (auto& e : table) {
    const int64_t pick = irand(r, 0, 2);
    e = pick == 0 ? -1 : pick == 1 ? static_cast<int32_t>(num_blocks + irand(r, 0, 1000))
                                   : static_cast<int32_t>(irand(r, 0, std::max<int64_t>(0, num_blocks - 1)));
  }
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) table[b * max_blocks + i] = perm[next++];
  in.block_table = Tensor::from_i32({batch, max_blocks}, table);
  in.context_lens = Tensor::from_i32({batch}, lens);
  // Cache: every slot filled with NaN bytes and garbage scales, then the context keys.
  in.k_cache = Tensor(DType::U8, {num_blocks, bs, d});
  std::memset(in.k_cache.raw(), kNanByte, in.k_cache.nbytes());
  in.k_scale_cache = Tensor(DType::F32, {num_blocks, bs});
  for (int64_t i = 0; i < in.k_scale_cache.numel(); ++i) in.k_scale_cache.set(i, bad_scale(r));
  const int32_t* tab = in.block_table.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < lens[b]; ++p) {
      const int64_t row = static_cast<int64_t>(tab[b * max_blocks + p / bs]) * bs + p % bs;
      in.k_scale_cache.data<float>()[row] =
          fill_row(in.k_cache.data<uint8_t>() + row * d, d, in.format, kind, exact, r);
    }
  // Logical keys past 65535 (outside tester F3: no paged draw had a context past 4097 keys, so a
  // kernel keeping key positions, or with block size 1 logical block indices, in 16 bits
  // passed): key p >= 65536 of the long request holds key p - 65536's bytes with their sign bits
  // flipped and its scale, so a kernel reading position p & 0xFFFF for p scores
  // Σ_j w_j·scale·ReLU(x_j) for Σ_j w_j·scale·ReLU(-x_j) (different whenever Σ_j w_j x_j != 0).
  if (long_ctx) {
    uint8_t* cb = in.k_cache.data<uint8_t>();
    float* sc = in.k_scale_cache.data<float>();
    for (int64_t p = detail::kIds16; p < lens[static_cast<size_t>(long_b)]; ++p) {
      const int64_t to = static_cast<int64_t>(tab[long_b * max_blocks + p]), from = tab[long_b * max_blocks + p - detail::kIds16];
      for (int64_t x = 0; x < d; ++x) cb[to * d + x] = static_cast<uint8_t>(cb[from * d + x] ^ 0x80);
      sc[to] = sc[from];
    }
  }
  in.q_idx = Tensor(DType::U8, {batch, next_n, h, d});
  in.w = fill_queries(in.q_idx.data<uint8_t>(), batch * next_n, h, d, grid, exact, r);
  if (many)  // each limit row: head 0 scores logical key 0 of its request > 0
    for (const int64_t row : many_row_limit_rows(batch * next_n)) {
      const int64_t b = row / next_n, key = static_cast<int64_t>(tab[b * max_blocks]) * bs;
      make_row_live(in.q_idx.data<uint8_t>() + row * h * d, in.k_cache.data<uint8_t>() + key * d, d, in.w, row * h);
    }
  // The long request's last row (its window holds every key, 65536 included) scores key 65536
  // nonzero (make_row_score_key): key 0's bytes are its own with their signs flipped.
  if (long_ctx) {
    const int64_t row = long_b * next_n + next_n - 1;
    make_row_score_key(in.q_idx.data<uint8_t>() + row * h * d, h,
                       in.k_cache.data<uint8_t>() + static_cast<int64_t>(tab[long_b * max_blocks + detail::kIds16]) * d,
                       d, in.format, in.w, row * h);
  }
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  in.max_context = draw_in(0, 1) ? -1 : max_len + irand(r, 0, 5);
  if (flavor == "bad_table") {
    const int64_t b = irand(r, 0, batch - 1);
    if (lens[b] > 0 && irand(r, 0, 1)) {
      // A read entry out of range.
      const int64_t i = irand(r, 0, (lens[b] + bs - 1) / bs - 1);
      in.block_table.data<int32_t>()[b * max_blocks + i] =
          irand(r, 0, 1) ? -1 : static_cast<int32_t>(num_blocks + irand(r, 0, 5));
    } else {
      in.context_lens.data<int32_t>()[b] = static_cast<int32_t>(max_blocks * bs + irand(r, 1, 3));
      in.max_context = -1;
    }
  }
  const std::string wide_desc = wide_blocks ? widen_paged_blocks(in, r)
                                : long_ctx  ? " context_past_65536(request " + std::to_string(long_b) + ")"
                                            : "";
  std::string ls;
  for (int32_t L : lens) ls += (ls.empty() ? "" : ",") + std::to_string(L);
  c.desc = "paged indexer batch=" + std::to_string(batch) + " next_n=" + std::to_string(next_n) +
           " block_size=" + std::to_string(bs) + " context_lens=[" + ls + "] max_blocks=" +
           std::to_string(max_blocks) + " num_blocks=" + std::to_string(num_blocks) + " H_I=" +
           std::to_string(h) + " d_I=" + std::to_string(d) + " " + to_string(in.format) +
           " scales=" + to_string(kind) + (flavor.empty() ? "" : " flavor=" + flavor) + wide_desc;
  return c;
}

SmlaFp8Case draw_smla_fp8_case(const std::string& flavor) {
  SmlaFp8Case c;
  SparseMlaFp8Inputs& in = c.in;
  if (!flavor.empty() && flavor != "many_rows" && flavor != "production" && flavor != "wide_ids")
    throw std::invalid_argument("draw_smla_fp8_case: unknown flavor \"" + flavor + "\"");
  const bool many = flavor == "many_rows", prod = flavor == "production";
  const int level = generation_level();
  // Many rows: s_q >= 257 (finding F8: rows past 128 returned 0 passed). Production (finding
  // F8: heads past 64 and slots past 128 ignored passed), s_q 1, one of two kinds (the first
  // draw "heads", the second "slots"): "heads" h_q 128 with k 16 or 32 (64 at levels >= 1),
  // "slots" h_q 1-2 with k 129 or 256 (levels >= 1: 512 or 2048); over k + 1 .. 2k + 1
  // tokens. A draw of both (h_q 128, k > 128) costs seconds to condition for the bf16 class
  // (unconditioned, most of its out rows are WEAK: out averages over > 100 keys); h_q 2-16
  // with k 2048 took 31 s CPU for 3 level-1 draws.
  const std::string prod_kind = !prod ? "" : draw_index() == 0 ? "heads" : draw_index() == 1 ? "slots"
                                         : *rc::gen::element<std::string>("heads", "slots");
  const int64_t s_q = many ? draw_many_row_count() : prod ? 1 : draw_in(1, 5);
  const int64_t h = many ? *rc::gen::element<int64_t>(1, 2)
                    : prod_kind == "heads" ? 128
                    : prod_kind == "slots" ? *rc::gen::element<int64_t>(1, 2)
                                           : *rc::gen::element<int64_t>(1, 2, 16);
  const int64_t prod_k = prod_kind == "heads" ? (level == 0 ? *rc::gen::element<int64_t>(16, 32) : 64)
                                              : (level == 0 ? *rc::gen::element<int64_t>(129, 256)
                                                            : *rc::gen::element<int64_t>(512, 2048));
  const int64_t bs = prod ? 64 : *rc::gen::element<int64_t>(1, 16, 64);
  const int64_t num_blocks = prod ? (prod_k + *rc::gen::element<int64_t>(1, prod_k + 1) + bs) / bs
                             : bs == 64 ? draw_in(1, 2) : bs == 16 ? draw_in(1, 5) : draw_in(2, 40);
  const int64_t tokens = num_blocks * bs;
  const int64_t k = prod ? prod_k
                    : many ? *rc::gen::element<int64_t>(1, 2, 3, 5, 8, 16, 17)
                           : *rc::gen::weightedOneOf<int64_t>(
                                 {{4, rc::gen::inRange<int64_t>(1, 17)}, {1, rc::gen::element<int64_t>(63, 64, 65)},
                                  {1, rc::gen::just<int64_t>(tokens + 3)}});
  // Many-row draws use power-of-two tile scales (where the two baselines coincide: one
  // conditioning pass; amax scales took up to 13 s CPU a level-0 run over 1100 rows).
  bool pow2 = many || *rc::gen::arbitrary<bool>();
  Rng r = draw_rng();
  in.q = Tensor(DType::BF16, {s_q, h, kMlaFp8Dqk});
  for (int64_t i = 0; i < in.q.numel(); ++i) in.q.set(i, uni(r, -1, 1));
  const double spread = std::exp2(uni(r, -1, 1));  // the logits' spread, set below
  // kv rows: per-tile amplitudes from 2^-8 to 2^6; some values at a tile's max, some tiny.
  Tensor kv(DType::F64, {tokens, kMlaFp8Dqk});
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t tile = 0; tile < 5; ++tile) {
      const int64_t lo = tile * kMlaFp8TileSize, hi = std::min(lo + kMlaFp8TileSize, kMlaFp8Dqk);
      const double amp = std::exp2(static_cast<double>(irand(r, -8, 6)));
      for (int64_t col = lo; col < hi; ++col) {
        double v = uni(r, -amp, amp);
        if (irand(r, 0, 40) == 0) v = amp * (irand(r, 0, 1) ? 1 : -1);
        if (irand(r, 0, 40) == 0) v = amp * 1e-4;
        kv.set(t * kMlaFp8Dqk + col, v);
      }
    }
  // Logits of a few units (SPEC §9 WEAK): sm_scale = spread·√d_qk / (max |q row| · max |kv
  // row|), so sm·|q ∘ kv|_2 <= spread. A FlashMLA-style kernel converts fp8 · scale to bf16
  // before its MMAs, which moves each logit by ~2^-9 of that; with logits of hundreds (tile
  // amplitudes up to 2^6) out moved by percents and a bf16 kernel could not be pinned to 1 %.
  double qmax = 0, kvmax = 0;
  for (int64_t row = 0; row < s_q * h; ++row) {
    double n2 = 0;
    for (int64_t col = 0; col < kMlaFp8Dqk; ++col) n2 += in.q.get(row * kMlaFp8Dqk + col) * in.q.get(row * kMlaFp8Dqk + col);
    qmax = std::max(qmax, std::sqrt(n2));
  }
  for (int64_t t = 0; t < tokens; ++t) {
    double n2 = 0;
    for (int64_t col = 0; col < kMlaFp8Dqk; ++col) n2 += kv.get(t * kMlaFp8Dqk + col) * kv.get(t * kMlaFp8Dqk + col);
    kvmax = std::max(kvmax, std::sqrt(n2));
  }
  in.sm_scale = qmax > 0 && kvmax > 0 ? spread * std::sqrt(static_cast<double>(kMlaFp8Dqk)) / (qmax * kvmax) : 1.0;
  in.kv_cache = encode_mla_fp8_cache(kv, pow2 ? Fp8ScaleRule::Pow2 : Fp8ScaleRule::Amax)
                    .reshaped({num_blocks, bs, kMlaFp8TokenBytes});
  // Ids: valid, -1, out of range, INT32_MIN/MAX, duplicates; some rows all invalid.
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k));
  const int64_t pool = std::max<int64_t>(1, tokens - irand(r, 0, std::min<int64_t>(tokens - 1, 8)));
  for (int64_t t = 0; t < s_q; ++t) {
    const bool empty = !prod && irand(r, 0, 5) == 0;
    // Production rows: most slots valid, so slots past 128 are read.
    const int64_t n_valid = empty ? 0 : prod ? irand(r, k - k / 8, k) : irand(r, 1, k);
    for (int64_t j = 0; j < k; ++j) {
      int32_t id;
      if (j < n_valid) id = static_cast<int32_t>(irand(r, 0, pool - 1));
      else {
        const int32_t bad[] = {-1, static_cast<int32_t>(tokens), std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max(), -7};
        id = bad[irand(r, 0, 4)];
      }
      ids[static_cast<size_t>(t * k + j)] = id;
    }
    std::shuffle(ids.begin() + t * k, ids.begin() + (t + 1) * k, r);
  }
  std::vector<int32_t> lengths;
  if (*rc::gen::arbitrary<bool>() || many) {
    // One row in eight a negative length (SPEC §4: no valid slot; finding F11).
    // Production rows (s_q 1) never negative and past slot 128: their draw is the one that
    // reaches slots past a 128-slot tile (fp8_ops_keys_past_tile_ignored passed
    // smla_fp8.production_shapes on a fresh seed when its one row had no valid slot past 128).
    for (int64_t t = 0; t < s_q; ++t)
      lengths.push_back(static_cast<int32_t>(
          prod                ? std::max<int64_t>(irand(r, k - k / 8, k), std::min<int64_t>(k, 129))
          : irand(r, 0, 7) == 0 ? std::vector<int64_t>{-1, -5, std::numeric_limits<int32_t>::min()}[static_cast<size_t>(irand(r, 0, 2))]
                              : irand(r, 0, k)));
  }
  if (prod && k > 128)  // a valid id in slot 128 of every row (read: its length is past 128)
    for (int64_t t = 0; t < s_q; ++t) ids[static_cast<size_t>(t * k + 128)] = static_cast<int32_t>(irand(r, 0, pool - 1));
  if (many && s_q > 1) {
    // Row 0 (no limit row) negative with a valid id: a kernel reading the length as unsigned
    // reads it (smla_topk_length_unsigned passed smla_fp8.many_rows on fresh seeds when no
    // negative row held a valid id).
    lengths[0] = -1;
    ids[0] = static_cast<int32_t>(irand(r, 0, pool - 1));
  }
  if (many)  // each limit row holds a valid slot before its length
    for (const int64_t t : many_row_limit_rows(s_q)) {
      if (!lengths.empty() && lengths[static_cast<size_t>(t)] < 1) lengths[static_cast<size_t>(t)] = 1;
      const int64_t n = lengths.empty() ? k : std::min<int64_t>(k, lengths[static_cast<size_t>(t)]);
      bool valid = false;
      for (int64_t j = 0; j < n && !valid; ++j) valid = ids[static_cast<size_t>(t * k + j)] >= 0 && ids[static_cast<size_t>(t * k + j)] < tokens;
      if (!valid) ids[static_cast<size_t>(t * k)] = static_cast<int32_t>(irand(r, 0, pool - 1));
    }
  // The wide-id draw (a run's draw detail::kWideIdsDraw of the "wide_ids" flavor; the tokens move
  // past 65535 below) selects a token: the first row without a negative length (row 0 when
  // every length is negative: its length becomes 1) holds a valid slot before its length.
  const bool wide = flavor == "wide_ids" && draw_index() == detail::kWideIdsDraw;
  if (wide) {
    int64_t t = 0;
    while (!lengths.empty() && t + 1 < s_q && lengths[static_cast<size_t>(t)] < 0) ++t;
    if (!lengths.empty() && lengths[static_cast<size_t>(t)] < 1) lengths[static_cast<size_t>(t)] = 1;
    const int64_t n = lengths.empty() ? k : std::min<int64_t>(k, lengths[static_cast<size_t>(t)]);
    bool valid = false;
    for (int64_t j = 0; j < n && !valid; ++j)
      valid = ids[static_cast<size_t>(t * k + j)] >= 0 && ids[static_cast<size_t>(t * k + j)] < tokens;
    if (!valid) ids[static_cast<size_t>(t * k + irand(r, 0, n - 1))] = static_cast<int32_t>(irand(r, 0, pool - 1));
  }
  in.indices = Tensor::from_i32({s_q, k}, ids);
  if (!lengths.empty()) in.topk_length = Tensor::from_i32({s_q}, lengths);
  if (*rc::gen::arbitrary<bool>()) {
    in.attn_sink = Tensor(DType::F32, {h});
    for (int64_t i = 0; i < h; ++i) in.attn_sink->set(i, irand(r, 0, 6) == 0 ? -INFINITY : uni(r, -2, 2));
  }
  // Tokens no valid slot reads: NaN bytes, NaN scales, NaN RoPE.
  const std::vector<char> read = read_mask(in);
  int64_t unread = 0;
  for (int64_t s = 0; s < tokens; ++s)
    if (!read[static_cast<size_t>(s)]) {
      ++unread;
      std::memset(in.kv_cache.data<uint8_t>() + s * kMlaFp8TokenBytes, 0xFF, static_cast<size_t>(kMlaFp8TokenBytes));
    }
  // The bf16 class (a FlashMLA-style kernel's bf16 out, SPEC §9 WEAK): rows whose out bound
  // exceeds 0.8 θ of their row scale get q[t, h, :] redrawn, judged as the detection test
  // judges them (judge_outputs on the float64 reference with out rounded to bf16; the
  // generators' shared conditioning, src/conditioning.h). A redrawn row is uniform(-1, 1) like
  // the first draw, so sm·|q ∘ kv|_2 stays near `spread` (its norm may exceed the first draw's
  // largest by a few percent). Measured (Detection.GeneratedFp8SmlaCasesHaveNoWeakRows, level
  // 0-1): draws with a WEAK bf16 out row 6, 2, 5 of 100 at seeds 1-3 before, 0 of 2000 after
  // (seeds 1-10 x 200); about one draw in four redraws a row (docs/what-a-pass-means.md).
  auto judge = [&] {
    oracle::OpCase oc;
    oc.mla_fp8 = in;
    const SparseMlaForward f = reference::sparse_mla_fp8_forward(in);
    oracle::CheckOptions opt;
    opt.allow_weak = true;  // the rows are read from the report, not the verdict
    return oracle::judge_outputs(oracle::Op::SparseMlaFp8Fwd, oc,
                                 {{"out", f.out.to(DType::BF16)}, {"lse", f.lse.to(DType::F32)},
                                  {"max_logits", f.max_logits.to(DType::F32)}},
                                 opt, "generator");
  };
  detail::condition_bf16_out_rows(in.q, std::vector<uint8_t>(static_cast<size_t>(s_q * h), 1), {}, r, judge);
  // With amax scales the baseline also runs with the tile scales rounded to bf16 (FlashMLA,
  // fp8_check.cpp): a row over few keys whose out does not cancel then carries that kv's own
  // error (up to ε_T + u16 ≈ 0.6 % of a value) besides P rounding and the bf16 out, about
  // 1.1 % of the row's scale, whatever q is (measured: FalseAlarms seed 33, libtorch-cpu, 15 of
  // 48 rows; a max_logits row, whose scale is its logits' Σ|terms| / (√d_qk + 1), at 1.16 θ
  // in another draw). A query row t with an out, lse or max_logits row still above 0.85 θ
  // gets every slot before its
  // topk_length pointed at tokens the case already reads (more keys: their errors average),
  // then q is conditioned again; up to 8 times.
  for (int round = 0; round < 8; ++round) {
    const oracle::OpReport rep = judge();
    std::vector<uint8_t> redo(static_cast<size_t>(s_q * h), 0);
    bool any = false;
    std::vector<int64_t> reads;
    for (int64_t s = 0; s < tokens; ++s)
      if (read[static_cast<size_t>(s)]) reads.push_back(s);
    for (const auto& t : rep.tensors) {
      if ((t.name != "out" && t.name != "lse" && t.name != "max_logits") ||
          static_cast<int64_t>(t.row_scale.size()) != s_q * h)
        continue;
      for (int64_t q_row = 0; q_row < s_q; ++q_row) {
        bool high = false;
        for (int64_t hh = 0; hh < h; ++hh) {
          const size_t i = static_cast<size_t>(q_row * h + hh);
          high = high || t.row_max_bound[i] > 0.85 * t.theta * t.row_scale[i];
        }
        if (!high || reads.empty()) continue;
        any = true;
        const int64_t len = in.topk_length ? std::min<int64_t>(k, in.topk_length->get(q_row)) : k;
        for (int64_t j = 0; j < len; ++j)
          in.indices.data<int32_t>()[q_row * k + j] =
              static_cast<int32_t>(reads[static_cast<size_t>(irand(r, 0, static_cast<int64_t>(reads.size()) - 1))]);
        for (int64_t hh = 0; hh < h; ++hh) redo[static_cast<size_t>(q_row * h + hh)] = 1;
      }
    }
    if (!any) break;
    detail::condition_bf16_out_rows(in.q, redo, {}, r, judge);
  }
  // Still above 0.95 θ (about one amax draw in 1000 at levels 0-1, rows at 1.005-1.012 θ):
  // the draw falls back to power-of-two scales (the tiles re-encoded, unread tokens NaN again),
  // where the two baselines coincide, and its q rows are conditioned once more.
  if (!pow2) {
    const oracle::OpReport rep = judge();
    bool high = false;
    for (const auto& t : rep.tensors)
      if (t.name == "out" || t.name == "lse" || t.name == "max_logits")
        for (size_t i = 0; i < t.row_scale.size(); ++i)
          high = high || t.row_max_bound[i] > 0.95 * t.theta * t.row_scale[i];
    if (high) {
      pow2 = true;
      in.kv_cache = encode_mla_fp8_cache(kv, Fp8ScaleRule::Pow2).reshaped({num_blocks, bs, kMlaFp8TokenBytes});
      for (int64_t s = 0; s < tokens; ++s)
        if (!read[static_cast<size_t>(s)])
          std::memset(in.kv_cache.data<uint8_t>() + s * kMlaFp8TokenBytes, 0xFF, static_cast<size_t>(kMlaFp8TokenBytes));
      detail::condition_bf16_out_rows(in.q, std::vector<uint8_t>(static_cast<size_t>(s_q * h), 1), {}, r, judge);
    }
  }
  // Token ids past 16 bits (outside tester F3: no FP8 sparse MLA draw selected a token >=
  // 65536, so a kernel keeping token ids in 16 bits passed): the cache's token rows [0, tokens)
  // move to [off, off + tokens), off = 65536 - m with m drawn in [0, the largest selected id],
  // so that id (and every selected id >= m) lands past 65535; the cache grows to whole blocks
  // and every new token holds 0xFF bytes (NaN values, scales and RoPE, as the unread ones), so
  // id & 0xFFFF reads a NaN token. Every id follows its token (detail::relocated_id). Only
  // where the tokens sit changes: every output and rounding is the drawn case's.
  std::string wide_desc;
  if (wide) {
    int64_t top = -1;
    for (int64_t t = 0; t < s_q; ++t) {
      const int64_t len = in.topk_length ? std::min<int64_t>(k, static_cast<int64_t>(in.topk_length->get(t))) : k;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t id = in.indices.data<int32_t>()[t * k + j];
        if (id >= 0 && id < tokens) top = std::max(top, id);
      }
    }
    const int64_t m = top >= 0 ? irand(r, 0, top) : 0;
    const int64_t off = detail::kIds16 - m, blocks2 = (tokens + off + bs - 1) / bs, n2 = blocks2 * bs;
    Tensor cache = detail::relocate_rows(in.kv_cache.reshaped({tokens, kMlaFp8TokenBytes}), off, n2);
    std::memset(cache.raw(), 0xFF, static_cast<size_t>(off * kMlaFp8TokenBytes));
    std::memset(cache.raw() + (off + tokens) * kMlaFp8TokenBytes, 0xFF,
                static_cast<size_t>((n2 - off - tokens) * kMlaFp8TokenBytes));
    in.kv_cache = cache.reshaped({blocks2, bs, kMlaFp8TokenBytes});
    detail::relocate_ids(in.indices, tokens, off, n2);
    wide_desc = " ids_past_16_bits(tokens moved by " + std::to_string(off) + " to " + std::to_string(n2) +
                " tokens, largest selected id " + std::to_string(top >= 0 ? top + off : -1) + ")";
  }
  c.desc = "sparse mla fp8 s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h) +
           " block_size=" + std::to_string(bs) + " tokens=" + std::to_string(tokens) + " k=" +
           std::to_string(k) + (pow2 ? " pow2" : " amax") + " scales topk_length=" +
           (in.topk_length ? "yes" : "no") + " sink=" + (in.attn_sink ? "yes" : "no") +
           " unread_nan_tokens=" + std::to_string(unread) + (flavor.empty() || flavor == "wide_ids" ? "" : " flavor=" + flavor) +
           (prod ? " kind=" + prod_kind : "") + wide_desc;
  return c;
}

}  // namespace dsa::props
