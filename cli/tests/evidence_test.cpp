// What a verdict rests on (issue 12, SPEC §9), on every route: a param that changes the
// judgement is never defaulted (a golden without it is an input error); a check that judged no
// element is a skip, never a pass (provided outputs the case does not define, an empty case);
// INCOMPLETE names every output missing; `fixtures check` names each row's file. The inputs are
// built here from the shipped goldens. Label golden.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/reference/topk.h"
#include "judge.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::expect_cli;
using test::golden;
using test::lines_with;
using test::run_cli_capture;
using test::Scratch;

// A golden without one of the params that change the judgement, and the values it allows.
struct MissingParam {
  std::string golden, param, allowed;
};

// Each such param is required: without it the file is an input error (exit 2) naming the param
// and its allowed values, in process, in compare and replay, and as a row of fixtures check
// (with its JSON entry). The intact golden with the same candidate agrees (the control).
TEST(FixtureParams, AMissingParamThatChangesTheJudgementIsAnInputErrorOnEveryRoute) {
  const std::vector<MissingParam> cases = {
      {"topk_plateau_small_sorted", "tie_break", "\"any\", \"small\" or \"large\""},
      {"topk_plateau_small_sorted", "sorted", "true or false"},
      {"kl_sparse_causal", "mode", "\"dense\" or \"sparse\""},
      {"kl_dense_causal", "coeff", "a finite number"},
  };
  for (const auto& m : cases) {
    SCOPED_TRACE(m.golden + " without " + m.param);
    Scratch dir("missing_param_" + m.param);
    const fixtures::Fixture intact = fixtures::load_fixture(golden(m.golden));
    ASSERT_TRUE(intact.params.contains(m.param));
    fixtures::Fixture f = intact;
    f.params.erase(m.param);
    std::filesystem::create_directories(dir.file("goldens"));  // the candidate stays outside
    const std::string bad = dir.file("goldens/" + m.golden + ".safetensors");
    fixtures::save_fixture(bad, f);
    const std::string cand = dir.file("candidate.safetensors");
    test::write_outputs(cand, intact.expected);
    const std::string words = "missing param '" + m.param + "' of op " + intact.op + ", expected " + m.allowed;

    try {
      oracle::op_case_from_fixture(fixtures::load_fixture(bad));
      ADD_FAILURE() << "no error without " << m.param;
    } catch (const fixtures::FileError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    std::string out;
    EXPECT_EQ(run_cli_capture("compare --golden " + golden(m.golden) + " --candidate " + cand, &out), 0) << out;
    expect_cli("compare --golden " + bad + " --candidate " + cand, 2, {bad, words});
    expect_cli("replay " + bad + " --candidate " + cand, 2, {bad, words});
    EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("goldens") + " --backend reference --json " + dir.file("r.json"),
                              &out),
              2)
        << out;
    EXPECT_EQ(lines_with(out, {m.golden + ".safetensors ", "ERROR: unreadable input"}).size(), 1u) << out;
    bool listed = false;
    const nlohmann::json report = test::read_json(dir.file("r.json"));
    for (const auto& j : report.at("files"))
      listed |= j.value("file", "") == m.golden + ".safetensors" && j.value("error", "").find(words) != std::string::npos;
    EXPECT_TRUE(listed);
  }
}

