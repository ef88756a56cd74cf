// The floors of local_bounds.cpp are fast (loops interchanged so that the innermost runs over
// contiguous heads or columns, rows in parallel, sums across rows per column in row order) but
// compute exactly what the straightforward loops compute: every term of every sum in the
// same order. The straightforward versions are kept here (*_scalar, the code as of issue 12)
// and both must give the same bytes, with 1 and 4 threads (issue 13). When the floors'
// formulas change, change these copies the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dsa/contract/dtype.h"
#include "dsa/contract/errors.h"
#include "dsa/contract/parallel.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/oracle/local_bounds.h"
#include "dsa/oracle/tolerances.h"

namespace dsa::oracle {
namespace {


constexpr double kU32 = 0x1p-24;  // unit roundoff of fp32 accumulation (SPEC §2, §5)
constexpr double kEta32 = 0x1p-150;  // half the fp32 subnormal spacing: the absolute error of a
                                     // probability that underflows (p_j far below 1)
constexpr double kEtaFtz = 0x1p-126;  // p_sink·Δ below fp32's normal range: flush-to-zero
                                      // kernels lose it whole
constexpr double kTiny32 = 0x1p-120;
constexpr double kFlipLambda = 3.0;

OutputFloor make(int64_t numel, int64_t row_len, std::string source) {
  OutputFloor f;
  f.row_len = std::max<int64_t>(1, row_len);
  f.acc.assign(static_cast<size_t>(numel), 0.0);
  f.narrow.assign(static_cast<size_t>(numel), 0.0);
  f.terms.assign(static_cast<size_t>(numel), 0.0);
  f.source = std::move(source);
  return f;
}

bool is_narrow(DType d) { return d == DType::BF16 || d == DType::F16; }

// One ulp of a 16-bit dtype with unit roundoff un at x, when a value within r of x may round
// to a different neighbour than x itself (a rounding midpoint lies in [x - r, x + r]); else 0.
double flip_ulp(double x, double r, double un) {
  if (!(un > 0) || !(r > 0)) return 0.0;
  int e = 0;
  std::frexp(std::max(std::abs(x), r), &e);
  const double ulp = std::ldexp(2 * un, e - 1);
  return std::floor((x - r) / ulp + 0.5) != std::floor((x + r) / ulp + 0.5) ? ulp : 0.0;
}

void require(bool ok, const char* where, const char* arg, const std::string& got,
             const std::string& expected) {
  check_arg(ok, where, arg, got, expected);
}

// The binade 2^floor(log2|x|) of a 16-bit rounding's half ulp (u16 times it), taken at |x|
// grown by 2^-6 and at least fp16's subnormal spacing 2^-14; 0 for x = 0. Written from its
// definition (ilogb), not from local_bounds.cpp's frexp form.
double half_ulp_binade(double x, bool f16) {
  if (x == 0) return 0.0;
  const double b = std::ldexp(1.0, std::ilogb(std::abs(x) * (1 + 0x1p-6)));
  return f16 ? std::max(b, 0x1p-14) : b;
}

// sum_error_scale, written again: max(√n|sum| + Σ|t|, sqrt(n·min(max(P, N), sqrt(sum² +
// ||t||₂²/2))² + ||t||₂²)).
double walk_scale(double n, double sum, double abs_sum, double sq_sum) {
  const double pos = 0.5 * (abs_sum + sum), neg = 0.5 * (abs_sum - sum);
  const double w = std::min(std::max(pos, neg), std::sqrt(sum * sum + 0.5 * sq_sum));
  return std::max(std::sqrt(n) * std::abs(sum) + abs_sum, std::sqrt(n * w * w + sq_sum));
}

CaseFloors sparse_mla_floors_scalar(const SparseMlaInputs& in, const Tensor* dout, DType work_dtype) {
  const char* where = "sparse_mla_floors";
  require(in.q.dim() == 3 && in.kv.dim() == 2 && in.kv.size(1) == in.q.size(2), where, "q/kv",
          shape_str(in.q.shape()) + " " + shape_str(in.kv.shape()), "[s_q,h_q,d_qk], [s_kv,d_qk]");
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), dqk = in.q.size(2), dv = in.d_v,
                s_kv = in.kv.size(0), k = in.indices.size(-1);
  require(dv > 0 && dv <= dqk, where, "d_v", std::to_string(dv), "0 < d_v <= d_qk");
  require(in.indices.size(0) == s_q, where, "indices", shape_str(in.indices.shape()), "[s_q, k]");
  if (dout)
    require(dout->numel() == s_q * h_q * dv, where, "dout", shape_str(dout->shape()),
            "[s_q, h_q, d_v]");
  const std::vector<double> Q = in.q.to_f64(), KV = in.kv.to_f64();
  const std::vector<double> dO = dout ? dout->to_f64() : std::vector<double>{};
  const std::vector<double> sink = in.attn_sink ? in.attn_sink->to_f64() : std::vector<double>{};
  const double u = kU32, un = is_narrow(work_dtype) ? unit_roundoff(work_dtype) : 0.0;
  const double sm = in.sm_scale, asm_ = std::abs(in.sm_scale);
  const double sdqk = std::sqrt(static_cast<double>(dqk)), sdv = std::sqrt(static_cast<double>(dv));

