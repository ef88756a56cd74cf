// The per-op testbed: backend run(s) → reference + baseline → judge → determinism.
#include "dsa/oracle/op_check.h"

#include "check_start.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dsa/contract/errors.h"
#include "dsa/oracle/fp8_check.h"
#include "dsa/oracle/local_bounds.h"
#include "dsa/oracle/scoped_case_memo.h"
#include "dsa/oracle/tolerances.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/topk.h"

namespace dsa::oracle {

using reference::Precision;

bool scalar_loss_shape(const std::vector<int64_t>& shape) {
  return shape.empty() || shape == std::vector<int64_t>{1};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::string run_difference(const std::string& name, const Tensor& a, const Tensor& b) {
  if (!a.defined() && !b.defined()) return "";
  if (a.defined() != b.defined())
    return name + ": returned on " + (a.defined() ? "the first" : "the second") + " run only";
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return name + ": " + dtype_name(a.dtype()) + " " + shape_str(a.shape()) + " then " + dtype_name(b.dtype()) +
           " " + shape_str(b.shape());
  if (bitwise_equal(a, b)) return "";
  const int64_t rows = a.dim() >= 2 ? a.size(0) : 1;
  const int64_t per_row = rows > 0 ? a.numel() / rows : 0;
  const bool ids = !is_floating(a.dtype());
  auto value = [&](const Tensor& t, int64_t i) {
    char buf[64];
    if (ids) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(t.get(i)));
    else std::snprintf(buf, sizeof buf, "%.9g", t.get(i));
    return std::string(buf);
  };
  // Bytes, not values: -0.0 vs +0.0 and NaN payloads differ too.
  const size_t es = per_row > 0 ? a.nbytes() / static_cast<size_t>(a.numel()) : 0;
  auto differs = [&](int64_t i) {
    return std::memcmp(a.raw() + i * static_cast<int64_t>(es), b.raw() + i * static_cast<int64_t>(es), es) != 0;
  };
  std::vector<int64_t> bad_rows;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < per_row; ++j)
      if (differs(r * per_row + j)) {
        bad_rows.push_back(r);
        break;
      }
  std::string s = name + ": ";
  if (a.dim() >= 2) {
    s += bad_rows.size() == 1 ? "row " : "rows ";
    for (size_t i = 0; i < bad_rows.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(bad_rows[i]);
    if (bad_rows.size() > 8) s += ", ...";
    s += " of " + std::to_string(rows) + (bad_rows.size() == 1 ? " differs" : " differ") + "; row " +
         std::to_string(bad_rows.front());
  } else {
    s += "differs;";
  }
  int shown = 0;
  for (int64_t j = 0; j < per_row && shown < 4; ++j) {
    const int64_t i = bad_rows.front() * per_row + j;
    if (!differs(i)) continue;
    s += std::string(shown ? "," : "") + (a.dim() >= 2 ? " slot " : " element ") + std::to_string(j) + ": " +
         (ids ? "id " : "") + value(a, i) + " then " + value(b, i);
    ++shown;
  }
  return s;
}

namespace {
/// "a, b, c" (empty for none).
std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string join_differences(std::initializer_list<std::string> parts) {
  std::string s;
  for (const auto& p : parts)
    if (!p.empty()) s += (s.empty() ? "" : "; ") + p;
  return s;
}
}  // namespace

std::string run_difference(const Tensor& a, const Tensor& b) {
  return run_difference(a.defined() && !is_floating(a.dtype()) ? "indices" : "output", a, b);
}
std::string run_difference(const SparseMlaForward& a, const SparseMlaForward& b) {
  return join_differences({run_difference("out", a.out, b.out), run_difference("lse", a.lse, b.lse),
                           run_difference("max_logits", a.max_logits, b.max_logits)});
}
std::string run_difference(const SparseMlaGrads& a, const SparseMlaGrads& b) {
  return join_differences({run_difference("dq", a.dq, b.dq), run_difference("dkv", a.dkv, b.dkv),
                           run_difference("dsink", a.dsink.value_or(Tensor()), b.dsink.value_or(Tensor()))});
}
std::string run_difference(const IndexerGrads& a, const IndexerGrads& b) {
  return join_differences({run_difference("dq_idx", a.dq_idx, b.dq_idx), run_difference("dk_idx", a.dk_idx, b.dk_idx),
                           run_difference("dw", a.dw, b.dw)});
}
std::string run_difference(const IndexerKlResult& a, const IndexerKlResult& b) {
  return join_differences({run_difference("loss", a.loss, b.loss), run_difference("d_scores", a.d_scores, b.d_scores)});
}

namespace {

using detail::run_backend;

// Judges one output of `op` (whose q has dtype `q`) by the local rule and the SPEC's dtype
// rule (check_start.h, shared with the §10 checks).
void judge(OpReport& r, const CheckOptions& opt, Op op, DType q, const std::string& name,
           const Tensor& cand, const Tensor& ref, const Tensor& base, const CaseFloors& floors,
           bool delta_shared = false) {
  static const OutputFloor none;  // an output not judged (not provided, or not returned)
  auto it = floors.find(name);
  const bool judged = cand.defined() && (!opt.provided_outputs || opt.provided_outputs->count(name));
  if (it == floors.end() && judged) throw std::logic_error("judge: no floor inputs for output " + name);
  detail::judge_output(r, opt, op, q, to_string(op), name, "", cand, ref, base,
                       it == floors.end() ? none : it->second, delta_shared);
}

// Results shared through the case's memo (issue 13): each reference result, baseline and
// floor set is computed once per case and fingerprint of the inputs it reads. A case without
// a memo of its own uses the thread's scoped one (ScopedCaseMemo: a property draw's), if any.
CaseMemo* memo_of(const OpCase& c) { return c.memo ? c.memo.get() : scoped_case_memo(); }

Fingerprint fp_indexer(const OpCase& c) {
  Fingerprint f;
  f.add(c.q_idx).add(c.k_idx).add(c.w).add(c.windows);
  return f;
}

Fingerprint fp_mla(const SparseMlaInputs& in) {
  Fingerprint f;
  f.add(in.q).add(in.kv).add(in.indices).add(in.topk_length).add(in.attn_sink).add(in.sm_scale).add(in.d_v);
  return f;
}

Fingerprint fp_kl(const IndexerKlInputs& in) {
  Fingerprint f;
  f.add(in.scores).add(in.q).add(in.kv).add(in.sm_scale).add(in.windows);
  f.add(static_cast<int64_t>(in.mode)).add(in.indices).add(in.coeff);
  return f;
}

std::shared_ptr<const Tensor> shared_indexer_scores(const OpCase& c, Precision p) {
  return shared_result<Tensor>(
      memo_of(c), p == Precision::Baseline ? "indexer_scores/baseline" : "indexer_scores/reference",
      fp_indexer(c), [&] { return reference::indexer_scores(c.q_idx, c.k_idx, c.w, c.windows, p); });
}

std::shared_ptr<const CaseFloors> shared_indexer_scores_floors(const OpCase& c) {
  return shared_result<CaseFloors>(memo_of(c), "indexer_scores/floors", fp_indexer(c), [&] {
    return indexer_scores_floors(c.q_idx, c.k_idx, c.w, c.windows);
  });
}

std::shared_ptr<const SparseMlaForward> shared_mla_forward(const OpCase& c, Precision p) {
  return shared_result<SparseMlaForward>(
      memo_of(c), p == Precision::Baseline ? "sparse_mla_fwd/baseline" : "sparse_mla_fwd/reference",
      fp_mla(c.mla), [&] { return reference::sparse_mla_forward(c.mla, p); });
}

// The floors depend on the working dtype only through its 16-bit rounding (local_bounds.h):
// every wider or non-float dtype gives the floors of F32, so they share one memo key.
DType floor_work_dtype(DType d) { return d == DType::BF16 || d == DType::F16 ? d : DType::F32; }

// The backward's dout fits the forward's shape (the floors can then include the backward).
bool dout_fits(const OpCase& c) {
  return c.dout.defined() && c.mla.q.dim() == 3 &&
         c.dout.numel() == c.mla.q.size(0) * c.mla.q.size(1) * c.mla.d_v;
}

// True when the backward's per-key-row floor arrays (dkv: s_kv x d_qk) are small (<= 2^20
// elements) or no larger than the per-slot work (s_q x h_q x k slots of d_qk columns): a
// forward then computes them along with its own floors, for the backward a memoized case may
// judge next. A draw over 65537+ kv rows of which a few are selected (the wide-id draws,
// outside tester F3) does not: its forward computes its own floors alone (a previous attempt
// doubled the CPU time of the sparse MLA properties computing 65537 x 512 dkv floors for
// forward-only checks), and a backward, when judged, computes the floors with dkv's.
bool dkv_floors_cheap(const SparseMlaInputs& in) {
  const int64_t s_kv = in.kv.size(0), dqk = in.q.size(2);
  return s_kv * dqk <= (int64_t{1} << 20) || s_kv <= in.q.size(0) * in.q.size(1) * in.indices.size(-1);
}

// Floor inputs of sparse MLA at the working dtype `work`: with the backward outputs when
// `backward`; for the forward of a memoized case with a usable dout as well when the dkv
// floors are cheap (dkv_floors_cheap; the forward outputs' floors do not depend on dout, so
// one computation serves both ops).
std::shared_ptr<const CaseFloors> shared_mla_floors(const OpCase& c, DType work, bool backward) {
  work = floor_work_dtype(work);
  CaseMemo* memo = memo_of(c);
  const bool with_dout = backward || (memo && dout_fits(c) && dkv_floors_cheap(c.mla));
  Fingerprint f = fp_mla(c.mla);
  if (with_dout) f.add(c.dout);
  auto kind = [&](DType d) {
    return std::string(with_dout ? "sparse_mla_fwd+bwd/floors/" : "sparse_mla_fwd/floors/") +
           dtype_name(d);
  };
  const Tensor* dout = with_dout ? &c.dout : nullptr;
  if (!memo || work == DType::F32)
    return shared_result<CaseFloors>(memo, kind(work), f,
                                     [&] { return sparse_mla_floors(c.mla, dout, work); });
  // A 16-bit working dtype: the floors of fp32 work come with it at little cost, for the
  // case's other candidates (the reference backend's outputs are f64).
  CaseFloors f32;
  bool have_f32 = false;
  auto r = shared_result<CaseFloors>(memo, kind(work), f, [&] {
    std::pair<CaseFloors, CaseFloors> both = sparse_mla_floors_and_f32(c.mla, dout, work);
    f32 = std::move(both.second);
    have_f32 = true;
    return std::move(both.first);
  });
  // Stored under the F32 key without counting a computation of its own (it was part of the
  // one above).
  if (have_f32)
    memo->get<std::shared_ptr<const CaseFloors>>(kind(DType::F32) + "@" + f.hex(), [&] {
      return std::make_shared<const CaseFloors>(std::move(f32));
    });
  return r;
}

// A backend that returns given outputs (judge_outputs).
class OutputsBackend : public Backend {
 public:
  OutputsBackend(const NamedOutputs& o, std::string label) : o_(o), label_(std::move(label)) {}
  std::string name() const override { return label_; }
  bool supports(Op) const override { return true; }
  Tensor indexer_scores(const Tensor&, const Tensor&, const Tensor&, const KeyWindows&) override {
    return get("scores");
  }
  IndexerGrads indexer_scores_backward(const Tensor&, const Tensor&, const Tensor&,
                                       const KeyWindows&, const Tensor&) override {
    return IndexerGrads{get("dq_idx"), get("dk_idx"), get("dw")};
  }
  Tensor select_topk(const Tensor&, int64_t, const TopkPolicy&,
                     const std::optional<KeyWindows>&) override {
    return get("indices");
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs&) override {
    return SparseMlaForward{get("out"), get("lse"), get("max_logits")};
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs&) override { return get("scores"); }
  Tensor paged_indexer_scores(const PagedIndexerInputs&) override { return get("scores"); }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs&) override {
    return SparseMlaForward{get("out"), get("lse"), get("max_logits")};
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs&, const Tensor&) override {
    SparseMlaGrads g{get("dq"), get("dkv"), std::nullopt};
    if (o_.count("dsink")) g.dsink = get("dsink");
    return g;
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs&) override {
    return IndexerKlResult{get("loss"), get("d_scores")};
  }

