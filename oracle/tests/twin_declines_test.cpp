// The twin test of declines (decline_cause) on the ops it did not cover and on declines by value
// that every twin without a feature kept:
// - the SPEC §10 ops (FP8 indexer, paged indexer, FP8 sparse MLA) and the KL loss's -inf scores
//   had no twin: every decline of their goldens was a skip "declined: no twin for op ...", so a
//   kernel declining them by value, or declining their mandatory features, passed with exit 0;
// - fresh11 F2: each twin was one fixed input, so a backend declining whenever a fixed position
//   holds the case's value (indices[0,0] == 0, scores[0,0] > 0) declined the twins that keep it
//   too, and the decline stayed a skip. The twin with other values keeps every feature and
//   moves the values (rows relabelled, ranks), so such a kernel runs it: INCOMPLETE.
// - fresh15 F2: empty indexer and KL windows, negative head weights and paged contexts shorter
//   than next_n were no feature, and the indexer backward had no twin: declining them was a skip.
// A kernel declining a feature the user named, or a shape, stays a skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dsa/contract/fp8.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/reference_backend.h"

namespace dsa::oracle {
namespace {

// The reference backend, declining each call of an op whose rule is set and returns true.
class RuleDecliner final : public Backend {
 public:
  std::function<bool(const Tensor&)> topk;
  std::function<bool(const SparseMlaInputs&)> mla;
  std::function<bool(const IndexerKlInputs&)> kl;
  std::function<bool(const Fp8IndexerInputs&)> fp8_indexer;
  std::function<bool(const PagedIndexerInputs&)> paged;
  std::function<bool(const SparseMlaFp8Inputs&)> mla_fp8;
  std::function<bool(const Tensor& q_idx, const Tensor& w, const KeyWindows& windows)> indexer;
  std::function<bool(const Tensor& q_idx, const Tensor& w, const KeyWindows& windows)> indexer_bwd;

  std::string name() const override { return "rule-decliner"; }
  bool supports(Op op) const override {
    switch (op) {
      case Op::Topk: return bool(topk);
      case Op::SparseMlaFwd:
      case Op::SparseMlaBwd: return bool(mla);
      case Op::IndexerKlLoss: return bool(kl);
      case Op::Fp8IndexerScores: return bool(fp8_indexer);
      case Op::PagedIndexerScores: return bool(paged);
      case Op::SparseMlaFp8Fwd: return bool(mla_fp8);
      case Op::IndexerScores: return bool(indexer);
      case Op::IndexerScoresBackward: return bool(indexer_bwd);
      default: return false;
    }
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (topk(s)) throw NotSupported("declined by rule");
    return ref_->select_topk(s, k, p, w);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    if (mla(in)) throw NotSupported("declined by rule");
    return ref_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    if (mla(in)) throw NotSupported("declined by rule");
    return ref_->sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    if (kl(in)) throw NotSupported("declined by rule");
    return ref_->indexer_kl_loss(in);
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    if (fp8_indexer(in)) throw NotSupported("declined by rule");
    return ref_->fp8_indexer_scores(in);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    if (paged(in)) throw NotSupported("declined by rule");
    return ref_->paged_indexer_scores(in);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    if (mla_fp8(in)) throw NotSupported("declined by rule");
    return ref_->sparse_mla_fp8_forward(in);
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    if (indexer(q, w, win)) throw NotSupported("declined by rule");
    return ref_->indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win,
                                       const Tensor& d_scores) override {
    if (indexer_bwd(q, w, win)) throw NotSupported("declined by rule");
    return ref_->indexer_scores_backward(q, k, w, win, d_scores);
  }

