// The declared rounding models on the FP8 sparse MLA forward (SPEC §9, §10; issue 12 F1 for
// the FP8 bf16 out).
//
// sparse_mla_fp8_fwd is §4 over the dequantized cache and returns a bf16 out too, so a kernel
// that normalizes before rounding P to bf16 (softmax in fp32, then p to bf16 before P·V, the max
// key's p too: DeepSeek's inference model.py) or that rounds out before applying attn_sink
// (the FP8 forward has sinks) rounds once more than FlashMLA does, exactly as on
// sparse_mla_fwd. check_sparse_mla_fp8_forward judges through the same judge_output as the §4
// checks (check_start.h), with CheckOptions::rounding, and its floors come from the same
// sparse_mla_floors (narrow_pmax, sink_rescale), so --normalized-p and --sink-after-rounding
// reach its bound on every route that reaches CheckOptions. These tests hold that down.
//
// Measured (this file's kernels; err/bound of out, both runs of the FP8 check alike):
//   normalized P, undeclared: the smla_fp8_decode golden and generated smla_fp8_decode cases
//     (ci, seeds 1-3) pass (0.53-0.69: many keys a row, logits of a few units); the few-key
//     cases below with power-of-two tile scales fail at 2.35/2.10/2.06x (seeds 1-3; 1.74-2.35x
//     with q scaled 1x-16x), every failing element explained by the max key's rounding and the
//     report naming --normalized-p;
//   declared: all pass, 0.88-0.93 on the power-of-two cases, with no WEAK row there nor on the
//     golden and the generated cases; the amax few-key cases pass with 5, 7, 7 of 16 out rows
//     WEAK (largest bound 1.07-1.17 % of the row's scale, θ = 1 %): their baseline dequantizes
//     kv to bf16 (SPEC §9), so ρ·E_row already holds about 0.3 % of the row's scale, which
//     sparse_mla_fwd's bf16 inputs do not have (docs/what-a-pass-means.md, Limits);
//   sink after rounding, undeclared: the power-of-two few-key cases fail at 1.96/2.22/2.24x;
//     the max key's rounding explains those failures as well on seeds 2-3 (seed 1: 166 of 167
//     elements), so the report names both flags there (before, only --normalized-p); declared they pass; the golden passes undeclared (0.74),
//     and declared it has 10 of 32 out rows WEAK (1.28 %), the generated cases 13, 6, 12 of 32
//     (1.24-1.26 %), as smla_sink has on sparse_mla_fwd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dsa/contract/fp8.h"
#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/fixtures/generate.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "fp8_rounding_kernels.h"