 private:
  Tensor get(const std::string& n) const {
    auto it = o_.find(n);
    return it == o_.end() ? Tensor() : it->second;
  }
  const NamedOutputs& o_;
  std::string label_;
};

// The candidate's result. The reference backend's (computes_reference) is the case's
// float64 reference itself: taken through `shared` (the memo the judge uses, so it is computed
// once per case) and not run a second time for determinism (its bytes do not depend on the
// run or the thread count: ThreadCount.*); a note says so. Other backends: run_backend.
template <class R, class Shared, class Call, class Eq>
bool run_candidate(OpReport& r, Backend& b, const CheckOptions& opt, Shared&& shared, Call call,
                   Eq eq, R& out) {
  if (!b.computes_reference()) return run_backend(r, b, opt, std::move(call), std::move(eq), out);
  const bool ok = run_backend(r, b, false, "", [&] { return R(*shared()); }, std::move(eq), out);
  if (ok)
    r.notes.push_back("candidate = the case's shared float64 reference (computed once per case, "
                      "not run twice)");
  return ok;
}

}  // namespace

OpReport check_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerScores;
  OpReport r = detail::start_report(b, to_string(op), op);
  Tensor cand;
  if (!run_candidate(r, b, opt, [&] { return shared_indexer_scores(c, Precision::Reference); },
                     [&] { return b.indexer_scores(c.q_idx, c.k_idx, c.w, c.windows); },
                     bitwise_equal, cand))
    return r;
  const auto ref = shared_indexer_scores(c, Precision::Reference);
  const auto base = shared_indexer_scores(c, Precision::Baseline);
  const auto floors = shared_indexer_scores_floors(c);
  judge(r, opt, op, c.q_idx.dtype(), "scores", cand, *ref, *base, *floors);
  return detail::settle_judged_nothing(std::move(r), opt, op);
}