 private:
  std::unique_ptr<Backend> ref_ = make_reference_backend();
};

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The reports of `b` on the golden `name` with `unsupported` named (the producer not judged).
std::vector<OpReport> reports(Backend& b, const std::string& name, const std::vector<std::string>& unsupported = {}) {
  CheckOptions opt;
  opt.unsupported = unsupported;
  const std::vector<OpReport> rs = judge_fixture_ops(golden(name), b, opt);
  EXPECT_FALSE(rs.empty()) << name;
  return rs;
}

// Every report INCOMPLETE, laid to `feature` ("holds <words>", "--unsupported <feature>"), and a
// skip naming it when `feature` is named.
void expect_laid_to(Backend& b, const std::string& name, const std::string& feature, const std::string& words) {
  SCOPED_TRACE(name + " / " + feature);
  for (const OpReport& r : reports(b, name)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "holds " + words)) << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported " + feature)) << r.reason;
  }
  for (const OpReport& r : reports(b, name, {feature})) {
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "named unsupported: " + feature)) << r.reason;
  }
}

// Every report INCOMPLETE as a decline by value, named features or not.
void expect_by_values(Backend& b, const std::string& name, const std::vector<std::string>& unsupported = {}) {
  SCOPED_TRACE(name);
  for (const OpReport& r : reports(b, name, unsupported)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "the decline depends on the values")) << r.reason;
  }
}

bool any_neg_inf(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.get(i) == -INFINITY) return true;
  return false;
}

// ---- (a) the KL loss and the §10 ops -----------------------------------------------------

// SPEC §7: a KL loss declining any -inf score (every KL golden holds some, outside the windows
// at least) is INCOMPLETE for it; named, a skip. Before: "no twin for op indexer_kl_loss", skip.
TEST(TwinDeclines, KlLossDecliningNegInfScoresIsIncomplete) {
  RuleDecliner b;
  b.kl = [](const IndexerKlInputs& in) { return any_neg_inf(in.scores); };
  for (const char* name : {"kl_dense_causal", "kl_dense_neg_inf_scores", "kl_sparse_causal", "kl_sparse_empty_windows"})
    expect_laid_to(b, name, "neg_inf_scores", "-inf scores");
}

// SPEC §10: an FP8 indexer declining NaN scales (the golden's unread keys hold them) runs the
// clean twin: INCOMPLETE for poisoned_unread; named, a skip.
TEST(TwinDeclines, Fp8IndexerDecliningPoisonedUnreadKeysIsIncomplete) {
  RuleDecliner b;
  b.fp8_indexer = [](const Fp8IndexerInputs& in) {
    for (int64_t i = 0; i < in.k_scale.numel(); ++i)
      if (!std::isfinite(in.k_scale.get(i))) return true;
    return false;
  };
  expect_laid_to(b, "fp8_idx_prefix_amax", "poisoned_unread", "unread parts holding anything");
}

// A paged indexer declining table entries out of range (the golden's own entries past a context
// hold some) runs the clean twin; one declining only the check's poisoned run (entries
// INT32_MAX) runs the case as given: both INCOMPLETE for poisoned_unread; named, skips.
TEST(TwinDeclines, PagedIndexerDecliningPoisonedEntriesIsIncomplete) {
  RuleDecliner own;
  own.paged = [](const PagedIndexerInputs& in) {
    for (int64_t i = 0; i < in.block_table.numel(); ++i)
      if (in.block_table.get(i) < 0 || in.block_table.get(i) >= static_cast<double>(in.k_cache.size(0))) return true;
    return false;
  };
  expect_laid_to(own, "paged_idx_mtp2", "poisoned_unread", "unread parts holding anything");
  RuleDecliner poisoned_run;
  poisoned_run.paged = [](const PagedIndexerInputs& in) {
    for (int64_t i = 0; i < in.block_table.numel(); ++i)
      if (in.block_table.get(i) == std::numeric_limits<int32_t>::max()) return true;
    return false;
  };
  expect_laid_to(poisoned_run, "paged_idx_mtp2", "poisoned_unread", "unread parts holding anything");
}