  // Per key j of row (t,h): e_j = √d_qk|P_j| + |sm|Σ_d|q_d kv_jd| is the rounding scale of its
  // own fp32 logit (independent across keys: added in quadrature), c_j = |P_j - m| + 1 that
  // of the max-subtraction and exp (added linearly). Softmax is shift invariant, so only
  // differences v_j - out enter (a row whose logits are all equal or that has one key is tight).
  OutputFloor fo = make(s_q * h_q * dv, dv,
                        "u(sqrt(Σ_j (p_j|v_jc-out_c|(e_j+c_j))^2) + √n|out_c| + Σ_j p_j|v_jc|), "
                        "e_j = |sm| S(q∘kv_j) >= √d_qk|P_j| + |sm|Σ|q kv_j|, c_j = max(|P_j-max|, |P_j-L|) + 1");
  if (un > 0)
    fo.source += " + u16 min(Σ_(j not max) f_j|p_j v_jc|, sqrt(Σ_(j not max) (w_j p_j v_jc)^2)) (P in "
                 "the 16-bit working dtype; f_j = min(1, 1/(2 exp(P_j - M'))) bounds b(e_j)/e_j, "
                 "w_j = min(2.574, 3.5 f_j): sub-Gaussian tail 2.1e-8, tolerances.cpp)";
  OutputFloor fl = make(s_q * h_q, 1,
                        "u(sqrt(Σ_j (p~_j(e_j+c_j))^2) + √n + |max| + |ln Σ exp(P-max)|)");
  OutputFloor fm = make(s_q * h_q, 1, "u·e_j of the keys within their error of the max");
  CaseFloors outf;
  OutputFloor fdq, fdkv, fds;
  std::vector<double> kv_q2, kv_val, kv_abs, kv_n2, kv_nsq, kv_nab;
  // tied rows' P parts per (key, p to 16 significant bits): (row, m·b(p)) in row order
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<size_t, double>>> ties;
  std::vector<int64_t> kv_n;
  std::vector<double> sk_q2, sk_val, sk_abs, sk_n2;
  std::vector<int64_t> sk_n;
  if (dout) {
    const std::string dsrc =
        "dS_j = p_j(g_j-Δ), g_j = dout·v_j; per key u p_j((e_j+c_j)|g_j-Δ| + √d_v|g_j| + "
        "Σ|dout v_j|) in quadrature, δL and δΔ common to the row";
    fdq = make(s_q * h_q * dqk, dqk,
               "|sm|(sqrt(Σ_j (kv_jc δdS_j)^2) + u ā|dq_c/sm| + δΔ|Σ_j p_j kv_jc| + "
               "u(√n|dq_c/sm| + Σ_j|dS_j kv_jc|)); " + dsrc);
    fdkv = make(s_kv * dqk, dqk,
                "sqrt(Σ over (t,h,j→s) of (|sm q_c|δdS_j + |dout_c|δp_j)^2) + u(√m|dkv| + "
                "Σ|terms|); " + dsrc);
    fds = make(h_q, 1, "sqrt(Σ_t (p_sink(u ā|Δ| + δΔ))^2) + u(√s_q|dsink| + Σ_t p_sink|Δ|); " + dsrc);
    for (OutputFloor* f : {&fdq, &fdkv, &fds}) f->narrow_delta.assign(f->narrow.size(), 0.0);
    if (un > 0) {
      for (OutputFloor* f : {&fdq, &fdkv, &fds})
        f->source += " + u16 terms (Δ from the 16-bit out, dS in the working dtype)";
      fdkv.source += "; dS_j, p_j rounded before dkv: u16 min(Σ b(dS_j)|sm q_c| + b(p_j)|dout_c|, "
                     "3.5 sqrt(Σ (b(dS_j) sm q_c)^2 + (b(p_j) dout_c)^2)) over (t,h,j→s), b(x) = "
                     "2^floor(log2|x|) (half an ulp = u16 b), a key's slots in a row coherent "
                     "(Higham & Mary 2019; 3.5: sub-Gaussian tail 2.1e-8); b(dS_j) in dq's "
                     "and dkv's terms at |dS_j| + p_j dshift, dshift = Σ_c |dout_c| u16 b(out_c) "
                     "+ δΔ16 (a 16-bit Δ's distance from the exact one)";
    }
    kv_q2.assign(static_cast<size_t>(s_kv * dqk), 0.0);
    kv_val = kv_abs = kv_n2 = kv_nsq = kv_nab = kv_q2;
    kv_n.assign(static_cast<size_t>(s_kv), 0);
    sk_q2.assign(static_cast<size_t>(h_q), 0.0);
    sk_val = sk_abs = sk_n2 = sk_q2;
    sk_n.assign(static_cast<size_t>(h_q), 0);
  }

