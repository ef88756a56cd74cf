// FP8 / paged reference ops (SPEC §10) against naive loops on the exact decoded values,
// gather invariance (shuffled tables, garbage past contexts), and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "dsa/contract/fp8.h"
#include "dsa/contract/paged_kv.h"
#include "dsa/reference/fp8_indexer.h"
#include "dsa/reference/paged_indexer.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "test_support.h"

namespace dsa {
namespace {

using namespace dsa::reference;
using test::throws_naming;

Tensor random_bytes(std::vector<int64_t> shape, uint64_t seed, double scale) {
  return fp8_encode(test::random_f64(std::move(shape), seed, scale), Fp8Format::E4M3FN);
}
Tensor random_scales(int64_t n, uint64_t seed) {
  Tensor t(DType::F32, {n});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.01, 2.0);
  for (int64_t i = 0; i < n; ++i) t.set(i, u(rng));
  return t;
}

Fp8IndexerInputs indexer_case(int64_t s_q, int64_t h, int64_t d, int64_t s_kv, uint64_t seed) {
  Fp8IndexerInputs in;
  in.q_idx = random_bytes({s_q, h, d}, seed, 40.0);
  in.k_idx = random_bytes({s_kv, d}, seed + 1, 40.0);
  in.k_scale = random_scales(s_kv, seed + 2);
  in.w = test::random_f64({s_q, h}, seed + 3).to(DType::F32);
  in.windows = KeyWindows::causal(s_q, s_kv);
  return in;
}

// Naive SPEC §10 formula on decoded bytes, scale applied inside the ReLU.
double naive_score(const Fp8IndexerInputs& in, int64_t t, int64_t s) {
  const int64_t h = in.q_idx.size(1), d = in.q_idx.size(2);
  const uint8_t* q = in.q_idx.data<uint8_t>();
  const uint8_t* k = in.k_idx.data<uint8_t>();
  double sum = 0;
  for (int64_t j = 0; j < h; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < d; ++c)
      dot += fp8_to_double(q[(t * h + j) * d + c], in.format) * fp8_to_double(k[s * d + c], in.format);
    sum += in.w.get(t * h + j) * std::max(0.0, in.k_scale.get(s) * dot);
  }
  return sum;
}

TEST(Fp8IndexerReference, MatchesTheNaiveFormula) {
  for (Fp8Format f : {Fp8Format::E4M3FN, Fp8Format::E5M2}) {
    Fp8IndexerInputs in = indexer_case(5, 3, 16, 9, 11);
    in.format = f;
    const Tensor got = fp8_indexer_scores(in);
    ASSERT_EQ(got.dtype(), DType::F64);
    ASSERT_EQ(got.shape(), (std::vector<int64_t>{5, 9}));
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t s = 0; s < 9; ++s) {
        if (!in.windows.contains(t, s)) {
          EXPECT_EQ(got.get(t * 9 + s), -test::kInf);
          continue;
        }
        const double want = naive_score(in, t, s);
        EXPECT_NEAR(got.get(t * 9 + s), want, test::kReassocRelTol * (1 + std::fabs(want)));
      }
    const Tensor base = fp8_indexer_scores(in, Precision::Baseline);
    EXPECT_EQ(base.dtype(), DType::F32);
    EXPECT_TRUE(test::close(base, got, test::kBaselineRelTol));
  }
}

TEST(Fp8IndexerReference, UnreadKeysMayHoldAnything) {
  Fp8IndexerInputs in = indexer_case(4, 2, 8, 10, 5);
  in.windows = KeyWindows::explicit_windows({1, 1, 2, 2}, {4, 5, 6, 6}, 10);
  const Tensor clean = fp8_indexer_scores(in);
  const Tensor clean_base = fp8_indexer_scores(in, Precision::Baseline);
  for (int64_t s : {0, 6, 9}) {
    in.k_scale.set(s, s == 0 ? -1.0 : std::nan(""));
    for (int64_t c = 0; c < 8; ++c) in.k_idx.data<uint8_t>()[s * 8 + c] = 0x7F;  // NaN bytes
  }
  EXPECT_TRUE(test::identical(fp8_indexer_scores(in), clean));
  EXPECT_TRUE(test::identical(fp8_indexer_scores(in, Precision::Baseline), clean_base));
  in.k_scale.set(3, 0.0);  // read by rows 0..3
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(in); }, "k_scale"));
  in.k_scale.set(3, -0.5);
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(in, Precision::Baseline); }, "k_scale"));
}

