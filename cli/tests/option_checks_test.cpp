// Numeric options are checked up front on every command (fresh-user findings F7/F8): a NaN,
// infinite, zero, negative, fractional or too large value is a usage error (exit 2) naming the
// option, the value and the accepted range, never a run whose every case fails (blaming the
// kernel) nor a self-contradictory range. Label golden.
#include <gtest/gtest.h>

#include <tuple>

#include <string>
#include <utility>
#include <vector>

#include "dsa/fixtures/fixture.h"
#include "dsa/property_tests/suite.h"
#include "call_watchdog.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::expect_cli;
using test::golden;
using test::lines_with;
using test::mutant_plugin_named;
using test::run_cli_capture;
using test::Scratch;

// Runs `args`, expects exit 2 and an error line naming `option` and `value`, with `range`.
void expect_usage_error(const std::string& args, const std::string& option, const std::string& value,
                        const std::string& range) {
  std::string out;
  EXPECT_EQ(run_cli_capture(args, &out), 2) << args << "\n" << out;
  EXPECT_NE(out.find(option + ": got " + value), std::string::npos) << args << "\n" << out;
  EXPECT_NE(out.find(range), std::string::npos) << args << "\n" << out;
  EXPECT_EQ(out.find("run_isolated"), std::string::npos) << "the value reached the runner: " << out;
  EXPECT_EQ(out.find("not in range 0.000000"), std::string::npos) << out;
}

TEST(NumericOptions, TimeoutOutsideItsRangeIsAUsageError) {
  const std::string audit = std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN + " --ops topk --timeout ";
  const std::string range = "expected a positive decimal number of seconds from 0.001 to 86400";
  for (const std::string v : {"nan", "inf", "-inf", "1e16", "0.0001", "0", "-5", "86401"})
    expect_usage_error(audit + v, "--timeout", v, range);
  // Not decimal numbers (fresh12 F11: strtod read "0x10" as 16 s and the audit ran).
  for (const std::string v : {"abc", "0x10", "0X1p4", "1e", "5s", "1,5", "0x"})
    expect_usage_error(audit + v, "--timeout", "\"" + v + "\"", range);
}

// Durations in messages keep their precision (fresh12 F11: a 0.5 s call read "after 0 s").
TEST(NumericOptions, SecondsInMessagesKeepTheirPrecision) {
  EXPECT_EQ(seconds_text(0.5004), "0.5");
  EXPECT_EQ(seconds_text(0.25), "0.25");
  EXPECT_EQ(seconds_text(0.001), "0.001");
  EXPECT_EQ(seconds_text(2.0), "2");
  EXPECT_EQ(seconds_text(9.994), "9.99");
  EXPECT_EQ(seconds_text(31.44), "31.4");
  EXPECT_EQ(seconds_text(300.02), "300");
  EXPECT_EQ(seconds_text(86400), "86400");
}

TEST(NumericOptions, JobsOutsideItsRangeIsAUsageError) {
  const std::string range = "expected a number of threads, an integer from 1 to 4096";
  for (const std::string v : {"0", "-3", "100000", "99999999999999999999"})
    expect_usage_error("audit --ops topk --jobs " + v, "--jobs", v, range);
  for (const std::string v : {"1.5", "nan", "2x"})
    expect_usage_error("fixtures check " + golden("topk_mtp") + " -j " + v, "--jobs", "\"" + v + "\"", range);
}

TEST(NumericOptions, LevelOutsideItsRangeIsAUsageError) {
  for (const std::string v : {"3", "-1"})
    expect_usage_error("audit --ops topk --level " + v, "--level", v,
                       "expected a test level, an integer from 0 to 2");
}

// The accepted ranges are in the help text a user reads first.
TEST(NumericOptions, HelpStatesTheRanges) {
  std::string out;
  ASSERT_EQ(run_cli_capture("audit --help", &out), 0);
  EXPECT_NE(out.find("a positive decimal number of seconds from 0.001 to 86400"), std::string::npos) << out;
  EXPECT_NE(out.find("an integer from 1 to 4096"), std::string::npos) << out;
}

