// Op checkers: run one op on a backend, run the float64 reference and its baseline, judge
// every output (SPEC §9), check determinism (§3.5) — the testbed behind every property,
// `dsa-verify check` and `make audit`.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "dsa/contract/op_types.h"
#include "dsa/oracle/backend.h"
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
  // KL loss (§7).
  IndexerKlInputs kl;
  // FP8 / paged inference ops (§10); checked in fp8_check.h.
  Fp8IndexerInputs fp8_indexer;
  PagedIndexerInputs paged_indexer;
  SparseMlaFp8Inputs mla_fp8;
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
  /// missing is still Incomplete.
  std::optional<std::set<std::string>> provided_outputs;
};

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

/// Runs `op` of `backend` on `c` and judges it. Verdict Skip when the backend is unavailable
/// (unavailable_reason), does not support the op, or throws NotSupported; Fail when it throws
/// anything else (reason = the message), when an output fails the ratio rule or NaN/±inf
/// positions differ, when top-k violates §3, or when a deterministic backend differs between
/// two runs. Invalid inputs make the reference throw std::invalid_argument (propagated).
OpReport check_op(Backend& backend, Op op, const OpCase& c, const CheckOptions& opt = default_check_options());

/// Same as check_op for each op (one function per op, SPEC section in brackets).
OpReport check_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §2
OpReport check_indexer_backward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §2
OpReport check_topk_op(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §3 exact
OpReport check_sparse_mla_forward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §4,§6
OpReport check_sparse_mla_backward(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §5
OpReport check_indexer_kl_loss(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());  // §7

/// Fused indexer + top-k (SPEC §9): the backend's own indexer scores fed to its own top-k,
/// judged by check_fused_topk with score_bound = 2x the ratio-rule bound of its scores (both
/// entries of a swapped pair may err by the bound).
OpReport check_fused_indexer_topk(Backend& b, const OpCase& c, const CheckOptions& opt = default_check_options());

/// Per-output bounds on the magnitude of the terms summed into each output, from the inputs'
/// maxima (tolerances.h: the floor scales with max(|reference|, term scale), so outputs that
/// cancel to ~0 are judged at their terms' fp32 precision). Names as in the op's outputs.
struct TermScales {
  std::map<std::string, double> values;
  double at(const std::string& name) const;  ///< 0 when unknown
};
/// scores: H_I·d_I·|w|·|q|·|k|; dq_idx: s_kv·|dI|·|w|·|k|; dk_idx: s_q·H_I·|dI|·|w|·|q|;
/// dw: s_kv·|dI|·d_I·|q|·|k| (|x| = max finite |x|). SPEC §2.
TermScales indexer_term_scales(const OpCase& c);
/// With L = max finite |max_logits| (float64 forward) + ln k, G = d_v·|dout|·|kv| and n the
/// most (query, valid slot) pairs selecting one key: out |kv|(1+L); lse, max_logits L;
/// dq 2·sm_scale·G·|kv|(1+L); dkv n·h_q(|dout|+2·sm_scale·G·|q|)(1+L); dsink s_q·G. SPEC §4-§5.
TermScales sparse_mla_term_scales(const OpCase& c);
/// loss coeff(1+2|I|+2L+ln s_kv); d_scores coeff/#non-empty rows. SPEC §7.
TermScales kl_term_scales(const OpCase& c);

/// True when two tensors have equal dtype, shape and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace dsa::oracle
