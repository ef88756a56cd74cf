// FP8 and paged-KV contract (SPEC §10): exhaustive decoding of all 256 bytes of both formats,
// round-to-nearest-even and saturation of the generator encoding, the 656-byte token view,
// and the paged descriptor's argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "dsa/contract/fp8.h"
#include "dsa/contract/fp8_op_types.h"
#include "dsa/contract/paged_kv.h"
#include "test_support.h"

namespace dsa {
namespace {

using test::throws_naming;

const Fp8Format kFormats[] = {Fp8Format::E4M3FN, Fp8Format::E5M2};

// OFP8 parameters written independently of the decoder: exponent bits, bias.
struct Layout {
  int eb, mb, bias;
};
Layout layout(Fp8Format f) { return f == Fp8Format::E4M3FN ? Layout{4, 3, 7} : Layout{5, 2, 15}; }

bool is_nan_code(uint8_t b, Fp8Format f) {
  const uint8_t m = b & 0x7F;
  return f == Fp8Format::E4M3FN ? m == 0x7F : m > 0x7C;
}

TEST(Fp8Contract, DecodesEveryByteExactly) {
  for (Fp8Format f : kFormats) {
    const Layout L = layout(f);
    for (int b = 0; b < 256; ++b) {
      const double v = fp8_to_double(static_cast<uint8_t>(b), f);
      if (is_nan_code(static_cast<uint8_t>(b), f)) {
        EXPECT_TRUE(std::isnan(v)) << to_string(f) << " byte " << b;
        continue;
      }
      if (f == Fp8Format::E5M2 && (b & 0x7F) == 0x7C) {
        EXPECT_EQ(v, (b & 0x80) ? -test::kInf : test::kInf);
        continue;
      }
      // Independent formula: (-1)^s · (e ? 1 + m/2^mb : m/2^mb) · 2^(max(e,1) - bias).
      const int s = b >> 7, e = (b >> L.mb) & ((1 << L.eb) - 1), m = b & ((1 << L.mb) - 1);
      const double frac = (e ? 1.0 : 0.0) + m / double(1 << L.mb);
      const double want = (s ? -1.0 : 1.0) * std::ldexp(frac, std::max(e, 1) - L.bias);
      EXPECT_EQ(v, want) << to_string(f) << " byte " << b;
      EXPECT_EQ(std::signbit(v), s == 1) << to_string(f) << " byte " << b;
    }
  }
}

TEST(Fp8Contract, FormatLimits) {
  EXPECT_EQ(fp8_to_double(0x7E, Fp8Format::E4M3FN), fp8_max(Fp8Format::E4M3FN));
  EXPECT_EQ(fp8_to_double(0x7B, Fp8Format::E5M2), fp8_max(Fp8Format::E5M2));
  for (Fp8Format f : kFormats) {
    EXPECT_EQ(fp8_to_double(0x01, f), fp8_min_subnormal(f));
    double largest = 0;
    for (int b = 0; b < 256; ++b) {
      const double v = fp8_to_double(static_cast<uint8_t>(b), f);
      if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
    }
    EXPECT_EQ(largest, fp8_max(f));
  }
  EXPECT_EQ(parse_fp8_format(to_string(Fp8Format::E5M2)), Fp8Format::E5M2);
  EXPECT_EQ(parse_fp8_format(to_string(Fp8Format::E4M3FN)), Fp8Format::E4M3FN);
  EXPECT_TRUE(throws_naming([] { parse_fp8_format("e4m3"); }, "format"));
}

// Every non-NaN byte survives decode → encode; NaN codes encode to the canonical 0x7F.
TEST(Fp8Contract, EncodeInvertsDecodeForEveryByte) {
  for (Fp8Format f : kFormats)
    for (Fp8Overflow o : {Fp8Overflow::Saturate, Fp8Overflow::NoSaturate})
      for (int b = 0; b < 256; ++b) {
        const uint8_t byte = static_cast<uint8_t>(b);
        const double v = fp8_to_double(byte, f);
        const uint8_t back = double_to_fp8(v, f, o);
        if (std::isnan(v)) {
          EXPECT_EQ(back & 0x7F, 0x7F) << to_string(f) << " byte " << b;
        } else if (std::isinf(v)) {
          const uint8_t want = o == Fp8Overflow::Saturate ? (byte & 0x80) | 0x7B : byte;
          EXPECT_EQ(back, want) << to_string(f) << " byte " << b;
        } else {
          EXPECT_EQ(back, byte) << to_string(f) << " byte " << b;
        }
      }
}

// Round to nearest, ties to even: between every pair of neighbouring finite values, the
// midpoint goes to the even code and anything off the midpoint to the nearer one.
TEST(Fp8Contract, RoundsToNearestEvenBetweenEveryPair) {
  for (Fp8Format f : kFormats) {
    std::vector<std::pair<double, uint8_t>> pos;
    for (int b = 0; b < 0x80; ++b) {
      const double v = fp8_to_double(static_cast<uint8_t>(b), f);
      if (std::isfinite(v)) pos.push_back({v, static_cast<uint8_t>(b)});
    }
    ASSERT_GT(pos.size(), 100u);
    for (size_t i = 0; i + 1 < pos.size(); ++i) {
      const auto [a, ba] = pos[i];
      const auto [c, bc] = pos[i + 1];
      ASSERT_LT(a, c);
      const double mid = 0.5 * (a + c), gap = c - a;
      const uint8_t even = (ba & 1) == 0 ? ba : bc;
      EXPECT_EQ(double_to_fp8(mid, f), even) << to_string(f) << " mid " << mid;
      EXPECT_EQ(double_to_fp8(-mid, f), even | 0x80) << to_string(f) << " mid " << -mid;
      EXPECT_EQ(double_to_fp8(mid - gap / 16, f), ba) << to_string(f);
      EXPECT_EQ(double_to_fp8(mid + gap / 16, f), bc) << to_string(f);
    }
    // Below half the smallest subnormal: zero (the tie at exactly half goes to even 0).
    const double tiny = fp8_min_subnormal(f);
    EXPECT_EQ(double_to_fp8(tiny / 2, f), 0x00);
    EXPECT_EQ(double_to_fp8(-tiny / 2, f), 0x80);
    EXPECT_EQ(double_to_fp8(tiny * 0.75, f), 0x01);
  }
}

// Overflow: the RNE result past the max saturates (Saturate) or becomes NaN (e4m3fn) / inf
// (e5m2) without saturation. e4m3fn's tie at 464 rounds to even 448; e5m2's tie at 61440
// rounds to even 65536, which overflows.
TEST(Fp8Contract, SaturationAndOverflow) {
  const auto e4 = Fp8Format::E4M3FN, e5 = Fp8Format::E5M2;
  const auto sat = Fp8Overflow::Saturate, nosat = Fp8Overflow::NoSaturate;
  EXPECT_EQ(double_to_fp8(464.0, e4, nosat), 0x7E);
  EXPECT_EQ(double_to_fp8(std::nextafter(464.0, 1e9), e4, nosat), 0x7F);
  EXPECT_EQ(double_to_fp8(std::nextafter(464.0, 1e9), e4, sat), 0x7E);
  EXPECT_EQ(double_to_fp8(-1e30, e4, sat), 0xFE);
  EXPECT_EQ(double_to_fp8(test::kInf, e4, sat), 0x7E);
  EXPECT_EQ(double_to_fp8(-test::kInf, e4, nosat), 0xFF);
  EXPECT_EQ(double_to_fp8(std::nextafter(61440.0, 0.0), e5, nosat), 0x7B);
  EXPECT_EQ(double_to_fp8(61440.0, e5, nosat), 0x7C);
  EXPECT_EQ(double_to_fp8(61440.0, e5, sat), 0x7B);
  EXPECT_EQ(double_to_fp8(-test::kInf, e5, nosat), 0xFC);
  EXPECT_EQ(double_to_fp8(-test::kInf, e5, sat), 0xFB);
  EXPECT_EQ(double_to_fp8(-0.0, e4), 0x80);
  EXPECT_EQ(double_to_fp8(test::kNaN, e5) & 0x7F, 0x7F);
}

TEST(Fp8Contract, TensorEncodeDecodeAndScales) {
  const Tensor v = Tensor::from_f64({2, 4}, {1.0, -2.5, 448.0, 1e9, 0.0, -0.0, 3.0, 1e-9});
  const Tensor b = fp8_encode(v, Fp8Format::E4M3FN);
  EXPECT_EQ(b.dtype(), DType::U8);
  const Tensor d = fp8_decode(b, Fp8Format::E4M3FN);
  EXPECT_EQ(d.shape(), v.shape());
  EXPECT_EQ(d.get(0), 1.0);
  EXPECT_EQ(d.get(3), 448.0);  // saturated
  EXPECT_TRUE(throws_naming([&] { fp8_decode(v, Fp8Format::E4M3FN); }, "bytes"));
  for (double bad : {0.0, -1.0, test::kNaN, test::kInf})
    EXPECT_TRUE(throws_naming([&] { check_fp8_scale("f", "k_scale", 3, bad); }, "k_scale"));
  EXPECT_NO_THROW(check_fp8_scale("f", "k_scale", 3, 1e-40));
  // Scale rules: pow2 is the smallest power of two >= amax/448; amax makes amax/s == 448.
  EXPECT_EQ(fp8_tile_scale(448.0, Fp8Format::E4M3FN, Fp8ScaleRule::Pow2), 1.0f);
  EXPECT_EQ(fp8_tile_scale(449.0, Fp8Format::E4M3FN, Fp8ScaleRule::Pow2), 2.0f);
  EXPECT_EQ(fp8_tile_scale(0.0, Fp8Format::E4M3FN, Fp8ScaleRule::Amax), 1.0f);
  const Fp8Quantized q = fp8_quantize_rows(v, 2, Fp8Format::E4M3FN, Fp8ScaleRule::Pow2);
  EXPECT_EQ(q.scales.shape(), (std::vector<int64_t>{2, 2}));
  for (int64_t i = 0; i < v.numel(); ++i) {
    const double s = q.scales.get(i / 2);
    const double back = fp8_to_double(q.bytes.data<uint8_t>()[i], Fp8Format::E4M3FN) * s;
    EXPECT_LE(std::fabs(back - v.get(i)), std::fabs(v.get(i)) / 16 + 2 * s * fp8_min_subnormal(Fp8Format::E4M3FN))
        << i;
  }
  EXPECT_TRUE(throws_naming([&] { fp8_quantize_rows(v, 3, Fp8Format::E4M3FN, Fp8ScaleRule::Amax); }, "tile"));
}

TEST(Fp8Contract, MlaTokenLayoutIs656Bytes) {
  EXPECT_EQ(kMlaFp8TokenBytes, 656);
  EXPECT_EQ(kMlaFp8Dqk, 576);
  std::vector<double> row(576);
  for (int c = 0; c < 576; ++c) row[c] = (c % 7 - 3) * (1 + c / 128) * 0.37;
  std::vector<uint8_t> tok(656, 0xAB);
  encode_mla_fp8_token(row.data(), Fp8ScaleRule::Pow2, tok.data());
  const MlaFp8TokenView v(tok.data());
  for (int i = 0; i < 4; ++i) {
    float s;
    std::memcpy(&s, tok.data() + 512 + 4 * i, 4);
    EXPECT_EQ(v.tile_scale(i), s);
    EXPECT_GT(s, 0.0f);
  }
  for (int c = 0; c < 512; ++c) {
    EXPECT_EQ(v.value(c), fp8_to_double(tok[c], Fp8Format::E4M3FN) * v.tile_scale(c / 128));
    EXPECT_LE(std::fabs(v.value(c) - row[c]), std::fabs(row[c]) / 16 + 1e-3) << c;
  }
  for (int c = 512; c < 576; ++c) {
    uint16_t bits;
    std::memcpy(&bits, tok.data() + 528 + 2 * (c - 512), 2);
    EXPECT_EQ(v.value(c), bf16_to_float(bf16{bits}));
    EXPECT_EQ(v.value(c), bf16_to_float(double_to_bf16(row[c])));
  }
  EXPECT_NO_THROW(v.check_scales("f", "kv_cache", 0));
  const float bad = -1.0f;
  std::memcpy(tok.data() + 512 + 8, &bad, 4);
  EXPECT_TRUE(throws_naming([&] { MlaFp8TokenView(tok.data()).check_scales("f", "kv_cache", 9); }, "kv_cache"));
  const Tensor cache = encode_mla_fp8_cache(Tensor::from_f64({1, 576}, row), Fp8ScaleRule::Amax);
  EXPECT_EQ(cache.shape(), (std::vector<int64_t>{1, 656}));
  EXPECT_TRUE(throws_naming([] { encode_mla_fp8_cache(Tensor(DType::F32, {1, 512}), Fp8ScaleRule::Amax); }, "kv"));
}

TEST(PagedKvContract, MapsLogicalKeysThroughTheTable) {
  // batch 2, block_size 4, 3 table columns, 5 blocks. Request 1 has context 5 (2 blocks).
  const Tensor table = Tensor::from_i32({2, 3}, {4, -1, 77, 2, 0, -5});
  const Tensor lens = Tensor::from_i32({2}, {3, 5});
  const PagedKv kv = make_paged_kv("f", table, lens, 4, 5);
  EXPECT_EQ(kv.blocks_read(0), 1);
  EXPECT_EQ(kv.blocks_read(1), 2);
  EXPECT_EQ(kv.token_row(0, 2), 4 * 4 + 2);
  EXPECT_EQ(kv.token_row(1, 4), 0 * 4 + 0);
  EXPECT_EQ(kv.max_context(), 5);
  const KeyWindows w = paged_mtp_windows(kv, 2, 8);
  ASSERT_EQ(w.s_q(), 4);
  EXPECT_EQ(w.s_kv, 8);
  EXPECT_EQ(w.ke, (std::vector<int64_t>{2, 3, 4, 5}));
  // A context shorter than next_n: leading rows are empty.
  const PagedKv short_kv = make_paged_kv("f", table, Tensor::from_i32({2}, {1, 0}), 4, 5);
  EXPECT_EQ(paged_mtp_windows(short_kv, 3, 1).ke, (std::vector<int64_t>{0, 0, 1, 0, 0, 0}));
}

// The §10 read masks (one definition for the oracle's twins and poison runs and the generators):
// each marks exactly the rows the contract lets a kernel read, on inputs that also hold bounds,
// entries and ids a kernel must not follow.
TEST(ReadMask, MarksExactlyWhatTheContractReads) {
  Fp8IndexerInputs idx;
  idx.k_idx = Tensor(DType::U8, {6, 4});
  idx.windows.s_kv = 6;
  idx.windows.ks = {1, 4, 3, 9};
  idx.windows.ke = {3, 4, 4, 12};  // an empty window and one past s_kv (clamped)
  EXPECT_EQ(read_mask(idx), (std::vector<char>{0, 1, 1, 1, 0, 0}));

  // batch 2, block_size 4, 3 table columns, 5 blocks; request 0 reads 3 keys of block 4,
  // request 1 five keys: block 2 (4 slots) and slot 0 of block 0. -1, 77, -5 are never read.
  PagedIndexerInputs paged;
  paged.k_cache = Tensor(DType::U8, {5, 4, 8});
  paged.block_table = Tensor::from_i32({2, 3}, {4, -1, 77, 2, 0, -5});
  paged.context_lens = Tensor::from_i32({2}, {3, 5});
  std::vector<char> want(20, 0);
  for (const int slot : {16, 17, 18, 8, 9, 10, 11, 0}) want[static_cast<size_t>(slot)] = 1;
  EXPECT_EQ(read_mask(paged), want);
  // A table entry out of range inside a context is skipped, not followed.
  paged.block_table = Tensor::from_i32({2, 3}, {9, -1, 77, 2, 0, -5});
  want[16] = want[17] = want[18] = 0;
  EXPECT_EQ(read_mask(paged), want);

  // 4 tokens, k 3: without topk_length every slot counts (-1 skipped); with lengths {2, 0} row 0
  // reads slots 0-1 (ids 2, -1) and row 1 nothing.
  SparseMlaFp8Inputs mla;
  mla.kv_cache = Tensor(DType::U8, {4, kMlaFp8TokenBytes});
  mla.indices = Tensor::from_i32({2, 3}, {2, -1, 3, 0, 1, 1});
  EXPECT_EQ(read_mask(mla), (std::vector<char>{1, 1, 1, 1}));
  mla.topk_length = Tensor::from_i32({2}, {2, 0});
  EXPECT_EQ(read_mask(mla), (std::vector<char>{0, 0, 1, 0}));
  mla.topk_length = Tensor::from_i32({2}, {-3, 99});  // negative: no slot; past k: all k slots
  EXPECT_EQ(read_mask(mla), (std::vector<char>{1, 1, 0, 0}));
}

TEST(PagedKvContract, BadArgumentsNameTheArgument) {
  const Tensor table = Tensor::from_i32({2, 3}, {4, -1, 77, 2, 0, -5});
  const Tensor lens = Tensor::from_i32({2}, {3, 5});
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, lens, 0, 5); }, "block_size"));
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, lens, 4, 4); }, "block_table"));  // id 4
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, Tensor::from_i32({2}, {3, 13}), 4, 5); },
                            "context_lens"));  // > capacity 12
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, Tensor::from_i32({2}, {-1, 5}), 4, 5); },
                            "context_lens"));
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, Tensor::from_i32({2}, {3, 9}), 4, 5); },
                            "block_table"));  // reads block_table[1, 2] = -5
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table, Tensor::from_i32({3}, {1, 1, 1}), 4, 5); },
                            "context_lens"));
  EXPECT_TRUE(throws_naming([&] { make_paged_kv("f", table.to(DType::I64), lens, 4, 5); }, "block_table"));
  const PagedKv kv = make_paged_kv("f", table, lens, 4, 5);
  EXPECT_TRUE(throws_naming([&] { paged_mtp_windows(kv, 0, 8); }, "next_n"));
  EXPECT_TRUE(throws_naming([&] { paged_mtp_windows(kv, 1, 4); }, "max_context"));
}

}  // namespace
}  // namespace dsa
