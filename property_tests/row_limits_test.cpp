// Row counts and top-k widths of production kernels (fresh-user finding 7: a kernel returning
// empty rows from query row 128 on, and a top-k writing -1 past the first 2048 ids, passed the
// audit). The properties that reach them fail the row- and width-limit mutants at level 0 on
// every seed, a row cutoff shrinks to the first row past it, and the reference passes.
#include <gtest/gtest.h>

#include <rapidcheck.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/generators.h"
#include "dsa/property_tests/suite.h"
#include "prop_test_util.h"

namespace dsa::props {
namespace {

using test::last_field;
using test::level0;
using test::mutant_named;
using test::property_named;

struct Limit {
  const char* mutant;
  const char* property;
  const char* shrunk_field;  // the shape the limit is on
  int64_t limit;
  int64_t shrinks_to_at_most;  // below every drawn value (s_q >= 257, k >= 2049 drawn)
};
const Limit kLimits[] = {
    {"topk_rows_from_128_empty", "topk.many_rows", " s_q=", 128, 256},
    {"indexer_rows_from_128_masked", "indexer.many_rows", " s_q=", 128, 256},
    {"smla_rows_from_128_empty", "smla.many_rows", " s_q=", 128, 256},
    {"topk_k_capped_at_2048", "topk.wide_k", " k=", 2048, 2049},
};

// Level 0 on seeds 1, 2, 3 and a fresh one (0: RapidCheck's own): every run fails, without
// shrinking as the audit runs a plugin.
TEST(RowLimits, MutantsFailAtLevel0OnEverySeed) {
  for (const Limit& l : kLimits)
    for (uint64_t seed : {1u, 2u, 3u, 0u}) {
      const PropertyResult r = run_property(mutant_named(l.mutant), property_named(l.property), level0(seed));
      EXPECT_EQ(r.verdict, oracle::Verdict::Fail) << l.mutant << " passed " << l.property << " at seed " << seed;
    }
}

// With shrinking (the in-process runs), the counterexample shrinks below every drawn shape
// toward the limit: s_q in (128, 256] for a row cutoff (measured at seed 7: 129 for the three
// ops; a sparse MLA draw whose rows from 128 on have no valid slot stops above 129), k = 2049
// for the width cap.
TEST(RowLimits, CounterexampleShrinksTowardTheLimit) {
  for (const Limit& l : kLimits) {
    const PropertyResult r =
        run_property(mutant_named(l.mutant), property_named(l.property), level0(7, /*shrink=*/true));
    ASSERT_EQ(r.verdict, oracle::Verdict::Fail) << l.mutant;
    const int64_t shrunk = last_field(r.message, l.shrunk_field);
    std::cout << l.mutant << ": " << l.property << " shrunk to" << l.shrunk_field << shrunk << "\n";
    EXPECT_GT(shrunk, l.limit) << r.message.substr(0, 400);
    EXPECT_LE(shrunk, l.shrinks_to_at_most) << "did not shrink toward the limit: " << r.message.substr(0, 400);
  }
}

// The reference passes the same properties at level 0 on those seeds.
TEST(RowLimits, ReferencePassesOnEverySeed) {
  for (const char* name : {"topk.many_rows", "topk.wide_k", "indexer.many_rows", "smla.many_rows"})
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult r =
          run_property(backend_subject("reference"), property_named(name), level0(seed, /*shrink=*/true));
      EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << name << " seed " << seed << ": " << r.message;
    }
}

// Each many-row property judges one op in one direction: a fault of the backward alone passes
// the forward's many-row property and fails the backward's, so it is reported under the
// property of the direction it breaks (before, indexer.many_rows and smla.many_rows judged
// the backward too when the backend had one, and these mutants failed them).
TEST(RowLimits, BackwardFaultsFailOnlyTheBackwardManyRowProperty) {
  const struct {
    const char* mutant;
    const char* forward;
    const char* backward;
  } cases[] = {{"smla_bwd_rows_from_128_dropped", "smla.many_rows", "smla.backward_many_rows"},
               {"indexer_bwd_rows_from_128_dropped", "indexer.many_rows", "indexer.backward_many_rows"}};
  for (const auto& c : cases)
    for (uint64_t seed : {1u, 2u, 3u}) {
      const PropertyResult f = run_property(mutant_named(c.mutant), property_named(c.forward), level0(seed));
      EXPECT_EQ(f.verdict, oracle::Verdict::Pass) << c.mutant << " failed " << c.forward << " at seed " << seed
                                                  << ": " << f.message.substr(0, 300);
      const PropertyResult b = run_property(mutant_named(c.mutant), property_named(c.backward), level0(seed));
      EXPECT_EQ(b.verdict, oracle::Verdict::Fail) << c.mutant << " passed " << c.backward << " at seed " << seed;
    }
}

// A kernel that declines more than 1024 rows (NotSupported, as a plugin's
// DSA_STATUS_UNSUPPORTED) declines the first draw and is judged on the others: a pass that
// says what was declined, not a skip.
class DeclinesOver1024Rows final : public oracle::Backend {
 public:
  std::string name() const override { return "declines_over_1024_rows"; }
  bool supports(oracle::Op op) const override { return op == oracle::Op::Topk; }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& w) override {
    if (scores.size(0) > 1024) throw oracle::NotSupported("s_q > 1024 not supported");
    return ref_->select_topk(scores, k, p, w);
  }

