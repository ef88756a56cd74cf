// Op checkers: run one op on a backend, run the float64 reference and its baseline, judge
// every output (SPEC §9), check determinism (§3.5) — the testbed behind every property,
// `dsa-verify check` and `make audit`.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dsa/contract/op_types.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/case_memo.h"
#include "dsa/oracle/report.h"
#include "dsa/oracle/topk_check.h"

namespace dsa::oracle {

/// Inputs of any op; fill the members the op needs (SPEC §2-§7, contract/op_types.h).
struct OpCase {
  // Indexer (§2): q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I], w [s_q,H_I], windows; d_scores
  // [s_q,s_kv] for the backward.
  Tensor q_idx, k_idx, w, d_scores;
  KeyWindows windows;
  // Top-k (§3): scores [s_q,s_kv] F32/F64, k, policy, optional windows.
  Tensor scores;
  int64_t k = 0;
  TopkPolicy policy;
  std::optional<KeyWindows> topk_windows;
  // Sparse MLA (§4-§5): inputs and dout [s_q,h_q,d_v].
  SparseMlaInputs mla;
  Tensor dout;
  /// The forward `out` [s_q,h_q,d_v] the candidate's backward took Δ from, when a caller
  /// hands it over explicitly (e.g. an out kept from another call). Absent, the backward
  /// check takes the candidate's own out from the candidate itself: its forward run on this
  /// case (a candidate file's or fixture's stored `out` on compare, replay, fixtures check and
  /// the Python compare; a built-in, plugin or Python backend's forward on audit and replay;
  /// judge_outputs' "out" entry); none when it has no forward (then q's dtype, SPEC §4).
  /// A 16-bit own out that passes the forward's local rule is the out the backward baseline
  /// and reference take Δ from (SPEC §5/§9: a kernel may take Δ from its own bf16 out; see
  /// check_sparse_mla_backward for the second legal source, a precise out); one that fails it,
  /// or is narrower than q's dtype, does not move the baseline (its own out rounded to the
  /// candidate's out dtype). An fp32 or wider out: Δ from the baseline's own out (at that
  /// precision already).
  std::optional<Tensor> fwd_out;
  // KL loss (§7).
  IndexerKlInputs kl;
  // FP8 / paged inference ops (§10); checked in fp8_check.h.
  Fp8IndexerInputs fp8_indexer;
  PagedIndexerInputs paged_indexer;
  SparseMlaFp8Inputs mla_fp8;
  /// Results computed once per case (issue 13): the float64 reference, the baseline at each
  /// precision and the floor inputs, shared by every backend and output judged on this case
  /// and by its copies (op_case_from_fixture gives each case one). Keys carry a fingerprint
  /// of the inputs they depend on, so a copy whose inputs were changed computes afresh.
  /// Null: the thread's scoped memo when one is alive (ScopedCaseMemo, scoped_case_memo.h: the
  /// property runner's, per draw), else every check computes its own.
  std::shared_ptr<CaseMemo> memo;
};

/// Options of every check.
struct CheckOptions {
  bool check_determinism = true;  ///< run twice and compare bytes when backend.deterministic()
  /// SPEC §9 "A pass must be able to fail": rows whose bound exceeds the detection threshold
  /// make the verdict Weak (a failure) unless this is set; then they are only noted.
  bool allow_weak = false;
  /// SPEC §9 "Complete outputs": absent = every output the op defines is required and a
  /// missing one (an undefined Tensor, or no dsink although attn_sink was given) makes the
  /// verdict Incomplete. Present = the outputs the kernel provides (e.g. {"out", "lse"}):
  /// the op's other outputs are listed in OpReport::not_judged, and a named output that is
  /// missing is still Incomplete. An op none of whose outputs it names is judged in full,
  /// with a note (provided_outputs_for).
  std::optional<std::set<std::string>> provided_outputs;
  /// SPEC-mandatory features the user names as left out by the kernel (`audit --unsupported`,
  /// Python unsupported=[...]; keys as the property suite's: invalid_ids, empty_rows,
  /// duplicate_ids, neg_inf_scores, nan_scores, k_boundary_ties). A fixture case the backend
  /// declines whose mandatory features are all named is a skip saying so, not INCOMPLETE
  /// (judge_fixture_ops). Other entries (property names) do not apply to fixtures.
  std::vector<std::string> unsupported;
  /// How a 16-bit sparse MLA kernel rounds where SPEC §4 leaves it free (RoundingModel):
  /// sink_after_rounding (--sink-after-rounding: out rounded before attn_sink is applied,
  /// out = fl16(fl32(fl16(o)·r))) and normalized_p (--normalized-p: softmax(P) rounded to 16
  /// bits before P·V, the max key too). Declared by the user, never inferred from the outputs:
  /// out's bound then adds that rounding and its WEAK rows follow that bound (judge_tensor).
  /// judge_fixture_ops and the audit's property tasks add what the backend declares
  /// (Backend::rounding_model, a plugin's rounding_models): either declares.
  /// Undeclared, such a kernel fails by up to about one 16-bit ulp, and the report names the flag.
  RoundingModel rounding;
};

/// The SPEC §4/§6 slot features of a sparse MLA case: some slot is invalid (id < 0 or >= s_kv,
/// or past topk_length[t]), some row has no valid slot (empty, §6), some row repeats a valid
/// id (duplicates, §4). `in.indices` [s_q, k] or [s_q, 1, k] I32; throws nothing for a
/// well-formed case (shapes are the caller's: check_sparse_mla_args). Used by the fixture
/// declines (judge_fixture_ops) and the property suite's feature notes alike.
struct SlotFeatures {
  bool invalid = false, empty = false, duplicates = false;
};
SlotFeatures sparse_mla_slot_features(const SparseMlaInputs& in);

/// True when the --unsupported names `names` cover the SPEC-mandatory feature `key` of a case
/// (or a property's draws) whose slots include invalid ones (`invalid_present`): `key` itself,
/// "empty_rows" when "invalid_ids" is named and invalid slots are present (a row of k >= 1 slots
/// is empty only through invalid slots, §4/§6: fresh11 F3b), or "short_context" when
/// "empty_windows" is named (a paged context shorter than next_n is how a paged indexer's window
/// is empty, §1/§10). Used by the fixture declines and the property suite alike; throws
/// nothing.
bool unsupported_covers(const std::vector<std::string>& names, const std::string& key, bool invalid_present);

/// The one rule of --outputs (every route: compare, replay, audit, fixtures check, Python):
/// the provided outputs that apply to `op`: `provided` when it names at least one of op's
/// outputs (op_output_names), else nullopt: an op none of whose outputs is named is judged
/// in full (e.g. --outputs dq,dkv beside a fwd+bwd golden judges the forward in full), never
/// reported as partial nor skipped. Throws nothing.
std::optional<std::set<std::string>> provided_outputs_for(Op op, const std::optional<std::set<std::string>>& provided);

/// The note of an op judged in full under provided_outputs_for ("judged in full: the provided
/// outputs (dq, dkv) name none of sparse_mla_fwd's outputs (out, lse, max_logits)"), or ""
/// when `provided` is unset or names one of op's outputs. Throws nothing.
std::string judged_in_full_note(Op op, const std::optional<std::set<std::string>>& provided);

/// Outputs of `op` not judged under `provided` (provided_outputs_for): those it leaves out,
/// in op_output_names order; empty when unset or when it names none of op's outputs. A label
/// "partial: X not judged" is built from this and nothing else. Throws nothing.
std::vector<std::string> not_judged_outputs(Op op, const std::optional<std::set<std::string>>& provided);

/// Checks a user's output list (`flag`, e.g. "--outputs") against the ops a route judges
/// (`ops`: the golden's ops, the audit's --ops): throws std::invalid_argument naming `flag`,
/// each name that is not an output of any of `ops`, and the outputs of each op ("argument
/// '--outputs' names out, which is not an output of the selected op: topk (indices)").
void check_provided_outputs(const std::vector<std::string>& names, const std::vector<Op>& ops,
                            const std::string& flag);

/// The options of a check called without options: CheckOptions{} unless a
/// ScopedCheckDefaults is alive on this thread. The property runner sets the audit's
/// --outputs / --allow-weak this way, so properties judge like the audit's other cases.
const CheckOptions& default_check_options();
/// Sets default_check_options() for this thread while alive (nestable).
class ScopedCheckDefaults {
 public:
  explicit ScopedCheckDefaults(CheckOptions opt);
  ~ScopedCheckDefaults();
  ScopedCheckDefaults(const ScopedCheckDefaults&) = delete;
  ScopedCheckDefaults& operator=(const ScopedCheckDefaults&) = delete;