// The fault a default hid: ids of a `large` tie-break on a `small` golden DISAGREE; without its
// tie_break the golden was read as `any` and they agreed. Now that golden is an input error.
TEST(FixtureParams, AMissingTieBreakIsNotReadAsAny) {
  Scratch dir("missing_tie_break");
  const fixtures::Fixture intact = fixtures::load_fixture(golden("topk_plateau_small_sorted"));
  ASSERT_EQ(intact.params.at("tie_break"), "small");
  const oracle::OpCase c = oracle::op_case_from_fixture(intact);
  TopkPolicy large = c.policy;
  large.tie_break = TieBreak::Large;
  const Tensor ids = reference::select_topk(c.scores, c.k, large, c.topk_windows);
  ASSERT_FALSE(oracle::bitwise_equal(ids, intact.expected.at("indices"))) << "no tie at the k-th value";
  const std::string cand = dir.file("large.safetensors");
  test::write_outputs(cand, {{"indices", ids}});
  fixtures::Fixture f = intact;
  f.params.erase("tie_break");
  const std::string bad = dir.file("no_tie_break.safetensors");
  fixtures::save_fixture(bad, f);
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + golden("topk_plateau_small_sorted") + " --candidate " + cand, &out), 1)
      << out;
  EXPECT_EQ(run_cli_capture("compare --golden " + bad + " --candidate " + cand, &out), 2) << out;
  EXPECT_TRUE(lines_with(out, {"AGREES"}).empty()) << out;
}

// The verdict, reason of each op and exit code of `compare` and `replay --candidate` (JSON).
struct FileVerdict {
  int rc = -1;
  nlohmann::json json;
};
FileVerdict run_file_route(const std::string& route, const std::string& golden_path, const std::string& cand,
                           const std::string& extra, const Scratch& dir, std::string* out) {
  FileVerdict v;
  const std::string json = dir.file(route + ".json");
  const std::string args = route == "compare" ? "compare --golden " + golden_path + " --candidate " + cand
                                              : "replay " + golden_path + " --candidate " + cand;
  v.rc = run_cli_capture(args + extra + " --json " + json, out);
  v.json = test::read_json(json);
  return v;
}

// Provided outputs that the case does not define (dsink on a case without attn_sink) judge
// nothing: the backward is a skip saying so, never "AGREES (partial ...)". compare and replay
// exit 2 as for any comparison that judged nothing, whatever else the file holds (a zero dkv
// not named by --outputs); in process and through a plugin the op is a skip with the same
// reason; the audit lists those fixtures as skip and the sink golden as partial.
TEST(JudgedNothing, ProvidedOutputsTheCaseDoesNotDefineAreASkipOnEveryRoute) {
  Scratch dir("judged_nothing_dsink");
  const fixtures::Fixture f = fixtures::load_fixture(golden("smla_basic"));
  ASSERT_EQ(f.inputs.count("attn_sink"), 0u);
  const int64_t h_q = f.inputs.at("q").size(1);
  const Tensor zeros(DType::F32, {h_q});
  const std::string want =
      "judged nothing: sparse_mla_bwd: the provided outputs (dsink) are not defined for this case "
      "(not provided: dq, dkv)";
  for (const bool with_dkv : {false, true}) {
    std::map<std::string, Tensor> outputs = {{"dsink", zeros}};
    if (with_dkv) outputs["dkv"] = Tensor(DType::F32, f.expected.at("dkv").shape());  // all wrong
    const std::string cand = dir.file(with_dkv ? "dsink_dkv.safetensors" : "dsink.safetensors");
    test::write_outputs(cand, outputs);
    for (const std::string route : {"compare", "replay"}) {
      std::string out;
      const FileVerdict v = run_file_route(route, golden("smla_basic"), cand, " --outputs dsink", dir, &out);
      EXPECT_EQ(v.rc, 2) << out;
      EXPECT_FALSE(lines_with(out, {route + ": judged nothing"}).empty()) << out;
      EXPECT_TRUE(lines_with(out, {"AGREES"}).empty()) << out;
      if (route == "compare") {  // the stored dsink is named as not judged
        EXPECT_EQ(lines_with(out, {"note:", "tensor 'dsink'", "has no attn_sink", "not judged"}).size(), 1u) << out;
      }
      EXPECT_EQ(v.json.value("verdict", ""), "SKIPPED") << v.json.dump(1);
      ASSERT_EQ(v.json.at("ops").size(), 2u);
      EXPECT_EQ(v.json.at("ops").at(1).at("verdict"), "skip");
      EXPECT_EQ(v.json.at("ops").at(1).at("reason"), want);
    }
  }
  oracle::CheckOptions opt;
  opt.provided_outputs = std::set<std::string>{"dsink"};
  auto reference = oracle::make_reference_backend();
  auto plugin = plugin::load_plugin(DSA_REFERENCE_PLUGIN);
  for (oracle::Backend* b : {reference.get(), static_cast<oracle::Backend*>(plugin.get())}) {
    const auto reports = oracle::judge_fixture_ops(f, *b, opt);
    ASSERT_EQ(reports.size(), 2u);
    // the forward is judged in full (--outputs names none of its outputs), the backward nothing
    EXPECT_EQ(reports[0].verdict, oracle::Verdict::Pass) << b->name();
    EXPECT_EQ(reports[1].verdict, oracle::Verdict::Skip) << b->name();
    EXPECT_EQ(reports[1].reason, want) << b->name();
  }
  // The same judge on a case with a sink judges dsink: a wrong one fails (the rule can fail).
  const fixtures::Fixture s = fixtures::load_fixture(golden("smla_sink"));
  const oracle::OpCase sc = oracle::op_case_from_fixture(s);
  const oracle::OpReport wrong = oracle::judge_outputs(
      oracle::Op::SparseMlaBwd, sc, {{"dsink", Tensor(DType::F32, s.expected.at("dsink").shape())}}, opt);
  EXPECT_EQ(wrong.verdict, oracle::Verdict::Fail) << oracle::format_op_report(wrong);

  // The audit: a sinkless golden's backward is a skip (0 cases), the sink golden a partial pass.
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --backend reference --ops sparse_mla_bwd --outputs dsink --json " + dir.file("a.json"),
                            &out),
            0)
      << out;
  bool basic = false, sink = false;
  const nlohmann::json audit = test::read_json(dir.file("a.json"));
  for (const auto& c : audit.at("cases")) {
    if (c.value("property", "") == "golden:smla_basic") {
      basic = true;
      EXPECT_EQ(c.value("status", ""), "skip") << c.dump();
      EXPECT_EQ(c.value("message", ""), want) << c.dump();
    }
    if (c.value("property", "") == "golden:smla_sink") {
      sink = true;
      EXPECT_EQ(c.value("status", ""), "pass") << c.dump();
    }
  }
  EXPECT_TRUE(basic && sink) << out;
}

