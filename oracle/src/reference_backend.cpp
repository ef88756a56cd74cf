// The `reference` backend: forwards every op to dsa::reference (float64).
#include "dsa/oracle/reference_backend.h"

#include "dsa/reference/fp8_indexer.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/paged_indexer.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "dsa/reference/topk.h"

namespace dsa::oracle {
namespace {

class ReferenceBackend final : public Backend {
 public:
  std::string name() const override { return "reference"; }
  bool supports(Op) const override { return true; }
  bool computes_reference() const override { return true; }
  Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                        const KeyWindows& windows) override {
    return reference::indexer_scores(q_idx, k_idx, w, windows);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                       const KeyWindows& windows, const Tensor& d_scores) override {
    return reference::indexer_scores_backward(q_idx, k_idx, w, windows, d_scores);
  }
  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override {
    return reference::select_topk(scores, k, policy, windows);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    return reference::sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return reference::sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    return reference::indexer_kl_loss(in);
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    return reference::fp8_indexer_scores(in);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    return reference::paged_indexer_scores(in);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    return reference::sparse_mla_fp8_forward(in);
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

void register_reference_backend() { register_backend("reference", &make_reference_backend); }

}  // namespace dsa::oracle