// An empty report or dump path (F1, fresh14): a CI line `--json $REPORT` with REPORT unset ran,
// exited 0 and wrote no report, silently. Now a usage error naming the option and what it takes,
// on every command with such an option, before anything runs.
TEST(PathOptions, AnEmptyPathIsAUsageError) {
  const std::string g = golden("topk_mtp");
  const std::string file = "expected a file path", dir = "expected a directory path";
  expect_usage_error("audit --ops topk --json \"\"", "--json", "\"\"", file);
  expect_usage_error("audit --ops topk --junit \"\"", "--junit", "\"\"", file);
  expect_usage_error("audit --ops topk --dump-dir \"\"", "--dump-dir", "\"\"", dir);
  expect_usage_error("fixtures check " + g + " --backend reference --json \"\"", "--json", "\"\"", file);
  expect_usage_error("compare --golden " + g + " --candidate " + g + " --json \"\"", "--json", "\"\"", file);
  expect_usage_error("replay " + g + " --json \"\"", "--json", "\"\"", file);
  expect_usage_error("fixtures generate --preset ci --out \"\"", "--out", "\"\"", dir);
}

// A file's structured conventions follow the --convention flag's rules (F4, fresh14): one that
// converts no output of the golden's op, or one named twice, is an input error naming the file
// (exit 2); before, both were accepted silently.
TEST(ConventionsMetadata, AreHeldToTheFlagsRules) {
  Scratch dir("conventions_metadata");
  auto with = [&](const std::string& name, const std::string& conventions, const std::string& tag) {
    fixtures::SafetensorsFile f = fixtures::read_safetensors(golden(name));
    f.metadata["conventions"] = conventions;
    const std::string path = dir.file(name + "_" + tag + ".safetensors");
    fixtures::write_safetensors(path, f);
    return path;
  };
  const std::string topk = with("topk_mtp", "[\"lse_base2\"]", "other_op");
  expect_cli("compare --golden " + golden("topk_mtp") + " --candidate " + topk, 2,
             {topk, "metadata 'conventions' names lse_base2", "converts outputs of sparse_mla_fwd"});
  expect_cli("replay " + golden("topk_mtp") + " --candidate " + topk, 2, {topk, "metadata 'conventions' names lse_base2"});
  const std::string smla = with("smla_sink", "[\"int64_ids\"]", "other_op");
  expect_cli("compare --golden " + golden("smla_sink") + " --candidate " + smla, 2,
             {smla, "metadata 'conventions' names int64_ids", "converts outputs of topk only"});
  const std::string twice = with("smla_sink", "[\"lse_base2\",\"lse_base2\"]", "twice");
  expect_cli("compare --golden " + golden("smla_sink") + " --candidate " + twice, 2,
             {twice, "names convention 'lse_base2' twice"});
  // A fixture file's conventions alike, on fixtures check.
  expect_cli("fixtures check " + smla + " --backend reference", 2, {smla, "metadata 'conventions' names int64_ids"});
  // The same files as goldens: every route refuses them alike (load_fixture applies the rule;
  // fresh19: compare and replay took lse_base2 on a topk golden and agreed, exit 0).
  for (const auto& [bad, good, want] :
       {std::tuple<std::string, std::string, std::string>{topk, golden("topk_mtp"), "metadata 'conventions' names lse_base2, which converts outputs of sparse_mla_fwd or sparse_mla_fp8_fwd only, not of the selected op topk"},
        {smla, golden("smla_sink"), "metadata 'conventions' names int64_ids, which converts outputs of topk only, not of the selected ops sparse_mla_fwd, sparse_mla_bwd"}}) {
    expect_cli("compare --golden " + bad + " --candidate " + good, 2, {bad, want});
    expect_cli("replay " + bad + " --candidate " + good, 2, {bad, want});
    expect_cli("replay " + bad + " --backend reference", 2, {bad, want});
    expect_cli("fixtures check " + bad + " --backend reference", 2, {bad, want});
  }
  // A convention of the op still applies (the shipped peer topk_short_rows names topk_width_min_k_s_kv).
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + std::string(DSA_PEER_FIXTURE_DIR) + "/topk_short_rows.safetensors" + " --backend reference", &out), 0) << out;
}

