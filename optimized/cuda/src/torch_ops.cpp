// CUDA dispatch of the `dsa` operator library (schemas in optimized/src/ops.cpp, SPEC §2-§4):
// dsa::topk_indices on CUDA tensors runs the cluster top-k kernel (select_topk_device),
// dsa::sparse_mla_fwd the one-pass sparse MLA forward (sparse_mla_forward_device, OnePassWgmma),
// dsa::sparse_mla_bwd the deterministic tensor-core backward (sparse_mla_backward_device) and
// dsa::indexer_scores / dsa::indexer_scores_backward the tensor-core indexer kernels
// (indexer_scores_device, indexer_scores_backward_device), on the current CUDA stream with
// device pointers, no host copies. Inputs a kernel does not take (top-k: scores not fp32,
// windows not int on the scores' device, k or s_kv over 2^31-1; sparse MLA: q/kv not bf16,
// indices/topk_length not int32, attn_sink not fp32, a tensor on another device, d_qk or d_v
// over the kernel limits; indexer: q_idx/k_idx not bf16, w not fp32, H_I > 64 or d_I > 128)
// and every invalid input go to the ATen composites (optimized/src/topk.cpp, sparse_mla.cpp,
// indexer.cpp), which raise the op's errors naming the argument. The composites stay reachable
// on their own as dsa::optimized::kernels::* and on CPU tensors.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>
#include <torch/version.h>

#include "dsa/cuda/backend.h"
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

