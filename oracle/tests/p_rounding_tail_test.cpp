// A FlashMLA-style bf16 sparse MLA kernel (P = exp(logit - max) rounded to bf16 before P·V, fp32
// accumulation, the row sum from the unrounded P; dS and P rounded to bf16 before dq and dkv) on
// a case where it exceeded its bound in the false-alarm run at DSA_TEST_LEVEL=2, seed 11
// (session 14), the run's own dump (oracle/tests/data/, a property-suite fixture):
// - flash_style_dkv_dups_level2_seed11: smla.duplicates_accumulate_in_dkv, one key in 3 slots,
//   128 heads; dkv [0, 19] was 1.007 of its bound. Its error is the P rounding (-0.0507 of
//   -0.0507): 48 heads whose sink lies far below have p = 1/3 and round it alike (+6.5e-4),
//   and dout's column 19 is negative on nearly every head, so the roundings add coherently
//   (6.1 σ of the independent model). The floor now counts the P roundings of tied rows (every
//   valid logit equal, p off the 16-bit grid) as one per (key, p) (local_bounds.cpp dkv_ties).
// It must pass with no WEAK row, and an output moved by θ(1 + 2^-6) of its row's scale (one
// element, one whole row) must still fail. docs/SPEC.md §9, docs/what-a-pass-means.md "Floors
// per op".
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/property_tests/fp8_generators.h"
#include "dsa/reference/sparse_mla_fp8.h"

