// Loads an external kernel library implementing dsa/backend_abi.h and serves it as a
// dsa::oracle::Backend, so the oracle audits it like any built-in backend (issue 6).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "dsa/backend_abi.h"
#include "dsa/oracle/backend.h"
#include "dsa/plugin/findings.h"
#include "dsa/plugin/isolation.h"

namespace dsa::plugin {

/// How calls into the plugin are run.
struct PluginOptions {
  /// true: the load probe and every op call run in a forked child (run_isolated), so a
  /// crash or hang becomes an IsolatedFailure; false: calls run in this process.
  bool isolate = true;
  /// Per-call limit when isolated (covers the forward a backward call runs first).
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  /// Limit of the isolated load probe (dlopen + dsa_backend_get_v1 + validation).
  std::chrono::milliseconds load_timeout{std::chrono::seconds(30)};
};

/// What the library declared, as loaded (for reports).
struct PluginInfo {
  std::string path;     ///< absolute path of the library
  std::string name;     ///< dsa_backend_v1::name
  std::string version;  ///< dsa_backend_v1::version ("" when NULL)
  uint32_t abi_version = 0;
  dsa_capabilities caps{};
  /// dsa_backend_v1::provided_outputs (DSA_OUTPUT_* bits; 0: every output of each op, also
  /// for tables built against the first ABI 1 header, which lack the field).
  uint32_t provided_outputs = 0;
  uint32_t fp8_caps = 0;  ///< DSA_FP8_* bits (ABI 1.1; 0 for an ABI 1.0 table)
  /// dsa_backend_v1::rounding_models: DSA_ROUNDING_* bits (ABI 1.2; 0, nothing declared, for a
  /// table built against an older header, which ends before the field).
  uint32_t rounding_models = 0;
};

/// The rounding models `info` declares (rounding_models: DSA_ROUNDING_SINK_AFTER_ROUNDING →
/// sink_after_rounding, DSA_ROUNDING_NORMALIZED_P → normalized_p). Throws nothing.
dsa::oracle::RoundingModel rounding_model_of(const PluginInfo& info);

/// Names of the outputs declared in provided_outputs (oracle output names, e.g. {"out",
/// "lse"}); std::nullopt when the plugin writes every output (bits 0).
std::optional<std::set<std::string>> provided_output_names(const PluginInfo& info);

/// Bit of `op` in dsa_capabilities::ops (DSA_OP_*).
uint32_t op_bit(dsa::oracle::Op op);

/// One line for report headers (op names as dsa::oracle::to_string), e.g. "plugin 'example'
/// 1.0 (ABI 1, /abs/lib.so): ops indexer_scores,topk,sparse_mla_fwd; inputs F32|BF16;
/// devices cpu; tie any|small|large; order sorted|unsorted; deterministic; outputs
/// index_scores=F32 mla_out=as-input mla_stats=F32"; a declared rounding model adds
/// "; rounding normalized-p" (or sink-after-rounding, or both joined by '|').
std::string describe(const PluginInfo& info);

/// A loaded plugin. Every op: validates shapes like the reference (std::invalid_argument
/// naming the argument), throws dsa::oracle::NotSupported when the op, an input dtype or a
/// tie policy / order is not declared (or the plugin returns DSA_STATUS_UNSUPPORTED),
/// allocates outputs with the declared dtypes inside guard zones, calls the plugin and then
/// checks the ABI's memory rules: ContractViolation for a changed descriptor (dtype, shape,
/// strides), a guard-zone overrun, a modified input or unwritten output elements;
/// PluginCallError for an error status; IsolatedFailure for a crash or timeout.
/// Outputs are returned in the declared dtypes (the oracle judges them, SPEC §9).
class PluginBackend : public dsa::oracle::Backend {
 public:
  ~PluginBackend() override;
  PluginBackend(const PluginBackend&) = delete;
  PluginBackend& operator=(const PluginBackend&) = delete;

