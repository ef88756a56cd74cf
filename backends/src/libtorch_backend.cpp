// Backends `libtorch-cpu`, `libtorch-cuda` and `libtorch-composite`: the `dsa` operator library
// (optimized/) behind the oracle's Backend interface. Host tensors are copied to the device and
// back exactly. `libtorch-composite` (CUDA) calls the indexer and top-k composites directly.
#include "libtorch_backend.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "dsa/backends/torch_tensor.h"
#include "dsa/optimized/fp8.h"
#include "dsa/optimized/indexer.h"
#include "dsa/optimized/kl_loss.h"
#include "dsa/optimized/sparse_mla.h"
#include "dsa/optimized/topk.h"

namespace dsa::backends {
namespace {

using oracle::Op;

class LibtorchBackend final : public oracle::Backend {
 public:
  LibtorchBackend(bool cuda, bool composite) : cuda_(cuda), composite_(cuda && composite) {}

  std::string name() const override {
    return composite_ ? "libtorch-composite" : cuda_ ? "libtorch-cuda" : "libtorch-cpu";
  }
  std::string unavailable_reason() const override {
    if (cuda_ && !torch::cuda::is_available()) return "no CUDA device";
    return {};
  }
  // CPU kernels are deterministic; on CUDA dkv's index_add_ uses atomics (order varies).
  bool deterministic() const override { return !cuda_; }
  bool supports(Op) const override { return true; }
  // The op library's argument error for bad values (a read scale, a table entry, a context
  // length; SPEC §10) is c10::ValueError (optimized/fp8.h); the contract's std::invalid_argument
  // (tensor conversion) too. Another c10::Error (an ATen failure) is not a rejection.
  oracle::CallFailure classify_failure(const std::exception& e) const override {
    if (dynamic_cast<const c10::ValueError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e))
      return oracle::CallFailure::ArgumentError;
    return oracle::CallFailure::OtherError;
  }

  Tensor indexer_scores(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                        const KeyWindows& windows) override {
    auto [ks, ke] = windows_to_torch(windows, dev());
    if (composite_)
      return from_torch(optimized::indexer_scores_composite(t(q_idx), t(k_idx), t(w), ks, ke));
    return from_torch(optimized::indexer_scores(t(q_idx), t(k_idx), t(w), ks, ke));
  }

  IndexerGrads indexer_scores_backward(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                       const KeyWindows& windows,
                                       const Tensor& d_scores) override {
    auto [ks, ke] = windows_to_torch(windows, dev());
    auto g = composite_ ? optimized::indexer_scores_backward_composite(t(q_idx), t(k_idx), t(w),
                                                                       t(d_scores), ks, ke)
                        : optimized::indexer_scores_backward(t(q_idx), t(k_idx), t(w),
                                                             t(d_scores), ks, ke);
    return {from_torch(std::get<0>(g)), from_torch(std::get<1>(g)), from_torch(std::get<2>(g))};
  }

  Tensor select_topk(const Tensor& scores, int64_t k, const TopkPolicy& policy,
                     const std::optional<KeyWindows>& windows) override {
    c10::optional<at::Tensor> ks, ke;
    if (windows) std::tie(ks, ke) = windows_to_torch(*windows, dev());
    if (composite_) return from_torch(optimized::topk_indices_composite(t(scores), k, policy, ks, ke));
    return from_torch(optimized::topk_indices(t(scores), k, policy, ks, ke));
  }

  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    auto r = optimized::sparse_mla_fwd(t(in.q), t(in.kv), t(in.indices), in.sm_scale, in.d_v,
                                       opt(in.topk_length), opt(in.attn_sink));
    return {from_torch(std::get<0>(r)), from_torch(std::get<1>(r)), from_torch(std::get<2>(r))};
  }

  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    const auto q = t(in.q), kv = t(in.kv), ids = t(in.indices);
    const auto len = opt(in.topk_length), sink = opt(in.attn_sink);
    auto f = optimized::sparse_mla_fwd(q, kv, ids, in.sm_scale, in.d_v, len, sink);
    auto g = optimized::sparse_mla_bwd(q, kv, ids, std::get<0>(f), std::get<1>(f), t(dout),
                                       in.sm_scale, in.d_v, len, sink);
    SparseMlaGrads out{from_torch(std::get<0>(g)), from_torch(std::get<1>(g)), std::nullopt};
    if (in.attn_sink) out.dsink = from_torch(std::get<2>(g));
    return out;
  }

  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    auto [ks, ke] = windows_to_torch(in.windows, dev());
    auto r = optimized::indexer_kl_loss(t(in.scores), t(in.q), t(in.kv), in.sm_scale, ks, ke,
                                        to_string(in.mode), opt(in.indices), in.coeff);
    return {from_torch(std::get<0>(r)), from_torch(std::get<1>(r))};
  }

  // SPEC §10 inference ops (composite: fp8 bytes decoded exactly, then the §2/§4 ops).
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    auto [ks, ke] = windows_to_torch(in.windows, dev());
    return from_torch(optimized::fp8_indexer_scores(t(in.q_idx), t(in.k_idx), t(in.k_scale),
                                                    t(in.w), ks, ke, to_string(in.format)));
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    return from_torch(optimized::paged_indexer_scores(
        t(in.q_idx), t(in.k_cache), t(in.k_scale_cache), t(in.w), t(in.block_table),
        t(in.context_lens), in.max_context, to_string(in.format)));
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    auto r = optimized::sparse_mla_fp8_fwd(t(in.q), t(in.kv_cache), t(in.indices), in.sm_scale,
                                           opt(in.topk_length), opt(in.attn_sink));
    return {from_torch(std::get<0>(r)), from_torch(std::get<1>(r)), from_torch(std::get<2>(r))};
  }

 private:
  at::Device dev() const { return cuda_ ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }
  at::Tensor t(const Tensor& x) const { return to_torch(x, dev()); }
  c10::optional<at::Tensor> opt(const std::optional<Tensor>& x) const {
    return x ? c10::optional<at::Tensor>(t(*x)) : c10::nullopt;
  }
  bool cuda_;
  bool composite_;
};

}  // namespace

std::unique_ptr<oracle::Backend> make_libtorch_backend(bool cuda, bool composite) {
  return std::make_unique<LibtorchBackend>(cuda, composite);
}

}  // namespace dsa::backends
