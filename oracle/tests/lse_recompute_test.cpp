// A sparse MLA backward that recomputes P from its forward's fp32 lse, FlashAttention-2/3 style
// (p_j = exp2(fl(s_j·fl(sm·log2e)) - fl(L·fl(log2e))); SPEC §5 hands lse to the backward).
// fresh16 F3: on a one-key row the floors held p = 1 exactly, and such a correct kernel failed
// dkv by 5-6x at |L| = 2^18. op_check now judges failing gradients again with the first-order
// term of that recomputation (local_bounds.h, sparse_mla_lse_recompute_terms; docs/SPEC.md §9).
// Every element within that bound: PASS where it stays below θ·rowscale on every row, else WEAK
// on the rows where it does not (named with their |L|; fails unless --allow-weak); an element
// over it keeps the FAIL. Shown here: at |L| ≈ 96 and at |L| = 2^18 through a V column (fp32
// class) the kernel passes through that report (its note says the floors alone fail it), and
// θ(1 + 2^-6) of a row's scale still fails; at |L| = 2^18 through a RoPE column with a small q
// (and on the extreme draws' layout, fresh16's FlashBwdF32) the widened bound exceeds θ on the
// huge-logit rows: WEAK there (AGREES with --allow-weak), while δ at θ on an ordinary row and a
// scaled or dropped huge-logit row still FAIL. Old code: every exp2 case here failed dkv
// (before 2026-12-02 the 2^18 RoPE cases stayed FAIL even with every element inside the bound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/oracle/case_memo.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/local_bounds.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "flash_bwd_f32.h"

namespace dsa::oracle {
namespace {

// fp32 q, kv, dout. Query rows 0-5: 3 random keys of 4 slots each (keys 0-11, values in
// (-1, 1)); rows 6 and 7: one key each (12, 13), whose logit sm·q[0]·kv[0] is +big / -big
// (q zero but column 0). A sink on every head when `sink`. Deterministic (mt19937, seed 16).
OpCase big_logit_case(double big, bool sink, int64_t col = 0, double qbig = 8.0) {
  const int64_t s_q = 8, h_q = 2, d_qk = 32, d_v = 24, s_kv = 14, k = 4;
  const double sm = 1.0 / std::sqrt(static_cast<double>(d_qk));
  std::mt19937 rng(16);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> q(static_cast<size_t>(s_q * h_q * d_qk)), kv(static_cast<size_t>(s_kv * d_qk)),
      dout(static_cast<size_t>(s_q * h_q * d_v));
  for (auto* v : {&q, &kv, &dout})
    for (double& x : *v) x = u(rng);
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k), -1);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < 3; ++j) ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((2 * t + j) % 12);
  for (int64_t t = 6; t < 8; ++t) {
    ids[static_cast<size_t>(t * k)] = static_cast<int32_t>(6 + t);
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t c = 0; c < d_qk; ++c)
        q[static_cast<size_t>((t * h_q + h) * d_qk + c)] = c == col ? (t == 6 ? qbig : -qbig) : 0.0;
    kv[static_cast<size_t>((6 + t) * d_qk + col)] = big / (qbig * sm);
  }
  fixtures::Fixture f;
  f.case_name = "lse_recompute_big_logit";
  f.op = "sparse_mla_fwd+bwd";
  f.producer = "lse_recompute_test";
  f.params = {{"sm_scale", sm}, {"d_v", d_v}};
  f.inputs["q"] = Tensor::from_f64({s_q, h_q, d_qk}, q).to(DType::F32);
  f.inputs["kv"] = Tensor::from_f64({s_kv, d_qk}, kv).to(DType::F32);
  f.inputs["indices"] = Tensor::from_i32({s_q, k}, ids);
  if (sink) f.inputs["attn_sink"] = Tensor::from_f64({h_q}, {-1.0, 0.5}).to(DType::F32);
  f.inputs["dout"] = Tensor::from_f64({s_q, h_q, d_v}, dout).to(DType::F32);
  return op_case_from_fixture(f);
}