OpReport check_indexer_backward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerScoresBackward;
  OpReport r = detail::start_report(b, to_string(op), op);
  IndexerGrads cand;
  auto eq = [](const IndexerGrads& x, const IndexerGrads& y) {
    return bitwise_equal(x.dq_idx, y.dq_idx) && bitwise_equal(x.dk_idx, y.dk_idx) &&
           bitwise_equal(x.dw, y.dw);
  };
  const Fingerprint fp = fp_indexer(c).add(c.d_scores);
  auto shared_ref = [&] {
    return shared_result<IndexerGrads>(memo_of(c), "indexer_scores_backward/reference", fp, [&] {
      return reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
    });
  };
  if (!run_candidate(r, b, opt, shared_ref,
                     [&] {
                       return b.indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows,
                                                        c.d_scores);
                     },
                     eq, cand))
    return r;
  const auto ref_p = shared_ref();
  const auto base_p = shared_result<IndexerGrads>(memo_of(c), "indexer_scores_backward/baseline", fp, [&] {
    return reference::indexer_scores_backward(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores,
                                              Precision::Baseline);
  });
  const auto floors_p = shared_result<CaseFloors>(memo_of(c), "indexer_scores_backward/floors", fp, [&] {
    return indexer_backward_floors(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
  });
  const IndexerGrads& ref = *ref_p;
  const IndexerGrads& base = *base_p;
  const CaseFloors& floors = *floors_p;
  judge(r, opt, op, c.q_idx.dtype(), "dq_idx", cand.dq_idx, ref.dq_idx, base.dq_idx, floors);
  judge(r, opt, op, c.q_idx.dtype(), "dk_idx", cand.dk_idx, ref.dk_idx, base.dk_idx, floors);
  judge(r, opt, op, c.q_idx.dtype(), "dw", cand.dw, ref.dw, base.dw, floors);
  return detail::settle_judged_nothing(std::move(r), opt, op);
}

OpReport check_topk_op(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::Topk;
  OpReport r = detail::start_report(b, to_string(op), op);
  Tensor cand;
  if (!run_backend(r, b, opt,
                   [&] { return b.select_topk(c.scores, c.k, c.policy, c.topk_windows); },
                   bitwise_equal, cand))
    return r;
  // SPEC §3: int32 ids (I64 only through the int64_ids convention, converted before this).
  // The violation is listed too (rule "dtype": route hints name the int64_ids convention).
  if (detail::contract_dtype_violated(r, op, "indices", "", cand, c.scores.dtype())) {
    r.topk_violations.push_back(
        {"dtype", -1, -1, detail::contract_dtype_message("indices", "", cand.dtype(), DType::I32)});
    return detail::settle_judged_nothing(std::move(r), opt, op, cand.numel());
  }
  std::vector<int64_t> nan_rows;
  r.topk_violations = check_topk(cand, c.scores, c.k, c.policy, c.topk_windows, &nan_rows);
  if (!nan_rows.empty())
    r.notes.push_back(std::to_string(nan_rows.size()) + " row(s) contained NaN scores (first row " +
                      std::to_string(nan_rows.front()) + ")");
  if (!r.topk_violations.empty()) r.fail(summarize_topk_violations(r.topk_violations));
  return detail::settle_judged_nothing(std::move(r), opt, op, cand.numel());
}

OpReport check_sparse_mla_forward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::SparseMlaFwd;
  OpReport r = detail::start_report(b, to_string(op), op);
  SparseMlaForward cand;
  auto eq = [](const SparseMlaForward& x, const SparseMlaForward& y) {
    return bitwise_equal(x.out, y.out) && bitwise_equal(x.lse, y.lse) &&
           bitwise_equal(x.max_logits, y.max_logits);
  };
  if (!run_candidate(r, b, opt, [&] { return shared_mla_forward(c, Precision::Reference); },
                     [&] { return b.sparse_mla_forward(c.mla); }, eq, cand))
    return r;
  // SPEC §4: out in q's dtype (or wider); a narrower out or another 16-bit format would pick
  // another baseline below (the dtype rule of every check, check_start.h).
  if ((!opt.provided_outputs || opt.provided_outputs->count("out")) &&
      detail::contract_dtype_violated(r, op, "out", "", cand.out, c.mla.q.dtype()))
    return r;
  const auto ref_p = shared_mla_forward(c, Precision::Reference);
  const auto base_p = shared_mla_forward(c, Precision::Baseline);
  const DType work = cand.out.defined() ? cand.out.dtype() : c.mla.q.dtype();
  const auto floors_p = shared_mla_floors(c, work, /*backward=*/false);
  const SparseMlaForward& ref = *ref_p;
  const SparseMlaForward& base = *base_p;
  const CaseFloors& floors = *floors_p;
  judge(r, opt, op, c.mla.q.dtype(), "out", cand.out, ref.out, base.out, floors);
  judge(r, opt, op, c.mla.q.dtype(), "lse", cand.lse, ref.lse, base.lse, floors);
  judge(r, opt, op, c.mla.q.dtype(), "max_logits", cand.max_logits, ref.max_logits, base.max_logits,
        floors);
  detail::wider_out_hint(r, "", cand.out, c.mla.q.dtype());
  return detail::settle_judged_nothing(std::move(r), opt, op);
}