TEST(Fp8IndexerReference, BadArguments) {
  const Fp8IndexerInputs good = indexer_case(2, 2, 4, 3, 1);
  EXPECT_NO_THROW(fp8_indexer_scores(good));
  auto with = [&](auto edit) { Fp8IndexerInputs in = good; edit(in); return in; };
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.q_idx = in.q_idx.reshaped({4, 4}); })); }, "q_idx"));
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.k_idx = Tensor(DType::F32, {3, 4}); })); }, "k_idx"));
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.k_scale = Tensor(DType::F64, {3}); })); }, "k_scale"));
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.k_scale = Tensor(DType::F32, {2}); })); }, "k_scale"));
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.w = Tensor(DType::F32, {2, 3}); })); }, "w"));
  EXPECT_TRUE(throws_naming([&] { fp8_indexer_scores(with([](auto& in) { in.windows = KeyWindows::full(3, 3); })); }, "windows"));
}

// A paged case: contexts `lens`, block_size bs, a shuffled table whose unread entries hold
// garbage ids, unread cache slots full of NaN bytes and NaN scales.
PagedIndexerInputs paged_case(std::vector<int32_t> lens, int64_t bs, int64_t next_n, uint64_t seed) {
  const int64_t batch = static_cast<int64_t>(lens.size()), h = 2, d = 8;
  int64_t max_blocks = 1, used = 0;
  for (int32_t L : lens) {
    max_blocks = std::max<int64_t>(max_blocks, (L + bs - 1) / bs + 1);
    used += (L + bs - 1) / bs;
  }
  const int64_t num_blocks = used + 2;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  std::vector<int32_t> table(static_cast<size_t>(batch * max_blocks), 1 << 30);
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) table[b * max_blocks + i] = perm[next++];
  PagedIndexerInputs in;
  in.q_idx = random_bytes({batch, next_n, h, d}, seed + 1, 30.0);
  in.k_cache = Tensor(DType::U8, {num_blocks, bs, d});
  std::memset(in.k_cache.raw(), 0x7F, in.k_cache.nbytes());
  in.k_scale_cache = Tensor(DType::F32, {num_blocks, bs});
  for (int64_t i = 0; i < in.k_scale_cache.numel(); ++i) in.k_scale_cache.set(i, std::nan(""));
  in.w = test::random_f64({batch * next_n, h}, seed + 2).to(DType::F32);
  in.block_table = Tensor::from_i32({batch, max_blocks}, table);
  in.context_lens = Tensor::from_i32({batch}, lens);
  const PagedKv kv = make_paged_kv("test", in.block_table, in.context_lens, bs, num_blocks);
  const Tensor keys = random_bytes({std::max<int64_t>(1, kv.max_context()) * batch, d}, seed + 3, 30.0);
  const Tensor sc = random_scales(keys.size(0), seed + 4);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < lens[b]; ++p) {
      const int64_t row = kv.token_row(b, p), src = b * kv.max_context() + p;
      std::memcpy(in.k_cache.data<uint8_t>() + row * d, keys.data<uint8_t>() + src * d, static_cast<size_t>(d));
      in.k_scale_cache.set(row, sc.get(src));
    }
  return in;
}

