// dsa_declines_invalid_ids_plugin: the float64 reference's sparse MLA through the plugin ABI,
// declining (DSA_STATUS_UNSUPPORTED) every call whose indices hold an invalid slot (an id
// outside [0, s_kv) or past topk_length): SPEC §4 makes those cases mandatory, so an audit
// reports it INCOMPLETE unless the user names them (`audit --unsupported invalid_ids,...`).
// Its top-k (the reference's) declines every call whose scores hold a -inf anywhere, inside or
// outside the windows (SPEC §3.1 and §2: -inf is part of every top-k's input; fresh12 F8:
// `--unsupported neg_inf_scores`). Built for the CLI tests only.
#include <cmath>
#include <memory>

#include "dsa/backend_abi.h"
#include "dsa/oracle/backend.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/plugin/abi_adapter.h"

namespace {

using namespace dsa;

class DeclinesInvalidIds final : public oracle::Backend {
 public:
  std::string name() const override { return "declines_invalid_ids"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd || op == oracle::Op::Topk;
  }
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    for (int64_t i = 0; i < s.numel(); ++i)
      if (s.get(i) == -INFINITY) throw oracle::NotSupported("-inf scores not supported");
    return ref_->select_topk(s, k, p, w);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    decline_invalid(in);
    return ref_->sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    decline_invalid(in);
    return ref_->sparse_mla_backward(in, dout);
  }

 private:
  static void decline_invalid(const SparseMlaInputs& in) {
    const int64_t s_q = in.indices.size(0), k = in.indices.numel() / (s_q > 0 ? s_q : 1);
    const int64_t s_kv = in.kv.size(0);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t id = in.indices.get(t * k + j);
        const bool past_length = in.topk_length && j >= in.topk_length->get(t);
        if (id < 0 || id >= s_kv || past_length) throw oracle::NotSupported("invalid ids not supported");
      }
  }
  std::unique_ptr<oracle::Backend> ref_ = oracle::make_reference_backend();
};

}  // namespace

extern "C" DSA_BACKEND_EXPORT const dsa_backend_v1* dsa_backend_get_v1(uint32_t loader_abi_version) {
  if (loader_abi_version != DSA_BACKEND_ABI_VERSION) return nullptr;
  dsa_capabilities caps = dsa::plugin::reference_like_capabilities();
  caps.ops = DSA_OP_SPARSE_MLA_FWD | DSA_OP_SPARSE_MLA_BWD | DSA_OP_TOPK_INDICES;
  return dsa::plugin::make_adapter_table("declines_invalid_ids", "dsa-verify " DSA_CONTRACT_VERSION, caps,
                                         [] { return std::make_unique<DeclinesInvalidIds>(); });
}