  std::vector<int64_t> ids;
  std::vector<double> P, E, A, C, p, pt, g, dS, ind, dpj, outc, accout, narout, G_;
  std::vector<size_t> order;
  std::vector<double> wq, km;
  for (int64_t t = 0; t < s_q; ++t) {
    ids.clear();
    int64_t limit = k;
    if (in.topk_length) limit = std::min<int64_t>(limit, static_cast<int64_t>(in.topk_length->get(t)));
    for (int64_t j = 0; j < limit; ++j) {
      const double id = in.indices.get(t * k + j);
      if (id >= 0 && id < static_cast<double>(s_kv)) ids.push_back(static_cast<int64_t>(id));
    }
    const size_t n = ids.size();
    if (n == 0) continue;  // SPEC §6: exact zeros / ±inf, nothing to round
    // Duplicate slots of one key carry identical values and identical rounding errors: the
    // quadrature sums below take each key once, with its multiplicity (wq[j] = multiplicity
    // at its first slot, 0 at the others; km[j] = multiplicity at every slot).
    order.resize(n);
    for (size_t j = 0; j < n; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ids[a] < ids[b] || (ids[a] == ids[b] && a < b);
    });
    wq.assign(n, 0.0);
    km.assign(n, 0.0);
    // m identical terms summed in fp32 round coherently (not at random): up to u·m/2 of
    // their sum (Higham ch. 4); dupf = the largest multiplicity / 2 scales Σ|terms|.
    double dupf = 0.0;
    for (size_t g0 = 0; g0 < n;) {
      size_t g1 = g0;
      while (g1 < n && ids[order[g1]] == ids[order[g0]]) ++g1;
      wq[order[g0]] = static_cast<double>(g1 - g0);
      dupf = std::max(dupf, 0.5 * static_cast<double>(g1 - g0));
      for (size_t gi = g0; gi < g1; ++gi) km[order[gi]] = static_cast<double>(g1 - g0);
      g0 = g1;
    }
    const double sn = std::sqrt(static_cast<double>(n));
    for (auto* v : {&P, &E, &A, &C, &p, &pt, &g, &dS, &ind, &dpj}) v->resize(n);
    for (auto* v : {&outc, &accout, &narout}) v->resize(static_cast<size_t>(dv));
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t row = t * h_q + h;
      const double* q = &Q[static_cast<size_t>(row * dqk)];
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < n; ++j) {
        const double* kv = &KV[static_cast<size_t>(ids[j] * dqk)];
        double dot = 0, ad = 0, sq = 0;
        for (int64_t c = 0; c < dqk; ++c) {
          dot += q[c] * kv[c];
          ad += std::abs(q[c] * kv[c]);
          sq += (q[c] * kv[c]) * (q[c] * kv[c]);
        }
        P[j] = sm * dot;
        A[j] = asm_ * ad;
        E[j] = asm_ * walk_scale(static_cast<double>(dqk), dot, ad, sq);
        m = std::max(m, P[j]);
      }
      double S = 0;
      for (size_t j = 0; j < n; ++j) S += std::exp(P[j] - m);
      const double lse = m + std::log(S);
      double L = lse, psink = 0, sinkv = 0;
      bool sink_finite = false;
      if (in.attn_sink) {
        sinkv = sink[static_cast<size_t>(h)];
        if (sinkv == std::numeric_limits<double>::infinity()) {
          L = sinkv;
          psink = 1;
        } else if (std::isfinite(sinkv)) {
          const double mm = std::max(lse, sinkv);
          L = mm + std::log(std::exp(lse - mm) + std::exp(sinkv - mm));
          psink = std::exp(sinkv - L);
          sink_finite = true;
        }
      }
      const double sink_c = sink_finite ? std::abs(sinkv - m) + 1 : 0.0;
      // u·ā: first-order error of L = ln Σ exp (the row's normaliser): the keys' independent
      // logit/exp errors in quadrature, the sum of n terms, the sink's exp
      double abar2 = 0;
      for (size_t j = 0; j < n; ++j) {
        p[j] = std::isinf(L) ? 0.0 : std::exp(P[j] - L);
        pt[j] = std::exp(P[j] - lse);
        // exp(P_j - max) (forward) or exp(P_j - L) (backward): the argument's rounding and
        // the exp; exp(0) = 1 is exact
        C[j] = std::max(std::abs(P[j] - m), std::isfinite(L) ? std::abs(P[j] - L) : 0.0) +
               (P[j] != m ? 1 : 0);
        abar2 += (wq[j] * p[j] * (E[j] + C[j])) * (wq[j] * p[j] * (E[j] + C[j]));
      }
      const double abar = std::sqrt(abar2) + (n > 1 ? sn : 0.0) + psink * sink_c;
      // out's P rounding: f_j bounds b(e_j)/e_j (e_j >= exp(P_j - M'), M' = max(m, sink)), w_j
      // the key's weight in the quadrature
      // The kernel's logits lie within margin_j = 16u e_j (logit_max_margin_u; kv_rel_shift 0 here) of P_j: a max
      // key is rounded too where a key of another id may reach it (gap_j > 0)
      std::vector<double> fj(n), wj(n), margin(n);
      double top = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < n; ++j) {
        margin[j] = logit_max_margin_u() * u * E[j];
        top = std::max(top, P[j] + margin[j]);
      }
      const double mr = sink_finite ? std::max(top, sinkv) : top;
      for (size_t j = 0; j < n; ++j) {
        if (P[j] < m) {
          fj[j] = std::min(1.0, 0.5 * std::exp(mr - (P[j] - margin[j])));
        } else {
          double other = -std::numeric_limits<double>::infinity();
          for (size_t k2 = 0; k2 < n; ++k2)
            if (ids[k2] != ids[j]) other = std::max(other, P[k2] + margin[k2]);
          const double gap = other - (P[j] - margin[j]);
          fj[j] = gap > 0 && un > 0 ? std::min({1.0, 0.5 * std::exp(gap), std::expm1(gap) / un}) : 0.0;
        }
        wj[j] = std::min(quadrature_p16(), quadrature16() * fj[j]);
      }
      // out
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (size_t j = 0; j < n; ++j) o += p[j] * KV[static_cast<size_t>(ids[j] * dqk + c)];
        double x2 = 0, z = 0, zs = 0, w = 0, wabs = 0, zw = 0, zf = 0;
        for (size_t j = 0; j < n; ++j) {
          const double v = KV[static_cast<size_t>(ids[j] * dqk + c)];
          if (p[j] > 0 && p[j] < kTiny32) wabs += std::abs(v);
          const double xe = p[j] * std::abs(v - o) * (E[j] + C[j]);
          x2 += (wq[j] * xe) * (wq[j] * xe);
          w += p[j] * std::abs(v);
          if (P[j] < m) {
            z += (wq[j] * p[j] * v) * (wq[j] * p[j] * v);
            zs += std::abs(p[j] * v);
            const double ww = wj[j] * (wq[j] * p[j]);
            zw += (ww * v) * (ww * v);
            zf += std::abs(fj[j] * p[j] * v);
          }
        }
        for (size_t j = 0; j < n; ++j) {  // the max keys another key may displace, after the others
          if (P[j] < m || !(fj[j] > 0)) continue;
          const double v = KV[static_cast<size_t>(ids[j] * dqk + c)];
          const double ww = wj[j] * (wq[j] * p[j]);
          zw += (ww * v) * (ww * v);
          zf += std::abs(fj[j] * p[j] * v);
        }
        const size_t c_ = static_cast<size_t>(c);
        outc[c_] = o;
        accout[c_] = u * (std::sqrt(x2) + sn * std::abs(o) + (1 + dupf) * w + psink * std::abs(o) * sink_c) +
                     kEta32 * wabs;
        // P rounded to 16 bits: at most f_j u16 p_j|v_jc| each; their sum is at most Σ|.| and,
        // as independent roundings, within sqrt(Σ (w_j .)^2) (tail 2.1e-8)
        (void)z;
        (void)zs;
        narout[c_] = un * std::min(zf, std::sqrt(zw));
        const size_t e = static_cast<size_t>(row * dv + c);
        fo.acc[e] = accout[c_];
        fo.narrow[e] = narout[c_];
        fo.terms[e] = w;
      }
      // lse and max_logits (the forward's exps: m, or the sink while m's exp stays normal)
      const double mfwd = sink_finite && sinkv > m && sinkv - m <= 87 ? sinkv : m;
      double x2 = 0, emax = 0, tmax = 0;
      for (size_t j = 0; j < n; ++j) {
        const double cf = std::max(std::abs(P[j] - m), std::abs(P[j] - mfwd)) + (P[j] != m || mfwd != m ? 1 : 0);
        x2 += (wq[j] * pt[j] * (E[j] + cf)) * (wq[j] * pt[j] * (E[j] + cf));
        if (P[j] + logit_max_margin_u() * u * E[j] >= m) {
          emax = std::max(emax, E[j]);
          tmax = std::max(tmax, (sdqk * std::abs(P[j]) + A[j]) / (sdqk + 1));
        }
      }
      fl.acc[static_cast<size_t>(row)] = u * (std::sqrt(x2) + sn + dupf + std::abs(m) + std::abs(std::log(S)));
      fl.terms[static_cast<size_t>(row)] = 1 + std::max(tmax, std::abs(m));
      fm.acc[static_cast<size_t>(row)] = u * emax;
      fm.terms[static_cast<size_t>(row)] = std::max(tmax, std::abs(m));
      if (!dout) continue;
      // backward
      const double* dorow = &dO[static_cast<size_t>(row * dv)];
      double delta = 0, D = 0, dD2 = 0, nflip1 = 0, nflip2 = 0, nshift = 0;
      for (int64_t c = 0; c < dv; ++c) {
        const size_t c_ = static_cast<size_t>(c);
        delta += outc[c_] * dorow[c];
        D += std::abs(outc[c_] * dorow[c]);
        // the P·V sum of out_c (its logit part is below): independent across columns
        const double sv = (1 + dupf) * dorow[c] * fo.terms[static_cast<size_t>(row * dv + c)];
        const double se = dorow[c] * sn * outc[c_];
        dD2 += sv * sv + se * se;
        // the candidate's 16-bit out may round this column the other way than the
        // baseline's (both are within their errors of out): one ulp of Δ's term
        const double fl = std::abs(dorow[c]) *
                          flip_ulp(outc[c_], 2 * kFlipLambda * accout[c_] + 2 * narout[c_], un);
        nflip1 += fl;
        nflip2 += fl * fl;
        // rounding out_c to 16 bits moves Δ by up to |dout_c| half an ulp of out_c
        if (un > 0) nshift += std::abs(dorow[c]) * un * half_ulp_binade(outc[c_], work_dtype == DType::F16);
      }
      const double dD = u * std::sqrt(dD2);
      double dl2 = 0;  // Δ = Σ_j p_j g_j: its logit/exp part, independent per key
      double pg1 = 0, pg2 = 0;  // Δ's shift by the candidate's P rounding: keys below the max
      std::vector<double>& Gv = G_;
      Gv.resize(n);
      for (size_t j = 0; j < n; ++j) {
        const double* v = &KV[static_cast<size_t>(ids[j] * dqk)];
        double gj = 0, Gj = 0, gsq = 0;
        for (int64_t c = 0; c < dv; ++c) {
          gj += dorow[c] * v[c];
          Gj += std::abs(dorow[c] * v[c]);
          gsq += (dorow[c] * v[c]) * (dorow[c] * v[c]);
        }
        g[j] = gj;
        Gv[j] = Gj;
        dS[j] = p[j] * (gj - delta);
        // independent per key: its logit/exp error times |g_j - Δ| and its g_j dot error
        ind[j] = u * p[j] * ((1 - p[j]) * (E[j] + C[j]) * std::abs(gj - delta) +
                             walk_scale(static_cast<double>(dv), gj, Gj, gsq));
        // δp_j = p_j(δP_j - δL): key j's own error enters with weight 1 - p_j (a row with
        // one key, p = 1, has an exact softmax)
        const double own = km[j] * p[j] * (E[j] + C[j]);
        const double others = std::sqrt(std::max(0.0, abar2 - own * own)) +
                              (n > 1 ? sn : 0.0) + psink * sink_c;
        dpj[j] = u * p[j] * ((1 - p[j]) * (E[j] + C[j]) + others);
        const double le = p[j] * (E[j] + C[j]) * std::abs(gj - delta);
        dl2 += (wq[j] * le) * (wq[j] * le);
        if (P[j] < m) {
          const double pg = wq[j] * p[j] * gj;
          pg1 += std::abs(pg);
          pg2 += pg * pg;
        } else if (fj[j] > 0) {
          const double pg = fj[j] * wq[j] * p[j] * gj;
          pg1 += std::abs(pg);
          pg2 += pg * pg;
        }
      }
      // δΔ: from the logits, the P·V sums of out, and the out·dout dot (fp32).
      const double dDelta = u * (std::sqrt(dl2) + sdv * std::abs(delta) + D) + dD;
      // Δ from a 16-bit out: the baseline rounds its own out to the same dtype (SPEC §9), so
      // only the candidate's P rounding (one per key, shared by the columns) moves its out, and
      // Δ, further; and its columns may round the other way (flips: a flip follows the
      // candidate's shift, so their hard sum, the quadrature only beyond about 12 equal ones).
      const double nflip = std::min(nflip1, quadrature16() * std::sqrt(nflip2));
      const double nDelta = un > 0 ? un * std::min(pg1, quadrature16() * std::sqrt(pg2)) + nflip : 0.0;
      // a 16-bit Δ lies within dshift of the exact one: dS_j's binade at |dS_j| + p_j dshift
      const double dshift = nshift + nDelta;
      for (int64_t c = 0; c < dqk; ++c) {
        double x2c = 0, val = 0, ab = 0, pk = 0, nsq = 0, nab = 0, tt = 0, eta = 0;
        for (size_t j = 0; j < n; ++j) {
          const double kv = KV[static_cast<size_t>(ids[j] * dqk + c)];
          x2c += (wq[j] * ind[j] * kv) * (wq[j] * ind[j] * kv);
          val += dS[j] * kv;
          ab += std::abs(dS[j] * kv);
          pk += p[j] * kv;
          // dS_j rounded to the 16-bit dtype: half an ulp is u16 times its binade.
          const double b = half_ulp_binade(std::abs(dS[j]) + p[j] * dshift, work_dtype == DType::F16);
          nsq += (wq[j] * b * kv) * (wq[j] * b * kv);
          nab += std::abs(wq[j] * b * kv);
          tt += p[j] * (Gv[j] + D) * std::abs(kv);
          if (p[j] > 0 && p[j] < kTiny32) eta += (Gv[j] + D) * std::abs(kv);
        }
        const size_t e = static_cast<size_t>(row * dqk + c);
        fdq.acc[e] = asm_ * (std::sqrt(x2c) + u * abar * std::abs(val) + dDelta * std::abs(pk) +
                             u * (sn * std::abs(val) + (1 + dupf) * ab) + kEta32 * eta);
        fdq.narrow[e] = asm_ * (nDelta * std::abs(pk) + un * std::min(nab, quadrature16() * std::sqrt(nsq)));
        fdq.narrow_delta[e] = asm_ * (nDelta * std::abs(pk));
        fdq.terms[e] = asm_ * tt;
      }
      // a tied row (all p_j equal, p off the 16-bit grid): its keys' P roundings are shared
      // with the other rows tied at the same p
      if (un > 0 && n > 0) {
        const bool f16 = work_dtype == DType::F16;
        const double r16 = f16 ? static_cast<double>(f16_to_float(double_to_f16(p[0])))
                               : static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(p[0]))));
        bool tied = p[0] > 0 && r16 != p[0];
        for (size_t j = 1; j < n && tied; ++j) tied = p[j] == p[0];
        if (tied) {
          int ex = 0;
          const double fr = std::frexp(p[0], &ex);
          const int64_t bucket = static_cast<int64_t>(ex) * (int64_t{1} << 20) + std::llround(std::ldexp(fr, 16));
          for (size_t g0 = 0; g0 < n;) {
            size_t g1 = g0;
            while (g1 < n && ids[order[g1]] == ids[order[g0]]) ++g1;
            ties[{ids[order[g0]], bucket}].push_back(
                {static_cast<size_t>(row), static_cast<double>(g1 - g0) * half_ulp_binade(p[0], f16)});
            g0 = g1;
          }
        }
      }
      // dkv: this row's slots grouped by key. Within the row, the parts that come from
      // the row's common errors (δL, δΔ) add linearly over the slots of one key
      // (duplicates); the per-slot parts and different rows add in quadrature.
      for (size_t g0 = 0; g0 < n;) {
        size_t g1 = g0;
        while (g1 < n && ids[order[g1]] == ids[order[g0]]) ++g1;
        const int64_t s = ids[order[g0]];
        kv_n[static_cast<size_t>(s)] += static_cast<int64_t>(g1 - g0);
        for (int64_t c = 0; c < dqk; ++c) {
          const size_t e = static_cast<size_t>(s * dqk + c);
          const double qc = std::abs(q[c]);
          const double dc = c < dv ? dorow[c] : 0.0;
          double indep = 0, comm = 0, nsum = 0, r1 = 0, r2 = 0;  // linear within one key's slots
          for (size_t gi = g0; gi < g1; ++gi) {
            const size_t j = order[gi];
            const double own = E[j] + C[j];
            indep += asm_ * qc * ind[j] + std::abs(dc) * u * p[j] * (1 - p[j]) * own +
                                 (p[j] > 0 && p[j] < kTiny32
                                      ? kEta32 * (asm_ * (Gv[j] + D) * qc + std::abs(dc))
                                      : 0.0);
            comm += asm_ * qc * p[j] * (u * abar * std::abs(g[j] - delta) + dDelta) +
                    std::abs(dc) * (dpj[j] - u * p[j] * (1 - p[j]) * own);
            nsum += asm_ * qc * p[j] * nDelta;
            const double term1 = sm * dS[j] * q[c], term2 = p[j] * dc;
            kv_val[e] += term1 + term2;
            kv_abs[e] += (1 + dupf) * (std::abs(term1) + std::abs(term2));
            // dS_j, p_j rounded to 16 bits before dkv: half an ulp is u16 times the binade
            if (un > 0) {
              const bool f16 = work_dtype == DType::F16;
              r1 += asm_ * half_ulp_binade(std::abs(dS[j]) + p[j] * dshift, f16) * qc;
              r2 += half_ulp_binade(p[j], f16) * std::abs(dc);
            }
            fdkv.terms[e] += asm_ * p[j] * (Gv[j] + D) * qc + std::abs(term2);
          }
          kv_q2[e] += (indep + comm) * (indep + comm);
          kv_n2[e] += nsum * nsum;
          // one key's slots in the row are coherent
          kv_nsq[e] += r1 * r1 + r2 * r2;
          kv_nab[e] += r1 + r2;
        }
        g0 = g1;
      }
      if (in.attn_sink && psink > 0) {
        const size_t hh = static_cast<size_t>(h);
        ++sk_n[hh];
        // p_sink = exp(sink - L): its argument's rounding, the exp and L's error
        const double arg = sink_finite ? std::abs(sinkv - L) + 1 : 0.0;
        const double err = psink * (u * (arg + abar) * std::abs(delta) + dDelta) +
                           (psink < kTiny32 ? kEtaFtz * D : 0.0) +
                           // Δ's products and p_sink·Δ below the normal range (flush-to-zero);
                           // none for a sink of +inf (L = +inf: p_j, out and Δ are exact zeros)
                           (std::isfinite(L) && psink * D < 0x1p-100
                                ? kEtaFtz * static_cast<double>(1 + dv) : 0.0);
        sk_q2[hh] += err * err;
        sk_val[hh] -= psink * delta;
        sk_abs[hh] += psink * std::abs(delta);
        sk_n2[hh] += (psink * nDelta) * (psink * nDelta);
        fds.terms[hh] += psink * D;
      }
    }
  }
  fl.logit_scale = fm.logit_scale = true;
  for (OutputFloor* f : {&fo, &fl, &fm, &fdq, &fdkv, &fds}) f->work_dtype = is_narrow(work_dtype) ? work_dtype : DType::F32;
  outf["out"] = std::move(fo);
  outf["lse"] = std::move(fl);
  outf["max_logits"] = std::move(fm);
  if (dout) {
    for (const auto& [key, rws] : ties) {  // one rounding per group: (Σ a)^2 for Σ a^2
      if (rws.size() < 2) continue;
      for (int64_t c = 0; c < dv; ++c) {
        double s1 = 0, s2 = 0;
        for (const auto& [r, a] : rws) {
          const double x = a * std::abs(dO[r * static_cast<size_t>(dv) + static_cast<size_t>(c)]);
          s1 += x;
          s2 += x * x;
        }
        kv_nsq[static_cast<size_t>(key.first * dqk + c)] += s1 * s1 - s2;
      }
    }
    for (int64_t s = 0; s < s_kv; ++s) {
      const double sm_n = std::sqrt(static_cast<double>(kv_n[static_cast<size_t>(s)]));
      for (int64_t c = 0; c < dqk; ++c) {
        const size_t e = static_cast<size_t>(s * dqk + c);
        fdkv.acc[e] = std::sqrt(kv_q2[e]) + u * (sm_n * std::abs(kv_val[e]) + kv_abs[e]);
        fdkv.narrow[e] = std::sqrt(kv_n2[e]) + un * std::min(kv_nab[e], quadrature16() * std::sqrt(kv_nsq[e]));
        fdkv.narrow_delta[e] = std::sqrt(kv_n2[e]);
      }
    }
    for (int64_t h = 0; h < h_q; ++h) {
      const size_t hh = static_cast<size_t>(h);
      fds.acc[hh] = std::sqrt(sk_q2[hh]) +
                    u * (std::sqrt(static_cast<double>(sk_n[hh])) * std::abs(sk_val[hh]) + sk_abs[hh]);
      fds.narrow[hh] = fds.narrow_delta[hh] = std::sqrt(sk_n2[hh]);
    }
    outf["dq"] = std::move(fdq);
    outf["dkv"] = std::move(fdkv);
    if (in.attn_sink) outf["dsink"] = std::move(fds);
  }
  return outf;
}