TEST(PagedIndexerReference, EqualsTheDenseFp8IndexerOfEachContext) {
  for (int64_t bs : {1, 16, 64})
    for (int64_t next_n : {1, 2, 3, 4}) {
      const std::vector<int32_t> lens = {static_cast<int32_t>(bs + 3), 0, 2, static_cast<int32_t>(2 * bs)};
      const PagedIndexerInputs in = paged_case(lens, bs, next_n, 100 + bs + next_n);
      const Tensor got = paged_indexer_scores(in);
      const int64_t width = *std::max_element(lens.begin(), lens.end());
      ASSERT_EQ(got.shape(), (std::vector<int64_t>{4 * next_n, width}));
      const PagedKv kv = make_paged_kv("test", in.block_table, in.context_lens, bs, in.k_cache.size(0));
      const int64_t d = in.k_cache.size(2), h = in.q_idx.size(2);
      for (int64_t b = 0; b < 4; ++b) {
        const int64_t L = lens[b];
        Fp8IndexerInputs f;
        f.q_idx = Tensor(DType::U8, {next_n, h, d});
        std::memcpy(f.q_idx.raw(), in.q_idx.data<uint8_t>() + b * next_n * h * d, f.q_idx.nbytes());
        f.k_idx = Tensor(DType::U8, {L, d});
        f.k_scale = Tensor(DType::F32, {L});
        for (int64_t p = 0; p < L; ++p) {
          std::memcpy(f.k_idx.data<uint8_t>() + p * d, in.k_cache.data<uint8_t>() + kv.token_row(b, p) * d, static_cast<size_t>(d));
          f.k_scale.set(p, in.k_scale_cache.get(kv.token_row(b, p)));
        }
        f.w = Tensor(DType::F32, {next_n, h});
        std::memcpy(f.w.raw(), in.w.data<float>() + b * next_n * h, f.w.nbytes());
        std::vector<int64_t> ks(static_cast<size_t>(next_n), 0), ke;
        for (int64_t i = 0; i < next_n; ++i) ke.push_back(std::clamp<int64_t>(L - next_n + i + 1, 0, L));
        f.windows = KeyWindows::explicit_windows(ks, ke, L);
        const Tensor dense = fp8_indexer_scores(f);
        for (int64_t i = 0; i < next_n; ++i)
          for (int64_t p = 0; p < width; ++p) {
            const double g = got.get((b * next_n + i) * width + p);
            if (p < ke[i]) EXPECT_EQ(g, dense.get(i * L + p)) << "bs " << bs << " b " << b << " p " << p;
            else EXPECT_EQ(g, -test::kInf) << "bs " << bs << " b " << b << " p " << p;
          }
      }
      const Tensor base = paged_indexer_scores(in, Precision::Baseline);
      EXPECT_TRUE(test::close(base, got, test::kBaselineRelTol));
    }
}

TEST(PagedIndexerReference, BadArguments) {
  const PagedIndexerInputs good = paged_case({5, 3}, 4, 2, 9);
  EXPECT_NO_THROW(paged_indexer_scores(good));
  auto with = [&](auto edit) { PagedIndexerInputs in = good; edit(in); return in; };
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.block_table.set(1, -1); })); }, "block_table"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.context_lens.set(0, 99); })); }, "context_lens"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.max_context = 4; })); }, "max_context"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.k_scale_cache = Tensor(DType::F32, {1, 4}); })); }, "k_scale_cache"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.context_lens.set(0, 6); })); }, "k_scale_cache"));  // reads a NaN scale
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.w = Tensor(DType::F32, {2, 2}); })); }, "w"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.q_idx = Tensor(DType::U8, {2, 2, 8}); })); }, "q_idx"));
  EXPECT_TRUE(throws_naming([&] { paged_indexer_scores(with([](auto& in) { in.k_cache = Tensor(DType::U8, {4, 4, 7}); })); }, "k_cache"));
}

