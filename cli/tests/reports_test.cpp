// What the audit and `fixtures check` print (issue 12 item 8, fresh-user findings): an audit
// that runs no case is not a pass; a partial pass says so in the table, the progress lines,
// JUnit and JSON; a producer lacking outputs is partial or skip, never a plain agree; --seed
// out of range is a usage error. Label golden.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "audit_tasks.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/reference_backend.h"
#include "report.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::lines_with;
using test::run_cli_capture;

std::string golden(const std::string& name) {
  return std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// --only naming a property of an op the kernel cannot run: every case skipped, exit 2 (not 0).
TEST(AuditRanNothing, OnlyAPropertyTheKernelCannotRunExitsTwo) {
  std::string out;
  const int rc = run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN +
                                     " --only kl.loss_and_gradient_ratio,kl.neg_inf_scores", &out);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("ran no case"), std::string::npos);
  EXPECT_NE(out.find("audit: 0 passed, 0 failed"), std::string::npos);
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

}  // namespace
}  // namespace dsa::cli