props::FlashStyleResult exp2_kernel(const OpCase& c, bool exp2) {
  props::FlashStyleOptions o;
  o.order = props::SumOrder::Reversed;
  o.dkv_reverse_slots = true;
  o.p_exp2_from_lse = exp2;
  return props::flash_style_sparse_mla(c.mla, &c.dout, o);
}

NamedOutputs grads_of(const props::FlashStyleResult& k) {
  NamedOutputs o{{"dq", k.grads.dq}, {"dkv", k.grads.dkv}, {"out", k.fwd.out}};
  if (k.grads.dsink) o["dsink"] = *k.grads.dsink;
  return o;
}

bool has_note(const OpReport& r, const std::string& s) {
  for (const auto& n : r.notes)
    if (n.find(s) != std::string::npos) return true;
  return false;
}

void expect_perturbations_fail(const OpCase& c, const NamedOutputs& g, const OpReport& r) {
  CheckOptions allow = default_check_options();
  allow.allow_weak = true;
  int tried = 0;
  for (const auto& t : r.tensors) {
    const Tensor& base = g.at(t.name);
    for (int64_t row = 0; row < t.rows; ++row) {
      if (t.row_weak[static_cast<size_t>(row)] || !(t.row_scale[static_cast<size_t>(row)] > 0)) continue;
      const double amount = t.theta * (1 + 0x1p-6) * t.row_scale[static_cast<size_t>(row)];
      for (int whole = 0; whole < 2; ++whole) {
        std::vector<double> x = base.to_f64();
        const int64_t first = row * t.row_len,
                      last = whole ? std::min<int64_t>(first + t.row_len, base.numel()) : first + 1;
        for (int64_t i = first; i < last; ++i) x[static_cast<size_t>(i)] += x[static_cast<size_t>(i)] >= 0 ? amount : -amount;
        NamedOutputs moved = g;
        moved[t.name] = Tensor::from_f64(base.shape(), x).to(base.dtype());
        const OpReport mr = judge_outputs(Op::SparseMlaBwd, c, moved, allow);
        ++tried;
        EXPECT_EQ(mr.verdict, Verdict::Fail)
            << t.name << (whole ? " row " : " element of row ") << row << " moved by θ(1+2^-6)·row scale\n"
            << format_op_report(mr);
      }
    }
  }
  EXPECT_GT(tried, 0);
}

// |L| ≈ 96: the exp2 backward fails the floors (p = 1 exactly on the one-key rows) and passes
// the widened bound with no WEAK row; the natural-exp control passes the floors themselves.
TEST(LseRecompute, Exp2BackwardAtModerateLsePassesAndStillDetects) {
  for (bool sink : {false, true}) {
    const OpCase c = big_logit_case(96.3, sink);
    const props::FlashStyleResult k = exp2_kernel(c, true), nat = exp2_kernel(c, false);
    const OpReport f = judge_outputs(Op::SparseMlaFwd, c, {{"out", k.fwd.out}, {"lse", k.fwd.lse}, {"max_logits", k.fwd.max_logits}});
    ASSERT_EQ(f.verdict, Verdict::Pass) << format_op_report(f);
    const OpReport rn = judge_outputs(Op::SparseMlaBwd, c, grads_of(nat));
    EXPECT_EQ(rn.verdict, Verdict::Pass) << format_op_report(rn);
    EXPECT_FALSE(has_note(rn, "gradients fail the floors")) << format_op_report(rn);
    const OpReport r = judge_outputs(Op::SparseMlaBwd, c, grads_of(k));
    EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
    // the floors alone fail it (the check can fail): the report says it took the widened bound
    EXPECT_TRUE(has_note(r, "gradients fail the floors but pass the bound widened")) << format_op_report(r);
    for (const auto& t : r.tensors) {
      std::printf("sink %d %s worst %.3g weakest/θ %.3g\n", sink, t.name.c_str(), t.worst, t.weakest / t.theta);
      EXPECT_EQ(t.weak_rows, 0) << t.name;
    }
    expect_perturbations_fail(c, grads_of(k), r);
  }
}

