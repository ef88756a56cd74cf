// Issue 13: each computation once per case. The producer and every backend judged on one
// fixture share its OpCase's memo, so the float64 reference, each baseline and each floor set
// run once however many candidates are judged. computation_counts() counts every run of
// those computations, memoized or not, so the same count without the memo shows the repeats
// the memo removes (the test can fail).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dsa/oracle/case_memo.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/oracle/scoped_case_memo.h"

namespace dsa::oracle {
namespace {

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

// Computations made by fn(), by kind.
template <class Fn>
std::map<std::string, int64_t> counted(Fn&& fn) {
  const auto before = computation_counts();
  fn();
  std::map<std::string, int64_t> diff;
  for (const auto& [kind, n] : computation_counts()) {
    auto it = before.find(kind);
    const int64_t d = n - (it == before.end() ? 0 : it->second);
    if (d) diff[kind] = d;
  }
  return diff;
}

// Judges the producer and two backends (three candidates) on one case; returns the report text.
std::string judge_three(const fixtures::Fixture& f, const OpCase& c) {
  auto ref = make_reference_backend();
  auto ref2 = make_reference_backend();
  FixtureReport r = check_fixture(f, c, ref.get());
  for (auto& rep : judge_fixture_ops(f, c, *ref2)) r.backend_vs_reference.push_back(std::move(rep));
  EXPECT_TRUE(r.passed()) << format_fixture_report(r);
  return format_fixture_report(r);
}

// With the case's memo every kind runs once; without it (a copy of the case with no memo) the
// kinds in `repeated` run once per candidate; the reports are the same.
void expect_once_per_case(const std::string& fixture, const std::vector<std::string>& kinds,
                          const std::vector<std::string>& repeated) {
  SCOPED_TRACE(fixture);
  const fixtures::Fixture f = golden(fixture);
  const OpCase c = op_case_from_fixture(f);
  ASSERT_TRUE(c.memo) << "op_case_from_fixture must give the case a memo";
  std::string shared_report, plain_report;
  const auto shared = counted([&] { shared_report = judge_three(f, c); });
  for (const auto& k : kinds) EXPECT_EQ(shared.count(k), 1u) << k << " was not computed";
  // Each memo key (a kind on one set of inputs, e.g. a poisoned re-run's) ran once, and
  // nothing ran outside the memo.
  std::map<std::string, int64_t> keys_of_kind;
  for (const auto& [key, n] : c.memo->counts()) {
    EXPECT_EQ(n, 1) << key << " computed " << n << " times on one case";
    ++keys_of_kind[key.substr(0, key.find('@'))];
  }
  for (const auto& [k, n] : shared)
    EXPECT_EQ(n, keys_of_kind[k]) << k << " computed outside the case's memo";
  OpCase plain = c;
  plain.memo.reset();
  const auto repeats = counted([&] { plain_report = judge_three(f, plain); });
  for (const auto& k : repeated) {
    ASSERT_TRUE(repeats.count(k)) << k;
    EXPECT_GE(repeats.at(k), 3 * shared.at(k)) << k << ": without the memo every candidate computes it";
  }
  EXPECT_EQ(shared_report, plain_report) << "sharing changed a report";
}

TEST(CaseSharing, SparseMlaReferenceBaselineAndFloorsOncePerCase) {
  expect_once_per_case("smla_sink",
                       {"sparse_mla_fwd/reference", "sparse_mla_fwd/baseline",
                        "sparse_mla_bwd/reference", "sparse_mla_bwd/baseline",
                        "sparse_mla_fwd+bwd/floors/F32"},
                       {"sparse_mla_fwd/reference", "sparse_mla_fwd/baseline",
                        "sparse_mla_bwd/reference", "sparse_mla_bwd/baseline"});
}

// A 16-bit candidate's sparse MLA floors bring those of fp32 work along: the reference
// backend (f64 outputs) judged next on the case computes no floors of its own.
TEST(CaseSharing, Bf16CandidateThenReferenceComputeTheFloorsOnce) {
  const fixtures::Fixture f = golden("smla_sink");
  const OpCase c = op_case_from_fixture(f);
  auto ref = make_reference_backend();
  const SparseMlaForward fwd = ref->sparse_mla_forward(c.mla);
  const NamedOutputs bf16_out = {{"out", fwd.out.to(DType::BF16)}};
  CheckOptions opt;
  opt.provided_outputs = std::set<std::string>{"out"};
  const auto n = counted([&] {
    EXPECT_TRUE(judge_outputs(Op::SparseMlaFwd, c, bf16_out, opt, "bf16").passed());
    for (const auto& r : judge_fixture_ops(f, c, *ref)) EXPECT_TRUE(r.passed()) << r.reason;
  });
  int64_t floors = 0;
  for (const auto& [k, m] : n)
    if (k.find("/floors/") != std::string::npos) floors += m;
  EXPECT_EQ(floors, 1) << "the fp32-work floors were computed again";
  EXPECT_EQ(n.count("sparse_mla_fwd+bwd/floors/BF16"), 1u);
}

TEST(CaseSharing, IndexerAndKlOncePerCase) {
  expect_once_per_case("idx_causal",
                       {"indexer_scores/reference", "indexer_scores/baseline",
                        "indexer_scores/floors", "indexer_scores_backward/reference",
                        "indexer_scores_backward/baseline", "indexer_scores_backward/floors"},
                       {"indexer_scores/reference", "indexer_scores_backward/floors"});
  expect_once_per_case("kl_sparse_causal",
                       {"indexer_kl_loss/reference", "indexer_kl_loss/baseline",
                        "indexer_kl_loss/floors"},
                       {"indexer_kl_loss/reference", "indexer_kl_loss/floors"});
}

TEST(CaseSharing, Fp8OpsOncePerCase) {
  expect_once_per_case("fp8_idx_prefix_amax",
                       {"fp8_indexer_scores/reference", "fp8_indexer_scores/baseline",
                        "fp8_indexer_scores/floors"},
                       {"fp8_indexer_scores/reference"});
  expect_once_per_case("paged_idx_mtp2",
                       {"paged_indexer_scores/reference", "paged_indexer_scores/baseline",
                        "paged_indexer_scores/floors"},
                       {"paged_indexer_scores/floors"});
  expect_once_per_case("smla_fp8_decode",
                       {"sparse_mla_fp8_fwd/reference", "sparse_mla_fp8_fwd/baseline"},
                       {"sparse_mla_fp8_fwd/reference"});
}

// The reference backend with a count of the computations it makes itself.
class CountingReference : public Backend {
 public:
  std::string name() const override { return "reference"; }
  bool supports(Op op) const override { return inner_->supports(op); }
  bool computes_reference() const override { return inner_->computes_reference(); }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w,
                        const KeyWindows& win) override {
    ++calls["indexer_scores/reference"];
    return inner_->indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    ++calls["indexer_scores_backward/reference"];
    return inner_->indexer_scores_backward(q, k, w, win, d);
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& win) override {
    return inner_->select_topk(s, k, p, win);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    ++calls["sparse_mla_fwd/reference"];
    return inner_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    ++calls["sparse_mla_bwd/reference"];
    return inner_->sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    ++calls["indexer_kl_loss/reference"];
    return inner_->indexer_kl_loss(in);
  }
  std::map<std::string, int64_t> calls;