CaseFloors indexer_scores_floors_scalar(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                 const KeyWindows& windows) {
  const char* where = "indexer_scores_floors";
  require(q_idx.dim() == 3 && k_idx.dim() == 2 && w.dim() == 2, where, "q_idx/k_idx/w",
          shape_str(q_idx.shape()) + " " + shape_str(k_idx.shape()) + " " + shape_str(w.shape()),
          "[s_q,H_I,d_I], [s_kv,d_I], [s_q,H_I]");
  const int64_t s_q = q_idx.size(0), H = q_idx.size(1), d = q_idx.size(2), s_kv = k_idx.size(0);
  require(windows.s_q() == s_q && windows.s_kv == s_kv, where, "windows",
          std::to_string(windows.s_q()) + " rows", std::to_string(s_q) + " rows");
  const std::vector<double> Q = q_idx.to_f64(), K = k_idx.to_f64(), W = w.to_f64();
  OutputFloor f = make(s_q * s_kv, s_kv,
                       "u(sqrt(Σ_j (w_j S(q_j∘k))^2) + S(w∘r)), S = sum_error_scale: max(√n|sum| + Σ|t|, sqrt(n min(max(P,N), sqrt(sum² + ||t||₂²/2))² + ||t||₂²))");
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = std::max<int64_t>(0, windows.ks[t]); s < std::min(s_kv, windows.ke[t]); ++s) {
      double dots2 = 0, val = 0, abs_sum = 0, sq_sum = 0, terms = 0;
      for (int64_t j = 0; j < H; ++j) {
        const double* q = &Q[static_cast<size_t>((t * H + j) * d)];
        const double* k = &K[static_cast<size_t>(s * d)];
        double dot = 0, ad = 0, sq = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += q[c] * k[c];
          ad += std::abs(q[c] * k[c]);
          sq += (q[c] * k[c]) * (q[c] * k[c]);
        }
        const double r = std::max(dot, 0.0), wj = W[static_cast<size_t>(t * H + j)];
        const double de = std::abs(wj) * walk_scale(static_cast<double>(d), dot, ad, sq);
        dots2 += de * de;
        val += wj * r;
        abs_sum += std::abs(wj * r);
        sq_sum += (wj * r) * (wj * r);
        terms += std::abs(wj) * ad;
      }
      const size_t e = static_cast<size_t>(t * s_kv + s);
      f.acc[e] = kU32 * (std::sqrt(dots2) + walk_scale(static_cast<double>(H), val, abs_sum, sq_sum));
      f.terms[e] = terms;
    }
  f.logit_scale = true;
  CaseFloors out;
  out["scores"] = std::move(f);
  return out;
}

