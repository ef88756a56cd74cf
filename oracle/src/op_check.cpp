// The per-op testbed: backend run(s) → reference + baseline → judge → determinism.
#include "dsa/oracle/op_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/tolerances.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"

namespace dsa::oracle {

using reference::Precision;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

namespace {

OpReport start(Backend& b, const std::string& op_name, Op op) {
  OpReport r;
  r.backend = b.name();
  r.op = op_name;
  const std::string why = b.unavailable_reason();
  if (!why.empty()) {
    r.verdict = Verdict::Skip;
    r.reason = why;
  } else if (!b.supports(op)) {
    r.verdict = Verdict::Skip;
    r.reason = std::string("op ") + to_string(op) + " not supported";
  }
  return r;
}

// Runs `call` (twice when determinism is checked); `eq` compares two results bitwise.
// Returns false when the report is final (skip or failure by exception).
template <class R, class Call, class Eq>
bool run_backend(OpReport& r, Backend& b, const CheckOptions& opt, Call call, Eq eq, R& out) {
  if (r.verdict == Verdict::Skip) return false;
  try {
    out = call();
    if (opt.check_determinism && b.deterministic()) {
      R again = call();
      r.determinism_checked = true;
      r.determinism_ok = eq(out, again);
      if (!r.determinism_ok) r.fail("deterministic backend returned different bytes on a second run");
    }
  } catch (const NotSupported& e) {
    r.verdict = Verdict::Skip;
    r.reason = e.what();
    return false;
  } catch (const std::exception& e) {
    r.fail(std::string("backend threw: ") + e.what());
    return false;
  }
  return true;
}

// SPEC §9 complete outputs: false (and the report updated) when `name` is not judged,
// either because the user named the outputs the kernel provides without it, or because the
// candidate did not return it (Incomplete).
bool wanted(OpReport& r, const CheckOptions& opt, const std::string& name, bool present) {
  if (opt.provided_outputs && !opt.provided_outputs->count(name)) {
    r.not_judged.push_back(name);
    return false;
  }
  if (!present) {
    r.mark(Verdict::Incomplete, name + ": not returned by the candidate (SPEC §9: every output "
                                       "is judged unless the provided outputs are named)");
    return false;
  }
  return true;
}

void judge(OpReport& r, const CheckOptions& opt, const std::string& op, const std::string& name,
           const Tensor& cand, const Tensor& ref, const Tensor& base, double term_scale) {
  if (!wanted(r, opt, name, cand.defined())) return;
  TensorCheck c = judge_tensor(op, name, cand, ref, base, term_scale);
  if (!c.passed) r.fail(name + ": " + c.message);
  r.tensors.push_back(std::move(c));
}

// Largest finite |x| (0 for empty tensors).
double amax(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = std::abs(t.get(i));
    if (std::isfinite(v)) m = std::max(m, v);
  }
  return m;
}

}  // namespace

TermScales indexer_term_scales(const OpCase& c) {
  TermScales s;
  const double H = static_cast<double>(c.q_idx.size(1)), dI = static_cast<double>(c.q_idx.size(2));
  const double s_q = static_cast<double>(c.q_idx.size(0)), s_kv = static_cast<double>(c.k_idx.size(0));
  const double q = amax(c.q_idx), k = amax(c.k_idx), w = amax(c.w);
  const double g = c.d_scores.defined() ? amax(c.d_scores) : 0.0;
  s.values["scores"] = H * dI * w * q * k;
  s.values["dq_idx"] = s_kv * g * w * k;
  s.values["dk_idx"] = s_q * H * g * w * q;
  s.values["dw"] = s_kv * g * dI * q * k;
  return s;
}

