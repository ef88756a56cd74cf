// A fixture case a backend declines (NotSupported although it runs the op: a plugin's
// DSA_STATUS_UNSUPPORTED, a Python NotImplementedError) is not a skip like an op it does not
// implement: a proven decline of a SPEC-mandatory case (ties at the k-th value, invalid ids,
// empty rows, ...) is INCOMPLETE, exit 1, on every fixture route (fixtures check, replay, the
// audit's fixture tasks, which the Python audit runs too), as the property suite does with a
// declined draw (DeclinedDraws.*). Before, each of these was a skip and the check exited 0.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "audit_tasks.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/reference_backend.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::golden;
using test::lines_with;
using test::run_cli_capture;

const std::string kPlugin = DSA_DECLINES_INVALID_IDS_PLUGIN;  // declines every case with an invalid id
// declines sparse MLA whenever indices[0,0] == 0, top-k whenever scores[0,0] > 0, KL any -inf
const std::string kByValuePlugin = DSA_DECLINES_BY_VALUE_PLUGIN;

// The plugin declines invalid ids (SPEC §4: mandatory) and runs the case's twin without them:
// INCOMPLETE through fixtures check and replay, naming the case and the plugin's reason.
TEST(DeclinedFixtures, DecliningInvalidIdsIsIncompleteThroughThePlugin) {
  for (const char* name : {"smla_invalid_mix", "smla_leading_padding"}) {
    SCOPED_TRACE(name);
    const std::string file = golden(name);
    std::string out;
    EXPECT_EQ(run_cli_capture("fixtures check " + file + " --plugin " + kPlugin, &out), 1) << out;
    // One row per op (the op column is padded; the backward's reason names the forward it ran).
    EXPECT_EQ(lines_with(out, {"sparse_mla_fwd   ", "plugin:", "INCOMPLETE: declined:", "invalid ids not supported"}).size(),
              1u) << out;
    EXPECT_EQ(lines_with(out, {"sparse_mla_bwd   ", "plugin:", "INCOMPLETE: declined:"}).size(), 1u) << out;
    EXPECT_FALSE(lines_with(out, {"INCOMPLETE: backend declined a SPEC-mandatory case: " + file + " holds invalid ids"})
                     .empty()) << out;
    EXPECT_TRUE(lines_with(out, {"plugin:", "skip"}).empty()) << out;
    // the summary counts them as INCOMPLETE, not as disagreements (fresh11 F3a)
    EXPECT_EQ(lines_with(out, {"fixtures: ", " 0 disagree, 0 WEAK, 2 INCOMPLETE, "}).size(), 1u) << out;

    EXPECT_EQ(run_cli_capture("replay " + file + " --plugin " + kPlugin, &out), 1) << out;
    EXPECT_FALSE(lines_with(out, {"replay: INCOMPLETE"}).empty()) << out;
    EXPECT_FALSE(lines_with(out, {"--unsupported invalid_ids"}).empty()) << out;

    // Named unsupported: a skip saying so; the producer still agrees (exit 0).
    EXPECT_EQ(run_cli_capture("fixtures check " + file + " --plugin " + kPlugin +
                                  " --unsupported invalid_ids,empty_rows,duplicate_ids", &out), 0) << out;
    EXPECT_FALSE(lines_with(out, {"sparse_mla_fwd   ", "plugin:", "skip: declined:", "named unsupported: invalid_ids"})
                     .empty()) << out;
    // no INCOMPLETE row: the summary's count is the one line naming it
    EXPECT_EQ(lines_with(out, {"INCOMPLETE"}).size(), 1u) << out;
    EXPECT_EQ(lines_with(out, {"fixtures: ", " 0 INCOMPLETE, "}).size(), 1u) << out;
  }
  // Empty rows are written with invalid slots (-1 ids or topk_length), so naming invalid_ids
  // covers them: a kernel that takes no invalid id is never handed such a row (fresh11 F3b:
  // these goldens stayed INCOMPLETE as "empty rows"). Duplicates are not covered by it.
  std::string out;
  for (const char* name : {"smla_empty_rows", "smla_sink", "smla_leading_padding", "smla_topk_length"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(run_cli_capture("fixtures check " + golden(name) + " --plugin " + kPlugin + " --unsupported invalid_ids",
                              &out), 0) << out;
    EXPECT_FALSE(lines_with(out, {"sparse_mla_fwd   ", "plugin:", "skip: declined:", "named unsupported: invalid_ids"})
                     .empty()) << out;
    EXPECT_EQ(lines_with(out, {"fixtures: ", " 0 INCOMPLETE, "}).size(), 1u) << out;
  }
  // It repeats ids too, but the plugin runs its twin without the invalid ids alone (the repeats
  // kept): the decline is about invalid ids only, so naming them makes it a skip (fresh-user F6:
  // one twin per feature; before, the twin without every feature blamed the repeats as well).
  // A kernel that declines repeats is INCOMPLETE for them (TwinDeclines.SparseMla...).
  EXPECT_EQ(run_cli_capture("fixtures check " + golden("smla_extreme_row_in_batch") + " --plugin " + kPlugin +
                                " --unsupported invalid_ids", &out), 0) << out;
  EXPECT_FALSE(lines_with(out, {"sparse_mla_fwd   ", "plugin:", "skip: declined:", "named unsupported: invalid_ids"})
                   .empty()) << out;
  EXPECT_TRUE(lines_with(out, {"--unsupported duplicate_ids"}).empty()) << out;
  // A case without invalid ids is judged (agree), and an unknown --unsupported entry is a
  // usage error naming the flag.
  EXPECT_EQ(run_cli_capture("fixtures check " + golden("smla_basic") + " --plugin " + kPlugin, &out), 0) << out;
  EXPECT_FALSE(lines_with(out, {"sparse_mla_fwd", "plugin:", "agree"}).empty()) << out;
  EXPECT_EQ(run_cli_capture("fixtures check " + golden("smla_basic") + " --unsupported invalid_idz", &out), 2) << out;
  EXPECT_NE(out.find("--unsupported: unknown entry \"invalid_idz\""), std::string::npos) << out;
}

// True when some row holds more selectable entries equal to its k_eff-th largest value than
// slots left for them (SPEC §3.3: the tie fill).
bool boundary_tie(const Tensor& scores, int64_t k, const std::optional<KeyWindows>& win) {
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<double> v;
    for (int64_t s = 0; s < s_kv; ++s) {
      const double x = scores.get(t * s_kv + s);
      if ((!win || win->contains(t, s)) && !std::isnan(x) && x != -INFINITY) v.push_back(x);
    }
    const int64_t n = static_cast<int64_t>(v.size()), k_eff = std::min(k, n);
    if (k_eff == 0 || k_eff == n) continue;
    std::sort(v.begin(), v.end(), std::greater<double>());
    if (v[static_cast<size_t>(k_eff)] == v[static_cast<size_t>(k_eff - 1)]) return true;
  }
  return false;
}

