// Tests of the contract target: dtype conversions (round to nearest even, single rounding),
// Tensor, KeyWindows builders (SPEC §1), policy parsing.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "dsa/contract/dtype.h"
#include "dsa/contract/key_windows.h"
#include "dsa/contract/policies.h"
#include "dsa/contract/tensor.h"
#include "test_support.h"

namespace dsa {
namespace {

using test::throws_naming;

uint16_t bf16_bits(double v) { return double_to_bf16(v).bits; }
uint16_t f16_bits(double v) { return double_to_f16(v).bits; }

TEST(DtypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(bf16_bits(1.0 + std::ldexp(1, -8)), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(bf16_bits(1.0 + 3 * std::ldexp(1, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(bf16_bits(-(1.0 + 3 * std::ldexp(1, -8))), 0xBF82);
  EXPECT_EQ(bf16_bits(1.0 + std::ldexp(1, -8) + std::ldexp(1, -20)), 0x3F81);  // above tie
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);
}

TEST(DtypeTest, Bf16FromDoubleRoundsOnce) {
  // Via float this would round to the tie 1 + 2^-8 first and then to 1.0.
  EXPECT_EQ(bf16_bits(1.0 + std::ldexp(1, -8) + std::ldexp(1, -40)), 0x3F81);
}

TEST(DtypeTest, Bf16SpecialValuesSubnormalsAndOverflow) {
  EXPECT_EQ(bf16_bits(-0.0), 0x8000);
  EXPECT_EQ(bf16_bits(test::kInf), 0x7F80);
  EXPECT_EQ(bf16_bits(-test::kInf), 0xFF80);
  EXPECT_TRUE(std::isnan(bf16_to_float(double_to_bf16(test::kNaN))));
  EXPECT_EQ(bf16_bits(FLT_MAX), 0x7F80);  // past max bf16 + half ulp
  EXPECT_EQ(bf16_bits(std::ldexp(255.0 / 128, 127)), 0x7F7F);  // max finite
  EXPECT_EQ(bf16_bits(std::ldexp(1, -133)), 0x0001);  // smallest subnormal
  EXPECT_EQ(bf16_bits(std::ldexp(1, -134)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(bf16_bits(3 * std::ldexp(1, -134)), 0x0002);
}

TEST(DtypeTest, F16RoundsToNearestEvenWithSubnormalsAndOverflow) {
  EXPECT_EQ(f16_bits(1.0), 0x3C00);
  EXPECT_EQ(f16_bits(1.0 + std::ldexp(1, -11)), 0x3C00);
  EXPECT_EQ(f16_bits(1.0 + 3 * std::ldexp(1, -11)), 0x3C02);
  EXPECT_EQ(f16_bits(65504.0), 0x7BFF);
  EXPECT_EQ(f16_bits(65519.0), 0x7BFF);
  EXPECT_EQ(f16_bits(65520.0), 0x7C00);  // max + half ulp: tie to even is inf
  EXPECT_EQ(f16_bits(-1e6), 0xFC00);
  EXPECT_EQ(f16_bits(std::ldexp(1, -24)), 0x0001);
  EXPECT_EQ(f16_bits(std::ldexp(1, -25)), 0x0000);
  EXPECT_EQ(f16_bits(3 * std::ldexp(1, -25)), 0x0002);
  EXPECT_EQ(f16_bits(std::ldexp(1023, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(f16_bits(-0.0), 0x8000);
  EXPECT_TRUE(std::isnan(f16_to_float(double_to_f16(test::kNaN))));
  EXPECT_EQ(f16_to_float(f16{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(f16{0x7C00}), INFINITY);
}

TEST(DtypeTest, EveryBf16AndF16BitPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float vb = bf16_to_float(bf16{static_cast<uint16_t>(b)});
    if (!std::isnan(vb)) { ASSERT_EQ(bf16_bits(vb), b) << std::hex << b; }
    const float vh = f16_to_float(f16{static_cast<uint16_t>(b)});
    if (!std::isnan(vh)) { ASSERT_EQ(f16_bits(vh), b) << std::hex << b; }
  }
}

TEST(DtypeTest, NamesParseAndBadNameIsNamed) {
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                  DType::U8, DType::Bool})
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_TRUE(throws_naming([] { parse_dtype("FP8"); }, "dtype"));
}

TEST(TensorTest, ConstructGetSetAndConvert) {
  Tensor t(DType::BF16, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.get(5), 0.0);
  t.set(1, 1.0 + std::ldexp(1, -8));  // rounds to nearest even
  EXPECT_EQ(t.get(1), 1.0);
  const Tensor d = Tensor::from_f64({3}, {0.1, -2.5, 1e-30});
  const Tensor f = d.to(DType::F32);
  EXPECT_EQ(f.get(0), static_cast<double>(0.1f));
  EXPECT_EQ(f.to(DType::F64).get(2), static_cast<double>(1e-30f));
  EXPECT_EQ(d.to(DType::I32).get(1), -2.0);  // ints truncate toward 0
  const Tensor r = d.reshaped({1, 3});
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.get(1), -2.5);
  EXPECT_EQ(Tensor::from_i32({2}, {7, -1}).data<int32_t>()[1], -1);
}

TEST(TensorTest, BadUseThrows) {
  EXPECT_TRUE(throws_naming([] { Tensor(DType::F32, {2, -1}); }, "shape"));
  EXPECT_TRUE(throws_naming([] { Tensor::from_f64({2}, {1, 2, 3}); }, "values"));
  EXPECT_TRUE(throws_naming([] { Tensor(DType::F32, {2}).reshaped({3}); }, "shape"));
  EXPECT_THROW(Tensor(DType::F32, {2}).data<double>(), std::invalid_argument);
  EXPECT_THROW(Tensor(DType::F32, {2}).size(2), std::out_of_range);
}

// Tensor::for_overwrite (issue 13): the shape and size of the constructor's, storage that
// copies, moves and converts like any tensor's; the constructor still zero-fills, even on
// memory that a written for_overwrite tensor just gave back.
TEST(TensorTest, ForOverwriteSizesCopiesAndMoves) {
  Tensor t = Tensor::for_overwrite(DType::F64, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  for (int64_t i = 0; i < 6; ++i) t.set(i, 0.5 * static_cast<double>(i) - 1);
  const Tensor copy = t;
  Tensor assigned;
  assigned = t;
  const Tensor moved = std::move(t);
  for (const Tensor* u : std::vector<const Tensor*>{&copy, &assigned, &moved})
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(u->get(i), 0.5 * static_cast<double>(i) - 1);
  EXPECT_EQ(copy.to(DType::F32).get(5), 1.5);
  EXPECT_EQ(copy.reshaped({3, 2}).get(4), 1.0);
  EXPECT_EQ(Tensor::for_overwrite(DType::I32, {0, 4}).nbytes(), 0u);
  EXPECT_TRUE(throws_naming([] { Tensor::for_overwrite(DType::F32, {-1}); }, "shape"));
  for (int64_t n : {int64_t{100}, int64_t{1} << 21}) {  // a small chunk and an mmap-sized one
    {
      Tensor dirty = Tensor::for_overwrite(DType::U8, {n});
      std::memset(dirty.raw(), 0xA5, dirty.nbytes());
    }
    const Tensor z(DType::U8, {n});
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; ++i) nonzero += z.raw()[i] != std::byte{0};
    EXPECT_EQ(nonzero, 0) << n << " bytes";
  }
}

void expect_windows(const KeyWindows& w, std::vector<int64_t> ks, std::vector<int64_t> ke,
                    int64_t s_kv) {
  EXPECT_EQ(w.ks, ks);
  EXPECT_EQ(w.ke, ke);
  EXPECT_EQ(w.s_kv, s_kv);
}

TEST(KeyWindowsTest, FullAndCausalBuilders) {
  expect_windows(KeyWindows::full(2, 4), {0, 0}, {4, 4}, 4);
  expect_windows(KeyWindows::causal(3, 5), {0, 0, 0}, {3, 4, 5}, 5);        // prefix offset 2
  expect_windows(KeyWindows::causal(3, 5, 0), {0, 0, 0}, {1, 2, 3}, 5);     // explicit start
  expect_windows(KeyWindows::causal(4, 2), {0, 0, 0, 0}, {0, 0, 1, 2}, 2);  // clamped, empty
  const KeyWindows w = KeyWindows::causal(4, 2);
  EXPECT_EQ(w.length(0), 0);
  EXPECT_EQ(w.length(3), 2);
  EXPECT_TRUE(w.contains(2, 0));
  EXPECT_FALSE(w.contains(2, 1));
}

TEST(KeyWindowsTest, VarlenBuilder) {
  // Segment 0: 2 queries over 5 keys; segment 1: 1 query over 4 keys.
  expect_windows(KeyWindows::varlen({0, 2, 3}, {0, 5, 9}), {0, 0, 5}, {4, 5, 9}, 9);
  EXPECT_TRUE(throws_naming([] { KeyWindows::varlen({0, 2}, {0, 5, 9}); }, "cu_seqlens_k"));
  EXPECT_TRUE(throws_naming([] { KeyWindows::varlen({0, 3}, {0, 2}); }, "cu_seqlens_k"));
}

TEST(KeyWindowsTest, MtpBuilder) {
  // Requests of context 4 and 3, next_n = 2: queries at L-2 and L-1.
  expect_windows(KeyWindows::mtp({4, 3}, 2), {0, 0, 4, 4}, {3, 4, 6, 7}, 7);
  EXPECT_TRUE(throws_naming([] { KeyWindows::mtp({1}, 2); }, "context_lens"));
  EXPECT_TRUE(throws_naming([] { KeyWindows::mtp({4}, 0); }, "next_n"));
}

TEST(KeyWindowsTest, ExplicitBuilderClamps) {
  expect_windows(KeyWindows::explicit_windows({-3, 2, 5}, {2, 9, 1}, 4), {0, 2, 4}, {2, 4, 1}, 4);
  EXPECT_EQ(KeyWindows::explicit_windows({-3, 2, 5}, {2, 9, 1}, 4).length(2), 0);
  EXPECT_TRUE(throws_naming([] { KeyWindows::explicit_windows({0}, {1, 2}, 4); }, "ke"));
  EXPECT_TRUE(throws_naming([] { KeyWindows::explicit_windows({0}, {1}, -1); }, "s_kv"));
}

TEST(PoliciesTest, ParseRoundTripsAndBadTextIsNamed) {
  for (TieBreak v : {TieBreak::Any, TieBreak::Small, TieBreak::Large})
    EXPECT_EQ(parse_tie_break(to_string(v)), v);
  for (RecomputePolicy v : {RecomputePolicy::None, RecomputePolicy::Full,
                            RecomputePolicy::SaveDsaIndexer})
    EXPECT_EQ(parse_recompute_policy(to_string(v)), v);
  for (KlMode v : {KlMode::Dense, KlMode::Sparse}) EXPECT_EQ(parse_kl_mode(to_string(v)), v);
  EXPECT_TRUE(throws_naming([] { parse_tie_break("random"); }, "tie_break"));
  EXPECT_TRUE(throws_naming([] { parse_recompute_policy("selective"); }, "recompute_policy"));
  EXPECT_TRUE(throws_naming([] { parse_kl_mode("Dense"); }, "mode"));
  const TopkPolicy p;
  EXPECT_EQ(p.tie_break, TieBreak::Small);
  EXPECT_TRUE(p.sorted);
}

}  // namespace
}  // namespace dsa
