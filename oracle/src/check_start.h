// Internal to the oracle (not installed): the opening, the backend run and the judging of
// every op check, shared by op_check.cpp (SPEC §2-§7) and fp8_check.cpp (§10), so that every
// op is judged by the same code (SPEC §9: local bounds, WEAK, complete outputs).
#pragma once

#include <algorithm>
#include <exception>
#include <optional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "dsa/contract/dtype.h"
#include "dsa/contract/errors.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/second_run.h"
#include "dsa/oracle/local_bounds.h"
#include "dsa/oracle/op_check.h"
#include "dsa/oracle/report.h"

namespace dsa::oracle::detail {

/// A report for `op_name` on `b`: Skip with the reason when the backend is unavailable here
/// or does not support `op`, else Pass (to be judged).
inline OpReport start_report(Backend& b, const std::string& op_name, Op op) {
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

/// Runs `call` (twice when `twice` and the backend is deterministic; `eq` compares the two
/// results bitwise, SPEC §3.5). False when the report is final: Skip (NotSupported) or Fail
/// (any other exception; the reason is "backend threw<what>: <message>"). std::bad_alloc
/// propagates (out of memory is not a verdict; judge_fixture_ops names it, ResourceError).
template <class R, class Call, class Eq>
bool run_backend(OpReport& r, Backend& b, bool twice, const std::string& what, Call call, Eq eq,
                 R& out) {
  if (r.verdict == Verdict::Skip) return false;
  try {
    out = call();
    if (twice && b.deterministic()) {
      // The first run's outputs are judged whatever the second does: a backend that declines
      // or throws on the identical second call (after returning outputs) fails here and the
      // first outputs are still judged (fresh11 F10: a kernel x1.5 wrong on the first call
      // that declined the re-run was never judged, exit 0).
      R again;
      // The re-run is marked (SecondRunScope): the plugin route makes it the second call in one
      // child process, after a call on other values of the same shapes (plugin_backend.cpp).
      SecondRunScope second_run;
      try {
        again = call();
      } catch (const NotSupported& e) {
        r.determinism_checked = true;
        r.fail(std::string("deterministic backend declined the second run of the same call after returning "
                           "outputs on the first (SPEC §3.5: a decline depends on the call, never on the run): ") +
               e.what());
        return true;
      } catch (const std::bad_alloc&) {
        throw;
      } catch (const std::exception& e) {
        r.determinism_checked = true;
        r.fail(std::string("deterministic backend threw on the second run of the same call after returning "
                           "outputs on the first: ") + e.what());
        return true;
      }
      r.determinism_checked = true;
      r.determinism_ok = eq(out, again);
      if (!r.determinism_ok) {
        // Which rows / ids differed between the two runs (every route: one judgement).
        const std::string where = run_difference(out, again);
        r.fail("deterministic backend returned different bytes on a second run" +
               (where.empty() ? std::string() : ": " + where) +
               (second_run.how().empty() ? std::string() : " (" + second_run.how() + ")"));
      }
    }
  } catch (const NotSupported& e) {
    r.verdict = Verdict::Skip;
    r.reason = e.what();
    r.declined = true;  // supports(op) was true (start_report): a decline of this case
    return false;
  } catch (const std::bad_alloc&) {
    // Out of memory is no verdict on the candidate: judge_fixture_ops reports it as a
    // ResourceError naming the op and the shapes (fixture_check.h), never a DISAGREE.
    throw;
  } catch (const std::exception& e) {
    r.fail("backend threw" + what + ": " + e.what());
    return false;
  }
  return true;
}

/// Same, twice when opt.check_determinism.
template <class R, class Call, class Eq>
bool run_backend(OpReport& r, Backend& b, const CheckOptions& opt, Call call, Eq eq, R& out) {
  return run_backend(r, b, opt.check_determinism, "", std::move(call), std::move(eq), out);
}

/// Precision rank of a float dtype (F16/BF16 1, F32 2, F64 3; 0 for the others), to tell an
/// output narrower than the dtype the SPEC fixes for it.
inline int precision_rank(DType d) {
  return d == DType::F64 ? 3 : d == DType::F32 ? 2 : (d == DType::F16 || d == DType::BF16) ? 1 : 0;
}

/// True when a candidate output of dtype `d` may stand for the dtype `fixed` the SPEC fixes for
/// it: `fixed` itself or a wider float (F32/F64 for a 16-bit `fixed`, F64 for F32). Another
/// format of the same width is not: an F16 out for a bf16 q is neither q's dtype (SPEC §4:
/// "out [s_q, h_q, d_v] (q's dtype)") nor wider (F16's range ends at 65504, bf16's at 3.4e38).
/// An integer `fixed` (top-k's I32 ids) is met by itself only (I64 ids are a convention,
/// converted before judging, SPEC §9).
inline bool dtype_meets_contract(DType d, DType fixed) {
  return d == fixed || (is_floating(fixed) && precision_rank(d) > precision_rank(fixed));
}

/// The dtype the SPEC fixes for output `name` of `op`, or nullopt where it fixes none. `q`:
/// the dtype of the op's q (sparse MLA's out is in q's dtype; ignored by the other ops). The
/// one table every check applies (contract_dtype_violated, below):
///   indexer_scores, fp8_indexer_scores, paged_indexer_scores: scores F32 (§2, §10);
///   topk: indices I32 (§3; int64 ids only through the int64_ids convention, §9);
///   sparse_mla_fwd and sparse_mla_fp8_fwd: out in q's dtype, lse and max_logits F32 (§4; §10
///     runs §4 over the dequantized cache with q as given, bf16 in FlashMLA's decode).
/// The SPEC fixes no dtype for indexer_scores_backward (dq_idx, dk_idx, dw), sparse_mla_bwd
/// (dq, dkv, dsink: §5 fixes fp32 accumulation, not the output dtype) or indexer_kl_loss
/// (loss, d_scores): those are judged at the class of the dtype they come in. Throws nothing.
inline std::optional<DType> contract_dtype(Op op, const std::string& name, DType q) {
  switch (op) {
    case Op::IndexerScores:
    case Op::Fp8IndexerScores:
    case Op::PagedIndexerScores:
      if (name == "scores") return DType::F32;
      break;
    case Op::Topk:
      if (name == "indices") return DType::I32;
      break;
    case Op::SparseMlaFwd:
    case Op::SparseMlaFp8Fwd:
      if (name == "out") return q;
      if (name == "lse" || name == "max_logits") return DType::F32;
      break;
    default:
      break;
  }
  return std::nullopt;
}

/// The one message for an output `name` (+ `label`, e.g. "[NaN blocks]") of dtype `given`
/// where the SPEC fixes `fixed` (every op, every route: compare, replay, fixtures check, a
/// backend's audit): names the output, the dtype given, the dtypes accepted and the contract.
inline std::string contract_dtype_message(const std::string& name, const std::string& label,
                                          DType given, DType fixed) {
  std::string wider;
  if (is_floating(fixed))
    for (DType w : {DType::F32, DType::F64})
      if (precision_rank(w) > precision_rank(fixed)) wider += std::string(wider.empty() ? "" : ", ") + dtype_name(w);
  return name + label + ": dtype " + dtype_name(given) + ", expected " + dtype_name(fixed) +
         (wider.empty() ? "" : " or wider (" + wider + ")") +
         " (contract: the SPEC fixes this output's dtype; §2/§10 scores fp32, §3 indices int32, "
         "§4/§10 lse and max_logits fp32, out in q's dtype)";
}

/// Fails `r` when the candidate's output `name` does not have the dtype the SPEC fixes for it
/// (`fixed`) or a wider float one. A narrower output would otherwise be judged at its own,
/// looser precision class (θ 1e-2 for bf16 instead of 1e-4), another 16-bit format (F16 out
/// for a bf16 q) at another format's class: a false AGREES. Wider (e.g. a float64 reference
/// run) is judged by its own, stricter class. Returns true when it failed.
inline bool narrower_than_contract(OpReport& r, const std::string& name, const std::string& label,
                                   const Tensor& cand, DType fixed) {
  if (!cand.defined() || dtype_meets_contract(cand.dtype(), fixed)) return false;
  r.fail(contract_dtype_message(name, label, cand.dtype(), fixed));
  return true;
}

/// The dtype rule of every check (contract_dtype's table): fails `r` when output `name` of
/// `op` has a dtype other than the SPEC's (or a wider float); `q`: the op's q dtype. Returns
/// true when it failed; false for an undefined output or one the SPEC fixes no dtype for.
inline bool contract_dtype_violated(OpReport& r, Op op, const std::string& name, const std::string& label,
                                    const Tensor& cand, DType q) {
  const std::optional<DType> fixed = contract_dtype(op, name, q);
  return fixed && narrower_than_contract(r, name, label, cand, *fixed);
}

/// The note a failing sparse MLA forward `out` (`label`: its run, e.g. "[NaN unread tokens]")
/// gets when it is wider than a 16-bit q (an fp32 accumulator returned as out): SPEC §9 runs
/// the baseline at the candidate's precision, read from out's dtype, so an fp32 out is judged
/// at the fp32 class; a kernel whose working precision is 16-bit (P rounded to bf16 before
/// P·V, FlashMLA's scheme) fails it by orders of magnitude although the same values rounded to
/// q's dtype (SPEC §4) agree (fresh-user finding F2). A hint only: it never changes the
/// verdict. Adds the note once, when r holds a failed check of "out" + label, `out` is wider
/// than `q` and `q` is BF16 or F16; otherwise does nothing. Throws nothing.
inline void wider_out_hint(OpReport& r, const std::string& label, const Tensor& out, DType q) {
  if (!out.defined() || (q != DType::BF16 && q != DType::F16) ||
      precision_rank(out.dtype()) <= precision_rank(q))
    return;
  const std::vector<std::string> failed = r.failed_outputs();
  if (std::find(failed.begin(), failed.end(), "out" + label) == failed.end()) return;
  const std::string od = dtype_name(out.dtype()), qd = dtype_name(q);
  const std::string note =
      "out is " + od + ", wider than q (" + qd + "), so it is judged at the " + od +
      " class: the class follows out's dtype (an " + od + " out claims " + od +
      " accuracy, SPEC §9). A kernel whose working precision is 16-bit (e.g. P rounded to " + qd +
      " before P·V, FlashMLA-style) should return out in q's dtype (" + qd +
      ", SPEC §4), its accumulator rounded once; the backward is judged at out's class too "
      "(docs/what-a-pass-means.md, 'The table'). A hint only: the verdict stands";
  for (const auto& n : r.notes)
    if (n == note) return;
  r.notes.push_back(note);
}

/// When opt.provided_outputs names none of the outputs of the op whose tolerance row is `row`
/// (e.g. `--outputs indices` for sparse MLA), that op has nothing to judge: returns the skip
/// reason (naming the op's outputs and the provided ones), else "". Without this the op would
/// pass with every output "not judged" (SPEC §9 complete outputs; a fresh-user false AGREES).
inline std::string nothing_provided(const CheckOptions& opt, const std::string& row) {
  if (!opt.provided_outputs) return "";
  const std::string key = row.substr(0, row.find(':'));
  for (Op op : all_ops()) {
    if (to_string(op) != key) continue;
    std::string ours, given;
    for (const auto& n : op_output_names(op)) {
      if (opt.provided_outputs->count(n)) return "";
      ours += (ours.empty() ? "" : ", ") + n;
    }
    for (const auto& n : *opt.provided_outputs) given += (given.empty() ? "" : ", ") + n;
    return key + ": none of its outputs (" + ours + ") is among the provided outputs (" + given +
           "): nothing of it is judged";
  }
  return "";
}

/// Judges one output by the local rule (SPEC §9) and folds it into the report: Fail when an
/// element is over its bound; Weak (or a note with opt.allow_weak) when rows are WEAK;
/// Incomplete when the candidate did not return it; not judged (listed once, for an empty
/// `label`) when opt.provided_outputs omits it. `row` is the tolerance table's op key,
/// `label` suffixes the name in the report (e.g. "[NaN blocks]" for a poisoned re-run).
/// `delta_shared`: judge_tensor's (the baseline took Δ from the candidate's own 16-bit out).
/// `op`: the op judged (its dtype rule, contract_dtype_violated: an output in another dtype
/// than the SPEC's fails there, naming the dtype and the contract, and is not judged);
/// `q`: that op's q dtype (the dtype of sparse MLA's out; ignored by the other ops).
inline void judge_output(OpReport& r, const CheckOptions& opt, Op op, DType q, const std::string& row,
                         const std::string& name, const std::string& label, const Tensor& cand,
                         const Tensor& ref, const Tensor& base, const OutputFloor& floor,
                         bool delta_shared = false) {
  if (opt.provided_outputs && !opt.provided_outputs->count(name)) {
    if (label.empty()) r.not_judged.push_back(name);
    const std::string none = nothing_provided(opt, row);
    if (!none.empty() && r.verdict == Verdict::Pass) {
      r.verdict = Verdict::Skip;  // not "pass": an op none of whose outputs is judged
      r.reason = none;
    }
    return;
  }
  if (!cand.defined()) {
    // Every missing output is named, not only the first (the reason lists them all).
    r.missing.push_back(name + label);
    std::string list;
    for (const auto& n : r.missing) list += (list.empty() ? "" : ", ") + n;
    const std::string why = list + ": not returned by the candidate (SPEC §9: every output is "
                                   "judged unless the provided outputs are named)";
    if (r.verdict == Verdict::Incomplete && r.missing.size() > 1) r.reason = why;
    else r.mark(Verdict::Incomplete, why);
    return;
  }
  if (contract_dtype_violated(r, op, name, label, cand, q)) return;
  // The loss is one number: [1] and [] are one representation on every route (SPEC §7,
  // scalar_loss_shape); another shape fails here, naming both.
  Tensor judged = cand;
  std::string shape_error;
  if (name == "loss") {
    if (scalar_loss_shape(cand.shape())) judged = cand.reshaped({1});
    else
      shape_error = "shape " + shape_str(cand.shape()) +
                    ", expected [1] or [] (SPEC §7: the loss is one number, a 0-dim tensor or one element)";
  }
  TensorCheck c = judge_tensor(row, name, judged, ref, base, floor, delta_shared, opt.rounding);
  if (!shape_error.empty() && !c.metrics.shape_ok) c.message = shape_error;
  c.name = name + label;
  if (!c.passed) r.fail(c.name + ": " + c.message);
  if (c.passed && c.weak_rows > 0) {
    const std::string why = c.name + ": " + std::to_string(c.weak_rows) + " of " +
                            std::to_string(c.rows) +
                            " rows WEAK (bound above theta x row scale: a wrong value there "
                            "could pass; SPEC §9)";
    if (opt.allow_weak) r.notes.push_back(why + "; allowed (--allow-weak)");
    else r.mark(Verdict::Weak, why);
  }
  r.tensors.push_back(std::move(c));
}

/// SPEC §9 "a pass must be able to fail": a check of op `op` that passed without judging one
/// element judged nothing, and is a Skip naming why, never a Pass: the provided outputs name
/// none that this case defines (e.g. --outputs dsink on a case without attn_sink), or every
/// output judged has 0 elements (an empty case, s_q = 0 or k = 0: no evidence). `elements`:
/// elements judged outside r.tensors (top-k's ids); -1 counts r.tensors only. Every check
/// returns through this (op_check.cpp, fp8_check.cpp). Throws nothing.
inline OpReport settle_judged_nothing(OpReport r, const CheckOptions& opt, Op op, int64_t elements = -1) {
  if (r.verdict != Verdict::Pass) return r;
  int64_t judged = elements < 0 ? 0 : elements;
  for (const auto& t : r.tensors) judged += t.metrics.numel;
  if (judged > 0) return r;
  std::string provided, defined;
  if (opt.provided_outputs)  // those of this op (a backend's declaration names every op's)
    for (const auto& n : op_output_names(op))
      if (opt.provided_outputs->count(n)) provided += (provided.empty() ? "" : ", ") + n;
  r.verdict = Verdict::Skip;
  r.nothing_judged = true;
  if (!r.not_judged.empty() && r.tensors.empty()) {
    for (const auto& n : r.not_judged) defined += (defined.empty() ? "" : ", ") + n;
    r.reason = std::string("judged nothing: ") + to_string(op) + ": the provided outputs (" + provided +
               ") are not defined for this case (not provided: " + defined + ")";
  } else {
    r.reason = std::string("judged nothing: ") + to_string(op) +
               ": every output judged has 0 elements (an empty case, s_q = 0 or k = 0, holds no evidence)";
  }
  return r;
}

}  // namespace dsa::oracle::detail
