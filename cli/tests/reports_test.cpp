// What the audit and `fixtures check` print (issue 12 item 8, fresh-user findings): an audit
// that runs no case is not a pass; a partial pass says so in the table, the progress lines,
// JUnit and JSON; a producer lacking outputs is partial or skip, never a plain agree; --seed
// out of range is a usage error. Label golden.
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <utility>

#include "audit_tasks.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/suite.h"
#include "dsa/reference/sparse_mla.h"
#include "report.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::expect_cli;
using test::golden;
using test::lines_with;
using test::read_text;
using test::run_cli_capture;
using test::Scratch;

// --only naming a property of an op the kernel cannot run: every case skipped, exit 2 (not 0).
TEST(AuditRanNothing, OnlyAPropertyTheKernelCannotRunExitsTwo) {
  Scratch dir("ran_nothing");
  std::string out;
  const int rc = run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN +
                                     " --only kl.loss_and_gradient_ratio,kl.neg_inf_scores --json " +
                                     dir.file("r.json"), &out);
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(test::read_json(dir.file("r.json")).value("backends_that_ran_no_case", nlohmann::json()),
            nlohmann::json::array({"plugin:example"}));
  EXPECT_NE(out.find("ran no case"), std::string::npos);
  EXPECT_NE(out.find("audit: 0 passed, 0 failed"), std::string::npos);
}

// fresh17 F6: an op named in --ops of which every case was skipped (the plugin lacks it) is not
// audited; a judged other op must not turn that into exit 0. Exit 2 naming the op.
TEST(AuditRanNothing, AnOpNamedInOpsThatJudgedNothingExitsTwo) {
  Scratch dir("op_ran_nothing");
  std::string out;
  const int rc = run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN +
                                     " --ops topk,indexer_kl_loss --seed 7"
                                     " --only topk.contract_exact,kl.loss_and_gradient_ratio --json " +
                                     dir.file("r.json"), &out);
  EXPECT_EQ(rc, 2) << out;
  const nlohmann::json j = test::read_json(dir.file("r.json"));
  EXPECT_EQ(j.value("ops_that_ran_no_case", nlohmann::json()), nlohmann::json::array({"plugin:example/indexer_kl_loss"}));
  EXPECT_EQ(j.value("backends_that_ran_no_case", nlohmann::json()), nlohmann::json::array());
  EXPECT_NE(out.find("--ops names indexer_kl_loss but backend plugin:example judged no case of it"), std::string::npos)
      << out;
  EXPECT_NE(out.find("audit: 1 passed, 0 failed, 1 skipped"), std::string::npos) << out;
  // Naming only the op the plugin runs passes.
  EXPECT_EQ(run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN +
                                " --ops topk --seed 7 --only topk.contract_exact",
                            &out),
            0)
      << out;
}

// A typo in --only or --ops is a usage error naming the flag and what it expects (exit 2),
// never an empty green audit.
TEST(AuditRanNothing, ATypoInOnlyOrOpsIsAUsageError) {
  expect_cli("audit --backend reference --only topk.contract_exactt", 2,
             {"argument '--only' got \"topk.contract_exactt\"", "expected a property name"});
  expect_cli("audit --backend reference --ops topkk", 2,
             {"argument '--ops' got \"topkk\"", "expected one of", "sparse_mla_fwd"});
}

