// lse and max_logits leave the sink out (SPEC §4: "lse and max_logits unchanged"), so their
// bounds must not grow with it. A fresh user (fresh11 F1) found lse's floor at about
// 0.8 u·|sink|: the floor took the exp arguments of the backward's p_j = exp(P_j - L), L the
// sink-inclusive normaliser, so a large finite sink made the exact lse WEAK (a false alarm from
// a sink of about 1e5 up) and, under --allow-weak, let an lse off by 1.0 agree at a sink of 1e8.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsa/oracle/fixture_check.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::oracle {
namespace {

class LseAndSink : public ::testing::Test {
 protected:
  void SetUp() override {
    base = op_case_from_fixture(
        fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/smla_sink.safetensors"));
    ASSERT_TRUE(base.mla.attn_sink.has_value());
    h_q = base.mla.q.shape()[1];
  }
  // the golden case with head 0's sink set to s
  OpCase with_sink(double s) const {
    OpCase c = base;
    std::vector<double> v = c.mla.attn_sink->to_f64();
    v[0] = s;
    c.mla.attn_sink = Tensor::from_f64({h_q}, v).to(DType::F32);
    return c;
  }
  // correct outputs as a bf16 kernel returns them: out rounded once, lse and max_logits fp32
  static NamedOutputs correct(const OpCase& c) {
    const SparseMlaForward f = reference::sparse_mla_forward(c.mla);
    return {{"out", f.out.to(c.mla.q.dtype())}, {"lse", f.lse.to(DType::F32)},
            {"max_logits", f.max_logits.to(DType::F32)}};
  }
  static const TensorCheck& check_of(const OpReport& r, const std::string& name) {
    for (const auto& t : r.tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no " + name + " in the report");
  }
  OpCase base;
  int64_t h_q = 0;
};

const double kLargeSinks[] = {1e3, 1e5, 1e6, 1e8, 3e38};

// The exact outputs agree, with no WEAK row, whatever the sink.
TEST_F(LseAndSink, CorrectOutputsAgreeUnderAnyLargeSink) {
  for (const double s : kLargeSinks) {
    const OpCase c = with_sink(s);
    const OpReport r = judge_outputs(Op::SparseMlaFwd, c, correct(c));
    EXPECT_EQ(r.verdict, Verdict::Pass) << "sink " << s << "\n" << format_op_report(r);
  }
}

// lse's and max_logits' bounds of head 0 are those of the same case without its sink: a sink
// far above the logits changes neither value, so it changes neither bound.
TEST_F(LseAndSink, BoundsOfLseAndMaxLogitsIgnoreASinkFarAboveTheLogits) {
  const OpCase none = with_sink(-std::numeric_limits<double>::infinity());
  const OpReport ref = judge_outputs(Op::SparseMlaFwd, none, correct(none));
  for (const double s : kLargeSinks) {
    const OpCase c = with_sink(s);
    const OpReport r = judge_outputs(Op::SparseMlaFwd, c, correct(c));
    for (const char* name : {"lse", "max_logits"}) {
      const TensorCheck &a = check_of(r, name), &b = check_of(ref, name);
      ASSERT_EQ(a.row_max_bound.size(), b.row_max_bound.size());
      for (size_t row = 0; row < a.row_max_bound.size(); row += static_cast<size_t>(h_q))
        EXPECT_EQ(a.row_max_bound[row], b.row_max_bound[row]) << name << " row " << row << " sink " << s;
    }
  }
}

// An lse off by 2θ (θ = 1e-4, fp32) in one row of the large-sink head fails, named as a
// failure (not WEAK); so does an lse off by 1.0 on every (nonempty) row of that head.
TEST_F(LseAndSink, AWrongLseOfTheLargeSinkHeadFails) {
  for (const double s : kLargeSinks) {
    const OpCase c = with_sink(s);
    NamedOutputs one = correct(c), all = correct(c);
    std::vector<double> l1 = one.at("lse").to_f64(), la = l1;
    l1[0] += 2e-4 * std::max(1.0, std::abs(l1[0]));
    int64_t finite = 0;  // an empty row's lse is -inf, which + 1.0 leaves right
    for (size_t row = 0; row < la.size(); row += static_cast<size_t>(h_q)) {
      la[row] += 1.0;
      finite += std::isfinite(la[row]);
    }
    one.at("lse") = Tensor::from_f64(one.at("lse").shape(), l1).to(DType::F32);
    all.at("lse") = Tensor::from_f64(all.at("lse").shape(), la).to(DType::F32);
    const OpReport r1 = judge_outputs(Op::SparseMlaFwd, c, one);
    const OpReport ra = judge_outputs(Op::SparseMlaFwd, c, all);
    EXPECT_EQ(r1.verdict, Verdict::Fail) << "sink " << s << "\n" << format_op_report(r1);
    EXPECT_EQ(ra.verdict, Verdict::Fail) << "sink " << s << "\n" << format_op_report(ra);
    EXPECT_GT(check_of(r1, "lse").failed_elements, 0);
    EXPECT_GT(finite, 0);
    EXPECT_EQ(check_of(ra, "lse").failed_elements, finite);
  }
}

}  // namespace
}  // namespace dsa::oracle