CaseFloors indexer_backward_floors_scalar(const Tensor& q_idx, const Tensor& k_idx, const Tensor& w,
                                   const KeyWindows& windows, const Tensor& d_scores) {
  const char* where = "indexer_backward_floors";
  CaseFloors out = indexer_scores_floors_scalar(q_idx, k_idx, w, windows);
  out.erase("scores");
  const int64_t s_q = q_idx.size(0), H = q_idx.size(1), d = q_idx.size(2), s_kv = k_idx.size(0);
  require(d_scores.dim() == 2 && d_scores.size(0) == s_q && d_scores.size(1) == s_kv, where,
          "d_scores", shape_str(d_scores.shape()), "[s_q, s_kv]");
  const std::vector<double> Q = q_idx.to_f64(), K = k_idx.to_f64(), W = w.to_f64(),
                            G = d_scores.to_f64();
  OutputFloor dq = make(s_q * H * d, H * d,
                        "u S(dI w k_s) over active s, S = sum_error_scale (+ whole terms whose q·k may flip sign)");
  OutputFloor dk = make(s_kv * d, d,
                        "u S(dI w q) over active (t,j), S = sum_error_scale (+ whole terms whose q·k may flip sign)");
  OutputFloor dw = make(s_q * H, H, "u(sqrt(Σ_s (dI S(q∘k_s))^2) + S(dI r)), S = sum_error_scale");
  std::vector<double> dk_t(static_cast<size_t>(s_kv * d), 0.0), dk_amb(dk_t.size(), 0.0),
      dk_v(dk_t.size(), 0.0), dk_q2(dk_t.size(), 0.0);
  std::vector<int64_t> dk_n(static_cast<size_t>(s_kv), 0);
  std::vector<double> dq_t(static_cast<size_t>(d)), dq_amb(static_cast<size_t>(d)),
      dq_v(static_cast<size_t>(d)), dq_q2(static_cast<size_t>(d));
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t ks = std::max<int64_t>(0, windows.ks[t]), ke = std::min(s_kv, windows.ke[t]);
    for (int64_t j = 0; j < H; ++j) {
      const double* q = &Q[static_cast<size_t>((t * H + j) * d)];
      const double wj = W[static_cast<size_t>(t * H + j)];
      std::fill(dq_t.begin(), dq_t.end(), 0.0);
      std::fill(dq_amb.begin(), dq_amb.end(), 0.0);
      std::fill(dq_v.begin(), dq_v.end(), 0.0);
      std::fill(dq_q2.begin(), dq_q2.end(), 0.0);
      int64_t n_active = 0, n = 0;
      double w_dots2 = 0, w_val = 0, w_abs = 0, w_sq = 0, w_terms = 0;
      for (int64_t s = ks; s < ke; ++s) {
        const double g = G[static_cast<size_t>(t * s_kv + s)];
        if (!std::isfinite(g) || g == 0) continue;
        const double* k = &K[static_cast<size_t>(s * d)];
        double dot = 0, ad = 0, sq = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += q[c] * k[c];
          ad += std::abs(q[c] * k[c]);
          sq += (q[c] * k[c]) * (q[c] * k[c]);
        }
        ++n;
        const double dot_err = walk_scale(static_cast<double>(d), dot, ad, sq);
        const double de = std::abs(g) * dot_err;
        w_dots2 += de * de;
        w_val += g * std::max(dot, 0.0);
        w_abs += std::abs(g * std::max(dot, 0.0));
        w_sq += (g * std::max(dot, 0.0)) * (g * std::max(dot, 0.0));
        w_terms += std::abs(g) * ad;
        // An exact zero dot means grid inputs, where fp32 is exact too (ReLU'(0) = 0, §2).
        const bool amb = dot != 0 && std::abs(dot) <= 8 * kU32 * dot_err;
        if (!(dot > 0) && !amb) continue;
        ++n_active;
        ++dk_n[static_cast<size_t>(s)];
        const double coef = g * wj;
        for (int64_t c = 0; c < d; ++c) {
          const double tk = coef * k[c], tq = coef * q[c];
          const size_t cc = static_cast<size_t>(c), se = static_cast<size_t>(s * d + c);
          dq_t[cc] += std::abs(tk);
          dk_t[se] += std::abs(tq);
          dq_q2[cc] += tk * tk;
          dk_q2[se] += tq * tq;
          if (dot > 0) {
            dq_v[cc] += tk;
            dk_v[se] += tq;
          }
          if (amb) {
            dq_amb[cc] += std::abs(tk);
            dk_amb[se] += std::abs(tq);
          }
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        const size_t e = static_cast<size_t>((t * H + j) * d + c), cc = static_cast<size_t>(c);
        dq.acc[e] = kU32 * walk_scale(static_cast<double>(n_active), dq_v[cc], dq_t[cc], dq_q2[cc]) + dq_amb[cc];
        dq.terms[e] = dq_t[cc];
      }
      const size_t e = static_cast<size_t>(t * H + j);
      dw.acc[e] = kU32 * (std::sqrt(w_dots2) + walk_scale(static_cast<double>(n), w_val, w_abs, w_sq));
      dw.terms[e] = w_terms;
    }
  }
  for (int64_t s = 0; s < s_kv; ++s)
    for (int64_t c = 0; c < d; ++c) {
      const size_t e = static_cast<size_t>(s * d + c);
      dk.acc[e] = kU32 * walk_scale(static_cast<double>(dk_n[static_cast<size_t>(s)]), dk_v[e], dk_t[e], dk_q2[e]) +
                  dk_amb[e];
      dk.terms[e] = dk_t[e];
    }
  out["dq_idx"] = std::move(dq);
  out["dk_idx"] = std::move(dk);
  out["dw"] = std::move(dw);
  return out;
}

