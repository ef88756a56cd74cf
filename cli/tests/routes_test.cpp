// One judgement on every route (issue 12 item 4, SPEC §9): identical candidate outputs fed
// through check_op in process, the plugin path, `dsa-verify compare`, `fixtures check` (the
// outputs stored as expected.*) and `replay --candidate` give identical verdicts and bounds
// per output. Label golden.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsa/contract/errors.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "bf16_out_kernel.h"
#include "flash_bwd_f32.h"
#include "fp8_rounding_kernels.h"
#include "dsa/property_tests/suite.h"
#include "judge.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::run_cli;

// The outputs of `b` on every op of `f`, named as in a candidate file.
std::map<std::string, Tensor> outputs_of(oracle::Backend& b, const fixtures::Fixture& f) {
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  std::map<std::string, Tensor> out;
  for (oracle::Op op : oracle::fixture_ops(f)) {
    switch (op) {
      case oracle::Op::IndexerScores:
        out["scores"] = b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
        break;
      case oracle::Op::IndexerScoresBackward: {
        const IndexerGrads g = b.indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
        out["dq_idx"] = g.dq_idx;
        out["dk_idx"] = g.dk_idx;
        out["dw"] = g.dw;
        break;
      }
      case oracle::Op::Topk:
        out["indices"] = b.select_topk(c.scores, c.k, c.policy, c.topk_windows);
        break;
      case oracle::Op::SparseMlaFwd: {
        const SparseMlaForward fwd = b.sparse_mla_forward(c.mla);
        out["out"] = fwd.out;
        out["lse"] = fwd.lse;
        out["max_logits"] = fwd.max_logits;
        break;
      }
      case oracle::Op::SparseMlaBwd: {
        const SparseMlaGrads g = b.sparse_mla_backward(c.mla, c.dout);
        out["dq"] = g.dq;
        out["dkv"] = g.dkv;
        if (g.dsink) out["dsink"] = *g.dsink;
        break;
      }
      case oracle::Op::IndexerKlLoss: {
        const IndexerKlResult r = b.indexer_kl_loss(c.kl);
        out["loss"] = r.loss;
        out["d_scores"] = r.d_scores;
        break;
      }
      case oracle::Op::Fp8IndexerScores:  // SPEC §10
        out["scores"] = b.fp8_indexer_scores(c.fp8_indexer);
        break;
      case oracle::Op::PagedIndexerScores:
        out["scores"] = b.paged_indexer_scores(c.paged_indexer);
        break;
      case oracle::Op::SparseMlaFp8Fwd: {
        const SparseMlaForward fwd = b.sparse_mla_fp8_forward(c.mla_fp8);
        out["out"] = fwd.out;
        out["lse"] = fwd.lse;
        out["max_logits"] = fwd.max_logits;
        break;
      }
    }
  }
  return out;
}

// What must be identical between routes: per op the verdict and not-judged outputs, per
// output its verdict, bound, error and baseline (numbers compared exactly).
nlohmann::json judged_part(const nlohmann::json& reports) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& op : reports.at("ops")) {
    nlohmann::json o = {{"op", op.at("op")}, {"verdict", op.at("verdict")}, {"not_judged", op.at("not_judged")}};
    for (const auto& t : op.at("outputs"))
      o["outputs"].push_back({{"name", t.at("name")}, {"passed", t.at("passed")}, {"bound", t.at("bound")},
                              {"max_abs", t.at("max_abs")}, {"baseline_err", t.at("baseline_err")},
                              {"floor", t.at("floor")}});
    out.push_back(o);
  }
  return out;
}

// The rounding model each route judged out with (reports_json's per-output flags), per op.
nlohmann::json rounding_part(const nlohmann::json& reports) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& op : reports.at("ops"))
    for (const auto& t : op.at("outputs"))
      out.push_back({{"op", op.at("op")}, {"name", t.at("name")}, {"normalized_p", t.at("normalized_p")},
                     {"sink_after_rounding", t.at("sink_after_rounding")}});
  return out;
}

// A golden fixture and a mutant kernel of its ops (property_tests/mutants); "" = the
// correct reference.
struct RouteCase {
  std::string golden, mutant;
};

