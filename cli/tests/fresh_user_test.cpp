// Faults a fresh user found in the reports and argument checks (issue 12 item 8; project rule
// "bad input gets a clear error naming the argument and the expected value"): --ops selects
// what is judged and the report names the op that failed; messages begin with what failed for
// the user, never an internal path. Label golden.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <fstream>
#include <sstream>

#include "audit_tasks.h"
#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/suite.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::lines_with;
using test::expect_cli;
using test::run_cli_capture;
using test::golden;
using test::read_text;
using test::mutant_plugin_named;


// A kernel whose forward is right and whose backward overwrites dkv: --ops sparse_mla_fwd
// judges the forward only (the forward properties' backward parts and the block properties
// do not run), so it passes; --ops sparse_mla_bwd judges the backward and fails under that op.
TEST(OpsSelection, ForwardOnlyJudgesTheForwardAndBackwardOnlyTheBackward) {
  const std::string plugin = mutant_plugin_named("smla_dkv_assigned_not_accumulated");
  ASSERT_FALSE(plugin.empty());
  Scratch dir("ops_selection");
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --ops sparse_mla_fwd --seed 5 --dump-dir " +
                                dir.file("d") + " --only smla.empty_rows,smla.extreme_rows_in_batch,"
                                "smla.topk_length_respected,smla.fp32_inputs",
                            &out),
            0);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_bwd"}).empty()) << "the backward was judged";
  EXPECT_EQ(lines_with(out, {"sparse_mla_fwd ", "property:smla.", " pass "}).size(), 4u);
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --ops sparse_mla_bwd --seed 5 --dump-dir " +
                                dir.file("d") + " --only smla.duplicates_accumulate_in_dkv",
                            &out),
            1);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "property:smla.duplicates_accumulate_in_dkv", " fail "}).size(), 1u);
}

// A fixture task under --ops never calls the backend for an op outside the selection (the
// backward of a fwd+bwd fixture under --ops sparse_mla_fwd), and reports only selected ops.
class CountingBackend : public oracle::Backend {
 public:
  std::string name() const override { return "counting"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd; }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    ++forward_calls;
    return reference_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    ++backward_calls;
    return reference_->sparse_mla_backward(in, dout);
  }
  int forward_calls = 0, backward_calls = 0;

 private:
  std::unique_ptr<oracle::Backend> reference_ = oracle::make_reference_backend();
};

TEST(OpsSelection, FixtureTasksCallOnlyTheSelectedOps) {
  Scratch dir("ops_fixture_calls");
  std::filesystem::copy_file(golden("smla_sink"), dir.file("smla_sink.safetensors"));
  const ReproCommands repro{"dsa-verify audit", [](const std::string& f) { return "dsa-verify replay " + f; }};
  for (const char* selected : {"sparse_mla_fwd", "sparse_mla_bwd"}) {
    AuditOptions o;
    o.ops = {selected};
    CountingBackend b;
    std::vector<AuditTask> tasks;
    add_fixture_tasks(tasks, dir.file(""), "golden", b, o, repro);
    ASSERT_EQ(tasks.size(), 1u);
    const std::vector<CaseResult> cases = tasks[0].run();
    ASSERT_EQ(cases.size(), 1u) << selected;
    EXPECT_EQ(cases[0].op, selected);
    EXPECT_EQ(cases[0].status, "pass") << cases[0].message;
    const bool fwd = std::string(selected) == "sparse_mla_fwd";
    EXPECT_GT(b.forward_calls, 0) << selected;  // the backward's baseline learns its out dtype
    EXPECT_EQ(b.backward_calls > 0, !fwd) << selected;
  }
}

