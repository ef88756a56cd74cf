// Sparse MLA forward and backward (SPEC §4-§6), one template on the accumulation type.
// Per query row t: gather the valid selected kv rows into Kg [n, d_qk], then
// P = sm_scale · Q_t Kg^T [h_q, n] and out = softmax(P) · Kg[:, :d_v] with Eigen GEMMs
// (the forward gathers long rows by slot blocks, with the same bytes: SlotBlocks).
#include "dsa/reference/sparse_mla.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "dsa/contract/parallel.h"
#include "internal.h"
#include "value_limits.h"

namespace dsa::reference {
namespace {

using detail::Mat;
using detail::Vec;

struct MlaDims {
  int64_t s_q, h_q, d_qk, d_v, s_kv, k;
};

MlaDims validate(const char* where, const SparseMlaInputs& in) {
  detail::check_rank3(where, "q", in.q, "[s_q, h_q, d_qk]");
  detail::check_activation_dtype(where, "q", in.q);
  MlaDims d{in.q.size(0), in.q.size(1), in.q.size(2), in.d_v, 0, 0};
  detail::check_rank2(where, "kv", in.kv, "[s_kv, d_qk]");
  detail::check_same_last_dim(where, "q", in.q, "kv", in.kv, "d_qk");
  detail::check_activation_dtype(where, "kv", in.kv);
  d.s_kv = in.kv.size(0);
  check_arg(in.d_v > 0 && in.d_v <= d.d_qk, where, "d_v", std::to_string(in.d_v),
            "0 < d_v <= d_qk = " + std::to_string(d.d_qk));
  check_arg(std::isfinite(in.sm_scale), where, "sm_scale", str(in.sm_scale), "a finite value");
  const bool idx_ok = (in.indices.dim() == 2 && in.indices.size(0) == d.s_q) ||
                      (in.indices.dim() == 3 && in.indices.size(0) == d.s_q &&
                       in.indices.size(1) == 1);
  check_arg(idx_ok, where, "indices", "shape " + shape_str(in.indices.shape()),
            "shape [" + std::to_string(d.s_q) + ", k] or [" + std::to_string(d.s_q) +
                ", 1, k]");
  check_dtype(where, "indices", in.indices, {DType::I32});
  d.k = in.indices.size(-1);
  if (in.topk_length) {
    check_shape(where, "topk_length", *in.topk_length, {d.s_q});
    check_dtype(where, "topk_length", *in.topk_length, {DType::I32});
  }
  if (in.attn_sink) {
    check_shape(where, "attn_sink", *in.attn_sink, {d.h_q});
    detail::check_wide_dtype(where, "attn_sink", *in.attn_sink);
    for (int64_t h = 0; h < d.h_q; ++h)
      check_arg(!std::isnan(in.attn_sink->get(h)), where, "attn_sink",
                "NaN at head " + std::to_string(h), "a non-NaN value (±inf allowed)");
  }
  return d;
}

/// Valid ids of row t in slot order (SPEC §4): 0 <= id < s_kv and slot < topk_length[t].
/// Duplicates are kept (separate terms).
void valid_ids(const SparseMlaInputs& in, const MlaDims& d, int64_t t, std::vector<int32_t>& ids) {
  ids.clear();
  const int32_t* row = in.indices.data<int32_t>() + t * d.k;
  int64_t limit = d.k;
  if (in.topk_length) limit = std::min<int64_t>(limit, in.topk_length->data<int32_t>()[t]);
  for (int64_t j = 0; j < limit; ++j)
    if (row[j] >= 0 && row[j] < d.s_kv) ids.push_back(row[j]);
}

/// Values the op reads (SPEC §6: no valid input may produce NaN; §4/§5/§9: fp32 logits and
/// accumulation). The q row of a row with a valid slot, the kv rows its valid slots address,
/// and (backward) its dout row and given out row are finite within FLT_MAX; each logit's terms
/// max(1, |sm_scale|) · Σ_d |q_d · kv_d| and (backward) each dout·v's Σ_c |dout_c · v_c| stay
/// within FLT_MAX. Rows and kv rows never read may hold anything (poisoned invalid ids). A
/// cheap bound (width · max|a| · max|b|) clears ordinary rows; the exact sums run only for the
/// rows it does not clear. Throws std::invalid_argument naming the argument and the limit.
void check_values(const char* where, const SparseMlaInputs& in, const MlaDims& d,
                  const Tensor* dout, const std::optional<Tensor>* out) {
  const double limit = detail::kFp32Max, scale = std::max(1.0, std::abs(in.sm_scale));
  const int64_t hd = d.h_q * d.d_qk, hv = d.h_q * d.d_v;
  std::vector<double> kvmax(static_cast<size_t>(d.s_kv), -1.0), vmax(static_cast<size_t>(d.s_kv), 0.0);
  std::vector<double> buf, a, b;
  std::vector<int32_t> ids;
  // Σ_c |x_c · y_c| over columns [0, w) of row i of `x` (width xw) and row j of `y` (width yw).
  auto terms = [&](const Tensor& x, int64_t i, int64_t xw, const Tensor& y, int64_t j, int64_t yw, int64_t w) {
    a.resize(static_cast<size_t>(w));
    b.resize(static_cast<size_t>(w));
    detail::convert_range<double>(x, a.data(), i * xw, i * xw + w);
    detail::convert_range<double>(y, b.data(), j * yw, j * yw + w);
    double sum = 0;
    for (int64_t c = 0; c < w; ++c) sum += std::abs(a[static_cast<size_t>(c)] * b[static_cast<size_t>(c)]);
    return sum;
  };
  for (int64_t t = 0; t < d.s_q; ++t) {
    valid_ids(in, d, t, ids);
    if (ids.empty()) continue;  // an empty row reads nothing (SPEC §6)
    auto why = [t] { return "row " + std::to_string(t) + " has a valid slot, SPEC §6"; };
    const double qm = detail::checked_max_abs(where, "q", in.q, t * hd, (t + 1) * hd, why, buf);
    double dm = 0;
    if (dout) dm = detail::checked_max_abs(where, "dout", *dout, t * hv, (t + 1) * hv, why, buf);
    if (out && *out) detail::checked_max_abs(where, "out", **out, t * hv, (t + 1) * hv, why, buf);
    double km = 0, vm = 0;
    for (int32_t s : ids) {
      double& m = kvmax[static_cast<size_t>(s)];
      if (m < 0) {
        m = detail::checked_max_abs(where, "kv", in.kv, s * d.d_qk, (s + 1) * d.d_qk,
                                    [s] { return "key " + std::to_string(s) + " is a valid slot's id, SPEC §6"; }, buf);
        double v = 0;
        for (int64_t c = 0; c < d.d_v; ++c) v = std::max(v, std::abs(buf[static_cast<size_t>(c)]));
        vmax[static_cast<size_t>(s)] = v;
      }
      km = std::max(km, m);
      vm = std::max(vm, vmax[static_cast<size_t>(s)]);
    }
    const bool logits_ok = scale * static_cast<double>(d.d_qk) * qm * km <= limit;
    const bool dv_ok = static_cast<double>(d.d_v) * dm * vm <= limit;
    if (logits_ok && dv_ok) continue;
    for (int64_t h = 0; h < d.h_q; ++h)
      for (int32_t s : ids) {
        if (!logits_ok) {
          const double x = scale * terms(in.q, t * d.h_q + h, d.d_qk, in.kv, s, d.d_qk, d.d_qk);
          if (!(x <= limit))
            check_arg(false, where, "q",
                    "row " + std::to_string(t) + " head " + std::to_string(h) + " against kv row " +
                        std::to_string(s) + ": max(1, |sm_scale|) · Σ_d |q_d · kv_d| = " + str(x),
                    "at most FLT_MAX = 3.40282e+38 (the logit sm_scale · q · kv is accumulated in "
                    "fp32, SPEC §4/§9; scale q, kv or sm_scale down)");
        }
        if (!dv_ok) {
          const double x = terms(*dout, t * d.h_q + h, d.d_v, in.kv, s, d.d_qk, d.d_v);
          if (!(x <= limit))
            check_arg(false, where, "dout",
                    "row " + std::to_string(t) + " head " + std::to_string(h) + " against kv row " +
                        std::to_string(s) + ": Σ_c |dout_c · v_c| = " + str(x),
                    "at most FLT_MAX = 3.40282e+38 (dout · v is accumulated in fp32, SPEC §5/§9)");
        }
      }
  }
}

/// Gradient sums past FLT_MAX (SPEC §5: dq, dkv and dsink are accumulated in fp32; §9: the
/// floor of each element is Σ|terms| of its sum). An fp32 kernel adds the terms of each
/// gradient element in its own order, so a partial sum can overflow to inf where the float64
/// sum cancels to a finite value (three rows adding +2e38, +2e38, -2e38 into one dkv element:
/// the reference holds 2e38, a kernel adding in row order inf); when Σ|terms| <= FLT_MAX no
/// partial sum in any order can. Per (row t, head h, valid slot j → key s), with
/// p_j = exp(P_j - L) (L with the sink, SPEC §5), a_j = Σ_c |dout_c · v_c|, b = Σ_c |out_c ·
/// dout_c| (Δ's terms; out as given, else the float64 forward's) and g_j = p_j (a_j + b) (the
/// terms of dS_j = p_j (dout·v_j - Δ)):
///   a_j + b, dq[t,h,c]: Σ_j |sm_scale| g_j |kv[s_j,c]|,
///   dkv[s,c]: Σ over (t, h, j → s) |sm_scale| g_j |q[t,h,c]| + (c < d_v) p_j |dout[t,h,c]|,
///   dsink[h]: Σ_t exp(sink[h] - L[t,h]) b[t,h]
/// must each be at most FLT_MAX. The error names the inputs that form the gradient, as the
/// float64 result guard does ('dout, q, kv, sm_scale'; dsink 'dout, q, kv, attn_sink'; dS
/// 'dout, out, kv'), with the element and the sum; the gradients are linear in dout, so
/// scaling dout down is always a fix. A cheap bound (Σ_j p_j
/// <= 1, |out| <= max|v| without a given out) clears ordinary inputs; the exact sums run only
/// when it does not. Called after check_values (every value read is finite). Throws
/// std::invalid_argument.
void check_gradient_terms(const char* where, const SparseMlaInputs& in, const MlaDims& d,
                          const Tensor& dout, const std::optional<Tensor>& out) {
  const double limit = detail::kFp32Max, sm = std::abs(in.sm_scale);
  const double dv = static_cast<double>(d.d_v), hq = static_cast<double>(d.h_q);
  const int64_t hd = d.h_q * d.d_qk, hv = d.h_q * d.d_v;
  std::vector<int32_t> ids;
  std::vector<double> buf;
  auto max_abs = [&](const Tensor& t, int64_t i0, int64_t i1) {
    buf.resize(static_cast<size_t>(i1 - i0));
    detail::convert_range<double>(t, buf.data(), i0, i1);
    double m = 0;
    for (double v : buf) m = std::max(m, std::abs(v));
    return m;
  };
  // Cheap bound: G_t = d_v · max|dout_t| · (max|v| + max|out_t|) >= a_j + b and >= Σ_j g_j.
  {
    std::vector<double> kvmax(static_cast<size_t>(d.s_kv), -1.0), vmax(static_cast<size_t>(d.s_kv), 0.0);
    std::vector<double> key_bound(static_cast<size_t>(d.s_kv), 0.0);
    double sink_bound = 0;
    bool ok = true;
    for (int64_t t = 0; t < d.s_q && ok; ++t) {
      valid_ids(in, d, t, ids);
      if (ids.empty()) continue;
      const double qm = max_abs(in.q, t * hd, (t + 1) * hd), dm = max_abs(dout, t * hv, (t + 1) * hv);
      double km = 0, vm = 0;
      for (int32_t s : ids) {
        double& m = kvmax[static_cast<size_t>(s)];
        if (m < 0) {
          m = max_abs(in.kv, s * d.d_qk, (s + 1) * d.d_qk);
          vmax[static_cast<size_t>(s)] = max_abs(in.kv, s * d.d_qk, s * d.d_qk + d.d_v);
        }
        km = std::max(km, m);
        vm = std::max(vm, vmax[static_cast<size_t>(s)]);
      }
      const double om = out ? max_abs(*out, t * hv, (t + 1) * hv) : vm;
      const double g = dv * dm * (vm + om);
      ok = g <= limit && sm * g * km <= limit;
      const double per_key = hq * (sm * g * qm + dm);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (int32_t s : ids) ok = ok && (key_bound[static_cast<size_t>(s)] += per_key) <= limit;
      if (in.attn_sink) ok = ok && (sink_bound += dv * om * dm) <= limit;
    }
    if (ok) return;
  }
  // The exact sums, in float64 (only for inputs the bound did not clear).
  const std::string fix = " (an fp32 kernel's partial sums can overflow to inf where the float64 sum is finite; "
                          "scale dout down)";
  // Named like the result guard (sparse_mla_backward): the inputs that form the gradient.
  auto fail = [&](const std::string& got, const char* grad, const char* args = "dout, q, kv, sm_scale") {
    check_arg(false, where, args, "values for which " + got,
              std::string("at most FLT_MAX = 3.40282e+38 (") + grad + " is accumulated in fp32, SPEC §5/§9" + ")" + fix);
  };
  std::vector<double> dkv_terms(static_cast<size_t>(d.s_kv * d.d_qk), 0.0), dsink_terms(static_cast<size_t>(d.h_q), 0.0);
  std::vector<double> q(static_cast<size_t>(d.d_qk)), go(static_cast<size_t>(d.d_v)), o(static_cast<size_t>(d.d_v));
  std::vector<double> kv, P, p, g;
  for (int64_t t = 0; t < d.s_q; ++t) {
    valid_ids(in, d, t, ids);
    if (ids.empty()) continue;
    const size_t n = ids.size();
    kv.resize(n * static_cast<size_t>(d.d_qk));
    for (size_t j = 0; j < n; ++j)
      detail::convert_range<double>(in.kv, kv.data() + j * d.d_qk, ids[j] * d.d_qk, (ids[j] + 1) * d.d_qk);
    P.resize(n);
    p.resize(n);
    g.resize(n);
    for (int64_t h = 0; h < d.h_q; ++h) {
      const int64_t r = t * d.h_q + h;
      detail::convert_range<double>(in.q, q.data(), r * d.d_qk, (r + 1) * d.d_qk);
      detail::convert_range<double>(dout, go.data(), r * d.d_v, (r + 1) * d.d_v);
      const double sink = in.attn_sink ? in.attn_sink->get(h) : -INFINITY;
      double m = sink;
      for (size_t j = 0; j < n; ++j) {
        double x = 0;
        for (int64_t c = 0; c < d.d_qk; ++c) x += q[static_cast<size_t>(c)] * kv[j * d.d_qk + c];
        P[j] = in.sm_scale * x;
        m = std::max(m, P[j]);
      }
      double ps = 0;
      if (sink == INFINITY) {
        std::fill(p.begin(), p.end(), 0.0);
        ps = 1;
      } else {
        double sum = sink == -INFINITY ? 0.0 : std::exp(sink - m);
        for (size_t j = 0; j < n; ++j) sum += (p[j] = std::exp(P[j] - m));
        for (size_t j = 0; j < n; ++j) p[j] /= sum;
        if (sink != -INFINITY) ps = std::exp(sink - m) / sum;
      }
      if (out) {
        detail::convert_range<double>(*out, o.data(), r * d.d_v, (r + 1) * d.d_v);
      } else {
        std::fill(o.begin(), o.end(), 0.0);
        for (size_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < d.d_v; ++c) o[static_cast<size_t>(c)] += p[j] * kv[j * d.d_qk + c];
      }
      double b = 0;
      for (int64_t c = 0; c < d.d_v; ++c) b += std::abs(o[static_cast<size_t>(c)] * go[static_cast<size_t>(c)]);
      const std::string at = "row " + std::to_string(t) + " head " + std::to_string(h);
      for (size_t j = 0; j < n; ++j) {
        double a = 0;
        for (int64_t c = 0; c < d.d_v; ++c) a += std::abs(go[static_cast<size_t>(c)] * kv[j * d.d_qk + c]);
        if (!(a + b <= limit))
          fail("dS of " + at + " against kv row " + std::to_string(ids[j]) +
                   " has Σ_c |dout_c · v_c| + Σ_c |out_c · dout_c| = " + str(a + b) + " (the terms of dout·v - Δ)",
               "dS = p (dout·v - Δ)", "dout, out, kv");
        g[j] = p[j] * (a + b);
      }
      for (int64_t c = 0; c < d.d_qk; ++c) {
        double x = 0;
        for (size_t j = 0; j < n; ++j) x += sm * g[j] * std::abs(kv[j * d.d_qk + c]);
        if (!(x <= limit))
          fail("dq[" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(c) +
                   "] has terms Σ_j |sm_scale · dS_j · kv[id_j, c]| = " + str(x) + " over " + std::to_string(n) +
                   " valid slots",
               "dq");
      }
      for (size_t j = 0; j < n; ++j) {
        double* row = dkv_terms.data() + static_cast<size_t>(ids[j]) * d.d_qk;
        for (int64_t c = 0; c < d.d_qk; ++c)
          row[c] += sm * g[j] * std::abs(q[static_cast<size_t>(c)]) + (c < d.d_v ? p[j] * std::abs(go[static_cast<size_t>(c)]) : 0.0);
      }
      dsink_terms[static_cast<size_t>(h)] += ps * b;
    }
  }
  for (int64_t i = 0; i < d.s_kv * d.d_qk; ++i)
    if (!(dkv_terms[static_cast<size_t>(i)] <= limit))
      fail("dkv[" + std::to_string(i / d.d_qk) + ", " + std::to_string(i % d.d_qk) +
               "] has terms Σ over the (row, head, slot) that add into it of |sm_scale · dS · q| + |p · dout| = " +
               str(dkv_terms[static_cast<size_t>(i)]),
           "dkv");
  if (in.attn_sink)
    for (int64_t h = 0; h < d.h_q; ++h)
      if (!(dsink_terms[static_cast<size_t>(h)] <= limit))
        fail("dsink[" + std::to_string(h) + "] has terms Σ_t exp(sink - L) · Σ_c |out_c · dout_c| = " +
                 str(dsink_terms[static_cast<size_t>(h)]),
             "dsink", "dout, q, kv, attn_sink");
}

/// Slot blocks of the forward's gathered keys (issue 13): a query row gathers k kv rows of
/// d_qk values (9.4 MiB at the glm5 shape in float64), far more than a core's L2 cache, and
/// with every core doing so the gather and the two GEMMs' reads of it compete for memory.
/// Blocks keep each thread's gathered keys in its L2 and give the same bytes as the
/// unblocked products (test SlotBlocks.*), because of how Eigen 3.4 computes a product into
/// a row-major destination: as the transposed column-major GEMM, the destination's columns
/// being the micro-kernel's rows (mr at a time, the last rows in smaller kernels), its depth
/// split in panels of kc (gebp adds each panel's sum into the destination, panel by panel).
///  - logits P = Q_t Kg^T [h_q, n]: column blocks of P (slots) of a multiple of mr, the last
///    block taking the remainder, give every slot the same micro-kernel, and the depth (d_qk)
///    panels do not depend on n: every logit is the same sum.
///  - out = P V [h_q, d_v], summed over slots: blocks equal to Eigen's own depth panels for
///    the unblocked product (kc from its blocking heuristic), added into out in order, are the
///    same sums as the one GEMM.
/// Products with one row or one column (Eigen's GEMV path) are never blocked.
template <class A>
struct SlotBlocks {
  static constexpr int64_t kMr = Eigen::internal::gebp_traits<A, A>::mr;
  /// Slots per logits block: 16 micro-kernel rows (64 in float64 with SSE2, mr 4: 288 KiB of
  /// gathered keys at d_qk 576).
  static constexpr int64_t kLogits = 16 * kMr;