CaseFloors kl_floors_scalar(const IndexerKlInputs& in) {
  const char* where = "kl_floors";
  require(in.scores.dim() == 2 && in.q.dim() == 3 && in.kv.dim() == 2, where, "scores/q/kv",
          shape_str(in.scores.shape()) + " " + shape_str(in.q.shape()) + " " +
              shape_str(in.kv.shape()),
          "[s_q,s_kv], [s_q,h_q,d_qk], [s_kv,d_qk]");
  const int64_t s_q = in.scores.size(0), s_kv = in.scores.size(1), h_q = in.q.size(1),
                d = in.q.size(2);
  const std::vector<double> I = in.scores.to_f64(), Q = in.q.to_f64(), KV = in.kv.to_f64();
  const double u = kU32, asm_ = std::abs(in.sm_scale), sd = std::sqrt(static_cast<double>(d));
  // Key set S_t (SPEC §7): window keys (dense) or valid selected ids in the window (sparse),
  // without keys whose indexer score is -inf.
  auto key_set = [&](int64_t t, std::vector<int64_t>& S) {
    S.clear();
    const int64_t ks = std::max<int64_t>(0, in.windows.ks[t]), ke = std::min(s_kv, in.windows.ke[t]);
    if (in.mode == KlMode::Dense) {
      for (int64_t s = ks; s < ke; ++s) S.push_back(s);
    } else if (in.indices) {
      const int64_t k = in.indices->size(-1);
      for (int64_t j = 0; j < k; ++j) {
        const double id = in.indices->get(t * k + j);
        if (id >= ks && id < ke) S.push_back(static_cast<int64_t>(id));
      }
      std::sort(S.begin(), S.end());
      S.erase(std::unique(S.begin(), S.end()), S.end());
    }
    S.erase(std::remove_if(S.begin(), S.end(),
                           [&](int64_t s) {
                             return I[static_cast<size_t>(t * s_kv + s)] ==
                                    -std::numeric_limits<double>::infinity();
                           }),
            S.end());
  };
  std::vector<int64_t> S;
  int64_t n_rows = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    key_set(t, S);
    n_rows += S.empty() ? 0 : 1;
  }
  OutputFloor fd = make(s_q * s_kv, s_kv,
                        "|coeff|/n_rows(δp_s + δq_s): teacher logits a_hs as sparse MLA, student "
                        "u q_s(|I_s-max I| + 2 + √n + c_s + |I_s-max I| + b̄ + |lse I|), c_s = "
                        "|I_s|(1-q_s) + Σ_{i≠s} q_i|I_i| (scores scaled or shifted before the max)");
  OutputFloor fl = make(1, 1, "|coeff|/n_rows Σ_t Σ_s δp_s|ln p_s - ln q_s + 1| + p_s δln q_s "
                              "+ u√n_rows Σ_t|KL_t| + u(Σ_s |q_s - p_s|(|I_s| + |I_s - max I|) + "
                              "|lse I|) (scores scaled or shifted before the max)");
  CaseFloors out;
  if (n_rows == 0) {
    out["loss"] = std::move(fl);
    out["d_scores"] = std::move(fd);
    return out;
  }
  const double gabs = std::abs(in.coeff) / static_cast<double>(n_rows);
  double loss_acc = 0, loss_T = 0, loss_sum = 0;
  std::vector<double> kl_row(static_cast<size_t>(s_q), 0.0);
  std::vector<double> P, A, pi, p, dp, qs;
  for (int64_t t = 0; t < s_q; ++t) {
    key_set(t, S);
    const size_t n = S.size();
    if (n == 0) continue;
    const double sn = std::sqrt(static_cast<double>(n));
    p.assign(n, 0.0);
    dp.assign(n, 0.0);
    P.resize(n); A.resize(n); pi.resize(n); qs.resize(n);
    for (int64_t h = 0; h < h_q; ++h) {
      const double* q = &Q[static_cast<size_t>((t * h_q + h) * d)];
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < n; ++j) {
        const double* kv = &KV[static_cast<size_t>(S[j] * d)];
        double dot = 0, ad = 0;
        for (int64_t c = 0; c < d; ++c) {
          dot += q[c] * kv[c];
          ad += std::abs(q[c] * kv[c]);
        }
        P[j] = in.sm_scale * dot;
        A[j] = asm_ * ad;
        m = std::max(m, P[j]);
      }
      double Z = 0;
      for (size_t j = 0; j < n; ++j) Z += std::exp(P[j] - m);
      double abar = 0;
      for (size_t j = 0; j < n; ++j) {
        pi[j] = std::exp(P[j] - m) / Z;
        abar += pi[j] * ((sd + 1) * A[j] + std::abs(P[j] - m) + 1);
      }
      for (size_t j = 0; j < n; ++j) {
        const double aj = (sd + 1) * A[j] + std::abs(P[j] - m) + 1;
        p[j] += pi[j] / static_cast<double>(h_q);
        // δπ_j = π_j(δP_j - Σ_i π_i δP_i): one key gives an exact softmax
        dp[j] += u * pi[j] * ((1 - pi[j]) * aj + abar - pi[j] * aj) / static_cast<double>(h_q);
      }
    }
    double mI = -std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < n; ++j) mI = std::max(mI, I[static_cast<size_t>(t * s_kv + S[j])]);
    double ZI = 0;
    for (size_t j = 0; j < n; ++j) ZI += std::exp(I[static_cast<size_t>(t * s_kv + S[j])] - mI);
    double kl_acc = 0, kl = 0, kl_T = 0;
    {
      double k0 = 0;
      for (size_t j = 0; j < n; ++j) {
        const double Is = I[static_cast<size_t>(t * s_kv + S[j])];
        if (p[j] > 0) k0 += p[j] * (std::log(p[j]) - (Is - mI - std::log(ZI)));
      }
      kl_row[static_cast<size_t>(t)] = k0;
    }
    double bbar = 0;  // student: Σ_i q_i b_i, b_i = |I_i - max| + 1 (subtract, exp)
    double qabs = 0;  // Σ_i q_i |I_i|
    for (size_t j = 0; j < n; ++j) {
      const double Is = I[static_cast<size_t>(t * s_kv + S[j])];
      qs[j] = std::exp(Is - mI) / ZI;
      bbar += qs[j] * (std::abs(Is - mI) + (Is != mI ? 1 : 0));
      qabs += qs[j] * std::abs(Is);
    }
    // scores rounded before the max (local_bounds.cpp, kl_floors)
    const double lse_err = n > 1 ? std::abs(mI + std::log(ZI)) : 0.0;
    auto shift_err = [&](double Is, double q) {
      const double others = std::max(0.0, qabs - q * std::abs(Is));
      return std::abs(Is) * (1 - q) + others + std::abs(Is - mI) + bbar + lse_err;
    };
    double kl_shift = lse_err;
    for (size_t j = 0; j < n; ++j) {
      const double Is = I[static_cast<size_t>(t * s_kv + S[j])];
      const double lnq = Is - mI - std::log(ZI);
      const double bj = std::abs(Is - mI) + (Is != mI ? 1 : 0);  // exp(0) = 1 is exact
      // normalisations (heads, keys) of n > 1 terms; one key is exact
      dp[j] += u * p[j] * (1 - p[j]) * (2 * std::sqrt(static_cast<double>(h_q)) + sn);
      const double sh = shift_err(Is, qs[j]);
      const double dq = u * qs[j] * ((1 - qs[j]) * bj + bbar - qs[j] * bj + (n > 1 ? sn : 0.0) + sh);
      const size_t e = static_cast<size_t>(t * s_kv + S[j]);
      fd.acc[e] = gabs * (dp[j] + dq) + u * gabs * std::abs(qs[j] - p[j]);
      fd.terms[e] = gabs * (qs[j] + p[j]);
      // ln q_s = (I_s - max) - ln Z: the subtraction, Z's relative error, the log, the result
      const double dlnq0 = u * (std::abs(Is - mI) + bbar + (n > 1 ? sn : 0.0) +
                                std::abs(std::log(ZI)) + std::abs(lnq));
      const double lnp = p[j] > 0 ? std::log(std::max(p[j], dp[j])) : 0.0;
      // Σ_s δp_s = 0 (p is normalised), so δp_s enters with ln p_s - ln q_s - KL_t
      kl_acc += dp[j] * std::abs(lnp - lnq - kl_row[static_cast<size_t>(t)]) + p[j] * dlnq0;
      kl_shift += std::abs(qs[j] - p[j]) * (std::abs(Is) + std::abs(Is - mI));
      if (p[j] > 0) {
        kl += p[j] * (std::log(p[j]) - lnq);
        kl_T += p[j] * (std::abs(std::log(p[j])) + std::abs(lnq));
      }
    }
    loss_acc += kl_acc + u * kl_shift;
    loss_sum += std::abs(kl);
    loss_T += kl_T;
  }
  fl.acc[0] = gabs * (loss_acc + u * std::sqrt(static_cast<double>(n_rows)) * loss_sum);
  fl.terms[0] = gabs * loss_T;
  out["loss"] = std::move(fl);
  out["d_scores"] = std::move(fd);
  return out;
}

