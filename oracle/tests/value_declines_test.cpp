// Declines that depend on the values of a call, never a limit of the kernel (fresh11 F10, a
// false pass with exit 0):
// - a deterministic backend returned a wrong out on the first call of a case and declined the
//   identical second call (the determinism run, SPEC §3.5): the check became a skip and the
//   wrong first outputs were never judged;
// - a backend declined every sparse MLA case whose ids are all valid and distinct (no
//   SPEC-mandatory feature) while running the same cases with an invalid id: the goldens were
//   skips, "a limit of the kernel (a shape, dtype or optional input)".
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"

namespace dsa::oracle {
namespace {

// The reference backend for sparse MLA, with one of the two faults above.
class ValueDecliner final : public Backend {
 public:
  enum class Mode { DeclinesTheSecondRun, DeclinesAllValidIds };
  explicit ValueDecliner(Mode m) : mode_(m) {}
  std::string name() const override { return "value-decliner"; }
  bool supports(Op op) const override { return op == Op::SparseMlaFwd || op == Op::SparseMlaBwd; }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    decline_if_asked(in);
    SparseMlaForward f = inner_->sparse_mla_forward(in);
    if (mode_ == Mode::DeclinesTheSecondRun) {  // wrong by 1.5x on the run that is returned
      std::vector<double> v = f.out.to_f64();
      for (double& x : v) x *= 1.5;
      f.out = Tensor::from_f64(f.out.shape(), v).to(f.out.dtype());
    }
    return f;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    decline_if_asked(in);
    return inner_->sparse_mla_backward(in, dout);
  }
  int calls = 0;

 private:
  void decline_if_asked(const SparseMlaInputs& in) {
    ++calls;
    if (mode_ == Mode::DeclinesTheSecondRun && calls % 2 == 0) throw NotSupported("second call declined");
    if (mode_ == Mode::DeclinesAllValidIds && !sparse_mla_slot_features(in).invalid &&
        !sparse_mla_slot_features(in).duplicates)
      throw NotSupported("only cases with some invalid or duplicate id are implemented");
  }
  Mode mode_;
  std::unique_ptr<Backend> inner_ = make_reference_backend();
};

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

// Declining the determinism run after returning outputs fails the op, and the first outputs
// are still judged (out fails: 1.5x the reference).
TEST(ValueDeclines, DecliningTheSecondRunFailsAndTheFirstOutputsAreJudged) {
  ValueDecliner b(ValueDecliner::Mode::DeclinesTheSecondRun);
  const std::vector<OpReport> rs = judge_fixture_ops(golden("smla_basic"), b);
  ASSERT_FALSE(rs.empty());
  const OpReport& fwd = rs.front();
  ASSERT_EQ(fwd.op, "sparse_mla_fwd");
  EXPECT_EQ(fwd.verdict, Verdict::Fail) << format_op_report(fwd);
  EXPECT_NE(fwd.reason.find("declined the second run of the same call"), std::string::npos) << fwd.reason;
  bool out_failed = false;
  for (const auto& t : fwd.tensors) out_failed = out_failed || (t.name == "out" && t.failed_elements > 0);
  EXPECT_TRUE(out_failed) << format_op_report(fwd);
}

// A case without any SPEC-mandatory feature that the backend declines but runs with one id
// set to -1 is INCOMPLETE (exit 1), naming the values; a backend that declines that twin too
// (a real limit) keeps the skip.
TEST(ValueDeclines, DecliningAllValidIdsIsIncomplete) {
  for (const char* name : {"smla_basic"}) {
    SCOPED_TRACE(name);
    ValueDecliner b(ValueDecliner::Mode::DeclinesAllValidIds);
    const std::vector<OpReport> rs = judge_fixture_ops(golden(name), b);
    ASSERT_FALSE(rs.empty());
    for (const auto& r : rs) {
      EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
      EXPECT_NE(r.reason.find("the decline depends on the values"), std::string::npos) << r.reason;
    }
  }
  class DeclinesEverything final : public Backend {
   public:
    std::string name() const override { return "declines-everything"; }
    bool supports(Op op) const override { return op == Op::SparseMlaFwd; }
    SparseMlaForward sparse_mla_forward(const SparseMlaInputs&) override { throw NotSupported("d_qk 32 not built"); }
  } all;
  const std::vector<OpReport> rs = judge_fixture_ops(golden("smla_basic"), all);
  ASSERT_FALSE(rs.empty());
  EXPECT_EQ(rs.front().verdict, Verdict::Skip) << rs.front().reason;
}

// ---- one twin per feature (fresh-user F6) -------------------------------------------------

// A top-k case of 2 rows x 8 keys holding NaN (row 0) and -inf (row 1), k = 3, no tie at the
// k-th value: the two features of F6's declined long-row draws, side by side.
fixtures::Fixture nan_and_neg_inf_case() {
  fixtures::Fixture f;
  f.case_name = "topk_nan_and_neg_inf";
  f.op = "topk";
  const double nan = std::nan(""), ninf = -INFINITY;
  f.inputs["scores"] =
      Tensor::from_f64({2, 8}, {8, 7, nan, 5, 4, 3, 2, 1, 9, ninf, 6, 5.5, 4.5, 3, 2, 1}).to(DType::F32);
  f.params = {{"k", 3}, {"tie_break", "small"}, {"sorted", true}};
  return f;
}

// The reference's top-k, declining each call that holds the features `kMode` names: 1 any -inf,
// 2 any NaN, 3 NaN and -inf together, 4 NaN or -inf.
template <int kMode>
class TopkFeatureDecliner final : public Backend {
 public:
  std::string name() const override { return "topk_feature_decliner_" + std::to_string(kMode); }
  bool supports(Op op) const override { return op == Op::Topk; }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    bool nan = false, ninf = false;
    for (int64_t i = 0; i < s.numel(); ++i) {
      nan = nan || std::isnan(s.get(i));
      ninf = ninf || s.get(i) == -INFINITY;
    }
    const bool decline = kMode == 1 ? ninf : kMode == 2 ? nan : kMode == 3 ? (nan && ninf) : (nan || ninf);
    if (decline) throw NotSupported("these scores are not supported");
    return inner_->select_topk(s, k, p, w);
  }

