// fresh16's FlashBwdF32 (a Python test backend of an outside tester) rebuilt in C++ for the
// lse-recompute tests (oracle/tests/lse_recompute_test.cpp, cli/tests/routes_test.cpp): an fp32
// FlashAttention-2/3-style sparse MLA whose backward recomputes
// p_j = exp2(fl(s_j·fl(sm·log2e)) - fl(L·fl(log2e))) from its forward's stored fp32 natural-log
// lse (SPEC §5 hands lse to the backward), P and dS in fp32, Δ from its own fp32 out
// (props::flash_style_sparse_mla with p_exp2_from_lse). A correct kernel: at |L| = 2^18 its p is
// off by about 2 % (u·|L|·log2e per rounding), which the floors alone do not hold (SPEC §9, "P
// recomputed from the forward's lse").
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dsa/contract/dtype.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/oracle/backend.h"
#include "dsa/property_tests/flash_style_kernel.h"

namespace dsa::test {

/// The extreme draws' layout (property_tests/src/generators.cpp, the "logit±2^18" rows of the
/// sparse MLA extreme case) at a fixed size, fp32 inputs (θ = 1e-4): q [6, 2, 32], kv [12, 32],
/// d_v 24, ids [6, 4], dout [6, 2, 24]; sm = 1/sqrt(32). Query rows 0, 1, 3, 5 ordinary (3 keys
/// among 1..9 and the hot key 0; values in (-1, 1), RoPE columns 24, 25 of q and kv ±100 or
/// (-1/64, 1/64) as the generator draws them); rows 2 and 4 one key each (dedicated key rows
/// 10, 11) at logit +2^18 and -2^18 through the last (RoPE) column: kv 256 there, q zero but that
/// column. With `sink`: attn_sink {-1, 0.5}. Deterministic (mt19937, seed 1602). The huge-logit
/// rows feed dq rows (t, h) of t = 2, 4, dkv rows 10, 11 and every dsink head.
inline fixtures::Fixture lse_extreme_draw_fixture(bool sink) {
  const int64_t s_q = 6, h_q = 2, d_qk = 32, d_v = 24, s_ord = 10, k = 4, cA = d_v, cB = d_v + 1, cH = d_qk - 1;
  const std::vector<int> kind = {0, 0, 1, 0, -1, 0};  // 0 ordinary, ±1 logit ±2^18
  const int64_t s_kv = s_ord + 2;
  const double sm = 1.0 / std::sqrt(static_cast<double>(d_qk));
  std::mt19937 rng(1602);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> q(static_cast<size_t>(s_q * h_q * d_qk)), kv(static_cast<size_t>(s_kv * d_qk)),
      dout(static_cast<size_t>(s_q * h_q * d_v));
  for (auto* v : {&q, &kv, &dout})
    for (double& x : *v) x = u(rng);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < h_q; ++h) {
      q[static_cast<size_t>((t * h_q + h) * d_qk + cA)] = u(rng) > 0 ? 100.0 : -100.0;
      q[static_cast<size_t>((t * h_q + h) * d_qk + cB)] = u(rng) / 64;
    }
  for (int64_t s = 0; s < s_ord; ++s) {
    kv[static_cast<size_t>(s * d_qk + cA)] = u(rng) / 64;
    kv[static_cast<size_t>(s * d_qk + cB)] = u(rng) > 0 ? 100.0 : -100.0;
  }
  std::vector<int32_t> ids(static_cast<size_t>(s_q * k), -1);
  int64_t dedicated = s_ord;
  for (int64_t t = 0; t < s_q; ++t) {
    const int kd = kind[static_cast<size_t>(t)];
    if (kd == 0) {
      for (int64_t j = 0; j < 3; ++j)
        ids[static_cast<size_t>(t * k + j)] = static_cast<int32_t>(1 + (3 * t + j) % (s_ord - 1));
      ids[static_cast<size_t>(t * k + 3)] = 0;  // the hot key
      continue;
    }
    ids[static_cast<size_t>(t * k + 1)] = static_cast<int32_t>(dedicated);
    kv[static_cast<size_t>(dedicated * d_qk + cH)] = 256.0;
    const double qv = std::ldexp(1.0, 18) / (sm * 256.0) * kd;
    for (int64_t h = 0; h < h_q; ++h)
      for (int64_t c = 0; c < d_qk; ++c) q[static_cast<size_t>((t * h_q + h) * d_qk + c)] = c == cH ? qv : 0.0;
    ++dedicated;
  }
  fixtures::Fixture f;
  f.case_name = sink ? "lse_extreme_draw_sink" : "lse_extreme_draw";
  f.op = "sparse_mla_fwd+bwd";
  f.producer = "flash_bwd_f32.h";
  f.params = {{"sm_scale", sm}, {"d_v", d_v}};
  f.inputs["q"] = Tensor::from_f64({s_q, h_q, d_qk}, q).to(DType::F32);
  f.inputs["kv"] = Tensor::from_f64({s_kv, d_qk}, kv).to(DType::F32);
  f.inputs["indices"] = Tensor::from_i32({s_q, k}, ids);
  if (sink) f.inputs["attn_sink"] = Tensor::from_f64({h_q}, {-1.0, 0.5}).to(DType::F32);
  f.inputs["dout"] = Tensor::from_f64({s_q, h_q, d_v}, dout).to(DType::F32);
  return f;
}

/// The kernel as a backend (sparse MLA forward and backward): P and dS fp32 (never rounded),
/// out and dq in q's dtype (BF16, F16 or F32; SPEC §4-§5), lse, max_logits, dkv, dsink fp32, Δ
/// from the out it returns (as fresh16's FlashBwdF32 takes Δ from its bf16 out). Its backward
/// recomputes its forward (out, lse) on the same inputs, as SPEC §5's caller would hand them
/// over. `exp2_from_lse` false: the same kernel with p_j = exp(P_j - L) from its own fp32
/// logits (the control, fresh16's BwdFromLse). Other q dtypes: oracle::NotSupported; otherwise
/// throws what props::flash_style_sparse_mla throws.
class FlashBwdF32Kernel : public oracle::Backend {
 public:
  explicit FlashBwdF32Kernel(bool exp2_from_lse = true) : exp2_(exp2_from_lse) {}
  std::string name() const override { return exp2_ ? "flash-bwd-exp2-f32" : "flash-bwd-exp-f32"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    return props::flash_style_sparse_mla(in, nullptr, options(in)).fwd;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return props::flash_style_sparse_mla(in, &dout, options(in)).grads;
  }

 private:
  props::FlashStyleOptions options(const SparseMlaInputs& in) const {
    const DType q = in.q.dtype();
    if (q != DType::BF16 && q != DType::F16 && q != DType::F32)
      throw oracle::NotSupported(name() + ": q must be BF16, F16 or F32, got " + dtype_name(q));
    props::FlashStyleOptions o;  // slot-order sums, P and dS fp32
    o.p_exp2_from_lse = exp2_;
    o.out_dtype = q;
    o.dq_dtype = q;
    return o;
  }
  bool exp2_;
};

}  // namespace dsa::test
