// A correct sparse MLA kernel of SPEC §4/§5 with a bf16 `out` rounded its own way, for the
// route tests (issue 12 item 7, F5): its forward returns out in q's dtype (bf16) with the
// elements whose exact value lies within 1/16 of a bf16 ulp of a rounding midpoint rounded to
// the other bf16 neighbour (one ulp off round-to-nearest: a real kernel's fp32 errors move such
// values across the midpoint, so its bf16 out differs from the baseline's there), and its
// backward takes Δ = out·dout from that out (SPEC §5: "a kernel may take Δ from its own bf16
// out, as the forward returned it"). Served in process and as a plugin
// (dsa_bf16_out_plugin, plugin/tests/bf16_out_plugin.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "dsa/oracle/backend.h"
#include "dsa/reference/sparse_mla.h"

namespace dsa::test {

class Bf16OwnRoundingKernel : public oracle::Backend {
 public:
  /// An element is rounded the other way when its exact value is within this fraction of the
  /// gap between its two bf16 neighbours from their midpoint.
  static constexpr double kNearMidpoint = 1.0 / 16;

  std::string name() const override { return "bf16-own-rounding"; }
  bool supports(oracle::Op op) const override {
    return op == oracle::Op::SparseMlaFwd || op == oracle::Op::SparseMlaBwd;
  }
  /// out [s_q, h_q, d_v] BF16 (q's dtype), lse and max_logits F32; float64 values before the
  /// roundings (reference::sparse_mla_forward).
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    const SparseMlaForward f = reference::sparse_mla_forward(in);
    Tensor out = f.out.to(DType::BF16);
    auto* bits = reinterpret_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < out.numel(); ++i) {
      const double exact = f.out.get(i), nearest = out.get(i);
      if (!std::isfinite(exact) || exact == nearest) continue;
      // bf16 is sign-magnitude: bits ± 1 moves |x| by one ulp, to the other neighbour.
      const uint16_t near_bits = bits[i];
      bits[i] = static_cast<uint16_t>(std::abs(nearest) > std::abs(exact) ? near_bits - 1 : near_bits + 1);
      const double other = out.get(i), half_gap = std::abs(other - nearest) / 2;
      if (!std::isfinite(other) || std::abs(exact - nearest) < half_gap * (1 - kNearMidpoint)) bits[i] = near_bits;
    }
    return SparseMlaForward{out, f.lse.to(DType::F32), f.max_logits.to(DType::F32)};
  }
  /// dq, dkv, dsink F32 in float64 with Δ from this kernel's own bf16 out (recomputed: the
  /// forward is deterministic, so it is the out the forward returned).
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    const Tensor out = sparse_mla_forward(in).out;
    const SparseMlaGrads g = reference::sparse_mla_backward(in, dout, reference::Precision::Reference, out);
    SparseMlaGrads r{g.dq.to(DType::F32), g.dkv.to(DType::F32), std::nullopt};
    if (g.dsink) r.dsink = g.dsink->to(DType::F32);
    return r;
  }
};

}  // namespace dsa::test