 private:
  std::unique_ptr<Backend> inner_ = make_reference_backend();
};

// The reference backend judged as a candidate (fixtures check, audit --backend reference)
// takes its results from the case's memo: with the producer judged too, each reference
// result is computed once per case, counting the backend's own calls (before: the sparse
// MLA forward 3 more times per file: two determinism runs and the backward's look at its
// out dtype; the backward 2 more times).
TEST(CaseSharing, ReferenceBackendAsCandidateSharesTheCaseReference) {
  for (const auto& [fixture, kinds] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"smla_sink", {"sparse_mla_fwd/reference", "sparse_mla_bwd/reference"}},
           {"idx_causal", {"indexer_scores/reference", "indexer_scores_backward/reference"}},
           {"kl_sparse_causal", {"indexer_kl_loss/reference"}}}) {
    SCOPED_TRACE(fixture);
    const fixtures::Fixture f = golden(fixture);
    const OpCase c = op_case_from_fixture(f);
    CountingReference ref;
    const auto n = counted([&] {
      FixtureReport r = check_fixture(f, c, nullptr);
      for (auto& rep : judge_fixture_ops(f, c, ref)) r.backend_vs_reference.push_back(std::move(rep));
      EXPECT_TRUE(r.passed()) << format_fixture_report(r);
    });
    for (const auto& k : kinds) {
      const int64_t own = ref.calls.count(k) ? ref.calls.at(k) : 0;
      EXPECT_EQ(own + (n.count(k) ? n.at(k) : 0), 1)
          << k << ": " << own << " computed by the backend itself";
    }
  }
}