namespace dsa::oracle {
namespace {

using fp8_rounding::fp8_kernel;
using fp8_rounding::few_key_case;
using fp8_rounding::sink_after_rounding_kernel;

// A case and its memo: every candidate judged on it shares the reference, baselines, floors.
struct Fp8Case {
  Fp8Case(std::string n, SparseMlaFp8Inputs i) : name(std::move(n)), in(std::move(i)) {
    c.mla_fp8 = in;
    c.memo = std::make_shared<CaseMemo>();
  }
  std::string name;
  SparseMlaFp8Inputs in;
  OpCase c;
};

// The smla_fp8_decode golden and three generated draws of it (ci preset): many keys a row.
std::vector<Fp8Case> decode_cases() {
  std::vector<Fp8Case> out;
  const fixtures::Fixture g =
      fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_fp8_decode.safetensors");
  out.emplace_back("golden smla_fp8_decode", fixtures::sparse_mla_fp8_inputs(g, "smla_fp8_decode"));
  for (uint64_t seed : {1, 2, 3})
    out.emplace_back("generated smla_fp8_decode seed " + std::to_string(seed),
                     fixtures::sparse_mla_fp8_inputs(fixtures::generate_case("ci", "smla_fp8_decode", seed), "generated"));
  return out;
}

std::vector<Fp8Case> few_key_cases(Fp8ScaleRule rule) {
  std::vector<Fp8Case> out;
  for (unsigned seed : {1u, 2u, 3u})
    out.emplace_back(std::string("few keys ") + (rule == Fp8ScaleRule::Pow2 ? "pow2" : "amax") + " seed " +
                         std::to_string(seed),
                     few_key_case(seed, rule));
  return out;
}

NamedOutputs named(const SparseMlaForward& f) {
  return {{"out", f.out}, {"lse", f.lse}, {"max_logits", f.max_logits}};
}

OpReport judge(const Fp8Case& fc, const NamedOutputs& o, bool normalized_p, bool sink_after_rounding,
               bool allow_weak = false) {
  CheckOptions opt = default_check_options();
  opt.rounding.normalized_p = normalized_p;
  opt.rounding.sink_after_rounding = sink_after_rounding;
  opt.allow_weak = allow_weak;
  return judge_outputs(Op::SparseMlaFp8Fwd, fc.c, o, opt);
}

// out and out[NaN unread tokens]: the two runs of the FP8 check
std::vector<const TensorCheck*> outs(const OpReport& r) {
  std::vector<const TensorCheck*> v;
  for (const auto& t : r.tensors)
    if (t.name.rfind("out", 0) == 0) v.push_back(&t);
  return v;
}

void print(const std::string& what, const OpReport& r) {
  for (const TensorCheck* t : outs(r))
    std::printf("measured: %s %s: %s, err/bound %.3f, %lld failed, %lld of %lld rows WEAK (largest bound %.4f of "
                "the row scale)\n",
                what.c_str(), t->name.c_str(), to_string(r.verdict), t->worst, static_cast<long long>(t->failed_elements),
                static_cast<long long>(t->weak_rows), static_cast<long long>(t->rows), t->weakest);
}

// Undeclared, the normalized-P kernel fails where the max key dominates, and every failing out
// element is one the max key's rounding explains: the report names the flag.
TEST(Fp8PRounding, NormalizedPFailsUndeclaredAndTheReportNamesTheFlag) {
  for (const Fp8Case& fc : few_key_cases(Fp8ScaleRule::Pow2)) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = fp8_kernel(fc.in, true);
    // the premise: its out is not the reference's nearest rounding
    ASSERT_FALSE(bitwise_equal(k.out, reference::sparse_mla_fp8_forward(fc.in).out.to(DType::BF16)));
    const OpReport r = judge(fc, named(k), false, false);
    print(fc.name + " normalized P undeclared", r);
    ASSERT_EQ(r.verdict, Verdict::Fail) << format_op_report(r);
    ASSERT_EQ(outs(r).size(), 2u);
    for (const TensorCheck* t : outs(r)) {
      EXPECT_GT(t->failed_elements, 0);
      EXPECT_EQ(t->pmax_explained, t->failed_elements);
      EXPECT_NE(t->message.find("--normalized-p"), std::string::npos) << t->message;
    }
  }
}

// Declared, it agrees without a WEAK row on the power-of-two few-key cases, the golden and the
// generated cases.
TEST(Fp8PRounding, DeclaredItAgreesWithoutWeakRows) {
  std::vector<Fp8Case> cases = decode_cases();
  for (Fp8Case& fc : few_key_cases(Fp8ScaleRule::Pow2)) cases.push_back(std::move(fc));
  for (const Fp8Case& fc : cases) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = fp8_kernel(fc.in, true);
    print(fc.name + " normalized P undeclared", judge(fc, named(k), false, false, true));
    const OpReport r = judge(fc, named(k), true, false);
    print(fc.name + " normalized P declared", r);
    EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
    ASSERT_EQ(outs(r).size(), 2u);
    for (const TensorCheck* t : outs(r)) {
      EXPECT_TRUE(t->rounding.normalized_p);
      EXPECT_EQ(t->weak_rows, 0);
    }
  }
}

// With amax tile scales the FP8 baseline dequantizes kv to bf16 and its E_row holds that
// rounding; declared, the normalized-P kernel still has no element over its bound, and the
// rows whose bound exceeds θ of their scale are WEAK (a verdict unless --allow-weak), as the
// file header measures: never a pass that cannot fail.
TEST(Fp8PRounding, DeclaredOnAmaxScalesNoElementIsOverItsBound) {
  for (const Fp8Case& fc : few_key_cases(Fp8ScaleRule::Amax)) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = fp8_kernel(fc.in, true);
    const OpReport r = judge(fc, named(k), true, false, /*allow_weak=*/true);
    print(fc.name + " normalized P declared", r);
    EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
    const OpReport strict = judge(fc, named(k), true, false);
    int64_t weak = 0;
    for (const TensorCheck* t : outs(r)) weak += t->weak_rows;
    EXPECT_EQ(strict.verdict, weak > 0 ? Verdict::Weak : Verdict::Pass) << format_op_report(strict);
  }
}