// Feeds the outputs of `in_process` on `golden_name` through every route: check_op in
// process, the plugin at `plugin_path` (the same kernel through the ABI; "": a kernel with no
// plugin build, that route is left out), `compare` and
// `replay --candidate` (a candidate file), `fixtures check` (the outputs stored as expected.*).
// Expects identical verdicts and bounds per output, verdict AGREES (or DISAGREES when
// `faulty`) and exit codes to match. `judge`: the rounding flags every route is given (in process
// CheckOptions, the CLI's --normalized-p / --sink-after-rounding); with `plugin_declares_rounding`
// the plugin route gets none and its capabilities (rounding_models) must declare the same.
// Returns the in-process reports' JSON.
nlohmann::json expect_same_on_every_route(const std::string& scratch, const std::string& golden_name,
                                          oracle::Backend& in_process, const std::string& plugin_path,
                                          bool faulty, const JudgeOptions& judge = {},
                                          bool plugin_declares_rounding = false) {
  Scratch dir(scratch);
  const std::string golden = std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + golden_name + ".safetensors";
  const fixtures::Fixture f = fixtures::load_fixture(golden);
  oracle::CheckOptions opt = check_options(judge, /*file_route=*/true);
  const std::string flags = rounding_flags(rounding_flags_of(judge));
  oracle::CheckOptions plugin_opt = opt;
  if (plugin_declares_rounding) plugin_opt.rounding = {};
  const nlohmann::json a = reports_json(oracle::judge_fixture_ops(f, in_process, opt));
  const nlohmann::json b = plugin_path.empty()
                               ? a
                               : reports_json(oracle::judge_fixture_ops(f, *plugin::load_plugin(plugin_path), plugin_opt));

  // The same outputs stored: a candidate file (compare, replay) and expected.* (fixtures check).
  const auto outputs = outputs_of(in_process, f);
  const std::string cand = dir.file("candidate.safetensors");
  test::write_outputs(cand, outputs);
  fixtures::Fixture as_expected = f;
  as_expected.expected = outputs;
  const std::string stored = dir.file("stored.safetensors");
  fixtures::save_fixture(stored, as_expected);

  const int compare_rc = run_cli("compare --golden " + golden + " --candidate " + cand + " --json " +
                                 dir.file("compare.json") + flags);
  const int replay_rc =
      run_cli("replay " + golden + " --candidate " + cand + " --json " + dir.file("replay.json") + flags);
  const int check_rc =
      run_cli("fixtures check " + stored + " --backend reference --json " + dir.file("check.json") + flags);
  const nlohmann::json c = test::read_json(dir.file("compare.json"));
  const nlohmann::json e = test::read_json(dir.file("replay.json"));
  const nlohmann::json d = test::read_json(dir.file("check.json")).at("files").at(0).at("producer");

  const nlohmann::json want = judged_part(a);
  EXPECT_EQ(want.size(), oracle::fixture_ops(f).size());
  EXPECT_EQ(judged_part(b), want) << "plugin path";
  EXPECT_EQ(judged_part(c), want) << "compare";
  EXPECT_EQ(judged_part(d), want) << "fixtures check";
  EXPECT_EQ(judged_part(e), want) << "replay";
  for (const auto* j : {&b, &c, &d, &e}) EXPECT_EQ(rounding_part(*j), rounding_part(a)) << j->dump(1);
  EXPECT_EQ(a.at("verdict"), faulty ? "DISAGREES" : "AGREES");
  for (const auto* j : {&b, &c, &d, &e}) EXPECT_EQ(j->at("verdict"), a.at("verdict"));
  const int want_rc = faulty ? 1 : 0;
  EXPECT_EQ(compare_rc, want_rc);
  EXPECT_EQ(replay_rc, want_rc);
  EXPECT_EQ(check_rc, want_rc);
  // Every route says where the backward baseline took Δ from, in the same words.
  auto delta_notes = [](const nlohmann::json& j) {
    std::vector<std::string> n;
    for (const auto& op : j.at("ops"))
      for (const auto& line : op.at("notes"))
        if (line.get<std::string>().find("Δ") != std::string::npos) n.push_back(line.get<std::string>());
    return n;
  };
  for (const auto* j : {&b, &c, &d, &e}) EXPECT_EQ(delta_notes(*j), delta_notes(a)) << j->dump(1);
  // and gives the same reasons (a failure's first words, a skip's why)
  auto reasons = [](const nlohmann::json& j) {
    std::vector<std::string> r;
    for (const auto& op : j.at("ops")) r.push_back(op.at("reason").get<std::string>());
    return r;
  };
  for (const auto* j : {&b, &c, &d, &e}) EXPECT_EQ(reasons(*j), reasons(a)) << j->dump(1);
  return a;
}

class RouteIdentity : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteIdentity, EveryRouteGivesTheSameVerdictsAndBounds) {
  const bool faulty = !GetParam().mutant.empty();
  // The same kernel in process and through the plugin ABI.
  std::unique_ptr<oracle::Backend> in_process;
  std::string plugin_path;
  if (faulty) {
    for (size_t i = 0; i < props::mutant_subjects().size(); ++i)
      if (props::mutant_subjects()[i].name == GetParam().mutant) {
        in_process = props::mutant_subjects()[i].make();
        plugin_path = test::mutant_plugin(i);
      }
    ASSERT_TRUE(in_process) << "mutant " << GetParam().mutant << " not found";
    ASSERT_FALSE(plugin_path.empty()) << "no plugin build of " << GetParam().mutant;
  } else {
    in_process = oracle::make_reference_backend();
    plugin_path = DSA_REFERENCE_PLUGIN;
  }
  expect_same_on_every_route("route_identity_" + GetParam().golden + "_" + (faulty ? GetParam().mutant : "correct"),
                             GetParam().golden, *in_process, plugin_path, faulty);
}

// A correct and a faulty kernel on a sparse MLA (fwd+bwd, sink), an indexer (fwd+bwd) and a
// KL-loss golden: the faults are a base-2 lse, bf16 accumulation, an unnormalised teacher.
INSTANTIATE_TEST_SUITE_P(Outputs, RouteIdentity,
                         ::testing::Values(RouteCase{"smla_sink", ""}, RouteCase{"smla_sink", "smla_base2_lse"},
                                           RouteCase{"idx_causal", ""},
                                           RouteCase{"idx_causal", "indexer_bf16_accumulation"},
                                           RouteCase{"kl_dense_causal", ""},
                                           RouteCase{"kl_dense_causal", "kl_unnormalised_teacher"}),
                         [](const ::testing::TestParamInfo<RouteCase>& i) {
                           return i.param.golden + "_" + (i.param.mutant.empty() ? "correct" : i.param.mutant);
                         });

