// The cases found by trying the tool from outside (issue 12), rebuilt here in code: each
// golden is computed by the float64 reference (or taken from fixtures/peer), each candidate
// is what a faulty kernel returns, and the verdict comes from the route a user runs
// (`dsa-verify compare`, `fixtures check`). Label golden.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <tuple>

#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/op_check.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"
#include "route_test_util.h"

namespace dsa::cli {
namespace {

using test::Scratch;
using test::run_cli;

std::string peer(const std::string& name) { return std::string(DSA_PEER_FIXTURE_DIR) + "/" + name + ".safetensors"; }

Tensor scaled(const Tensor& t, double factor) {
  Tensor out(t.dtype(), t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i) * factor);
  return out;
}

// compare of the golden's expected.* with `output` multiplied by `factor` says DISAGREES and
// exits 1.
void expect_scaled_disagrees(const std::string& golden, const std::string& output, double factor) {
  Scratch dir("scaled_" + output);
  const fixtures::Fixture f = fixtures::load_fixture(golden);
  std::map<std::string, Tensor> cand = f.expected;
  cand.erase("out_bf16");
  cand.at(output) = scaled(cand.at(output), factor);
  test::write_outputs(dir.file("cand.safetensors"), cand);
  const int rc = run_cli("compare --golden " + golden + " --candidate " + dir.file("cand.safetensors") +
                         " --json " + dir.file("r.json"));
  EXPECT_EQ(test::read_json(dir.file("r.json")).value("verdict", ""), "DISAGREES");
  EXPECT_EQ(rc, 1);
}

// A gradient scaled by a factor far outside rounding is a wrong gradient on every route.
TEST(SharedCases, SmlaBasicDkvHalvedDisagrees) {
  expect_scaled_disagrees(peer("smla_basic"), "dkv", 0.5);
}

TEST(SharedCases, SmlaBasicDqOnePercentTooLargeDisagrees) {
  expect_scaled_disagrees(peer("smla_basic"), "dq", 1.01);
}

TEST(SharedCases, SmlaSinkDsinkTenPercentTooSmallDisagrees) {
  expect_scaled_disagrees(peer("smla_sink"), "dsink", 0.9);
}

// The same faults judged as a producer's expected.*: `fixtures check` must not accept what
// compare rejects (one judgement).
TEST(SharedCases, FixturesCheckRejectsTheSameScaledGradient) {
  Scratch dir("check_scaled");
  fixtures::Fixture f = fixtures::load_fixture(peer("smla_basic"));
  f.expected.at("dkv") = scaled(f.expected.at("dkv"), 0.5);
  fixtures::save_fixture(dir.file("smla_basic_dkv_half.safetensors"), f);
  EXPECT_EQ(run_cli("fixtures check " + dir.file("smla_basic_dkv_half.safetensors") + " --backend reference"), 1);
}

// A small sparse MLA golden (sm_scale 8, d_qk 16, d_v 8) from the float64 reference.
fixtures::Fixture smla_golden(const std::string& name, const Tensor& q, const Tensor& kv,
                              const Tensor& indices, std::optional<Tensor> sink, bool backward) {
  fixtures::Fixture f;
  f.case_name = name;
  f.op = backward ? "sparse_mla_fwd+bwd" : "sparse_mla_fwd";
  f.producer = "dsa-verify reference (float64), rounded to F32";
  f.params = {{"sm_scale", 8.0}, {"d_v", 8}};
  f.inputs.emplace("q", q);
  f.inputs.emplace("kv", kv);
  f.inputs.emplace("indices", indices);
  SparseMlaInputs in;
  in.q = q;
  in.kv = kv;
  in.indices = indices;
  in.sm_scale = 8.0;
  in.d_v = 8;
  if (sink) {
    in.attn_sink = *sink;
    f.inputs.emplace("attn_sink", *sink);
  }
  const SparseMlaForward fwd = reference::sparse_mla_forward(in);
  f.expected.emplace("out", fwd.out.to(DType::F32));
  f.expected.emplace("lse", fwd.lse.to(DType::F32));
  f.expected.emplace("max_logits", fwd.max_logits.to(DType::F32));
  if (backward) {
    Tensor dout(DType::F32, {q.size(0), q.size(1), 8});
    for (int64_t i = 0; i < dout.numel(); ++i) dout.set(i, ((i * 7) % 11 - 5) / 8.0);
    f.inputs.emplace("dout", dout);
    const SparseMlaGrads g = reference::sparse_mla_backward(in, dout);
    f.expected.emplace("dq", g.dq.to(DType::F32));
    f.expected.emplace("dkv", g.dkv.to(DType::F32));
    if (g.dsink) f.expected.emplace("dsink", g.dsink->to(DType::F32));
  }
  return f;
}

// Values on a 1/8 grid, small and exact in F32.
Tensor grid(std::vector<int64_t> shape, int seed) {
  Tensor t(DType::F32, std::move(shape));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(static_cast<int>(rng() % 17) - 8) / 8.0);
  return t;
}

