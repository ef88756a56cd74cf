// The external path end to end: the reference served through the ABI (dsa_reference_plugin)
// and loaded back with load_plugin gives bitwise the bytes of calling dsa::reference
// directly; the C example plugin passes the oracle's checks (SPEC §3, §4, §6, §9).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dsa/oracle/op_check.h"
#include "dsa/plugin/plugin_backend.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"

namespace dsa::plugin {
namespace {

using dsa::oracle::bitwise_equal;
using dsa::oracle::Op;
using dsa::oracle::Verdict;

Tensor random_f32(std::vector<int64_t> shape, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  Tensor t(DType::F32, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// Ids with holes: -1 padding in front and behind, out-of-range ids, repeats.
Tensor messy_indices(int64_t s_q, int64_t k, int64_t s_kv, std::mt19937& rng) {
  Tensor t(DType::I32, {s_q, k});
  std::uniform_int_distribution<int> id(-2, static_cast<int>(s_kv) + 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, id(rng));
  t.set(0, -1);
  for (int64_t j = 0; j < k; ++j) t.set(k + j, -1);  // row 1: empty (SPEC §6)
  return t;
}

constexpr int64_t kSq = 5, kSkv = 19, kHi = 3, kDi = 8, kHq = 4, kDqk = 16, kDv = 8, kK = 7;

struct Fixture : ::testing::Test {
  std::mt19937 rng{20261130};
  KeyWindows windows = KeyWindows::causal(kSq, kSkv);

  SparseMlaInputs mla_inputs(bool sink, bool lengths, bool three_d) {
    SparseMlaInputs in;
    in.q = random_f32({kSq, kHq, kDqk}, rng);
    in.kv = random_f32({kSkv, kDqk}, rng);
    in.indices = messy_indices(kSq, kK, kSkv, rng);
    if (three_d) in.indices = in.indices.reshaped({kSq, 1, kK});
    if (lengths) in.topk_length = Tensor::from_i32({kSq}, {7, 7, 3, 0, 5});
    if (sink) {
      in.attn_sink = random_f32({kHq}, rng);
      in.attn_sink->set(1, -std::numeric_limits<double>::infinity());
    }
    in.sm_scale = 1.0 / std::sqrt(static_cast<double>(kDqk));
    in.d_v = kDv;
    return in;
  }
};

using ReferencePluginTest = Fixture;

TEST_F(ReferencePluginTest, LoadsAndDeclaresEveryOp) {
  auto b = open_plugin(DSA_REFERENCE_PLUGIN);
  EXPECT_EQ(b->name(), "plugin:reference");
  for (Op op : dsa::oracle::all_ops()) EXPECT_TRUE(b->supports(op)) << to_string(op);
  EXPECT_EQ(b->unavailable_reason(), "");
}

TEST_F(ReferencePluginTest, IndexerScoresAndBackwardAreBitwiseTheReference) {
  auto b = load_plugin(DSA_REFERENCE_PLUGIN);
  Tensor q = random_f32({kSq, kHi, kDi}, rng), k = random_f32({kSkv, kDi}, rng);
  Tensor w = random_f32({kSq, kHi}, rng), d = random_f32({kSq, kSkv}, rng);
  Tensor want = reference::indexer_scores(q, k, w, windows);
  EXPECT_TRUE(bitwise_equal(b->indexer_scores(q, k, w, windows), want));
  IndexerGrads g = b->indexer_scores_backward(q, k, w, windows, d);
  IndexerGrads r = reference::indexer_scores_backward(q, k, w, windows, d);
  EXPECT_TRUE(bitwise_equal(g.dq_idx, r.dq_idx));
  EXPECT_TRUE(bitwise_equal(g.dk_idx, r.dk_idx));
  EXPECT_TRUE(bitwise_equal(g.dw, r.dw));
}

TEST_F(ReferencePluginTest, TopkIsBitwiseTheReferenceForEveryPolicy) {
  auto b = load_plugin(DSA_REFERENCE_PLUGIN);
  Tensor s = random_f32({kSq, kSkv}, rng);
  for (int64_t i = 0; i < s.numel(); i += 3) s.set(i, 0.0);  // tie plateaus at 0.0
  s.set(4, std::nan(""));
  s.set(5, -std::numeric_limits<double>::infinity());
  for (TieBreak tb : {TieBreak::Any, TieBreak::Small, TieBreak::Large})
    for (bool sorted : {true, false})
      for (bool win : {false, true})
        for (int64_t k : {int64_t{0}, int64_t{4}, kSkv + 3}) {
          TopkPolicy p{tb, sorted};
          std::optional<KeyWindows> w = win ? std::optional<KeyWindows>(windows) : std::nullopt;
          EXPECT_TRUE(bitwise_equal(b->select_topk(s, k, p, w), reference::select_topk(s, k, p, w)))
              << to_string(tb) << " sorted=" << sorted << " windows=" << win << " k=" << k;
        }
}

TEST_F(ReferencePluginTest, SparseMlaForwardAndBackwardAreBitwiseTheReference) {
  auto b = load_plugin(DSA_REFERENCE_PLUGIN);
  for (int variant = 0; variant < 4; ++variant) {
    SparseMlaInputs in = mla_inputs(variant & 1, variant & 2, variant == 3);
    if (variant == 2) {  // bf16 inputs
      in.q = in.q.to(DType::BF16);
      in.kv = in.kv.to(DType::BF16);
    }
    SparseMlaForward f = b->sparse_mla_forward(in);
    SparseMlaForward rf = reference::sparse_mla_forward(in);
    EXPECT_TRUE(bitwise_equal(f.out, rf.out)) << variant;
    EXPECT_TRUE(bitwise_equal(f.lse, rf.lse)) << variant;
    EXPECT_TRUE(bitwise_equal(f.max_logits, rf.max_logits)) << variant;
    Tensor dout = random_f32({kSq, kHq, kDv}, rng);
    SparseMlaGrads g = b->sparse_mla_backward(in, dout);
    SparseMlaGrads rg = reference::sparse_mla_backward(in, dout);
    EXPECT_TRUE(bitwise_equal(g.dq, rg.dq)) << variant;
    EXPECT_TRUE(bitwise_equal(g.dkv, rg.dkv)) << variant;
    ASSERT_EQ(g.dsink.has_value(), rg.dsink.has_value()) << variant;
    if (g.dsink) {
      EXPECT_TRUE(bitwise_equal(*g.dsink, *rg.dsink)) << variant;
    }
  }
}

TEST_F(ReferencePluginTest, IndexerKlLossIsBitwiseTheReference) {
  auto b = load_plugin(DSA_REFERENCE_PLUGIN);
  for (KlMode mode : {KlMode::Dense, KlMode::Sparse}) {
    IndexerKlInputs in;
    in.scores = random_f32({kSq, kSkv}, rng);
    in.q = random_f32({kSq, kHq, kDqk}, rng);
    in.kv = random_f32({kSkv, kDqk}, rng);
    in.sm_scale = 0.25;
    in.windows = windows;
    in.mode = mode;
    if (mode == KlMode::Sparse) in.indices = messy_indices(kSq, kK, kSkv, rng);
    in.coeff = 0.5;
    IndexerKlResult r = b->indexer_kl_loss(in);
    IndexerKlResult want = reference::indexer_kl_loss(in);
    EXPECT_TRUE(bitwise_equal(r.loss, want.loss)) << to_string(mode);
    EXPECT_TRUE(bitwise_equal(r.d_scores, want.d_scores)) << to_string(mode);
  }
}

TEST_F(ReferencePluginTest, PassesTheOracleChecks) {
  auto b = load_plugin(DSA_REFERENCE_PLUGIN);
  dsa::oracle::OpCase c;
  c.mla = mla_inputs(true, true, false);
  c.dout = random_f32({kSq, kHq, kDv}, rng);
  for (Op op : {Op::SparseMlaFwd, Op::SparseMlaBwd}) {
    dsa::oracle::OpReport r = dsa::oracle::check_op(*b, op, c);
    EXPECT_EQ(r.verdict, Verdict::Pass) << dsa::oracle::format_op_report(r);
  }
}

using ExamplePluginTest = Fixture;

TEST_F(ExamplePluginTest, TopkMatchesTheReferenceBitwise) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  Tensor s = random_f32({kSq, kSkv}, rng);
  for (int64_t i = 0; i < s.numel(); i += 2) s.set(i, (i % 4 == 0) ? 0.0 : -0.0);  // ±0 ties
  s.set(7, std::nan(""));
  s.set(8, -std::numeric_limits<double>::infinity());
  for (TieBreak tb : {TieBreak::Small, TieBreak::Large})
    for (bool win : {false, true})
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{6}, kSkv + 2}) {
        TopkPolicy p{tb, true};
        std::optional<KeyWindows> w = win ? std::optional<KeyWindows>(windows) : std::nullopt;
        EXPECT_TRUE(bitwise_equal(b->select_topk(s, k, p, w), reference::select_topk(s, k, p, w)))
            << to_string(tb) << " windows=" << win << " k=" << k;
      }
}

TEST_F(ExamplePluginTest, PassesTheOracleTopkCheckOnPlateaus) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  dsa::oracle::OpCase c;
  c.scores = Tensor(DType::F32, {kSq, kSkv});
  for (int64_t i = 0; i < c.scores.numel(); ++i) c.scores.set(i, static_cast<double>(i % 3));
  c.k = 8;
  for (TieBreak tb : {TieBreak::Any, TieBreak::Small, TieBreak::Large}) {
    c.policy = TopkPolicy{tb, true};
    c.topk_windows = windows;
    dsa::oracle::OpReport r = dsa::oracle::check_op(*b, Op::Topk, c);
    EXPECT_EQ(r.verdict, Verdict::Pass) << dsa::oracle::format_op_report(r);
  }
}