// Issue 12 item 7 (F5): a correct FlashAttention-style bf16 kernel (P rounded to bf16 before
// P·V, so its bf16 out differs from the baseline's) whose backward takes Δ from that out
// (SPEC §5) gets the same verdict, AGREES, and the same bounds on every route: each hands the
// backward check the candidate's own out (its forward in process and through the plugin, the
// stored out of the candidate file and of the fixture), judged by the forward's rule first.
TEST(RouteIdentity, Bf16OutTakingDeltaFromItsOwnOutIsJudgedAlikeOnEveryRoute) {
  dsa::test::Bf16FlashStyleKernel k;
  const fixtures::Fixture f = fixtures::load_fixture(test::golden("smla_sink"));
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  const Tensor own = k.sparse_mla_forward(c.mla).out;
  ASSERT_EQ(own.dtype(), DType::BF16);
  ASSERT_FALSE(oracle::bitwise_equal(own, reference::sparse_mla_forward(c.mla).out.to(DType::BF16)))
      << "the kernel's out must differ from round-to-nearest, or the case shows nothing";
  const nlohmann::json a =
      expect_same_on_every_route("route_identity_bf16_flash_style", "smla_sink", k, DSA_BF16_OUT_PLUGIN, false);
  nlohmann::json bwd;
  for (const auto& op : a.at("ops"))
    if (op.at("op") == "sparse_mla_bwd") bwd = op;
  ASSERT_FALSE(bwd.is_null()) << a.dump(1);
  bool own_delta = false;
  for (const auto& n : bwd.at("notes"))
    own_delta |= n.get<std::string>().find("baseline takes Δ from the candidate's own BF16 out") != std::string::npos;
  EXPECT_TRUE(own_delta) << bwd.dump(1);
  // The out moved the baseline: without it (Δ from the baseline's own out rounded to bf16) the
  // same gradients are judged against other baseline errors.
  const SparseMlaGrads g = k.sparse_mla_backward(c.mla, c.dout);
  const oracle::NamedOutputs grads = {{"dq", g.dq}, {"dkv", g.dkv}, {"dsink", *g.dsink}};
  const nlohmann::json without = reports_json({oracle::judge_outputs(oracle::Op::SparseMlaBwd, c, grads)});
  EXPECT_NE(judged_part(without).at(0).at("outputs"), judged_part(nlohmann::json{{"ops", {bwd}}}).at(0).at("outputs"));
}

// The same kernel as a plugin passes the audit's sparse MLA properties, the many-row draws
// included (fresh-user finding 8 item 4): before, it moved every bf16 out element within 1/32 ulp
// of a rounding midpoint to the farther neighbour, which no correct fp32 kernel does, and
// smla.many_rows failed at 1.04x the out bound on seeds 1-5. A correct kernel of any precision
// must pass; about 3 s.
TEST(RouteIdentity, Bf16FlashStylePluginPassesTheAudit) {
  Scratch dir("bf16_flash_style_audit");
  std::string out;
  EXPECT_EQ(test::run_cli_capture(std::string("audit --plugin ") + DSA_BF16_OUT_PLUGIN +
                                      " --only smla.many_rows,smla.forward_ratio,smla.backward_parity --level 0"
                                      " --seed 1 --dump-dir " + dir.file("d"),
                                  &out),
            0)
      << out;
  EXPECT_FALSE(test::lines_with(out, {"audit: 3 passed, 0 failed, 0 skipped"}).empty()) << out;
}

// Declaring a rounding model loosens no passing property into a failure (fresh11 F7): with
// θ = 1e-2 on the declared bound, ordinary generated rows went WEAK (1.007-1.13e-2 of the row
// scale) and the example plugin went from 25 passed to 16 passed, 9 failed under
// --sink-after-rounding; the declared models' own θ (theta_declared_rounding16, 2e-2) keeps every
// sparse MLA forward property passing, without WEAK rows. Since 45d6629 a declaration is also
// checked: the example plugin does not round the declared way, so exactly the model's exact tier
// fails (exit 1), naming the declaration; every other property still passes.
TEST(RouteIdentity, DeclaredRoundingModelsKeepAPassingPluginPassing) {
  Scratch dir("declared_models_audit");
  for (const auto& [flag, tier] : {std::pair<const char*, const char*>{"--sink-after-rounding",
                                                                       "smla.sink_after_rounding_exact_tier"},
                                   {"--normalized-p", "smla.normalized_p_exact_tier"}}) {
    std::string out;
    EXPECT_EQ(test::run_cli_capture(std::string("audit --plugin ") + DSA_EXAMPLE_PLUGIN + " " + flag +
                                        " --ops sparse_mla_fwd --level 0 --seed 1 --dump-dir " +
                                        dir.file("d"),
                                    &out),
              1)
        << flag << "\n" << out;
    EXPECT_TRUE(test::lines_with(out, {"WEAK"}).empty()) << flag << "\n" << out;
    const auto failed = test::lines_with(out, {"] fail "});
    ASSERT_FALSE(failed.empty()) << flag << "\n" << out;
    for (const auto& line : failed) EXPECT_NE(line.find(tier), std::string::npos) << line;
    EXPECT_NE(out.find(" passed, 1 failed, "), std::string::npos) << out;
    EXPECT_NE(out.find("not followed on its exact tier"), std::string::npos) << out;
  }
}

