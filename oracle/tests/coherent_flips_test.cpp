// A FlashMLA-style bf16 backward whose Δ = out·dout comes from its own bf16 out, judged
// without that out (SPEC §5, §9; local_bounds.cpp flip_sum).
//
// The candidate rounds P to bf16 before P·V, so its fp32 out lies a little off the baseline's;
// where a bf16 rounding midpoint lies between the two, the candidate's bf16 out_c is one ulp
// from the baseline's (a flip). Each flip moves Δ by ulp_c·dout_c. δΔ16 held the flips in
// quadrature, sqrt(Σ (ulp_c dout_c)^2), as if their signs were independent draws; but a flip
// follows the sign of the candidate's shift of out_c, and a few flips can add up. In this row
// (query row 48, head 0 of a generated level-1 case that CI's random RapidCheck seed drew,
// 2026-12-02, 2 valid keys) two large flips add coherently: Δ moved 0.00265 against a
// quadrature of 0.0019, and dq failed at 1.11x its bound. The flips now enter as their hard
// sum up to quadrature16()^2 equal ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dsa/oracle/fixture_check.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::oracle {
namespace {

// The row's inputs as drawn (q, kv bf16 values; dout fp32), hex floats: exact.
const double kQ[32] = {
    0x1.2cp-1, -0x1.36p-1, 0x1.8p-4, -0x1.cep-9, -0x1.28p-1, 0x1.8ep-2, 0x1.bcp-3, -0x1.c8p-2,
    -0x1.bep-1, 0x1.26p-1, -0x1.ep-1, 0x1.5ap-2, 0x1.74p-1, -0x1.dep-2, -0x1.72p-1, 0x1.6p-1,
    -0x1.d8p-1, -0x1.8p-1, -0x1.4cp-5, -0x1.06p-2, 0x1.2ep-1, -0x1.06p-1, 0x1.42p-1, -0x1.4ap-1,
    0x1.94p-2, -0x1.ap-1, 0x1.3p-1, 0x1.98p-1, 0x1.e2p-1, 0x1.cep-1, 0x1.9p-2, -0x1.24p-1};
const double kKv0[32] = {
    0x1.5ep-2, -0x1.52p-3, 0x1.06p-1, -0x1.c4p-1, -0x1.1cp-2, 0x1.38p-2, -0x1.02p-2, 0x1.3ep-1,
    -0x1.6cp-1, -0x1.16p-2, 0x1.68p-1, -0x1.e6p-1, -0x1.1cp-1, 0x1.bap-2, 0x1.9cp-1, 0x1.fp-9,
    0x1.9cp-1, -0x1.d8p-2, -0x1.eap-4, -0x1.86p-1, 0x1.28p-1, -0x1.2ap-3, -0x1.24p-2, 0x1.7p-1,
    0x1.a4p-3, 0x1.cp-1, -0x1.d4p-1, -0x1.5ep-7, -0x1.3ap-2, 0x1.b4p-3, -0x1.02p-1, -0x1.02p-1};
const double kKv1[32] = {
    -0x1.2ap-4, -0x1.92p-2, -0x1.22p-4, -0x1.28p-1, 0x1.cap-1, -0x1.9ep-2, 0x1.06p-1, -0x1.7ap-1,
    -0x1.b8p-1, 0x1.62p-2, 0x1.c2p-4, -0x1.ep-1, 0x1.6p-1, 0x1.6ep-6, 0x1.44p-3, 0x1.e8p-1,
    -0x1.ap-1, -0x1.44p-8, -0x1.8ep-3, 0x1.96p-3, 0x1.6cp-3, 0x1.9p-3, 0x1.acp-2, 0x1.0ep-1,
    -0x1.c8p-3, -0x1.7p-1, -0x1.e4p-4, 0x1.92p-1, -0x1.b6p-1, -0x1.c8p-3, 0x1.a2p-4, -0x1.14p-2};
const double kDout[32] = {
    -0x1.e997d6p-3, -0x1.b3d2dcp-1, 0x1.c45e8ep-1, -0x1.c8261cp-3, 0x1.10b2bcp-1, -0x1.8ea0dap-2,
    0x1.2bc63p-2, -0x1.ea6046p-2, -0x1.9d0bacp-3, 0x1.71476p-3, 0x1.3f73eep-4, -0x1.3adddap-1,
    0x1.0d6e4ap-1, -0x1.1a7148p-2, 0x1.194088p-1, 0x1.72e5fcp-4, -0x1.09fbbcp-2, -0x1.878cbcp-1,
    -0x1.40b88ep-1, 0x1.e9a0aep-2, 0x1.d279c2p-2, 0x1.a37966p-3, 0x1.3c3b0ap-1, 0x1.78f83p-1,
    0x1.5c2f24p-3, -0x1.13a52cp-2, -0x1.ebf4e8p-1, 0x1.cc32aap-1, -0x1.2e322cp-3, -0x1.1f9ef8p-1,
    0x1.af5d4cp-1, -0x1.2d58a4p-1};

OpCase coherent_flip_case() {
  OpCase c;
  c.mla.q = Tensor::from_f64({1, 1, 32}, std::vector<double>(kQ, kQ + 32)).to(DType::BF16);
  std::vector<double> kv(kKv0, kKv0 + 32);
  kv.insert(kv.end(), kKv1, kKv1 + 32);
  c.mla.kv = Tensor::from_f64({2, 32}, kv).to(DType::BF16);
  c.mla.indices = Tensor::from_f64({1, 2}, {0, 1}).to(DType::I32);
  c.mla.sm_scale = 0x1.6a09e667f3bccp-1;  // 1/sqrt(2), as drawn
  c.mla.d_v = 32;
  c.dout = Tensor::from_f64({1, 1, 32}, std::vector<double>(kDout, kDout + 32)).to(DType::F32);
  return c;
}

// FlashMLA-style: P and dS rounded to bf16, fp32 sums, bf16 out and dq, Δ from its bf16 out.
props::FlashStyleResult flash_mla_style(const OpCase& c) {
  props::FlashStyleOptions o;
  o.work = DType::BF16;
  o.round_p_before_pv = o.round_ds_before_dq = o.round_before_dkv = true;
  o.out_dtype = o.dq_dtype = DType::BF16;
  return props::flash_style_sparse_mla(c.mla, &c.dout, o);
}

TEST(CoherentFlips, TheRowTheyMovedPassesAndAMovedDqStillFails) {
  const OpCase c = coherent_flip_case();
  const props::FlashStyleResult k = flash_mla_style(c);
  // The premise: the kernel's bf16 out and the exact out rounded to bf16 differ in columns
  // whose Δ terms add up beyond their quadrature.
  const std::vector<double> mine = k.fwd.out.to_f64(), g = c.dout.to_f64(),
                            base = reference::sparse_mla_forward(c.mla).out.to(DType::BF16).to_f64();
  double sum = 0, sq = 0;
  int flips = 0;
  for (size_t x = 0; x < g.size(); ++x) {
    const double d = (mine[x] - base[x]) * g[x];
    if (d == 0) continue;
    ++flips;
    sum += d;
    sq += d * d;
  }
  ASSERT_GE(flips, 2);
  ASSERT_GT(std::abs(sum), 1.3 * std::sqrt(sq)) << "the flips no longer add coherently";
  const NamedOutputs grads{{"dq", k.grads.dq}, {"dkv", k.grads.dkv}};  // no out handed over
  const OpReport r = judge_outputs(Op::SparseMlaBwd, c, grads);
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  // Able to fail: dq 5% too large on this row.
  const std::vector<double> dq = k.grads.dq.to_f64();
  std::vector<double> moved(dq);
  for (double& v : moved) v *= 1.05;
  const OpReport bad = judge_outputs(Op::SparseMlaBwd, c,
                                     {{"dq", Tensor::from_f64(k.grads.dq.shape(), moved).to(DType::BF16)},
                                      {"dkv", k.grads.dkv}});
  EXPECT_EQ(bad.verdict, Verdict::Fail) << format_op_report(bad);
}

}  // namespace
}  // namespace dsa::oracle