// Without --ops a forward property also judges the backward (when the kernel has one); a
// backward failure is filed under sparse_mla_bwd in the table, the progress line and JUnit,
// and the message begins with the oracle's line (op, output, err > bound), not with RapidCheck's
// source location and macro ("../../property_tests/...: RC_FAIL(::dsa::oracle::...)").
TEST(OpsSelection, ABackwardFailureInAForwardPropertyIsNamedByItsOp) {
  const std::string plugin = mutant_plugin_named("smla_dkv_assigned_not_accumulated");
  ASSERT_FALSE(plugin.empty());
  Scratch dir("ops_naming");
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --only smla.empty_rows --seed 5 --junit " +
                                dir.file("r.xml") + " --dump-dir " + dir.file("d"),
                            &out),
            1);
  EXPECT_EQ(lines_with(out, {"[1/1] fail sparse_mla_bwd smla.empty_rows"}).size(), 1u);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "property:smla.empty_rows", " fail "}).size(), 1u);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_fwd ", "property:smla.empty_rows"}).empty());
  const std::string xml = read_text(dir.file("r.xml"));
  const std::string attr = "<failure message=\"";
  const size_t at = xml.find(attr);
  ASSERT_NE(at, std::string::npos) << xml;
  const std::string message = xml.substr(at + attr.size(), 200);
  EXPECT_EQ(message.rfind("[FAIL] plugin:", 0), 0u) << message;
  EXPECT_NE(message.find("sparse_mla_bwd: dkv: "), std::string::npos) << message;
  EXPECT_NE(message.find("&gt; bound"), std::string::npos) << message;
  for (const char* internal : {"dsa::", "RC_FAIL", ".cpp:", "../"})
    EXPECT_EQ(message.find(internal), std::string::npos) << internal << " in " << message;
}

// A backend that throws inside a property (a plugin returning an error status): the message
// begins with the exception's text, not RapidCheck's "Exception thrown with message:".
TEST(OpsSelection, AnExceptionInAPropertyBeginsWithItsText) {
  const std::string plugin = mutant_plugin_named("smla_sink_dropped");
  ASSERT_FALSE(plugin.empty());
  Scratch dir("ops_exception");
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --plugin " + plugin + " --only smla.empty_rows --seed 3 "
                            "--junit " + dir.file("r.xml") + " --dump-dir " + dir.file("d"),
                            &out),
            1);
  const std::string xml = read_text(dir.file("r.xml"));
  const std::string attr = "<failure message=\"";
  const size_t at = xml.find(attr);
  ASSERT_NE(at, std::string::npos) << xml;
  const std::string message = xml.substr(at + attr.size(), 200);
  EXPECT_EQ(message.find("Exception thrown"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("exception: plugin ", 0), 0u) << message;  // its dsink is missing
  EXPECT_NE(message.find("sparse_mla_bwd"), std::string::npos) << message;
  // ... filed under the op that threw (the forward property's backward call)
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "property:smla.empty_rows", " fail "}).size(), 1u);
}

// --only naming a property of an op --ops does not select: a usage error (exit 2) naming both
// names, the op missing and the properties --ops leaves, not "ran no case".
TEST(AuditRanNothing, OnlyAndOpsClashIsNamed) {
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --backend reference --ops topk --only topk.contract_exact,smla.forward_ratio", &out), 2);
  EXPECT_EQ(lines_with(out, {"arguments '--only' and '--ops' clash", "\"smla.forward_ratio\", a property of sparse_mla_fwd",
                             "--ops topk does not select sparse_mla_fwd", "--only takes one of: topk.contract_exact",
                             "or add sparse_mla_fwd to --ops"})
                .size(),
            1u);
  EXPECT_TRUE(lines_with(out, {"ran no case"}).empty());
  // A block property needs all four ops of the block.
  EXPECT_EQ(run_cli_capture("audit --backend reference --ops topk --only block.gradients_equal_across_policies", &out), 2);
  EXPECT_EQ(lines_with(out, {"clash", "does not select indexer_scores,sparse_mla_fwd,sparse_mla_bwd"}).size(), 1u);
}

