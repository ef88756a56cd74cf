// The §10 goldens through the fixture routes (fixtures check, compare): the producer and the
// reference agree; a candidate with one wrong element, a NaN, or a wrong tile scale disagrees;
// a U8 tensor without its fp8_dtypes tag is a file error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/oracle/candidate_backend.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "dsa/contract/fp8.h"

namespace dsa::oracle {
namespace {

fixtures::Fixture golden(const std::string& name) {
  return fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors");
}

Verdict judge_outputs(const fixtures::Fixture& f, std::map<std::string, Tensor> outputs) {
  CandidateBackend cand(std::move(outputs), "test candidate", {});
  CheckOptions opt;
  opt.check_determinism = false;
  const auto reports = judge_fixture_ops(f, cand, opt);
  for (const auto& r : reports) std::cout << format_op_report(r);
  return overall_verdict(reports);
}

// Index of the largest finite |value| (a real, visible element to perturb).
int64_t largest_finite(const Tensor& t) {
  int64_t best = -1;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i)) && (best < 0 || std::fabs(t.get(i)) > std::fabs(t.get(best)))) best = i;
  return best;
}

class Fp8Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8Golden, ProducerAndReferenceAgree) {
  const fixtures::Fixture f = golden(GetParam());
  ASSERT_TRUE(fixtures::is_fp8_op(f.op));
  fixtures::validate_fixture(f, GetParam());
  auto ref = make_reference_backend();
  const FixtureReport r = check_fixture(f, ref.get());
  EXPECT_TRUE(r.passed()) << format_fixture_report(r);
  EXPECT_EQ(judge_outputs(f, f.expected), Verdict::Pass);
}

TEST_P(Fp8Golden, OneWrongElementOrNaNDisagrees) {
  const fixtures::Fixture f = golden(GetParam());
  const std::string name = f.expected.count("scores") ? "scores" : "out";
  const Tensor& good = f.expected.at(name);
  const int64_t i = largest_finite(good);
  ASSERT_GE(i, 0);
  // The bound the correct output is judged by; an error of twice that must be caught.
  CandidateBackend ok(f.expected, "good", {});
  CheckOptions opt;
  opt.check_determinism = false;
  double bound = -1;
  for (const auto& r : judge_fixture_ops(f, ok, opt))
    for (const auto& t : r.tensors)
      if (t.name == name) bound = t.max_bound;  // the largest element bound (local rule)
  ASSERT_GT(bound, 0.0);
  for (double bad : {good.get(i) + 2 * bound * (good.get(i) < 0 ? -1 : 1), std::nan("")}) {
    auto outs = f.expected;
    Tensor t = good.to(good.dtype());
    t.set(i, bad);
    outs[name] = t;
    EXPECT_EQ(judge_outputs(f, outs), Verdict::Fail) << name << "[" << i << "] = " << bad;
  }
}

// SPEC §9 local rule on the FP8 sparse MLA (§10): the golden's correct outputs (fp32, and
// rounded to bf16) are judged without WEAK rows (a WEAK row is a verdict); in every (t, h)
// row of out a change of θ·(1 + 2^-6) of the row's scale in one element disagrees, and so
// does a change of twice the row's own largest bound in rows where that is below ρ·E of the
// whole tensor (which the former tensor-wide E accepted).
TEST(Fp8SparseMlaLocalRule, EveryRowDetectsThetaOnTheGolden) {
  const fixtures::Fixture f = golden("smla_fp8_decode");
  // the producer's fp32 out, and the same rounded to bf16 (a FlashMLA-style kernel's out:
  // judged against the baseline that dequantizes kv to bf16)
  for (DType od : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(od));
    auto expected = f.expected;
    expected["out"] = f.expected.at("out").to(od);
    CandidateBackend ok(expected, "good", {});
    CheckOptions opt;
    opt.check_determinism = false;
    const auto reports = judge_fixture_ops(f, ok, opt);
    ASSERT_EQ(overall_verdict(reports), Verdict::Pass);
    const TensorCheck* out = nullptr;
    for (const auto& r : reports)
      for (const auto& t : r.tensors)
        if (t.name == "out") out = &t;
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->weak_rows, 0);
    const Tensor& good = expected.at("out");
    int64_t caught = 0, caught_local = 0, below = 0, rows = 0;
    for (int64_t row = 0; row < out->rows; ++row) {
      int64_t i = -1;
      for (int64_t e = row * out->row_len; e < (row + 1) * out->row_len; ++e)
        if (std::isfinite(good.get(e)) && (i < 0 || std::fabs(good.get(e)) > std::fabs(good.get(i)))) i = e;
      if (i < 0 || out->row_scale[static_cast<size_t>(row)] == 0) continue;
      ++rows;
      // outward by at least the amount after rounding to the candidate's dtype
      auto moved = [&](double amount) {
        Tensor t = good.to(good.dtype());
        const double sign = good.get(i) < 0 ? -1 : 1;
        for (double x = amount; std::fabs(t.get(i) - good.get(i)) < amount; x *= 1 + 0x1p-6)
          t.set(i, good.get(i) + sign * x);
        auto outs = expected;
        outs["out"] = t;
        return judge_outputs(f, outs);
      };
      caught += moved(out->theta * (1 + 0x1p-6) * out->row_scale[static_cast<size_t>(row)]) == Verdict::Fail;
      const double local = 2 * out->row_max_bound[static_cast<size_t>(row)];
      if (local < out->rho * out->baseline_err) {
        ++below;
        caught_local += moved(local) == Verdict::Fail;
      }
    }
    EXPECT_GT(rows, 0);
    EXPECT_EQ(caught, rows);
    EXPECT_EQ(caught_local, below);
  }
}