// One legal, very large logit in the last row must not loosen the bound of the other rows:
// zeroing `out` of rows 0-2 is caught (SPEC §9: bounds depend on the element's own row).
TEST(SharedCases, OneLargeLogitRowDoesNotHideZeroedRows) {
  Scratch dir("large_logit");
  Tensor q = grid({4, 2, 16}, 1), kv = grid({6, 16}, 2);
  q.set((3 * 2 + 0) * 16 + 0, 128.0);  // row 3, head 0
  kv.set(5 * 16 + 0, 256.0);           // key 5: logit 8 * 128 * 256 = 262144 (+ grid terms)
  const Tensor ids = Tensor::from_i32({4, 3}, {0, 1, 2, 1, 2, 3, 2, 3, 4, 5, 0, 1});
  const fixtures::Fixture g = smla_golden("large_logit_row", q, kv, ids, Tensor::from_f64({2}, {0.5, -1.0}).to(DType::F32), true);
  ASSERT_GT(g.expected.at("max_logits").get(6), 2.6e5);
  fixtures::save_fixture(dir.file("golden.safetensors"), g);
  std::map<std::string, Tensor> cand = g.expected;
  for (int64_t i = 0; i < 3 * 2 * 8; ++i) cand.at("out").set(i, 0.0);
  test::write_outputs(dir.file("cand.safetensors"), cand);
  EXPECT_EQ(run_cli("compare --golden " + dir.file("golden.safetensors") + " --candidate " +
                    dir.file("cand.safetensors") + " --json " + dir.file("r.json")), 1);
  EXPECT_EQ(test::read_json(dir.file("r.json")).value("verdict", ""), "DISAGREES");
}

// A finite mask value (-5e4) hides a real logit of -280576: the kernel returns out = 0 and
// only `out`. Writes the golden and that candidate into `dir`.
void write_finite_mask_case(const Scratch& dir) {
  Tensor q = grid({2, 2, 16}, 3), kv = grid({4, 16}, 4);
  // The logit comes from column 15, outside V (d_v = 8): |v| stays small while the logit is huge.
  for (int64_t d = 0; d < 16; ++d) {
    q.set(0 * 16 + d, d == 15 ? -137.0 : 0.0);  // row 0, head 0
    kv.set(1 * 16 + d, d == 15 ? 256.0 : kv.get(1 * 16 + d));
  }
  const Tensor ids = Tensor::from_i32({2, 2}, {1, -1, 0, 2});  // row 0: one valid key
  const fixtures::Fixture g = smla_golden("finite_mask_value", q, kv, ids, std::nullopt, false);
  ASSERT_LT(g.expected.at("max_logits").get(0), -2.8e5);
  fixtures::save_fixture(dir.file("golden.safetensors"), g);
  Tensor out = g.expected.at("out");
  for (int64_t i = 0; i < 8; ++i) out.set(i, 0.0);  // row 0, head 0: masked away
  test::write_outputs(dir.file("cand.safetensors"), {{"out", out}});
  test::write_outputs(dir.file("good.safetensors"), {{"out", g.expected.at("out")}});
}

// Without --outputs, the missing lse and max_logits (which would catch the fault) never let
// the candidate agree: DISAGREES (its `out` is caught), exit 1. A
// correct `out` alone is INCOMPLETE without --outputs and agrees, saying what was not
// judged, with --outputs out.
TEST(SharedCases, FiniteMaskValueWithOnlyOutNeverAgrees) {
  Scratch dir("finite_mask_incomplete");
  write_finite_mask_case(dir);
  const std::string golden = " --golden " + dir.file("golden.safetensors");
  EXPECT_EQ(run_cli("compare" + golden + " --candidate " + dir.file("cand.safetensors") + " --json " + dir.file("a.json")), 1);
  // The zeroed `out` itself is over its bound: DISAGREES (more severe than INCOMPLETE), the
  // verdict the cases README expects.
  EXPECT_EQ(test::read_json(dir.file("a.json")).value("verdict", ""), "DISAGREES");
  EXPECT_EQ(run_cli("compare" + golden + " --candidate " + dir.file("good.safetensors") + " --json " + dir.file("b.json")), 1);
  EXPECT_EQ(test::read_json(dir.file("b.json")).value("verdict", ""), "INCOMPLETE");
  EXPECT_EQ(run_cli("compare" + golden + " --candidate " + dir.file("good.safetensors") + " --outputs out --json " +
                    dir.file("c.json")), 0);
  EXPECT_EQ(test::read_json(dir.file("c.json")).value("verdict", ""), "AGREES (partial: lse, max_logits not judged)");
}

