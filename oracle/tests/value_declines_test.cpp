// Declines that depend on the values of a call, never a limit of the kernel (fresh11 F10, a
// false pass with exit 0):
// - a deterministic backend returned a wrong out on the first call of a case and declined the
//   identical second call (the determinism run, SPEC §3.5): the check became a skip and the
//   wrong first outputs were never judged;
// - a backend declined every sparse MLA case whose ids are all valid and distinct (no
//   SPEC-mandatory feature) while running the same cases with an invalid id: the goldens were
//   skips, "a limit of the kernel (a shape, dtype or optional input)".
#include <gtest/gtest.h>

#include <memory>
#include <string>

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

}  // namespace
}  // namespace dsa::oracle