// Every judging route names the rounding models it judges with, as the audit does: a flag given
// to compare, replay or fixtures check prints "rounding models of <who>: normalized_p
// (--normalized-p)" and is in the JSON report (rounding_models[0].<model>.judged). Before, only
// the audit said so; the other routes judged with the model silently.
TEST(RouteIdentity, EveryRouteNamesTheRoundingModelsItJudgesWith) {
  Scratch dir("rounding_line_routes");
  const std::string g = test::golden("smla_sink");
  struct Route {
    std::string args, who;
  } routes[] = {{"compare --golden " + g + " --candidate " + g, "rounding models of candidate " + g + ": "},
                {"replay " + g + " --backend reference", "rounding models of reference: "},
                {"fixtures check " + g + " --backend reference", "rounding models of reference: "}};
  for (const auto& r : routes) {
    for (const char* flag : {"", " --normalized-p", " --sink-after-rounding"}) {
      const std::string json = dir.file("r.json");
      std::string out;
      EXPECT_EQ(test::run_cli_capture(r.args + flag + " --json " + json, &out), 0) << r.args << flag << "\n" << out;
      const nlohmann::json j = test::read_json(json);
      ASSERT_TRUE(j.contains("rounding_models")) << r.args << "\n" << j.dump(1).substr(0, 2000);
      const nlohmann::json& m = j.at("rounding_models").at(0);
      const bool p = std::string(flag) == " --normalized-p", sink = std::string(flag) == " --sink-after-rounding";
      EXPECT_EQ(m.at("normalized_p").at("judged").get<bool>(), p) << r.args << flag << "\n" << m.dump(1);
      EXPECT_EQ(m.at("sink_after_rounding").at("judged").get<bool>(), sink) << r.args << flag << "\n" << m.dump(1);
      const auto lines = test::lines_with(out, {"rounding models of"});
      if (!p && !sink) {
        EXPECT_TRUE(lines.empty()) << r.args << "\n" << out;
        continue;
      }
      const std::string want = r.who + (p ? "normalized_p (--normalized-p)" : "sink_after_rounding (--sink-after-rounding)");
      ASSERT_EQ(lines.size(), 1u) << r.args << flag << "\n" << out;
      EXPECT_EQ(lines[0], want) << r.args << flag;
    }
  }
}

// The declared rounding models on the FP8 sparse MLA forward (SPEC §9, §10): a kernel that
// rounds the normalized softmax(P) to bf16 before P·V (the max key's p too), and one that
// applies attn_sink after rounding out, on a few-key power-of-two case built in memory
// (oracle/tests/fp8_rounding_kernels.h). Undeclared, `compare` fails and names the flag;
// declared (--normalized-p, --sink-after-rounding), in process, `compare` and `replay` of a
// candidate file and `fixtures check` of the outputs stored as expected.* give the same
// verdict (AGREES), bounds and declaration per output.
TEST(RouteIdentity, Fp8DeclaredRoundingModelsAreJudgedAlikeOnEveryRoute) {
  const SparseMlaFp8Inputs in = fp8_rounding::few_key_case(1, Fp8ScaleRule::Pow2);
  fixtures::Fixture f = fixtures::sparse_mla_fp8_fixture(in, "fp8_few_keys");
  const SparseMlaForward exact = reference::sparse_mla_fp8_forward(in);
  f.expected = {{"out", exact.out.to(DType::F32)}, {"lse", exact.lse.to(DType::F32)},
                {"max_logits", exact.max_logits.to(DType::F32)}};
  const struct {
    const char* flag;
    SparseMlaForward outputs;
  } kernels[] = {{"--normalized-p", fp8_rounding::fp8_kernel(in, true)},
                 {"--sink-after-rounding", fp8_rounding::sink_after_rounding_kernel(in)}};
  for (const auto& k : kernels) {
    SCOPED_TRACE(k.flag);
    const std::string flag = k.flag;
    Scratch dir(std::string("fp8_rounding_") + (flag == "--normalized-p" ? "p" : "sink"));
    const std::string golden = dir.file("golden.safetensors");
    fixtures::save_fixture(golden, f);
    const std::map<std::string, Tensor> outputs = {
        {"out", k.outputs.out}, {"lse", k.outputs.lse}, {"max_logits", k.outputs.max_logits}};
    const std::string cand = dir.file("candidate.safetensors");
    test::write_outputs(cand, outputs);
    fixtures::Fixture as_expected = f;
    as_expected.expected = outputs;
    const std::string stored = dir.file("stored.safetensors");
    fixtures::save_fixture(stored, as_expected);

    // undeclared: DISAGREES, and the failure names the flag
    std::string text;
    EXPECT_EQ(test::run_cli_capture("compare --golden " + golden + " --candidate " + cand, &text), 1);
    EXPECT_FALSE(test::lines_with(text, {"DISAGREES"}).empty()) << text;
    EXPECT_NE(text.find(flag), std::string::npos) << text;

    // declared: the same judgement on every route (WEAK rows allowed: the sink model's own
    // error reaches one bf16 ulp on some rows, docs/what-a-pass-means.md, Limits)
    JudgeOptions judge;
    judge.normalized_p = flag == "--normalized-p";
    judge.sink_after_rounding = !judge.normalized_p;
    judge.allow_weak = true;
    const std::string opts = " " + flag + " --allow-weak";
    oracle::CandidateBackend in_process(outputs, "fp8 rounding kernel", {});
    const nlohmann::json a = reports_json(oracle::judge_fixture_ops(f, in_process, check_options(judge, true)));
    EXPECT_EQ(run_cli("compare --golden " + golden + " --candidate " + cand + opts + " --json " + dir.file("c.json")), 0);
    EXPECT_EQ(run_cli("replay " + golden + " --candidate " + cand + opts + " --json " + dir.file("r.json")), 0);
    EXPECT_EQ(run_cli("fixtures check " + stored + " --backend reference" + opts + " --json " + dir.file("k.json")), 0);
    const nlohmann::json c = test::read_json(dir.file("c.json")), r = test::read_json(dir.file("r.json"));
    const nlohmann::json d = test::read_json(dir.file("k.json")).at("files").at(0).at("producer");
    EXPECT_EQ(a.at("verdict"), "AGREES") << a.dump(1);
    const nlohmann::json want = judged_part(a);
    EXPECT_EQ(judged_part(c), want) << "compare";
    EXPECT_EQ(judged_part(r), want) << "replay";
    EXPECT_EQ(judged_part(d), want) << "fixtures check";
    for (const auto* j : {&a, &c, &r, &d})
      for (const auto& t : j->at("ops").at(0).at("outputs")) {
        if (t.at("name").get<std::string>().rfind("out", 0) == 0) {
          EXPECT_EQ(t.at(judge.normalized_p ? "normalized_p" : "sink_after_rounding"), true) << t.dump();
        }
      }
  }
}

