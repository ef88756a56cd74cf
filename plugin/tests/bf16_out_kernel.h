// A correct bf16 sparse MLA kernel of SPEC §4/§5 in the FlashAttention style, for the route
// tests (issue 12 item 7, F5): its forward computes the logits, the softmax and P·V in fp32 and
// rounds P = exp(logit - max) to bf16 before P·V (as FlashAttention and FlashMLA feed their PV
// matrix product), then returns out rounded once to bf16 (q's dtype). Its out therefore differs
// from the fp32 baseline's out rounded to bf16 in many elements (P's roundings move it by up to
// a few bf16 ulps), within the forward's local rule (the 16-bit working-dtype term). Its backward
// computes dq, dkv, dsink in float64 with Δ = out·dout from that bf16 out (SPEC §5: "a kernel may
// take Δ from its own bf16 out, as the forward returned it"), returned as fp32. Inputs: q and kv
// bf16 only (other dtypes: NotSupported; the plugin declares BF16 inputs only). Served in process
// and as a plugin (dsa_bf16_out_plugin, plugin/tests/bf16_out_plugin.cpp).
//
// Built with normalized_p, it rounds the normalized probabilities softmax(P) = P / sum to bf16
// before P·V instead (the max key's probability too: DeepSeek's inference model.py, most PyTorch
// kernels), the kernel of the declared rounding model normalized_p (SPEC §9, --normalized-p);
// served as plugins that declare it in rounding_models or not (bf16_out_plugin.cpp built with DSA_NORMALIZED_P=1).
//
// Until 2026-12-01 this kernel rounded the float64 out to bf16 and moved every element within
// 1/32 ulp of a rounding midpoint to the farther bf16 neighbour (up to 0.53 ulp off), claiming
// that a real kernel's fp32 errors move such values across the midpoint. They do not: a correct
// fp32 kernel's error is about u32 · √n · Σ|terms| (thousands of times smaller than 1/32 of a
// bf16 ulp, 2^-13 relative), so the forward rule rightly failed it (`dsa-verify audit --plugin
// ... --only smla.many_rows`: out 1.04x its bound, 8 elements about 0.006 ulp past a midpoint).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsa/contract/dtype.h"
#include "dsa/oracle/backend.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::test {

class Bf16FlashStyleKernel : public oracle::Backend {
 public:
  /// normalized_p: round softmax(P) (not exp(P - max)) to bf16 before P·V. It declares nothing
  /// itself (rounding_model() stays the default): the routes under test declare it.
  explicit Bf16FlashStyleKernel(bool normalized_p = false) : normalized_p_(normalized_p) {}
  std::string name() const override { return normalized_p_ ? "bf16-normalized-p" : "bf16-flash-style"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd;
  }
  /// out [s_q, h_q, d_v] BF16 (fp32 softmax and P·V with P rounded to bf16, out rounded once);
  /// lse and max_logits F32 rounded from float64 (reference::sparse_mla_forward). Throws
  /// oracle::NotSupported unless q and kv are BF16.
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    if (in.q.dtype() != DType::BF16 || in.kv.dtype() != DType::BF16)
      throw oracle::NotSupported("bf16-flash-style: q and kv must be BF16, got " + std::string(dtype_name(in.q.dtype())) +
                                 " and " + dtype_name(in.kv.dtype()));
    const SparseMlaForward f = reference::sparse_mla_forward(in);  // shapes checked, lse, max_logits
    const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d = in.q.size(2), d_v = in.d_v, s_kv = in.kv.size(0);
    const int64_t k = s_q > 0 ? in.indices.numel() / s_q : 0;
    const std::vector<double> q = in.q.to_f64(), kv = in.kv.to_f64();  // bf16 values: exact in fp32
    const float sm = static_cast<float>(in.sm_scale);
    auto bf16 = [](float x) { return bf16_to_float(float_to_bf16(x)); };
    std::vector<double> out(static_cast<size_t>(s_q * h_q * d_v), 0.0);
    for (int64_t t = 0; t < s_q; ++t) {
      std::vector<int64_t> ids;  // valid slots (SPEC §4): in [0, s_kv) and before topk_length
      const int64_t len = in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
        if (id >= 0 && id < s_kv && j < len) ids.push_back(id);
      }
      if (ids.empty()) continue;  // SPEC §6: out 0
      for (int64_t h = 0; h < h_q; ++h) {
        const double* qr = &q[static_cast<size_t>((t * h_q + h) * d)];
        std::vector<float> logit(ids.size()), p(ids.size());
        for (size_t j = 0; j < ids.size(); ++j) {
          float dot = 0;
          for (int64_t x = 0; x < d; ++x)
            dot += static_cast<float>(qr[x]) * static_cast<float>(kv[static_cast<size_t>(ids[j] * d + x)]);
          logit[j] = sm * dot;
        }
        const float m = *std::max_element(logit.begin(), logit.end());
        float sum = 0;
        for (size_t j = 0; j < ids.size(); ++j) sum += (p[j] = std::exp(logit[j] - m));
        // The sink scales out by exp(lse) / (exp(lse) + exp(sink)) (SPEC §4).
        float scale = 1;
        const double sink = in.attn_sink ? in.attn_sink->get(h) : -std::numeric_limits<double>::infinity();
        if (sink == std::numeric_limits<double>::infinity()) {
          scale = 0;
        } else if (std::isfinite(sink)) {
          const float lse = m + std::log(sum), s = static_cast<float>(sink), top = std::max(lse, s);
          scale = std::exp(lse - top) / (std::exp(lse - top) + std::exp(s - top));
        }
        for (int64_t c = 0; c < d_v; ++c) {
          float acc = 0;
          for (size_t j = 0; j < ids.size(); ++j)
            acc += bf16(normalized_p_ ? p[j] / sum : p[j]) * static_cast<float>(kv[static_cast<size_t>(ids[j] * d + c)]);
          out[static_cast<size_t>((t * h_q + h) * d_v + c)] = (normalized_p_ ? acc : acc / sum) * scale;
        }
      }
    }
    return SparseMlaForward{Tensor::from_f64({s_q, h_q, d_v}, out).to(DType::BF16), f.lse.to(DType::F32),
                            f.max_logits.to(DType::F32)};
  }
  /// dq, dkv, dsink F32 computed in float64 with Δ from this kernel's own bf16 out (recomputed:
  /// the forward is deterministic, so it is the out the forward returned).
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    const Tensor out = sparse_mla_forward(in).out;
    const SparseMlaGrads g = reference::sparse_mla_backward(in, dout, reference::Precision::Reference, out);
    SparseMlaGrads r{g.dq.to(DType::F32), g.dkv.to(DType::F32), std::nullopt};
    if (g.dsink) r.dsink = g.dsink->to(DType::F32);
    return r;
  }

 private:
  bool normalized_p_ = false;
};

}  // namespace dsa::test