  /// Whether the logits of an [h_q, n] row are computed by blocks.
  static bool logits_blocked(int64_t h_q, int64_t n) { return h_q > 1 && n >= 2 * kLogits; }

  /// Columns of out (and V) per P·V block for a panel of kc slots: about 1 MiB of V per
  /// block, a multiple of mr (blocks of this width, the last one taking the rest, at least
  /// mr wide: pv_column_blocks). Column blocks of out are the micro-kernel's rows: every
  /// element keeps its sum.
  static int64_t pv_columns(int64_t kc, int64_t d_v) {
    const int64_t fit = std::max<int64_t>(
        1, (int64_t{1} << 20) / (std::max<int64_t>(1, kc) * static_cast<int64_t>(sizeof(A))));
    const int64_t blocks = (d_v + fit - 1) / fit;
    const int64_t per = (d_v + blocks - 1) / blocks;
    return std::min(d_v, (per + kMr - 1) / kMr * kMr);
  }
  /// How many column blocks of width `bv` cover d_v (the last one, taking the rest, is at
  /// least mr wide or the only one).
  static int64_t pv_column_blocks(int64_t bv, int64_t d_v) {
    int64_t count = (d_v + bv - 1) / bv;
    if (count > 1 && d_v - (count - 1) * bv < kMr) --count;
    return count;
  }