 private:
  std::unique_ptr<Backend> inner_ = make_reference_backend();
};

// The one report of the top-k case on `b` with `unsupported` named.
OpReport topk_report(Backend& b, const std::vector<std::string>& unsupported) {
  CheckOptions opt;
  opt.unsupported = unsupported;
  const std::vector<OpReport> rs = judge_fixture_ops(nan_and_neg_inf_case(), b, opt);
  EXPECT_EQ(rs.size(), 1u);
  return rs.empty() ? OpReport{} : rs.front();
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A kernel declining -inf only is INCOMPLETE for -inf alone (never NaN), a skip naming it with
// --unsupported neg_inf_scores; naming NaN instead leaves it INCOMPLETE.
TEST(TwinDeclines, DecliningNegInfOnlyIsLaidToNegInfAlone) {
  TopkFeatureDecliner<1> b;
  const OpReport plain = topk_report(b, {});
  EXPECT_EQ(plain.verdict, Verdict::Incomplete) << plain.reason;
  EXPECT_TRUE(has(plain.reason, "holds -inf scores")) << plain.reason;
  EXPECT_TRUE(has(plain.reason, "--unsupported neg_inf_scores ")) << plain.reason;
  EXPECT_FALSE(has(plain.reason, "NaN")) << plain.reason;
  const OpReport named = topk_report(b, {"neg_inf_scores"});
  EXPECT_EQ(named.verdict, Verdict::Skip) << named.reason;
  EXPECT_TRUE(has(named.reason, "named unsupported: neg_inf_scores")) << named.reason;
  EXPECT_EQ(topk_report(b, {"nan_scores"}).verdict, Verdict::Incomplete);
}

// A kernel declining NaN only is INCOMPLETE for NaN, named -inf or not; a skip with nan_scores.
TEST(TwinDeclines, DecliningNanOnlyIsLaidToNanAlone) {
  TopkFeatureDecliner<2> b;
  for (const std::vector<std::string>& names : {std::vector<std::string>{}, {"neg_inf_scores"}}) {
    const OpReport r = topk_report(b, names);
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.reason;
    EXPECT_TRUE(has(r.reason, "holds NaN scores")) << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported nan_scores ")) << r.reason;
    EXPECT_FALSE(has(r.reason, "-inf scores (")) << r.reason;
  }
  const OpReport named = topk_report(b, {"nan_scores"});
  EXPECT_EQ(named.verdict, Verdict::Skip) << named.reason;
  EXPECT_TRUE(has(named.reason, "named unsupported: nan_scores")) << named.reason;
}

// Declining the two together: the twin without -inf runs, so naming -inf alone explains the
// decline (a skip; before, both twins ran and NaN was blamed too). Declining either: the twin
// without -inf still holds NaN and is declined, so naming -inf alone leaves NaN INCOMPLETE.
TEST(TwinDeclines, NamingOneFeatureWaivesOnlyWhatItsTwinShows) {
  TopkFeatureDecliner<3> together;
  EXPECT_EQ(topk_report(together, {}).verdict, Verdict::Incomplete);
  const OpReport t = topk_report(together, {"neg_inf_scores"});
  EXPECT_EQ(t.verdict, Verdict::Skip) << t.reason;
  EXPECT_TRUE(has(t.reason, "named unsupported: neg_inf_scores")) << t.reason;
  EXPECT_EQ(topk_report(together, {"nan_scores"}).verdict, Verdict::Skip);

  TopkFeatureDecliner<4> either;
  const OpReport e = topk_report(either, {"neg_inf_scores"});
  EXPECT_EQ(e.verdict, Verdict::Incomplete) << e.reason;
  EXPECT_TRUE(has(e.reason, "--unsupported nan_scores ")) << e.reason;
  const OpReport both = topk_report(either, {"neg_inf_scores", "nan_scores"});
  EXPECT_EQ(both.verdict, Verdict::Skip) << both.reason;
  EXPECT_TRUE(has(both.reason, "named unsupported: neg_inf_scores, nan_scores")) << both.reason;
}

// The reference's sparse MLA, declining each call holding invalid slots (kMode 1) or repeated
// valid ids in a row (kMode 2).
template <int kMode>
class SlotDecliner final : public Backend {
 public:
  std::string name() const override { return "slot_decliner_" + std::to_string(kMode); }
  bool supports(Op op) const override { return op == Op::SparseMlaFwd || op == Op::SparseMlaBwd; }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    decline(in);
    return inner_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    decline(in);
    return inner_->sparse_mla_backward(in, dout);
  }

 private:
  static void decline(const SparseMlaInputs& in) {
    const SlotFeatures f = sparse_mla_slot_features(in);
    if (kMode == 1 && f.invalid) throw NotSupported("invalid ids not supported");
    if (kMode == 2 && f.duplicates) throw NotSupported("repeated ids not supported");
  }
  std::unique_ptr<Backend> inner_ = make_reference_backend();
};