OpReport check_sparse_mla_backward(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::SparseMlaBwd;
  OpReport r = detail::start_report(b, to_string(op), op);
  SparseMlaGrads cand;
  auto eq = [](const SparseMlaGrads& x, const SparseMlaGrads& y) {
    return bitwise_equal(x.dq, y.dq) && bitwise_equal(x.dkv, y.dkv) &&
           x.dsink.has_value() == y.dsink.has_value() &&
           (!x.dsink || bitwise_equal(*x.dsink, *y.dsink));
  };
  const Fingerprint fp = fp_mla(c.mla).add(c.dout);
  auto shared_ref = [&] {
    return shared_result<SparseMlaGrads>(memo_of(c), "sparse_mla_bwd/reference", fp,
                                         [&] { return reference::sparse_mla_backward(c.mla, c.dout); });
  };
  if (!run_candidate(r, b, opt, shared_ref, [&] { return b.sparse_mla_backward(c.mla, c.dout); },
                     eq, cand))
    return r;
  // SPEC §9: the baseline takes Δ from `out` at the candidate's precision (§5). The candidate's
  // own out is the one the route handed over (c.fwd_out), else the one its forward returns on
  // this case (a candidate file's stored out, a plugin's or a built-in backend's forward run
  // here, a Python backend's); without one, q's dtype (§4).
  const auto base_fwd_p = shared_mla_forward(c, Precision::Baseline);
  const SparseMlaForward& base_fwd = *base_fwd_p;
  DType out_dtype = c.mla.q.dtype();
  std::optional<Tensor> own_out;  // the candidate's own out, when one is known
  std::string own_source;
  if (c.fwd_out && c.fwd_out->defined()) {
    own_out = *c.fwd_out;
    own_source = "as handed to its backward";
  } else if (b.computes_reference()) {
    out_dtype = shared_mla_forward(c, Precision::Reference)->out.dtype();  // F64, computed once
  } else if (b.supports(Op::SparseMlaFwd)) {
    try {
      const SparseMlaForward f = b.sparse_mla_forward(c.mla);
      if (f.out.defined() && is_floating(f.out.dtype())) {
        own_out = f.out;
        own_source = "as its forward returns it on this case";
      }
    } catch (const std::exception&) {
      // no forward to learn from: q's dtype (SPEC §4)
    }
  }
  if (own_out) out_dtype = own_out->dtype();
  std::optional<Tensor> delta_out;
  bool delta_from_candidate = false;  // the candidate's own out: not shared with other backends
  // The baseline's Δ is the candidate's own (its 16-bit out, passed by the forward rule): SPEC
  // §5 has the backward take Δ from the out as its forward returned it, so the floors' δΔ16
  // part (another 16-bit out's distance, OutputFloor::narrow_delta) is left out; Δ's own
  // rounding is in the baseline and so in E_row. Leaving it out only tightens the bound: a
  // backward that took Δ from another out gets a false alarm, never a false AGREES.
  bool delta_shared = false;
  std::string own_note;  // said only when the report judges with that Δ
  if (!detail::dtype_meets_contract(out_dtype, c.mla.q.dtype())) {
    // SPEC §4: out is in q's dtype; an out narrower than q, or another 16-bit format (F16 for
    // a bf16 q), must not move the baseline (the forward check fails it).
    r.notes.push_back(std::string("the candidate's out (") + dtype_name(out_dtype) +
                      ") is not q's dtype nor wider: baseline Δ at q's dtype (SPEC §4)");
    out_dtype = c.mla.q.dtype();
    own_out.reset();
  }
  const bool out16 = out_dtype != DType::F32 && out_dtype != DType::F64;
  if (own_out && out16) {
    // A 16-bit out: whose rounding it is matters (one bf16 ulp of out moves Δ by about
    // u16·|out·dout|, above the fp32 floors), so Δ comes from the candidate's own out, as its
    // backward took it (SPEC §5). It is used only when it is right (the forward's local rule):
    // a wrong out must not move the baseline. An fp32 or wider out differs from the baseline's
    // own by fp32 roundings, which the baseline's error already has: Δ from the baseline's out.
    const auto ref_fwd = shared_mla_forward(c, Precision::Reference);
    const auto ff = shared_mla_floors(c, out_dtype, /*backward=*/false);
    const TensorCheck oc =
        judge_tensor(to_string(Op::SparseMlaFwd), "out", *own_out, ref_fwd->out, base_fwd.out,
                     ff->at("out"), false, opt.rounding);
    if (oc.passed) {
      delta_out = *own_out;
      delta_shared = true;
      // The baseline's own out rounded to that dtype, bit for bit: the shared computation.
      delta_from_candidate = !bitwise_equal(*own_out, base_fwd.out.to(out_dtype));
      own_note = std::string("baseline takes Δ from the candidate's own ") +
                 dtype_name(out_dtype) + " out (" + own_source + ")";
    } else {
      r.notes.push_back(std::string("the candidate's own ") + dtype_name(out_dtype) + " out (" +
                        own_source + ") fails the forward rule, so the baseline does not take Δ from it "
                        "(below: from the baseline's own out)");
    }
  }
  if (!delta_out && out16) {
    delta_out = base_fwd.out.to(out_dtype);
    r.notes.push_back(std::string("baseline takes Δ from its out rounded to ") +
                      dtype_name(out_dtype) + " (the candidate's out dtype, SPEC §9)");
  }
  // Δ from the baseline's own out rounded to out_dtype depends on the case and that dtype
  // only; Δ from the candidate's out is that candidate's (computed for it alone).
  const std::string base_kind =
      delta_from_candidate ? "sparse_mla_bwd/baseline(candidate out)"
      : delta_out ? std::string("sparse_mla_bwd/baseline/") + dtype_name(out_dtype)
                  : std::string("sparse_mla_bwd/baseline");
  const auto base_p = shared_result<SparseMlaGrads>(
      delta_from_candidate ? nullptr : memo_of(c), base_kind, fp,
      [&] { return reference::sparse_mla_backward(c.mla, c.dout, Precision::Baseline, delta_out); });
  const auto floors_p = shared_mla_floors(c, out_dtype, /*backward=*/true);
  const CaseFloors& floors = *floors_p;
  auto judge_grads_with = [&](OpReport& rr, const SparseMlaGrads& ref, const SparseMlaGrads& base,
                              bool shared, const CaseFloors& fl) {
    judge(rr, opt, op, c.mla.q.dtype(), "dq", cand.dq, ref.dq, base.dq, fl, shared);
    judge(rr, opt, op, c.mla.q.dtype(), "dkv", cand.dkv, ref.dkv, base.dkv, fl, shared);
    if (c.mla.attn_sink && ref.dsink && base.dsink) {
      const Tensor none;
      judge(rr, opt, op, c.mla.q.dtype(), "dsink", cand.dsink ? *cand.dsink : none, *ref.dsink,
            *base.dsink, fl, shared);
    }
  };
  auto judge_grads = [&](OpReport& rr, const SparseMlaGrads& ref, const SparseMlaGrads& base,
                         bool shared) { judge_grads_with(rr, ref, base, shared, floors); };
  // A backward that recomputes P from its forward's fp32 lse with separately scaled fp32
  // logits (FlashAttention-2/3, FlashMLA: exp2(s·fl(sm·log2e) - fl(L·log2e)); SPEC §5 hands it
  // lse) errs in p_j by up to u(3|P_j| + 3|L|) more than the floors hold, also on a row with
  // one key (local_bounds.h, sparse_mla_lse_recompute_terms; fresh16 F3: 2.1 % of dkv at
  // |L| = 2^18). Judged only when the gradients fail: the floors plus that term, as a whole
  // second report. An element over that bound too keeps the FAIL. When every element lies
  // within it, that report is the verdict: PASS where the widened bound stays below θ·rowscale
  // on every row (the published δ holds), WEAK on the rows where it does not (large |L|: a
  // correct exp2 backward and a wrong one within the bound cannot be told apart there; SPEC §9,
  // fails unless --allow-weak), each such row named with its |L|. Rows below θ keep their
  // detection: a perturbation of δ there fails the widened report as it fails the floors.
  //
  // Why two judgements and not one pass choosing a model per element: the widened report is
  // not the floors' report plus a term. The term enters floor_e, hence s_e, κ_row and the
  // per-element baseline term min(E_row, κ_row·s_e), and the WEAK test (bound / row scale),
  // so each element's bound under either model needs its row's model first; and the model is
  // one claim about the kernel, chosen for the whole report (a row that passes the floors is
  // still accepted up to the widened bound once the widened model is taken, so its WEAK status
  // must be the widened one). The term itself is computed once per case and inputs (the
  // case's memo, as the floors), and only on the failing path.
  const OpReport r_pristine = r;
  struct LseTerms {  // sparse_mla_lse_recompute_terms and its per-row |L|; empty: not computable
    std::map<std::string, std::vector<double>> extra, row_lse;
  };
  auto lse_recompute = [&](OpReport rep, const OpReport& pre, const SparseMlaGrads& ref,
                           const SparseMlaGrads& base, bool shared, const CaseFloors& base_floors) {
    if (rep.verdict != Verdict::Fail) return rep;
    const auto terms = shared_result<LseTerms>(memo_of(c), "sparse_mla_bwd/lse_recompute_terms", fp, [&] {
      LseTerms t;
      try {
        t.extra = sparse_mla_lse_recompute_terms(c.mla, c.dout, &t.row_lse);
      } catch (const std::exception&) {
        t = LseTerms{};  // the floors' own argument checks already judged these inputs
      }
      return t;
    });
    if (terms->extra.empty()) return rep;
    const std::map<std::string, std::vector<double>>& extra = terms->extra;
    const std::map<std::string, std::vector<double>>& row_lse = terms->row_lse;
    CaseFloors wide = base_floors;
    double worst = 0;  // the largest extra term over an element's floor (λ·acc)
    for (const auto& [name, e] : extra) {
      auto it = wide.find(name);
      if (it == wide.end() || it->second.acc.size() != e.size()) continue;
      const double lam = tolerance(to_string(op), name, DType::F32).lambda;
      for (size_t i = 0; i < e.size(); ++i) {
        const double a = it->second.acc[i];
        if (e[i] > 0) worst = std::max(worst, a > 0 ? e[i] / (lam * a) : INFINITY);
        it->second.acc[i] = a + e[i] / lam;
      }
      it->second.source += " + P recomputed from an fp32 lse (λ x this term = Σ_j uτ_j|term_j|, "
                           "τ_j = 3|P_j| + 3|L| (+ |L| + 1 with a sink), docs/SPEC.md §9)";
    }
    OpReport w = pre;  // the report as it stood before the gradients were judged
    judge_grads_with(w, ref, base, shared, wide);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", worst);
    const std::string what =
        "the bound widened by the first-order error of P recomputed from an fp32 lse with "
        "separately scaled fp32 logits (FlashAttention-2/3, FlashMLA-style backward: u(3|P_j| + "
        "3|L|) on p_j, docs/SPEC.md §9; up to " + std::string(buf) + "x an element's floor here)";
    if (w.verdict == Verdict::Fail) {
      rep.notes.push_back("the gradients are over " + what + " too (" + w.reason + "): the FAIL stands");
      return rep;
    }
    // The rows WEAK under the widened bound, each with the largest |L| feeding it.
    std::string rows;
    double lmax = 0;
    for (const auto& t : w.tensors) {
      if (t.weak_rows == 0) continue;
      const auto lit = row_lse.find(t.name);
      rows += std::string(rows.empty() ? "" : "; ") + t.name + " " + std::to_string(t.weak_rows) + " of " +
              std::to_string(t.rows) + " rows:";
      for (int64_t row : t.weak_row_ids) {
        const double l = lit != row_lse.end() && row >= 0 && static_cast<size_t>(row) < lit->second.size()
                             ? lit->second[static_cast<size_t>(row)] : 0.0;
        lmax = std::max(lmax, l);
        std::snprintf(buf, sizeof buf, " %lld (|L| %.4g)", static_cast<long long>(row), l);
        rows += buf;
      }
      if (t.weak_rows > static_cast<int64_t>(t.weak_row_ids.size())) rows += " ...";
      // rows WEAK under the floors alone too (not the lse term's doing): counted apart
      int64_t both = 0;
      for (const auto& f : rep.tensors)
        if (f.name == t.name && f.row_weak.size() == t.row_weak.size())
          for (size_t i = 0; i < t.row_weak.size(); ++i) both += t.row_weak[i] && f.row_weak[i];
      if (both > 0) rows += " (" + std::to_string(both) + " of them WEAK under the floors alone too)";
    }
    const std::string floors_alone = "the floors alone fail them (" + rep.reason + ")";
    if (rows.empty()) {
      w.notes.push_back("gradients fail the floors but pass " + what + " with no WEAK row: "
                        "judged with it (the published δ holds on every row); " + floors_alone);
      return w;
    }
    std::snprintf(buf, sizeof buf, "%.4g", lmax);
    const std::string cause = "cause: P recomputed from the forward's fp32 lse errs by u(3|P_j| + 3|L|) in "
                              "p_j (first order), |L| up to " + std::string(buf) + " on those rows";
    w.notes.push_back("gradients fail the floors but every element lies within " + what +
                      "; that bound exceeds θ x row scale on " + rows + ": WEAK there (" + cause +
                      "; a wrong value within it could pass there; SPEC §9: " +
                      (opt.allow_weak ? "allowed (--allow-weak)" : "fails unless --allow-weak") +
                      "); the other rows are judged with the published δ; " + floors_alone);
    if (w.verdict == Verdict::Weak) w.reason += " [" + cause + "]";
    return w;
  };
  if (!delta_shared) {
    if (!delta_out) {
      judge_grads(r, *shared_ref(), *base_p, false);
      r = lse_recompute(std::move(r), r_pristine, *shared_ref(), *base_p, false, floors);
      return detail::settle_judged_nothing(std::move(r), opt, op);
    }
    // A 16-bit Δ the candidate's own out does not share: the baseline's error holds the shift
    // its 16-bit Δ makes, sm·δΔ·Σ_j p_j kv_jc in dq_c (δΔ·p_j·q_c summed in dkv), a rounding
    // every such kernel inherits that reaches a huge column in full. Split it off exactly
    // (OutputFloor::inherited16, judge_tensor): per element, |R(Δ16) - R(Δ)| (R the float64
    // reference, Δ16 from the baseline's out rounded to out_dtype) and the baseline's
    // arithmetic error |B(Δ16) - R(Δ16)|; the distance between the candidate's 16-bit Δ and
    // Δ16 stays in the floor (δΔ16). With E_row alone, one huge kv column let a dq row's
    // other columns 5 % off AGREE (LocalRuleHugeColumn.Bf16BackwardWithoutOwnOut).
    const auto ref16_p = shared_result<SparseMlaGrads>(
        memo_of(c), std::string("sparse_mla_bwd/reference/delta from out ") + dtype_name(out_dtype), fp,
        [&] { return reference::sparse_mla_backward(c.mla, c.dout, Precision::Reference, delta_out); });
    const auto ref_p = shared_ref();
    const SparseMlaGrads& ref = *ref_p;
    CaseFloors split = floors;
    auto add_split = [&](const char* name, const Tensor& r0, const Tensor& r16, const Tensor& b16) {
      auto it = split.find(name);
      if (it == split.end() || !r0.defined() || !r16.defined() || !b16.defined() || r0.numel() != r16.numel() ||
          r0.numel() != b16.numel())
        return;
      OutputFloor& f = it->second;
      f.inherited16.clear();
      f.inherited16_arith.clear();
      add_inherited16(f.inherited16, f.inherited16_arith, r0, r16, b16);
      f.inherited16_source = std::string("the exact shift of the float64 reference when Δ is taken from the "
                                         "baseline's out rounded to ") +
                             dtype_name(out_dtype) + " (the candidate's own out not handed over)";
    };
    add_split("dq", ref.dq, ref16_p->dq, base_p->dq);
    add_split("dkv", ref.dkv, ref16_p->dkv, base_p->dkv);
    if (ref.dsink && ref16_p->dsink && base_p->dsink) add_split("dsink", *ref.dsink, *ref16_p->dsink, *base_p->dsink);
    judge_grads_with(r, ref, *base_p, false, split);
    r = lse_recompute(std::move(r), r_pristine, ref, *base_p, false, split);
    return detail::settle_judged_nothing(std::move(r), opt, op);
  }
  // Δ from the candidate's own 16-bit out. Its gradients are judged against the float64
  // reference taking Δ from that same out (SPEC §5: the out as the forward returned it is an
  // input of the backward; §9: the reference computes from the exact values of the inputs).
  // Judged against the reference with Δ from the exact out instead, E_row(baseline) would
  // carry the whole Δ shift that out makes, and an out that passes the forward rule but is
  // rounded with a bias (toward sign(dout)) moves Δ coherently: the bound widens many times
  // and accepts a dsink far off (fresh-user case, 15-22 %).
  const auto ref_own_p = shared_result<SparseMlaGrads>(
      delta_from_candidate ? nullptr : memo_of(c),
      std::string("sparse_mla_bwd/reference/delta from out ") + dtype_name(out_dtype), fp,
      [&] { return reference::sparse_mla_backward(c.mla, c.dout, Precision::Reference, delta_out); });
  OpReport own_pre = r;
  own_pre.notes.push_back(own_note);
  OpReport own = own_pre;
  judge_grads(own, *ref_own_p, *base_p, true);
  if (own.passed()) {
    own.notes.push_back("gradients judged against the float64 reference whose Δ comes from "
                        "the same out (SPEC §5)");
    return detail::settle_judged_nothing(std::move(own), opt, op);
  }
  // A kernel may also take Δ from a precise out (fp32 or wider) and return a rounded copy:
  // then its gradients are judged against the exact reference, with the baseline taking Δ
  // from its own fp32 out, and the floors without δΔ16 (no 16-bit Δ on either side). The
  // bounds stay as tight as with Δ from the candidate's out: a kernel that took Δ from its
  // 16-bit out and has a wrong gradient must not find a looser bound here. Gradients that
  // fit neither legal Δ source fail (the report with Δ from the candidate's out, the
  // contract's reading).
  const auto base_precise_p = shared_result<SparseMlaGrads>(
      memo_of(c), "sparse_mla_bwd/baseline", fp,
      [&] { return reference::sparse_mla_backward(c.mla, c.dout, Precision::Baseline); });
  OpReport precise = r;
  judge_grads(precise, *shared_ref(), *base_precise_p, true);
  // The less severe of the two (a WEAK row is a limit of the case, not a wrong gradient):
  // gradients that fit the precise source with a WEAK row there are WEAK, not FAIL.
  auto severity = [](Verdict v) {
    return v == Verdict::Fail ? 3 : v == Verdict::Incomplete ? 2 : v == Verdict::Weak ? 1 : 0;
  };
  own = lse_recompute(std::move(own), own_pre, *ref_own_p, *base_p, true, floors);
  precise = lse_recompute(std::move(precise), r_pristine, *shared_ref(), *base_precise_p, true, floors);
  if (own.verdict == Verdict::Pass) return detail::settle_judged_nothing(std::move(own), opt, op);
  if (severity(precise.verdict) < severity(own.verdict)) {
    precise.notes.push_back(
        std::string("gradients ") + (own.verdict == Verdict::Fail ? "disagree" : "are WEAK") +
        " with Δ from the candidate's own out but agree with Δ from a precise out (fp32 or "
        "wider): judged against the exact reference, baseline Δ from its fp32 out (SPEC §5)");
    return detail::settle_judged_nothing(std::move(precise), opt, op);
  }
  // Both readings fail: the verdict is FAIL either way; the report headlines the reading under
  // which fewer outputs fail, so that it names the outputs that are wrong under every reading
  // (fresh18 F3: a dkv missing one row's terms, dq and dsink exact, was headlined by dq and
  // dsink, which fail only with Δ from the 16-bit out on rows of logits in the thousands).
  // Equal counts (e.g. dsink alone under both): the reading with fewer failing elements
  // (fresh19: a dsink wrong on one head was headlined by the reading that also failed the
  // heads whose only error was the 16-bit Δ).
  const std::vector<std::string> own_failing = own.failed_outputs(), precise_failing = precise.failed_outputs();
  auto failing_elements = [](const OpReport& x) {
    int64_t n = 0;
    for (const auto& t : x.tensors) n += t.passed ? 0 : std::max<int64_t>(1, t.failed_elements);
    return n;
  };
  const int64_t own_elements = failing_elements(own), precise_elements = failing_elements(precise);
  if (own.verdict == Verdict::Fail && precise.verdict == Verdict::Fail && !precise_failing.empty() &&
      (precise_failing.size() < own_failing.size() ||
       (precise_failing.size() == own_failing.size() && precise_elements < own_elements))) {
    const bool fewer_outputs = precise_failing.size() < own_failing.size();
    precise.notes.push_back("the gradients fit neither Δ source: reported with Δ from a precise out (fp32 or "
                            "wider), under which fewer " + std::string(fewer_outputs ? "outputs" : "elements") +
                            " fail (" + joined(precise_failing) + ", " + std::to_string(precise_elements) +
                            " element(s)); with Δ from the candidate's own out (SPEC §5) " + joined(own_failing) +
                            " fail, " + std::to_string(own_elements) + " element(s) (" + own.reason + ")");
    return detail::settle_judged_nothing(std::move(precise), opt, op);
  }
  if (own.verdict == Verdict::Fail)
    own.notes.push_back("the gradients fit neither Δ source: Δ from the candidate's own out "
                        "(reported) nor Δ from a precise out (" +
                        std::string(to_string(precise.verdict)) + ": " + precise.reason + ")");
  return detail::settle_judged_nothing(std::move(own), opt, op);
}

