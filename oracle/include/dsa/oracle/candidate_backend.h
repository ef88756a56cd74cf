// Stored outputs as a Backend (target dsa_oracle_fixtures): a candidate file of
// `dsa-verify compare` / `replay`, or a fixture's expected.* (`fixtures check`), served to
// check_op so that every route is judged by the same code on the same OpCase (SPEC §9).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsa/fixtures/conventions.h"
#include "dsa/oracle/backend.h"

namespace dsa::oracle {

/// Every output name of every op (sorted, unique).
const std::vector<std::string>& all_output_names();

/// Returns the tensors it holds. An op is supported when at least one of its outputs is
/// stored; outputs that are not stored come back as undefined Tensors (check_op then reports
/// them as missing or, with CheckOptions::provided_outputs, as not judged). Conventions
/// (fixtures::Convention) convert representations before judging and never hide a contract
/// violation: lse_base2 multiplies lse and max_logits by ln 2 in their own dtype;
/// ids_s_q_1_k views [s_q, 1, k] indices as [s_q, k]; int64_ids narrows I64 indices to I32
/// (an id outside int32 becomes INT32_MIN, reported by the top-k check as out of range);
/// topk_width_min_k_s_kv pads [s_q, min(k, s_kv)] indices to [s_q, k] with -1. A convention
/// whose input form is absent (say int64_ids on I32 ids) leaves the tensor as it is and the
/// judge reports its dtype or shape. deterministic() is true (same bytes on every call).
class CandidateBackend : public Backend {
 public:
  /// `outputs`: tensors by output name; `label`: the file path (named in errors and notes);
  /// `name`: the backend name shown in reports.
  CandidateBackend(std::map<std::string, Tensor> outputs, std::string label,
                   std::vector<fixtures::Convention> conventions,
                   std::string name = "candidate-file");

  std::string name() const override { return name_; }
  bool deterministic() const override { return true; }
  bool supports(Op op) const override;

  /// Names of the stored outputs of `op` (in op_output_names order).
  std::vector<std::string> stored_outputs(Op op) const;
  const std::vector<fixtures::Convention>& conventions() const { return conventions_; }
  /// The stored tensor of output `name` as read (before any convention), or nullptr.
  const Tensor* stored(const std::string& name) const {
    auto it = outputs_.find(name);
    return it == outputs_.end() ? nullptr : &it->second;
  }
  /// One line per convention applied so far ("topk_width_min_k_s_kv: indices [6, 24] padded
  /// with -1 to [6, 40]"), for reports.
  const std::vector<std::string>& adapter_notes() const { return notes_; }

  Tensor indexer_scores(const Tensor&, const Tensor&, const Tensor&, const KeyWindows&) override;
  IndexerGrads indexer_scores_backward(const Tensor&, const Tensor&, const Tensor&,
                                       const KeyWindows&, const Tensor&) override;
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy&,
                     const std::optional<KeyWindows>&) override;
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs&) override;
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs&, const Tensor&) override;
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs&) override;
  /// §10 ops: the stored scores / out, lse, max_logits (conventions as for sparse MLA).
  Tensor fp8_indexer_scores(const Fp8IndexerInputs&) override;
  Tensor paged_indexer_scores(const PagedIndexerInputs&) override;
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs&) override;

 private:
  bool has(const std::string& n) const { return outputs_.count(n) > 0; }
  SparseMlaForward stored_forward();  // out, lse, max_logits with lse_base2 applied
  bool uses(fixtures::Convention c) const;
  Tensor get(const std::string& n) const;
  void need(Op op) const;
  void note(const std::string& line);

  std::map<std::string, Tensor> outputs_;
  std::string label_, name_;
  std::vector<fixtures::Convention> conventions_;
  std::vector<std::string> notes_;
};

/// Reads a candidate file (safetensors): tensors named `<output>` or `expected.<output>`
/// (output names as in op_output_names). Conventions: `conventions` plus those named in the
/// file's metadata "conventions" when it is a JSON array (a JSON object there is free text
/// and ignored). `ignored` (when given) receives the names of tensors that are not outputs.
/// Throws fixtures::FileError(path, ...) when the file cannot be read, holds no output
/// tensor, holds one output twice (`out` and `expected.out`) or names an unknown convention.
std::unique_ptr<CandidateBackend> load_candidate_file(
    const std::string& path, const std::vector<fixtures::Convention>& conventions,
    std::vector<std::string>* ignored = nullptr);

}  // namespace dsa::oracle
