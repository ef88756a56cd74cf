// The first-order error a correct sparse MLA backward adds by recomputing P from its forward's
// fp32 lse with separately scaled fp32 logits (FlashAttention-2/3, FlashMLA-style backwards).
// Derivation and sources: local_bounds.h (sparse_mla_lse_recompute_terms), docs/SPEC.md §9.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dsa/contract/errors.h"
#include "dsa/oracle/local_bounds.h"

namespace dsa::oracle {

std::map<std::string, std::vector<double>> sparse_mla_lse_recompute_terms(
    const SparseMlaInputs& in, const Tensor& dout, std::map<std::string, std::vector<double>>* row_lse) {
  const char* where = "sparse_mla_lse_recompute_terms";
  check_arg(in.q.dim() == 3 && in.kv.dim() == 2 && in.kv.size(1) == in.q.size(2), where, "q/kv",
            shape_str(in.q.shape()) + " " + shape_str(in.kv.shape()), "[s_q,h_q,d_qk], [s_kv,d_qk]");
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), dqk = in.q.size(2), dv = in.d_v,
                s_kv = in.kv.size(0), k = in.indices.size(-1);
  check_arg(dv > 0 && dv <= dqk, where, "d_v", std::to_string(dv), "0 < d_v <= d_qk");
  check_arg(in.indices.size(0) == s_q && in.indices.numel() == s_q * k, where, "indices",
            shape_str(in.indices.shape()), "[s_q, k] or [s_q, 1, k]");
  check_arg(dout.numel() == s_q * h_q * dv, where, "dout", shape_str(dout.shape()), "[s_q, h_q, d_v]");
  constexpr double u = 0x1p-24;  // fp32 unit roundoff
  const std::vector<double> Q = in.q.to_f64(), KV = in.kv.to_f64(), dO = dout.to_f64();
  const std::vector<double> sink = in.attn_sink ? in.attn_sink->to_f64() : std::vector<double>{};
  const double sm = in.sm_scale, asm_ = std::abs(sm);
  std::vector<double> edq(static_cast<size_t>(s_q * h_q * dqk), 0.0),
      edkv(static_cast<size_t>(s_kv * dqk), 0.0), eds(static_cast<size_t>(in.attn_sink ? h_q : 0), 0.0);
  // per output row, the largest |L| among the query rows (t, h) that feed it
  std::vector<double> ldq(static_cast<size_t>(s_q * h_q), 0.0), ldkv(static_cast<size_t>(s_kv), 0.0),
      lds(eds.size(), 0.0);
  std::vector<int64_t> ids;
  std::vector<double> P, p, g, w;
  for (int64_t t = 0; t < s_q; ++t) {
    valid_slot_ids(in, t, ids);
    const size_t n = ids.size();
    if (n == 0) continue;  // SPEC §6: exact zeros, nothing recomputed
    P.assign(n, 0.0);
    p.assign(n, 0.0);
    g.assign(n, 0.0);
    w.assign(n, 0.0);
    for (int64_t h = 0; h < h_q; ++h) {
      const double* q = &Q[static_cast<size_t>((t * h_q + h) * dqk)];
      const double* d = &dO[static_cast<size_t>((t * h_q + h) * dv)];
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < n; ++j) {
        const double* kv = &KV[static_cast<size_t>(ids[j] * dqk)];
        double s = 0, gj = 0;
        for (int64_t c = 0; c < dqk; ++c) s += q[c] * kv[c];
        for (int64_t c = 0; c < dv; ++c) gj += d[c] * kv[c];
        P[j] = sm * s;
        g[j] = gj;
        m = std::max(m, P[j]);
      }
      double S = 0;
      for (size_t j = 0; j < n; ++j) S += std::exp(P[j] - m);
      double L = m + std::log(S), sk = 0, fold = 0;
      bool sink_finite = false;
      if (in.attn_sink) {
        sk = sink[static_cast<size_t>(h)];
        if (sk == std::numeric_limits<double>::infinity()) continue;  // p_j = 0 exactly, p_sink = 1
        if (std::isfinite(sk)) {
          const double mm = std::max(L, sk);
          L = mm + std::log(std::exp(L - mm) + std::exp(sk - mm));
          sink_finite = true;
        }
      }
      if (!std::isfinite(L)) continue;
      if (sink_finite) fold = std::abs(L) + 1;
      const double aL = std::abs(L);
      ldq[static_cast<size_t>(t * h_q + h)] = aL;
      for (size_t j = 0; j < n; ++j) ldkv[static_cast<size_t>(ids[j])] = std::max(ldkv[static_cast<size_t>(ids[j])], aL);
      if (sink_finite) lds[static_cast<size_t>(h)] = std::max(lds[static_cast<size_t>(h)], aL);
      double delta = 0;
      for (size_t j = 0; j < n; ++j) {
        p[j] = std::exp(P[j] - L);
        delta += p[j] * g[j];
      }
      double* dqrow = &edq[static_cast<size_t>((t * h_q + h) * dqk)];
      for (size_t j = 0; j < n; ++j) {
        const double tau = u * (3 * std::abs(P[j]) + 3 * std::abs(L) + fold);
        const double dS = p[j] * (g[j] - delta);
        const double* kv = &KV[static_cast<size_t>(ids[j] * dqk)];
        double* ekv = &edkv[static_cast<size_t>(ids[j] * dqk)];
        for (int64_t c = 0; c < dqk; ++c) {
          dqrow[c] += asm_ * tau * std::abs(dS * kv[c]);
          ekv[c] += tau * (std::abs(sm * dS * q[c]) + (c < dv ? p[j] * std::abs(d[c]) : 0.0));
        }
      }
      if (sink_finite) {
        const double psink = std::exp(sk - L);
        eds[static_cast<size_t>(h)] += u * (3 * std::abs(sk) + 3 * std::abs(L) + fold) * psink * std::abs(delta);
      }
    }
  }
  std::map<std::string, std::vector<double>> out;
  out["dq"] = std::move(edq);
  out["dkv"] = std::move(edkv);
  if (in.attn_sink) out["dsink"] = std::move(eds);
  if (row_lse) {
    row_lse->clear();
    (*row_lse)["dq"] = std::move(ldq);
    (*row_lse)["dkv"] = std::move(ldkv);
    if (in.attn_sink) (*row_lse)["dsink"] = std::move(lds);
  }
  return out;
}

}  // namespace dsa::oracle