// An empty case (s_q = 0) holds no evidence: a top-k golden with no query rows judges nothing
// on every route (compare, replay: exit 2; fixtures check: skip rows, exit 2; in process: a
// skip with the reason), never AGREES with no output judged.
TEST(JudgedNothing, AnEmptyCaseIsASkipOnEveryRoute) {
  Scratch dir("judged_nothing_empty");
  fixtures::Fixture g;
  g.case_name = "topk_no_rows";
  g.op = "topk";
  g.producer = "dsa-verify reference";
  g.params = {{"k", 4}, {"tie_break", "small"}, {"sorted", true}};
  g.inputs["scores"] = Tensor(DType::F32, {0, 8});
  g.expected["indices"] = Tensor(DType::I32, {0, 4});
  const std::string path = dir.file("topk_no_rows.safetensors");
  fixtures::save_fixture(path, g);
  const std::string cand = dir.file("candidate.safetensors");
  test::write_outputs(cand, {{"indices", Tensor(DType::I32, {0, 4})}});
  const std::string want = "judged nothing: topk: every output judged has 0 elements";
  for (const std::string route : {"compare", "replay"}) {
    std::string out;
    const FileVerdict v = run_file_route(route, path, cand, "", dir, &out);
    EXPECT_EQ(v.rc, 2) << out;
    EXPECT_FALSE(lines_with(out, {route + ": judged nothing"}).empty()) << out;
    EXPECT_EQ(v.json.value("verdict", ""), "SKIPPED") << v.json.dump(1);
    EXPECT_EQ(v.json.at("ops").at(0).at("reason").get<std::string>().rfind(want, 0), 0u) << v.json.dump(1);
  }
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + path + " --backend reference", &out), 2) << out;
  EXPECT_EQ(lines_with(out, {"topk_no_rows.safetensors ", "skip: " + want}).size(), 2u) << out;  // producer, reference
  EXPECT_FALSE(lines_with(out, {"judged nothing: every row was skipped"}).empty()) << out;
  const oracle::OpReport r =
      oracle::judge_outputs(oracle::Op::Topk, oracle::op_case_from_fixture(g), {{"indices", Tensor(DType::I32, {0, 4})}});
  EXPECT_EQ(r.verdict, oracle::Verdict::Skip);
  EXPECT_EQ(r.reason.rfind(want, 0), 0u) << r.reason;
  // Wrong ids of an empty case still fail: a skip only where nothing could be judged.
  const oracle::OpReport bad =
      oracle::judge_outputs(oracle::Op::Topk, oracle::op_case_from_fixture(g), {{"indices", Tensor(DType::I32, {0, 3})}});
  EXPECT_EQ(bad.verdict, oracle::Verdict::Fail) << oracle::format_op_report(bad);
}