// A candidate file's conventions field follows the golden's rule (fresh20 F1): text that is not
// JSON, a JSON string or number is an input error naming the file and the field (exit 2), on
// compare and replay; before, a candidate file ignored it silently and a correct base-2 lse
// DISAGREED with no word on the field. A JSON object stays free text, never applied.
TEST(ConventionsMetadata, AMalformedCandidateFieldIsAFileError) {
  Scratch dir("conventions_candidate");
  const std::string g = golden("smla_sink");
  auto with = [&](const std::string& conventions, const std::string& tag) {
    fixtures::SafetensorsFile f = fixtures::read_safetensors(g);
    f.metadata["conventions"] = conventions;
    const std::string path = dir.file("cand_" + tag + ".safetensors");
    fixtures::write_safetensors(path, f);
    return path;
  };
  for (const auto& [text, tag, want] :
       {std::tuple<std::string, std::string, std::string>{"lse_base2", "bare", "metadata 'conventions'"},
        {"[lse_base2", "broken", "metadata 'conventions'"},
        {"\"lse_base2\"", "string", "must be a JSON array of convention names"},
        {"5", "number", "must be a JSON array of convention names"}}) {
    const std::string c = with(text, tag);
    expect_cli("compare --golden " + g + " --candidate " + c, 2, {c, want});
    expect_cli("replay " + g + " --candidate " + c, 2, {c, want});
  }
  // Free text (a JSON object) is kept and never applied: the golden's own outputs agree.
  const std::string notes = with("{\"lse\": \"base 2\"}", "object");
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + notes, &out), 0) << out;
}

// A stored expected.* that is no output of the fixture's op is said, never silently dropped
// (fresh20 F2: the peer smla_basic's expected.out_bf16 halved read "agree" with no word).
TEST(FixturesCheck, StoredTensorsThatAreNoOutputAreNamedNotJudged) {
  Scratch dir("not_outputs");
  fixtures::Fixture f = fixtures::load_fixture(golden("smla_sink"));
  f.expected["out_bf16"] = f.expected.at("out");
  const std::string path = dir.file("extra.safetensors");
  fixtures::save_fixture(path, f);
  expect_cli("fixtures check " + path + " --backend reference", 0,
             {path, "tensor 'expected.out_bf16' is not an output of op sparse_mla_fwd+bwd; not judged"});
  std::string out;
  ASSERT_EQ(run_cli_capture("fixtures check " + path + " --backend reference -v", &out), 0) << out;
  EXPECT_FALSE(lines_with(out, {"expected.out_bf16: not an output of op sparse_mla_fwd+bwd", "not judged"}).empty()) << out;
  // The same tensor without the prefix (fresh21: silently skipped): not an input, not read.
  fixtures::Fixture g = fixtures::load_fixture(golden("smla_sink"));
  g.inputs["out_bf16"] = g.expected.at("out");
  const std::string plain = dir.file("plain.safetensors");
  fixtures::save_fixture(plain, g);
  expect_cli("fixtures check " + plain + " --backend reference", 0,
             {plain, "tensor 'out_bf16' is not an input of op sparse_mla_fwd+bwd nor expected.*; not read"});
}

// replay --candidate says what it will not judge, as compare does (fresh21: replay dropped a
// stray 'out.x' silently while compare noted it): one function prints the notes for both.
TEST(CandidateNotes, ReplayAndCompareNameTheTensorsTheyIgnore) {
  Scratch dir("candidate_notes");
  const std::string g = golden("smla_sink");
  fixtures::SafetensorsFile f = fixtures::read_safetensors(g);
  f.tensors.emplace("out.x", f.tensors.at("expected.out"));
  const std::string c = dir.file("stray.safetensors");
  fixtures::write_safetensors(c, f);
  for (const std::string& route : {"compare --golden " + g + " --candidate " + c, "replay " + g + " --candidate " + c})
    expect_cli(route, 0, {c, "tensor 'out.x' is not an output name; ignored"});
}