// Equal keys and, per output, equal row length, flags, source and bytes of every vector.
::testing::AssertionResult same_floors(const CaseFloors& a, const CaseFloors& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "different outputs";
  for (const auto& [name, x] : a) {
    auto it = b.find(name);
    if (it == b.end()) return ::testing::AssertionFailure() << name << " missing";
    const OutputFloor& y = it->second;
    if (x.row_len != y.row_len || x.logit_scale != y.logit_scale ||
        x.work_dtype != y.work_dtype || x.source != y.source)
      return ::testing::AssertionFailure() << name << ": row_len/flags/source differ";
    for (auto v : {&OutputFloor::acc, &OutputFloor::narrow, &OutputFloor::narrow_delta, &OutputFloor::terms}) {
      const std::vector<double>& p = x.*v;
      const std::vector<double>& q = y.*v;
      if (p.size() != q.size() ||
          (!p.empty() && std::memcmp(p.data(), q.data(), p.size() * sizeof(double)) != 0)) {
        size_t i = 0;
        while (i < std::min(p.size(), q.size()) && std::memcmp(&p[i], &q[i], sizeof(double)) == 0) ++i;
        return ::testing::AssertionFailure()
               << name << ": bytes differ at element " << i << " of " << p.size() << " ("
               << (i < p.size() ? p[i] : 0.0) << " vs " << (i < q.size() ? q[i] : 0.0) << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

struct ThreadsGuard {
  int saved = max_threads();
  ~ThreadsGuard() { set_max_threads(saved); }
};

OpCase golden_case(const std::string& name) {
  return op_case_from_fixture(
      fixtures::load_fixture(std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors"));
}

// The golden sparse MLA cases (duplicates, sinks, empty and invalid rows, topk_length, fp32 inputs, an
// extreme row), and smla_basic with q scaled by 64 (probabilities below 2^-120: the
// subnormal terms).
std::vector<std::pair<std::string, OpCase>> mla_cases() {
  std::vector<std::pair<std::string, OpCase>> out;
  for (const char* n : {"smla_basic", "smla_causal_topk", "smla_duplicates", "smla_empty_rows",
                        "smla_extreme_row_in_batch", "smla_invalid_mix", "smla_leading_padding",
                        "smla_sink", "smla_topk_length", "smla_fp32"})
    out.emplace_back(n, golden_case(n));
  OpCase big = golden_case("smla_basic");
  for (int64_t i = 0; i < big.mla.q.numel(); ++i) big.mla.q.set(i, 64 * big.mla.q.get(i));
  out.emplace_back("smla_basic q x64", big);
  // tied rows (one key in 3 slots, 128 heads, p = 1/3 on many of them): dkv's shared P roundings
  out.emplace_back("dups level 2", op_case_from_fixture(fixtures::load_fixture(
                                       std::string(DSA_GOLDEN_FIXTURE_DIR) +
                                       "/../../oracle/tests/data/flash_style_dkv_dups_level2_seed11.safetensors")));
  return out;
}

// smla_sink with its first 5 of 8 heads: a head count that is not a multiple of the 8 heads
// the dot loops keep in registers.
OpCase five_heads() {
  OpCase c = golden_case("smla_sink");
  const int64_t s_q = c.mla.q.size(0), h = c.mla.q.size(1), d = c.mla.q.size(2), dv = c.mla.d_v;
  auto slice = [&](const Tensor& x, int64_t width) {
    Tensor y(x.dtype(), {s_q, 5, width});
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t i = 0; i < 5 * width; ++i) y.set(t * 5 * width + i, x.get(t * h * width + i));
    return y;
  };
  c.mla.q = slice(c.mla.q, d);
  c.dout = slice(c.dout, dv);
  Tensor sink(c.mla.attn_sink->dtype(), {5});
  for (int64_t i = 0; i < 5; ++i) sink.set(i, c.mla.attn_sink->get(i));
  c.mla.attn_sink = sink;
  return c;
}

TEST(SparseMlaFloors, SameBytesAsTheStraightforwardLoops) {
  ThreadsGuard guard;
  set_max_threads(2);
  for (const auto& [name, c] : mla_cases()) {
    ASSERT_TRUE(c.dout.defined()) << name;
    for (DType work : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(name + " " + dtype_name(work));
      EXPECT_TRUE(same_floors(sparse_mla_floors(c.mla, nullptr, work),
                              sparse_mla_floors_scalar(c.mla, nullptr, work)));
      EXPECT_TRUE(same_floors(sparse_mla_floors(c.mla, &c.dout, work),
                              sparse_mla_floors_scalar(c.mla, &c.dout, work)));
    }
  }
}

// The 16-bit and the fp32-work floors computed together equal two separate computations.
TEST(SparseMlaFloors, WithF32SameBytesAsTwoCalls) {
  std::vector<std::pair<std::string, OpCase>> cases = mla_cases();
  cases.emplace_back("five heads", five_heads());
  for (const auto& [name, c] : cases) {
    SCOPED_TRACE(name);
    for (const Tensor* dout : {static_cast<const Tensor*>(nullptr), &c.dout}) {
      const auto both = sparse_mla_floors_and_f32(c.mla, dout, DType::BF16);
      EXPECT_TRUE(same_floors(both.first, sparse_mla_floors_scalar(c.mla, dout, DType::BF16)));
      EXPECT_TRUE(same_floors(both.second, sparse_mla_floors_scalar(c.mla, dout, DType::F32)));
    }
  }
}

TEST(SparseMlaFloors, FiveHeadsSameBytes) {
  const OpCase c = five_heads();
  for (DType work : {DType::BF16, DType::F32})
    EXPECT_TRUE(same_floors(sparse_mla_floors(c.mla, &c.dout, work),
                            sparse_mla_floors_scalar(c.mla, &c.dout, work)));
}

const char* const kIndexerCases[] = {"idx_causal", "idx_empty_windows", "idx_mtp",
                                     "idx_mtp_next_n3", "idx_prefix", "idx_varlen"};
const char* const kKlCases[] = {"kl_dense_causal", "kl_dense_neg_inf_scores", "kl_sparse_causal",
                                "kl_sparse_empty_windows"};

TEST(IndexerFloors, SameBytesAsTheStraightforwardLoops) {
  ThreadsGuard guard;
  set_max_threads(2);
  for (const char* n : kIndexerCases) {
    SCOPED_TRACE(n);
    const OpCase c = golden_case(n);
    EXPECT_TRUE(same_floors(indexer_scores_floors(c.q_idx, c.k_idx, c.w, c.windows),
                            indexer_scores_floors_scalar(c.q_idx, c.k_idx, c.w, c.windows)));
    EXPECT_TRUE(same_floors(
        indexer_backward_floors(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores),
        indexer_backward_floors_scalar(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores)));
  }
}

TEST(KlFloors, SameBytesAsTheStraightforwardLoops) {
  ThreadsGuard guard;
  set_max_threads(2);
  for (const char* n : kKlCases) {
    SCOPED_TRACE(n);
    const OpCase c = golden_case(n);
    EXPECT_TRUE(same_floors(kl_floors(c.kl), kl_floors_scalar(c.kl)));
  }
}

TEST(SparseMlaFloors, TheComparisonSeesOneUlp) {
  const OpCase c = golden_case("smla_sink");
  const CaseFloors a = sparse_mla_floors(c.mla, &c.dout, DType::BF16);
  for (const char* name : {"out", "dkv", "dsink"}) {
    CaseFloors b = a;
    double& x = b.at(name).acc.back();
    x = std::nextafter(x, std::numeric_limits<double>::infinity());
    EXPECT_FALSE(same_floors(a, b)) << name;
  }
}

// Issue 13: bytes do not depend on the thread count (rows in blocks of 4 x threads, so 1 and
// 4 threads also cut the rows differently).
TEST(ThreadCount, SparseMlaFloorsSameBytesWith1And4Threads) {
  ThreadsGuard guard;
  for (const char* n : {"smla_duplicates", "smla_sink"}) {
    const OpCase c = golden_case(n);
    set_max_threads(1);
    const CaseFloors one = sparse_mla_floors(c.mla, &c.dout, DType::BF16);
    set_max_threads(4);
    EXPECT_TRUE(same_floors(one, sparse_mla_floors(c.mla, &c.dout, DType::BF16))) << n;
  }
}

TEST(ThreadCount, IndexerAndKlFloorsSameBytesWith1And4Threads) {
  ThreadsGuard guard;
  for (const char* n : {"idx_varlen", "idx_causal"}) {
    const OpCase c = golden_case(n);
    set_max_threads(1);
    const CaseFloors s1 = indexer_scores_floors(c.q_idx, c.k_idx, c.w, c.windows);
    const CaseFloors b1 = indexer_backward_floors(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores);
    set_max_threads(4);
    EXPECT_TRUE(same_floors(s1, indexer_scores_floors(c.q_idx, c.k_idx, c.w, c.windows))) << n;
    EXPECT_TRUE(same_floors(b1, indexer_backward_floors(c.q_idx, c.k_idx, c.w, c.windows, c.d_scores)))
        << n;
  }
  for (const char* n : {"kl_dense_causal", "kl_sparse_causal"}) {
    const OpCase c = golden_case(n);
    set_max_threads(1);
    const CaseFloors one = kl_floors(c.kl);
    set_max_threads(4);
    EXPECT_TRUE(same_floors(one, kl_floors(c.kl))) << n;
  }
}

}  // namespace
}  // namespace dsa::oracle