// INCOMPLETE names every output the candidate did not return, not only the first: out alone
// lacks lse and max_logits; dsink alone (on a sink case) lacks dq and dkv. Same words in
// process and in compare.
TEST(CompleteOutputs, IncompleteNamesEveryMissingOutput) {
  Scratch dir("incomplete_lists");
  const fixtures::Fixture f = fixtures::load_fixture(golden("smla_sink"));
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  const std::string tail = ": not returned by the candidate";
  const oracle::OpReport fwd = oracle::judge_outputs(oracle::Op::SparseMlaFwd, c, {{"out", f.expected.at("out")}});
  EXPECT_EQ(fwd.verdict, oracle::Verdict::Incomplete);
  EXPECT_EQ(fwd.reason.rfind("lse, max_logits" + tail, 0), 0u) << fwd.reason;
  const oracle::OpReport bwd =
      oracle::judge_outputs(oracle::Op::SparseMlaBwd, c, {{"dsink", f.expected.at("dsink")}});
  EXPECT_EQ(bwd.verdict, oracle::Verdict::Incomplete);
  EXPECT_EQ(bwd.reason.rfind("dq, dkv" + tail, 0), 0u) << bwd.reason;
  const std::string cand = dir.file("c.safetensors");
  test::write_outputs(cand, {{"out", f.expected.at("out")}, {"dsink", f.expected.at("dsink")}});
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + golden("smla_sink") + " --candidate " + cand, &out), 1) << out;
  EXPECT_EQ(lines_with(out, {"[INCOMPLETE]", "sparse_mla_fwd: lse, max_logits" + tail}).size(), 1u) << out;
  EXPECT_EQ(lines_with(out, {"[INCOMPLETE]", "sparse_mla_bwd: dq, dkv" + tail}).size(), 1u) << out;
}

// Two files holding the same case are told apart: every row of `fixtures check` and every JSON
// entry names its file (relative to the checked directory).
TEST(FixturesCheckRows, EachRowNamesItsFile) {
  Scratch dir("rows_name_files");
  for (const std::string name : {"first", "second"})
    std::filesystem::copy_file(golden("topk_mtp"), dir.file(name + ".safetensors"));
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("") + " --backend reference --json " + dir.file("r.json"), &out), 0)
      << out;
  for (const std::string name : {"first", "second"})
    EXPECT_EQ(lines_with(out, {name + ".safetensors ", "topk ", "agree"}).size(), 2u) << out;  // producer, reference
  std::vector<std::string> files;
  const nlohmann::json report = test::read_json(dir.file("r.json"));
  for (const auto& j : report.at("files")) {
    files.push_back(j.value("file", ""));
    EXPECT_EQ(j.value("case", ""), "topk_mtp");
  }
  EXPECT_EQ(files, (std::vector<std::string>{"first.safetensors", "second.safetensors"}));
}

}  // namespace
}  // namespace dsa::cli