OpReport check_indexer_kl_loss(Backend& b, const OpCase& c, const CheckOptions& opt) {
  const Op op = Op::IndexerKlLoss;
  OpReport r = detail::start_report(b, to_string(op), op);
  IndexerKlResult cand;
  auto eq = [](const IndexerKlResult& x, const IndexerKlResult& y) {
    return bitwise_equal(x.loss, y.loss) && bitwise_equal(x.d_scores, y.d_scores);
  };
  const Fingerprint fp = fp_kl(c.kl);
  auto shared_ref = [&] {
    return shared_result<IndexerKlResult>(memo_of(c), "indexer_kl_loss/reference", fp,
                                          [&] { return reference::indexer_kl_loss(c.kl); });
  };
  if (!run_candidate(r, b, opt, shared_ref, [&] { return b.indexer_kl_loss(c.kl); }, eq, cand))
    return r;
  const auto ref_p = shared_ref();
  const auto base_p = shared_result<IndexerKlResult>(memo_of(c), "indexer_kl_loss/baseline", fp, [&] {
    return reference::indexer_kl_loss(c.kl, Precision::Baseline);
  });
  const auto floors_p = shared_result<CaseFloors>(memo_of(c), "indexer_kl_loss/floors", fp,
                                                  [&] { return kl_floors(c.kl); });
  const IndexerKlResult& ref = *ref_p;
  const IndexerKlResult& base = *base_p;
  const CaseFloors& floors = *floors_p;
  judge(r, opt, op, c.kl.q.dtype(), "loss", cand.loss, ref.loss, base.loss, floors);
  judge(r, opt, op, c.kl.q.dtype(), "d_scores", cand.d_scores, ref.d_scores, base.d_scores, floors);
  return detail::settle_judged_nothing(std::move(r), opt, op);
}

