// The FlashAttention-style sparse MLA test kernel (flash_style_kernel.h).
#include "dsa/property_tests/flash_style_kernel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dsa/contract/dtype.h"

namespace dsa::props {
namespace {

// x rounded to d (one rounding to nearest even; F32: x).
float round_to(float x, DType d) {
  if (d == DType::BF16) return bf16_to_float(float_to_bf16(x));
  if (d == DType::F16) return f16_to_float(double_to_f16(x));
  return x;
}

// The fp32 sum of term(0..n-1) in `o` (sum_ordered without a vector of the terms).
template <class Term>
float sum_of(size_t n, SumOrder o, const Term& term) {
  float s = 0;
  if (o == SumOrder::Slot) {
    for (size_t i = 0; i < n; ++i) s += term(i);
  } else if (o == SumOrder::Reversed) {
    for (size_t i = n; i-- > 0;) s += term(i);
  } else {
    for (size_t b = 0; b < n; b += 4) {  // blocks of 4, then the block sums
      float blk = 0;
      for (size_t i = b; i < std::min(n, b + 4); ++i) blk += term(i);
      s += blk;
    }
  }
  return s;
}

}  // namespace

float sum_ordered(const std::vector<float>& t, SumOrder o) {
  return sum_of(t.size(), o, [&t](size_t i) { return t[i]; });
}

FlashStyleResult flash_style_sparse_mla(const SparseMlaInputs& in, const Tensor* dout, const FlashStyleOptions& o) {
  const auto rounded_if = [&o](bool on, float x) { return on ? round_to(x, o.work) : x; };
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), d = in.q.size(2), dv = in.d_v, s_kv = in.kv.size(0);
  const int64_t k = s_q > 0 ? in.indices.numel() / s_q : 0;
  const std::vector<double> Q = in.q.to_f64(), KV = in.kv.to_f64();
  const std::vector<double> dO = dout ? dout->to_f64() : std::vector<double>();
  const float sm = static_cast<float>(in.sm_scale);
  // FlashAttention-2/3's scale_softmax_log2 (one rounding of the double product) and log2e
  constexpr double kLog2e = 1.4426950408889634;
  const float sm_log2e = static_cast<float>(in.sm_scale * kLog2e), log2e_f = static_cast<float>(kLog2e);
  const auto kv = [&KV, d](int64_t id, int64_t x) { return static_cast<float>(KV[static_cast<size_t>(id * d + x)]); };
  std::vector<double> out(static_cast<size_t>(s_q * h_q * dv), 0.0), lse(static_cast<size_t>(s_q * h_q), INFINITY),
      mx(lse.size(), -INFINITY), dq(static_cast<size_t>(s_q * h_q * d), 0.0);
  std::vector<float> dkv(static_cast<size_t>(s_kv * d), 0.0f), dsink(static_cast<size_t>(h_q), 0.0f);
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<int64_t> ids;
    const int64_t len = in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
      if (id >= 0 && id < s_kv && j < len) ids.push_back(id);
    }
    const size_t n = ids.size();
    if (n == 0) continue;  // out 0, lse +inf, max -inf; no gradient
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t row = t * h_q + h;
      const double* q = &Q[static_cast<size_t>(row * d)];
      std::vector<float> P(n), e(n), sraw(n);
      for (size_t j = 0; j < n; ++j) {
        sraw[j] = sum_of(static_cast<size_t>(d), o.order,
                         [&](size_t x) { return static_cast<float>(q[x]) * kv(ids[j], static_cast<int64_t>(x)); });
        P[j] = sm * sraw[j];
      }
      const float m = *std::max_element(P.begin(), P.end());
      for (size_t j = 0; j < n; ++j) e[j] = std::exp(P[j] - m);
      const float S = sum_ordered(e, o.order);
      const float L0 = m + std::log(S);
      // the sink: an extra logit with a zero value vector (SPEC §4-§5)
      const float sk = in.attn_sink ? static_cast<float>(in.attn_sink->get(h)) : -INFINITY;
      float r = 1.0f, psink = 0.0f, L = L0;
      if (sk == INFINITY) {
        r = 0;
        psink = 1;
        L = INFINITY;
      } else if (sk != -INFINITY) {
        const float mm = std::max(L0, sk);
        L = mm + std::log(std::exp(L0 - mm) + std::exp(sk - mm));
        r = std::exp(L0 - L);
        psink = std::exp(sk - L);
      }
      lse[static_cast<size_t>(row)] = L0;
      mx[static_cast<size_t>(row)] = m;
      std::vector<float> pv(n), o_ret(static_cast<size_t>(dv));  // P for P·V; out as returned
      for (size_t j = 0; j < n; ++j)
        pv[j] = o.normalized_p ? round_to(std::isinf(L) ? 0.0f : std::exp(P[j] - L), o.work)
                               : rounded_if(o.round_p_before_pv, e[j]);
      if (o.liar_pmax_factor != 1.0f) pv[static_cast<size_t>(std::max_element(P.begin(), P.end()) - P.begin())] *= o.liar_pmax_factor;
      const float presink = r != 1.0f ? o.liar_presink_factor : 1.0f;
      for (int64_t c = 0; c < dv; ++c) {
        const float acc = sum_of(n, o.order, [&](size_t j) { return pv[j] * kv(ids[j], c); });
        // normalized P: out is the sum itself; the sink after rounding: o rounded first
        const float oc = o.normalized_p ? acc
                         : o.sink_after_rounding && r != 1.0f ? round_to(acc / S, o.out_dtype) * r
                                                              : acc / S * presink * r;
        out[static_cast<size_t>(row * dv + c)] = oc;
        o_ret[static_cast<size_t>(c)] = round_to(oc, o.out_dtype);
      }
      if (!dout) continue;
      const double* g = &dO[static_cast<size_t>(row * dv)];
      // Δ from the out this kernel returns
      const float delta = sum_of(static_cast<size_t>(dv), o.order, [&](size_t c) { return o_ret[c] * static_cast<float>(g[c]); });
      std::vector<float> p(n), dS(n), dSq(n);
      for (size_t j = 0; j < n; ++j) {
        p[j] = std::isinf(L) ? 0.0f
               : o.p_exp2_from_lse ? std::exp2(sraw[j] * sm_log2e - L * log2e_f)
                                   : std::exp(P[j] - L);
        const float dp = sum_of(static_cast<size_t>(dv), o.order, [&](size_t c) {
          return static_cast<float>(g[c]) * kv(ids[j], static_cast<int64_t>(c));
        });
        dS[j] = p[j] * (dp - delta);
        dSq[j] = rounded_if(o.round_ds_before_dq, dS[j]);
      }
      for (int64_t x = 0; x < d; ++x)
        dq[static_cast<size_t>(row * d + x)] = sm * sum_of(n, o.order, [&](size_t j) { return dSq[j] * kv(ids[j], x); });
      for (size_t i = 0; i < n; ++i) {
        const size_t j = o.dkv_reverse_slots ? n - 1 - i : i;
        const float dSk = rounded_if(o.round_before_dkv, dS[j]), pk = rounded_if(o.round_before_dkv, p[j]);
        for (int64_t x = 0; x < d; ++x) {
          float gx = sm * dSk * static_cast<float>(q[x]);
          if (x < dv) gx += pk * static_cast<float>(g[x]);
          dkv[static_cast<size_t>(ids[j] * d + x)] += gx;
        }
      }
      const float ps = o.p_exp2_from_lse && std::isfinite(L) && std::isfinite(sk)
                           ? std::exp2(sk * log2e_f - L * log2e_f) : psink;
      if (in.attn_sink) dsink[static_cast<size_t>(h)] -= ps * delta;
    }
  }
  FlashStyleResult res;
  res.fwd.out = Tensor::from_f64({s_q, h_q, dv}, out).to(o.out_dtype);
  res.fwd.lse = Tensor::from_f64({s_q, h_q}, lse).to(DType::F32);
  res.fwd.max_logits = Tensor::from_f64({s_q, h_q}, mx).to(DType::F32);
  if (!dout) return res;
  res.grads.dq = Tensor::from_f64({s_q, h_q, d}, dq).to(o.dq_dtype);
  res.grads.dkv = Tensor::from_f64({s_kv, d}, std::vector<double>(dkv.begin(), dkv.end())).to(DType::F32);
  if (in.attn_sink)
    res.grads.dsink = Tensor::from_f64({h_q}, std::vector<double>(dsink.begin(), dsink.end())).to(DType::F32);
  return res;
}

}  // namespace dsa::props