// A plugin declaring out and lse: its passes are partial in the table, the progress lines,
// the JUnit names (and system-out) and the JSON.
TEST(AuditPartial, TableProgressJunitAndJsonSayWhatWasNotJudged) {
  Scratch dir("audit_partial");
  std::string out;
  const int rc = run_cli_capture(std::string("audit --plugin ") + DSA_PARTIAL_PLUGIN +
                                     " --only smla.forward_ratio --json " + dir.file("r.json") + " --junit " +
                                     dir.file("r.xml"), &out);
  EXPECT_EQ(rc, 0);
  // progress: "[1/1] pass sparse_mla_fwd smla.forward_ratio (partial: max_logits not judged) (..s)"
  EXPECT_EQ(lines_with(out, {"[1/1] pass", "smla.forward_ratio", "(partial: max_logits not judged)"}).size(), 1u);
  // table row and the partial line under it
  const auto row = lines_with(out, {"sparse_mla_fwd", "property:smla.forward_ratio", " partial "});
  EXPECT_EQ(row.size(), 1u);
  EXPECT_EQ(lines_with(out, {"partial sparse_mla_fwd property:smla.forward_ratio: max_logits not judged"}).size(), 1u);
  EXPECT_NE(out.find("audit: 1 passed (1 partial: some outputs not judged)"), std::string::npos);
  const std::string xml = read_text(dir.file("r.xml"));
  EXPECT_NE(xml.find("name=\"property:smla.forward_ratio [partial: max_logits not judged]\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("<system-out>partial: max_logits not judged</system-out>"), std::string::npos) << xml;
  const auto j = test::read_json(dir.file("r.json"));
  EXPECT_EQ(j.at("summary").value("partial", -1), 1);
  EXPECT_EQ(j.at("cases").at(0).at("not_judged"), nlohmann::json::array({"max_logits"}));
  // The JUnit still validates against the common schema.
  if (std::system("command -v xmllint > /dev/null 2>&1") == 0) {
    const std::string xsd = std::string(DSA_CLI_TESTS_DIR) + "/junit.xsd";
    EXPECT_EQ(std::system(("xmllint --noout --schema " + xsd + " " + dir.file("r.xml")).c_str()), 0);
  }
}

// A fixture task whose backward the kernel cannot run: the progress line of its passing
// forward names the skipped op, and the table has a skip row (0 cases) for it. --ops names
// that backward, so the audit exits 2 naming it (fresh17 F6), after the full table.
TEST(AuditPartial, ProgressOfAFixtureNamesTheOpsThatDidNotRun) {
  Scratch dir("audit_fixture_skip");
  std::filesystem::create_directories(dir.file("golden"));
  std::filesystem::create_directories(dir.file("peer"));
  std::filesystem::copy_file(golden("smla_sink"), dir.file("golden/smla_sink.safetensors"));
  std::string out;
  const int rc = run_cli_capture("audit --plugin " + std::string(DSA_PARTIAL_PLUGIN) +
                                     " --ops sparse_mla_fwd,sparse_mla_bwd --dump-dir " + dir.file("dump"),
                                 &out, "DSA_FIXTURES_DIR=" + dir.file(""));
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(lines_with(out, {"--ops names sparse_mla_bwd but backend plugin:partial_outputs judged no case"}).size(), 1u)
      << out;
  EXPECT_EQ(lines_with(out, {"] pass fixture golden:smla_sink", "skip: sparse_mla_bwd"}).size(), 1u);
  const auto skip_row = lines_with(out, {"sparse_mla_bwd ", "golden:smla_sink", " skip "});
  ASSERT_EQ(skip_row.size(), 1u);
  EXPECT_EQ(skip_row[0].back(), '0') << skip_row[0];
}

// The audit's fixture tasks carry what --outputs left out; a full judgement carries nothing.
TEST(AuditPartial, FixtureCasesCarryTheOutputsNotJudged) {
  Scratch dir("audit_fixture_partial");
  std::filesystem::copy_file(golden("smla_sink"), dir.file("smla_sink.safetensors"));
  std::unique_ptr<oracle::Backend> reference = oracle::make_reference_backend();
  for (bool partial : {true, false}) {
    AuditOptions o;
    if (partial) o.judge.outputs = std::vector<std::string>{"out", "lse", "dq", "dkv", "dsink"};
    ReproCommands repro{"dsa-verify audit", [](const std::string& f) { return "dsa-verify replay " + f; }};
    std::vector<AuditTask> tasks;
    add_fixture_tasks(tasks, dir.file(""), "golden", *reference, o, repro);
    ASSERT_EQ(tasks.size(), 1u);
    const std::vector<CaseResult> cases = tasks[0].run();
    ASSERT_EQ(cases.size(), 2u);  // forward and backward
    for (const auto& c : cases) {
      EXPECT_EQ(c.status, "pass") << c.op << ": " << c.message;
      const bool fwd = c.op == "sparse_mla_fwd";
      EXPECT_EQ(c.not_judged, partial && fwd ? std::vector<std::string>{"max_logits"} : std::vector<std::string>{})
          << c.op;
      EXPECT_EQ(partial_note(c).empty(), !(partial && fwd));
    }
  }
}

// The report writers on one partial and one full pass: only the partial one is marked.
TEST(ReportFormat, OnlyAPartialPassIsMarkedPartial) {
  CaseResult full = make_case("sparse_mla_fwd", "golden:a", "pass");
  CaseResult part = make_case("sparse_mla_fwd", "golden:b", "pass");
  part.not_judged = {"lse", "max_logits"};
  CaseResult failed = make_case("sparse_mla_fwd", "golden:c", "fail");
  failed.not_judged = {"lse"};  // a failure is a failure, never "partial"
  EXPECT_EQ(partial_note(part), "partial: lse, max_logits not judged");
  EXPECT_EQ(partial_note(full), "");
  EXPECT_EQ(partial_note(failed), "");
  const std::string xml = to_junit("b", {full, part, failed});
  EXPECT_NE(xml.find("name=\"golden:a\""), std::string::npos);
  EXPECT_NE(xml.find("name=\"golden:b [partial: lse, max_logits not judged]\""), std::string::npos);
  EXPECT_NE(xml.find("name=\"golden:c\""), std::string::npos);
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_summary(f, "b", {full, part, failed});
  std::fclose(f);
  const std::string table(buf, len);
  std::free(buf);
  std::cout << table;
  EXPECT_EQ(lines_with(table, {"golden:a", " pass "}).size(), 1u);
  EXPECT_EQ(lines_with(table, {"golden:b", " partial "}).size(), 1u);
  EXPECT_NE(table.find("audit: 2 passed (1 partial"), std::string::npos);  // b counts as passed, and partial
  EXPECT_NE(table.find("err/base"), std::string::npos);
  EXPECT_NE(table.find("err/bound"), std::string::npos);
}

// fixtures check FILE: a producer lacking lse is partial and names it; one storing no backward
// output is skip for the backward, never agree.
TEST(FixturesCheckPartial, ProducerLackingOutputsIsPartialOrSkipNeverAgree) {
  Scratch dir("check_partial");
  fixtures::Fixture f = fixtures::load_fixture(golden("smla_sink"));
  ASSERT_EQ(f.op, "sparse_mla_fwd+bwd");
  fixtures::Fixture no_lse = f;
  no_lse.expected.erase("lse");
  fixtures::save_fixture(dir.file("no_lse.safetensors"), no_lse);
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("no_lse.safetensors") + " --backend reference", &out), 0);
  EXPECT_EQ(lines_with(out, {"sparse_mla_fwd ", "producer", "partial: lse not stored, not judged"}).size(), 1u);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "producer", "agree"}).size(), 1u);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_fwd ", "producer", "agree"}).empty());
  EXPECT_NE(out.find("1 partial"), std::string::npos);

  fixtures::Fixture fwd_only = f;
  for (const char* n : {"dq", "dkv", "dsink"}) fwd_only.expected.erase(n);
  fixtures::save_fixture(dir.file("fwd_only.safetensors"), fwd_only);
  EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("fwd_only.safetensors") + " --backend reference", &out), 0);
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "producer", "skip: dq, dkv, dsink not stored"}).size(), 1u);
  EXPECT_TRUE(lines_with(out, {"sparse_mla_bwd ", "producer", "agree"}).empty());
  EXPECT_EQ(lines_with(out, {"sparse_mla_bwd ", "reference", "agree"}).size(), 1u);
}

