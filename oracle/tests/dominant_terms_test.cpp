// fp32 and narrower dots of FP8 terms whose few dominant terms cancel (SPEC §9, §10;
// local_bounds.cpp sum_error_scale).
//
// A sum's rounding error is Σ_i δ_i s_i over its partial sums s_i. The floors took
// √n|sum| + Σ|t_i| for sqrt(Σ_i s_i²): right for terms of one magnitude, short by up to √n/2
// when a few large terms of opposite signs cancel, since the partial sums then stay near
// their size for many steps. FP8 bytes span 2^-16..57344 (e5m2), so a drawn dot can be two
// terms of ±286720 and 62 small ones. A random-seed sweep (RC_PARAMS="seed=424242" ctest
// -L prop, 2026-12-03) found two correct kernels failing on such dots; each is one row here,
// as drawn:
// - the LibTorch CPU paged indexer (fp32, the dot in c order): scores[960, 9] 1.00009x;
// - a declared 14-bit accumulator (fp8_reduced_accumulation) of e4m3 terms: scores[0, 27]
//   1.21x.
// The same kind in a sparse MLA logit q·kv (bf16 inputs, fp32 kernel) is built here too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dsa/contract/fp8.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/reference/fp8_indexer.h"
#include "declared_tensor_core.h"