// A top-k kernel that claims determinism and swaps two ids of row 1 on every other call.
class AlternatingTopk : public oracle::Backend {
 public:
  std::string name() const override { return "alternating-topk"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override {
    Tensor ids = reference_->select_topk(scores, k, policy, windows);
    if (++calls_ % 2 == 0) {
      const double first = ids.get(k), second = ids.get(k + 1);
      ids.set(k, second);
      ids.set(k + 1, first);
    }
    return ids;
  }

 private:
  std::unique_ptr<oracle::Backend> reference_ = oracle::make_reference_backend();
  int calls_ = 0;
};

// The determinism check says which rows and ids differed between the two runs (the one
// judgement every route calls; the Python route printed no reason).
TEST(DeterminismReport, NamesTheRowsAndIdsThatDiffered) {
  const fixtures::Fixture f = fixtures::load_fixture(golden("topk_plateau_small_sorted"));
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  ASSERT_GE(c.k, 2);
  AlternatingTopk b;
  const oracle::OpReport r = oracle::check_op(b, oracle::Op::Topk, c);
  EXPECT_EQ(r.verdict, oracle::Verdict::Fail);
  EXPECT_FALSE(r.determinism_ok);
  const Tensor ids = oracle::make_reference_backend()->select_topk(c.scores, c.k, c.policy, c.topk_windows);
  const std::string want = "deterministic backend returned different bytes on a second run: indices: row 1 of " +
                           std::to_string(c.scores.size(0)) + " differs; row 1 slot 0: id " +
                           std::to_string(static_cast<int64_t>(ids.get(c.k))) + " then " +
                           std::to_string(static_cast<int64_t>(ids.get(c.k + 1))) + ", slot 1: id " +
                           std::to_string(static_cast<int64_t>(ids.get(c.k + 1))) + " then " +
                           std::to_string(static_cast<int64_t>(ids.get(c.k)));
  EXPECT_EQ(r.reason, want);
}

// A top-k file of [s_q, min(k, s_kv)] ids (s_kv < k) that does not declare the narrowed-width
// convention still fails on every route, and the failure says how to declare it there:
// fixtures check names the conventions metadata, compare --narrowed-topk-width, replay
// --convention topk_width_min_k_s_kv. Declared, it agrees.
TEST(CompareHints, NarrowedTopkWidthSuggestsItsDeclaration) {
  Scratch dir("narrowed");
  fixtures::Fixture f = fixtures::load_fixture(std::string(DSA_PEER_FIXTURE_DIR) + "/topk_short_rows.safetensors");
  ASSERT_LT(f.inputs.at("scores").size(1), f.params.at("k").get<int64_t>());
  ASSERT_EQ(f.expected.at("indices").size(1), f.inputs.at("scores").size(1));
  f.conventions.clear();  // undeclared
  const std::string path = dir.file("short_rows_undeclared.safetensors");
  fixtures::save_fixture(path, f);
  std::string out;
  expect_cli("fixtures check " + path + " --backend reference", 1,
             {"[FAIL] producer topk:", "hint: the candidate's ids are [s_q, 24] = [s_q, min(k, s_kv)]",
              "add \"topk_width_min_k_s_kv\" to the fixture's conventions metadata"});
  expect_cli("compare --golden " + path + " --candidate " + path, 1,
             {"[FAIL] candidate-file topk:", "hint:", "pass --narrowed-topk-width"});
  expect_cli("replay " + path + " --candidate " + path, 1, {"hint:", "pass --convention topk_width_min_k_s_kv"});
  EXPECT_EQ(run_cli_capture("compare --golden " + path + " --candidate " + path + " --narrowed-topk-width", &out), 0);
  EXPECT_TRUE(lines_with(out, {"hint:"}).empty());
}

// The audit's fixture task (CLI and Python route) gives the same hint for such a producer.
TEST(CompareHints, AuditFixtureTaskSuggestsTheNarrowedWidthDeclaration) {
  Scratch dir("narrowed_audit");
  fixtures::Fixture f = fixtures::load_fixture(std::string(DSA_PEER_FIXTURE_DIR) + "/topk_short_rows.safetensors");
  f.conventions.clear();
  fixtures::save_fixture(dir.file("short_rows_undeclared.safetensors"), f);
  AuditOptions o;
  o.ops = {"topk"};
  const ReproCommands repro{"dsa-verify audit", [](const std::string& x) { return "dsa-verify replay " + x; }};
  std::unique_ptr<oracle::Backend> reference = oracle::make_reference_backend();
  std::vector<AuditTask> tasks;
  add_fixture_tasks(tasks, dir.file(""), "peer", *reference, o, repro);
  ASSERT_EQ(tasks.size(), 1u);
  bool hinted = false;
  for (const CaseResult& c : tasks[0].run())
    if (c.property.find("(producer topk)") != std::string::npos)
      hinted = c.status == "fail" && c.message.find("hint: the candidate's ids are [s_q, 24]") != std::string::npos &&
               c.message.find("topk_width_min_k_s_kv") != std::string::npos;
  EXPECT_TRUE(hinted);
}

// `fixtures check DIR` with a corrupt file beside good ones: the corrupt file is a row of the
// table named by its path and counted as unreadable in the summary; exit 2 (input error) even
// though every other row agrees; the JSON lists it with its error.
TEST(FixturesCheckErrors, ACorruptFileIsCountedAndNamed) {
  Scratch dir("corrupt");
  std::filesystem::copy_file(golden("topk_mtp"), dir.file("topk_mtp.safetensors"));
  const std::string corrupt = dir.file("corrupt.safetensors");
  {
    const std::string bytes = read_text(golden("idx_causal"));
    std::ofstream(corrupt, std::ios::binary) << bytes.substr(0, 300);  // truncated
  }
  std::string out = expect_cli("fixtures check " + dir.file("") + " --backend reference --json " + dir.file("r.json"),
                               2, {"error: " + corrupt + ": "});
  // the row names the file relative to the checked directory (two files may share a case name)
  EXPECT_EQ(lines_with(out, {"corrupt.safetensors ", "ERROR: unreadable input"}).size(), 1u) << out;
  EXPECT_EQ(lines_with(out, {"fixtures: 2 agree, 0 partial, 0 disagree, 0 WEAK, 0 INCOMPLETE, 0 skipped, 1 unreadable"}).size(), 1u) << out;
  const auto j = test::read_json(dir.file("r.json"));
  bool listed = false;
  for (const auto& f : j.at("files")) listed |= f.value("path", "") == corrupt && f.contains("error");
  EXPECT_TRUE(listed) << j.dump();
  // The corrupt file alone: still a row and exit 2, never "judged nothing" or a pass.
  EXPECT_EQ(run_cli_capture("fixtures check " + corrupt + " --backend reference", &out), 2);
  EXPECT_EQ(lines_with(out, {"fixtures: 0 agree", "1 unreadable"}).size(), 1u) << out;
  EXPECT_TRUE(lines_with(out, {"judged nothing"}).empty()) << out;
}

// A fixture whose size params contradict its tensors (params.s_q = 4 with a q of 8 rows) is
// the file's error on load, on every route (exit 2), naming the file, the param, its value and
// the tensor's shape; params that agree load as before.
TEST(InputErrors, SizeParamsContradictingTheShapesAreNamed) {
  Scratch dir("size_params");
  struct Case {
    const char* fixture;
    const char* key;
    const char* tensor;
    int64_t dim;
  };
  for (const Case& c : {Case{"smla_basic", "s_q", "q", 0}, Case{"smla_basic", "h_q", "q", 1},
                        Case{"smla_basic", "d_qk", "q", 2}, Case{"smla_basic", "s_kv", "kv", 0},
                        Case{"smla_basic", "topk", "indices", -1},
                        Case{"topk_distinct_causal", "s_kv", "scores", 1},
                        Case{"idx_causal", "H_I", "q_idx", 1}}) {
    fixtures::Fixture f = fixtures::load_fixture(golden(c.fixture));
    const Tensor& t = f.inputs.at(c.tensor);
    const int64_t size = t.size(c.dim < 0 ? t.dim() + c.dim : c.dim);
    const std::string path = dir.file(std::string(c.key) + ".safetensors");
    f.params[c.key] = size;  // agreeing: loads
    fixtures::save_fixture(path, f);
    EXPECT_NO_THROW(fixtures::load_fixture(path)) << c.key;
    f.params[c.key] = size + 3;
    fixtures::save_fixture(path, f);
    std::string what;
    try {
      fixtures::load_fixture(path);
    } catch (const fixtures::FileError& e) {
      what = e.what();
    }
    const std::string want = path + ": params." + c.key + " = " + std::to_string(size + 3) +
                             " contradicts tensor '" + c.tensor + "' of shape " + shape_str(t.shape());
    EXPECT_EQ(what.rfind(want, 0), 0u) << what;
    EXPECT_NE(what.find("is " + std::to_string(size) + ")"), std::string::npos) << what;
    EXPECT_THROW(fixtures::validate_fixture(f, "in memory"), fixtures::FileError) << c.key;
    // Every route loads through load_fixture: two of the params through the program (CI time).
    if (std::string(c.key) != "s_q" && std::string(c.fixture) != "topk_distinct_causal") continue;
    expect_cli("fixtures check " + path + " --backend reference", 2, {want});
    expect_cli("compare --golden " + path + " --candidate " + golden(c.fixture), 2,
               {"params." + std::string(c.key) + " = ", "contradicts tensor"});
  }
}

}  // namespace
}  // namespace dsa::cli