// SPEC §10 + §4: an FP8 sparse MLA declining invalid ids is INCOMPLETE for them alone (its twin
// without them runs); one declining NaN tokens (0xFF bytes: the check's poisoned run) for
// poisoned_unread alone.
TEST(TwinDeclines, Fp8SparseMlaDeclinesAreLaidToEachFeature) {
  RuleDecliner invalid;
  invalid.mla_fp8 = [](const SparseMlaFp8Inputs& in) {
    const int64_t tokens = in.kv_cache.numel() / kMlaFp8TokenBytes, s_q = in.indices.size(0), k = in.indices.size(-1);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const double id = in.indices.get(t * k + j);
        if (id < 0 || id >= static_cast<double>(tokens) || (in.topk_length && j >= in.topk_length->get(t)))
          return true;
      }
    return false;
  };
  expect_laid_to(invalid, "smla_fp8_decode", "invalid_ids", "invalid ids");
  for (const OpReport& r : reports(invalid, "smla_fp8_decode"))
    EXPECT_FALSE(has(r.reason, "unread parts")) << r.reason;
  RuleDecliner nan_tokens;
  nan_tokens.mla_fp8 = [](const SparseMlaFp8Inputs& in) {
    const uint8_t* bytes = in.kv_cache.data<uint8_t>();
    for (int64_t s = 0; s < in.kv_cache.numel() / kMlaFp8TokenBytes; ++s)
      if (bytes[s * kMlaFp8TokenBytes] == 0xFF && bytes[s * kMlaFp8TokenBytes + 1] == 0xFF) return true;
    return false;
  };
  expect_laid_to(nan_tokens, "smla_fp8_decode", "poisoned_unread", "unread parts holding anything");
}

// ---- (b) declines by value that the twins without a feature keep (fresh11 F2) -------------

// Declining whenever a fixed position holds the golden's own value: every twin without a
// feature keeps it (before: "declined its twin without them too", a skip, exit 0); the twin
// with other values moves it and runs: INCOMPLETE, also with every feature named.
TEST(TwinDeclines, DecliningTheCasesOwnValueIsIncompleteOnEveryOp) {
  {
    RuleDecliner b;  // indices[0,0] == 0, as smla_causal_topk's, smla_duplicates' and F2's
    b.mla = [](const SparseMlaInputs& in) { return in.indices.get(0) == 0.0; };
    for (const char* name : {"smla_causal_topk", "smla_duplicates", "smla_extreme_row_in_batch"})
      expect_by_values(b, name, {"invalid_ids", "empty_rows", "duplicate_ids"});
  }
  for (const char* name : {"smla_basic", "smla_empty_rows", "smla_invalid_mix", "smla_sink", "smla_topk_length"}) {
    const double v0 = golden(name).inputs.at("indices").get(0);
    RuleDecliner b;
    b.mla = [v0](const SparseMlaInputs& in) { return in.indices.get(0) == v0; };
    expect_by_values(b, name);
  }
  {
    RuleDecliner b;  // scores[0,0] > 0: topk_mtp holds -inf (outside its windows)
    b.topk = [](const Tensor& s) { return s.get(0) > 0; };
    for (const char* name : {"topk_mtp", "topk_varlen", "topk_plateau_small_sorted", "topk_window_garbage"})
      expect_by_values(b, name, {"neg_inf_scores", "nan_scores", "k_boundary_ties"});
  }
  for (const char* name : {"topk_distinct_causal", "topk_narrow_band_k2048", "topk_plateau_any_sorted"}) {
    const double v0 = golden(name).inputs.at("scores").get(0);
    RuleDecliner b;
    b.topk = [v0](const Tensor& s) { return s.get(0) == v0; };
    expect_by_values(b, name);
  }
  for (const char* name : {"kl_dense_causal", "kl_sparse_causal"}) {
    const double v0 = golden(name).inputs.at("scores").get(0);
    RuleDecliner b;
    b.kl = [v0](const IndexerKlInputs& in) { return in.scores.get(0) == v0; };
    expect_by_values(b, name);
  }
  {
    const double v0 = golden("fp8_idx_prefix_amax").inputs.at("w").get(0);
    RuleDecliner b;
    b.fp8_indexer = [v0](const Fp8IndexerInputs& in) { return in.w.get(0) == v0; };
    expect_by_values(b, "fp8_idx_prefix_amax");
  }
  {
    const double v0 = golden("paged_idx_mtp2").inputs.at("w").get(0);
    RuleDecliner b;
    b.paged = [v0](const PagedIndexerInputs& in) { return in.w.get(0) == v0; };
    expect_by_values(b, "paged_idx_mtp2");
  }
  {
    const double v0 = golden("smla_fp8_decode").inputs.at("indices").get(0);
    RuleDecliner b;
    b.mla_fp8 = [v0](const SparseMlaFp8Inputs& in) { return in.indices.get(0) == v0; };
    expect_by_values(b, "smla_fp8_decode");
  }
  {
    const double v0 = golden("idx_causal").inputs.at("w").get(0);
    RuleDecliner b;
    b.indexer = [v0](const Tensor&, const Tensor& w, const KeyWindows&) { return w.get(0) == v0; };
    b.indexer_bwd = b.indexer;  // the backward had no twin: a skip "no twin for op" (fresh15 F2)
    const std::vector<OpReport> rs = reports(b, "idx_causal");
    EXPECT_EQ(rs.size(), 2u);
    for (const OpReport& r : rs) {
      EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
      EXPECT_TRUE(has(r.reason, "the decline depends on the values")) << r.reason;
    }
  }
}