// A fixtures check that judged nothing (no stored outputs, no backend that runs the op) is
// not a pass: exit 2.
TEST(FixturesCheckPartial, NothingJudgedIsNotAPass) {
  std::string out;
  ASSERT_EQ(run_cli_capture("backends", &out), 0);
  if (lines_with(out, {"libtorch-composite", "unavailable"}).empty())
    GTEST_SKIP() << "libtorch-composite is available here: no backend to leave unused";
  Scratch dir("check_nothing");
  fixtures::Fixture f = fixtures::load_fixture(golden("topk_distinct_causal"));
  f.expected.clear();
  fixtures::save_fixture(dir.file("inputs_only.safetensors"), f);
  EXPECT_EQ(run_cli_capture("fixtures check " + dir.file("inputs_only.safetensors") + " --backend libtorch-composite",
                            &out), 2);
  EXPECT_FALSE(lines_with(out, {"topk", "producer", "skip: indices not stored"}).empty());
  EXPECT_NE(out.find("judged nothing"), std::string::npos);
}

// --seed is a uint64: a negative or too large value is a usage error naming --seed and the
// range, never a silently wrapped seed.
TEST(AuditSeed, NegativeOrTooLargeIsAUsageError) {
  for (const char* bad : {"-1", "18446744073709551616", "1e3"}) {
    std::string out;
    EXPECT_EQ(run_cli_capture(std::string("audit --backend reference --only topk.contract_exact --seed ") + bad, &out), 2);
    EXPECT_NE(out.find("--seed"), std::string::npos) << bad;
    EXPECT_NE(out.find("0 to 18446744073709551615"), std::string::npos) << bad;
  }
  std::string out;
  EXPECT_EQ(run_cli_capture("audit --backend reference --only topk.contract_exact --seed 18446744073709551615", &out), 0);
}