// FP8 cache of `tokens` rows for kv values; unread tokens are NaN bytes with NaN scales.
SparseMlaFp8Inputs smla_case(int64_t s_q, int64_t h, int64_t k, int64_t tokens, uint64_t seed, Tensor* kv_out) {
  SparseMlaFp8Inputs in;
  in.q = test::random_f64({s_q, h, 576}, seed).to(DType::BF16);
  const Tensor kv = test::random_f64({tokens, 576}, seed + 1, 2.0);
  in.kv_cache = encode_mla_fp8_cache(kv, Fp8ScaleRule::Amax).reshaped({tokens / 4, 4, 656});
  std::vector<int32_t> ids;
  std::mt19937_64 rng(seed + 2);
  for (int64_t i = 0; i < s_q * k; ++i) ids.push_back(static_cast<int32_t>(rng() % (tokens - 1)));
  ids[0] = -1;
  ids[1] = static_cast<int32_t>(tokens + 3);
  in.indices = Tensor::from_i32({s_q, k}, ids);
  in.sm_scale = 0.04;
  // Token tokens-1 is never addressed: poison it.
  std::memset(in.kv_cache.data<uint8_t>() + (tokens - 1) * 656, 0xFF, 656);
  if (kv_out) *kv_out = kv;
  return in;
}

TEST(SparseMlaFp8Reference, EqualsSparseMlaOnTheDequantizedCache) {
  const SparseMlaFp8Inputs in = smla_case(3, 4, 6, 16, 21, nullptr);
  const SparseMlaForward got = sparse_mla_fp8_forward(in);
  // Dequantize every token with the view, NaN rows for the poisoned one (never read).
  Tensor kv(DType::F64, {16, 576});
  for (int64_t t = 0; t < 16; ++t) {
    const MlaFp8TokenView v(in.kv_cache.data<uint8_t>() + t * 656);
    for (int64_t c = 0; c < 576; ++c) kv.set(t * 576 + c, v.value(c));
  }
  SparseMlaInputs m{in.q, kv, in.indices, std::nullopt, std::nullopt, in.sm_scale, 512};
  const SparseMlaForward want = sparse_mla_forward(m);
  EXPECT_TRUE(test::close(got.out, want.out, test::kReassocRelTol));
  EXPECT_TRUE(test::close(got.lse, want.lse, test::kReassocRelTol));
  EXPECT_TRUE(test::close(got.max_logits, want.max_logits, test::kReassocRelTol));
  const SparseMlaForward base = sparse_mla_fp8_forward(in, Precision::Baseline);
  // Baseline = kv dequantized to q's dtype (bf16), then the fp32 baseline of §4.
  const SparseMlaInputs m16{in.q, kv.to(DType::BF16), in.indices, std::nullopt, std::nullopt, in.sm_scale, 512};
  const SparseMlaForward want16 = sparse_mla_forward(m16, Precision::Baseline);
  EXPECT_TRUE(test::identical(base.out, want16.out));
  EXPECT_TRUE(test::identical(base.lse, want16.lse));
  // topk_length 0 rows are empty (§6).
  SparseMlaFp8Inputs empty = in;
  empty.topk_length = Tensor::from_i32({3}, {0, 6, 2});
  const SparseMlaForward e = sparse_mla_fp8_forward(empty);
  EXPECT_EQ(e.lse.get(0), test::kInf);
  EXPECT_EQ(e.max_logits.get(0), -test::kInf);
  EXPECT_EQ(e.out.get(0), 0.0);
}

TEST(SparseMlaFp8Reference, BadArguments) {
  const SparseMlaFp8Inputs good = smla_case(2, 2, 4, 8, 3, nullptr);
  EXPECT_NO_THROW(sparse_mla_fp8_forward(good));
  auto with = [&](auto edit) { SparseMlaFp8Inputs in = good; edit(in); return in; };
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.q = Tensor(DType::BF16, {2, 2, 512}); })); }, "q"));
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.kv_cache = Tensor(DType::U8, {8, 576}); })); }, "kv_cache"));
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.kv_cache = Tensor(DType::F32, {8, 656}); })); }, "kv_cache"));
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.indices = Tensor(DType::I64, {2, 4}); })); }, "indices"));
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.topk_length = Tensor(DType::I32, {3}); })); }, "topk_length"));
  // A read token whose scale is invalid: point slot 2 of row 0 at the poisoned token.
  EXPECT_TRUE(throws_naming([&] { sparse_mla_fp8_forward(with([](auto& in) { in.indices.set(2, 7); })); }, "kv_cache"));
}

}  // namespace
}  // namespace dsa