// |L| = 2^18 through a V column (as the extreme draws and smla_extreme_row_in_batch make it):
// the row's scale holds |sm q_c|(Σ|dout v| + Σ|out dout|), huge there, and the widened bound
// stays below θ of it: passes, the floors alone fail. Through a RoPE column (c >= d_v) with a
// small q the scale stays small: the widened bound exceeds θ on the two huge-logit rows, which
// are WEAK (named, with |L| = 2^18 as the cause); with --allow-weak the case AGREES.
TEST(LseRecompute, Exp2BackwardAt2To18) {
  const double big = std::ldexp(1.0, 18) * 1.0123;
  for (int route = 0; route < 2; ++route) {
    const OpCase c = route == 0 ? big_logit_case(big, false) : big_logit_case(big, false, 31, 0.5);
    const props::FlashStyleResult k = exp2_kernel(c, true), nat = exp2_kernel(c, false);
    const OpReport rn = judge_outputs(Op::SparseMlaBwd, c, grads_of(nat));
    EXPECT_EQ(rn.verdict, Verdict::Pass) << format_op_report(rn);
    const OpReport r = judge_outputs(Op::SparseMlaBwd, c, grads_of(k));
    std::printf("route %d verdict %d\n%s\n", route, static_cast<int>(r.verdict), format_op_report(r).c_str());
    if (route == 0) {
      EXPECT_EQ(r.verdict, Verdict::Pass) << format_op_report(r);
      EXPECT_TRUE(has_note(r, "gradients fail the floors but pass the bound widened")) << format_op_report(r);
      expect_perturbations_fail(c, grads_of(k), r);
    } else {
      EXPECT_EQ(r.verdict, Verdict::Weak) << format_op_report(r);
      EXPECT_NE(r.reason.find("cause: P recomputed from the forward's fp32 lse"), std::string::npos) << r.reason;
      EXPECT_TRUE(has_note(r, "the floors alone fail them (dkv:")) << format_op_report(r);
      // dkv rows 12 and 13: the one-key rows' dedicated keys, |L| = 2^18 · 1.0123
      EXPECT_TRUE(has_note(r, "dkv 2 of 14 rows: 12 (|L| 2.654e+05) 13 (|L| 2.654e+05)")) << format_op_report(r);
      expect_perturbations_fail(c, grads_of(k), r);
    }
  }
}

// fresh16's FlashBwdF32 (audit seeds 1 and 2, smla.backward_parity: dkv 2.2 % off at
// |L| = 2^18) rebuilt in C++ (flash_bwd_f32.h) on the extreme draws' layout with fp32 inputs.
OpCase extreme_draw_case(bool sink) { return op_case_from_fixture(test::lse_extreme_draw_fixture(sink)); }

// The rows fed by a huge-logit query row of extreme_draw_case: dq rows (t, h) of t = 2, 4 and
// dkv rows 10, 11 (their dedicated keys); dsink rows (heads) take every query row.
bool huge_row(const std::string& name, int64_t row) {
  if (name == "dq") return row / 2 == 2 || row / 2 == 4;
  if (name == "dkv") return row >= 10;
  return name == "dsink";
}