// A limit of the kernel stays a skip on every op: declining every call (a shape or dtype it
// does not take) declines every twin too.
TEST(TwinDeclines, DecliningEveryCallStaysASkipOnEveryOp) {
  RuleDecliner b;
  b.topk = [](const Tensor&) { return true; };
  b.mla = [](const SparseMlaInputs&) { return true; };
  b.kl = [](const IndexerKlInputs&) { return true; };
  b.fp8_indexer = [](const Fp8IndexerInputs&) { return true; };
  b.paged = [](const PagedIndexerInputs&) { return true; };
  b.mla_fp8 = [](const SparseMlaFp8Inputs&) { return true; };
  b.indexer = [](const Tensor&, const Tensor&, const KeyWindows&) { return true; };
  b.indexer_bwd = b.indexer;
  for (const char* name : {"topk_distinct_causal", "topk_plateau_small_sorted", "smla_basic", "smla_invalid_mix",
                           "kl_dense_causal", "kl_sparse_empty_windows", "fp8_idx_prefix_amax", "paged_idx_mtp2",
                           "smla_fp8_decode", "idx_causal", "idx_empty_windows"}) {
    SCOPED_TRACE(name);
    for (const OpReport& r : reports(b, name)) {
      EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
      EXPECT_EQ(r.reason.rfind("declined: declined by rule (", 0), 0u) << r.reason;
    }
  }
}

// The twins keep what a legitimate decline is about: a kernel declining a feature named with
// --unsupported declines the twin with other values too (it keeps the feature), so the decline
// stays a skip naming it (the value twin does not make it INCOMPLETE).
TEST(TwinDeclines, TheValueTwinKeepsEveryFeature) {
  RuleDecliner b;
  b.topk = [](const Tensor& s) { return any_neg_inf(s); };
  b.mla = [](const SparseMlaInputs& in) { return sparse_mla_slot_features(in).duplicates; };
  b.kl = [](const IndexerKlInputs& in) { return any_neg_inf(in.scores); };
  for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{
           {"topk_distinct_causal", "neg_inf_scores"}, {"topk_plateau_small_sorted", "neg_inf_scores"},
           {"smla_duplicates", "duplicate_ids"}, {"smla_extreme_row_in_batch", "duplicate_ids"},
           {"kl_sparse_empty_windows", "neg_inf_scores"}}) {
    SCOPED_TRACE(name);
    const std::vector<OpReport> rs = reports(b, name, {key});
    for (const OpReport& r : rs) {
      EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
      EXPECT_TRUE(has(r.reason, "named unsupported: " + key)) << r.reason;
    }
  }
}


