// Sparse MLA backward: which Δ = out·dout the gradients are judged with (SPEC §5, §9).
//
// A kernel's backward takes Δ from the out its forward returned (e.g. its bf16 out), or from
// a precise out (fp32 or wider) while it returns a rounded copy. A bf16 out that passes the
// forward rule can still be rounded with a bias: every element within 0.85 ulp, rounded
// toward sign(dout) instead of to nearest. Δ then moves coherently, by up to ~0.85 ulp ×
// Σ|dout| per row. When the baseline took Δ from that out but the reference took it from the
// exact out, E_row(baseline) carried the whole shift and the bound grew ~28× on dsink: a
// dsink 15-22 % off with exact dq and dkv AGREED on every file route (fresh-user finding,
// session 7). The judge now accepts gradients only if they fit one legal Δ source, each with
// a tight bound: the float64 reference with Δ from the candidate's own out, or the exact
// reference with the baseline's Δ from its fp32 out.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dsa/oracle/fixture_check.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::oracle {
namespace {

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

// The bf16 value one step from bf16 value `b` in direction `dir` (+1 up, -1 down).
double bf16_step(double b, int dir) {
  float f = static_cast<float>(b);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t h = static_cast<uint16_t>(u >> 16);
  if (f == 0.0f)
    h = dir > 0 ? 0x0001 : 0x8001;
  else if ((f > 0) == (dir > 0))
    ++h;
  else
    --h;
  u = static_cast<uint32_t>(h) << 16;
  std::memcpy(&f, &u, 4);
  return f;
}

// The exact out rounded to bf16 toward sign(dout) wherever that neighbour lies within
// `reach` ulp of the exact value, to nearest elsewhere: a biased out of legal-looking size.
Tensor biased_out(const Tensor& exact_out, const Tensor& dout, double reach) {
  const std::vector<double> x = exact_out.to_f64(), g = dout.to_f64();
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double rn = static_cast<double>(static_cast<float>(Tensor::from_f64({1}, {x[i]}).to(DType::BF16).to_f64()[0]));
    y[i] = rn;
    if (g[i] == 0.0) continue;
    const int dir = g[i] > 0 ? 1 : -1;
    const double ulp = std::abs(bf16_step(rn, dir) - rn);
    const double toward = (x[i] - rn) * dir >= 0 ? bf16_step(rn, dir) : rn;  // the neighbour on dout's side
    if (std::abs(toward - x[i]) <= reach * ulp) y[i] = toward;
  }
  return Tensor::from_f64(exact_out.shape(), y).to(DType::BF16);
}

NamedOutputs grads_with(const Tensor& out, const SparseMlaGrads& g) {
  NamedOutputs o{{"out", out}, {"dq", g.dq.to(DType::F32)}, {"dkv", g.dkv.to(DType::F32)}};
  if (g.dsink) o["dsink"] = g.dsink->to(DType::F32);
  return o;
}

class DeltaSource : public ::testing::Test {
 protected:
  void SetUp() override {
    c = op_case_from_fixture(golden("smla_sink"));
    ASSERT_TRUE(c.mla.attn_sink.has_value());
    ASSERT_EQ(c.mla.q.dtype(), DType::BF16);
    const SparseMlaForward f = reference::sparse_mla_forward(c.mla);
    out = biased_out(f.out, c.dout, 0.85);
    // The premise: this out is legal by the forward rule, and not the nearest rounding.
    const OpReport fr = judge_outputs(Op::SparseMlaFwd, c,
                                      {{"out", out}, {"lse", f.lse.to(DType::F32)},
                                       {"max_logits", f.max_logits.to(DType::F32)}});
    ASSERT_TRUE(fr.passed()) << format_op_report(fr);
    ASSERT_FALSE(bitwise_equal(out, f.out.to(DType::BF16)));
    exact = reference::sparse_mla_backward(c.mla, c.dout);
    own = reference::sparse_mla_backward(c.mla, c.dout, reference::Precision::Reference, out);
  }
  OpReport judge(const NamedOutputs& o) { return judge_outputs(Op::SparseMlaBwd, c, o); }
  OpCase c;
  Tensor out;
  SparseMlaGrads exact, own;
};