// Old verdict FAIL (the floors alone: dkv several times its bound on the dedicated keys), new
// verdict WEAK on exactly the huge-logit rows, naming them and the cause, AGREES with
// --allow-weak; every ordinary row stays below θ (judged at full strength) and δ = θ(1+2^-6) of
// its scale there fails; a huge-logit row scaled by 2 or 1.25, or dropped (0), fails too.
TEST(LseRecompute, FlashBwdF32IsWeakOnTheHugeLogitRowsNotDisagreeing) {
  for (bool sink : {false, true}) {
    SCOPED_TRACE(sink ? "with a sink" : "without a sink");
    const OpCase c = extreme_draw_case(sink);
    test::FlashBwdF32Kernel kernel, control(false);  // exp2 from the lse; exp(P - L)
    const SparseMlaForward fw = kernel.sparse_mla_forward(c.mla);
    const OpReport f = judge_outputs(Op::SparseMlaFwd, c, {{"out", fw.out}, {"lse", fw.lse}, {"max_logits", fw.max_logits}});
    ASSERT_EQ(f.verdict, Verdict::Pass) << format_op_report(f);
    const SparseMlaGrads gn = control.sparse_mla_backward(c.mla, c.dout), gk = kernel.sparse_mla_backward(c.mla, c.dout);
    NamedOutputs gnat{{"dq", gn.dq}, {"dkv", gn.dkv}, {"out", control.sparse_mla_forward(c.mla).out}};
    NamedOutputs g{{"dq", gk.dq}, {"dkv", gk.dkv}, {"out", fw.out}};
    if (sink) {
      gnat["dsink"] = *gn.dsink;
      g["dsink"] = *gk.dsink;
    }
    const OpReport rn = judge_outputs(Op::SparseMlaBwd, c, gnat);
    EXPECT_EQ(rn.verdict, Verdict::Pass) << format_op_report(rn);
    const OpReport r = judge_outputs(Op::SparseMlaBwd, c, g);
    std::printf("%s\n", format_op_report(r).c_str());
    ASSERT_EQ(r.verdict, Verdict::Weak) << format_op_report(r);
    EXPECT_EQ(verdict_line({r}), "WEAK");
    EXPECT_NE(r.reason.find("cause: P recomputed from the forward's fp32 lse errs by u(3|P_j| + 3|L|) in p_j"),
              std::string::npos) << r.reason;
    EXPECT_TRUE(has_note(r, "the floors alone fail them (dkv:")) << format_op_report(r);  // the old verdict
    // key 10 (logit +2^18); key 11 (logit -2^18) too without a sink (with one, L ≈ sink there
    // and p_11 = exp(-2^18 - L) = 0: no gradient, nothing to recompute)
    const std::string rows = sink ? "dkv 1 of 12 rows: 10 (|L| 2.621e+05):"
                                  : "dkv 2 of 12 rows: 10 (|L| 2.621e+05) 11 (|L| 2.621e+05):";
    EXPECT_TRUE(has_note(r, rows)) << format_op_report(r);
    int64_t weak = 0;
    for (const auto& t : r.tensors)
      for (int64_t row = 0; row < t.rows; ++row) {
        const bool w = t.row_weak[static_cast<size_t>(row)] != 0;
        weak += w;
        if (!huge_row(t.name, row)) {
          EXPECT_FALSE(w) << t.name << " row " << row << ": an ordinary row WEAK";
        }
      }
    EXPECT_GT(weak, 0);
    CheckOptions allow = default_check_options();
    allow.allow_weak = true;
    const OpReport ra = judge_outputs(Op::SparseMlaBwd, c, g, allow);
    EXPECT_EQ(verdict_line({ra}), "AGREES") << format_op_report(ra);
    EXPECT_TRUE(has_note(ra, rows)) << format_op_report(ra);
    EXPECT_TRUE(has_note(ra, "SPEC §9: allowed (--allow-weak)")) << format_op_report(ra);
    // δ at θ(1+2^-6)·row scale on each ordinary row (one element, the whole row): FAIL
    expect_perturbations_fail(c, g, r);
    // a huge-logit dkv row scaled (a gradient counted twice, 25 % off) or dropped: FAIL, not WEAK
    for (const CheckOptions& opt : {default_check_options(), allow})
      for (double factor : {2.0, 1.25, 0.0}) {
        std::vector<double> x = g.at("dkv").to_f64();
        for (int64_t s = 10; s < 12; ++s)
          for (int64_t i = s * 32; i < (s + 1) * 32; ++i) x[static_cast<size_t>(i)] *= factor;
        NamedOutputs moved = g;
        moved["dkv"] = Tensor::from_f64(g.at("dkv").shape(), x).to(DType::F32);
        const OpReport mr = judge_outputs(Op::SparseMlaBwd, c, moved, opt);
        EXPECT_EQ(mr.verdict, Verdict::Fail) << "dkv rows 10, 11 x " << factor << "\n" << format_op_report(mr);
        EXPECT_TRUE(has_note(mr, "the FAIL stands")) << format_op_report(mr);
      }
  }
}