// A failing element prints "err X > bound Y" (never "<="); a passing one "<=".
TEST(ReportFormat, AFailedElementPrintsGreaterThanItsBound) {
  oracle::TensorCheck c;
  c.name = "out";
  c.rho = 2;
  c.bound = 1.0;
  c.passed = false;
  c.message = "1 element(s) over their bound";
  oracle::ElementBound e;
  e.flat = 0;
  e.where = "[0, 0, 0]";
  e.err = 2.0;
  e.bound = 1.0;
  e.rho_e_row = 0.5;
  e.floor_acc = 0.5;
  c.at_worst = e;
  c.failures = {e};
  oracle::TensorCheck ok = c;
  ok.passed = true;
  ok.failures.clear();
  ok.at_worst.err = 0.5;
  const std::string text = oracle::format_tensor_checks({c, ok});
  std::cout << text;
  const auto failed = lines_with(text, {"FAILED [0, 0, 0]"});
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].find("err 2.000e+00 > bound 1.000e+00"), std::string::npos) << failed[0];
  EXPECT_EQ(failed[0].find("<="), std::string::npos) << failed[0];
  EXPECT_EQ(lines_with(text, {"bound at worst element", "err 5.000e-01 <= bound 1.000e+00"}).size(), 1u);
}

// An output of the wrong shape is not measured: its row shows "-", never a 0 error or ratio.
TEST(ReportFormat, AShapeMismatchShowsNoMeasurement) {
  const Tensor ref = Tensor::from_f64({2, 2}, {1, 2, 3, 4});
  const Tensor cand = Tensor::from_f64({1, 4}, {1, 2, 3, 4}).to(DType::F32);
  const oracle::TensorCheck c = oracle::judge_tensor("sparse_mla_fwd", "lse", cand, ref, ref, oracle::OutputFloor{});
  ASSERT_FALSE(c.passed);
  const std::string text = oracle::format_tensor_checks({c});
  std::cout << text;
  const auto row = lines_with(text, {"  lse "});
  ASSERT_EQ(row.size(), 1u);
  EXPECT_EQ(row[0].find("0.000e+00"), std::string::npos) << row[0];
  EXPECT_NE(row[0].find(" - "), std::string::npos) << row[0];
  EXPECT_FALSE(lines_with(text, {"-> shape [1, 4]"}).empty()) << text;
}