OpReport check_fused_indexer_topk(Backend& b, const OpCase& c, const CheckOptions& opt) {
  OpReport r = detail::start_report(b, "indexer_scores+topk", Op::IndexerScores);
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
  const auto ref_p = shared_indexer_scores(c, Precision::Reference);
  const auto base_p = shared_indexer_scores(c, Precision::Baseline);
  const auto floors_p = shared_indexer_scores_floors(c);
  const Tensor& ref = *ref_p;
  const size_t before = r.tensors.size();
  judge(r, opt, Op::IndexerScores, c.q_idx.dtype(), "scores", scores, ref, *base_p, *floors_p);
  if (r.tensors.size() == before) return r;  // not judged (missing or not provided)
  const TensorCheck& sc = r.tensors.back();
  // Per query row (SPEC §9 local bounds): both swapped entries may each err by the row's
  // largest score bound, so the band around that row's v* is 2x it. No other row enters.
  std::vector<double> bands(static_cast<size_t>(ref.size(0)), 0.0);
  if (sc.metrics.shape_ok && sc.row_max_bound.size() == bands.size())
    for (size_t t = 0; t < bands.size(); ++t)
      bands[t] = std::isfinite(sc.row_max_bound[t]) ? 2.0 * sc.row_max_bound[t] : 0.0;
  const double widest = bands.empty() ? 0.0 : *std::max_element(bands.begin(), bands.end());
  r.notes.push_back("fused top-k score band per row: 2x the row's largest score bound (widest " +
                    std::to_string(widest) + ")");
  if (detail::contract_dtype_violated(r, Op::Topk, "indices", "", ids, c.q_idx.dtype())) {
    r.topk_violations.push_back(
        {"dtype", -1, -1, detail::contract_dtype_message("indices", "", ids.dtype(), DType::I32)});
    return detail::settle_judged_nothing(std::move(r), opt, Op::Topk, ids.numel());
  }
  r.topk_violations = check_fused_topk(ids, ref, bands, c.k, c.windows);
  if (!r.topk_violations.empty())
    r.fail(r.topk_violations.front().rule + " row=" + std::to_string(r.topk_violations.front().row) +
           ": " + r.topk_violations.front().detail);
  return detail::settle_judged_nothing(std::move(r), opt, Op::Topk, ids.numel());
}