 private:
  const CheckOptions* previous_;
  CheckOptions opt_;
};

/// Runs `op` of `backend` on `c` and judges it by the local rule (SPEC §9). Verdict Skip when
/// the backend is unavailable (unavailable_reason), does not support the op, or throws
/// NotSupported; Fail when it throws anything else (reason = the message), when an element
/// exceeds its bound or NaN/±inf positions differ, when top-k violates §3, or when a
/// deterministic backend differs between two runs; Incomplete when a required output is
/// missing; Weak when rows are weak and opt.allow_weak is off. Invalid inputs make the
/// reference throw std::invalid_argument (propagated). The reference, the baseline and the
/// floors are computed once per call and shared by the op's outputs, and once per case when
/// c.memo is set (shared by every backend judged on c).
OpReport check_op(Backend& backend, Op op, const OpCase& c, const CheckOptions& opt = default_check_options());

/// Same as check_op for each op (one function per op, SPEC section in brackets).
OpReport check_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §2
OpReport check_indexer_backward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §2
OpReport check_topk_op(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §3 exact
OpReport check_sparse_mla_forward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §4,§6
/// Sparse MLA backward (§5): when Δ comes from the candidate's own 16-bit out (OpCase::fwd_out),
/// the gradients are judged against the float64 reference taking Δ from that same out, else
/// (if that fails) against the exact reference with the baseline's Δ from its fp32 out; they
/// must fit one of the two (docs/what-a-pass-means.md, "Which Δ the gradients are judged with").
OpReport check_sparse_mla_backward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §5
OpReport check_indexer_kl_loss(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §7

/// Fused indexer + top-k (SPEC §9): the backend's own indexer scores fed to its own top-k,
/// judged by check_fused_topk with one band per query row = 2x that row's largest local
/// score bound (both entries of a swapped pair may err by the bound; no other row enters).
OpReport check_fused_indexer_topk(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());

/// Outputs of one op by name ("out", "lse", "dq", "scores", "indices", ...), as a kernel or a
/// file returned them; an absent name is an output not returned.
using NamedOutputs = std::map<std::string, Tensor>;

/// Judges given outputs of `op` on `c` exactly as check_op judges a backend's (same rule,
/// same report; no determinism run). For SparseMlaBwd an "out" entry is the candidate's own
/// forward out, which the backward baseline takes Δ from as OpCase::fwd_out describes (unless
/// c.fwd_out is set). `label` names the source in the report's backend field. Same errors as
/// check_op.
OpReport judge_outputs(Op op, const OpCase& c, const NamedOutputs& outputs,
                       const CheckOptions& opt = default_check_options(),
                       const std::string& label = "outputs");

/// SPEC §7: the loss is one number, and a candidate may return it as [1] (the reference's
/// shape) or [] (a 0-dim tensor, torch's usual loss): the same representation. True for those
/// two shapes only; every route judges `loss` by this rule (a [1, 1] loss fails, naming both
/// shapes). Source: docs/fixtures.md (tensor names per op). Throws nothing.
bool scalar_loss_shape(const std::vector<int64_t>& shape);

/// True when two tensors have equal dtype, shape and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);

/// Where two runs' tensors `first` and `second` of output `name` differ (SPEC §3.5 determinism),
/// for a report: "" when bitwise equal; else the dtype or shape change, or the rows that differ
/// (first 8, "rows 0, 3 of 6"; row = first index, the query row of [s_q, ...] outputs) and,
/// in the first such row, the first differing slots with both values (ids for integer
/// outputs, e.g. "row 0 slot 3: id 17 then 12"; 9 significant digits for floats).
std::string run_difference(const std::string& name, const Tensor& first, const Tensor& second);
/// The same over every output of an op's result (the outputs that differ, "; "-separated).
std::string run_difference(const Tensor& first, const Tensor& second);
std::string run_difference(const SparseMlaForward& first, const SparseMlaForward& second);
std::string run_difference(const SparseMlaGrads& first, const SparseMlaGrads& second);
std::string run_difference(const IndexerGrads& first, const IndexerGrads& second);
std::string run_difference(const IndexerKlResult& first, const IndexerKlResult& second);

}  // namespace dsa::oracle