  /// Eigen's depth panel for out [h_q, d_v] = P [h_q, n] · V [n, d_v]; n (one panel) for a
  /// GEMV-shaped product.
  static int64_t pv_panel(int64_t h_q, int64_t n, int64_t d_v) {
    if (h_q <= 1 || d_v <= 1) return n;
    // gemm_blocking_space of a row-major destination: m = its columns, n = its rows.
    Eigen::Index kc = n, mc = d_v, nc = h_q;
    Eigen::internal::computeProductBlockingSizes<A, A, 1, Eigen::Index>(kc, mc, nc, 1);
    return std::max<int64_t>(1, std::min<int64_t>(n, kc));
  }
};

/// Shared per-row state: the gathered keys and the logits with their row statistics.
template <class A>
struct RowSoftmax {
  Mat<A> Kg;     // [n, d_qk] gathered kv rows (compute() only)
  Mat<A> P;      // [h_q, n] logits, then probabilities
  Vec<A> m;      // [h_q] max logits
  Vec<A> lse;    // [h_q] natural-log sum exp
  Vec<A> r;      // [h_q] sink scale exp(lse) / (exp(lse) + exp(sink)); 1 without sink
  Vec<A> psink;  // [h_q] sink probability exp(sink - L); 0 without sink

  // Gathers kv rows `ids` into Kg, computes logits of Qt [h_q, d_qk] and softmax statistics;
  // leaves P = exp(P - lse) · r, i.e. the §5 probabilities p_j = exp(P_j - L).
  void compute(const detail::RowReader<A>& kv, int64_t d_qk, const Eigen::Ref<const Mat<A>>& Qt,
               const std::vector<int32_t>& ids, A sm_scale, const Vec<A>* sink) {
    const int64_t n = static_cast<int64_t>(ids.size());
    Kg.resize(n, d_qk);
    kv.gather(ids, 0, n, 0, d_qk, Kg.data());
    P.noalias() = Qt * Kg.transpose();
    normalize(sm_scale, sink);
  }