// A topk golden and its indices stored as int64: compare fails (ids are int32, SPEC §3) and
// the error says which convention converts them; with it the same file agrees.
TEST(CompareHints, Int64IdsNameTheirConvention) {
  Scratch dir("int64_hint");
  const std::string g = golden("topk_distinct_causal");
  const fixtures::Fixture f = fixtures::load_fixture(g);
  const Tensor& ids = f.expected.at("indices");
  Tensor wide(DType::I64, ids.shape());
  for (int64_t i = 0; i < ids.numel(); ++i) wide.set(i, ids.get(i));
  test::write_outputs(dir.file("c.safetensors"), {{"indices", wide}});
  std::string out;
  expect_cli("compare --golden " + g + " --candidate " + dir.file("c.safetensors"), 1,
             {"indices: dtype I64, expected I32 (contract:", "--convention int64_ids"});
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + dir.file("c.safetensors") +
                                " --convention int64_ids", &out), 0);
  EXPECT_EQ(out.find("hint:"), std::string::npos);
}

// A candidate file's outputs that the comparison will not judge are named, never silently
// dropped: an output of an op the golden does not define, and one --outputs leaves out.
TEST(CompareNotes, UnjudgedStoredOutputsAreNamed) {
  Scratch dir("unjudged");
  const std::string g = golden("topk_distinct_causal");
  const fixtures::Fixture f = fixtures::load_fixture(g);
  test::write_outputs(dir.file("c.safetensors"),
                      {{"indices", f.expected.at("indices")}, {"dkv", Tensor(DType::F32, {2, 3})}});
  std::string out = expect_cli("compare --golden " + g + " --candidate " + dir.file("c.safetensors"), 0,
                               {"note:", "'dkv' is an output of sparse_mla_bwd", "not judged"});
  EXPECT_TRUE(lines_with(out, {"note:", "'indices'"}).empty()) << out;
  const std::string s = golden("smla_basic");
  const fixtures::Fixture m = fixtures::load_fixture(s);
  std::map<std::string, Tensor> outs;
  for (const char* n : {"out", "lse", "max_logits", "dq", "dkv"}) outs.emplace(n, m.expected.at(n));
  test::write_outputs(dir.file("m.safetensors"), outs);
  out = expect_cli("compare --golden " + s + " --candidate " + dir.file("m.safetensors") + " --outputs out,lse,dq", 0,
                   {"note:", "'dkv' is in the file but not named by --outputs"});
  EXPECT_FALSE(lines_with(out, {"note:", "'max_logits' is in the file but not named by --outputs"}).empty()) << out;
  EXPECT_TRUE(lines_with(out, {"note:", "'out'"}).empty()) << out;
  EXPECT_TRUE(lines_with(out, {"note:", "'dq'"}).empty()) << out;
}

// --outputs naming no output of the golden's ops is a usage error (exit 2) naming it and each
// op's outputs (oracle::check_provided_outputs), on compare and replay alike; not exit 1 or 0.
TEST(CompareNotes, JudgedNothingExitsTwo) {
  Scratch dir("judged_nothing");
  const std::string s = golden("smla_basic");
  const fixtures::Fixture m = fixtures::load_fixture(s);
  std::map<std::string, Tensor> outs;
  for (const char* n : {"out", "lse", "max_logits"}) outs.emplace(n, m.expected.at(n));
  test::write_outputs(dir.file("m.safetensors"), outs);
  std::string out;
  expect_cli("compare --golden " + s + " --candidate " + dir.file("m.safetensors") + " --outputs indices", 2,
             {"'--outputs' names indices, which is not an output of the selected ops: "
              "sparse_mla_fwd (out, lse, max_logits); sparse_mla_bwd (dq, dkv, dsink)"});
  // replay --candidate is the same judgement: the same exit code.
  expect_cli("replay " + s + " --candidate " + dir.file("m.safetensors") + " --outputs indices", 2,
             {"'--outputs' names indices, which is not an output"});
  EXPECT_EQ(run_cli_capture("compare --golden " + s + " --candidate " + dir.file("m.safetensors") +
                                " --outputs out,lse,max_logits", &out), 0) << out;
}