bool on(const c10::optional<at::Tensor>& t, at::ScalarType dtype, int64_t size,
        const at::Device& device) {
  return !t.has_value() || !t->defined() ||
         (t->scalar_type() == dtype && t->dim() == 1 && t->size(0) == size &&
          t->device() == device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fwd_cuda(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale,
    int64_t d_v, const c10::optional<at::Tensor>& topk_length,
    const c10::optional<at::Tensor>& attn_sink) {
  const bool shapes = q.dim() == 3 && kv.dim() == 2 && kv.size(1) == q.size(2) &&
                      (indices.dim() == 2 || (indices.dim() == 3 && indices.size(1) == 1)) &&
                      indices.size(0) == q.size(0);
  const bool takes =
      shapes && q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16 &&
      indices.scalar_type() == at::kInt && kv.device() == q.device() &&
      indices.device() == q.device() && d_v > 0 && d_v <= q.size(2) &&
      q.size(2) <= sparse_mla_max_d_qk() && d_v <= sparse_mla_max_d_v() &&
      std::isfinite(sm_scale) && kv.size(0) <= INT32_MAX &&
      q.size(0) * ((q.size(1) + 15) / 16) <= INT32_MAX &&
      on(topk_length, at::kInt, q.size(0), q.device()) &&
      on(attn_sink, at::kFloat, q.size(1), q.device());
  if (!takes)
    return dsa::optimized::kernels::sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length,
                                                    attn_sink);
  const c10::DeviceGuard guard(q.device());
  const int64_t s_q = q.size(0), h_q = q.size(1), d_qk = q.size(2), s_kv = kv.size(0);
  const int64_t k = indices.size(-1);
  const at::Tensor qc = q.contiguous(), kvc = kv.contiguous();
  const at::Tensor ids = indices.reshape({s_q, k}).contiguous();
  at::Tensor len, sink;
  if (topk_length.has_value() && topk_length->defined()) len = topk_length->contiguous();
  if (attn_sink.has_value() && attn_sink->defined()) sink = attn_sink->contiguous();
  at::Tensor out = at::empty({s_q, h_q, d_v}, qc.options());
  at::Tensor lse = at::empty({s_q, h_q}, qc.options().dtype(at::kFloat));
  at::Tensor max_logits = at::empty({s_q, h_q}, qc.options().dtype(at::kFloat));
  if (s_q == 0 || h_q == 0) return {out, lse, max_logits};
  sparse_mla_forward_device(
      reinterpret_cast<const uint16_t*>(qc.data_ptr()),
      reinterpret_cast<const uint16_t*>(kvc.data_ptr()), ids.data_ptr<int32_t>(),
      len.defined() ? len.data_ptr<int32_t>() : nullptr,
      sink.defined() ? sink.data_ptr<float>() : nullptr, s_q, h_q, d_qk, s_kv, k, d_v,
      static_cast<float>(sm_scale), reinterpret_cast<uint16_t*>(out.data_ptr()),
      lse.data_ptr<float>(), max_logits.data_ptr<float>(), current_stream(qc.device()),
      SparseMlaKernel::OnePassWgmma);
  return {out, lse, max_logits};
}

// dsa::sparse_mla_bwd (SPEC §5) on the tensor-core backward (sparse_mla_backward_device):
// deterministic by default (DSA_CUDA_SMLA_BWD=fast: atomic dkv; =fallback: the composite), P
// and dS rounded once to bf16 for a bf16 dout (DSA_CUDA_SMLA_BWD_PDS=hilo: the hi + lo kernel,
// which a split fp32 / fp16 dout always takes).
// Taken: q/kv/out bf16, lse fp32 [s_q, h_q], dout bf16, fp16 or fp32 [s_q, h_q, d_v], d_qk and
// d_v multiples of 8 within the kernel limits, int32 indices/topk_length, fp32 attn_sink, one
// device, 16-byte aligned data, s_q·k <= 2^31-1. dout other than bf16 is split exactly into
// bf16 parts hi + mid + lo (the backward is linear in dout), one kernel run each, the grads
// added in that order. Returns dq in q's dtype, dkv and dsink fp32 (the composite's dtypes);
// anything else goes to the composite (optimized/src/sparse_mla.cpp), which raises the errors.
bool aligned16(const at::Tensor& t) {
  return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15u) == 0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_bwd_cuda(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, double sm_scale, int64_t d_v,
    const c10::optional<at::Tensor>& topk_length, const c10::optional<at::Tensor>& attn_sink) {
  const auto composite = [&] {
    return dsa::optimized::kernels::sparse_mla_bwd(q, kv, indices, out, lse, dout, sm_scale, d_v,
                                                    topk_length, attn_sink);
  };
  SparseMlaBwdPath path = SparseMlaBwdPath::Kernel;
  SparseMlaBwdRounding rounding = SparseMlaBwdRounding::Bf16;
  try {
    path = sparse_mla_bwd_path_from_env();
    rounding = sparse_mla_bwd_rounding_from_env();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "dsa::sparse_mla_bwd: ", e.what());
  }
  if (path == SparseMlaBwdPath::Fallback) return composite();
  const bool shapes = q.dim() == 3 && kv.dim() == 2 && kv.size(1) == q.size(2) &&
                      (indices.dim() == 2 || (indices.dim() == 3 && indices.size(1) == 1)) &&
                      indices.size(0) == q.size(0) && d_v > 0 && d_v <= q.size(2) &&
                      out.dim() == 3 && dout.dim() == 3 && lse.dim() == 2 &&
                      out.sizes() == dout.sizes() && out.size(0) == q.size(0) &&
                      out.size(1) == q.size(1) && out.size(2) == d_v && lse.size(0) == q.size(0) &&
                      lse.size(1) == q.size(1);
  if (!shapes) return composite();
  const int64_t s_q = q.size(0), h_q = q.size(1), d_qk = q.size(2), s_kv = kv.size(0);
  const int64_t k = indices.size(-1);
  const at::Device dev = q.device();
  const auto st = dout.scalar_type();
  const bool takes =
      q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16 &&
      out.scalar_type() == at::kBFloat16 && lse.scalar_type() == at::kFloat &&
      (st == at::kBFloat16 || st == at::kFloat || st == at::kHalf) &&
      indices.scalar_type() == at::kInt && kv.device() == dev && indices.device() == dev &&
      out.device() == dev && lse.device() == dev && dout.device() == dev && d_qk % 8 == 0 &&
      d_v % 8 == 0 && d_qk <= sparse_mla_backward_max_d_qk() &&
      d_v <= sparse_mla_backward_max_d_v() && std::isfinite(sm_scale) && s_kv < INT32_MAX &&
      h_q <= INT32_MAX && s_q > 0 && h_q > 0 && k > 0 && s_q * k <= INT32_MAX &&
      s_q * ((h_q + 63) / 64) <= INT32_MAX && on(topk_length, at::kInt, s_q, dev) &&
      on(attn_sink, at::kFloat, h_q, dev);
  if (!takes) return composite();
  const c10::DeviceGuard guard(dev);
  const at::Tensor qc = q.contiguous(), kvc = kv.contiguous(), oc = out.contiguous();
  const at::Tensor lc = lse.contiguous();
  const at::Tensor ids = indices.reshape({s_q, k}).contiguous();
  at::Tensor len, sink;
  if (topk_length.has_value() && topk_length->defined()) len = topk_length->contiguous();
  if (attn_sink.has_value() && attn_sink->defined()) sink = attn_sink->contiguous();
  if (!aligned16(qc) || !aligned16(kvc) || !aligned16(oc)) return composite();
  std::vector<at::Tensor> parts;
  if (st == at::kBFloat16) {
    parts.push_back(dout.contiguous());
  } else {
    at::Tensor rest = dout.to(at::kFloat);
    for (int p = 0; p < 3; ++p) {
      at::Tensor part = rest.to(at::kBFloat16).contiguous();
      rest = rest - part.to(at::kFloat);
      // all-zero parts after the first left out (as the cuda backend's bf16_parts): a dout
      // holding bf16 values runs once, as its bf16 copy does
      if (p == 0 || part.ne(0).any().item<bool>()) parts.push_back(part);
    }
  }
  // A split dout (several kernel runs) takes the hi + lo kernel: one bf16 rounding of dS per
  // part adds up past the single rounding the SPEC §9 floors model (backend.cpp).
  if (parts.size() > 1) rounding = SparseMlaBwdRounding::HiLo;
  const SparseMlaBwdMode mode = path == SparseMlaBwdPath::KernelFast
                                    ? SparseMlaBwdMode::Fast
                                    : SparseMlaBwdMode::Deterministic;
  const auto fopts = qc.options().dtype(at::kFloat);
  const size_t scratch_bytes = sparse_mla_backward_scratch_bytes(s_q, h_q, d_qk, s_kv, k, mode);
  at::Tensor scratch =
      at::empty({static_cast<int64_t>(std::max<size_t>(scratch_bytes, 1))}, qc.options().dtype(at::kByte));
  const cudaStream_t stream = current_stream(dev);
  at::Tensor dq, dkv, dsink = sink.defined() ? at::Tensor() : at::zeros({0}, fopts);
  for (size_t i = 0; i < parts.size(); ++i) {
    at::Tensor dq_i = at::empty({s_q, h_q, d_qk}, fopts), dkv_i = at::empty({s_kv, d_qk}, fopts);
    at::Tensor dsink_i = sink.defined() ? at::empty({h_q}, fopts) : at::Tensor();
    sparse_mla_backward_device(
        reinterpret_cast<const uint16_t*>(qc.data_ptr()),
        reinterpret_cast<const uint16_t*>(kvc.data_ptr()), ids.data_ptr<int32_t>(),
        len.defined() ? len.data_ptr<int32_t>() : nullptr,
        sink.defined() ? sink.data_ptr<float>() : nullptr,
        reinterpret_cast<const uint16_t*>(oc.data_ptr()), lc.data_ptr<float>(),
        reinterpret_cast<const uint16_t*>(parts[i].data_ptr()), s_q, h_q, d_qk, s_kv, k, d_v,
        static_cast<float>(sm_scale), dq_i.data_ptr<float>(), dkv_i.data_ptr<float>(),
        sink.defined() ? dsink_i.data_ptr<float>() : nullptr, scratch.data_ptr(), stream, mode,
        rounding);
    if (i == 0) {
      dq = dq_i;
      dkv = dkv_i;
      if (sink.defined()) dsink = dsink_i;
    } else {  // hi + mid + lo, in that order
      dq.add_(dq_i);
      dkv.add_(dkv_i);
      if (sink.defined()) dsink.add_(dsink_i);
    }
  }
  return {dq.to(q.scalar_type()), dkv, dsink};
}