// Naming `out` as all the kernel provides, the zeroed out itself must be caught.
TEST(SharedCases, FiniteMaskValueZeroOutAloneDisagrees) {
  Scratch dir("finite_mask_out");
  write_finite_mask_case(dir);
  EXPECT_EQ(run_cli("compare --golden " + dir.file("golden.safetensors") + " --candidate " + dir.file("cand.safetensors") +
                    " --outputs out --json " + dir.file("b.json")), 1);
  EXPECT_EQ(test::read_json(dir.file("b.json")).value("verdict", ""), "DISAGREES");
}

// All scores in one narrow band [10, 10.2): a radix top-k that keeps only the first 1024
// candidates of the threshold bin drops true top-k entries.
TEST(SharedCases, NarrowBandTopkTruncatedToTheFirst1024CandidatesDisagrees) {
  Scratch dir("narrow_band");
  const int64_t s_q = 4, s_kv = 4096, k = 64;
  Tensor scores(DType::F32, {s_q, s_kv});
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> band(10.0f, 10.2f);
  for (int64_t i = 0; i < scores.numel(); ++i) scores.set(i, band(rng));
  const TopkPolicy policy{TieBreak::Small, true};
  fixtures::Fixture g;
  g.case_name = "topk_narrow_band";
  g.op = "topk";
  g.producer = "dsa-verify reference";
  g.params = {{"k", k}, {"tie_break", "small"}, {"sorted", true}};
  g.inputs.emplace("scores", scores);
  g.expected.emplace("indices", reference::select_topk(scores, k, policy, std::nullopt));
  fixtures::save_fixture(dir.file("golden.safetensors"), g);
  // The faulty kernel: the top-k of the first 1024 columns only.
  Tensor head(DType::F32, {s_q, 1024});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < 1024; ++s) head.set(t * 1024 + s, scores.get(t * s_kv + s));
  test::write_outputs(dir.file("cand.safetensors"), {{"indices", reference::select_topk(head, k, policy, std::nullopt)}});
  EXPECT_EQ(run_cli("compare --golden " + dir.file("golden.safetensors") + " --candidate " +
                    dir.file("cand.safetensors") + " --json " + dir.file("r.json")), 1);
  EXPECT_EQ(test::read_json(dir.file("r.json")).value("verdict", ""), "DISAGREES");
}

// Contract-correct top-k on the short-rows scores (k 40 > s_kv 24, -inf rows, -0.0/+0.0),
// with the producer's free-text conventions in the metadata: text never turns an adapter on
// or a rule off, so `fixtures check FILE` agrees.
fixtures::Fixture short_rows_contract_correct() {
  fixtures::Fixture f = fixtures::load_fixture(peer("topk_short_rows"));
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  f.producer = "dsa-verify reference (contract-correct outputs)";
  f.conventions.clear();  // k columns, -1 padded: no representation to convert
  f.convention_notes = {{"width", "min(k, s_kv) columns (the peer narrows the output when k > s_kv)"},
                        {"nan", "torch.topk ranks NaN above +inf"},
                        {"ties", "torch.topk, any tie subset"}};
  f.expected.at("indices") = reference::select_topk(c.scores, c.k, c.policy, c.topk_windows);
  return f;
}

TEST(SharedCases, ContractCorrectShortRowsAgreeDespiteFreeTextConventions) {
  Scratch dir("short_rows");
  const fixtures::Fixture f = short_rows_contract_correct();
  ASSERT_EQ(f.expected.at("indices").size(1), 40);
  fixtures::save_fixture(dir.file("topk_short_rows.safetensors"), f);
  EXPECT_EQ(run_cli("fixtures check " + dir.file("topk_short_rows.safetensors") + " --backend reference --json " +
                    dir.file("r.json")), 0);
  EXPECT_EQ(test::read_json(dir.file("r.json")).at("files").at(0).at("producer").value("verdict", ""), "AGREES");
}

