// Outputs whose dtype the SPEC fixes (§2/§10 scores fp32, §4 lse and max_logits fp32, out in
// q's dtype) are a contract check in the one judgement: a narrower output would otherwise be
// judged at its own, looser precision class (bf16 θ 1e-2 instead of 1e-4) and AGREE although
// it is wrong by up to that class's bound (found by a fresh-user run, 2026-11-30). Each test
// also shows the same values in the contract dtype pass, so the failure is the dtype's.
// Also: provided outputs (--outputs) that name none of an op's outputs skip that op instead of
// letting it pass with nothing judged.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"

namespace dsa::oracle {
namespace {

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

TEST(OutputDtype, Bf16LseOrMaxLogitsFails) {
  const OpCase c = op_case_from_fixture(golden("smla_basic"));
  const SparseMlaForward f = make_reference_backend()->sparse_mla_forward(c.mla);
  const Tensor out = f.out.to(c.mla.q.dtype());
  const NamedOutputs ok = {{"out", out}, {"lse", f.lse.to(DType::F32)}, {"max_logits", f.max_logits.to(DType::F32)}};
  EXPECT_TRUE(judge_outputs(Op::SparseMlaFwd, c, ok, {}, "f32").passed());
  for (const char* narrow : {"lse", "max_logits"}) {
    NamedOutputs bad = ok;
    bad[narrow] = bad.at(narrow).to(DType::BF16);
    const OpReport r = judge_outputs(Op::SparseMlaFwd, c, bad, {}, "bf16");
    EXPECT_EQ(r.verdict, Verdict::Fail) << narrow;
    EXPECT_NE(r.reason.find(std::string(narrow) + ": dtype BF16, expected F32"), std::string::npos) << r.reason;
  }
}

TEST(OutputDtype, Bf16IndexerScoresFail) {
  const OpCase c = op_case_from_fixture(golden("idx_causal"));
  const Tensor s = make_reference_backend()->indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
  EXPECT_TRUE(judge_outputs(Op::IndexerScores, c, {{"scores", s.to(DType::F32)}}, {}, "f32").passed());
  const OpReport r = judge_outputs(Op::IndexerScores, c, {{"scores", s.to(DType::BF16)}}, {}, "bf16");
  EXPECT_EQ(r.verdict, Verdict::Fail);
  EXPECT_NE(r.reason.find("scores: dtype BF16, expected F32"), std::string::npos) << r.reason;
}

TEST(OutputDtype, OutNarrowerThanQFails) {
  OpCase c = op_case_from_fixture(golden("smla_basic"));
  c.mla.q = c.mla.q.to(DType::F32);  // fp32 q: out must be fp32 (or wider)
  c.mla.kv = c.mla.kv.to(DType::F32);
  c.memo.reset();
  const SparseMlaForward f = make_reference_backend()->sparse_mla_forward(c.mla);
  CheckOptions only_out;
  only_out.provided_outputs = std::set<std::string>{"out"};
  EXPECT_TRUE(judge_outputs(Op::SparseMlaFwd, c, {{"out", f.out.to(DType::F32)}}, only_out, "f32").passed());
  const OpReport r = judge_outputs(Op::SparseMlaFwd, c, {{"out", f.out.to(DType::BF16)}}, only_out, "bf16");
  EXPECT_EQ(r.verdict, Verdict::Fail);
  EXPECT_NE(r.reason.find("out: dtype BF16, expected F32"), std::string::npos) << r.reason;
}

// SPEC §4: out is in q's dtype. For a bf16 q an F16 out is neither q's dtype nor wider (a
// fresh-user run: it AGREED, judged at F16's class); it fails naming out, F16 and the dtypes
// expected, while bf16 and the wider F32/F64 outs of the same values pass. The backward's
// baseline does not take Δ at F16 either.
TEST(OutputDtype, OutInAnother16BitFormatThanQFails) {
  const OpCase c = op_case_from_fixture(golden("smla_basic"));
  ASSERT_EQ(c.mla.q.dtype(), DType::BF16);
  const SparseMlaForward f = make_reference_backend()->sparse_mla_forward(c.mla);
  CheckOptions only_out;
  only_out.provided_outputs = std::set<std::string>{"out"};
  for (DType ok : {DType::BF16, DType::F32, DType::F64})
    EXPECT_TRUE(judge_outputs(Op::SparseMlaFwd, c, {{"out", f.out.to(ok)}}, only_out, "ok").passed())
        << dtype_name(ok);
  const OpReport r = judge_outputs(Op::SparseMlaFwd, c, {{"out", f.out.to(DType::F16)}}, only_out, "f16");
  EXPECT_EQ(r.verdict, Verdict::Fail);
  EXPECT_NE(r.reason.find("out: dtype F16, expected BF16 or wider (F32, F64)"), std::string::npos) << r.reason;
  // The backward handed an F16 out: its baseline stays at q's dtype, and says so.
  const SparseMlaGrads g = make_reference_backend()->sparse_mla_backward(c.mla, c.dout);
  NamedOutputs grads = {{"dq", g.dq}, {"dkv", g.dkv}, {"out", f.out.to(DType::F16)}};
  const OpReport b = judge_outputs(Op::SparseMlaBwd, c, grads, {}, "f16 out");
  bool noted = false;
  for (const auto& n : b.notes) noted |= n.find("(F16) is not q's dtype nor wider") != std::string::npos;
  EXPECT_TRUE(noted);
}

// Every output whose dtype the SPEC fixes (check_start.h contract_dtype: §2/§10 scores fp32,
// §3 indices int32, §4/§10 out in q's dtype, lse and max_logits fp32), on every op that has
// one, through both routes: the file route (a candidate file's outputs, CandidateBackend and
// judge_fixture_ops, what `compare` runs) and the backend route (judge_outputs: a Backend
// through check_op, as a plugin or a Python backend). Each golden's expected outputs AGREE as
// stored; with the one output in a narrower dtype or another 16-bit format the op fails on
// both routes with one message naming the output, its dtype, the dtypes expected and the
// contract. A fresh-user run (fresh10 F3) found sparse_mla_fp8_fwd AGREEING with an F16 out
// for a bf16 q: its check never applied the rule to out.
TEST(OutputDtype, EveryContractDtypeFailsAlikeOnFileAndBackendRoutes) {
  struct Row {
    const char* golden;
    Op op;
    const char* name;
    DType bad;
    const char* expected;  // the dtypes accepted, as the message says them
  };
  const Row rows[] = {
      {"idx_causal", Op::IndexerScores, "scores", DType::BF16, "F32 or wider (F64)"},
      {"fp8_idx_prefix_pow2", Op::Fp8IndexerScores, "scores", DType::F16, "F32 or wider (F64)"},
      {"paged_idx_mtp2", Op::PagedIndexerScores, "scores", DType::BF16, "F32 or wider (F64)"},
      {"topk_distinct_causal", Op::Topk, "indices", DType::I64, "I32"},
      {"topk_distinct_causal", Op::Topk, "indices", DType::F32, "I32"},
      {"smla_basic", Op::SparseMlaFwd, "out", DType::F16, "BF16 or wider (F32, F64)"},
      {"smla_basic", Op::SparseMlaFwd, "lse", DType::BF16, "F32 or wider (F64)"},
      {"smla_basic", Op::SparseMlaFwd, "max_logits", DType::F16, "F32 or wider (F64)"},
      {"smla_fp32", Op::SparseMlaFwd, "out", DType::BF16, "F32 or wider (F64)"},
      {"smla_fp8_decode", Op::SparseMlaFp8Fwd, "out", DType::F16, "BF16 or wider (F32, F64)"},
      {"smla_fp8_decode", Op::SparseMlaFp8Fwd, "lse", DType::BF16, "F32 or wider (F64)"},
      {"smla_fp8_decode", Op::SparseMlaFp8Fwd, "max_logits", DType::F16, "F32 or wider (F64)"},
  };
  auto report_of = [](const std::vector<OpReport>& all, Op op) {
    for (const auto& r : all)
      if (r.op == to_string(op)) return r;
    ADD_FAILURE() << "no report of " << to_string(op);
    return OpReport{};
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(std::string(row.golden) + " " + row.name + " " + dtype_name(row.bad));
    const fixtures::Fixture f = golden(row.golden);
    const OpCase c = op_case_from_fixture(f);
    std::map<std::string, Tensor> outputs;
    for (const auto& n : op_output_names(row.op))
      if (f.expected.count(n)) outputs[n] = f.expected.at(n);
    ASSERT_TRUE(outputs.count(row.name));
    CheckOptions opt;
    opt.check_determinism = false;
    {  // the stored outputs, in their contract dtypes, agree on both routes
      CandidateBackend file(outputs, "as stored", {});
      EXPECT_EQ(report_of(judge_fixture_ops(f, c, file, opt), row.op).verdict, Verdict::Pass);
      EXPECT_EQ(judge_outputs(row.op, c, outputs, opt, "as stored").verdict, Verdict::Pass);
    }
    outputs[row.name] = outputs.at(row.name).to(row.bad);
    CandidateBackend file(outputs, "bad dtype", {});
    const OpReport by_file = report_of(judge_fixture_ops(f, c, file, opt), row.op);
    const OpReport by_backend = judge_outputs(row.op, c, outputs, opt, "bad dtype");
    const std::string says = std::string(row.name) + ": dtype " + dtype_name(row.bad) + ", expected " +
                             row.expected + " (contract: the SPEC fixes this output's dtype";
    EXPECT_EQ(by_file.verdict, Verdict::Fail);
    EXPECT_EQ(by_backend.verdict, Verdict::Fail);
    EXPECT_EQ(by_file.reason.rfind(says, 0), 0u) << by_file.reason;
    EXPECT_EQ(by_file.reason, by_backend.reason);
  }
}

// An op none of whose outputs the provided outputs name is judged in full (provided_outputs_for),
// with a note, never a pass with every output "not judged" nor a skip: a wrong out fails.
TEST(ProvidedOutputs, NoneOfTheOpsOutputsJudgesInFull) {
  const OpCase c = op_case_from_fixture(golden("smla_basic"));
  const SparseMlaForward f = make_reference_backend()->sparse_mla_forward(c.mla);
  Tensor out = f.out.to(c.mla.q.dtype());
  out.set(0, out.get(0) * 1.25 + 0.25);  // a clearly wrong out element
  const NamedOutputs wrong = {{"out", out}, {"lse", f.lse.to(DType::F32)}, {"max_logits", f.max_logits.to(DType::F32)}};
  CheckOptions none, only_out;
  none.provided_outputs = std::set<std::string>{"indices"};
  only_out.provided_outputs = std::set<std::string>{"out"};
  const OpReport r = judge_outputs(Op::SparseMlaFwd, c, wrong, none, "indices");
  EXPECT_EQ(r.verdict, Verdict::Fail) << r.reason;
  EXPECT_TRUE(r.not_judged.empty());
  bool noted = false;
  for (const auto& n : r.notes)
    noted |= n == "judged in full: the provided outputs (indices) name none of sparse_mla_fwd's outputs "
                  "(out, lse, max_logits)";
  EXPECT_TRUE(noted);
  EXPECT_EQ(judge_outputs(Op::SparseMlaFwd, c, wrong, only_out, "out").verdict, Verdict::Fail);
  // the right outputs pass in full under the same options: the note is no partial label
  const NamedOutputs right = {{"out", f.out.to(c.mla.q.dtype())}, {"lse", f.lse.to(DType::F32)},
                              {"max_logits", f.max_logits.to(DType::F32)}};
  const OpReport ok = judge_outputs(Op::SparseMlaFwd, c, right, none, "indices");
  EXPECT_EQ(ok.verdict, Verdict::Pass) << ok.reason;
  EXPECT_EQ(verdict_line({ok}), "AGREES");
  EXPECT_TRUE(not_judged_outputs(Op::SparseMlaFwd, none.provided_outputs).empty());
  EXPECT_EQ(not_judged_outputs(Op::SparseMlaFwd, only_out.provided_outputs),
            (std::vector<std::string>{"lse", "max_logits"}));
  // a name that is no output of the selected ops is a usage error naming each op's outputs
  EXPECT_THROW(check_provided_outputs({"out"}, {Op::Topk}, "--outputs"), std::invalid_argument);
  EXPECT_NO_THROW(check_provided_outputs({"out", "indices"}, {Op::Topk, Op::SparseMlaFwd}, "--outputs"));
}

}  // namespace
}  // namespace dsa::oracle