namespace dsa::oracle {
namespace {

// Row 960 (key 9) of the paged case: 2 heads x 64 e5m2 bytes of q, the key's 64 bytes, its
// scale and the row's head weights. Head 1 holds +-57344 at columns 0 and 28; the key holds -5
// at both: terms -286720 and +286720, 28 adds apart, in a dot of 4.41.
const uint8_t kPagedQ[128] = {
    0xcf, 0xd4, 0x00, 0x5c, 0x57, 0xd8, 0xd0, 0xd6, 0xd3, 0x5c, 0xd6, 0xe0, 0xdc, 0x5f, 0xde, 0xe0,
    0xdf, 0x59, 0xd9, 0x51, 0x5e, 0x5a, 0x00, 0x55, 0xdc, 0x82, 0x5e, 0xdc, 0xdd, 0x5a, 0xdd, 0x58,
    0x5b, 0xda, 0x56, 0x5d, 0x5d, 0x54, 0x5e, 0x5d, 0xdc, 0xdf, 0xe0, 0x5c, 0x5e, 0x55, 0xdb, 0xdd,
    0x5b, 0xd1, 0x5e, 0xdc, 0x5f, 0x5c, 0x60, 0x5c, 0xdc, 0x53, 0xdf, 0xde, 0x52, 0xde, 0xdf, 0x55,
    0x7b, 0x9e, 0xa6, 0x30, 0xb1, 0x2d, 0xaf, 0xa8, 0x2d, 0x1f, 0x2b, 0x30, 0xb1, 0xb0, 0x31, 0xa4,
    0x2e, 0xb0, 0x2f, 0x29, 0xa1, 0x29, 0x23, 0xb0, 0x2b, 0xa9, 0xac, 0xa5, 0xfb, 0x2b, 0x27, 0xb0,
    0x2e, 0xac, 0xae, 0x31, 0xae, 0x2d, 0x2f, 0x1e, 0xa8, 0xad, 0x2f, 0x2f, 0xa3, 0x2d, 0xac, 0x30,
    0xad, 0xad, 0x28, 0x2f, 0xb1, 0x29, 0x2f, 0xb0, 0x23, 0xad, 0x31, 0xb1, 0x2d, 0x2f, 0xb1, 0xb0,
};
const uint8_t kPagedK[64] = {
    0xc5, 0x42, 0xc5, 0x43, 0xb9, 0xc2, 0xc4, 0x3e, 0xc4, 0xc4, 0x40, 0xb8, 0xc1, 0xc1, 0x2d, 0xc4,
    0x43, 0xc6, 0x42, 0x45, 0x3f, 0xa2, 0x3d, 0xc2, 0x44, 0xc5, 0x40, 0xc5, 0xc5, 0x3b, 0xbb, 0x00,
    0x45, 0xc1, 0x45, 0xc0, 0x45, 0x44, 0xc1, 0xc5, 0x43, 0xc4, 0x45, 0xc4, 0x44, 0x45, 0x45, 0x42,
    0xbe, 0x42, 0x2e, 0x2c, 0xae, 0xc5, 0x46, 0x45, 0x42, 0xc4, 0x45, 0x41, 0xc3, 0x46, 0x3e, 0xb1,
};
constexpr double kPagedScale = 0x1.54b5fcp-7, kPagedW0 = 0x1.958c56p-4, kPagedW1 = -0x1.298004p+0;

// Row 0 (key 27) of the detection draw: 2 heads x 128 e4m3fn bytes of q, the key's bytes.
const uint8_t kNarrowQ[256] = {
    0xba, 0x36, 0x25, 0x31, 0x40, 0xc2, 0xb4, 0x3b, 0xbd, 0x28, 0x44, 0xb3, 0x7e, 0x31, 0xb5, 0xb7,
    0xbf, 0x39, 0xa0, 0x31, 0x45, 0x3e, 0x3e, 0x40, 0xb5, 0x38, 0xbf, 0xbf, 0xc3, 0x2c, 0xbc, 0xbd,
    0x3f, 0xbf, 0x35, 0xb9, 0xc1, 0x42, 0x2e, 0xbf, 0xb2, 0x3b, 0x43, 0xb8, 0xbf, 0x32, 0xc4, 0xb4,
    0x33, 0x42, 0x3e, 0xc5, 0x44, 0xb4, 0xc2, 0x40, 0xb5, 0xb9, 0x3e, 0x27, 0xbc, 0x9f, 0x40, 0x36,
    0x28, 0xc0, 0x3b, 0x3f, 0x3f, 0xbe, 0xb5, 0x3e, 0x38, 0x3c, 0x43, 0xb2, 0x36, 0xb4, 0x41, 0x40,
    0x3a, 0xbd, 0x41, 0xa9, 0x38, 0x42, 0xbc, 0xb8, 0xc2, 0xc0, 0xbb, 0xb8, 0x43, 0x41, 0x45, 0x38,
    0x43, 0x41, 0xa1, 0x45, 0xc1, 0xc6, 0x44, 0xfe, 0xa3, 0xb4, 0x44, 0xa1, 0x04, 0xb9, 0x12, 0x3c,
    0x40, 0x3e, 0xb5, 0x45, 0x3b, 0xbe, 0x33, 0xa6, 0x8a, 0x29, 0xc3, 0xc5, 0xc4, 0x37, 0x02, 0x36,
    0x56, 0xca, 0x59, 0xbb, 0x54, 0xda, 0x4d, 0x5a, 0x4e, 0xda, 0x47, 0x55, 0x4e, 0x4c, 0x59, 0xc5,
    0xd9, 0xc0, 0xca, 0x54, 0x52, 0xc1, 0xd1, 0xd0, 0x56, 0xd8, 0x54, 0x59, 0x59, 0xd8, 0x4a, 0xda,
    0x5a, 0xd9, 0x56, 0x53, 0xd7, 0xda, 0xd8, 0x56, 0x37, 0x49, 0x40, 0xcf, 0x49, 0x00, 0x2f, 0xc6,
    0x57, 0xd0, 0xda, 0xda, 0x4e, 0xb8, 0xce, 0x00, 0xd4, 0xd8, 0x4b, 0xd9, 0xc2, 0x59, 0xbb, 0x4f,
    0x56, 0x4a, 0x4a, 0x50, 0xd6, 0xcc, 0x5a, 0x58, 0x59, 0x53, 0x56, 0xba, 0x49, 0x4b, 0x34, 0x57,
    0x59, 0xcd, 0x46, 0xd6, 0x48, 0xda, 0xd4, 0xd7, 0xd9, 0x54, 0xd8, 0x4a, 0xd9, 0xd5, 0x3f, 0x55,
    0x50, 0xd7, 0xcd, 0xd5, 0x4a, 0xd3, 0xce, 0x56, 0x5a, 0xc4, 0xd4, 0x53, 0xb0, 0xd9, 0xd5, 0xd8,
    0x28, 0xd6, 0x3a, 0x56, 0x52, 0xd8, 0xda, 0x51, 0xd0, 0xb3, 0x51, 0xd4, 0x4a, 0x27, 0x59, 0x53,
};
const uint8_t kNarrowK[128] = {
    0xc6, 0xc7, 0x45, 0x3c, 0x41, 0xcb, 0xb8, 0x47, 0xba, 0xb8, 0x41, 0x48, 0x4c, 0x41, 0x49, 0xb9,
    0x4d, 0x4c, 0x44, 0xc2, 0xcb, 0xcd, 0xc8, 0xc1, 0x45, 0xc8, 0x2c, 0xcc, 0xc6, 0x4a, 0xa1, 0x42,
    0x4d, 0xc6, 0xcc, 0xcd, 0xcb, 0xc4, 0xc9, 0x2f, 0xb6, 0xcc, 0x4a, 0xbf, 0xc4, 0xb1, 0x2d, 0x4d,
    0x44, 0x33, 0xc9, 0x46, 0xc8, 0x28, 0x44, 0x49, 0x3f, 0xcb, 0xa8, 0x44, 0x49, 0x2f, 0x4b, 0xca,
    0x41, 0x19, 0xc3, 0x27, 0x44, 0xc9, 0xcc, 0x49, 0x44, 0x43, 0x3f, 0x40, 0x46, 0xc0, 0xc8, 0x4c,
    0xcb, 0xbc, 0xb6, 0x4b, 0xbf, 0xc3, 0xc1, 0xcc, 0xca, 0x3d, 0xcc, 0x48, 0x46, 0x49, 0x00, 0x4d,
    0x43, 0xb7, 0x4c, 0xca, 0xc0, 0x45, 0x41, 0x4c, 0xc0, 0xc6, 0xca, 0x39, 0xbd, 0x4d, 0x48, 0xcb,
    0x4a, 0x46, 0x48, 0x46, 0xc8, 0xc6, 0xb7, 0x40, 0xac, 0xb9, 0x49, 0xc5, 0xaa, 0xc3, 0xc1, 0x4a,
};
constexpr double kNarrowScale = 0x1.3d65cp+2, kNarrowW0 = -0x1.0fd146p-2, kNarrowW1 = -0x1.2fc3ep-10;

OpCase one_key_case(const uint8_t* q, const uint8_t* k, int64_t d, double scale, double w0, double w1,
                    Fp8Format format) {
  OpCase c;
  Fp8IndexerInputs& in = c.fp8_indexer;
  in.format = format;
  in.q_idx = Tensor(DType::U8, {1, 2, d});
  in.k_idx = Tensor(DType::U8, {1, d});
  for (int64_t i = 0; i < 2 * d; ++i) in.q_idx.data<uint8_t>()[i] = q[i];
  for (int64_t i = 0; i < d; ++i) in.k_idx.data<uint8_t>()[i] = k[i];
  in.k_scale = Tensor::from_f64({1}, {scale}).to(DType::F32);
  in.w = Tensor::from_f64({1, 2}, {w0, w1}).to(DType::F32);
  in.windows.s_kv = 1;
  in.windows.ks = {0};
  in.windows.ke = {1};
  return c;
}

// The kernel's score: each head's dot accumulated in c order by `acc` (one rounding per
// add), then in fp32 either ReLU, x w_j, the heads' sum, x k_scale (the LibTorch op's order)
// or, with scale_first, x k_scale, ReLU, x w_j, the heads' sum (the detection control's).
template <class Acc>
double kernel_score(const Fp8IndexerInputs& in, Acc acc, bool scale_first = false) {
  const int64_t d = in.q_idx.size(2);
  const float s = static_cast<float>(in.k_scale.get(0));
  float score = 0;
  for (int64_t j = 0; j < 2; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < d; ++c)
      dot = acc(dot, fp8_to_double(in.q_idx.data<uint8_t>()[j * d + c], in.format) *
                         fp8_to_double(in.k_idx.data<uint8_t>()[c], in.format));
    const float r = std::max(0.0f, scale_first ? s * static_cast<float>(dot) : static_cast<float>(dot));
    score += static_cast<float>(in.w.get(j)) * r;
  }
  return scale_first ? score : static_cast<float>(score * s);
}

// The former floor, λ u(sqrt(Σ_j (w_j(√d|dot_j| + Σ_c|t_c|))²) + √H|I| + Σ_j|w_j r_j|), over the
// dequantized key, with u = 2^-24 and λ the judging tolerance row's (the declared row's λ
// carries its 2^10 for a 14-bit accumulator).
double former_floor(const Fp8IndexerInputs& in, double lambda) {
  const int64_t d = in.q_idx.size(2);
  const double s = in.k_scale.get(0);
  double dots2 = 0, val = 0, abs_sum = 0;
  for (int64_t j = 0; j < 2; ++j) {
    double dot = 0, ad = 0;
    for (int64_t c = 0; c < d; ++c) {
      const double t = fp8_to_double(in.q_idx.data<uint8_t>()[j * d + c], in.format) *
                       fp8_to_double(in.k_idx.data<uint8_t>()[c], in.format) * s;
      dot += t;
      ad += std::abs(t);
    }
    const double wj = in.w.get(j), de = std::abs(wj) * (std::sqrt(static_cast<double>(d)) * std::abs(dot) + ad);
    dots2 += de * de;
    val += wj * std::max(dot, 0.0);
    abs_sum += std::abs(wj * std::max(dot, 0.0));
  }
  return lambda * 0x1p-24 * (std::sqrt(dots2) + std::sqrt(2.0) * std::abs(val) + abs_sum);
}

Tensor one_score(double v) { return Tensor::from_f64({1, 1}, {v}).to(DType::F32); }

TEST(DominantTerms, Fp32DotWhoseLargeTermsCancelPassesAndAMovedScoreFails) {
  const OpCase c = one_key_case(kPagedQ, kPagedK, 64, kPagedScale, kPagedW0, kPagedW1, Fp8Format::E5M2);
  const double ref = reference::fp8_indexer_scores(c.fp8_indexer).get(0);
  const double mine = kernel_score(c.fp8_indexer, [](double a, double t) {
    return static_cast<double>(static_cast<float>(a) + static_cast<float>(t));
  });
  const OpReport r = judge_outputs(Op::Fp8IndexerScores, c, {{"scores", one_score(mine)}});
  const TensorCheck& t = r.tensors.front();
  // The premise: an error past the former floor (it failed there), from the dominant terms.
  ASSERT_GT(std::abs(mine - ref), former_floor(c.fp8_indexer, t.lambda)) << mine << " vs " << ref;
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  // Able to fail: the score moved by just over θ of the row's scale.
  const OpReport bad = judge_outputs(Op::Fp8IndexerScores, c,
                                     {{"scores", one_score(mine + (1 + 0x1p-6) * t.theta * t.row_scale.front())}});
  EXPECT_EQ(bad.verdict, Verdict::Fail) << format_op_report(bad);
}

TEST(DominantTerms, DeclaredFourteenBitAccumulatorWhoseLargeTermsCancelPassesAndAMovedScoreFails) {
  const OpCase c = one_key_case(kNarrowQ, kNarrowK, 128, kNarrowScale, kNarrowW0, kNarrowW1, Fp8Format::E4M3FN);
  const double ref = reference::fp8_indexer_scores(c.fp8_indexer).get(0);
  const double mine = kernel_score(c.fp8_indexer, [](double a, double t) {
    const double x = a + t;  // exact: both on a fine binary grid
    if (x == 0) return x;
    int e = 0;
    std::frexp(x, &e);
    const double ulp = std::ldexp(1.0, e - 14);
    return std::nearbyint(x / ulp) * ulp;
  }, /*scale_first=*/true);
  ASSERT_EQ(mine, -0x1.572008p+6) << "not the control's score as drawn";
  testing::DeclaredTensorCore ok(one_score(mine));
  const OpReport r = check_fp8_indexer_scores(ok, c);
  const TensorCheck& t = r.tensors.front();
  ASSERT_GT(std::abs(mine - ref), former_floor(c.fp8_indexer, t.lambda)) << mine << " vs " << ref;
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  // Able to fail: moved by just over the declared row's θ of the row's scale.
  testing::DeclaredTensorCore moved(one_score(mine - (1 + 0x1p-6) * t.theta * t.row_scale.front()));
  const OpReport bad = check_fp8_indexer_scores(moved, c);
  EXPECT_EQ(bad.verdict, Verdict::Fail) << format_op_report(bad);
}

// A sparse MLA row (bf16 q and kv, d_qk 576, d_v 512, two keys) whose first key's logit
// holds +65536 and -65536 at columns 0 and 560 among small products: the fp32 partial sum
// sits at 65536 for 560 adds, each small product rounded at its ulp. A FlashAttention-style
// fp32 kernel (products and sums in column order) passes; out moved fails. Under the former
// floors it failed out (508 of 512 columns), lse and max_logits, each at 1.18x.
TEST(DominantTerms, Fp32SparseMlaLogitWhoseLargeTermsCancelPassesAndAMovedOutFails) {
  constexpr int64_t kD = 576, kDv = 512, kFar = 560;
  std::mt19937_64 rng(20261211);  // a draw whose walk errs 4x the former logit floor
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> q(kD), kv(2 * kD);
  for (double& x : q) x = normal(rng);
  for (double& x : kv) x = normal(rng);
  q[0] = 256;
  q[kFar] = -256;
  kv[0] = kv[kFar] = 256;         // key 0: +65536 and -65536
  kv[kD] = kv[kD + kFar] = 0;     // key 1: no large product
  OpCase c;
  c.mla.q = Tensor::from_f64({1, 1, kD}, q).to(DType::BF16);
  c.mla.kv = Tensor::from_f64({2, kD}, kv).to(DType::BF16);
  c.mla.indices = Tensor::from_f64({1, 2}, {0, 1}).to(DType::I32);
  c.mla.sm_scale = 1.0 / std::sqrt(static_cast<double>(kD));
  c.mla.d_v = kDv;
  props::FlashStyleOptions o;  // fp32 throughout, products and sums in column/slot order
  const props::FlashStyleResult k = props::flash_style_sparse_mla(c.mla, nullptr, o);
  const NamedOutputs fwd{{"out", k.fwd.out}, {"lse", k.fwd.lse}, {"max_logits", k.fwd.max_logits}};
  // The row is WEAK (its bound is 0.3% of its scale: a logit of ±65536 products is ill-
  // conditioned), so it is judged under --allow-weak.
  CheckOptions opt = default_check_options();
  opt.allow_weak = true;
  const OpReport r = judge_outputs(Op::SparseMlaFwd, c, fwd, opt);
  const TensorCheck* t = nullptr;
  for (const TensorCheck& x : r.tensors)
    if (x.name == "out") t = &x;
  ASSERT_NE(t, nullptr);
  // The premise: key 0's fp32 logit errs past the former logit floor λu(√d|q·kv| + Σ|q_c kv_c|).
  const std::vector<double> qb = c.mla.q.to_f64(), kb = c.mla.kv.to_f64();
  double dot = 0, ad = 0;
  float dot32 = 0;
  for (int64_t x = 0; x < kD; ++x) {
    dot += qb[static_cast<size_t>(x)] * kb[static_cast<size_t>(x)];
    ad += std::abs(qb[static_cast<size_t>(x)] * kb[static_cast<size_t>(x)]);
    dot32 += static_cast<float>(qb[static_cast<size_t>(x)]) * static_cast<float>(kb[static_cast<size_t>(x)]);
  }
  ASSERT_GT(std::abs(dot32 - dot), t->lambda * 0x1p-24 * (std::sqrt(static_cast<double>(kD)) * std::abs(dot) + ad))
      << dot32 << " vs " << dot;
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  // Able to fail: out[0] moved by its own bound beyond the error it has.
  ASSERT_EQ(t->at_worst.flat, 0) << "the worst element is not column 0";
  std::vector<double> moved = k.fwd.out.to_f64();
  const double ref0 = t->at_worst.reference;
  moved[0] = ref0 + 1.05 * (moved[0] > ref0 ? 1 : -1) * t->bound;
  NamedOutputs bad = fwd;
  bad["out"] = Tensor::from_f64(k.fwd.out.shape(), moved).to(k.fwd.out.dtype());
  const OpReport rb = judge_outputs(Op::SparseMlaFwd, c, bad, opt);
  EXPECT_EQ(rb.verdict, Verdict::Fail) << format_op_report(rb);
}

}  // namespace
}  // namespace dsa::oracle