// fresh16's FlashBwdF32 (oracle/tests/flash_bwd_f32.h: an fp32 backward recomputing P = exp2(...)
// from its forward's fp32 lse) on the extreme draws' layout with fp32 inputs: its gradients fail
// the floors and lie within the bound widened by that recompute's first-order error, which
// exceeds θ on the 2^18-logit rows (SPEC §9). Every route gives the same WEAK verdict, bounds,
// reason (naming the cause) and notes, exit 1; with --allow-weak AGREES, exit 0: in process
// (check_op, as the audit's fixture tasks judge a backend), a candidate backend of the stored
// outputs, `compare`, `replay --candidate`, `fixtures check` (expected.*). The CLI audit of the
// same kernel in process (dsa_verify_test_backends, test:flash-bwd-exp2-f32) on
// smla.backward_parity, seeds 1 and 2 (fresh16: DISAGREES there, dkv 2.2 % off at |L| = 2^18),
// fails as WEAK, never as DISAGREES, and passes with --allow-weak. Before 2026-12-02 every
// route said DISAGREES. No plugin build of this kernel: the plugin route hands the same outputs
// to the same check_sparse_mla_backward (RouteIdentity.Bf16OutTakingDeltaFromItsOwnOutIsJudgedAlikeOnEveryRoute).
TEST(RouteIdentity, LseRecomputeWeakRowsAreJudgedAlikeOnEveryRoute) {
  Scratch dir("route_identity_lse_weak");
  const fixtures::Fixture f = dsa::test::lse_extreme_draw_fixture(false);
  const std::string golden = dir.file("golden.safetensors");
  fixtures::save_fixture(golden, f);
  dsa::test::FlashBwdF32Kernel k;
  const auto outputs = outputs_of(k, f);
  const std::string cand = dir.file("candidate.safetensors");
  test::write_outputs(cand, outputs);
  fixtures::Fixture as_expected = f;
  as_expected.expected = outputs;
  const std::string stored = dir.file("stored.safetensors");
  fixtures::save_fixture(stored, as_expected);
  auto notes = [](const nlohmann::json& j) {
    std::vector<std::string> n;
    for (const auto& op : j.at("ops"))
      for (const auto& line : op.at("notes")) n.push_back(line.get<std::string>());
    return n;
  };
  auto reasons = [](const nlohmann::json& j) {
    std::vector<std::string> r;
    for (const auto& op : j.at("ops")) r.push_back(op.at("reason").get<std::string>());
    return r;
  };
  for (const bool allow : {false, true}) {
    SCOPED_TRACE(allow ? "--allow-weak" : "plain");
    JudgeOptions judge;
    judge.allow_weak = allow;
    const oracle::CheckOptions opt = check_options(judge, /*file_route=*/true);
    const std::string flag = allow ? " --allow-weak" : "";
    const nlohmann::json a = reports_json(oracle::judge_fixture_ops(f, k, opt));
    oracle::CandidateBackend stored_outputs(outputs, "flash-bwd-exp2-f32 outputs", {});
    const nlohmann::json b = reports_json(oracle::judge_fixture_ops(f, stored_outputs, opt));
    const int compare_rc = run_cli("compare --golden " + golden + " --candidate " + cand + flag + " --json " +
                                   dir.file("compare.json"));
    const int replay_rc = run_cli("replay " + golden + " --candidate " + cand + flag + " --json " + dir.file("replay.json"));
    const int check_rc =
        run_cli("fixtures check " + stored + " --backend reference" + flag + " --json " + dir.file("check.json"));
    const nlohmann::json c = test::read_json(dir.file("compare.json")), e = test::read_json(dir.file("replay.json"));
    const nlohmann::json d = test::read_json(dir.file("check.json")).at("files").at(0).at("producer");
    EXPECT_EQ(a.at("verdict"), allow ? "AGREES" : "WEAK") << a.dump(1);
    const nlohmann::json want = judged_part(a);
    for (const auto* j : {&b, &c, &d, &e}) {
      EXPECT_EQ(judged_part(*j), want) << j->dump(1);
      EXPECT_EQ(j->at("verdict"), a.at("verdict"));
      EXPECT_EQ(reasons(*j), reasons(a)) << j->dump(1);
      EXPECT_EQ(notes(*j), notes(a)) << j->dump(1);
    }
    for (int rc : {compare_rc, replay_rc, check_rc}) EXPECT_EQ(rc, allow ? 0 : 1);
    bool named = false;
    for (const auto& n : notes(a))
      named |= n.find("dkv 2 of 12 rows: 10 (|L| 2.621e+05) 11 (|L| 2.621e+05): WEAK there (cause: P recomputed "
                      "from the forward's fp32 lse") != std::string::npos;
    EXPECT_TRUE(named) << a.dump(1);
  }
  // The audit, in process: the tester's seeds.
  for (const char* seed : {"1", "2"})
    for (const bool allow : {false, true}) {
      SCOPED_TRACE(std::string("audit seed ") + seed + (allow ? " --allow-weak" : ""));
      const std::string json = dir.file("audit.json"), log = dir.file("audit.txt");
      const std::string cmd = std::string(DSA_VERIFY_TEST_BACKENDS) +
                              " audit --backend test:flash-bwd-exp2-f32 --only smla.backward_parity --seed " + seed +
                              " --dump-dir " + dir.file("d") + " --json " + json + (allow ? " --allow-weak" : "") +
                              " > " + log + " 2>&1";
      const int status = std::system(cmd.c_str());
      const std::string text = test::read_text(log);
      ASSERT_TRUE(WIFEXITED(status)) << text;
      EXPECT_EQ(WEXITSTATUS(status), allow ? 0 : 1) << text;
      EXPECT_EQ(text.find("DISAGREES"), std::string::npos) << text;
      if (!allow) {
        EXPECT_FALSE(test::lines_with(text, {"WEAK"}).empty()) << text;
      }
      std::cout << text;
    }
}