// The indexer kernels take bf16 q_idx/k_idx, fp32 w, H_I <= 64, d_I <= 128, int32-indexable
// sizes and windows both given or both absent (int, on the same device); d_I is zero-padded to
// a multiple of 8 here (a copy). Anything else goes to the composite, which raises the errors.
bool indexer_takes(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                   const c10::optional<at::Tensor>& ks, const c10::optional<at::Tensor>& ke) {
  const bool has_ks = ks.has_value() && ks->defined(), has_ke = ke.has_value() && ke->defined();
  if (q_idx.dim() != 3 || k_idx.dim() != 2 || w.dim() != 2) return false;
  const int64_t s_q = q_idx.size(0), h = q_idx.size(1), d = q_idx.size(2), s_kv = k_idx.size(0);
  return q_idx.scalar_type() == at::kBFloat16 && k_idx.scalar_type() == at::kBFloat16 &&
         w.scalar_type() == at::kFloat && k_idx.size(1) == d && w.size(0) == s_q &&
         w.size(1) == h && h <= indexer_max_heads() && d <= indexer_max_dim() &&
         s_q <= INT32_MAX && s_kv <= INT32_MAX - 128 && k_idx.device() == q_idx.device() &&
         w.device() == q_idx.device() && has_ks == has_ke &&
         (!has_ks || (window_ok(ks, s_q, q_idx.device()) && window_ok(ke, s_q, q_idx.device())));
}

struct IndexerArgs {
  at::Tensor q, k, w, ks, ke;  // contiguous; q/k padded to d_pad; ks/ke int64 or undefined
  int64_t s_q, h, d, d_pad, s_kv;
};