// ---- (c) empty windows, negative head weights, short paged contexts (fresh15 F2) ----------
// Legal inputs every kernel must take (SPEC §1: an empty window is legal; §2: w may be
// negative; §10: MTP windows of a context shorter than next_n are clamped, empty) were no twin
// feature: a kernel declining exactly them got "declined: ... (no twin for op ...)" or "the
// case holds no SPEC-mandatory feature" skips, exit 0. Each now has a twin without it.

bool empty_window(const KeyWindows& w) {
  for (int64_t t = 0; t < w.s_q(); ++t)
    if (w.length(t) == 0) return true;
  return false;
}

bool negative(const Tensor& w) {
  for (int64_t i = 0; i < w.numel(); ++i)
    if (w.get(i) < 0) return true;
  return false;
}

// The golden `name` with row `row`'s window emptied (ke = ks).
fixtures::Fixture with_empty_row(const std::string& name, int64_t row) {
  fixtures::Fixture f = golden(name);
  f.inputs.at("ke").set(row, f.inputs.at("ks").get(row));
  return f;
}

// The §2 indexer and its backward (before: no twin for the backward; the forward's decline
// "no SPEC-mandatory feature": skips).
TEST(TwinDeclines, IndexerDecliningEmptyWindowsOrNegativeWeightsIsIncomplete) {
  RuleDecliner empty;
  empty.indexer = [](const Tensor&, const Tensor&, const KeyWindows& w) { return empty_window(w); };
  empty.indexer_bwd = empty.indexer;
  expect_laid_to(empty, "idx_empty_windows", "empty_windows", "empty key windows");
  RuleDecliner neg;
  neg.indexer = [](const Tensor&, const Tensor& w, const KeyWindows&) { return negative(w); };
  neg.indexer_bwd = neg.indexer;
  for (const char* name : {"idx_causal", "idx_empty_windows", "idx_varlen"})
    expect_laid_to(neg, name, "negative_weights", "negative head weights");
  // Declining both: the twin without both runs; INCOMPLETE for both.
  RuleDecliner both;
  both.indexer = [](const Tensor&, const Tensor& w, const KeyWindows& win) { return negative(w) || empty_window(win); };
  both.indexer_bwd = both.indexer;
  for (const OpReport& r : reports(both, "idx_empty_windows")) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported empty_windows,negative_weights")) << r.reason;
  }
  for (const OpReport& r : reports(both, "idx_empty_windows", {"empty_windows", "negative_weights"}))
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
}

// SPEC §1, §7: a KL loss declining empty windows (kl_sparse_empty_windows' rows 0..5); its twin
// widens each to one key whose score is -inf (the row still has no term).
TEST(TwinDeclines, KlLossDecliningEmptyWindowsIsIncomplete) {
  RuleDecliner b;
  b.kl = [](const IndexerKlInputs& in) { return empty_window(in.windows); };
  expect_laid_to(b, "kl_sparse_empty_windows", "empty_windows", "empty key windows");
  fixtures::Fixture dense = with_empty_row("kl_dense_causal", 3);
  for (const OpReport& r : judge_fixture_ops(dense, b)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported empty_windows")) << r.reason;
  }
}