TEST_F(ExamplePluginTest, SparseMlaForwardPassesTheOracleInF32AndBf16) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  for (int variant = 0; variant < 4; ++variant) {
    dsa::oracle::OpCase c;
    c.mla = mla_inputs(variant & 1, variant & 2, variant == 3);
    if (variant >= 2) {
      c.mla.q = c.mla.q.to(DType::BF16);
      c.mla.kv = c.mla.kv.to(DType::BF16);
    }
    dsa::oracle::OpReport r = dsa::oracle::check_op(*b, Op::SparseMlaFwd, c);
    EXPECT_EQ(r.verdict, Verdict::Pass) << "variant " << variant << "\n"
                                        << dsa::oracle::format_op_report(r);
    ASSERT_FALSE(r.tensors.empty());
    EXPECT_EQ(r.tensors.front().dtype, c.mla.q.dtype());  // out in q's dtype (AS_INPUT)
  }
}

TEST_F(ExamplePluginTest, EmptyRowsFollowSpec6) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  SparseMlaInputs in = mla_inputs(false, false, false);
  SparseMlaForward f = b->sparse_mla_forward(in);
  for (int64_t h = 0; h < kHq; ++h) {  // row 1 has only -1 ids
    EXPECT_EQ(f.lse.get(1 * kHq + h), std::numeric_limits<double>::infinity());
    EXPECT_EQ(f.max_logits.get(1 * kHq + h), -std::numeric_limits<double>::infinity());
    for (int64_t c = 0; c < kDv; ++c) EXPECT_EQ(f.out.get((1 * kHq + h) * kDv + c), 0.0);
  }
}

