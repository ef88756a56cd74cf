// CUDA dispatch of the `dsa` operator library (schemas in optimized/src/ops.cpp, SPEC §3):
// dsa::topk_indices on CUDA tensors runs the cluster top-k kernel (select_topk_device) on the
// current CUDA stream with device pointers, no host copies. Inputs the kernel does not take
// (scores not fp32, windows not int on the scores' device, k or s_kv over 2^31-1) and every
// invalid input go to the ATen composite (optimized/src/topk.cpp), which raises the op's
// errors naming the argument. The composite stays reachable on its own as
// dsa::optimized::kernels::topk_indices and on CPU tensors.
#include <climits>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>
#include <torch/version.h>

#include "dsa/cuda/kernels.h"
#include "dsa/cuda/torch_ops.h"
#include "kernels.h"  // optimized/src: the composite kernels

namespace dsa::cuda {
namespace {

/// PyTorch's current CUDA stream on `device` (through c10's device-generic stream API, so
/// this file needs no c10/cuda headers); LibTorch 1.x: the legacy default stream.
cudaStream_t current_stream(const at::Device& device) {
#if TORCH_VERSION_MAJOR >= 2
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return static_cast<cudaStream_t>(impl.getStream(device).native_handle());
#else
  (void)device;
  return nullptr;
#endif
}

bool window_ok(const c10::optional<at::Tensor>& w, int64_t s_q, const at::Device& device) {
  return w.has_value() && w->defined() && w->dim() == 1 && w->size(0) == s_q &&
         !at::isFloatingType(w->scalar_type()) && !at::isComplexType(w->scalar_type()) &&
         w->scalar_type() != at::kBool && w->device() == device;
}

at::Tensor topk_indices_cuda(const at::Tensor& scores, int64_t k,
                             const c10::optional<at::Tensor>& ks,
                             const c10::optional<at::Tensor>& ke, c10::string_view tie_break,
                             bool sorted) {
  const std::string tb(tie_break.data(), tie_break.size());
  const bool has_ks = ks.has_value() && ks->defined(), has_ke = ke.has_value() && ke->defined();
  const bool takes = scores.scalar_type() == at::kFloat && scores.dim() == 2 && k >= 0 &&
                     k <= INT32_MAX && scores.size(1) <= INT32_MAX && scores.size(0) <= INT32_MAX &&
                     (tb == "any" || tb == "small" || tb == "large") && has_ks == has_ke &&
                     (!has_ks || (window_ok(ks, scores.size(0), scores.device()) &&
                                  window_ok(ke, scores.size(0), scores.device())));
  if (!takes) return dsa::optimized::kernels::topk_indices(scores, k, ks, ke, tie_break, sorted);
  const c10::DeviceGuard guard(scores.device());
  const at::Tensor x = scores.contiguous();
  const int64_t s_q = x.size(0), s_kv = x.size(1);
  at::Tensor out = at::empty({s_q, k}, x.options().dtype(at::kInt));
  if (s_q == 0 || k == 0) return out;
  at::Tensor ks64, ke64;
  if (has_ks) {
    ks64 = ks->to(at::kLong).contiguous();
    ke64 = ke->to(at::kLong).contiguous();
  }
  const size_t scratch_bytes = topk_scratch_bytes(s_q, s_kv, k);
  at::Tensor scratch;
  if (scratch_bytes > 0)
    scratch = at::empty({static_cast<int64_t>(scratch_bytes)}, x.options().dtype(at::kByte));
  const TopkPolicy policy{tb == "large" ? TieBreak::Large : TieBreak::Small, sorted};
  select_topk_device(x.data_ptr<float>(), s_q, s_kv, k,
                     has_ks ? ks64.data_ptr<int64_t>() : nullptr,
                     has_ks ? ke64.data_ptr<int64_t>() : nullptr, policy,
                     out.data_ptr<int32_t>(), scratch_bytes ? scratch.data_ptr() : nullptr,
                     current_stream(x.device()), TopkKernel::Cluster);
  return out;
}

}  // namespace

bool torch_ops_registered() { return true; }

}  // namespace dsa::cuda

TORCH_LIBRARY_IMPL(dsa, CUDA, m) { m.impl("topk_indices", &dsa::cuda::topk_indices_cuda); }