// Detection holds with the declaration: the declared kernel's out moved outward by at least 2θ
// of a row's scale in one element, or in every element of one row, fails, in every row that is
// not WEAK and has a nonzero scale (the golden, the generated cases, the few-key cases).
TEST(Fp8PRounding, TwoThetaMovesFailWithTheDeclaration) {
  std::vector<Fp8Case> cases = decode_cases();
  for (Fp8ScaleRule rule : {Fp8ScaleRule::Pow2, Fp8ScaleRule::Amax})
    for (Fp8Case& fc : few_key_cases(rule)) cases.push_back(std::move(fc));
  for (const Fp8Case& fc : cases) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = fp8_kernel(fc.in, true);
    const NamedOutputs good = named(k);
    const OpReport r = judge(fc, good, true, false, true);
    ASSERT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
    const TensorCheck& t = r.tensors.front();
    ASSERT_EQ(t.name, "out");
    const std::vector<double> ref = reference::sparse_mla_fp8_forward(fc.in).out.to_f64();
    const Tensor& out = k.out;
    int64_t rows = 0, caught_one = 0, caught_row = 0;
    for (int64_t row = 0; row < t.rows; ++row) {
      const double scale = t.row_scale[static_cast<size_t>(row)];
      if (t.row_weak[static_cast<size_t>(row)] || !(scale > 0)) continue;
      ++rows;
      const double amount = 2 * t.theta * scale;
      // element e moved away from the reference until the bf16 value has moved by `amount`
      auto move = [&](Tensor& x, int64_t e) {
        const double v = out.get(e), sign = v >= ref[static_cast<size_t>(e)] ? 1 : -1;
        for (double a = amount; std::fabs(x.get(e) - v) < amount; a *= 1 + 0x1p-6) x.set(e, v + sign * a);
      };
      const int64_t first = row * t.row_len;
      Tensor one = out.to(DType::BF16), whole = out.to(DType::BF16);
      move(one, first + row % t.row_len);
      for (int64_t e = first; e < first + t.row_len; ++e) move(whole, e);
      NamedOutputs a = good, b = good;
      a["out"] = one;
      b["out"] = whole;
      caught_one += judge(fc, a, true, false, true).verdict == Verdict::Fail;
      caught_row += judge(fc, b, true, false, true).verdict == Verdict::Fail;
    }
    std::printf("measured: %s: 2 theta moves caught in %lld (one element) and %lld (one row) of %lld rows\n",
                fc.name.c_str(), static_cast<long long>(caught_one), static_cast<long long>(caught_row),
                static_cast<long long>(rows));
    EXPECT_GT(rows, 0);
    EXPECT_EQ(caught_one, rows);
    EXPECT_EQ(caught_row, rows);
  }
}