IndexerArgs indexer_args(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
                         const c10::optional<at::Tensor>& ks, const c10::optional<at::Tensor>& ke) {
  IndexerArgs a;
  a.s_q = q_idx.size(0);
  a.h = q_idx.size(1);
  a.d = q_idx.size(2);
  a.s_kv = k_idx.size(0);
  a.d_pad = (a.d + 7) / 8 * 8;
  a.q = a.d_pad == a.d ? q_idx.contiguous() : at::constant_pad_nd(q_idx, {0, a.d_pad - a.d}).contiguous();
  a.k = a.d_pad == a.d ? k_idx.contiguous() : at::constant_pad_nd(k_idx, {0, a.d_pad - a.d}).contiguous();
  a.w = w.contiguous();
  if (ks.has_value() && ks->defined()) {
    a.ks = ks->to(at::kLong).contiguous();
    a.ke = ke->to(at::kLong).contiguous();
  }
  return a;
}

at::Tensor indexer_scores_cuda(const at::Tensor& q_idx, const at::Tensor& k_idx,
                               const at::Tensor& w, const c10::optional<at::Tensor>& ks,
                               const c10::optional<at::Tensor>& ke) {
  if (!indexer_takes(q_idx, k_idx, w, ks, ke))
    return dsa::optimized::kernels::indexer_scores(q_idx, k_idx, w, ks, ke);
  const c10::DeviceGuard guard(q_idx.device());
  const IndexerArgs a = indexer_args(q_idx, k_idx, w, ks, ke);
  at::Tensor out = at::empty({a.s_q, a.s_kv}, a.w.options());
  indexer_scores_device(reinterpret_cast<const uint16_t*>(a.q.data_ptr()),
                        reinterpret_cast<const uint16_t*>(a.k.data_ptr()), a.w.data_ptr<float>(),
                        a.ks.defined() ? a.ks.data_ptr<int64_t>() : nullptr,
                        a.ke.defined() ? a.ke.data_ptr<int64_t>() : nullptr, a.s_q, a.h, a.d_pad,
                        a.s_kv, out.data_ptr<float>(), current_stream(q_idx.device()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> indexer_scores_backward_cuda(
    const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w,
    const at::Tensor& d_scores, const c10::optional<at::Tensor>& ks,
    const c10::optional<at::Tensor>& ke) {
  if (!indexer_takes(q_idx, k_idx, w, ks, ke) || d_scores.scalar_type() != at::kFloat ||
      d_scores.dim() != 2 || d_scores.size(0) != q_idx.size(0) ||
      d_scores.size(1) != k_idx.size(0) || d_scores.device() != q_idx.device())
    return dsa::optimized::kernels::indexer_scores_backward(q_idx, k_idx, w, d_scores, ks, ke);
  const c10::DeviceGuard guard(q_idx.device());
  const IndexerArgs a = indexer_args(q_idx, k_idx, w, ks, ke);
  const at::Tensor ds = d_scores.contiguous();
  at::Tensor dq = at::empty({a.s_q, a.h, a.d_pad}, a.q.options());
  at::Tensor dk = at::empty({a.s_kv, a.d_pad}, a.k.options());
  at::Tensor dw = at::empty({a.s_q, a.h}, a.w.options());
  indexer_scores_backward_device(
      reinterpret_cast<const uint16_t*>(a.q.data_ptr()),
      reinterpret_cast<const uint16_t*>(a.k.data_ptr()), a.w.data_ptr<float>(),
      a.ks.defined() ? a.ks.data_ptr<int64_t>() : nullptr,
      a.ke.defined() ? a.ke.data_ptr<int64_t>() : nullptr, ds.data_ptr<float>(), a.s_q, a.h,
      a.d_pad, a.s_kv, reinterpret_cast<uint16_t*>(dq.data_ptr()),
      reinterpret_cast<uint16_t*>(dk.data_ptr()), dw.data_ptr<float>(),
      current_stream(q_idx.device()));
  if (a.d_pad != a.d) {
    dq = dq.narrow(2, 0, a.d).contiguous();
    dk = dk.narrow(1, 0, a.d).contiguous();
  }
  return {dq, dk, dw};
}

}  // namespace

bool torch_ops_registered() { return true; }

}  // namespace dsa::cuda

TORCH_LIBRARY_IMPL(dsa, CUDA, m) {
  m.impl("topk_indices", &dsa::cuda::topk_indices_cuda);
  m.impl("sparse_mla_fwd", &dsa::cuda::sparse_mla_fwd_cuda);
  m.impl("sparse_mla_bwd", &dsa::cuda::sparse_mla_bwd_cuda);
  m.impl("indexer_scores", &dsa::cuda::indexer_scores_cuda);
  m.impl("indexer_scores_backward", &dsa::cuda::indexer_scores_backward_cuda);
}