// A row is judged by its own baseline error: beside a row of large logits (whose fp32 logits
// and exps err far more, so its E_row is large), a row of small logits keeps a tight bound, and an error of twice that bound, far below ρ·E of the large row (what the
// former tensor-wide E allowed), disagrees. A WEAK row is a verdict unless allowed.
class FixedFp8Mla : public Backend {
 public:
  explicit FixedFp8Mla(SparseMlaForward f) : f_(std::move(f)) {}
  std::string name() const override { return "fixed"; }
  bool supports(Op op) const override { return op == Op::SparseMlaFp8Fwd; }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs&) override { return f_; }

 private:
  SparseMlaForward f_;
};

TEST(Fp8SparseMlaLocalRule, ARowIsJudgedByItsOwnBaselineError) {
  std::vector<double> kv(4 * 576), q(2 * 576);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = (static_cast<double>(i % 5) - 2.0) * (1.0 + static_cast<double>(i % 7) / 3.0);
  for (size_t i = 0; i < 576; ++i) {
    const double v = static_cast<double>(i % 3) - 1.0;
    q[i] = 64 * v;           // row 0: logits of hundreds
    q[576 + i] = v / 64;     // row 1: logits below one
  }
  OpCase c;
  c.mla_fp8.q = Tensor::from_f64({2, 1, 576}, q).to(DType::BF16);
  c.mla_fp8.kv_cache = encode_mla_fp8_cache(Tensor::from_f64({4, 576}, kv), Fp8ScaleRule::Amax);
  c.mla_fp8.indices = Tensor::from_i32({2, 4}, {0, 1, 2, 3, 0, 1, 2, 3});
  c.mla_fp8.sm_scale = 0.05;
  const SparseMlaForward ref = reference::sparse_mla_fp8_forward(c.mla_fp8);
  const SparseMlaForward good{ref.out.to(DType::F32), ref.lse.to(DType::F32), ref.max_logits.to(DType::F32)};
  CheckOptions allow;
  allow.check_determinism = false;
  allow.allow_weak = true;
  FixedFp8Mla ok(good);
  const OpReport r = check_sparse_mla_fp8_forward(ok, c, allow);
  ASSERT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  const TensorCheck& out = r.tensors.front();
  ASSERT_EQ(out.name, "out");
  ASSERT_EQ(out.rows, 2);
  const double local = 2 * out.row_max_bound[1];
  ASSERT_LT(local, out.rho * out.baseline_err) << format_op_report(r);
  Tensor bad = good.out.to(DType::F32);
  const int64_t i = 512 + 511;  // row 1, last value column
  for (double x = local; std::fabs(bad.get(i) - good.out.get(i)) < local; x *= 1 + 0x1p-6)
    bad.set(i, good.out.get(i) + x);
  FixedFp8Mla wrong(SparseMlaForward{bad, good.lse, good.max_logits});
  EXPECT_EQ(check_sparse_mla_fp8_forward(wrong, c, allow).verdict, Verdict::Fail);
  if (out.weak_rows > 0) {
    CheckOptions strict = allow;
    strict.allow_weak = false;
    EXPECT_EQ(check_sparse_mla_fp8_forward(ok, c, strict).verdict, Verdict::Weak);
  }
}

INSTANTIATE_TEST_SUITE_P(Section10, Fp8Golden,
                         ::testing::Values("fp8_idx_prefix_amax", "fp8_idx_prefix_pow2",
                                           "paged_idx_mtp2", "smla_fp8_decode"));

