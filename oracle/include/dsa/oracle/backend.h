// The Backend interface: anything the oracle can audit (reference, libtorch-cpu,
// libtorch-cuda, cuda, plugins, mutants) and the registry of named backends.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsa/contract/fp8_op_types.h"
#include "dsa/contract/op_types.h"

namespace dsa::oracle {

/// How a 16-bit sparse MLA kernel rounds, where SPEC §4 leaves it free and the oracle cannot
/// tell from the outputs: declared, never inferred (a model inferred from the outputs would let
/// a wrong value move its own bound), by the user (CheckOptions::rounding: --sink-after-rounding,
/// --normalized-p) or by the backend (Backend::rounding_model: a plugin's rounding_models, ABI
/// 1.2); judge_fixture_ops and the audit's property tasks judge with a model when either
/// declares it. Each adds its rounding to out's bound and, where the backward does not get
/// the kernel's own out, the shift it gives Δ to the gradients' δΔ16 (local_bounds.cpp); each
/// output it enters has the detection threshold theta_declared_rounding16(), 2e-2
/// (judge_tensor). The WEAK rows follow from the bounds alone.
struct RoundingModel {
  /// out rounded to 16 bits before attn_sink is applied: out = fl16(fl32(fl16(o)·r)), r the
  /// row's sink factor (--sink-after-rounding; OutputFloor::sink_rescale)
  bool sink_after_rounding = false;
  /// the normalized probabilities p = softmax(P) rounded to 16 bits before P·V, the max key's
  /// too (--normalized-p; OutputFloor::narrow_pmax), p with the sink (exp(P - L), SPEC §4).
  /// Off: FlashMLA's exp(P - max), whose max key is exactly 1. Each model adds its own
  /// rounding only (DeclaredModels.*): a kernel doing the other's fails where the two differ.
  bool normalized_p = false;
};

/// The models either declares (a field is set when it is set in `a` or in `b`). Throws nothing.
inline RoundingModel either(const RoundingModel& a, const RoundingModel& b) {
  return {a.sink_after_rounding || b.sink_after_rounding, a.normalized_p || b.normalized_p};
}

/// The ops a backend may implement (names as in the `dsa` operator library).
/// The last three are the FP8 / paged inference ops of SPEC §10.
enum class Op {
  IndexerScores, IndexerScoresBackward, Topk, SparseMlaFwd, SparseMlaBwd, IndexerKlLoss,
  Fp8IndexerScores, PagedIndexerScores, SparseMlaFp8Fwd
};
const char* to_string(Op op);
/// All ops, in pipeline order (the §10 inference ops last).
const std::vector<Op>& all_ops();
/// Output names of `op`, in report order (SPEC §2-§7, §10): scores; dq_idx, dk_idx, dw;
/// indices; out, lse, max_logits; dq, dkv, dsink; loss, d_scores; §10: scores, scores,
/// out, lse, max_logits.
const std::vector<std::string>& op_output_names(Op op);

/// Thrown by a backend for an op it does not implement; the oracle reports "skip".
class NotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// True when `why` (a NotSupported message) is a limit the backend declared up front rather
/// than a run-time decline: the plugin adapter's "...: tie_break small not declared" / "FP8
/// format e4m3fn not declared in fp8_caps" / "op not declared in caps.ops" (plugin_backend.cpp)
/// and the Python bridge's "backend 'x' declares tie_breaks [...]" / dtypes / fp8_formats
/// (_bridge.py). Such a decline is never taken as a declined SPEC-mandatory case (the property
/// suite discards the draw; a fixture's op is a skip). Throws nothing.
inline bool declared_limitation(const std::string& why) {
  return why.find(" not declared") != std::string::npos || why.find("' declares ") != std::string::npos;
}

/// How a backend op call that threw ended, as the route that made the call tells it. The
/// properties that require a rejection of bad input (SPEC §10: fp8.invalid_scale_rejected,
/// paged.bad_table_rejected, ...) accept only ArgumentError.
enum class CallFailure {
  ArgumentError,    ///< the kernel's documented argument error: std::invalid_argument (C++),
                    ///< DSA_STATUS_INVALID_ARGUMENT (plugin ABI), ValueError (Python backend)
  RejectedByRoute,  ///< the route's own input check refused the call; the kernel never ran
  Crashed,          ///< the isolated call died (signal, abort, exit without a result)
  TimedOut,         ///< the isolated call was still running at its timeout and was killed
  MemoryViolation,  ///< a write past a buffer (guard zone), a changed descriptor or input
  OtherError,       ///< any other error (DSA_STATUS_INTERNAL_ERROR, another exception type)
};
/// "argument error", "rejected by the route", "crashed", "timed out", "memory violation",
/// "other error".
inline const char* to_string(CallFailure f) {
  switch (f) {
    case CallFailure::ArgumentError: return "argument error";
    case CallFailure::RejectedByRoute: return "rejected by the route";
    case CallFailure::Crashed: return "crashed";
    case CallFailure::TimedOut: return "timed out";
    case CallFailure::MemoryViolation: return "memory violation";
    case CallFailure::OtherError: return "other error";
  }
  return "other error";
}

/// A backend computes the SPEC ops on host tensors (it copies to its device and back).
/// Outputs use the backend's own dtypes; the oracle judges them against the reference.
/// Every op's shapes, dtypes and rules: SPEC §2-§7 and dsa/contract/op_types.h.
/// Default implementations throw NotSupported.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// Empty when usable here; otherwise why not (e.g. "no CUDA device"), reported as skip.
  virtual std::string unavailable_reason() const { return {}; }
  /// True when identical inputs give bitwise-identical outputs (SPEC §3.5).
  virtual bool deterministic() const { return true; }
  /// True when every op returns exactly dsa::reference's Precision::Reference result for its
  /// inputs (the `reference` backend). The sparse MLA, indexer and KL checks then take the
  /// candidate's result from the case's memo (the reference the judge uses, computed once per
  /// case) instead of calling the backend (issue 13). Default false.
  virtual bool computes_reference() const { return false; }
  /// True when the backend implements `op`.
  virtual bool supports(Op op) const = 0;
  /// The outputs the backend writes (output names as in SPEC §2-§7, e.g. {"out", "lse"});
  /// std::nullopt = every output of each op it supports (SPEC §9 complete outputs). A plugin
  /// declares them in dsa_backend_v1::provided_outputs; the others are not judged.
  virtual std::optional<std::set<std::string>> provided_outputs() const { return std::nullopt; }
  /// How the kernel rounds where SPEC §4 leaves it free (RoundingModel; default: neither
  /// model). A plugin declares it in dsa_backend_v1::rounding_models. judge_fixture_ops and
  /// the audit's property tasks add it to CheckOptions::rounding (either declares), as they
  /// narrow to provided_outputs(); a route that wraps another backend forwards it.
  virtual RoundingModel rounding_model() const { return {}; }

