#include "dsa/oracle/fixture_check.h"

#include <set>
#include <sstream>

#include "dsa/oracle/topk_check.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"

namespace dsa::oracle {

using fixtures::FileError;
using fixtures::Fixture;
using reference::Precision;

namespace {

const Tensor* find(const std::map<std::string, Tensor>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

template <class T>
T param(const Fixture& f, const char* key) {
  if (!f.params.contains(key)) throw FileError(f.case_name, std::string("missing param '") + key + "'");
  return f.params[key].get<T>();
}
template <class T>
T param_or(const Fixture& f, const char* key, T fallback) {
  return f.params.contains(key) ? f.params[key].get<T>() : fallback;
}

std::vector<int64_t> to_i64(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(t.get(i));
  return v;
}

KeyWindows windows_of(const Fixture& f, int64_t s_q, int64_t s_kv) {
  const Tensor* ks = find(f.inputs, "ks");
  const Tensor* ke = find(f.inputs, "ke");
  if (ks && ke) return KeyWindows::explicit_windows(to_i64(*ks), to_i64(*ke), s_kv);
  return KeyWindows::full(s_q, s_kv);
}

void judge_expected(OpReport& r, const Fixture& f, const std::string& op, const std::string& name,
                    const Tensor& ref, const Tensor& base) {
  const Tensor* e = find(f.expected, name);
  if (!e) return;
  TensorCheck c = judge_tensor("peer:" + op, name, *e, ref, base);
  if (!c.passed) r.fail(name + ": " + c.message);
  r.tensors.push_back(std::move(c));
}

// Backend output vs expected: metrics only; fails on non-finite position or shape mismatch.
void compare_expected(OpReport& r, const Fixture& f, const std::string& name, const Tensor& cand) {
  if (!cand.defined()) return;  // not provided (judged Incomplete by check_op)
  const Tensor* e = find(f.expected, name);
  if (!e) return;
  TensorCheck c;
  c.name = name;
  c.dtype = cand.dtype();
  c.metrics = compare_tensors(cand, *e);
  c.passed = c.metrics.shape_ok && c.metrics.nonfinite_mismatches == 0;
  c.ratio = NAN;
  c.bound = NAN;
  c.baseline_err = NAN;
  if (!c.passed) {
    c.message = c.metrics.first_mismatch;
    r.fail(name + ": " + c.message);
  }
  r.tensors.push_back(std::move(c));
}

std::set<int64_t> row_set(const Tensor& ids, int64_t t) {
  std::set<int64_t> s;
  const int64_t w = ids.size(1);
  for (int64_t j = 0; j < w; ++j) {
    const int64_t v = static_cast<int64_t>(ids.get(t * w + j));
    if (v >= 0) s.insert(v);
  }
  return s;
}

}  // namespace

bool FixtureReport::passed() const {
  if (!reference_vs_expected.passed() || !backend_vs_expected.passed()) return false;
  for (const auto& r : backend_vs_reference)
    if (!r.passed()) return false;
  return true;
}

std::vector<Op> fixture_ops(const Fixture& f) {
  if (f.op == "sparse_mla_fwd+bwd") return {Op::SparseMlaFwd, Op::SparseMlaBwd};
  if (f.op == "sparse_mla_fwd") return {Op::SparseMlaFwd};
  if (f.op == "indexer_scores+bwd") return {Op::IndexerScores, Op::IndexerScoresBackward};
  if (f.op == "indexer_scores") return {Op::IndexerScores};
  if (f.op == "topk") return {Op::Topk};
  if (f.op == "indexer_kl_loss") return {Op::IndexerKlLoss};
  throw FileError(f.case_name, "unknown op '" + f.op + "'");
}

OpCase op_case_from_fixture(const Fixture& f) {
  using fixtures::require_input;
  OpCase c;
  const std::string& label = f.case_name;
  for (Op op : fixture_ops(f)) {
    if (op == Op::IndexerScores || op == Op::IndexerScoresBackward) {
      c.q_idx = require_input(f, "q_idx", label);
      c.k_idx = require_input(f, "k_idx", label);
      c.w = require_input(f, "w", label);
      c.windows = windows_of(f, c.q_idx.size(0), c.k_idx.size(0));
      if (op == Op::IndexerScoresBackward) c.d_scores = require_input(f, "d_scores", label);
    } else if (op == Op::Topk) {
      c.scores = require_input(f, "scores", label);
      c.k = param<int64_t>(f, "k");
      c.policy.tie_break = parse_tie_break(param_or<std::string>(f, "tie_break", "any"));
      c.policy.sorted = param_or<bool>(f, "sorted", true);
      if (find(f.inputs, "ks") && find(f.inputs, "ke"))
        c.topk_windows = windows_of(f, c.scores.size(0), c.scores.size(1));
    } else if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd) {
      c.mla.q = require_input(f, "q", label);
      c.mla.kv = require_input(f, "kv", label);
      c.mla.indices = require_input(f, "indices", label);
      if (const Tensor* t = find(f.inputs, "topk_length")) c.mla.topk_length = *t;
      if (const Tensor* t = find(f.inputs, "attn_sink")) c.mla.attn_sink = *t;
      c.mla.sm_scale = param<double>(f, "sm_scale");
      c.mla.d_v = param<int64_t>(f, "d_v");
      if (op == Op::SparseMlaBwd) c.dout = require_input(f, "dout", label);
    } else if (op == Op::IndexerKlLoss) {
      c.kl.scores = require_input(f, "scores", label);
      c.kl.q = require_input(f, "q", label);
      c.kl.kv = require_input(f, "kv", label);
      c.kl.sm_scale = param<double>(f, "sm_scale");
      c.kl.coeff = param_or<double>(f, "coeff", 1.0);
      c.kl.mode = parse_kl_mode(param_or<std::string>(f, "mode", "dense"));
      c.kl.windows = windows_of(f, c.kl.scores.size(0), c.kl.scores.size(1));
      if (const Tensor* t = find(f.inputs, "indices")) c.kl.indices = *t;
    }
  }
  return c;
}

FixtureReport check_fixture(const Fixture& f, Backend* backend, const CheckOptions& opt) {
  FixtureReport rep;
  rep.case_name = f.case_name;
  rep.op = f.op;
  rep.producer = f.producer;
  const std::vector<Op> ops = fixture_ops(f);
  const OpCase c = op_case_from_fixture(f);
  OpReport& re = rep.reference_vs_expected;
  re.backend = "reference";
  re.op = f.op + " vs expected";
  rep.backend_vs_expected.backend = backend ? backend->name() : "";
  rep.backend_vs_expected.op = f.op + " vs expected";
  if (!backend) {
    rep.backend_vs_expected.verdict = Verdict::Skip;
    rep.backend_vs_expected.reason = "no backend";
  }

  for (Op op : ops) {
    const std::string name = to_string(op);
    switch (op) {
      case Op::IndexerScores: {
        judge_expected(re, f, name, "scores", reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows),
                       reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows, Precision::Baseline));
        break;
      }
      case Op::IndexerScoresBackward: {
        auto ref = reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
        auto base = reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores,
                                                       Precision::Baseline);
        judge_expected(re, f, name, "dq_idx", ref.dq_idx, base.dq_idx);
        judge_expected(re, f, name, "dk_idx", ref.dk_idx, base.dk_idx);
        judge_expected(re, f, name, "dw", ref.dw, base.dw);
        break;
      }
      case Op::SparseMlaFwd: {
        auto ref = reference::sparse_mla_forward(c.mla);
        auto base = reference::sparse_mla_forward(c.mla, Precision::Baseline);
        judge_expected(re, f, name, "out", ref.out, base.out);
        judge_expected(re, f, name, "out_bf16", ref.out, base.out);
        judge_expected(re, f, name, "lse", ref.lse, base.lse);
        judge_expected(re, f, name, "max_logits", ref.max_logits, base.max_logits);
        break;
      }
      case Op::SparseMlaBwd: {
        auto ref = reference::sparse_mla_backward(c.mla, c.dout);
        auto base = reference::sparse_mla_backward(c.mla, c.dout, Precision::Baseline);
        judge_expected(re, f, name, "dq", ref.dq, base.dq);
        judge_expected(re, f, name, "dkv", ref.dkv, base.dkv);
        if (ref.dsink && base.dsink) judge_expected(re, f, name, "dsink", *ref.dsink, *base.dsink);
        break;
      }
      case Op::IndexerKlLoss: {
        auto ref = reference::indexer_kl_loss(c.kl);
        auto base = reference::indexer_kl_loss(c.kl, Precision::Baseline);
        judge_expected(re, f, name, "loss", ref.loss, base.loss);
        judge_expected(re, f, name, "d_scores", ref.d_scores, base.d_scores);
        break;
      }
      case Op::Topk: {
        const TopkConventions conv = topk_conventions_from_json(f.conventions);
        if (conv.narrowed_width) re.notes.push_back("adapter: narrowed width min(k, s_kv) padded with -1");
        if (conv.nan_ranks_first) re.notes.push_back("adapter: torch.topk ranks NaN first");
        if (conv.positive_zero_first) re.notes.push_back("adapter: torch.topk orders +0.0 before -0.0");
        const Tensor* expected_ptr = find(f.expected, "indices");
        std::vector<int64_t> nan_rows;
        if (expected_ptr)
          re.topk_violations = check_topk(*expected_ptr, c.scores, c.k, c.policy, c.topk_windows, conv, &nan_rows);
        else
          re.notes.push_back("no expected.indices: only the reference is checked against SPEC §3");
        if (!nan_rows.empty()) re.notes.push_back(std::to_string(nan_rows.size()) + " row(s) with NaN scores");
        // The reference itself must satisfy §3 and agree with the producer modulo ties.
        const Tensor mine = reference::select_topk(c.scores, c.k, c.policy, c.topk_windows);
        for (auto v : check_topk(mine, c.scores, c.k, c.policy, c.topk_windows)) {
          v.rule = "reference:" + v.rule;
          re.topk_violations.push_back(v);
        }
        if (!expected_ptr) {
          if (!re.topk_violations.empty()) re.fail(re.topk_violations.front().rule + ": " + re.topk_violations.front().detail);
          break;
        }
        const Tensor adapted = conv.narrowed_width ? adapt_topk_width(*expected_ptr, c.k) : *expected_ptr;
        int64_t differing = 0;
        for (int64_t t = 0; t < c.scores.size(0); ++t)
          if (row_set(mine, t) != row_set(adapted, t)) ++differing;
        re.notes.push_back(std::to_string(differing) + " of " + std::to_string(c.scores.size(0)) +
                           " rows select a different set than the producer" +
                           (c.policy.tie_break == TieBreak::Any ? " (allowed: tie subsets under 'any')" : ""));
        if (differing > 0 && c.policy.tie_break != TieBreak::Any)
          re.fail("reference and producer select different sets under tie_break=" +
                  std::string(to_string(c.policy.tie_break)));
        if (!re.topk_violations.empty())
          re.fail(re.topk_violations.front().rule + " row=" + std::to_string(re.topk_violations.front().row) +
                  ": " + re.topk_violations.front().detail);
        break;
      }
    }
  }

  if (!backend) return rep;
  for (Op op : ops) rep.backend_vs_reference.push_back(check_op(*backend, op, c, opt));
  // Backend vs expected: rerun outputs (cheap at fixture sizes) and compare metrics.
  OpReport& be = rep.backend_vs_expected;
  try {
    for (Op op : ops) {
      if (!backend->supports(op) || !backend->unavailable_reason().empty()) continue;
      switch (op) {
        case Op::IndexerScores:
          compare_expected(be, f, "scores", backend->indexer_scores(c.q_idx, c.k_idx, c.w, c.windows));
          break;
        case Op::IndexerScoresBackward: {
          auto g = backend->indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
          compare_expected(be, f, "dq_idx", g.dq_idx);
          compare_expected(be, f, "dk_idx", g.dk_idx);
          compare_expected(be, f, "dw", g.dw);
          break;
        }
        case Op::SparseMlaFwd: {
          auto o = backend->sparse_mla_forward(c.mla);
          compare_expected(be, f, "out", o.out);
          compare_expected(be, f, "lse", o.lse);
          compare_expected(be, f, "max_logits", o.max_logits);
          break;
        }
        case Op::SparseMlaBwd: {
          auto g = backend->sparse_mla_backward(c.mla, c.dout);
          compare_expected(be, f, "dq", g.dq);
          compare_expected(be, f, "dkv", g.dkv);
          if (g.dsink) compare_expected(be, f, "dsink", *g.dsink);
          break;
        }
        case Op::IndexerKlLoss: {
          auto k = backend->indexer_kl_loss(c.kl);
          compare_expected(be, f, "loss", k.loss);
          compare_expected(be, f, "d_scores", k.d_scores);
          break;
        }
        case Op::Topk: {
          const Tensor ids = backend->select_topk(c.scores, c.k, c.policy, c.topk_windows);
          const TopkConventions conv = topk_conventions_from_json(f.conventions);
          const Tensor* expected = find(f.expected, "indices");
          if (!expected) break;
          const Tensor adapted = conv.narrowed_width ? adapt_topk_width(*expected, c.k) : *expected;
          int64_t differing = 0;
          for (int64_t t = 0; t < c.scores.size(0); ++t)
            if (ids.dim() == 2 && row_set(ids, t) != row_set(adapted, t)) ++differing;
          be.notes.push_back(std::to_string(differing) + " row set(s) differ from the producer");
          if (differing > 0 && c.policy.tie_break != TieBreak::Any)
            be.fail("backend and producer select different sets");
          break;
        }
      }
    }
  } catch (const NotSupported& e) {
    be.notes.push_back(std::string("skipped: ") + e.what());
  } catch (const std::exception& e) {
    be.fail(std::string("backend threw: ") + e.what());
  }
  return rep;
}

std::string format_fixture_report(const FixtureReport& r) {
  std::ostringstream os;
  os << "== " << r.case_name << " (" << r.op << ") " << (r.passed() ? "pass" : "FAIL") << "\n";
  os << "   producer: " << r.producer << "\n";
  os << format_op_report(r.reference_vs_expected);
  for (const auto& b : r.backend_vs_reference) os << format_op_report(b);
  if (r.backend_vs_expected.verdict != Verdict::Skip) os << format_op_report(r.backend_vs_expected);
  return os.str();
}

}  // namespace dsa::oracle