// A kernel that applied tile 1's scale to tile 0 (recomputed by the reference on a cache
// with swapped scales) disagrees with the golden.
TEST(Fp8GoldenRoutes, SwappedTileScaleDisagrees) {
  const fixtures::Fixture f = golden("smla_fp8_decode");
  SparseMlaFp8Inputs in = fixtures::sparse_mla_fp8_inputs(f, "smla_fp8_decode");
  Tensor cache = in.kv_cache.to(DType::U8);
  const int64_t tokens = cache.numel() / kMlaFp8TokenBytes;
  for (int64_t t = 0; t < tokens; ++t) {
    uint8_t* s = cache.data<uint8_t>() + t * kMlaFp8TokenBytes + kMlaFp8ScalesOffset;
    const MlaFp8TokenView v(cache.data<uint8_t>() + t * kMlaFp8TokenBytes);
    if (!(v.tile_scale(0) > 0) || !(v.tile_scale(1) > 0)) continue;  // unread NaN token
    std::swap_ranges(s, s + 4, s + 4);
  }
  in.kv_cache = cache;
  auto ref = make_reference_backend();
  const SparseMlaForward wrong = ref->sparse_mla_fp8_forward(in);
  EXPECT_EQ(judge_outputs(f, {{"out", wrong.out.to(DType::F32)},
                              {"lse", wrong.lse.to(DType::F32)},
                              {"max_logits", wrong.max_logits.to(DType::F32)}}),
            Verdict::Fail);
}

TEST(Fp8GoldenRoutes, UntaggedBytesAreAFileError) {
  fixtures::Fixture f = golden("fp8_idx_prefix_pow2");
  f.params.erase("fp8_dtypes");
  try {
    op_case_from_fixture(f);
    FAIL() << "no error";
  } catch (const fixtures::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_dtypes.q_idx"), std::string::npos) << e.what();
  }
  fixtures::Fixture g = golden("smla_fp8_decode");
  g.params["fp8_dtypes"]["kv_cache"] = "e4m3fn";  // not the 656-byte layout tag
  EXPECT_THROW(op_case_from_fixture(g), fixtures::FileError);
}

// The FP8 tensor-core row: a backend that declares reduced accumulation is judged by it (and
// the report says so); an error between the two bounds fails the fp32 row and passes it.
class ScoresOffBy : public Backend {
 public:
  ScoresOffBy(double delta, bool reduced) : delta_(delta), reduced_(reduced) {}
  std::string name() const override { return reduced_ ? "declares-fp8-tc" : "fp32-accumulation"; }
  bool supports(Op op) const override { return op == Op::Fp8IndexerScores; }
  bool fp8_reduced_accumulation() const override { return reduced_; }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    Tensor s = make_reference_backend()->fp8_indexer_scores(in).to(DType::F32);
    const int64_t i = largest_finite(s);
    s.set(i, s.get(i) + delta_);
    return s;
  }

 private:
  double delta_;
  bool reduced_;
};

TEST(Fp8TensorCoreRow, SelectedByTheBackendsDeclarationAndNamedInTheReport) {
  const fixtures::Fixture f = golden("fp8_idx_prefix_amax");
  OpCase c;
  c.fp8_indexer = fixtures::fp8_indexer_inputs(f, "fp8_idx_prefix_amax");
  auto bound_of = [&](Backend& b) {
    const OpReport r = check_fp8_indexer_scores(b, c);
    return r.tensors.empty() ? -1.0 : r.tensors.front().bound;
  };
  ScoresOffBy exact32(0, false), exact_tc(0, true);
  const double fp32_bound = bound_of(exact32), tc_bound = bound_of(exact_tc);
  ASSERT_GT(fp32_bound, 0.0);
  ASSERT_GT(tc_bound, 4 * fp32_bound);
  ScoresOffBy off32(2 * fp32_bound, false), off_tc(2 * fp32_bound, true);
  EXPECT_EQ(check_fp8_indexer_scores(off32, c).verdict, Verdict::Fail);
  const OpReport r = check_fp8_indexer_scores(off_tc, c);
  EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.front().find("fp8_indexer_scores:fp8_tensor_core"), std::string::npos);
  ScoresOffBy far_tc(2 * tc_bound, true);  // the wider row still fails
  EXPECT_EQ(check_fp8_indexer_scores(far_tc, c).verdict, Verdict::Fail);
}

}  // namespace
}  // namespace dsa::oracle