TEST_F(ExamplePluginTest, IndexerScoresPassTheOracleInF32AndBf16) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  for (bool bf16 : {false, true}) {
    dsa::oracle::OpCase c;
    c.q_idx = random_f32({kSq, kHi, kDi}, rng);
    c.k_idx = random_f32({kSkv, kDi}, rng);
    if (bf16) {
      c.q_idx = c.q_idx.to(DType::BF16);
      c.k_idx = c.k_idx.to(DType::BF16);
    }
    c.w = random_f32({kSq, kHi}, rng);
    c.windows = KeyWindows::varlen({0, 2, kSq}, {0, 8, kSkv});
    dsa::oracle::OpReport r = dsa::oracle::check_op(*b, Op::IndexerScores, c);
    EXPECT_EQ(r.verdict, Verdict::Pass) << dsa::oracle::format_op_report(r);
  }
}

TEST_F(ExamplePluginTest, UnsupportedOpsAreSkippedByTheOracle) {
  auto b = load_plugin(DSA_EXAMPLE_PLUGIN);
  dsa::oracle::OpCase c;
  c.mla = mla_inputs(false, false, false);
  c.dout = random_f32({kSq, kHq, kDv}, rng);
  EXPECT_EQ(dsa::oracle::check_op(*b, Op::SparseMlaBwd, c).verdict, Verdict::Skip);
}

