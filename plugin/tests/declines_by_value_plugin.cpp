// dsa_declines_by_value_plugin: the float64 reference through the plugin ABI, declining
// (DSA_STATUS_UNSUPPORTED) by value, never by a limit of a kernel (fresh11 F2): its sparse MLA
// declines every call whose indices[0,0] is 0, its top-k every call whose scores[0,0] is
// positive. Every twin that only takes a SPEC-mandatory feature out keeps those values, so
// before the twin with other values (decline_cause) such declines stayed skips and `fixtures
// check` exited 0. Its KL loss declines every call holding a -inf score (SPEC §7: mandatory;
// before, the KL loss had no twin). Built for the CLI tests only.
#include <cmath>
#include <memory>

#include "dsa/backend_abi.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/abi_adapter.h"

namespace {

using namespace dsa;

class DeclinesByValue final : public oracle::Backend {
 public:
  std::string name() const override { return "declines_by_value"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd || op == oracle::Op::Topk ||
           op == oracle::Op::IndexerKlLoss;
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (s.numel() > 0 && s.get(0) > 0) throw oracle::NotSupported("scores[0,0] > 0 not supported");
    return ref_->select_topk(s, k, p, w);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    decline_first_id(in);
    return ref_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    decline_first_id(in);
    return ref_->sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    for (int64_t i = 0; i < in.scores.numel(); ++i)
      if (in.scores.get(i) == -INFINITY) throw oracle::NotSupported("-inf scores not supported");
    return ref_->indexer_kl_loss(in);
  }

 private:
  static void decline_first_id(const SparseMlaInputs& in) {
    if (in.indices.numel() > 0 && in.indices.get(0) == 0) throw oracle::NotSupported("indices[0,0] == 0 not supported");
  }
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

}  // namespace

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  caps.ops = DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD | DSA_OP_TOPK_INDICES | DSA_OP_INDEXER_KL_LOSS;
  return dsa::plugin::make_adapter_table("declines_by_value", "dsa-verify " DSA_CONTRACT_VERSION, caps,
                                         [] { return std::make_unique<DeclinesByValue>(); });
}