// SPEC §10 + §1, §2: the FP8 indexer declining negative w (its goldens hold some) or an empty
// window (the golden with row 2 emptied).
TEST(TwinDeclines, Fp8IndexerDecliningEmptyWindowsOrNegativeWeightsIsIncomplete) {
  RuleDecliner neg;
  neg.fp8_indexer = [](const Fp8IndexerInputs& in) { return negative(in.w); };
  for (const char* name : {"fp8_idx_prefix_amax", "fp8_idx_prefix_pow2"})
    expect_laid_to(neg, name, "negative_weights", "negative head weights");
  RuleDecliner empty;
  empty.fp8_indexer = [](const Fp8IndexerInputs& in) { return empty_window(in.windows); };
  const fixtures::Fixture f = with_empty_row("fp8_idx_prefix_amax", 2);
  for (const OpReport& r : judge_fixture_ops(f, empty)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.reason;
    EXPECT_TRUE(has(r.reason, "holds empty key windows")) << r.reason;
    EXPECT_TRUE(has(r.reason, "--unsupported empty_windows")) << r.reason;
    EXPECT_FALSE(has(r.reason, "unread parts")) << r.reason;  // the twin keeps the poisoned keys
  }
  CheckOptions named;
  named.unsupported = {"empty_windows"};
  for (const OpReport& r : judge_fixture_ops(f, empty, named)) EXPECT_EQ(r.verdict, Verdict::Skip) << r.reason;
}

// SPEC §10: the paged indexer declining contexts shorter than next_n (paged_idx_mtp2: contexts
// 0 and 1, next_n 2) or negative w. --unsupported empty_windows covers short contexts.
TEST(TwinDeclines, PagedIndexerDecliningShortContextsOrNegativeWeightsIsIncomplete) {
  RuleDecliner short_ctx;
  short_ctx.paged = [](const PagedIndexerInputs& in) {
    for (int64_t b = 0; b < in.context_lens.numel(); ++b)
      if (in.context_lens.get(b) < static_cast<double>(in.q_idx.size(1))) return true;
    return false;
  };
  expect_laid_to(short_ctx, "paged_idx_mtp2", "short_context", "paged contexts shorter than next_n");
  for (const OpReport& r : reports(short_ctx, "paged_idx_mtp2")) EXPECT_FALSE(has(r.reason, "unread parts")) << r.reason;
  for (const OpReport& r : reports(short_ctx, "paged_idx_mtp2", {"empty_windows"}))
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.reason;
  RuleDecliner neg;
  neg.paged = [](const PagedIndexerInputs& in) { return negative(in.w); };
  expect_laid_to(neg, "paged_idx_mtp2", "negative_weights", "negative head weights");
}

// The value twin keeps negative_weights: a w of both signs stays so (times -1/2), a w >= 0
// stays so (times 1/2; times -1/2 made it negative, a twin holding a feature the case does
// not, which the test may not run). So a kernel declining negative w is never handed one by
// the value twin (named, a skip), and one declining by a value of w >= 0 runs it: INCOMPLETE.
TEST(TwinDeclines, TheIndexerValueTwinKeepsTheSignsOfW) {
  RuleDecliner neg;
  neg.indexer = [](const Tensor&, const Tensor& w, const KeyWindows&) { return negative(w); };
  neg.indexer_bwd = neg.indexer;
  for (const OpReport& r : reports(neg, "idx_causal", {"negative_weights"})) {
    EXPECT_EQ(r.verdict, Verdict::Skip) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "named unsupported: negative_weights")) << r.reason;
  }
  fixtures::Fixture f = golden("idx_causal");
  Tensor& w = f.inputs.at("w");
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, std::abs(w.get(i)));
  const double v0 = w.get(0);
  RuleDecliner by_value;
  by_value.indexer = [v0](const Tensor&, const Tensor& x, const KeyWindows&) { return x.get(0) == v0; };
  by_value.indexer_bwd = by_value.indexer;
  for (const OpReport& r : judge_fixture_ops(f, by_value)) {
    EXPECT_EQ(r.verdict, Verdict::Incomplete) << r.op << ": " << r.reason;
    EXPECT_TRUE(has(r.reason, "the decline depends on the values")) << r.reason;
  }
}

}  // namespace
}  // namespace dsa::oracle