// torch.topk ranks NaN first: a producer that selects NaN deviates from the contract, and
// neither free text nor any convention excuses it; the reason names the rows.
TEST(SharedCases, ASelectedNaNDeviatesFromTheContractWhateverTheConventions) {
  Scratch dir("nan_selected");
  fixtures::Fixture f = short_rows_contract_correct();
  f.conventions = {fixtures::Convention::TopkWidthMinKSkv};
  Tensor& scores = f.inputs.at("scores");
  const int64_t s_kv = scores.size(1);
  for (int64_t t : {2, 3}) scores.set(t * s_kv + 7, NAN);
  // torch order: the NaN id first, then the contract's ids of that row.
  const oracle::OpCase c = oracle::op_case_from_fixture(f);
  Tensor ids = reference::select_topk(c.scores, c.k, c.policy, c.topk_windows);
  for (int64_t t : {2, 3}) {
    for (int64_t j = c.k - 1; j > 0; --j) ids.set(t * c.k + j, ids.get(t * c.k + j - 1));
    ids.set(t * c.k, 7);
  }
  f.expected.at("indices") = ids;
  fixtures::save_fixture(dir.file("torch_nan.safetensors"), f);
  EXPECT_EQ(run_cli("fixtures check " + dir.file("torch_nan.safetensors") + " --backend reference --json " +
                    dir.file("r.json")), 1);
  const auto p = test::read_json(dir.file("r.json")).at("files").at(0).at("producer");
  EXPECT_EQ(p.value("verdict", ""), "DISAGREES");
  EXPECT_NE(p.at("ops").at(0).value("reason", "").find("deviates from the contract: selected NaN in rows 2, 3"),
            std::string::npos)
      << p.dump(2);
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

// A correct kernel of SPEC §4/§5: its forward returns `out` in q's dtype (bf16) and its
// backward takes Δ = out·dout from that bf16 `out`. One query, one head, one key and a sink,
// in closed form (float64, outputs F32).
class Bf16OutKernel : public oracle::Backend {
 public:
  std::string name() const override { return "bf16-out-kernel"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    const auto [P, L, w] = logits(in);
    SparseMlaForward f{Tensor(DType::F32, {1, 1, in.d_v}), Tensor(DType::F32, {1, 1}),
                       Tensor(DType::F32, {1, 1})};
    for (int64_t d = 0; d < in.d_v; ++d) f.out.set(d, in.kv.get(d) * w);
    f.out = f.out.to(in.q.dtype());  // rounded to bf16, as returned
    f.lse.set(0, P);
    f.max_logits.set(0, P);
    return f;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    const Tensor out = sparse_mla_forward(in).out;  // the kernel's own bf16 out
    const auto [P, L, w] = logits(in);
    const double p = std::exp(P - L);
    double delta = 0, dout_v = 0;
    for (int64_t d = 0; d < in.d_v; ++d) {
      delta += out.get(d) * dout.get(d);
      dout_v += dout.get(d) * in.kv.get(d);
    }
    const double dS = p * (dout_v - delta);
    const int64_t d_qk = in.q.size(2);
    SparseMlaGrads g{Tensor(DType::F32, {1, 1, d_qk}), Tensor(DType::F32, {1, d_qk}),
                     Tensor(DType::F32, {1})};
    for (int64_t d = 0; d < d_qk; ++d) {
      g.dq.set(d, in.sm_scale * dS * in.kv.get(d));
      g.dkv.set(d, in.sm_scale * dS * in.q.get(d) + (d < in.d_v ? p * dout.get(d) : 0.0));
    }
    g.dsink->set(0, -std::exp(in.attn_sink->get(0) - L) * delta);
    return g;
  }

 private:
  // P = sm_scale·q·kv, L = ln(e^P + e^sink), w = e^P / (e^P + e^sink).
  static std::tuple<double, double, double> logits(const SparseMlaInputs& in) {
    double P = 0;
    for (int64_t d = 0; d < in.q.size(2); ++d) P += in.q.get(d) * in.kv.get(d);
    P *= in.sm_scale;
    const double s = in.attn_sink->get(0);
    const double L = std::max(P, s) + std::log1p(std::exp(-std::abs(P - s)));
    return {P, L, std::exp(P - L)};
  }
};

TEST(SharedCases, Bf16OutBackwardTakingDeltaFromItsOwnOutPasses) {
  oracle::OpCase c;
  c.mla.q = Tensor::from_f64({1, 1, 2}, {1.0, 0.5}).to(DType::BF16);
  c.mla.kv = Tensor::from_f64({1, 2}, {2.0, -1.0}).to(DType::BF16);
  c.mla.indices = Tensor::from_i32({1, 1}, {0});
  c.mla.attn_sink = Tensor::from_f64({1}, {0.3}).to(DType::F32);
  c.mla.sm_scale = 0.5;
  c.mla.d_v = 2;
  c.dout = Tensor::from_f64({1, 1, 2}, {0.75, -0.25}).to(DType::BF16);
  Bf16OutKernel k;
  // Its bf16 out differs from the fp32 one, so Δ differs: the case is not trivial.
  const double w32 = static_cast<float>(k.sparse_mla_forward(c.mla).out.get(0));
  ASSERT_EQ(k.sparse_mla_forward(c.mla).out.dtype(), DType::BF16);
  ASSERT_NE(w32, reference::sparse_mla_forward(c.mla).out.to(DType::F32).get(0));
  for (oracle::Op op : {oracle::Op::SparseMlaFwd, oracle::Op::SparseMlaBwd}) {
    const oracle::OpReport r = oracle::check_op(k, op, c);
    std::cout << oracle::format_op_report(r);
    EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << r.reason;
  }
}

}  // namespace
}  // namespace dsa::cli