// smla_extreme_row_in_batch holds invalid and repeated ids: a kernel declining invalid ids runs
// its twin without them (repeats kept), so --unsupported invalid_ids makes it a skip (before, the
// twin without every feature was the only one, and the repeats were blamed); a kernel declining
// repeats runs the twin without them (invalid ids kept): INCOMPLETE for duplicate_ids alone.
TEST(TwinDeclines, SparseMlaDeclinesAreLaidToOneFeatureEach) {
  const fixtures::Fixture f = golden("smla_extreme_row_in_batch");
  ASSERT_EQ(fixture_ops(f).size(), 2u);  // forward and backward, each judged below
  CheckOptions named;
  named.unsupported = {"invalid_ids"};
  SlotDecliner<1> invalid;
  for (const OpReport& r : judge_fixture_ops(f, invalid, named)) {
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "named unsupported: invalid_ids")) << r.reason;
  }
  for (const OpReport& r : judge_fixture_ops(f, invalid)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "holds invalid ids")) << r.reason;
    EXPECT_FALSE(has(r.reason, "duplicate ids")) << r.reason;
  }
  SlotDecliner<2> repeats;
  for (const OpReport& r : judge_fixture_ops(f, repeats, named)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "holds duplicate ids")) << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported duplicate_ids ")) << r.reason;
    EXPECT_FALSE(has(r.reason, "holds invalid ids")) << r.reason;
  }
  CheckOptions dups;
  dups.unsupported = {"duplicate_ids"};
  for (const OpReport& r : judge_fixture_ops(f, repeats, dups)) {
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "named unsupported: duplicate_ids")) << r.reason;
  }
}

// decline_cause is the one twin test: what it returns for the top-k case, per feature.
TEST(TwinDeclines, DeclineCauseNamesEachFeature) {
  const OpCase c = op_case_from_fixture(nan_and_neg_inf_case());
  TopkFeatureDecliner<1> ninf;
  const DeclineCause plain = decline_cause(ninf, Op::Topk, c);
  EXPECT_EQ(plain.held, (std::vector<std::string>{"neg_inf_scores", "nan_scores"}));
  EXPECT_EQ(plain.depends_on, std::vector<std::string>{"neg_inf_scores"});
  EXPECT_TRUE(plain.waived.empty());
  EXPECT_FALSE(plain.by_values);
  const DeclineCause named = decline_cause(ninf, Op::Topk, c, {"neg_inf_scores"});
  EXPECT_TRUE(named.depends_on.empty());
  EXPECT_EQ(named.waived, std::vector<std::string>{"neg_inf_scores"});
  EXPECT_FALSE(named.incomplete());
  // Other ops have no twin: nothing shown.
  EXPECT_FALSE(decline_cause(ninf, Op::IndexerScores, c).incomplete());
}

}  // namespace
}  // namespace dsa::oracle