// The reference's top-k, declining as `kMode` says: 0 ties at the k-th value (SPEC §3.3,
// mandatory), 1 every call (a top-k it cannot run at run time), 2 a declared limit, 4 any -inf
// score, inside or outside the windows (SPEC §3.1, §2; fresh12 F8); 3 declines nothing.
template <int kMode>
class TopkDecliner final : public oracle::Backend {
 public:
  std::string name() const override { return "topk_decliner_" + std::to_string(kMode); }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (kMode == 0 && boundary_tie(s, k, w)) throw oracle::NotSupported("ties at the k-th value not supported");
    if (kMode == 1) throw oracle::NotSupported("no top-k on this device today");
    if (kMode == 2) throw oracle::NotSupported("plugin:x topk: tie_break small not declared");
    if (kMode == 4)
      for (int64_t i = 0; i < s.numel(); ++i)
        if (s.get(i) == -INFINITY) throw oracle::NotSupported("-inf scores not supported");
    return ref_->select_topk(s, k, p, w);
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

// The audit's fixture task (the code `dsa-verify audit` and the Python audit run): the one
// case of the top-k golden `name` (default a plateau), judged on `b` with `unsupported`.
CaseResult fixture_case(oracle::Backend& b, const std::vector<std::string>& unsupported,
                        const std::string& name = "topk_plateau_small_sorted") {
  Scratch dir("declined_task");
  std::filesystem::copy_file(golden(name), dir.file(name + ".safetensors"));
  AuditOptions opts;
  opts.unsupported = unsupported;
  ReproCommands repro;
  repro.audit = "dsa-verify audit --backend x";
  repro.replay = [](const std::string& f) { return "dsa-verify replay " + f; };
  std::vector<AuditTask> tasks;
  add_fixture_tasks(tasks, dir.file(""), "golden", b, opts, repro);
  EXPECT_EQ(tasks.size(), 1u);
  if (tasks.size() != 1) return CaseResult{};
  const std::vector<CaseResult> cases = tasks[0].run();
  EXPECT_EQ(cases.size(), 1u);
  return cases.empty() ? CaseResult{} : cases[0];
}

TEST(DeclinedFixtures, DecliningTiesAtTheKthValueIsIncompleteInTheAudit) {
  TopkDecliner<0> ties;
  const CaseResult c = fixture_case(ties, {});
  EXPECT_EQ(c.status, "fail") << c.message;
  EXPECT_EQ(c.message.rfind("INCOMPLETE: backend declined a SPEC-mandatory case: ", 0), 0u) << c.message;
  EXPECT_NE(c.message.find("topk_plateau_small_sorted.safetensors holds ties at the k-th value"), std::string::npos)
      << c.message;
  EXPECT_NE(c.message.find("ties at the k-th value not supported"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("--unsupported k_boundary_ties"), std::string::npos) << c.message;

  const CaseResult named = fixture_case(ties, {"k_boundary_ties"});
  EXPECT_EQ(named.status, "skip") << named.message;
  EXPECT_NE(named.message.find("named unsupported: k_boundary_ties"), std::string::npos) << named.message;
}

// Declines that are not shown to be about a mandatory feature stay skips, each saying why:
// the twin without ties is declined too (a limit of the kernel), or a limit declared up front.
TEST(DeclinedFixtures, DeclinesNotAboutAMandatoryFeatureAreSkipsSayingSo) {
  TopkDecliner<1> every;
  const CaseResult c = fixture_case(every, {});
  EXPECT_EQ(c.status, "skip") << c.message;
  EXPECT_NE(c.message.find("declined: no top-k on this device today"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("declined its twin without them too"), std::string::npos) << c.message;

  TopkDecliner<2> declared;
  const CaseResult d = fixture_case(declared, {});
  EXPECT_EQ(d.status, "skip") << d.message;
  EXPECT_NE(d.message.find("a limit the backend declares up front"), std::string::npos) << d.message;

  TopkDecliner<3> runs;  // declines nothing: the plateau is judged
  EXPECT_EQ(fixture_case(runs, {}).status, "pass");
}

// fresh12 F8: a top-k that declines every case holding a -inf score is INCOMPLETE on
// topk_distinct_causal, whose -inf lie outside its windows only (SPEC §2 writes -inf there; §3.1:
// never selected): in process (the audit's fixture task, which the Python audit runs), through
// a plugin (fixtures check) and in the CLI audit of an in-process backend. Before, the case held
// "no SPEC-mandatory feature" (-inf was counted inside the windows only) and each was a skip.
// Named with --unsupported neg_inf_scores, it is a skip saying so, never an agree.
TEST(DeclinedFixtures, DecliningNegInfScoresIsIncompleteOnEveryRoute) {
  TopkDecliner<4> ninf;
  const CaseResult c = fixture_case(ninf, {}, "topk_distinct_causal");
  EXPECT_EQ(c.status, "fail") << c.message;
  EXPECT_EQ(c.message.rfind("INCOMPLETE: backend declined a SPEC-mandatory case: ", 0), 0u) << c.message;
  EXPECT_NE(c.message.find("topk_distinct_causal.safetensors holds -inf scores"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("-inf scores not supported"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("--unsupported neg_inf_scores"), std::string::npos) << c.message;
  const CaseResult named = fixture_case(ninf, {"neg_inf_scores"}, "topk_distinct_causal");
  EXPECT_EQ(named.status, "skip") << named.message;
  EXPECT_NE(named.message.find("named unsupported: neg_inf_scores"), std::string::npos) << named.message;

  // The plugin (dsa_declines_invalid_ids_plugin's top-k declines any -inf).
  const std::string file = golden("topk_distinct_causal");
  std::string out;
  EXPECT_EQ(run_cli_capture("fixtures check " + file + " --plugin " + kPlugin, &out), 1) << out;
  EXPECT_EQ(lines_with(out, {"topk   ", "plugin:", "INCOMPLETE: declined:", "-inf scores not supported"}).size(), 1u)
      << out;
  EXPECT_FALSE(lines_with(out, {"--unsupported neg_inf_scores"}).empty()) << out;
  EXPECT_EQ(lines_with(out, {"fixtures: ", " 1 INCOMPLETE, "}).size(), 1u) << out;
  EXPECT_EQ(
      run_cli_capture("fixtures check " + file + " --plugin " + kPlugin + " --unsupported neg_inf_scores", &out), 0)
      << out;
  EXPECT_FALSE(lines_with(out, {"topk   ", "plugin:", "skip: declined:", "named unsupported: neg_inf_scores"}).empty())
      << out;
  EXPECT_TRUE(lines_with(out, {"topk   ", "plugin:", "agree"}).empty()) << out;

  // The CLI audit of an in-process backend (tests/test_backends.cpp): the golden is INCOMPLETE;
  // named, it is a skip, and a property that passed without the declined draws says partial.
  Scratch dir("declined_neg_inf_audit");
  for (const bool named_flag : {false, true}) {
    SCOPED_TRACE(named_flag ? "--unsupported neg_inf_scores" : "plain");
    const std::string json = dir.file(named_flag ? "named.json" : "plain.json");
    const std::string cmd = std::string(DSA_VERIFY_TEST_BACKENDS) + " audit --backend test:declines-neg-inf --ops topk"
                            " --seed 7 --dump-dir " + dir.file("d") + " --json " + json +
                            (named_flag ? " --unsupported neg_inf_scores" : "") + " > " + dir.file("out.txt") + " 2>&1";
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << test::read_text(dir.file("out.txt"));
    // Named: no failure. The long- and many-row draws hold NaN beside the -inf: each decline is
    // laid to -inf alone by its own twin (fresh-user F6: they stayed INCOMPLETE as NaN, exit 1).
    EXPECT_EQ(WEXITSTATUS(status), named_flag ? 0 : 1) << test::read_text(dir.file("out.txt"));
    const nlohmann::json j = test::read_json(json);
    bool golden_seen = false;
    size_t partial = 0;
    for (const auto& k : j.at("cases")) {
      const std::string prop = k.value("property", ""), st = k.value("status", ""), msg = k.value("message", "");
      if (prop == "golden:topk_distinct_causal") {
        golden_seen = true;
        EXPECT_EQ(st, named_flag ? "skip" : "fail") << k.dump(1);
        EXPECT_NE(msg.find(named_flag ? "named unsupported: neg_inf_scores" : "holds -inf scores"), std::string::npos)
            << k.dump(1);
      }
      if (named_flag) {
        EXPECT_NE(st, "fail") << k.dump(1);
        EXPECT_EQ(msg.find("NaN scores"), std::string::npos) << k.dump(1);
      }
      // never a plain pass over declined draws the user named
      if (st == "pass" && msg.find("named unsupported: neg_inf_scores") != std::string::npos) {
        EXPECT_TRUE(k.value("partial", false)) << k.dump(1);
        EXPECT_NE(k.at("not_judged").dump().find("neg_inf_scores cases"), std::string::npos) << k.dump(1);
        ++partial;
      }
    }
    EXPECT_TRUE(golden_seen) << j.dump(1);
    if (named_flag) {
      EXPECT_GE(partial, 1u) << j.dump(1);
    }
  }
}

// fresh11 F2: a plugin declining by value (sparse MLA whenever indices[0,0] == 0, as
// smla_causal_topk's; top-k whenever scores[0,0] > 0, as topk_mtp's) declined every twin that
// only takes a feature out (they keep those values), so `fixtures check` and `replay` exited 0
// with skips. The twin with other values that keeps every feature (ids relabelled, query rows
// reversed; window entries reversed, scores replaced by ranks) runs: INCOMPLETE, exit 1, also
// with every feature named. Its KL loss declines any -inf score (SPEC §7, every KL golden holds
// some): INCOMPLETE for neg_inf_scores, a skip when named. A case it takes is judged (agree).
TEST(DeclinedFixtures, DecliningByValueIsIncompleteThroughThePlugin) {
  std::string out;
  for (const char* flags : {"", " --unsupported invalid_ids,empty_rows,duplicate_ids"}) {
    SCOPED_TRACE(flags);
    const std::string file = golden("smla_causal_topk");
    EXPECT_EQ(run_cli_capture("fixtures check " + file + " --plugin " + kByValuePlugin + flags, &out), 1) << out;
    EXPECT_EQ(lines_with(out, {"sparse_mla_fwd   ", "plugin:", "INCOMPLETE: declined:", "indices[0,0] == 0"}).size(),
              1u) << out;
    EXPECT_EQ(lines_with(out, {"sparse_mla_bwd   ", "plugin:", "INCOMPLETE: declined:"}).size(), 1u) << out;
    EXPECT_GE(lines_with(out, {"the decline depends on the values"}).size(), 1u) << out;
    EXPECT_TRUE(lines_with(out, {"plugin:", "skip"}).empty()) << out;
    if (*flags) continue;  // replay takes no --unsupported
    EXPECT_EQ(run_cli_capture("replay " + file + " --plugin " + kByValuePlugin, &out), 1) << out;
    EXPECT_FALSE(lines_with(out, {"replay: INCOMPLETE"}).empty()) << out;
  }
  for (const char* flags : {"", " --unsupported neg_inf_scores,nan_scores,k_boundary_ties"}) {
    SCOPED_TRACE(flags);
    EXPECT_EQ(run_cli_capture("fixtures check " + golden("topk_mtp") + " --plugin " + kByValuePlugin + flags, &out), 1)
        << out;
    EXPECT_EQ(lines_with(out, {"topk   ", "plugin:", "INCOMPLETE: declined:", "scores[0,0] > 0"}).size(), 1u) << out;
    EXPECT_GE(lines_with(out, {"the decline depends on the values"}).size(), 1u) << out;
  }
  const std::string kl = golden("kl_dense_causal");
  EXPECT_EQ(run_cli_capture("fixtures check " + kl + " --plugin " + kByValuePlugin, &out), 1) << out;
  EXPECT_EQ(lines_with(out, {"indexer_kl_loss   ", "plugin:", "INCOMPLETE: declined:", "-inf scores not supported"})
                .size(), 1u) << out;
  EXPECT_FALSE(lines_with(out, {"--unsupported neg_inf_scores"}).empty()) << out;
  EXPECT_EQ(run_cli_capture("fixtures check " + kl + " --plugin " + kByValuePlugin + " --unsupported neg_inf_scores",
                            &out), 0) << out;
  EXPECT_FALSE(lines_with(out, {"indexer_kl_loss   ", "plugin:", "skip: declined:", "named unsupported: neg_inf_scores"})
                   .empty()) << out;
  // Cases it takes are judged: smla_basic (indices[0,0] = 33), topk_distinct_causal (-4.25).
  for (const char* name : {"smla_basic", "topk_distinct_causal"}) {
    EXPECT_EQ(run_cli_capture("fixtures check " + golden(name) + " --plugin " + kByValuePlugin, &out), 0) << out;
    EXPECT_FALSE(lines_with(out, {"plugin:", "agree"}).empty()) << out;
  }
}

}  // namespace
}  // namespace dsa::cli
