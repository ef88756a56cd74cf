#include "dsa/property_tests/generators.h"

#include <rapidcheck.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace dsa::props {
namespace {

using Rng = std::mt19937_64;

Rng draw_rng() { return Rng(*rc::gen::arbitrary<uint64_t>()); }

int64_t draw_in(int64_t lo, int64_t hi_inclusive) {
  return *rc::gen::inRange<int64_t>(lo, hi_inclusive + 1);
}
template <class T>
T draw_of(std::initializer_list<T> xs) {
  return *rc::gen::elementOf(std::vector<T>(xs));
}
bool draw_bool() { return *rc::gen::arbitrary<bool>(); }

double uni(Rng& r, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(r); }
int64_t irand(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }

// Fills with integers in [-a, a] (exact) or uniform(-a, a), stored in `dtype`; never all zero.
Tensor fill(DType dtype, std::vector<int64_t> shape, Tier tier, double a, Rng& r) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, tier == Tier::Exact ? static_cast<double>(irand(r, -static_cast<int64_t>(a),
                                                                 static_cast<int64_t>(a)))
                                 : uni(r, -a, a));
  if (t.numel() > 0 && all_zero(t)) t.set(0, 1.0);
  return t;
}

std::vector<int64_t> split(int64_t total, int64_t parts, Rng& r) {
  std::vector<int64_t> v(static_cast<size_t>(parts), 0);
  for (int64_t i = 0; i < total; ++i) v[static_cast<size_t>(irand(r, 0, parts - 1))]++;
  return v;
}

}  // namespace

bool all_zero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.get(i) != 0.0) return false;
  return true;
}

KeyWindows draw_windows(int64_t s_q, int64_t s_kv, const char* kind, std::string* drawn) {
  std::string k = kind ? kind : *rc::gen::element<std::string>("full", "causal", "varlen", "mtp",
                                                              "ragged", "empty");
  if (drawn) *drawn = k;
  Rng r = draw_rng();
  if (k == "causal") {
    const int64_t offset = draw_bool() ? -1 : draw_in(0, s_kv);
    return KeyWindows::causal(s_q, s_kv, offset);
  }
  if (k == "varlen" && s_kv >= s_q && s_q >= 1) {
    const int64_t b = draw_in(1, std::min<int64_t>(3, s_q));
    std::vector<int64_t> lq = split(s_q - b, b, r), extra = split(s_kv - s_q, b, r);
    std::vector<int64_t> cq{0}, ck{0};
    for (int64_t i = 0; i < b; ++i) {
      cq.push_back(cq.back() + lq[i] + 1);
      ck.push_back(ck.back() + lq[i] + 1 + extra[i]);
    }
    return KeyWindows::varlen(cq, ck);
  }
  if (k == "mtp" && s_kv >= s_q && s_q >= 1) {
    int64_t next_n = 1;
    for (int64_t n : {3, 2})
      if (s_q % n == 0) { next_n = n; break; }
    const int64_t b = s_q / next_n;
    std::vector<int64_t> extra = split(s_kv - s_q, b, r), ctx;
    for (int64_t i = 0; i < b; ++i) ctx.push_back(next_n + extra[i]);
    return KeyWindows::mtp(ctx, next_n);
  }
  if (k == "ragged" || k == "empty") {
    std::vector<int64_t> ks, ke;
    for (int64_t t = 0; t < s_q; ++t) {
      const int64_t a = irand(r, 0, s_kv), b = irand(r, a, s_kv);
      const bool empty = k == "empty" && irand(r, 0, 2) == 0;
      ks.push_back(empty ? b : a);
      ke.push_back(empty ? irand(r, 0, b) : b);
    }
    return KeyWindows::explicit_windows(ks, ke, s_kv);
  }
  return KeyWindows::full(s_q, s_kv);
}