namespace {
thread_local const CheckOptions* current_defaults = nullptr;
}  // namespace

const CheckOptions& default_check_options() {
  static const CheckOptions plain;
  return current_defaults ? *current_defaults : plain;
}

SlotFeatures sparse_mla_slot_features(const SparseMlaInputs& in) {
  const int64_t s_q = in.indices.size(0), k = in.indices.size(-1), s_kv = in.kv.size(0);
  SlotFeatures f;
  std::vector<int64_t> seen;
  for (int64_t t = 0; t < s_q; ++t) {
    seen.clear();
    const int64_t len = in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
      if (j >= len || id < 0 || id >= s_kv) f.invalid = true;
      else seen.push_back(id);
    }
    f.empty = f.empty || seen.empty();
    std::sort(seen.begin(), seen.end());
    f.duplicates = f.duplicates || std::adjacent_find(seen.begin(), seen.end()) != seen.end();
  }
  return f;
}

bool unsupported_covers(const std::vector<std::string>& names, const std::string& key, bool invalid_present) {
  auto named = [&](const char* k) { return std::find(names.begin(), names.end(), k) != names.end(); };
  if (std::find(names.begin(), names.end(), key) != names.end()) return true;
  if (key == "short_context" && named("empty_windows")) return true;
  return key == "empty_rows" && invalid_present && named("invalid_ids");
}