// `replay FILE` alone judges the built-in reference: it says so, since such a pass reproduces
// no kernel's failure (fresh-user report); with a backend named there is no such note.
TEST(ReplayNotes, DefaultReferenceBackendIsSaid) {
  std::string out;
  expect_cli("replay " + golden("smla_basic"), 0, {"note: replay: no --backend", "reproduces no kernel's failure"});
  EXPECT_EQ(run_cli_capture("replay " + golden("smla_basic") + " --backend reference", &out), 0) << out;
  EXPECT_TRUE(lines_with(out, {"note: replay: no --backend"}).empty()) << out;
}

// q and kv disagreeing on d_qk: the error names both and their shapes, not kv alone.
TEST(InputErrors, DqkMismatchNamesQAndKv) {
  SparseMlaInputs in;
  in.q = Tensor(DType::F32, {2, 1, 7});
  in.kv = Tensor(DType::F32, {3, 8});
  in.indices = Tensor::from_i32({2, 1}, {0, 1});
  in.sm_scale = 0.5;
  in.d_v = 4;
  std::string what;
  try {
    reference::sparse_mla_forward(in);
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("arguments 'q' and 'kv' disagree on d_qk"), std::string::npos) << what;
  EXPECT_NE(what.find("q shape [2, 1, 7]"), std::string::npos) << what;
  EXPECT_NE(what.find("kv shape [3, 8]"), std::string::npos) << what;
  // Through a file: the file's path, the op, both arguments, no function name; exit 2.
  Scratch dir("dqk");
  fixtures::Fixture f = fixtures::load_fixture(golden("smla_basic"));
  const Tensor& q = f.inputs.at("q");
  Tensor narrow(q.dtype(), {q.size(0), q.size(1), q.size(2) - 1});
  for (int64_t r = 0; r < q.size(0) * q.size(1); ++r)
    for (int64_t d = 0; d + 1 < q.size(2); ++d) narrow.set(r * (q.size(2) - 1) + d, q.get(r * q.size(2) + d));
  f.inputs.at("q") = narrow;
  const std::string path = dir.file("q_narrow.safetensors");
  fixtures::save_fixture(path, f);
  const std::string out = expect_cli("fixtures check " + path + " --backend reference", 2,
                                     {path + ": sparse_mla_fwd inputs: arguments 'q' and 'kv' disagree on d_qk"});
  EXPECT_EQ(out.find("sparse_mla_forward:"), std::string::npos);
}

// params.k out of range or not an integer: an input error (exit 2) naming params.k and the
// range on every file route, never a backend failure (exit 1) or a truncated k.
TEST(InputErrors, TopkParamKOutOfRangeIsAnInputError) {
  Scratch dir("param_k");
  for (const nlohmann::json& k : {nlohmann::json(1e12), nlohmann::json(-3), nlohmann::json(16.5)}) {
    fixtures::Fixture f = fixtures::load_fixture(golden("topk_distinct_causal"));
    f.params["k"] = k;
    const std::string path = dir.file("k.safetensors");
    fixtures::save_fixture(path, f);
    expect_cli("fixtures check " + path + " --backend reference", 2,
               {path + ": params.k got", "expected an integer from 0 to"});
    const std::string out = expect_cli("compare --golden " + path + " --candidate " + golden("topk_distinct_causal"), 2,
                                       {"params.k got", "expected an integer from 0 to"});
    EXPECT_EQ(out.find("backend threw"), std::string::npos);
  }
}

// Inputs of the wrong rank name the tensor and the file, not Tensor::size.
TEST(InputErrors, WrongRankNamesTheTensor) {
  Scratch dir("rank");
  fixtures::Fixture f = fixtures::load_fixture(golden("topk_distinct_causal"));
  f.inputs.at("scores") = f.inputs.at("scores").reshaped({f.inputs.at("scores").numel()});
  const std::string path = dir.file("s1d.safetensors");
  fixtures::save_fixture(path, f);
  const std::string out = expect_cli("fixtures check " + path + " --backend reference", 2,
                                     {path + ": tensor 'scores' has shape", "expected 2 dimensions"});
  EXPECT_EQ(out.find("Tensor::size"), std::string::npos);
  f = fixtures::load_fixture(golden("topk_distinct_causal"));
  f.inputs.at("ks") = f.inputs.at("ks").reshaped({4, f.inputs.at("ks").numel() / 4});
  fixtures::save_fixture(path, f);
  expect_cli("fixtures check " + path + " --backend reference", 2,
             {path + ": tensor 'ks' has shape", "expected 1 dimension [s_q]"});
}