TermScales sparse_mla_term_scales(const OpCase& c) {
  TermScales s;
  const SparseMlaInputs& in = c.mla;
  const int64_t s_q = in.q.size(0), s_kv = in.kv.size(0);
  const double h = static_cast<double>(in.q.size(1));
  const double d_v = static_cast<double>(in.d_v);
  const int64_t k = in.indices.size(-1);
  const double q = amax(in.q), kv = amax(in.kv), sc = std::abs(in.sm_scale);
  // L bounds |P - lse| of the terms that carry weight: the actual largest |logit| (from the
  // float64 forward) plus ln k, not the worst case sm_scale·d_qk·|q|·|kv|.
  const SparseMlaForward f = reference::sparse_mla_forward(in);
  double L = std::log(static_cast<double>(std::max<int64_t>(1, k)));
  for (int64_t i = 0; i < f.max_logits.numel(); ++i) {
    const double m = f.max_logits.get(i);
    if (std::isfinite(m)) L = std::max(L, std::abs(m) + std::log(static_cast<double>(k)));
  }
  // Terms summed into one dkv row: h_q per (query, valid slot) that selects the key.
  std::vector<int64_t> hits(static_cast<size_t>(s_kv), 0);
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
    for (int64_t j = 0; j < std::min(k, len); ++j) {
      const double id = in.indices.get(t * k + j);
      if (id >= 0 && id < static_cast<double>(s_kv)) ++hits[static_cast<size_t>(id)];
    }
  }
  const double max_hits = static_cast<double>(
      std::max<int64_t>(1, hits.empty() ? 1 : *std::max_element(hits.begin(), hits.end())));
  const double dout = c.dout.defined() ? amax(c.dout) : 0.0;
  const double G = d_v * dout * kv;
  s.values["out"] = kv * (1 + L);
  s.values["lse"] = L;
  s.values["max_logits"] = L;
  s.values["dq"] = 2 * sc * G * kv * (1 + L);
  s.values["dkv"] = max_hits * h * (dout + 2 * sc * G * q) * (1 + L);
  s.values["dsink"] = static_cast<double>(s_q) * G;
  return s;
}

TermScales kl_term_scales(const OpCase& c) {
  TermScales s;
  const IndexerKlInputs& in = c.kl;
  const double d = static_cast<double>(in.q.size(2));
  const double L = std::abs(in.sm_scale) * d * amax(in.q) * amax(in.kv);
  int64_t rows = 0;
  for (int64_t t = 0; t < in.windows.s_q(); ++t) rows += in.windows.length(t) > 0;
  const double coeff = std::abs(in.coeff);
  s.values["loss"] = coeff * (1 + 2 * amax(in.scores) + 2 * L +
                              std::log(static_cast<double>(std::max<int64_t>(1, in.windows.s_kv))));
  s.values["d_scores"] = coeff / static_cast<double>(std::max<int64_t>(1, rows));
  return s;
}

double TermScales::at(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? 0.0 : it->second;
}

OpReport check_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerScores;
  OpReport r = start(b, to_string(op), op);
  Tensor cand;
  if (!run_backend(r, b, opt, [&] { return b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows); },
                   bitwise_equal, cand))
    return r;
  const Tensor ref = reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
  const Tensor base =
      reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows, Precision::Baseline);
  judge(r, opt, to_string(op), "scores", cand, ref, base, indexer_term_scales(c).at("scores"));
  return r;
}

OpReport check_indexer_backward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerScoresBackward;
  OpReport r = start(b, to_string(op), op);
  IndexerGrads cand;
  auto eq = [](const IndexerGrads& x, const IndexerGrads& y) {
    return bitwise_equal(x.dq_idx, y.dq_idx) && bitwise_equal(x.dk_idx, y.dk_idx) &&
           bitwise_equal(x.dw, y.dw);
  };
  if (!run_backend(r, b, opt,
                   [&] {
                     return b.indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows,
                                                      c.d_scores);
                   },
                   eq, cand))
    return r;
  const IndexerGrads ref =
      reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
  const IndexerGrads base = reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows,
                                                               c.d_scores, Precision::Baseline);
  const TermScales ts = indexer_term_scales(c);
  judge(r, opt, to_string(op), "dq_idx", cand.dq_idx, ref.dq_idx, base.dq_idx, ts.at("dq_idx"));
  judge(r, opt, to_string(op), "dk_idx", cand.dk_idx, ref.dk_idx, base.dk_idx, ts.at("dk_idx"));
  judge(r, opt, to_string(op), "dw", cand.dw, ref.dw, base.dw, ts.at("dw"));
  return r;
}