// A KL kernel whose loss has the shape `shape` (the float64 reference's values otherwise).
class LossShapeKernel : public oracle::Backend {
 public:
  explicit LossShapeKernel(std::vector<int64_t> shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "loss-shape"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::IndexerKlLoss; }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = reference::indexer_kl_loss(in);
    r.loss = r.loss.reshaped(shape_);
    return r;
  }

 private:
  std::vector<int64_t> shape_;
};

// SPEC §7 (issue 12, one rule): the loss is one number, and [] (a 0-dim tensor, torch's usual
// loss) and [1] are one representation. A correct kernel returning a 0-dim loss AGREES with the
// same bounds on every route (in process, compare and replay of a candidate file, fixtures check
// of the outputs stored as expected.*; the plugin ABI hands the loss over as [1]), as the Python
// audit and compare do (python/tests/test_compare_fixture.py).
TEST(RouteIdentity, ZeroDimLossAgreesAlikeOnEveryRoute) {
  LossShapeKernel k(std::vector<int64_t>{});
  const nlohmann::json a =
      expect_same_on_every_route("route_identity_loss_0dim", "kl_dense_causal", k, DSA_REFERENCE_PLUGIN, false);
  EXPECT_EQ(a.at("verdict"), "AGREES") << a.dump(1);
}

// Any other shape of the loss ([1, 1], [1, 1, 1]) is a shape error on every route, with the
// same message naming the shapes accepted; never reshaped into a pass on one route only.
TEST(RouteIdentity, OtherLossShapesFailAlikeOnEveryRoute) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1, 1}}) {
    LossShapeKernel k(shape);
    const nlohmann::json a = expect_same_on_every_route("route_identity_loss_" + std::to_string(shape.size()) + "d",
                                                        "kl_dense_causal", k, "", true);
    EXPECT_NE(a.at("ops").at(0).at("reason").get<std::string>().find(
                  "loss: shape " + shape_str(shape) + ", expected [1] or []"),
              std::string::npos)
        << a.dump(1);
  }
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

// A plugin built against the first ABI 1 header (no provided_outputs field) still loads and
// writes every output.
TEST(PluginOutputs, OldHeaderPluginLoadsWithEveryOutput) {
  auto p = plugin::open_plugin(DSA_OLD_HEADER_PLUGIN);
  EXPECT_EQ(p->info().provided_outputs, 0u);
  EXPECT_FALSE(p->provided_outputs().has_value());
  EXPECT_EQ(p->info().rounding_models, 0u);  // nor a rounding model (ABI 1.2)
}