// The top-k property that re-runs a call itself (topk.int32_contiguous_deterministic, three
// runs of one call) marks its re-runs as the oracle's determinism re-run is marked, so the
// plugin route makes each a second call in one child after a decoy: a top-k that replays its
// first result for later calls of the same shapes (dsa_stale_plugin) fails it, naming how the
// re-run was made; the example plugin passes it (fresh17 F5, the property's own re-runs).
TEST(StaleState, TopkPropertyReRunsAreSecondCallsOnThePluginRoute) {
  Scratch dir("stale_topk_property");
  const std::string only = " --ops topk --only topk.int32_contiguous_deterministic --seed 3 --dump-dir ";
  std::string out;
  EXPECT_EQ(run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN + only + dir.file("a"), &out), 0)
      << out;
  EXPECT_EQ(run_cli_capture(std::string("audit --plugin ") + DSA_STALE_PLUGIN + only + dir.file("b"), &out), 1)
      << out;
  EXPECT_FALSE(lines_with(out, {"deterministic backend returned different bytes on run 2"}).empty()) << out;
  EXPECT_FALSE(lines_with(out, {"the second call in one child process"}).empty()) << out;
}

// `dsa-verify mutants --list` maps every plugin number to its mutant and fault, from the
// code's own list (props::mutant_subjects), and names each built plugin library.
TEST(MutantsList, EveryPluginNumberMapsToItsMutant) {
  std::string out;
  ASSERT_EQ(run_cli_capture("mutants --list", &out), 0);
  const std::vector<props::Subject> all = props::mutant_subjects();
  size_t plugins = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool block = all[i].name.rfind("block_", 0) == 0;
    const std::string lib = block ? "(in-process only)" : "libdsa_mutant_plugin_" + std::to_string(i) + ".so";
    EXPECT_EQ(lines_with(out, {std::to_string(i) + " ", lib, " " + all[i].name + " ", all[i].fault}).size(), 1u)
        << all[i].name;
    if (block) continue;
    ++plugins;
    const std::string built = test::mutant_plugin(i);
    if (!built.empty()) {
      EXPECT_NE(built.find("libdsa_mutant_plugin_" + std::to_string(i) + ".so"), std::string::npos);
    }
  }
  EXPECT_FALSE(test::mutant_plugin(plugins - 1).empty()) << "every listed plugin is built";
  EXPECT_TRUE(test::mutant_plugin(plugins).empty()) << "no plugin beyond the list";
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

using test::golden;
using test::lines_with;
using test::run_cli_capture;
using test::Scratch;

// The two whitespace-separated words before "FAIL" on `row` (the ratio and err/bound columns of
// format_tensor_checks' table; err/base and err/bound of the audit's), or "" when absent.
std::pair<std::string, std::string> columns_before_fail(const std::string& row) {
  std::stringstream in(row);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  for (size_t i = 2; i < words.size(); ++i)
    if (words[i] == "FAIL" || words[i] == "fail") return {words[i - 2], words[i - 1]};
  return {"", ""};
}