// Names read from a file are quoted with control bytes as \xNN (fresh21: a convention name
// holding ESC, CR and LF printed "compare: AGREES" on a line of its own): a tensor name or
// metadata key holding one is an input error; a metadata value is shown escaped.
TEST(FileNames, ControlBytesNeverReachTheOutputRaw) {
  Scratch dir("control_names");
  const std::string g = golden("smla_sink");
  fixtures::SafetensorsFile f = fixtures::read_safetensors(g);
  f.metadata["conventions"] = "[\"x\\r\\ncompare: AGREES\"]";
  const std::string conv = dir.file("conv.safetensors");
  fixtures::write_safetensors(conv, f);
  const std::string out = expect_cli("compare --golden " + g + " --candidate " + conv, 2,
                                     {conv, "unknown convention 'x\\x0D\\x0Acompare: AGREES'"});
  EXPECT_TRUE(lines_with(out, {"compare: AGREES"}).size() == 1) << out;  // only the escaped one
  fixtures::SafetensorsFile t = fixtures::read_safetensors(g);
  t.tensors.emplace("out\x1b[32m", t.tensors.at("expected.out"));
  const std::string name = dir.file("name.safetensors");
  fixtures::write_safetensors(name, t);
  expect_cli("compare --golden " + g + " --candidate " + name, 2, {name, "tensor name 'out\\x1B[32m' holds a control byte"});
}

// A valid value still runs (the checks reject only what is out of range).
TEST(NumericOptions, ValidValuesRun) {
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + golden("topk_mtp") + " --backend reference -j 1", &out), 0) << out;
}

// --outputs (F6): a name that is no output of a selected op is a usage error naming it and each
// op's outputs, on compare, replay and audit; before, compare said "'indices' not judged" and
// judged it, and audit labelled top-k "partial: indices not judged" while judging it.
TEST(OutputsOption, ANameOfNoSelectedOpIsAUsageError) {
  const std::string g = golden("topk_short_rows");
  const fixtures::Fixture f = fixtures::load_fixture(g);
  Scratch dir("outputs_rule");
  test::write_outputs(dir.file("c.safetensors"), {{"indices", f.expected.at("indices")}});
  const std::string expected = "argument '--outputs' names out, which is not an output of the selected op: topk (indices)";
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + dir.file("c.safetensors") + " --outputs out", &out), 2)
      << out;
  EXPECT_FALSE(lines_with(out, {expected}).empty()) << out;
  EXPECT_TRUE(lines_with(out, {"not judged"}).empty()) << out;
  expect_cli("replay " + g + " --candidate " + dir.file("c.safetensors") + " --outputs out", 2, {expected});
  expect_cli("audit --ops topk --outputs out --dump-dir " + dir.file("d"), 2, {expected});
}