// A plugin declaring only out and lse: max_logits is not judged (partial), never missing.
TEST(PluginOutputs, DeclaredOutputsMakeAPartialVerdictOnEveryPluginRoute) {
  auto p = plugin::open_plugin(DSA_PARTIAL_PLUGIN);
  ASSERT_TRUE(p->provided_outputs().has_value());
  EXPECT_EQ(*p->provided_outputs(), (std::set<std::string>{"out", "lse"}));
  EXPECT_NE(plugin::describe(p->info()).find("provides only lse,out"), std::string::npos);
  const std::string golden = std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_sink.safetensors";
  const fixtures::Fixture f = fixtures::load_fixture(golden);
  const auto reports = oracle::judge_fixture_ops(f, *p, {});
  EXPECT_EQ(oracle::verdict_line(reports), "AGREES (partial: max_logits not judged)");
  Scratch dir("partial_plugin");
  EXPECT_EQ(run_cli("replay " + golden + " --plugin " + DSA_PARTIAL_PLUGIN + " --json " + dir.file("r.json")), 0);
  EXPECT_EQ(test::read_json(dir.file("r.json")).value("verdict", ""), "AGREES (partial: max_logits not judged)");
  // The audit's properties judge what the plugin declares too (never INCOMPLETE for max_logits).
  EXPECT_EQ(run_cli(std::string("audit --plugin ") + DSA_PARTIAL_PLUGIN + " --only smla.forward_ratio,smla.empty_rows"), 0);
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

// A kernel that cannot run an op is `skip`, never `pass`/`agree`: in the audit's progress
// lines and in its table (the example plugin declares no KL loss).
TEST(SkipIsNotAgree, AuditProgressOfAnUndeclaredOpSaysSkip) {
  Scratch dir("skip_progress");
  const std::string log = dir.file("audit.log");
  const std::string cmd = std::string(DSA_VERIFY) + " audit --plugin " + DSA_EXAMPLE_PLUGIN +
                          " --ops indexer_kl_loss > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream all;
  all << in.rdbuf();
  std::cout << all.str();
  // Nothing ran: not a pass (exit 2), and the error names the backend.
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(all.str().find("ran no case"), std::string::npos);
  int progress = 0;
  std::string line;
  while (std::getline(all, line)) {
    if (line.rfind("[", 0) != 0 || line.find("/") == std::string::npos) continue;  // "[3/9] skip ..."
    ++progress;
    EXPECT_NE(line.find("] skip "), std::string::npos) << line;
  }
  EXPECT_GE(progress, 4) << "the KL properties and the kl_* fixtures each print a progress line";
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

// A plugin declares its rounding models in its capabilities (dsa_backend_v1::rounding_models,
// ABI 1.2; issue 12 item 6): the same kernel, rounding softmax(P) to bf16 before P·V
// (Bf16FlashStyleKernel(true)), built as a plugin declaring DSA_ROUNDING_NORMALIZED_P, one
// declaring nothing and one declaring only DSA_ROUNDING_SINK_AFTER_ROUNDING (a declaration that
// does not cover it). Goldens: bf16, no sink, few keys, where the max key dominates.
const char* const kNormalizedPGoldens[] = {"smla_topk_length", "smla_leading_padding"};

const nlohmann::json* output_named(const nlohmann::json& reports, const std::string& op, const std::string& name) {
  for (const auto& o : reports.at("ops"))
    if (o.at("op") == op)
      for (const auto& t : o.at("outputs"))
        if (t.at("name") == name) return &t;
  return nullptr;
}

TEST(RoundingModels, PluginDeclaringNormalizedPAgreesUndeclaredFailsNamingTheFlag) {
  auto declared = plugin::open_plugin(DSA_NORMALIZED_P_PLUGIN);
  auto undeclared = plugin::open_plugin(DSA_NORMALIZED_P_UNDECLARED_PLUGIN);
  auto sink_only = plugin::open_plugin(DSA_NORMALIZED_P_SINK_PLUGIN);
  EXPECT_TRUE(declared->rounding_model().normalized_p);
  EXPECT_FALSE(declared->rounding_model().sink_after_rounding);
  EXPECT_FALSE(undeclared->rounding_model().normalized_p || undeclared->rounding_model().sink_after_rounding);
  EXPECT_TRUE(sink_only->rounding_model().sink_after_rounding && !sink_only->rounding_model().normalized_p);
  EXPECT_NE(plugin::describe(declared->info()).find("; rounding normalized-p"), std::string::npos)
      << plugin::describe(declared->info());
  for (const char* name : kNormalizedPGoldens) {
    SCOPED_TRACE(name);
    const fixtures::Fixture f = fixtures::load_fixture(test::golden(name));
    const nlohmann::json plain = reports_json(oracle::judge_fixture_ops(f, *undeclared, {}));
    const nlohmann::json wrong = reports_json(oracle::judge_fixture_ops(f, *sink_only, {}));
    const nlohmann::json yes = reports_json(oracle::judge_fixture_ops(f, *declared, {}));
    // Undeclared (and declared as the other model) out fails, and the report names the flag.
    for (const auto* j : {&plain, &wrong}) {
      EXPECT_EQ(j->at("verdict"), "DISAGREES") << j->dump(1);
      const nlohmann::json* out = output_named(*j, "sparse_mla_fwd", "out");
      ASSERT_NE(out, nullptr);
      EXPECT_FALSE(out->at("passed").get<bool>());
      EXPECT_NE(out->at("message").get<std::string>().find("--normalized-p"), std::string::npos) << out->dump(1);
    }
    // Declared in the capabilities: it agrees, judged with the model.
    EXPECT_EQ(yes.at("verdict"), "AGREES") << yes.dump(1);
    ASSERT_NE(output_named(yes, "sparse_mla_fwd", "out"), nullptr);
    EXPECT_TRUE(output_named(yes, "sparse_mla_fwd", "out")->at("normalized_p").get<bool>());
    // Either declares: the flag on the undeclared plugin gives the same verdicts and bounds, and
    // the flag beside the other model's declaration too (their models joined).
    JudgeOptions flag;
    flag.normalized_p = true;
    const oracle::CheckOptions with_flag = check_options(flag, false);
    EXPECT_EQ(judged_part(reports_json(oracle::judge_fixture_ops(f, *undeclared, with_flag))), judged_part(yes));
    EXPECT_EQ(judged_part(reports_json(oracle::judge_fixture_ops(f, *declared, with_flag))), judged_part(yes));
    const nlohmann::json both = reports_json(oracle::judge_fixture_ops(f, *sink_only, with_flag));
    EXPECT_EQ(both.at("verdict"), "AGREES") << both.dump(1);
    EXPECT_TRUE(output_named(both, "sparse_mla_fwd", "out")->at("normalized_p").get<bool>());
  }
}

// The same kernel in process judged with --normalized-p (CheckOptions), through the plugin
// declaring it in its capabilities (no flag), and as stored outputs through compare, replay and
// fixtures check with the flag: identical verdicts, bounds and per-output models (issue 12 item 4).
// replay --plugin with no flag judges like them. Undeclared, the same outputs disagree here.
TEST(RouteIdentity, NormalizedPDeclaredInThePluginCapabilitiesIsJudgedAlikeOnEveryRoute) {
  dsa::test::Bf16FlashStyleKernel k(true);
  JudgeOptions judge;
  judge.normalized_p = true;
  for (const char* name : kNormalizedPGoldens) {
    SCOPED_TRACE(name);
    const nlohmann::json a = expect_same_on_every_route(std::string("route_identity_normalized_p_") + name, name, k,
                                                        DSA_NORMALIZED_P_PLUGIN, false, judge, true);
    const fixtures::Fixture f = fixtures::load_fixture(test::golden(name));
    EXPECT_EQ(reports_json(oracle::judge_fixture_ops(f, k, check_options(JudgeOptions{}, true))).at("verdict"),
              "DISAGREES");
    Scratch dir(std::string("replay_normalized_p_plugin_") + name);
    EXPECT_EQ(run_cli("replay " + test::golden(name) + " --plugin " + DSA_NORMALIZED_P_PLUGIN + " --json " +
                      dir.file("r.json")),
              0);
    const nlohmann::json r = test::read_json(dir.file("r.json"));
    EXPECT_EQ(judged_part(r), judged_part(a));
    EXPECT_EQ(rounding_part(r), rounding_part(a));
  }
}

// The audit of a plugin names the rounding models it judged with and who declared them, in its
// report, its JSON and its reproduce lines (which re-judge the same way): a plugin declaring
// only sink_after_rounding fails the normalized-P out, and its reproduce lines carry
// --sink-after-rounding although no flag was given; with --normalized-p added it passes, and
// the report names both sources; the plugin declaring normalized_p passes. About 40 s.
TEST(RoundingModels, AuditReportAndReproduceLinesNameTheDeclaredModels) {
  Scratch dir("rounding_models_audit");
  const std::string audit = std::string("audit --level 0 --seed 1 --dump-dir ") + dir.file("d") + " --only ";
  const std::string sink_plugin = std::string(" --plugin ") + DSA_NORMALIZED_P_SINK_PLUGIN;
  std::string out;
  EXPECT_EQ(test::run_cli_capture(audit + "smla.invalid_slots_never_read,smla.topk_length_respected" + sink_plugin +
                                      " --timeout 45.5 --json " + dir.file("a.json"),
                                  &out),
            1)
      << out;
  EXPECT_FALSE(test::lines_with(out, {"rounding models of plugin:normalized_p_sink: sink_after_rounding (declared "
                                      "by the backend's capabilities)"})
                   .empty())
      << out;
  const auto repro_lines = test::lines_with(out, {"reproduce: ", "dsa-verify audit"});
  EXPECT_EQ(repro_lines.size(), 2u) << out;
  for (const auto& line : repro_lines) {
    // ... and the run's --seed and --timeout (fresh12 F11: they were left out, so the line ran
    // another seed's draws with the default timeout).
    EXPECT_NE(line.find(sink_plugin + " --sink-after-rounding --seed 1 --timeout 45.5 --only smla."), std::string::npos)
        << line;
    EXPECT_EQ(line.find("--normalized-p"), std::string::npos) << line;
  }
  const nlohmann::json a = test::read_json(dir.file("a.json"));
  ASSERT_EQ(a.at("rounding_models").size(), 1u) << a.dump(1);
  EXPECT_EQ(a.at("rounding_models").at(0).at("backend"), "plugin:normalized_p_sink");
  EXPECT_EQ(a.at("rounding_models").at(0).at("sink_after_rounding"),
            (nlohmann::json{{"judged", true}, {"flag", false}, {"backend", true}}));
  EXPECT_EQ(a.at("rounding_models").at(0).at("normalized_p"),
            (nlohmann::json{{"judged", false}, {"flag", false}, {"backend", false}}));
  // The flag adds the model the capabilities leave out: both are named, with their sources.
  EXPECT_EQ(test::run_cli_capture(audit + "smla.invalid_slots_never_read" + sink_plugin + " --normalized-p", &out), 0)
      << out;
  EXPECT_FALSE(test::lines_with(out, {"rounding models of plugin:normalized_p_sink: sink_after_rounding (declared "
                                      "by the backend's capabilities), normalized_p (--normalized-p)"})
                   .empty())
      << out;
  // The plugin declaring normalized_p in its capabilities passes, and the report says so.
  EXPECT_EQ(test::run_cli_capture(audit + "smla.invalid_slots_never_read --plugin " + DSA_NORMALIZED_P_PLUGIN +
                                      " --json " + dir.file("b.json"),
                                  &out),
            0)
      << out;
  EXPECT_FALSE(test::lines_with(out, {"rounding models of plugin:normalized_p: normalized_p (declared by the "
                                      "backend's capabilities)"})
                   .empty())
      << out;
  EXPECT_EQ(test::read_json(dir.file("b.json")).at("rounding_models").at(0).at("normalized_p"),
            (nlohmann::json{{"judged", true}, {"flag", false}, {"backend", true}}));
}

}  // namespace
}  // namespace dsa::cli