  // The same P and statistics as compute() (same bytes), gathering the keys by slot blocks
  // into `buf` (SlotBlocks) instead of keeping them all in Kg.
  void compute_blocked(const detail::RowReader<A>& kv, int64_t d_qk,
                       const Eigen::Ref<const Mat<A>>& Qt, const std::vector<int32_t>& ids,
                       A sm_scale, const Vec<A>* sink, std::vector<A>& buf) {
    const int64_t n = static_cast<int64_t>(ids.size());
    P.resize(Qt.rows(), n);
    const int64_t B = SlotBlocks<A>::kLogits;
    const int64_t blocks = n / B;  // >= 2 (SlotBlocks::logits_blocked)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t j0 = b * B, j1 = b + 1 == blocks ? n : j0 + B;  // the last takes the rest
      if (buf.size() < static_cast<size_t>((j1 - j0) * d_qk)) buf.resize(static_cast<size_t>((j1 - j0) * d_qk));
      kv.gather(ids, j0, j1, 0, d_qk, buf.data());
      const Eigen::Map<const Mat<A>> Kb(buf.data(), j1 - j0, d_qk);
      P.middleCols(j0, j1 - j0).noalias() = Qt * Kb.transpose();
    }
    normalize(sm_scale, sink);
  }

  // From logits P: max, lse, sink terms; P becomes the probabilities.
  void normalize(A sm_scale, const Vec<A>* sink) {
    P *= sm_scale;
    m = P.rowwise().maxCoeff();
    P.colwise() -= m;  // max-subtract: every row has a finite max (n > 0, finite inputs)
    P = P.array().exp().matrix();
    lse = m.array() + P.rowwise().sum().array().log();
    r.setOnes(P.rows());
    psink.setZero(P.rows());
    if (sink) {
      // Stable in both directions: sink = -inf gives r = 1, sink = +inf gives r = 0.
      r = (A(1) + (sink->array() - lse.array()).exp()).inverse();
      psink = (A(1) + (lse.array() - sink->array()).exp()).inverse();
    }
    // P currently holds exp(P - m); divide by Σ exp(P - m) = exp(lse - m), scale by r.
    const Vec<A> scale = r.array() * (m.array() - lse.array()).exp();
    P = scale.asDiagonal() * P;
  }
};

/// Flops of one query row's two GEMMs (the cost hint of the row loops).
double row_flops(const MlaDims& d) {
  return 2.0 * static_cast<double>(d.h_q) * static_cast<double>(d.k) *
         static_cast<double>(d.d_qk + d.d_v);
}

/// One query row of the forward in flight (a slot of the forward's ring): its ids, q rows at
/// A and logits / probabilities, shared by the workers that compute its units.
template <class A>
struct ForwardRow {
  std::vector<int32_t> ids;
  Mat<A> Qt;  // [h_q, d_qk] q rows of this query row at A
  RowSoftmax<A> rs;
  int64_t kc = 0, bv = 0;  // P·V depth panel and column-block width (SlotBlocks)
  size_t buf_size = 0;     // a worker's buf for this row's largest unit (one allocation)
};

/// A worker's own buffers, reused across units (no allocation per unit).
template <class A>
struct ForwardScratch {
  std::vector<A> buf;  // gathered keys of one slot block, or one V panel of a column block
  RowSoftmax<A> rs;    // rows computed whole (short rows)
};

/// Where a query row of the forward stands (guarded by the forward's schedule mutex; one per
/// row, so that a done row's slot can be reused before the rows below it are done).
struct RowProgress {
  int phase = 0;  // 0 starting, 1 logits, 2 normalising, 3 P·V, 4 done
  int64_t logit_units = 0, next_logit = 0, logits_done = 0;
  int64_t v_units = 0, next_v = 0, v_done = 0;
};

template <class A>
SparseMlaForward forward(const SparseMlaInputs& in, const MlaDims& d) {
  // q rows are converted per query row and kv rows as they are gathered, inside the
  // parallel row loop: no whole-tensor copies.
  const detail::RowReader<A> kv(in.kv, d.d_qk);
  Vec<A> sink;
  if (in.attn_sink) sink = detail::to_mat<A>(*in.attn_sink, d.h_q, 1);
  // Results are written in place into the output tensors, allocated without a fill: every
  // element is written below (out by the threads computing its row, so its pages are first
  // touched in parallel; issue 13).
  SparseMlaForward f{Tensor::for_overwrite(detail::out_dtype<A>(), {d.s_q, d.h_q, d.d_v}),
                     Tensor::for_overwrite(detail::out_dtype<A>(), {d.s_q, d.h_q}),
                     Tensor::for_overwrite(detail::out_dtype<A>(), {d.s_q, d.h_q})};
  auto out = detail::mat_view<A>(f.out, d.s_q * d.h_q, d.d_v);
  auto lse = detail::mat_view<A>(f.lse, d.s_q, d.h_q);
  auto mx = detail::mat_view<A>(f.max_logits, d.s_q, d.h_q);
  lse.setConstant(detail::inf<A>());
  mx.setConstant(-detail::inf<A>());
  if (d.s_q == 0) return f;
  const A sm = static_cast<A>(in.sm_scale);
  const Vec<A>* sk = in.attn_sink ? &sink : nullptr;
  using Blocks = SlotBlocks<A>;
  // Units of work (issue 13: rows split so that at the end no thread waits for another's
  // whole row): a long row (Blocks::logits_blocked) is started (ids, q rows), then its logits
  // computed by units of kLogitUnit slot blocks, normalised (one unit), and P·V computed by
  // column blocks of out (each adding Eigen's depth panels in order). Every element of P and
  // out is the same sum as when one thread computes the row (the same products, in the same
  // order), so the bytes do not depend on which thread runs a unit. A short row is one unit.
  constexpr int64_t kLogitUnit = 4;
  // Long rows have several units each: more workers than rows can share them (few rows,
  // e.g. decoding); short rows are one unit each.
  const int64_t threads =
      Blocks::logits_blocked(d.h_q, d.k) ? max_threads() : std::min<int64_t>(d.s_q, max_threads());
  // Rows in flight take ring slots from a stack, the slot freed last on top (as the
  // backward's): a starting row reuses the buffers the most likely still in cache, and only
  // as many slots are touched (allocated, first-touched) as rows are in flight at once.
  const int64_t slots = std::min<int64_t>(d.s_q, 2 * threads);  // rows in flight at most
  std::vector<ForwardRow<A>> rows(static_cast<size_t>(slots));
  std::vector<RowProgress> progress(static_cast<size_t>(d.s_q));
  std::vector<int64_t> slot_index(static_cast<size_t>(d.s_q), 0);  // row -> its slot (set at start)
  std::vector<int64_t> free_slots;  // a stack: the slot freed last on top
  for (int64_t i = slots - 1; i >= 0; --i) free_slots.push_back(i);
  auto row_of = [&](int64_t t) -> ForwardRow<A>& {
    return rows[static_cast<size_t>(slot_index[static_cast<size_t>(t)])];
  };
  auto prog_of = [&](int64_t t) -> RowProgress& { return progress[static_cast<size_t>(t)]; };

  // Starts row t: ids and q rows, and the unit counts in p; computes the whole row when it
  // is empty or short. Returns true when the row is done.
  auto start_row = [&](ForwardScratch<A>& s, int64_t t, RowProgress& p) {
    ForwardRow<A>& r = row_of(t);
    valid_ids(in, d, t, r.ids);
    auto out_t = out.middleRows(t * d.h_q, d.h_q);
    if (r.ids.empty()) {  // SPEC §6: out 0, lse +inf, max_logits -inf (set above)
      out_t.setZero();
      return true;
    }
    const int64_t n = static_cast<int64_t>(r.ids.size());
    r.Qt.resize(d.h_q, d.d_qk);
    detail::convert_range<A>(in.q, r.Qt.data(), t * d.h_q * d.d_qk, (t + 1) * d.h_q * d.d_qk);
    if (!Blocks::logits_blocked(d.h_q, n) || d.d_v <= 1) {
      // Short rows (and GEMV-shaped products): the keys gathered whole, as always.
      s.rs.compute(kv, d.d_qk, r.Qt, r.ids, sm, sk);
      out_t.noalias() = s.rs.P * s.rs.Kg.leftCols(d.d_v);
      lse.row(t) = s.rs.lse.transpose();
      mx.row(t) = s.rs.m.transpose();
      return true;
    }
    r.rs.P.resize(d.h_q, n);
    r.kc = Blocks::pv_panel(d.h_q, n, d.d_v);
    r.bv = Blocks::pv_columns(r.kc, d.d_v);
    p.logit_units = (n / Blocks::kLogits + kLogitUnit - 1) / kLogitUnit;
    p.v_units = Blocks::pv_column_blocks(r.bv, d.d_v);
    // The largest logits block (the last, taking the rest) and the largest V panel (the last
    // column block may be wider): a worker's buf grows once to it, not block by block.
    const int64_t last_logits = n - (n / Blocks::kLogits - 1) * Blocks::kLogits;
    const int64_t widest = std::max(r.bv, d.d_v - (p.v_units - 1) * r.bv);
    r.buf_size = static_cast<size_t>(
        std::max(last_logits * d.d_qk, std::min(r.kc, n) * widest));
    return false;
  };
  // Logits of slot blocks [u·kLogitUnit, (u+1)·kLogitUnit) of row t (the row's last block
  // takes the rest of its slots, as in RowSoftmax::compute_blocked).
  auto logits_unit = [&](ForwardScratch<A>& s, int64_t t, int64_t u) {
    ForwardRow<A>& r = row_of(t);
    const int64_t n = static_cast<int64_t>(r.ids.size());
    const int64_t B = Blocks::kLogits, blocks = n / B;
    for (int64_t b = u * kLogitUnit; b < std::min(blocks, (u + 1) * kLogitUnit); ++b) {
      const int64_t j0 = b * B, j1 = b + 1 == blocks ? n : j0 + B;
      if (s.buf.size() < r.buf_size) s.buf.resize(r.buf_size);
      kv.gather(r.ids, j0, j1, 0, d.d_qk, s.buf.data());
      const Eigen::Map<const Mat<A>> Kb(s.buf.data(), j1 - j0, d.d_qk);
      r.rs.P.middleCols(j0, j1 - j0).noalias() = r.Qt * Kb.transpose();
    }
  };
  auto normalize_unit = [&](int64_t t) {
    ForwardRow<A>& r = row_of(t);
    r.rs.normalize(sm, sk);
    lse.row(t) = r.rs.lse.transpose();
    mx.row(t) = r.rs.m.transpose();
  };
  // Column block cb of out = P V, by Eigen's own depth panels in order (SlotBlocks), each
  // panel of V gathered into buf.
  auto pv_unit = [&](ForwardScratch<A>& s, int64_t t, int64_t cb, int64_t col_blocks) {
    ForwardRow<A>& r = row_of(t);
    const int64_t n = static_cast<int64_t>(r.ids.size());
    const int64_t c0 = cb * r.bv, c1 = cb + 1 == col_blocks ? d.d_v : c0 + r.bv;  // the last takes the rest
    auto out_b = out.middleRows(t * d.h_q, d.h_q).middleCols(c0, c1 - c0);
    for (int64_t j0 = 0; j0 < n; j0 += r.kc) {
      const int64_t nb = std::min(r.kc, n - j0);
      if (s.buf.size() < r.buf_size) s.buf.resize(r.buf_size);
      kv.gather(r.ids, j0, j0 + nb, c0, c1, s.buf.data());
      const Eigen::Map<const Mat<A>> Vb(s.buf.data(), nb, c1 - c0);
      if (j0 == 0) out_b.noalias() = r.rs.P.middleCols(0, nb) * Vb;
      else out_b.noalias() += r.rs.P.middleCols(j0, nb) * Vb;
    }
  };

  // Schedule state, guarded by mu. A worker takes the first unit it can in row order
  // (finishing rows first frees their slots), else starts the next row if a slot is free,
  // else waits for a unit running elsewhere; one worker alone runs every row in order.
  std::mutex mu;
  std::condition_variable cv;
  int64_t next_row = 0;    // rows below are started
  int64_t first_open = 0;  // rows below are done
  bool failed = false;
  enum Kind { kStart, kLogits, kNormalize, kPv };
  auto worker = [&](int64_t, int64_t) {
    ForwardScratch<A> s;
    std::unique_lock<std::mutex> lock(mu);
    try {
      for (;;) {
        if (failed) return;
        Kind kind = kStart;
        int64_t t = -1, u = 0;
        for (int64_t r = first_open; r < next_row && t < 0; ++r) {
          RowProgress& p = prog_of(r);
          if (p.phase == 1 && p.next_logit < p.logit_units) {
            kind = kLogits, t = r, u = p.next_logit++;
          } else if (p.phase == 1 && p.logits_done == p.logit_units) {
            kind = kNormalize, t = r, p.phase = 2;
          } else if (p.phase == 3 && p.next_v < p.v_units) {
            kind = kPv, t = r, u = p.next_v++;
          }
        }
        if (t < 0 && next_row < d.s_q && !free_slots.empty()) {
          kind = kStart, t = next_row++;
          slot_index[static_cast<size_t>(t)] = free_slots.back();
          free_slots.pop_back();
        }
        if (t < 0) {
          if (first_open == d.s_q) return;  // every row done
          cv.wait(lock);
          continue;
        }
        RowProgress& p = prog_of(t);
        const int64_t v_units = p.v_units;
        lock.unlock();
        bool done = false;
        switch (kind) {
          case kStart: done = start_row(s, t, p); break;  // p is this worker's while phase 0
          case kLogits: logits_unit(s, t, u); break;
          case kNormalize: normalize_unit(t); break;
          case kPv: pv_unit(s, t, u, v_units); break;
        }
        lock.lock();
        switch (kind) {
          case kStart: p.phase = done ? 4 : 1; break;
          case kLogits: ++p.logits_done; break;
          case kNormalize: p.phase = 3; break;
          case kPv: if (++p.v_done == p.v_units) p.phase = 4; break;
        }
        if (p.phase == 4) free_slots.push_back(slot_index[static_cast<size_t>(t)]);
        while (first_open < next_row && prog_of(first_open).phase == 4) ++first_open;
        cv.notify_all();
      }
    } catch (...) {
      if (!lock.owns_lock()) lock.lock();
      failed = true;  // the others stop; parallel_for rethrows this error
      cv.notify_all();
      throw;
    }
  };
  parallel_for(threads, row_flops(d) * static_cast<double>(d.s_q) / static_cast<double>(threads),
               worker);
  return f;
}

/// One query row of the backward in flight (a slot of the backward's ring): what its units
/// share, and what it hands to the ordered reductions (a row takes a free slot when it starts
/// and frees it once every stream has added it).
template <class A>
struct RowGrads {
  std::vector<int32_t> ids;    // valid ids in slot order
  std::vector<int32_t> order;  // slot indices j grouped by key chunk, in slot order within each
  std::vector<int64_t> start;  // [key chunks + 1]: where each key chunk's run starts in order
  std::vector<int64_t> fill;   // counting-sort cursors, one per key chunk
  Mat<A> Qt, dOt;              // [h_q, d_qk] q rows, [h_q, d_v] dout rows at A
  RowSoftmax<A> rs;            // gathered keys Kg, probabilities P and their statistics
  Mat<A> O, dS;                // [h_q, d_v] out, [h_q, n] dS
  Vec<A> delta;                // [h_q] Δ = out · dout
  Mat<A> dKg;                  // [n, d_qk] gradient of the gathered kv rows
  Vec<A> dsink;                // [h_q] exp(sink - L) Δ (with attn_sink)
  int64_t bq = 0, bo = 0;      // column-block widths of dq and out (split rows)
};

/// Where a ring slot's row stands in the backward (guarded by the schedule's mutex).
struct RowPhase {
  int phase = 0;  // kBwdStart .. kBwdDone
  int64_t units = 0, next = 0, done = 0;  // of the current phase
};

// The phases of a split row of the backward, in order; each phase's units run in parallel.
enum BwdPhase : int {
  kBwdStart,      // ids, key-chunk order, gathered keys (1 unit; a short row: all of it)
  kBwdLogits,     // logits by units of slot blocks
  kBwdNormalize,  // softmax statistics and P (1 unit)
  kBwdOut,        // out = P V by column blocks (none when out is given)
  kBwdDelta,      // Δ and the sink term (1 unit)
  kBwdDs,         // dS by slot blocks
  kBwdGrads,      // dq by column blocks, then dKg by slot blocks
  kBwdDone
};

template <class A>
SparseMlaGrads backward(const SparseMlaInputs& in, const Tensor& dout, const MlaDims& d,
                        const std::optional<Tensor>& given_out) {
  // q, dout and the given out are converted per query row and kv rows as they are
  // gathered, inside the parallel pipeline: no whole-tensor copies.
  const detail::RowReader<A> kv(in.kv, d.d_qk);
  Vec<A> sink;
  if (in.attn_sink) sink = detail::to_mat<A>(*in.attn_sink, d.h_q, 1);
  const Vec<A>* sk = in.attn_sink ? &sink : nullptr;
  const A sm = static_cast<A>(in.sm_scale);
  // dq and dkv are written in place into the output tensors, allocated without a fill
  // (issue 13): each dq row is written by the threads computing its query row, each key
  // chunk of dkv zeroed by the first reduction of its stream (in the pipeline, in parallel).
  SparseMlaGrads grads{Tensor::for_overwrite(detail::out_dtype<A>(), {d.s_q, d.h_q, d.d_qk}),
                       Tensor::for_overwrite(detail::out_dtype<A>(), {d.s_kv, d.d_qk}), std::nullopt};
  auto dQ = detail::mat_view<A>(grads.dq, d.s_q * d.h_q, d.d_qk);
  auto dKV = detail::mat_view<A>(grads.dkv, d.s_kv, d.d_qk);
  Vec<A> dsink = Vec<A>::Zero(d.h_q);
  if (d.s_q == 0) dKV.setZero();  // no rows, no reductions: dkv is 0
  if (d.s_q > 0) {
    // One pipeline, no barrier between rows: workers compute query rows (a long row split in
    // units that several workers share; each writes its own dq rows and leaves dKg in a ring
    // slot), and reduce finished rows into dkv per key chunk ("stream"), each stream adding
    // rows in query-row, then slot order: every dkv element is the same sum as the serial
    // loop's, whatever the thread count. dsink is one more stream, in row order. The ring
    // (~384 MiB of gathered keys and dKg at most) bounds memory; a starting row takes the slot
    // freed last (its buffers the most likely still in cache: only as many slots are touched
    // as rows are in flight). Its size, the slot order, the key chunks and the units change
    // only the schedule, never a result.
    using Blocks = SlotBlocks<A>;
    constexpr int64_t kSlotUnit = 4 * Blocks::kLogits;  // slots per unit (4 slot blocks)
    const int64_t threads = max_threads();
    const int64_t row_bytes = std::max<int64_t>(1, 2 * d.k * d.d_qk * static_cast<int64_t>(sizeof(A)));
    const int64_t slots = std::min<int64_t>(
        d.s_q, std::clamp<int64_t>(2 * threads, 1,
                                   std::max<int64_t>(1, (int64_t{384} << 20) / row_bytes)));
    const int64_t key_chunks_wanted = std::clamp<int64_t>(4 * threads, 1, std::max<int64_t>(1, d.s_kv));
    const int64_t key_chunk = std::max<int64_t>(1, (d.s_kv + key_chunks_wanted - 1) / key_chunks_wanted);
    const int64_t key_chunks = std::max<int64_t>(1, (d.s_kv + key_chunk - 1) / key_chunk);
    const int64_t streams = key_chunks + (in.attn_sink ? 1 : 0);
    std::vector<RowGrads<A>> rows(static_cast<size_t>(slots));
    std::vector<RowPhase> phases(static_cast<size_t>(slots));
    std::vector<int64_t> slot_index(static_cast<size_t>(d.s_q), 0);  // row -> its slot (set at start)
    std::vector<int64_t> free_slots;  // a stack: the slot freed last on top
    for (int64_t i = slots - 1; i >= 0; --i) free_slots.push_back(i);
    int64_t freed = 0;  // rows below have given their slots back
    auto slot = [&](int64_t t) -> RowGrads<A>& {
      return rows[static_cast<size_t>(slot_index[static_cast<size_t>(t)])];
    };
    auto phase_of = [&](int64_t t) -> RowPhase& {
      return phases[static_cast<size_t>(slot_index[static_cast<size_t>(t)])];
    };
    // Column blocks of a [h_q, cols] product (dq, out): about 4 of them, a multiple of mr wide,
    // the last one taking the rest; like SlotBlocks' P·V column blocks, each element keeps
    // its sum.
    auto col_width = [](int64_t cols) {
      return std::max<int64_t>(Blocks::kMr, ((cols + 3) / 4 + Blocks::kMr - 1) / Blocks::kMr * Blocks::kMr);
    };
    auto col_range = [&](int64_t width, int64_t cols, int64_t b, int64_t count) {
      const int64_t c0 = b * width;
      return std::make_pair(c0, b + 1 == count ? cols : c0 + width);
    };
    // Units of kSlotUnit slots (a multiple of mr and nr: each slot keeps its micro-kernel),
    // the last one taking the rest.
    auto slot_units = [](int64_t n) { return std::max<int64_t>(1, n / kSlotUnit); };
    auto slot_range = [&](int64_t n, int64_t u) {
      const int64_t j0 = u * kSlotUnit;
      return std::make_pair(j0, u + 1 == slot_units(n) ? n : j0 + kSlotUnit);
    };
    // Units of each phase of a split row.
    auto units_of = [&](const RowGrads<A>& g, int phase) -> int64_t {
      const int64_t n = static_cast<int64_t>(g.ids.size());
      switch (phase) {
        case kBwdLogits: return (n / Blocks::kLogits + 3) / 4;
        case kBwdOut: return given_out ? 0 : Blocks::pv_column_blocks(g.bo, d.d_v);
        case kBwdDs: return slot_units(n);
        case kBwdGrads: return Blocks::pv_column_blocks(g.bq, d.d_qk) + slot_units(n);
        default: return 1;
      }
    };

    // A long row is split (SlotBlocks' logits blocks; products of at least mr columns).
    auto split_row = [&](int64_t n) {
      return Blocks::logits_blocked(d.h_q, n) && d.d_v >= 2 * Blocks::kMr && d.d_qk >= 2 * Blocks::kMr;
    };

    // Rows [t·h_q, (t+1)·h_q) of a [s_q·h_q, cols] tensor, converted to A into m.
    auto convert_rows = [&](const Tensor& x, int64_t t, int64_t cols, Mat<A>& m) {
      m.resize(d.h_q, cols);
      detail::convert_range<A>(x, m.data(), t * d.h_q * cols, (t + 1) * d.h_q * cols);
    };

    // The whole row t, on one thread (short rows).
    auto compute_whole = [&](RowGrads<A>& g, int64_t t) {
      RowSoftmax<A>& rs = g.rs;
      const Mat<A>& Qt = g.Qt;
      const Mat<A>& dOt = g.dOt;
      rs.compute(kv, d.d_qk, Qt, g.ids, sm, sk);
      const auto Vg = rs.Kg.leftCols(d.d_v);
      if (given_out) convert_rows(*given_out, t, d.d_v, g.O);   // out as the kernel got it
      else g.O.noalias() = rs.P * Vg;                            // sink-scaled out [h_q, d_v]
      g.delta = g.O.cwiseProduct(dOt).rowwise().sum();           // Δ = out · dout
      g.dS.noalias() = dOt * Vg.transpose();                     // dout · v_j
      g.dS = rs.P.cwiseProduct(g.dS - g.delta.replicate(1, g.dS.cols()));  // p_j (dout·v_j - Δ)
      dQ.middleRows(t * d.h_q, d.h_q).noalias() = sm * (g.dS * rs.Kg);
      g.dKg.noalias() = sm * (g.dS.transpose() * Qt);
      g.dKg.leftCols(d.d_v).noalias() += rs.P.transpose() * dOt;
      if (in.attn_sink) g.dsink = rs.psink.cwiseProduct(g.delta);  // exp(sink - L) Δ
    };

    // Starts row t: ids, key-chunk order; a short row computed whole. Returns true when the
    // row is computed.
    auto start_row = [&](int64_t t) {
      RowGrads<A>& g = slot(t);
      valid_ids(in, d, t, g.ids);
      if (g.ids.empty()) {  // SPEC §6: dq = 0, no dkv / dsink contribution
        dQ.middleRows(t * d.h_q, d.h_q).setZero();
        return true;
      }
      // Slot indices by key chunk (a stable counting sort), for the per-chunk reductions.
      const int64_t n = static_cast<int64_t>(g.ids.size());
      g.start.assign(static_cast<size_t>(key_chunks + 1), 0);
      for (int32_t id : g.ids) ++g.start[static_cast<size_t>(id / key_chunk + 1)];
      for (int64_t c = 0; c < key_chunks; ++c)
        g.start[static_cast<size_t>(c + 1)] += g.start[static_cast<size_t>(c)];
      g.fill.assign(g.start.begin(), g.start.end() - 1);
      g.order.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j)
        g.order[static_cast<size_t>(g.fill[static_cast<size_t>(g.ids[static_cast<size_t>(j)] / key_chunk)]++)] =
            static_cast<int32_t>(j);
      convert_rows(in.q, t, d.d_qk, g.Qt);
      convert_rows(dout, t, d.d_v, g.dOt);
      if (!split_row(n)) {
        compute_whole(g, t);
        return true;
      }
      g.rs.Kg.resize(n, d.d_qk);
      kv.gather(g.ids, 0, n, 0, d.d_qk, g.rs.Kg.data());
      g.rs.P.resize(d.h_q, n);
      g.dS.resize(d.h_q, n);
      g.O.resize(d.h_q, d.d_v);
      g.dKg.resize(n, d.d_qk);
      g.bq = col_width(d.d_qk);
      g.bo = col_width(d.d_v);
      return false;
    };

    // Unit u of phase `phase` of split row t: the products of compute_whole by blocks, each
    // element the same sum (SlotBlocks: slot blocks of multiples of mr, the last taking the
    // rest; column blocks of a multiple of mr; depth panels that do not depend on a block).
    auto run_unit = [&](int64_t t, int phase, int64_t u) {
      RowGrads<A>& g = slot(t);
      RowSoftmax<A>& rs = g.rs;
      const int64_t n = static_cast<int64_t>(g.ids.size());
      const Mat<A>& Qt = g.Qt;
      const Mat<A>& dOt = g.dOt;
      switch (phase) {
        case kBwdLogits: {
          const int64_t B = Blocks::kLogits, blocks = n / B;
          for (int64_t b = 4 * u; b < std::min(blocks, 4 * u + 4); ++b) {
            const int64_t j0 = b * B, j1 = b + 1 == blocks ? n : j0 + B;
            rs.P.middleCols(j0, j1 - j0).noalias() = Qt * rs.Kg.middleRows(j0, j1 - j0).transpose();
          }
          return;
        }
        case kBwdNormalize:
          rs.normalize(sm, sk);
          if (given_out) convert_rows(*given_out, t, d.d_v, g.O);  // out as the kernel got it
          return;
        case kBwdOut: {
          const auto [c0, c1] = col_range(g.bo, d.d_v, u, Blocks::pv_column_blocks(g.bo, d.d_v));
          g.O.middleCols(c0, c1 - c0).noalias() = rs.P * rs.Kg.middleCols(c0, c1 - c0);
          return;
        }
        case kBwdDelta:
          g.delta = g.O.cwiseProduct(dOt).rowwise().sum();
          if (in.attn_sink) g.dsink = rs.psink.cwiseProduct(g.delta);
          return;
        case kBwdDs: {
          const auto [j0, j1] = slot_range(n, u);
          auto dSb = g.dS.middleCols(j0, j1 - j0);
          dSb.noalias() = dOt * rs.Kg.middleRows(j0, j1 - j0).leftCols(d.d_v).transpose();
          dSb = rs.P.middleCols(j0, j1 - j0).cwiseProduct(dSb - g.delta.replicate(1, j1 - j0));
          return;
        }
        case kBwdGrads: {
          const int64_t qb = Blocks::pv_column_blocks(g.bq, d.d_qk);
          if (u < qb) {
            const auto [c0, c1] = col_range(g.bq, d.d_qk, u, qb);
            dQ.middleRows(t * d.h_q, d.h_q).middleCols(c0, c1 - c0).noalias() =
                sm * (g.dS * rs.Kg.middleCols(c0, c1 - c0));
          } else {
            const auto [j0, j1] = slot_range(n, u - qb);
            auto dKb = g.dKg.middleRows(j0, j1 - j0);
            dKb.noalias() = sm * (g.dS.middleCols(j0, j1 - j0).transpose() * Qt);
            dKb.leftCols(d.d_v).noalias() += rs.P.middleCols(j0, j1 - j0).transpose() * dOt;
          }
          return;
        }
        default: return;
      }
    };

    // Adds rows [r0, r1) of stream c, in row order.
    auto reduce = [&](int64_t c, int64_t r0, int64_t r1) {
      if (r0 == 0 && c < key_chunks) {  // the chunk's first rows: zero its keys first
        const int64_t k0 = std::min(d.s_kv, c * key_chunk);
        dKV.middleRows(k0, std::min(d.s_kv, k0 + key_chunk) - k0).setZero();
      }
      for (int64_t t = r0; t < r1; ++t) {
        const RowGrads<A>& g = slot(t);
        if (g.ids.empty()) continue;
        if (c == key_chunks) {
          dsink -= g.dsink;
          continue;
        }
        for (int64_t i = g.start[static_cast<size_t>(c)]; i < g.start[static_cast<size_t>(c + 1)]; ++i) {
          const int32_t j = g.order[static_cast<size_t>(i)];
          dKV.row(g.ids[static_cast<size_t>(j)]) += g.dKg.row(j);
        }
      }
    };

    // Schedule state, guarded by mu.
    std::mutex mu;
    std::condition_variable cv;
    int64_t next_row = 0;                                        // rows below are started
    int64_t first_open = 0;                                      // rows below are computed
    std::vector<char> computed(static_cast<size_t>(d.s_q), 0);   // row t's slot is filled
    std::vector<int64_t> reduced(static_cast<size_t>(streams), 0);  // rows each stream added
    std::vector<char> busy(static_cast<size_t>(streams), 0);     // a worker is adding for it
    bool failed = false;
    // Moves row t past its finished phase to the next one with units (kBwdDone: computed).
    auto advance = [&](int64_t t, RowPhase& p) {
      for (++p.phase; p.phase < kBwdDone; ++p.phase) {
        p.units = units_of(slot(t), p.phase);
        p.next = p.done = 0;
        if (p.units > 0) return;
      }
      computed[static_cast<size_t>(t)] = 1;
      while (first_open < next_row && computed[static_cast<size_t>(first_open)]) ++first_open;
    };
    // A worker prefers reductions (they free ring slots), then the first unit it can take in
    // row order, then starting the next row; it waits only while every task it could take
    // depends on one running elsewhere, so the pipeline cannot deadlock, and a single worker
    // runs it all in serial order.
    auto worker = [&](int64_t, int64_t) {
      std::unique_lock<std::mutex> lock(mu);
      try {
        for (;;) {
          if (failed) return;
          int64_t c = -1, min_reduced = d.s_q;
          for (int64_t i = 0; i < streams; ++i) {
            const int64_t r = reduced[static_cast<size_t>(i)];
            min_reduced = std::min(min_reduced, r);
            if (c < 0 && !busy[static_cast<size_t>(i)] && r < d.s_q && computed[static_cast<size_t>(r)]) c = i;
          }
          if (c >= 0) {
            const int64_t r0 = reduced[static_cast<size_t>(c)];
            int64_t r1 = r0;
            while (r1 < d.s_q && computed[static_cast<size_t>(r1)]) ++r1;
            busy[static_cast<size_t>(c)] = 1;
            lock.unlock();
            reduce(c, r0, r1);
            lock.lock();
            reduced[static_cast<size_t>(c)] = r1;
            busy[static_cast<size_t>(c)] = 0;
            cv.notify_all();
            continue;
          }
          int64_t t = -1, u = 0;
          int phase = kBwdStart;
          for (int64_t r = first_open; r < next_row && t < 0; ++r) {
            RowPhase& p = phase_of(r);
            if (p.phase > kBwdStart && p.phase < kBwdDone && p.next < p.units)
              t = r, phase = p.phase, u = p.next++;
          }
          for (; freed < min_reduced; ++freed)  // rows every stream has added
            free_slots.push_back(slot_index[static_cast<size_t>(freed)]);
          if (t < 0 && next_row < d.s_q && !free_slots.empty()) {
            t = next_row++;
            slot_index[static_cast<size_t>(t)] = free_slots.back();
            free_slots.pop_back();
            phase_of(t) = RowPhase{};
          }
          if (t < 0) {
            if (min_reduced == d.s_q) return;  // every row added by every stream
            cv.wait(lock);
            continue;
          }
          lock.unlock();
          const bool whole = phase == kBwdStart ? start_row(t) : (run_unit(t, phase, u), false);
          lock.lock();
          RowPhase& p = phase_of(t);
          if (phase == kBwdStart) {
            if (whole) {
              p.phase = kBwdDone;
              computed[static_cast<size_t>(t)] = 1;
              while (first_open < next_row && computed[static_cast<size_t>(first_open)]) ++first_open;
            } else {
              advance(t, p);
            }
          } else if (++p.done == p.units) {
            advance(t, p);
          }
          cv.notify_all();
        }
      } catch (...) {
        if (!lock.owns_lock()) lock.lock();
        failed = true;  // the others stop; parallel_for rethrows this error
        cv.notify_all();
        throw;
      }
    };
    // Long rows have several units each: more workers than rows can share them.
    const int64_t workers = Blocks::logits_blocked(d.h_q, d.k) ? threads : std::min<int64_t>(d.s_q, threads);
    parallel_for(workers, 3 * row_flops(d) * static_cast<double>(d.s_q) / static_cast<double>(workers),
                 worker);
  }
  if (in.attn_sink) grads.dsink = detail::to_tensor<A>(dsink.transpose(), {d.h_q});
  return grads;
}

}  // namespace

SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in, Precision precision) {
  const char* where = "sparse_mla_forward";
  const MlaDims d = validate(where, in);
  check_values(where, in, d, nullptr, nullptr);
  if (precision != Precision::Reference) return forward<float>(in, d);
  SparseMlaForward f = forward<double>(in, d);
  // Inputs the checks above let through never reach these (a guard; ±inf lse/max_logits of
  // empty rows are the contract's, SPEC §6).
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"out", &f.out},
                                {"lse", &f.lse}, {"max_logits", &f.max_logits}})
    detail::check_result_values(where, "q, kv, sm_scale, attn_sink", name, *t);
  return f;
}

SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout,
                                   Precision precision, const std::optional<Tensor>& out) {
  const char* where = "sparse_mla_backward";
  const MlaDims d = validate(where, in);
  check_shape(where, "dout", dout, {d.s_q, d.h_q, d.d_v});
  detail::check_activation_dtype(where, "dout", dout);
  if (out) {
    check_shape(where, "out", *out, {d.s_q, d.h_q, d.d_v});
    detail::check_activation_dtype(where, "out", *out);
  }
  check_values(where, in, d, &dout, &out);
  check_gradient_terms(where, in, d, dout, out);
  if (precision != Precision::Reference) return backward<float>(in, dout, d, out);
  SparseMlaGrads g = backward<double>(in, dout, d, out);
  // Gradients past FLT_MAX (e.g. a huge dout or kv summed over many rows): no fp32 kernel
  // can return them.
  detail::check_result_values(where, "dout, q, kv, sm_scale", "dq", g.dq);
  detail::check_result_values(where, "dout, q, kv, sm_scale", "dkv", g.dkv);
  if (g.dsink) detail::check_result_values(where, "dout, q, kv, attn_sink", "dsink", *g.dsink);
  return g;
}

}  // namespace dsa::reference