// --outputs naming one output twice (`out,out`, or `--outputs out --outputs out`) is a usage
// error naming the option and the name on every command that takes it (fresh-user finding 8);
// before, compare and replay merged the names and said AGREES (partial).
TEST(OutputsOption, ANameGivenTwiceIsAUsageError) {
  const std::string g = golden("smla_sink");
  const std::string dump = " --dump-dir " + Scratch("outputs_twice").file("d");
  for (const std::string& cmd :
       {"compare --golden " + g + " --candidate " + g + " --outputs out,out",
        "compare --golden " + g + " --candidate " + g + " --outputs out,lse --outputs lse",
        "replay " + g + " --candidate " + g + " --outputs out,out", "replay " + g + " --outputs dq,dkv,dq",
        "audit --backend reference --ops sparse_mla_fwd --only smla.forward_ratio --outputs lse,out,lse" + dump}) {
    const std::string out =
        expect_cli(cmd, 2, {"argument '--outputs' names \"", "\" twice", "expected each name once"});
    EXPECT_TRUE(lines_with(out, {"AGREES"}).empty()) << cmd << "\n" << out;
  }
  // Every other list flag follows the same rule (fresh11 F3c: --unsupported
  // invalid_ids,invalid_ids was accepted silently while --outputs out,out was an error).
  for (const auto& [cmd, flag] : std::vector<std::pair<std::string, std::string>>{
           {"fixtures check " + g + " --unsupported invalid_ids,invalid_ids", "--unsupported"},
           {"audit --backend reference --unsupported empty_rows --unsupported empty_rows" + dump, "--unsupported"},
           {"audit --backend reference --ops topk,sparse_mla_fwd,topk" + dump, "--ops"},
           {"audit --backend reference --only topk.contract_exact,topk.contract_exact" + dump, "--only"},
           {"compare --golden " + g + " --candidate " + g + " --convention lse_base2,lse_base2", "--convention"}})
    expect_cli(cmd, 2, {"argument '" + flag + "' names \"", "\" twice", "expected each name once"});
  // Each name once still runs.
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + g + " --outputs out,lse", &out), 0) << out;
}

// An op none of whose outputs --outputs names is judged in full, and its label is not partial:
// audit --ops topk,sparse_mla_fwd --outputs out,lse judges top-k in full (a top-k mutant fails,
// a correct plugin passes without "partial"), as the label says.
TEST(OutputsOption, AnOpWithNoNamedOutputIsJudgedInFullAndNotLabelledPartial) {
  Scratch dir("outputs_full");
  const std::string only = " --ops topk,sparse_mla_fwd --outputs out,lse --only topk.contract_exact --seed 5 --dump-dir ";
  std::string out;
  EXPECT_EQ(run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN + only + dir.file("a"), &out), 0) << out;
  EXPECT_TRUE(lines_with(out, {"indices not judged"}).empty()) << out;
  const std::string mutant = mutant_plugin_named("topk_zero_padding");
  ASSERT_FALSE(mutant.empty());
  EXPECT_EQ(run_cli_capture("audit --plugin " + mutant + only + dir.file("b"), &out), 1) << out;
  EXPECT_TRUE(lines_with(out, {"indices not judged"}).empty()) << out;
}

// On a fwd+bwd golden, --outputs dq,dkv judges the forward in full when the file holds it (a
// wrong out fails; the note says so) and lists it as not judged when the file holds none of it
// (a backward-only kernel).
TEST(OutputsOption, ForwardBesideNamedBackwardOutputs) {
  const std::string g = golden("smla_basic");
  const fixtures::Fixture f = fixtures::load_fixture(g);
  Scratch dir("outputs_fwd_bwd");
  std::map<std::string, Tensor> all, bwd;
  for (const char* n : {"out", "lse", "max_logits", "dq", "dkv"}) all.emplace(n, f.expected.at(n));
  for (const char* n : {"dq", "dkv"}) bwd.emplace(n, f.expected.at(n));
  test::write_outputs(dir.file("all.safetensors"), all);
  test::write_outputs(dir.file("bwd.safetensors"), bwd);
  std::string out;
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + dir.file("all.safetensors") + " --outputs dq,dkv", &out), 0)
      << out;
  EXPECT_FALSE(lines_with(out, {"judged in full: the provided outputs (dkv, dq) name none of sparse_mla_fwd's outputs"}).empty())
      << out;
  EXPECT_TRUE(lines_with(out, {"not judged"}).empty()) << out;
  EXPECT_FALSE(lines_with(out, {"compare: AGREES"}).empty()) << out;
  Tensor wrong = all.at("out");
  wrong.set(0, wrong.get(0) * 1.25 + 0.25);
  all["out"] = wrong;
  test::write_outputs(dir.file("wrong.safetensors"), all);
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + dir.file("wrong.safetensors") + " --outputs dq,dkv", &out), 1)
      << out;
  EXPECT_EQ(run_cli_capture("compare --golden " + g + " --candidate " + dir.file("bwd.safetensors") + " --outputs dq,dkv", &out), 0)
      << out;
  EXPECT_FALSE(lines_with(out, {"compare: AGREES (partial: out, lse, max_logits not judged)"}).empty()) << out;
  EXPECT_TRUE(lines_with(out, {"judged in full"}).empty()) << out;
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