  virtual Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                const KeyWindows& windows);
  virtual IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx,
                                               const Tensor& w, const KeyWindows& windows,
                                               const Tensor& d_scores);
  virtual Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                             const std::optional<KeyWindows>& windows);
  virtual SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in);
  virtual SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout);
  virtual IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in);

  // SPEC §10 inference ops (FP8 bytes, paged KV). Same NotSupported defaults.
  /// FP8 indexer scores [s_q,s_kv] (contract/fp8_op_types.h: Fp8IndexerInputs).
  virtual Tensor fp8_indexer_scores(const Fp8IndexerInputs& in);
  /// Paged FP8 indexer scores [batch·next_n, max_context] (PagedIndexerInputs).
  virtual Tensor paged_indexer_scores(const PagedIndexerInputs& in);
  /// Sparse MLA forward over the 656-byte FP8 KV cache (SparseMlaFp8Inputs).
  virtual SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in);
  /// True when the backend accumulates FP8 products on tensor cores with fewer mantissa
  /// bits than fp32 between promotions (DeepSeek-V3 report §3.3: about 14). The oracle then
  /// judges the FP8 indexer ops by the table row for that accumulation, and says so.
  virtual bool fp8_reduced_accumulation() const { return false; }
  /// What `e`, thrown by one of this backend's op calls, says about the call (CallFailure).
  /// Default (an in-process C++ backend): std::invalid_argument is ArgumentError (the contract's
  /// argument error, dsa/contract/errors.h), anything else OtherError. A route that wraps
  /// another backend forwards this; a plugin route tells its status, crashes and guard zones.
  virtual CallFailure classify_failure(const std::exception& e) const {
    return dynamic_cast<const std::invalid_argument*>(&e) ? CallFailure::ArgumentError : CallFailure::OtherError;
  }
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

/// Registers a named backend; a second registration of a name replaces the first.
void register_backend(const std::string& name, BackendFactory factory);
/// Names of every registered backend, sorted.
std::vector<std::string> backend_names();
/// Creates a backend; throws std::invalid_argument naming `name` and the known names.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace dsa::oracle