  /// "plugin:<name>".
  std::string name() const override;
  /// "" when usable; otherwise the plugin's is_available message (or why that call failed).
  std::string unavailable_reason() const override;
  bool deterministic() const override;
  bool supports(dsa::oracle::Op op) const override;
  /// provided_output_names(info()): the outputs declared in provided_outputs.
  std::optional<std::set<std::string>> provided_outputs() const override;
  /// rounding_model_of(info()): the models declared in rounding_models (ABI 1.2).
  dsa::oracle::RoundingModel rounding_model() const override;
  const PluginInfo& info() const;
  const PluginOptions& options() const;

  Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                        const KeyWindows& windows) override;
  IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx,
                                       const Tensor& w, const KeyWindows& windows,
                                       const Tensor& d_scores) override;
  /// Sends the policy as is (Any is sent as DSA_TIE_BREAK_ANY; undeclared → NotSupported).
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override;
  /// indices [s_q,1,k] are passed as [s_q,k].
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override;
  /// Runs the plugin's own forward first (in the same child) when it declares one and
  /// passes its out/lse; otherwise out/lse are NULL.
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override;
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override;
  /// SPEC §10 ops (ABI 1.1). Structure is validated like the reference (invalid_argument);
  /// a format outside fp8_caps or a q dtype outside input_dtypes is NotSupported. Values go
  /// to the plugin as given (scales, ids), which must reject bad ones itself with
  /// DSA_STATUS_INVALID_ARGUMENT.
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override;
  /// Block-table entries a context reads and context lengths: isolated (the default), a bad
  /// one goes to the plugin as given (it addresses memory only in the child, which must return
  /// DSA_STATUS_INVALID_ARGUMENT: paged.bad_table_rejected judges the kernel); in this process
  /// (options.isolate false) the loader rejects it itself (std::invalid_argument, classified
  /// RejectedByRoute, so that property is a skip, not a pass).
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override;
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override;
  /// fp8_caps & DSA_FP8_REDUCED_ACCUMULATION.
  bool fp8_reduced_accumulation() const override;
  /// PluginCallError with DSA_STATUS_INVALID_ARGUMENT: ArgumentError (other statuses
  /// OtherError); IsolatedFailure: Crashed or TimedOut; ContractViolation (guard zones,
  /// descriptors, inputs; also when it came with DSA_STATUS_INVALID_ARGUMENT): MemoryViolation;
  /// the loader's own std::invalid_argument (the plugin was not called): RejectedByRoute.
  dsa::oracle::CallFailure classify_failure(const std::exception& e) const override;

  struct Impl;

 private:
  friend std::unique_ptr<PluginBackend> open_plugin(const std::string&, const PluginOptions&);
  friend std::string register_plugin(const std::string&, const PluginOptions&);
  explicit PluginBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// dlopens `path` (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE), finds DSA_BACKEND_ENTRY_SYMBOL,
/// calls it with DSA_BACKEND_ABI_VERSION and validates the table and capabilities.
/// With options.isolate the same probe first runs in a child, so a library that crashes
/// while loading is reported instead of crashing the caller.
/// Throws PluginLoadError naming the path for: a missing file, a file dlopen rejects (not a
/// shared object, unresolved symbols), a library without the entry symbol ("not a dsa
/// plugin"), a NULL table, abi_version != DSA_BACKEND_ABI_VERSION, a struct_size smaller
/// than the first ABI 1 table (one ending before provided_outputs is accepted; one ending
/// before fp8_caps lacks the §10 ops), an empty or non-printable name, or inconsistent capabilities
/// (unknown bits, no ops, a declared op whose function is NULL, no input dtype, no device,
/// no tie policy/order for top-k, an output dtype code illegal for its family, deterministic
/// not 0/1, unknown provided_outputs bits or a declared op none of whose outputs is
/// provided, unknown rounding_models bits or a rounding model without a sparse MLA op; a
/// table ending before rounding_models declares none), or a crash/hang of the probe.
std::unique_ptr<PluginBackend> open_plugin(const std::string& path,
                                           const PluginOptions& options = {});

/// open_plugin as a plain Backend (what `dsa-verify audit --plugin PATH.so` uses).
std::unique_ptr<dsa::oracle::Backend> load_plugin(const std::string& path,
                                                  const PluginOptions& options = {});

/// Opens `path` once (so a bad library throws PluginLoadError here), then registers it with
/// dsa::oracle::register_backend under its name() "plugin:<name>" (each make_backend call
/// opens it again, without the probe). Returns the registered name, e.g. for
/// `fixtures check --backend`.
std::string register_plugin(const std::string& path, const PluginOptions& options = {});

}  // namespace dsa::plugin