// `audit --unsupported` (props::SuiteOptions::unsupported): a kernel that declines
// SPEC-mandatory cases (here every draw with an invalid id, SPEC §4, hence every empty row,
// §6) is INCOMPLETE, exit 1, unless the user names what it leaves out; then the same audit is
// not a failure and the report says which behaviour was not judged. Same seed both times.
TEST(UnsupportedOption, NamedMandatoryCasesAreReportedNotIncomplete) {
  Scratch dir("unsupported_option");
  const std::string audit = std::string("audit --plugin ") + DSA_DECLINES_INVALID_IDS_PLUGIN +
                            " --only smla.forward_ratio --seed 7 --json ";
  std::string plain, named;
  const int plain_rc = run_cli_capture(audit + dir.file("plain.json"), &plain);
  const int named_rc = run_cli_capture(audit + dir.file("named.json") + " --unsupported invalid_ids,empty_rows", &named);

  // Without it: INCOMPLETE, naming the declined behaviour and the flag that names it.
  EXPECT_EQ(plain_rc, 1) << plain;
  const nlohmann::json p = test::read_json(dir.file("plain.json"));
  ASSERT_EQ(p.at("cases").size(), 1u) << p.dump(1);
  const nlohmann::json& pc = p.at("cases").at(0);
  EXPECT_EQ(pc.value("status", ""), "fail");
  EXPECT_EQ(pc.value("message", "").rfind("INCOMPLETE: backend declined mandatory cases: ", 0), 0u) << pc.dump(1);
  EXPECT_NE(pc.value("message", "").find("invalid ids"), std::string::npos) << pc.dump(1);
  EXPECT_NE(pc.value("message", "").find("--unsupported empty_rows,invalid_ids"), std::string::npos) << pc.dump(1);
  // The plugin's own reason reaches the report (after its name, path and op).
  EXPECT_NE(pc.value("message", "").find("DSA_STATUS_UNSUPPORTED: invalid ids not supported"), std::string::npos)
      << pc.dump(1);
  EXPECT_EQ(p.at("summary").value("failed", -1), 1);

  // Named: no failure, nothing INCOMPLETE, and the report says what was not judged. Nearly
  // every draw holds an invalid id, so the property is a skip and the audit ran no case
  // (exit 2, as for any audit that judged nothing), never a pass.
  EXPECT_EQ(named_rc, 2) << named;
  EXPECT_EQ(named.find("INCOMPLETE"), std::string::npos) << named;
  const nlohmann::json n = test::read_json(dir.file("named.json"));
  ASSERT_EQ(n.at("cases").size(), 1u) << n.dump(1);
  const nlohmann::json& nc = n.at("cases").at(0);
  EXPECT_NE(nc.value("status", ""), "fail") << nc.dump(1);
  EXPECT_NE(nc.value("status", ""), "pass") << nc.dump(1);
  EXPECT_NE(nc.value("message", "").find("(not judged, named unsupported: empty_rows, invalid_ids)"), std::string::npos)
      << nc.dump(1);
  EXPECT_EQ(n.at("summary").value("failed", -1), 0);
  EXPECT_NE(named.find("named unsupported: empty_rows, invalid_ids"), std::string::npos) << named;

  // An unknown name is a usage error naming the flag.
  std::string bad;
  EXPECT_EQ(run_cli_capture(audit + dir.file("bad.json") + " --unsupported invalid_idz", &bad), 2) << bad;
  EXPECT_NE(bad.find("--unsupported: unknown entry \"invalid_idz\""), std::string::npos) << bad;
}

}  // namespace
}  // namespace dsa::cli