namespace dsa::cli {
namespace {

using fixtures::Convention;

std::vector<oracle::OpReport> judge_stored(const fixtures::Fixture& golden,
                                           std::map<std::string, Tensor> outputs,
                                           std::vector<Convention> conv) {
  oracle::CandidateBackend b(std::move(outputs), "test-candidate", std::move(conv));
  oracle::CheckOptions opt;
  opt.check_determinism = false;
  return oracle::judge_fixture_ops(golden, b, opt);
}

// Each convention converts one representation; without it the same outputs disagree.
TEST(Conventions, ConvertRepresentationsAndNothingElse) {
  // lse_base2 on a sparse MLA forward golden.
  fixtures::Fixture smla = fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_basic.safetensors");
  smla.op = "sparse_mla_fwd";
  std::map<std::string, Tensor> fwd = {{"out", smla.expected.at("out")}};
  for (const char* n : {"lse", "max_logits"}) {
    Tensor t = smla.expected.at(n);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) / std::log(2.0));
    fwd[n] = t;
  }
  EXPECT_EQ(oracle::verdict_line(judge_stored(smla, fwd, {})), "DISAGREES");
  EXPECT_EQ(oracle::verdict_line(judge_stored(smla, fwd, {Convention::LseBase2})), "AGREES");

  // int64_ids and ids_s_q_1_k on a top-k golden.
  const fixtures::Fixture topk = fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/topk_distinct_causal.safetensors");
  const Tensor& ids = topk.expected.at("indices");
  Tensor wide(DType::I64, {ids.size(0), 1, ids.size(1)});
  for (int64_t i = 0; i < ids.numel(); ++i) wide.set(i, ids.get(i));
  EXPECT_EQ(oracle::verdict_line(judge_stored(topk, {{"indices", wide}}, {Convention::Int64Ids})), "DISAGREES");
  EXPECT_EQ(oracle::verdict_line(judge_stored(topk, {{"indices", wide}}, {Convention::Int64Ids, Convention::IdsSq1K})),
            "AGREES");
  // An I64 id that does not fit int32 stays a contract violation after the conversion.
  wide.set(3, 1e12);
  const auto bad = judge_stored(topk, {{"indices", wide}}, {Convention::Int64Ids, Convention::IdsSq1K});
  EXPECT_EQ(oracle::verdict_line(bad), "DISAGREES");
  EXPECT_EQ(bad.at(0).reason.rfind("deviates from the contract: id out of range in row 0", 0), 0u) << bad.at(0).reason;

  // topk_width_min_k_s_kv: the peer's narrowed short rows against the contract's width.
  const fixtures::Fixture peer_rows = fixtures::load_fixture(peer("topk_short_rows"));
  fixtures::Fixture contract = short_rows_contract_correct();
  const std::map<std::string, Tensor> narrowed = {{"indices", peer_rows.expected.at("indices")}};
  EXPECT_EQ(oracle::verdict_line(judge_stored(contract, narrowed, {})), "DISAGREES");
  EXPECT_EQ(oracle::verdict_line(judge_stored(contract, narrowed, {Convention::TopkWidthMinKSkv})), "AGREES");
}

}  // namespace
}  // namespace dsa::cli