 private:
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

TEST(RowLimits, DecliningTheFirstDrawJudgesTheOthers) {
  const PropertyResult r =
      run_property(subject_of<DeclinesOver1024Rows>(), property_named("topk.many_rows"), level0(1, /*shrink=*/true));
  std::cout << r.message << "\n";
  EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << r.message;
  EXPECT_GE(r.declined, 1);
  EXPECT_EQ(r.cases, cases_for_level(0, property_named("topk.many_rows").cost));
}

// ---- Every row a row limit shows in has something to judge (fresh-user finding: an example
// plugin emptying sparse MLA rows >= 1024 passed smla.many_rows at seeds 4 and 18, as the one
// row 1024 of their s_q = 1025 draw had topk_length 0, so emptying it changed nothing).

// The rows a row-limit fault shows in: the tile edges 128, 256, 512, 1024 and the last row
// (this test's own list, not the generators').
std::vector<int64_t> limit_rows_of(int64_t s_q) {
  std::vector<int64_t> rows;
  for (const int64_t t : {int64_t{128}, int64_t{256}, int64_t{512}, int64_t{1024}, s_q - 1})
    if (t >= 0 && t < s_q && std::find(rows.begin(), rows.end(), t) == rows.end()) rows.push_back(t);
  return rows;
}

// "" when every limit row of a top-k input holds a selectable key (in its window, not NaN,
// not -inf: SPEC §3.1) and k >= 1, else the first row that does not.
std::string topk_dead_row(const Tensor& scores, int64_t k, const std::optional<KeyWindows>& w) {
  const int64_t s_q = scores.size(0), s_kv = scores.size(1);
  for (const int64_t t : limit_rows_of(s_q)) {
    bool ok = false;
    for (int64_t s = 0; s < s_kv && !ok; ++s) {
      const double v = scores.get(t * s_kv + s);
      ok = (!w || w->contains(t, s)) && !std::isnan(v) && v != -INFINITY;
    }
    if (!ok || k < 1) return "top-k s_q=" + std::to_string(s_q) + " row " + std::to_string(t) + " has no selectable key";
  }
  return "";
}

// "" when every limit row of an indexer input has a key in its window with a nonzero score
// I[t, s] (SPEC §2, in double) and, when `d_scores` is given, a nonzero d_scores[t, s] there.
std::string indexer_dead_row(const Tensor& q, const Tensor& kx, const Tensor& w, const KeyWindows& win,
                             const Tensor* d_scores) {
  const int64_t s_q = q.size(0), H = q.size(1), d = q.size(2), s_kv = kx.size(0);
  for (const int64_t t : limit_rows_of(s_q)) {
    bool ok = false;
    for (int64_t s = 0; s < s_kv && !ok; ++s) {
      if (!win.contains(t, s)) continue;
      double score = 0;
      for (int64_t j = 0; j < H; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += q.get((t * H + j) * d + x) * kx.get(s * d + x);
        score += w.get(t * H + j) * std::max(0.0, dot);
      }
      ok = score != 0 && (!d_scores || d_scores->get(t * s_kv + s) != 0);
    }
    if (!ok)
      return "indexer s_q=" + std::to_string(s_q) + " row " + std::to_string(t) + " has no key with a nonzero score" +
             (d_scores ? " and d_scores" : "");
  }
  return "";
}

// "" when every limit row of a sparse MLA input holds a valid slot (j < topk_length[t], id in
// [0, s_kv): SPEC §4).
std::string smla_dead_row(const SparseMlaInputs& in) {
  const int64_t s_q = in.q.size(0), k = in.indices.size(-1), s_kv = in.kv.size(0);
  for (const int64_t t : limit_rows_of(s_q)) {
    const int64_t len = in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
    bool ok = false;
    for (int64_t j = 0; j < std::min(len, k) && !ok; ++j) {
      const double id = in.indices.get(t * k + j);
      ok = id >= 0 && id < static_cast<double>(s_kv);
    }
    if (!ok)
      return "sparse MLA s_q=" + std::to_string(s_q) + " row " + std::to_string(t) + " has no valid slot" +
             (in.topk_length ? " (topk_length " + std::to_string(len) + ")" : "");
  }
  return "";
}

// The reference, recording what each op call shows at the limit rows (the draws of the
// properties themselves, through run_property).
class RecordingReference final : public oracle::Backend {
 public:
  explicit RecordingReference(bool backward, std::vector<std::string>* dead, int* calls)
      : backward_(backward), dead_(dead), calls_(calls) {}
  std::string name() const override { return "recording_reference"; }
  bool supports(oracle::Op op) const override {
    if (op == oracle::Op::IndexerScoresBackward || op == oracle::Op::SparseMlaBwd) return backward_;
    return op == oracle::Op::Topk || op == oracle::Op::IndexerScores || op == oracle::Op::SparseMlaFwd;
  }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& w) override {
    note(topk_dead_row(scores, k, w));
    return ref_->select_topk(scores, k, p, w);
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& kx, const Tensor& w, const KeyWindows& win) override {
    note(indexer_dead_row(q, kx, w, win, nullptr));
    return ref_->indexer_scores(q, kx, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& kx, const Tensor& w,
                                               const KeyWindows& win, const Tensor& ds) override {
    note(indexer_dead_row(q, kx, w, win, &ds));
    return ref_->indexer_scores_backward(q, kx, w, win, ds);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    note(smla_dead_row(in));
    return ref_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    note(smla_dead_row(in));
    return ref_->sparse_mla_backward(in, dout);
  }

 private:
  void note(const std::string& why) {
    ++*calls_;
    if (!why.empty()) dead_->push_back(why);
  }
  bool backward_;
  std::vector<std::string>* dead_;
  int* calls_;
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

// The draws of topk.many_rows, indexer.many_rows (either tier), smla.many_rows (the forward
// each), indexer.backward_many_rows (exact tier) and smla.backward_many_rows (the backward) at
// level 0 on seeds 1-10: every call the properties make shows something to judge at rows 128,
// 256, 512, 1024 and the last.
TEST(RowLimits, EveryLimitRowHasSomethingToJudgeInThePropertiesDraws) {
  for (const bool backward : {false, true})
    for (const char* name : backward ? std::vector<const char*>{"indexer.backward_many_rows", "smla.backward_many_rows"}
                                     : std::vector<const char*>{"topk.many_rows", "indexer.many_rows", "smla.many_rows"}) {
      std::vector<std::string> dead;
      int calls = 0;
      Subject s;
      s.name = "recording_reference";
      s.make = [&] { return std::unique_ptr<oracle::Backend>(new RecordingReference(backward, &dead, &calls)); };
      for (uint64_t seed = 1; seed <= 10; ++seed) {
        const PropertyResult r = run_property(s, property_named(name), level0(seed));
        EXPECT_EQ(r.verdict, oracle::Verdict::Pass) << name << " seed " << seed << ": " << r.message;
        for (const auto& d : dead) ADD_FAILURE() << name << " seed " << seed << (backward ? " (backward)" : "") << ": " << d;
        dead.clear();
      }
      EXPECT_GE(calls, 10 * cases_for_level(0, property_named(name).cost)) << name;
    }
}

// The generators directly, every layout smla.many_rows draws and both indexer tiers, on
// first draws (s_q 1025-1100) and later ones: RapidCheck's own seeds, 30 cases.
void limit_rows_have_something_to_judge() {
  set_draw_index(*rc::gen::inRange(0, 3));
  const TopkCase tc = draw_topk_many_rows_case();
  const std::string t = topk_dead_row(tc.scores, tc.k, tc.windows);
  if (!t.empty()) RC_FAIL(t + " (" + tc.desc + ")");
  for (const Tier tier : {Tier::Exact, Tier::Random}) {
    const IndexerCase ic = draw_indexer_many_rows_case(tier);
    const std::string i = indexer_dead_row(ic.q_idx, ic.k_idx, ic.w, ic.windows, &ic.d_scores);
    if (!i.empty()) RC_FAIL(i + " (" + ic.desc + ")");
  }
  for (const char* layout : {"mixed", "poison", "topk_length", "dups"}) {
    const SmlaCase sc = draw_smla_case(layout, DType::BF16, "many_rows");
    const std::string m = smla_dead_row(sc.in);
    if (!m.empty()) RC_FAIL(m + " (" + sc.desc + ")");
  }
}
TEST(RowLimits, EveryLimitRowHasSomethingToJudgeInEveryLayout) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = 30;
  rc::detail::TestMetadata md;
  md.id = "RowLimits/EveryLimitRowHasSomethingToJudgeInEveryLayout";
  md.description = md.id;
  const auto result = rc::detail::checkTestable(&limit_rows_have_something_to_judge, md, params);
  set_draw_index(0);
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  EXPECT_TRUE(result.is<rc::detail::SuccessResult>()) << msg.str();
}

// A kernel that drops query rows: rows >= `from` (a grid of `from` rows), or with `from` < 0
// only the last row (a grid one row short). Dropped rows come back as a kernel leaves them:
// top-k -1, indexer -inf, sparse MLA empty (SPEC §6). Forward ops only.
class DropsRows final : public oracle::Backend {
 public:
  explicit DropsRows(int64_t from) : from_(from) {}
  std::string name() const override { return from_ < 0 ? "drops_last_row" : "drops_rows_from_" + std::to_string(from_); }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::Topk || op == oracle::Op::IndexerScores || op == oracle::Op::SparseMlaFwd;
  }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& p,
                     const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(scores, k, p, w);
    for (int64_t t = 0; t < scores.size(0); ++t)
      if (dropped(t, scores.size(0)))
        for (int64_t j = 0; j < k; ++j) ids.set(t * k + j, -1);
    return ids;
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& kx, const Tensor& w, const KeyWindows& win) override {
    Tensor sc = ref_->indexer_scores(q, kx, w, win);
    const int64_t s_kv = kx.size(0);
    for (int64_t t = 0; t < q.size(0); ++t)
      if (dropped(t, q.size(0)))
        for (int64_t s = 0; s < s_kv; ++s) sc.set(t * s_kv + s, -INFINITY);
    return sc;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaInputs cut = in;
    const int64_t s_q = in.q.size(0), k = in.indices.size(-1);
    for (int64_t t = 0; t < s_q; ++t)
      if (dropped(t, s_q))
        for (int64_t j = 0; j < k; ++j) cut.indices.set(t * k + j, -1);
    return ref_->sparse_mla_forward(cut);
  }

 private:
  bool dropped(int64_t t, int64_t s_q) const { return from_ < 0 ? t == s_q - 1 : t >= from_; }
  int64_t from_;
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

// A grid of 1024 rows, and a grid one row short, fail the three many-row properties at level
// 0 on seeds 1-30 (before every limit row had something to judge, the 1024-row sparse MLA
// kernel passed seeds 4 and 18: the s_q = 1025 first draw's row 1024 had topk_length 0).
TEST(RowLimits, DroppedRowsFailOnEverySeed) {
  for (const int64_t from : {int64_t{1024}, int64_t{-1}})
    for (const char* name : {"topk.many_rows", "indexer.many_rows", "smla.many_rows"}) {
      Subject s;
      s.name = DropsRows(from).name();
      s.make = [from] { return std::unique_ptr<oracle::Backend>(new DropsRows(from)); };
      int passed = 0;
      for (uint64_t seed = 1; seed <= 30; ++seed) {
        const PropertyResult r = run_property(s, property_named(name), level0(seed));
        EXPECT_EQ(r.verdict, oracle::Verdict::Fail) << s.name << " passed " << name << " at seed " << seed;
        passed += r.verdict != oracle::Verdict::Fail;
      }
      std::cout << s.name << ": " << name << " passed " << passed << " of 30 seeds\n";
    }
}

}  // namespace
}  // namespace dsa::props