bool has_note(const OpReport& r, const std::string& part) {
  for (const auto& n : r.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

TEST_F(DeltaSource, EitherLegalSourcePasses) {
  const OpReport from_own = judge(grads_with(out, own));
  EXPECT_TRUE(from_own.passed()) << format_op_report(from_own);
  EXPECT_TRUE(has_note(from_own, "Δ comes from the same out")) << format_op_report(from_own);
  const OpReport from_exact = judge(grads_with(out, exact));
  EXPECT_TRUE(from_exact.passed()) << format_op_report(from_exact);
  EXPECT_TRUE(has_note(from_exact, "agree with Δ from a precise out")) << format_op_report(from_exact);
}

// The fresh-user case: exact dq and dkv, a dsink 15 % off on one head.
TEST_F(DeltaSource, ABiasedOutCannotWidenTheBound) {
  SparseMlaGrads g = exact;
  std::vector<double> ds = g.dsink->to_f64();
  ds[0] *= 0.85;
  g.dsink = Tensor::from_f64(g.dsink->shape(), ds);
  const OpReport r = judge(grads_with(out, g));
  EXPECT_EQ(r.verdict, Verdict::Fail) << format_op_report(r);
  EXPECT_TRUE(has_note(r, "fit neither Δ source")) << format_op_report(r);
}

// Both readings fail: the report headlines the one under which fewer outputs fail, so it names
// the output wrong under both (fresh18 F3). Exact dq and dsink with a dkv whose largest key row
// is halved: with Δ from the biased out, the exact gradients fail besides dkv; with Δ from a
// precise out only dkv fails, and that reading is reported (the other named in a note).
TEST_F(DeltaSource, BothReadingsFailingHeadlineTheOutputWrongUnderBoth) {
  ASSERT_TRUE(judge(grads_with(out, exact)).passed());  // premise: exact gradients pass (precise reading)
  SparseMlaGrads g = exact;
  std::vector<double> dkv = g.dkv.to_f64();
  const int64_t d = g.dkv.size(g.dkv.dim() - 1);
  size_t worst = 0;
  double worst_norm = -1;
  for (size_t s = 0; s * d < dkv.size(); ++s) {
    double n = 0;
    for (int64_t c2 = 0; c2 < d; ++c2) n += std::abs(dkv[s * d + c2]);
    if (n > worst_norm) worst_norm = n, worst = s;
  }
  for (int64_t c2 = 0; c2 < d; ++c2) dkv[worst * d + c2] *= 0.5;
  g.dkv = Tensor::from_f64(g.dkv.shape(), dkv);
  const OpReport r = judge(grads_with(out, g));
  ASSERT_EQ(r.verdict, Verdict::Fail) << format_op_report(r);
  for (const auto& t : r.tensors) EXPECT_EQ(t.passed, t.name != "dkv") << t.name << "\n" << format_op_report(r);
  EXPECT_TRUE(has_note(r, "fit neither Δ source: reported with Δ from a precise out")) << format_op_report(r);
  EXPECT_TRUE(has_note(r, "under which fewer outputs fail (dkv")) << format_op_report(r);
}

// Gradients from two Δ sources at once (dq and dkv from one, dsink from the other) fit
// neither: the shift the biased out makes is far above either bound.
TEST_F(DeltaSource, MixedSourcesFail) {
  SparseMlaGrads a = own, b = exact;
  a.dsink = exact.dsink;
  b.dsink = own.dsink;
  for (const SparseMlaGrads* g : {&a, &b}) {
    const OpReport r = judge(grads_with(out, *g));
    EXPECT_EQ(r.verdict, Verdict::Fail) << format_op_report(r);
  }
}

// Detection on this case, from either source: each head's dsink 1 % off (the bf16-work
// dsink threshold of docs/what-a-pass-means.md) fails.
TEST_F(DeltaSource, EachDsinkHeadOnePercentOffFails) {
  for (const SparseMlaGrads* src : {&own, &exact}) {
    const std::vector<double> base = src->dsink->to_f64();
    for (size_t h = 0; h < base.size(); ++h) {
      if (base[h] == 0.0) continue;
      SparseMlaGrads g = *src;
      std::vector<double> ds = base;
      ds[h] *= 1.01;
      g.dsink = Tensor::from_f64(src->dsink->shape(), ds);
      const OpReport r = judge(grads_with(out, g));
      EXPECT_EQ(r.verdict, Verdict::Fail) << "head " << h << (src == &own ? " own Δ" : " exact Δ");
    }
  }
}

// Both readings fail dsink alone (fresh19): the report headlines the reading under which fewer
// elements fail, so it names the head that is wrong under both. An out biased by up to 0.5 ulp
// (dq and dkv then fit either Δ source) and dsink from one source with head 0 15 % off: under
// the other source 7 heads' dsink fail; under its own only head 0. Before, the
// gradients whose dsink came from the precise Δ were reported with Δ from the candidate's
// out, 7 failing heads.
TEST(DeltaSourceTie, DsinkAloneFailingHeadlinesTheReadingWithFewerFailingElements) {
  const OpCase c = op_case_from_fixture(golden("smla_sink"));
  const SparseMlaForward f = reference::sparse_mla_forward(c.mla);
  const Tensor out = biased_out(f.out, c.dout, 0.5);
  const SparseMlaGrads exact = reference::sparse_mla_backward(c.mla, c.dout);
  const SparseMlaGrads own = reference::sparse_mla_backward(c.mla, c.dout, reference::Precision::Reference, out);
  for (const SparseMlaGrads* src : {&exact, &own}) {
    SparseMlaGrads g = exact;  // dq and dkv: exact (they fit either source here)
    std::vector<double> ds = src->dsink->to_f64();
    ds[0] *= 0.85;
    g.dsink = Tensor::from_f64(src->dsink->shape(), ds);
    const OpReport r = judge_outputs(Op::SparseMlaBwd, c, grads_with(out, g));
    const char* from = src == &own ? "dsink with Δ from the candidate's out" : "dsink with Δ from a precise out";
    ASSERT_EQ(r.verdict, Verdict::Fail) << from << "\n" << format_op_report(r);
    for (const auto& t : r.tensors) {
      EXPECT_EQ(t.passed, t.name != "dsink") << from << ": " << t.name << "\n" << format_op_report(r);
      if (t.name != "dsink") continue;
      EXPECT_EQ(t.failed_elements, 1) << from << "\n" << format_op_report(r);
      ASSERT_FALSE(t.failures.empty());
      EXPECT_EQ(t.failures[0].flat, 0) << from << "\n" << format_op_report(r);
    }
    EXPECT_TRUE(has_note(r, "fit neither Δ source")) << from << "\n" << format_op_report(r);
  }
}

}  // namespace
}  // namespace dsa::oracle