ScopedCheckDefaults::ScopedCheckDefaults(CheckOptions opt) : previous_(current_defaults), opt_(std::move(opt)) {
  current_defaults = &opt_;
}

ScopedCheckDefaults::~ScopedCheckDefaults() { current_defaults = previous_; }

OpReport judge_outputs(Op op, const OpCase& c, const NamedOutputs& outputs,
                       const CheckOptions& opt, const std::string& label) {
  OutputsBackend b(outputs, label);
  CheckOptions o = opt;
  o.check_determinism = false;
  // An "out" entry is served as the candidate's forward (OutputsBackend): the backward check
  // takes it as the candidate's own out, as it takes a candidate file's.
  if (op == Op::SparseMlaBwd && !c.fwd_out && !outputs.count("out")) {
    // The outputs hold no forward: the baseline's Δ follows q's dtype (SPEC §4).
    struct NoForward : OutputsBackend {
      using OutputsBackend::OutputsBackend;
      bool supports(Op x) const override { return x != Op::SparseMlaFwd; }
    } nb(outputs, label);
    return check_op(nb, op, c, o);
  }
  return check_op(b, op, c, o);
}

std::optional<std::set<std::string>> provided_outputs_for(Op op,
                                                          const std::optional<std::set<std::string>>& provided) {
  if (!provided) return std::nullopt;
  for (const auto& n : op_output_names(op))
    if (provided->count(n)) return provided;
  return std::nullopt;
}

std::string judged_in_full_note(Op op, const std::optional<std::set<std::string>>& provided) {
  if (!provided || provided_outputs_for(op, provided)) return "";
  return std::string("judged in full: the provided outputs (") +
         joined(std::vector<std::string>(provided->begin(), provided->end())) + ") name none of " +
         to_string(op) + "'s outputs (" + joined(op_output_names(op)) + ")";
}

std::vector<std::string> not_judged_outputs(Op op, const std::optional<std::set<std::string>>& provided) {
  std::vector<std::string> out;
  const auto applied = provided_outputs_for(op, provided);
  if (!applied) return out;
  for (const auto& n : op_output_names(op))
    if (!applied->count(n)) out.push_back(n);
  return out;
}

void check_provided_outputs(const std::vector<std::string>& names, const std::vector<Op>& ops,
                            const std::string& flag) {
  std::vector<std::string> bad;
  for (const auto& n : names) {
    bool ours = false;
    for (Op op : ops)
      for (const auto& o : op_output_names(op)) ours |= o == n;
    if (!ours && std::find(bad.begin(), bad.end(), n) == bad.end()) bad.push_back(n);
  }
  if (bad.empty()) return;
  std::string per_op;
  for (Op op : ops)
    per_op += std::string(per_op.empty() ? "" : "; ") + to_string(op) + " (" + joined(op_output_names(op)) + ")";
  throw std::invalid_argument("argument '" + flag + "' names " + joined(bad) +
                              (bad.size() == 1 ? ", which is not an output" : ", which are not outputs") +
                              " of the selected op" + (ops.size() == 1 ? "" : "s") + ": " + per_op +
                              "; name only outputs of these ops (an op none of whose outputs is named "
                              "is judged in full)");
}

OpReport check_op(Backend& backend, Op op, const OpCase& c, const CheckOptions& opt_in) {
  // --outputs naming none of this op's outputs: the op is judged in full (provided_outputs_for).
  const std::string full = judged_in_full_note(op, opt_in.provided_outputs);
  if (!full.empty()) {
    CheckOptions all = opt_in;
    all.provided_outputs.reset();
    OpReport r = check_op(backend, op, c, all);
    r.notes.push_back(full);
    return r;
  }
  const CheckOptions& opt = opt_in;
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