TEST(CaseSharing, ACopyWithChangedInputsDoesNotShareResults) {
  const fixtures::Fixture f = golden("smla_basic");
  const OpCase c = op_case_from_fixture(f);
  auto ref = make_reference_backend();
  ASSERT_TRUE(check_fixture(f, c, ref.get()).passed());
  // A perturbed copy keeps the memo pointer; its fingerprint differs, so it computes afresh
  // and its (now wrong) stored outputs disagree.
  OpCase perturbed = c;
  perturbed.mla.q.set(0, perturbed.mla.q.get(0) + 1.0);
  const auto n = counted([&] {
    EXPECT_FALSE(check_fixture(f, perturbed, nullptr).passed())
        << "the producer's outputs agreed with a changed q";
  });
  EXPECT_EQ(n.count("sparse_mla_fwd/reference"), 1u) << "a changed q reused the original's reference";
}

// A case without a memo of its own uses the thread's scoped one (ScopedCaseMemo, what the
// property runner gives each draw): the forward and backward checks of the case, and a second
// backend judged on it, compute each reference, baseline and floor set once, with the reports
// of the memo-less judgement; outside the scope every check computes its own.
TEST(CaseSharing, AScopedMemoServesCasesWithoutTheirOwn) {
  const fixtures::Fixture f = golden("smla_sink");
  OpCase c = op_case_from_fixture(f);
  c.memo.reset();
  auto ref = make_reference_backend();
  auto judge_twice = [&] {
    std::string text;
    for (int i = 0; i < 2; ++i) {
      const OpReport fwd = check_sparse_mla_forward(*ref, c);
      const OpReport bwd = check_sparse_mla_backward(*ref, c);
      EXPECT_TRUE(fwd.passed() && bwd.passed()) << format_op_report(fwd) << format_op_report(bwd);
      text += format_op_report(fwd) + format_op_report(bwd);
    }
    return text;
  };
  EXPECT_EQ(scoped_case_memo(), nullptr);
  std::string plain_report, scoped_report;
  const auto plain = counted([&] { plain_report = judge_twice(); });
  auto memo = std::make_shared<CaseMemo>();
  std::map<std::string, int64_t> scoped;
  {
    const ScopedCaseMemo scope(memo);
    EXPECT_EQ(scoped_case_memo(), memo.get());
    {
      const ScopedCaseMemo none(nullptr);  // nestable; null: no memo inside
      EXPECT_EQ(scoped_case_memo(), nullptr);
    }
    EXPECT_EQ(scoped_case_memo(), memo.get());
    scoped = counted([&] { scoped_report = judge_twice(); });
  }
  EXPECT_EQ(scoped_case_memo(), nullptr) << "the scope did not restore the previous memo";
  for (const std::string k : {"sparse_mla_fwd/reference", "sparse_mla_fwd/baseline", "sparse_mla_bwd/reference"}) {
    EXPECT_EQ(scoped.count(k) ? scoped.at(k) : 0, 1) << k << " under the scoped memo";
    EXPECT_GE(plain.count(k) ? plain.at(k) : 0, 2) << k << " without a memo";
  }
  for (const auto& [key, n] : memo->counts()) EXPECT_EQ(n, 1) << key;
  EXPECT_EQ(scoped_report, plain_report) << "the scoped memo changed a report";
  // A case with a memo of its own keeps it.
  OpCase own = op_case_from_fixture(f);
  auto other = std::make_shared<CaseMemo>();
  {
    const ScopedCaseMemo scope(other);
    EXPECT_TRUE(check_sparse_mla_forward(*ref, own).passed());
  }
  EXPECT_EQ(other->total_computations(), 0) << "a case with its own memo used the scoped one";
  EXPECT_GT(own.memo->total_computations(), 0);
}

}  // namespace
}  // namespace dsa::oracle
