// FP8 sparse MLA kernels that round once more than FlashMLA where SPEC §4 leaves it free
// (the declared rounding models, RoundingModel, on sparse_mla_fp8_fwd), and a few-key decode
// case where that rounding shows. Shared by oracle/tests/fp8_p_rounding_test.cpp and the CLI
// route tests (cli/tests/routes_test.cpp). Tests only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dsa/contract/fp8.h"
#include "dsa/contract/fp8_op_types.h"
#include "dsa/contract/tensor.h"
#include "dsa/reference/sparse_mla_fp8.h"

namespace dsa::fp8_rounding {

inline float bf16(float x) {
  return static_cast<float>(Tensor::from_f64({1}, {static_cast<double>(x)}).to(DType::BF16).get(0));
}

// An FP8 sparse MLA kernel the SPEC §10 way: the read tokens dequantized as the reference does
// (fp8 · scale exact, reference::gather_sparse_mla_fp8), logits exact then fp32, softmax in
// fp32 (max, exps and their sum, the sink's exp in the sum), P·V accumulated in fp32, out
// rounded to bf16 once; lse and max_logits the reference's in fp32 (only out is at issue).
// `normalize`: p_j = exp(P_j - max) / Σ rounded to bf16 before P·V, the max key's too;
// otherwise FlashMLA's exp(P_j - max) rounded (the max key's exp(0) = 1 exact), the fp32 sum
// divided out at the end.
inline SparseMlaForward fp8_kernel(const SparseMlaFp8Inputs& in, bool normalize) {
  const SparseMlaInputs m = reference::gather_sparse_mla_fp8(in).inputs;
  const int64_t s_q = m.q.size(0), h_q = m.q.size(1), d = m.q.size(2), k = m.indices.size(-1),
                s_kv = m.kv.size(0), dv = m.d_v;
  const std::vector<double> q = m.q.to_f64(), kv = m.kv.to_f64();
  std::vector<double> out(static_cast<size_t>(s_q * h_q * dv), 0.0);
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = m.topk_length ? std::min<int64_t>(k, m.topk_length->get(t)) : k;
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t id = static_cast<int64_t>(m.indices.get(t * k + j));
      if (id >= 0 && id < s_kv) ids.push_back(id);
    }
    if (ids.empty()) continue;  // SPEC §6: out 0
    for (int64_t h = 0; h < h_q; ++h) {
      const double sink = m.attn_sink ? m.attn_sink->get(h) : -INFINITY;
      if (sink == INFINITY) continue;  // every probability 0
      std::vector<float> P(ids.size());
      for (size_t j = 0; j < ids.size(); ++j) {
        double dot = 0;
        for (int64_t x = 0; x < d; ++x)
          dot += q[static_cast<size_t>((t * h_q + h) * d + x)] * kv[static_cast<size_t>(ids[j] * d + x)];
        P[j] = static_cast<float>(m.sm_scale * dot);
      }
      const float mx = *std::max_element(P.begin(), P.end());
      float S = 0;
      for (float p : P) S += std::exp(p - mx);
      if (sink != -INFINITY) S += std::exp(static_cast<float>(sink) - mx);
      for (int64_t c = 0; c < dv; ++c) {
        float acc = 0;
        for (size_t j = 0; j < ids.size(); ++j) {
          const float e = std::exp(P[j] - mx);
          acc += bf16(normalize ? e / S : e) * static_cast<float>(kv[static_cast<size_t>(ids[j] * d + c)]);
        }
        out[static_cast<size_t>((t * h_q + h) * dv + c)] = normalize ? acc : acc / S;
      }
    }
  }
  const SparseMlaForward f = reference::sparse_mla_fp8_forward(in);
  return {Tensor::from_f64({s_q, h_q, dv}, out).to(DType::BF16), f.lse.to(DType::F32), f.max_logits.to(DType::F32)};
}

// The reference out rounded to bf16, then divided by the row's sink factor r, rounded to bf16,
// multiplied by r in fp32 and rounded again: a kernel that applies attn_sink after rounding out.
inline SparseMlaForward sink_after_rounding_kernel(const SparseMlaFp8Inputs& in) {
  const SparseMlaForward f = reference::sparse_mla_fp8_forward(in);
  const int64_t h_q = in.q.size(1), dv = f.out.size(2);
  std::vector<double> o = f.out.to_f64();
  for (size_t i = 0; i < o.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i) / dv;
    const double s = in.attn_sink ? in.attn_sink->get(row % h_q) : -INFINITY, l = f.lse.get(row);
    if (!std::isfinite(s) || !std::isfinite(l)) continue;  // one rounding (below)
    const float r = static_cast<float>(1.0 / (1.0 + std::exp(s - l)));
    o[i] = bf16(bf16(static_cast<float>(o[i] / r)) * r);
  }
  return {Tensor::from_f64(f.out.shape(), o).to(DType::BF16), f.lse.to(DType::F32), f.max_logits.to(DType::F32)};
}

// A decode case with 1 to 4 valid keys per row (topk_length 1..4 over 8 tokens), where the max
// key carries most of the probability: sinks 0.5 (head 0) and -inf (head 1), kv on [-0.5, 1.5),
// q on [-1, 1), sm_scale 1/√576 (logits of a few units). `rule`: the tile scales (Pow2: the
// baseline's bf16 dequantization is exact; Amax: it rounds).
inline SparseMlaFp8Inputs few_key_case(unsigned seed, Fp8ScaleRule rule) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t tokens = 8, s_q = 8, h_q = 2, k = 4, D = kMlaFp8Dqk;
  std::vector<double> kv(static_cast<size_t>(tokens * D)), q(static_cast<size_t>(s_q * h_q * D));
  for (auto& x : kv) x = u(rng) + 0.5;
  for (auto& x : q) x = u(rng);
  SparseMlaFp8Inputs in;
  in.q = Tensor::from_f64({s_q, h_q, D}, q).to(DType::BF16);
  in.kv_cache = encode_mla_fp8_cache(Tensor::from_f64({tokens, D}, kv), rule);
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k)), lens(static_cast<size_t>(s_q));
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(rng() % tokens);
    lens[static_cast<size_t>(t)] = static_cast<int32_t>(1 + t % k);
  }
  in.indices = Tensor::from_i32({s_q, k}, ids);
  in.topk_length = Tensor::from_i32({s_q}, lens);
  in.attn_sink = Tensor::from_f64({h_q}, {0.5, -INFINITY}).to(DType::F32);
  in.sm_scale = 1.0 / std::sqrt(static_cast<double>(D));
  return in;
}

}  // namespace dsa::fp8_rounding