// A kernel whose result depends on an earlier call in its process (dsa_stale_plugin: the first
// result of each op replayed for later calls of the same shapes, as a stale CUDA graph) is
// correct alone in a fresh child; the determinism re-run, made as a second call in one child
// after a call on other values of the same shapes, returns the replayed result and fails, naming
// the state carried between calls (fresh17 F5). The example plugin passes the same cases.
using StalePluginTest = Fixture;

TEST_F(StalePluginTest, TheDeterminismRerunFailsStateCarriedBetweenCallsOnEveryOp) {
  dsa::oracle::OpCase c;
  c.q_idx = random_f32({kSq, kHi, kDi}, rng);
  c.k_idx = random_f32({kSkv, kDi}, rng);
  c.w = random_f32({kSq, kHi}, rng);
  c.windows = windows;
  c.scores = random_f32({kSq, kSkv}, rng);
  c.k = kK;
  c.policy = TopkPolicy{TieBreak::Small, true};
  c.topk_windows = windows;
  c.mla = mla_inputs(true, false, false);
  auto stale = load_plugin(DSA_STALE_PLUGIN);
  auto example = load_plugin(DSA_EXAMPLE_PLUGIN);
  for (Op op : {Op::IndexerScores, Op::Topk, Op::SparseMlaFwd}) {
    const dsa::oracle::OpReport ok = dsa::oracle::check_op(*example, op, c);
    EXPECT_EQ(ok.verdict, Verdict::Pass) << dsa::oracle::format_op_report(ok);
    EXPECT_TRUE(ok.determinism_checked && ok.determinism_ok) << to_string(op);
    const dsa::oracle::OpReport r = dsa::oracle::check_op(*stale, op, c);
    EXPECT_EQ(r.verdict, Verdict::Fail) << dsa::oracle::format_op_report(r);
    EXPECT_TRUE(r.determinism_checked) << to_string(op);
    EXPECT_FALSE(r.determinism_ok) << to_string(op);
    EXPECT_NE(r.reason.find("deterministic backend returned different bytes on a second run"), std::string::npos)
        << r.reason;
    EXPECT_NE(r.reason.find("the second call in one child process"), std::string::npos) << r.reason;
    EXPECT_NE(r.reason.find("carries state between calls"), std::string::npos) << r.reason;
    // The first run (alone in its child) is correct: only the re-run fails.
    for (const auto& t : r.tensors) EXPECT_TRUE(t.passed) << to_string(op) << " " << t.name;
  }
}

}  // namespace
}  // namespace dsa::plugin