// The lse term is computed only on the failing path and once per case and inputs (the case's
// memo, computation_counts): three judgements of the exp2 kernel's gradients (plain, with
// --allow-weak, one perturbed) compute it once; the control, which passes the floors, never.
// Before, each failing judgement recomputed it (and the shared-Δ route twice per judgement).
TEST(LseRecompute, TermIsComputedOncePerCaseOnTheFailingPathOnly) {
  const std::string kind = "sparse_mla_bwd/lse_recompute_terms";
  auto count = [&] {
    const auto all = computation_counts();
    const auto it = all.find(kind);
    return it == all.end() ? int64_t{0} : it->second;
  };
  const OpCase c = extreme_draw_case(false);
  ASSERT_TRUE(c.memo);
  test::FlashBwdF32Kernel kernel, control(false);
  const SparseMlaGrads gn = control.sparse_mla_backward(c.mla, c.dout), gk = kernel.sparse_mla_backward(c.mla, c.dout);
  const int64_t before = count();
  EXPECT_EQ(judge_outputs(Op::SparseMlaBwd, c, {{"dq", gn.dq}, {"dkv", gn.dkv}}).verdict, Verdict::Pass);
  EXPECT_EQ(count(), before);
  CheckOptions allow = default_check_options();
  allow.allow_weak = true;
  EXPECT_EQ(judge_outputs(Op::SparseMlaBwd, c, {{"dq", gk.dq}, {"dkv", gk.dkv}}).verdict, Verdict::Weak);
  EXPECT_EQ(judge_outputs(Op::SparseMlaBwd, c, {{"dq", gk.dq}, {"dkv", gk.dkv}}, allow).verdict, Verdict::Pass);
  std::vector<double> x = gk.dkv.to_f64();
  x[10 * 32] *= 2;
  EXPECT_EQ(judge_outputs(Op::SparseMlaBwd, c, {{"dq", gk.dq}, {"dkv", Tensor::from_f64(gk.dkv.shape(), x).to(DType::F32)}})
                .verdict,
            Verdict::Fail);
  EXPECT_EQ(count(), before + 1);
}

// The term itself: zero on an ordinary row's dq where dS = 0, positive on a one-key row's dkv,
// and argument errors name the argument.
TEST(LseRecompute, TermsHaveTheOutputShapesAndRejectBadDout) {
  const OpCase c = big_logit_case(96.3, true);
  const auto e = sparse_mla_lse_recompute_terms(c.mla, c.dout);
  EXPECT_EQ(e.at("dq").size(), static_cast<size_t>(c.mla.q.numel()));
  EXPECT_EQ(e.at("dkv").size(), static_cast<size_t>(c.mla.kv.numel()));
  EXPECT_EQ(e.at("dsink").size(), 2u);
  EXPECT_GT(e.at("dkv")[static_cast<size_t>(12 * 32)], 0.0);
  const Tensor bad = Tensor::from_f64({3}, {1.0, 2.0, 3.0});
  try {
    (void)sparse_mla_lse_recompute_terms(c.mla, bad);
    FAIL() << "no error";
  } catch (const std::invalid_argument& x) {
    EXPECT_NE(std::string(x.what()).find("dout"), std::string::npos) << x.what();
  }
}

}  // namespace
}  // namespace dsa::oracle