// A kernel without that rounding (FlashMLA's exp(P - max), the max key exact) is judged as
// before: undeclared it agrees with no WEAK row on the cases above (amax few-key rows aside,
// whose bounds the header measures), and the declaration only adds to out's bound (every
// row's largest bound at least the undeclared one, larger in some row). An fp32 out keeps
// its bounds bit for bit.
TEST(Fp8PRounding, AKernelWithoutTheRoundingIsUnchanged) {
  std::vector<Fp8Case> cases = decode_cases();
  for (Fp8Case& fc : few_key_cases(Fp8ScaleRule::Pow2)) cases.push_back(std::move(fc));
  for (const Fp8Case& fc : cases) {
    SCOPED_TRACE(fc.name);
    const NamedOutputs flash = named(fp8_kernel(fc.in, false));
    const OpReport plain = judge(fc, flash, false, false);
    print(fc.name + " exp(P - max) undeclared", plain);
    EXPECT_EQ(plain.verdict, Verdict::Pass) << format_op_report(plain);
    const OpReport declared = judge(fc, flash, true, false, true);
    const TensorCheck &a = plain.tensors.front(), &b = declared.tensors.front();
    ASSERT_EQ(a.name, "out");
    ASSERT_EQ(b.name, "out");
    EXPECT_FALSE(a.rounding.normalized_p);
    bool larger = false;
    for (size_t row = 0; row < a.row_max_bound.size(); ++row) {
      EXPECT_GE(b.row_max_bound[row], a.row_max_bound[row]);
      larger |= b.row_max_bound[row] > a.row_max_bound[row];
    }
    EXPECT_TRUE(larger);
    const SparseMlaForward f = reference::sparse_mla_fp8_forward(fc.in);
    const NamedOutputs wide{{"out", f.out.to(DType::F32)}, {"lse", f.lse.to(DType::F32)},
                            {"max_logits", f.max_logits.to(DType::F32)}};
    const OpReport w0 = judge(fc, wide, false, false), w1 = judge(fc, wide, true, true);
    ASSERT_EQ(w0.tensors.size(), w1.tensors.size());
    for (size_t i = 0; i < w0.tensors.size(); ++i) EXPECT_EQ(w0.tensors[i].row_max_bound, w1.tensors[i].row_max_bound);
  }
}

// The FP8 forward has sinks: a kernel that rounds out before applying attn_sink fails
// undeclared where its second rounding shows (power-of-two few-key cases), naming
// --sink-after-rounding; declared, it has no element over its bound (WEAK rows as on
// sparse_mla_fwd's smla_sink: the header's figures) and 2θ moves of a non-WEAK row still fail.
TEST(Fp8SinkAfterRounding, FailsUndeclaredAndAgreesDeclared) {
  for (const Fp8Case& fc : few_key_cases(Fp8ScaleRule::Pow2)) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = sink_after_rounding_kernel(fc.in);
    const OpReport plain = judge(fc, named(k), false, false);
    print(fc.name + " sink after rounding undeclared", plain);
    ASSERT_EQ(plain.verdict, Verdict::Fail) << format_op_report(plain);
    for (const TensorCheck* t : outs(plain)) {
      EXPECT_EQ(t->presink_explained, t->failed_elements);
      EXPECT_NE(t->message.find("--sink-after-rounding"), std::string::npos) << t->message;
    }
  }
  std::vector<Fp8Case> cases = decode_cases();
  for (Fp8Case& fc : few_key_cases(Fp8ScaleRule::Pow2)) cases.push_back(std::move(fc));
  for (const Fp8Case& fc : cases) {
    SCOPED_TRACE(fc.name);
    const SparseMlaForward k = sink_after_rounding_kernel(fc.in);
    const OpReport r = judge(fc, named(k), false, true, true);
    print(fc.name + " sink after rounding declared", r);
    ASSERT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
    const TensorCheck& t = r.tensors.front();
    ASSERT_TRUE(t.rounding.sink_after_rounding);
    const std::vector<double> ref = reference::sparse_mla_fp8_forward(fc.in).out.to_f64();
    int64_t rows = 0, caught = 0;
    for (int64_t row = 0; row < t.rows; ++row) {
      const double scale = t.row_scale[static_cast<size_t>(row)];
      if (t.row_weak[static_cast<size_t>(row)] || !(scale > 0)) continue;
      ++rows;
      Tensor moved = k.out.to(DType::BF16);
      const int64_t e = row * t.row_len + row % t.row_len;
      const double v = k.out.get(e), sign = v >= ref[static_cast<size_t>(e)] ? 1 : -1;
      for (double a = 2 * t.theta * scale; std::fabs(moved.get(e) - v) < 2 * t.theta * scale; a *= 1 + 0x1p-6)
        moved.set(e, v + sign * a);
      NamedOutputs o = named(k);
      o["out"] = moved;
      caught += judge(fc, o, false, true, true).verdict == Verdict::Fail;
    }
    EXPECT_GT(rows, 0);
    EXPECT_EQ(caught, rows);
  }
}

}  // namespace
}  // namespace dsa::oracle