OpReport check_topk_op(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::Topk;
  OpReport r = start(b, to_string(op), op);
  Tensor cand;
  if (!run_backend(r, b, opt,
                   [&] { return b.select_topk(c.scores, c.k, c.policy, c.topk_windows); },
                   bitwise_equal, cand))
    return r;
  std::vector<int64_t> nan_rows;
  r.topk_violations = check_topk(cand, c.scores, c.k, c.policy, c.topk_windows, &nan_rows);
  if (!nan_rows.empty())
    r.notes.push_back(std::to_string(nan_rows.size()) + " row(s) contained NaN scores (first row " +
                      std::to_string(nan_rows.front()) + ")");
  if (!r.topk_violations.empty()) r.fail(summarize_topk_violations(r.topk_violations));
  return r;
}

OpReport check_sparse_mla_forward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::SparseMlaFwd;
  OpReport r = start(b, to_string(op), op);
  SparseMlaForward cand;
  auto eq = [](const SparseMlaForward& x, const SparseMlaForward& y) {
    return bitwise_equal(x.out, y.out) && bitwise_equal(x.lse, y.lse) &&
           bitwise_equal(x.max_logits, y.max_logits);
  };
  if (!run_backend(r, b, opt, [&] { return b.sparse_mla_forward(c.mla); }, eq, cand)) return r;
  const SparseMlaForward ref = reference::sparse_mla_forward(c.mla);
  const SparseMlaForward base = reference::sparse_mla_forward(c.mla, Precision::Baseline);
  const TermScales ts = sparse_mla_term_scales(c);
  judge(r, opt, to_string(op), "out", cand.out, ref.out, base.out, ts.at("out"));
  judge(r, opt, to_string(op), "lse", cand.lse, ref.lse, base.lse, ts.at("lse"));
  judge(r, opt, to_string(op), "max_logits", cand.max_logits, ref.max_logits, base.max_logits,
        ts.at("max_logits"));
  return r;
}

OpReport check_sparse_mla_backward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::SparseMlaBwd;
  OpReport r = start(b, to_string(op), op);
  SparseMlaGrads cand;
  auto eq = [](const SparseMlaGrads& x, const SparseMlaGrads& y) {
    return bitwise_equal(x.dq, y.dq) && bitwise_equal(x.dkv, y.dkv) &&
           x.dsink.has_value() == y.dsink.has_value() &&
           (!x.dsink || bitwise_equal(*x.dsink, *y.dsink));
  };
  if (!run_backend(r, b, opt, [&] { return b.sparse_mla_backward(c.mla, c.dout); }, eq, cand))
    return r;
  const SparseMlaGrads ref = reference::sparse_mla_backward(c.mla, c.dout);
  const SparseMlaGrads base = reference::sparse_mla_backward(c.mla, c.dout, Precision::Baseline);
  const TermScales ts = sparse_mla_term_scales(c);
  judge(r, opt, to_string(op), "dq", cand.dq, ref.dq, base.dq, ts.at("dq"));
  judge(r, opt, to_string(op), "dkv", cand.dkv, ref.dkv, base.dkv, ts.at("dkv"));
  if (c.mla.attn_sink) {
    if (wanted(r, opt, "dsink", cand.dsink.has_value() && cand.dsink->defined()) && ref.dsink &&
        base.dsink)
      judge(r, opt, to_string(op), "dsink", *cand.dsink, *ref.dsink, *base.dsink, ts.at("dsink"));
  }
  return r;
}