TopkCase draw_topk_case(const std::string& flavor) {
  TopkCase c;
  const bool wide = *rc::gen::inRange(0, 8) == 0;
  const int64_t s_kv = wide ? draw_of<int64_t>({63, 64, 65, 2047, 2049})
                            : draw_in(1, 24);
  const int64_t s_q = wide ? draw_in(1, 3) : draw_in(1, 6);
  c.k = *rc::gen::weightedOneOf<int64_t>(
      {{1, rc::gen::just<int64_t>(0)}, {2, rc::gen::just<int64_t>(1)},
       {6, rc::gen::inRange<int64_t>(1, s_kv + 1)}, {2, rc::gen::just<int64_t>(int64_t{s_kv})},
       {2, rc::gen::inRange<int64_t>(s_kv + 1, s_kv + 8)},
       {1, rc::gen::element<int64_t>(int64_t{63}, int64_t{64}, int64_t{65}, int64_t{2048})}});
  c.policy.tie_break = *rc::gen::element(TieBreak::Any, TieBreak::Small, TieBreak::Large);
  c.policy.sorted = draw_bool();
  if (flavor == "plateau") {
    c.policy.tie_break = *rc::gen::element(TieBreak::Small, TieBreak::Large);
    c.policy.sorted = true;
  }
  std::string wkind;
  if (draw_bool()) c.windows = draw_windows(s_q, s_kv, nullptr, &wkind);
  const std::string values = flavor == "plateau" || flavor == "neg_inf" || flavor == "nan"
                                 ? flavor
                                 : *rc::gen::element<std::string>("int", "relu", "signed_zero",
                                                                  "random", "neg_inf", "nan");
  Rng r = draw_rng();
  c.scores = Tensor(DType::F32, {s_q, s_kv});
  for (int64_t t = 0; t < s_q; ++t) {
    const bool all_neg_inf = values == "neg_inf" && irand(r, 0, 2) == 0;
    for (int64_t s = 0; s < s_kv; ++s) {
      double v;
      if (values == "int" || values == "plateau") v = static_cast<double>(irand(r, -2, 2));
      else if (values == "relu") v = std::max(0.0, static_cast<double>(irand(r, -3, 3)) * 0.5);
      else if (values == "signed_zero") v = irand(r, 0, 2) == 0 ? 1.0 : (irand(r, 0, 1) ? 0.0 : -0.0);
      else v = uni(r, -4, 4);
      if (values == "neg_inf" && (all_neg_inf || irand(r, 0, 2) == 0)) v = -INFINITY;
      if (values == "nan" && irand(r, 0, 4) == 0) v = NAN;
      c.scores.set(t * s_kv + s, v);
    }
  }
  c.desc = "topk s_q=" + std::to_string(s_q) + " s_kv=" + std::to_string(s_kv) + " k=" +
           std::to_string(c.k) + " values=" + values + " windows=" + (c.windows ? wkind : "none");
  return c;
}

IndexerCase draw_indexer_case(std::optional<Tier> tier, const char* window_kind) {
  IndexerCase c;
  c.tier = tier ? *tier : (draw_bool() ? Tier::Exact : Tier::Random);
  const bool edge = *rc::gen::inRange(0, 6) == 0;
  const int64_t s_q = edge ? draw_of<int64_t>({63, 64, 65}) : draw_in(1, 8);
  const int64_t s_kv = edge ? draw_in(1, 8) : draw_of<int64_t>({1, 2, 3, 5, 8, 13, 63, 64, 65});
  const int64_t h = draw_in(1, 4);
  const int64_t d = draw_of<int64_t>({1, 2, 8, 16, 64});
  std::string wk;
  c.windows = draw_windows(s_q, s_kv, window_kind, &wk);
  Rng r = draw_rng();
  const bool exact = c.tier == Tier::Exact;
  c.q_idx = fill(DType::BF16, {s_q, h, d}, c.tier, exact ? 3 : 1, r);
  c.k_idx = fill(DType::BF16, {s_kv, d}, c.tier, exact ? 3 : 1, r);
  c.w = fill(DType::F32, {s_q, h}, c.tier, exact ? 2 : 1, r);
  c.d_scores = fill(DType::F32, {s_q, s_kv}, c.tier, exact ? 2 : 1, r);
  c.desc = std::string("indexer ") + (exact ? "exact" : "random") + " s_q=" + std::to_string(s_q) +
           " s_kv=" + std::to_string(s_kv) + " H_I=" + std::to_string(h) + " d_I=" +
           std::to_string(d) + " windows=" + wk;
  return c;
}

