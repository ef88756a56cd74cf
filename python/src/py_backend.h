// A Python object with methods named after the ops, served as a dsa::oracle::Backend, so the
// oracle, the property suite and the fixture runner judge it exactly as they judge a built-in
// backend or a plugin. The Python side of each call (torch tensors, the backend's attributes,
// exceptions) lives in dsa_verify/_bridge.py; this class moves tensors and checks outputs.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "dsa/oracle/backend.h"
#include "dsa/oracle/op_check.h"

namespace dsa::python {

/// Wraps a dsa_verify._bridge.Bridge. Safe on any thread: every method takes the GIL itself,
/// so callers that may run backends on worker threads release it first. Per op call: inputs are copied once into host tensors handed over as
/// DLPack capsules (the bridge moves them to the backend's device in one copy per tensor);
/// outputs come back as capsules and are checked: a missing, non-contiguous, wrong-dtype or
/// wrong-shape output throws std::runtime_error naming the op and the output (the oracle
/// reports a failure); NotImplementedError in Python throws oracle::NotSupported (a skip);
/// any other Python exception throws std::runtime_error carrying the Python traceback. On
/// the host, an input the backend modified in place is a failure naming the input.
class PyBackend final : public oracle::Backend {
 public:
  /// Shared handle of a bridge whose last owner drops it under the GIL.
  using BridgeHandle = std::shared_ptr<pybind11::object>;
  /// Requires the GIL (copies the Python reference).
  static BridgeHandle share(const pybind11::object& bridge);
  explicit PyBackend(BridgeHandle bridge);

  std::string name() const override;
  std::string unavailable_reason() const override;
  bool deterministic() const override;
  bool supports(oracle::Op op) const override;

  Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                        const KeyWindows& windows) override;
  IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                       const KeyWindows& windows, const Tensor& d_scores) override;
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override;
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override;
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override;
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override;
  // SPEC §10: FP8 bytes handed over as uint8 with a `fp8_format` scalar (OpArgs below).
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override;
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override;
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override;
  /// The bridge's `fp8_reduced_accumulation` (the backend attribute, default False).
  bool fp8_reduced_accumulation() const override;

 private:
  BridgeHandle bridge_;
};

/// Keyword arguments of one op call as the Python backend receives them (SPEC argument
/// names): `tensors` name -> host Tensor (absent optional inputs are passed as None),
/// `scalars` name -> Python value. Windows become `ks`, `ke` int64 [s_q] (top-k: None when
/// the case has no windows); `[s_q,1,k]` indices are passed as `[s_q,k]`. SPEC §10 ops: FP8
/// tensors (q_idx, k_idx, k_cache, kv_cache) are U8 bytes with the scalar `fp8_format`
/// ("e4m3fn" / "e5m2"; the 656-byte kv_cache is always e4m3fn NoPE + fp32 scales + bf16 RoPE,
/// passed in the shape it has); paged cases add the scalars `block_size` (k_cache.size(1)) and
/// `max_context` (-1 resolved to the largest context); sparse_mla_fp8_fwd adds d_v = 512.
struct OpArgs {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::string> none;  ///< optional inputs passed as None
  pybind11::dict scalars;
};
/// The arguments of `op` for case `c` (the members check_op would pass to the backend); used
/// by PyBackend and by load_fixture's per-op keyword arguments.
OpArgs op_args(oracle::Op op, const oracle::OpCase& c);

/// Set when a backend call was interrupted (KeyboardInterrupt / SystemExit in Python); the
/// module's entry points re-raise KeyboardInterrupt once the oracle has unwound.
std::atomic<bool>& interrupted();

/// Set when the audit was stopped (SIGINT/SIGTERM in dsa_verify.audit, a KeyboardInterrupt or
/// SystemExit raised by the kernel; dsa_verify._core.request_stop): every later backend call
/// throws oracle::NotSupported without calling the kernel, so a task still running in a worker
/// thread winds down at its next call. Cleared by request_stop(False) when an audit starts.
std::atomic<bool>& stop_requested();

/// Output names of an op (SPEC order); sparse_mla_bwd lists dsink only with a sink.
std::vector<std::string> output_names(oracle::Op op, bool with_sink);

}  // namespace dsa::python