OpReport check_indexer_kl_loss(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerKlLoss;
  OpReport r = start(b, to_string(op), op);
  IndexerKlResult cand;
  auto eq = [](const IndexerKlResult& x, const IndexerKlResult& y) {
    return bitwise_equal(x.loss, y.loss) && bitwise_equal(x.d_scores, y.d_scores);
  };
  if (!run_backend(r, b, opt, [&] { return b.indexer_kl_loss(c.kl); }, eq, cand)) return r;
  const IndexerKlResult ref = reference::indexer_kl_loss(c.kl);
  const IndexerKlResult base = reference::indexer_kl_loss(c.kl, Precision::Baseline);
  const TermScales ts = kl_term_scales(c);
  judge(r, opt, to_string(op), "loss", cand.loss, ref.loss, base.loss, ts.at("loss"));
  judge(r, opt, to_string(op), "d_scores", cand.d_scores, ref.d_scores, base.d_scores, ts.at("d_scores"));
  return r;
}

OpReport check_fused_indexer_topk(Backend& b, const OpCase& c, const CheckOptions& opt) {
  OpReport r = start(b, "indexer_scores+topk", Op::IndexerScores);
  if (r.verdict == Verdict::Pass && !b.supports(Op::Topk)) {
    r.verdict = Verdict::Skip;
    r.reason = "op topk not supported";
  }
  Tensor scores, ids;
  if (!run_backend(r, b, opt, [&] { return b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows); },
                   bitwise_equal, scores))
    return r;
  if (!run_backend(r, b, opt, [&] { return b.select_topk(scores, c.k, c.policy, c.windows); },
                   bitwise_equal, ids))
    return r;
  const Tensor ref = reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows);
  const Tensor base =
      reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows, Precision::Baseline);
  TensorCheck sc = judge_tensor(to_string(Op::IndexerScores), "scores", scores, ref, base,
                                indexer_term_scales(c).at("scores"));
  if (!sc.passed) r.fail("scores: " + sc.message);
  // Both swapped entries may each err by the bound, so the accepted band around v* is 2x.
  const double bound = sc.metrics.shape_ok ? 2.0 * sc.bound : 0.0;
  r.tensors.push_back(sc);
  r.notes.push_back("fused top-k score bound " + std::to_string(bound));
  r.topk_violations = check_fused_topk(ids, ref, bound, c.k, c.windows);
  if (!r.topk_violations.empty())
    r.fail(r.topk_violations.front().rule + " row=" + std::to_string(r.topk_violations.front().row) +
           ": " + r.topk_violations.front().detail);
  return r;
}

namespace {
thread_local const CheckOptions* current_defaults = nullptr;
}  // namespace

const CheckOptions& default_check_options() {
  static const CheckOptions plain;
  return current_defaults ? *current_defaults : plain;
}

ScopedCheckDefaults::ScopedCheckDefaults(CheckOptions opt) : previous_(current_defaults), opt_(std::move(opt)) {
  current_defaults = &opt_;
}

ScopedCheckDefaults::~ScopedCheckDefaults() { current_defaults = previous_; }

OpReport check_op(Backend& backend, Op op, const OpCase& c, const CheckOptions& opt) {
  switch (op) {
    case Op::IndexerScores: return check_indexer_scores(backend, c, opt);
    case Op::IndexerScoresBackward: return check_indexer_backward(backend, c, opt);
    case Op::Topk: return check_topk_op(backend, c, opt);
    case Op::SparseMlaFwd: return check_sparse_mla_forward(backend, c, opt);
    case Op::SparseMlaBwd: return check_sparse_mla_backward(backend, c, opt);
    case Op::IndexerKlLoss: return check_indexer_kl_loss(backend, c, opt);
    case Op::Fp8IndexerScores: return check_fp8_indexer_scores(backend, c, opt);
    case Op::PagedIndexerScores: return check_paged_indexer_scores(backend, c, opt);
    case Op::SparseMlaFp8Fwd: return check_sparse_mla_fp8_forward(backend, c, opt);
  }
  throw std::invalid_argument("check_op: unknown op");
}

}  // namespace dsa::oracle