SmlaCase draw_smla_case(const std::string& layout_in) {
  SmlaCase c;
  const std::string layout =
      layout_in.empty() ? *rc::gen::element<std::string>("mixed", "poison", "empty", "dups",
                                                         "leading_block", "topk_length")
                        : layout_in;
  const int64_t s_q = draw_in(1, 6);
  const int64_t h = draw_in(1, 4);
  const bool big = *rc::gen::inRange(0, 10) == 0;
  const int64_t d_qk = big ? 576 : draw_of<int64_t>({8, 16, 32});
  const int64_t d_v = big ? 512 : draw_of<int64_t>({d_qk / 2, d_qk});
  int64_t s_kv = layout == "dups" ? draw_in(1, 3) : draw_of<int64_t>({2, 3, 5, 9, 17, 63, 64, 65});
  if (layout == "poison") s_kv = std::max<int64_t>(s_kv, 3);
  int64_t k = layout == "leading_block" ? draw_in(65, 80)
                                        : draw_of<int64_t>({1, 2, 3, 5, 8, 16, 63, 64, 65});
  Rng r = draw_rng();
  // Valid ids: poison layout avoids rows 0 and s_kv-1 (they hold NaN and must never be read).
  const int64_t lo = layout == "poison" ? 1 : 0, hi = layout == "poison" ? s_kv - 2 : s_kv - 1;
  const std::vector<int64_t> bad = {-1, std::numeric_limits<int32_t>::min(), s_kv,
                                    std::numeric_limits<int32_t>::max(), s_kv + 7, -5};
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k));
  std::vector<int32_t> lengths(static_cast<size_t>(s_q), static_cast<int32_t>(k));
  const bool use_len = layout == "topk_length" || ((layout == "mixed" || layout == "poison") && draw_bool());
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t pattern = irand(r, 0, 5);  // 0 all valid, 1 front pad, 2 tail pad, 3 holes, 4 empty, 5 mixed
    const bool empty_row = (layout == "empty" && irand(r, 0, 1) == 0) || (pattern == 4 && layout != "leading_block");
    const int64_t front = pattern == 1 ? irand(r, 1, k) : 0;
    const int64_t tail_from = pattern == 2 ? irand(r, 0, k - 1) : k;
    for (int64_t j = 0; j < k; ++j) {
      bool invalid = empty_row || j < front || j >= tail_from ||
                     ((pattern == 3 || pattern == 5) && irand(r, 0, 2) == 0);
      if (layout == "leading_block") invalid = j < 64 || (irand(r, 0, 3) == 0 && j < k - 1);
      int64_t id = invalid ? bad[static_cast<size_t>(irand(r, 0, 5))] : irand(r, lo, hi);
      if (layout == "dups" && !invalid) id = irand(r, 0, std::min<int64_t>(1, s_kv - 1));
      ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(id);
    }
    if (use_len) {
      const int64_t len = irand(r, 0, k);
      lengths[static_cast<size_t>(t)] = static_cast<int32_t>(len);
      // Garbage past topk_length: valid-looking ids that must be ignored.
      for (int64_t j = len; j < k; ++j)
        ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(irand(r, lo, hi));
    }
  }
  c.in.indices = Tensor::from_i32({s_q, k}, ids);
  const bool view3 = *rc::gen::inRange(0, 6) == 0;  // the accepted [s_q, 1, k] view (SPEC §4)
  if (view3) c.in.indices = c.in.indices.reshaped({s_q, 1, k});
  if (use_len) c.in.topk_length = Tensor::from_i32({s_q}, lengths);
  c.in.q = fill(DType::BF16, {s_q, h, d_qk}, Tier::Random, 1, r);
  c.in.kv = fill(DType::BF16, {s_kv, d_qk}, Tier::Random, 1, r);
  if (layout == "poison")
    for (int64_t col = 0; col < d_qk; ++col) {
      c.in.kv.set(col, NAN);
      c.in.kv.set((s_kv - 1) * d_qk + col, NAN);
    }
  c.in.sm_scale = 1.0 / std::sqrt(static_cast<double>(d_qk)) * (draw_bool() ? 1.0 : 4.0);
  c.in.d_v = d_v;
  if (layout != "poison" && *rc::gen::inRange(0, 3) == 0) {
    Tensor sink(DType::F32, {h});
    for (int64_t i = 0; i < h; ++i)
      sink.set(i, draw_of<double>({INFINITY, -INFINITY, 80.0, -80.0, 0.5, -1.5}));
    c.in.attn_sink = sink;
  }
  c.dout = fill(DType::F32, {s_q, h, d_v}, Tier::Random, 1, r);
  c.desc = "smla layout=" + layout + " s_q=" + std::to_string(s_q) + " h_q=" + std::to_string(h) +
           " d_qk=" + std::to_string(d_qk) + " d_v=" + std::to_string(d_v) + " s_kv=" +
           std::to_string(s_kv) + " k=" + std::to_string(k) + (use_len ? " topk_length" : "") + (view3 ? " indices[s_q,1,k]" : "") +
           (c.in.attn_sink ? " sink" : "");
  return c;
}