// fresh18 F4: an output that fails only on non-finite positions (NaN or +inf where the
// reference is finite, finite where it is -inf) has no finite error; its row in the
// per-output table (fixtures check, compare, replay) said "0 0 FAIL". It names the mismatch.
TEST(ReportFormat, ANonFiniteMismatchIsNamedNeverAZeroError) {
  Scratch dir("nonfinite_row");
  struct Edit {
    const char* fixture;
    const char* output;
    double value;  // NaN: put at flat 3; else at the first element of the other class
  };
  for (const Edit& e : {Edit{"smla_basic", "out", NAN}, Edit{"smla_basic", "out", INFINITY},
                        Edit{"smla_empty_rows", "lse", 0.0}}) {
    fixtures::Fixture f = fixtures::load_fixture(golden(e.fixture));
    Tensor& t = f.expected.at(e.output);
    int64_t at = -1;
    for (int64_t i = 0; i < t.numel() && at < 0; ++i)
      if (std::isfinite(t.get(i)) != std::isfinite(e.value)) at = i;
    ASSERT_GE(at, 0) << e.fixture << " " << e.output << " holds no element of the other class";
    t.set(at, e.value);
    const std::string path = dir.file(std::string(e.fixture) + "_" + e.output + ".safetensors");
    fixtures::save_fixture(path, f);
    std::string out;
    EXPECT_EQ(run_cli_capture("fixtures check " + path + " --backend reference", &out), 1);  // the verdict: FAIL
    const auto rows = lines_with(out, {std::string("  ") + e.output + " ", "FAIL"});
    ASSERT_EQ(rows.size(), 1u) << out;
    EXPECT_NE(rows[0].find("1 non-finite position mismatch"), std::string::npos) << rows[0];
    EXPECT_EQ(columns_before_fail(rows[0]), std::make_pair(std::string("nonfinite"), std::string("nonfinite")))
        << rows[0];
    EXPECT_EQ(lines_with(out, {"-> 1 non-finite position mismatch(es), first flat " + std::to_string(at)}).size(), 1u)
        << out;
  }
}

// The reference's sparse MLA forward with out's flat 3 NaN: a kernel whose only fault is a
// non-finite value where the reference is finite.
class NanOutBackend final : public oracle::Backend {
 public:
  std::string name() const override { return "test:nan-out"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::SparseMlaFwd; }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward r = ref_->sparse_mla_forward(in);
    r.out.set(3, NAN);
    return r;
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

// The audit's table (dsa-verify audit, dsa_verify.audit's summary through the same
// print_summary): a golden case that fails only on a NaN prints "nonfinite" in its err/base
// and err/bound columns, never "fail 0 0"; the JSON counts the mismatch.
TEST(ReportFormat, AuditTableNamesANonFiniteMismatch) {
  Scratch dir("nonfinite_audit");
  std::filesystem::copy_file(golden("smla_basic"), dir.file("smla_basic.safetensors"));
  NanOutBackend backend;
  AuditOptions o;
  ReproCommands repro{"dsa-verify audit", [](const std::string& f) { return "dsa-verify replay " + f; }};
  std::vector<AuditTask> tasks;
  add_fixture_tasks(tasks, dir.file(""), "golden", backend, o, repro);
  ASSERT_EQ(tasks.size(), 1u);
  std::vector<CaseResult> cases;
  for (const auto& c : tasks[0].run())
    if (c.op == "sparse_mla_fwd") cases.push_back(c);
  ASSERT_EQ(cases.size(), 1u);
  EXPECT_EQ(cases[0].status, "fail") << cases[0].message;  // the verdict is unchanged
  EXPECT_EQ(cases[0].nonfinite_mismatches, 1);
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_summary(f, "test:nan-out", cases);
  std::fclose(f);
  const std::string table(buf, len);
  std::free(buf);
  std::cout << table;
  const auto rows = lines_with(table, {"sparse_mla_fwd", "golden:smla_basic", " fail "});
  ASSERT_EQ(rows.size(), 1u) << table;
  // the columns after the result: err/base, err/bound
  std::stringstream in(rows[0].substr(rows[0].find(" fail ") + 6));
  std::string base, bound;
  in >> base >> bound;
  EXPECT_EQ(base, "nonfinite") << rows[0];
  EXPECT_EQ(bound, "nonfinite") << rows[0];
  EXPECT_NE(table.find("1 non-finite position mismatch(es), first flat 3"), std::string::npos) << table;
  EXPECT_EQ(to_json("test:nan-out", cases).at("cases").at(0).value("nonfinite_mismatches", -1), 1);
}

}  // namespace
}  // namespace dsa::cli
