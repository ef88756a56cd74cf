// A sparse MLA forward whose `out` is wider than its 16-bit q is judged at out's class (SPEC §9:
// the baseline runs at the candidate's precision, read from out's dtype). A FlashMLA-style
// kernel (P rounded to bf16 before P·V, fp32 accumulation) that returns its fp32 accumulator
// as out fails that class by orders of magnitude, while the same values rounded to q's dtype
// agree (fresh-user finding F2). The verdict stays; the report adds a hint saying why and
// what to return, on the file route (a candidate file: CandidateBackend + judge_fixture_ops,
// what `compare` runs) and the backend route (judge_outputs), for sparse_mla_fwd and
// sparse_mla_fp8_fwd. The kernel is built here (props::flash_style_sparse_mla).
#include <gtest/gtest.h>

#include <string>

#include "dsa/fixtures/fixture.h"
#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/reference/sparse_mla_fp8.h"

namespace dsa::oracle {
namespace {

const char* const kHint = "should return out in q's dtype (BF16, SPEC §4)";

bool has_hint(const OpReport& r) {
  for (const auto& n : r.notes)
    if (n.find(kHint) != std::string::npos && n.find("A hint only") != std::string::npos &&
        n.find("judged at the F32 class") != std::string::npos)
      return true;
  return false;
}

// FlashMLA's scheme at bf16: P = exp(logit - max) rounded to bf16 before P·V, fp32 sums.
SparseMlaForward flashmla_style(const SparseMlaInputs& in, DType out_dtype) {
  props::FlashStyleOptions o;
  o.work = DType::BF16;
  o.round_p_before_pv = true;
  o.out_dtype = out_dtype;
  return props::flash_style_sparse_mla(in, nullptr, o).fwd;
}

NamedOutputs named(const SparseMlaForward& f) {
  return {{"out", f.out}, {"lse", f.lse}, {"max_logits", f.max_logits}};
}

OpReport forward_report(const std::vector<OpReport>& all, Op op) {
  for (const auto& r : all)
    if (r.op == to_string(op)) return r;
  ADD_FAILURE() << "no report of " << to_string(op);
  return OpReport{};
}

TEST(WiderOut, Fp32OutOfA16BitPKernelFailsWithTheHintOnEveryRoute) {
  const fixtures::Fixture f =
      fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_basic.safetensors");
  const OpCase c = op_case_from_fixture(f);
  ASSERT_EQ(c.mla.q.dtype(), DType::BF16);
  CheckOptions opt;
  opt.check_determinism = false;
  opt.provided_outputs = std::set<std::string>{"out", "lse", "max_logits"};
  const SparseMlaForward wide = flashmla_style(c.mla, DType::F32);
  ASSERT_EQ(wide.out.dtype(), DType::F32);
  CandidateBackend file(named(wide), "fp32 out", {});
  const OpReport by_file = forward_report(judge_fixture_ops(f, c, file, opt), Op::SparseMlaFwd);
  const OpReport by_backend = judge_outputs(Op::SparseMlaFwd, c, named(wide), opt, "fp32 out");
  for (const OpReport* r : {&by_file, &by_backend}) {
    EXPECT_EQ(r->verdict, Verdict::Fail) << format_op_report(*r);  // a hint, never a pass
    EXPECT_EQ(r->reason.rfind("out:", 0), 0u) << r->reason;
    EXPECT_TRUE(has_hint(*r)) << format_op_report(*r);
  }
  // The same values rounded to q's dtype agree, without the hint; an fp32 out of a kernel
  // that does not round P agrees at the fp32 class, without it.
  SparseMlaForward rounded = wide;
  rounded.out = wide.out.to(DType::BF16);
  const OpReport ok = judge_outputs(Op::SparseMlaFwd, c, named(rounded), opt, "bf16 out");
  EXPECT_EQ(ok.verdict, Verdict::Pass) << format_op_report(ok);
  EXPECT_FALSE(has_hint(ok));
  props::FlashStyleOptions exact;
  const OpReport fp32 = judge_outputs(Op::SparseMlaFwd, c,
                                      named(props::flash_style_sparse_mla(c.mla, nullptr, exact).fwd), opt,
                                      "fp32 kernel");
  EXPECT_EQ(fp32.verdict, Verdict::Pass) << format_op_report(fp32);
  EXPECT_FALSE(has_hint(fp32));
}

TEST(WiderOut, Fp8DecodeFp32OutOfA16BitPKernelFailsWithTheHint) {
  const fixtures::Fixture f =
      fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_fp8_decode.safetensors");
  const OpCase c = op_case_from_fixture(f);
  ASSERT_EQ(c.mla_fp8.q.dtype(), DType::BF16);
  // The FP8 cache dequantized to bf16 (fp32 scale, one rounding), then the same kernel.
  SparseMlaInputs in = reference::gather_sparse_mla_fp8(c.mla_fp8).inputs;
  in.kv = in.kv.to(DType::BF16);
  const SparseMlaForward wide = flashmla_style(in, DType::F32);
  CheckOptions opt;
  opt.check_determinism = false;
  CandidateBackend file(named(wide), "fp32 out", {});
  const OpReport by_file = forward_report(judge_fixture_ops(f, c, file, opt), Op::SparseMlaFp8Fwd);
  const OpReport by_backend = judge_outputs(Op::SparseMlaFp8Fwd, c, named(wide), opt, "fp32 out");
  for (const OpReport* r : {&by_file, &by_backend}) {
    EXPECT_EQ(r->verdict, Verdict::Fail) << format_op_report(*r);
    EXPECT_TRUE(has_hint(*r)) << format_op_report(*r);
  }
  SparseMlaForward rounded = wide;
  rounded.out = wide.out.to(DType::BF16);
  const OpReport ok = judge_outputs(Op::SparseMlaFp8Fwd, c, named(rounded), opt, "bf16 out");
  EXPECT_EQ(ok.verdict, Verdict::Pass) << format_op_report(ok);
  EXPECT_FALSE(has_hint(ok));
}

}  // namespace
}  // namespace dsa::oracle