namespace dsa::oracle {
namespace {

OpCase load_case(const std::string& name) {
  return op_case_from_fixture(fixtures::load_fixture(std::string(DSA_ORACLE_TEST_DATA_DIR) + "/" + name));
}

// The false-alarm run's control_flash_style (property_tests/mutants/mutants.cpp): P, dS rounded
// to q's dtype before P·V, dq and dkv; out in q's dtype, Δ from it.
props::FlashStyleResult flash_style(const OpCase& c) {
  props::FlashStyleOptions o;
  o.work = o.out_dtype = c.mla.q.dtype();
  o.round_p_before_pv = o.round_ds_before_dq = o.round_before_dkv = true;
  return props::flash_style_sparse_mla(c.mla, c.dout.numel() > 0 ? &c.dout : nullptr, o);
}

NamedOutputs fwd_of(const props::FlashStyleResult& k) {
  return {{"out", k.fwd.out}, {"lse", k.fwd.lse}, {"max_logits", k.fwd.max_logits}};
}

NamedOutputs bwd_of(const props::FlashStyleResult& k) {
  NamedOutputs o{{"dq", k.grads.dq}, {"dkv", k.grads.dkv}, {"out", k.fwd.out}};
  if (k.grads.dsink) o["dsink"] = *k.grads.dsink;
  return o;
}

const TensorCheck& tensor(const OpReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::out_of_range("no tensor " + name);
}

// `name` of `g` moved by θ(1 + 2^-6) × its row's scale, in the element `at` alone and in its
// whole row (away from 0): both must fail.
void expect_moves_fail(Op op, const OpCase& c, const NamedOutputs& g, const OpReport& r, const std::string& name,
                       int64_t at) {
  const TensorCheck& t = tensor(r, name);
  const int64_t row = at / t.row_len;
  const double amount = t.theta * (1 + 0x1p-6) * t.row_scale[static_cast<size_t>(row)];
  ASSERT_GT(amount, 0.0);
  for (int whole = 0; whole < 2; ++whole) {
    const Tensor& base = g.at(name);
    std::vector<double> x = base.to_f64();
    const int64_t first = whole ? row * t.row_len : at, last = whole ? first + t.row_len : at + 1;
    for (int64_t i = first; i < last; ++i) x[static_cast<size_t>(i)] += x[static_cast<size_t>(i)] >= 0 ? amount : -amount;
    NamedOutputs moved = g;
    moved[name] = Tensor::from_f64(base.shape(), x).to(base.dtype());
    const OpReport mr = judge_outputs(op, c, moved);
    EXPECT_EQ(mr.verdict, Verdict::Fail) << name << (whole ? " row " : " element ") << at << " moved by θ(1+2^-6)·row scale\n"
                                         << format_op_report(mr);
  }
}

TEST(PRoundingTail, FlashStyleBf16DkvOfTiedDuplicateRowsPasses) {
  const OpCase c = load_case("flash_style_dkv_dups_level2_seed11.safetensors");
  ASSERT_EQ(c.mla.q.dtype(), DType::BF16);
  ASSERT_GT(c.dout.numel(), 0);
  const props::FlashStyleResult k = flash_style(c);
  const OpReport f = judge_outputs(Op::SparseMlaFwd, c, fwd_of(k));
  EXPECT_EQ(f.verdict, Verdict::Pass) << format_op_report(f);
  const OpReport r = judge_outputs(Op::SparseMlaBwd, c, bwd_of(k));
  const TensorCheck& dkv = tensor(r, "dkv");
  std::printf("dkv worst err/bound %.4f weakest bound/(θ rowscale) %.3g\n", dkv.worst, dkv.weakest / dkv.theta);
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);  // dkv 1.007 with the rows independent
  for (const auto& t : r.tensors) EXPECT_EQ(t.weak_rows, 0) << t.name;
  // dkv [0, 19] of dkv [1, 32]: the element that exceeded its bound, and its row
  expect_moves_fail(Op::SparseMlaBwd, c, bwd_of(k), r, "dkv", 19);
}

// The max key out's P rounding may skip is the kernel's, not the float64 reference's. A
// FlashMLA-style FP8 decode kernel (props::flashmla_fp8_forward: kv = fp8 · scale rounded to
// bf16, P = exp(logit - max) rounded to bf16 before P·V) on the draw of
// Detection.Fp8SmlaPerturbationsFailFlashMlaControlsPass that failed at DSA_TEST_LEVEL=2, seed
// 12003 (s_q 2, h_q 16, 25 tokens, k 5, amax scales; dumped from that run): in row (t 0, h 15)
// token 5 (two slots) has the largest exact logit, 0.7084, and token 4 the next, 0.7038; kv
// dequantized to bf16 moves them to 0.7032 and 0.7035, so the kernel's max is token 4 and
// token 5's exp, 0.99976, is rounded to 1 (P in bf16). The floor held token 5's exp(0) exact,
// and out [0, 15, 135] (token 5's value 12.56 there, token 4's -0.29) was 1.03x its bound. The
// floor now counts a max key's rounding wherever another key or the sink may be the kernel's
// max (sparse_mla_floors' margin; kv_rel_shift 2·u16 for FP8 kv dequantized to 16 bits).
// Both scale roundings must pass, the flip must be there, and that element moved by θ(1 +
// 2^-6) of its row's scale, alone or with its row, must fail.
TEST(PRoundingTail, Fp8MaxKeyDisplacedByTheKernelsDequantizationPasses) {
  const std::string file = "flashmla_fp8_max_key_displaced_level2_seed12003.safetensors";
  const OpCase c = load_case(file);
  const SparseMlaFp8Inputs& in = c.mla_fp8;
  ASSERT_EQ(in.q.dim(), 3) << file << " is not a sparse_mla_fp8_fwd case";
  // the flip: per (t, h) row, the slot of the largest logit over the exact kv, over kv
  // dequantized to bf16 with the fp32 scale, and with the scale rounded to bf16
  const SparseMlaInputs exact = reference::gather_sparse_mla_fp8(in).inputs;
  SparseMlaInputs fp32_scale = exact;
  fp32_scale.kv = exact.kv.to(DType::BF16);
  const SparseMlaInputs bf16_scale = fp8_scale_rounded_problem(in, DType::BF16);
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d = in.q.size(2), k = exact.indices.size(1);
  auto argmax_row = [&](const SparseMlaInputs& x, int64_t t, int64_t h) {
    double best = -INFINITY;
    int64_t at = -1;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = static_cast<int64_t>(x.indices.get(t * k + j));
      if (id < 0 || id >= x.kv.size(0)) continue;
      double dot = 0;
      for (int64_t col = 0; col < d; ++col) dot += x.q.get((t * h_q + h) * d + col) * x.kv.get(id * d + col);
      if (dot > best) best = dot, at = id;
    }
    return at;
  };
  int flips = 0;
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t e = argmax_row(exact, t, h);
      flips += argmax_row(fp32_scale, t, h) != e || argmax_row(bf16_scale, t, h) != e;
    }
  EXPECT_GT(flips, 0) << "no row whose max key the bf16 dequantization displaces: the case no longer tests it";
  for (bool scale_in_bf16 : {true, false}) {
    SCOPED_TRACE(scale_in_bf16 ? "tile scale rounded to bf16" : "fp32 tile scale");
    const SparseMlaForward f = props::flashmla_fp8_forward(in, scale_in_bf16);
    const NamedOutputs outs{{"out", f.out}, {"lse", f.lse}, {"max_logits", f.max_logits}};
    const OpReport r = judge_outputs(Op::SparseMlaFp8Fwd, c, outs);
    const TensorCheck& out = tensor(r, "out");
    std::printf("fp8 %s scale: out worst err/bound %.4f\n", scale_in_bf16 ? "bf16" : "fp32", out.worst);
    EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);  // 1.03 before (bf16 scale)
    // out [0, 15, 135], the element that exceeded its bound, and its row
    expect_moves_fail(Op::SparseMlaFp8Fwd, c, outs, r, "out", (0 * h_q + 15) * kMlaFp8NopeDim + 135);
  }
}

}  // namespace
}  // namespace dsa::oracle