KlCase draw_kl_case() {
  KlCase c;
  const int64_t s_q = draw_in(1, 8), s_kv = draw_in(1, 12), h = draw_in(2, 4);
  const int64_t d = draw_of<int64_t>({4, 8, 16});
  std::string wk;
  c.in.windows = draw_windows(s_q, s_kv, nullptr, &wk);
  Rng r = draw_rng();
  c.in.q = fill(DType::F32, {s_q, h, d}, Tier::Random, 1, r);
  c.in.kv = fill(DType::F32, {s_kv, d}, Tier::Random, 1, r);
  c.in.sm_scale = 1.0 / std::sqrt(static_cast<double>(d));
  c.in.coeff = draw_of<double>({1.0, 0.5, 3.0});
  c.in.scores = Tensor(DType::F32, {s_q, s_kv});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < s_kv; ++s)
      c.in.scores.set(t * s_kv + s, c.in.windows.contains(t, s) ? uni(r, -3, 3) : -INFINITY);
  c.in.mode = draw_bool() ? KlMode::Dense : KlMode::Sparse;
  if (c.in.mode == KlMode::Sparse) {
    const int64_t k = draw_in(1, s_kv + 2);
    std::vector<int32_t> ids(static_cast<size_t>(s_q * k));
    for (auto& id : ids) id = static_cast<int32_t>(irand(r, -1, s_kv - 1));
    c.in.indices = Tensor::from_i32({s_q, k}, ids);
  }
  c.desc = "kl s_q=" + std::to_string(s_q) + " s_kv=" + std::to_string(s_kv) + " h_q=" +
           std::to_string(h) + " mode=" + to_string(c.in.mode) + " windows=" + wk;
  return c;
}

BlockCase draw_block_case() {
  BlockCase c;
  const int64_t s_q = draw_in(1, 6), s_kv = s_q + draw_in(0, 6);
  const int64_t H = draw_in(1, 2), dI = 8, h = draw_in(1, 3), d_qk = 16;
  Rng r = draw_rng();
  c.in.q_idx = fill(DType::BF16, {s_q, H, dI}, Tier::Random, 1, r);
  c.in.k_idx = fill(DType::BF16, {s_kv, dI}, Tier::Random, 1, r);
  c.in.w = fill(DType::F32, {s_q, H}, Tier::Random, 1, r);
  c.in.windows = KeyWindows::causal(s_q, s_kv);
  c.in.k = draw_in(1, s_kv + 2);
  c.in.policy = TopkPolicy{TieBreak::Small, true};
  c.in.q = fill(DType::BF16, {s_q, h, d_qk}, Tier::Random, 1, r);
  c.in.kv = fill(DType::BF16, {s_kv, d_qk}, Tier::Random, 1, r);
  c.in.sm_scale = 0.25;
  c.in.d_v = 8;
  c.dout = fill(DType::F32, {s_q, h, 8}, Tier::Random, 1, r);
  return c;
}

}  // namespace dsa::props
