// Declared rounding models checked on an exact tier (SPEC §9, "the output's rounding":
// --normalized-p, --sink-after-rounding; docs/what-a-pass-means.md, Limits).
//
// A declared model adds one 16-bit rounding to out's bound and is taken on the backend's word,
// so before this file a kernel declaring a model it does not follow got about one 16-bit ulp of
// slack for nothing. Here, for a backend that declares a model, the sparse MLA forward is drawn
// on rows where every legal evaluation of that model gives one known 16-bit value per element,
// and where the default model (FlashMLA's exp(P - max), the max key exactly 1, the sink applied
// in fp32 before out's one rounding) gives another on many elements:
//
//  - every valid key of a row has the same logit: q is 0 except on a few "logit columns"
//    (the RoPE columns, or one value column when d_qk = d_v), where the row's keys hold the
//    same small integers; the dot products are exact integers and sm_scale a power of two, so
//    every key's logit is the same fp32 value in any summation order, exp(P - max) = 1 exactly
//    and the probabilities are 1/n (n valid keys);
//  - the value columns hold integers in [-255, 255] (exact in bf16 and fp16).
//
// normalized_p (rows without a sink, n in {3, 5, 6, 7}): the model rounds p = 1/n to 16 bits;
// fp32 gives 1/n to a few ulps and 1/n lies at least 0.05 of a 16-bit ulp from a rounding
// midpoint (bf16: 0.17, 0.30, 0.17, 0.21 for n = 3, 5, 6, 7), so p16 = fl16(1/n) whatever the
// exp, sum or division. P·V = Σ_j p16 · v_j is exact in fp32 in any order (every partial sum is
// an integer multiple of p16's ulp, at most 7 · 255 · 2^11 < 2^22 of them), so out =
// fl16(p16 · S), S = Σ_j v_jc.
// The default model gives fl16(S / n), and p16 · n = 1 + ε (bf16 ε = +2^-9 for n = 3), so the
// two differ in about a third of the bf16 elements by one ulp.
//
// sink_after_rounding (rows with a finite sink, n in {4, 8}; with n = 2 a bf16 o = S/2 is a
// bf16 value or a tie): o = S / n is exact (p = 1/n exact in every model: P normalized or not), the model gives out = fl16(fl32(fl16(o) · r)),
// r = exp(lse) / (exp(lse) + exp(sink)); the default gives fl16(o · r). r differs between
// legal fp32 evaluations by about u32 (|lse|, |sink| <= 6 here: below 2^-19 relative), so an
// element is judged only where fl16(o) · r (and o) lie at least 1/64 of a 16-bit ulp
// (2^-14 of the value in bf16, 2^-17 in fp16) from a midpoint: every legal evaluation then
// rounds to the same 16-bit value.
//
// The candidate's out must equal that value bit for bit on every judged element; elsewhere this
// property judges nothing (the other properties judge every element by the local rule).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "dsa/contract/dtype.h"
#include "src/props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::BlockFactory;
using oracle::Op;

enum class Model { NormalizedP, SinkAfterRounding };

const char* model_name(Model m) { return m == Model::NormalizedP ? "normalized_p" : "sink_after_rounding"; }

// x rounded once to the 16-bit dtype d (to nearest, ties to even).
double round16(double x, DType d) {
  return d == DType::BF16 ? static_cast<double>(bf16_to_float(double_to_bf16(x)))
                          : static_cast<double>(f16_to_float(double_to_f16(x)));
}

// Distance of x from the nearest rounding midpoint of the 16-bit dtype d, in units of d's ulp
// at |x|: 0.5 where x is representable (and at 0), 0 at a tie. Normal range only (the tier's
// values lie in [2^-14, 2^11] or are 0).
double midpoint_distance(double x, DType d) {
  if (x == 0) return 0.5;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = m 2^e, m in [0.5, 1): binade 2^(e-1)
  const int bits = d == DType::BF16 ? 8 : 11;
  const double ulp = std::ldexp(1.0, e - bits);
  const double f = std::fabs(x) / ulp;
  return std::fabs(f - std::floor(f) - 0.5);
}

// Below this distance (in 16-bit ulps) from a midpoint an element is not judged: an fp32
// evaluation of r (sink) may land on either side. 1/64 ulp = 2^-14 (bf16) / 2^-17 (fp16) of
// the value; r's fp32 error here stays below 2^-19.
constexpr double kMarginUlp = 1.0 / 64;

struct TierCase {
  SmlaCase c;
  Model model = Model::NormalizedP;
  DType work = DType::BF16;                 ///< q, kv and out dtype; P rounded to it
  std::vector<double> pred;                 ///< per out element: the declared model's out
  std::vector<double> other;                ///< per out element: the default model's out
  std::vector<uint8_t> judged;              ///< 1: every legal evaluation of the model gives pred
  int64_t n_judged = 0, n_telling = 0;      ///< judged; judged and pred != other
  std::string desc;
};

using Rng = std::mt19937_64;

int64_t irand(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }
int64_t draw_in(int64_t lo, int64_t hi) { return *rc::gen::inRange<int64_t>(lo, hi + 1); }
template <class T>
T draw_of(std::initializer_list<T> xs) {
  return *rc::gen::elementOf(std::vector<T>(xs));
}

// One element of either model. S: Σ_j v_j over the row's n keys (integers), A: Σ_j |v_j|; lse
// the row's exact log-sum-exp (logit + ln n); sink: -inf for none. Returns {pred, other,
// judged, telling}.
struct Element {
  double pred, other;
  bool judged, telling;
};
Element element(Model m, DType d, double S, double A, int64_t n, double lse, double sink) {
  if (m == Model::NormalizedP) {
    const double p16 = round16(1.0 / static_cast<double>(n), d);
    const double x = p16 * S;
    const double def = S / static_cast<double>(n);
    // Every partial sum of p16 · v_j is an integer multiple of p16's ulp, at most A p16 / ulp of
    // them: below 2^24, every fp32 sum of the terms in any order is exact.
    int e = 0;
    std::frexp(p16, &e);
    const bool exact = A * p16 / std::ldexp(1.0, e - (d == DType::BF16 ? 8 : 11)) < 0x1p24;
    const bool judged = exact && midpoint_distance(1.0 / static_cast<double>(n), d) >= kMarginUlp &&
                        midpoint_distance(x, d) >= kMarginUlp;
    const double pred = round16(x, d), other = round16(def, d);
    return {pred, other, judged, judged && midpoint_distance(def, d) >= kMarginUlp && pred != other};
  }
  const double o = S / static_cast<double>(n);  // exact: n is 4 or 8
  const double r = 1.0 / (1.0 + std::exp(sink - lse));
  const double y = round16(o, d) * r, z = o * r;
  const bool judged = midpoint_distance(o, d) >= kMarginUlp && midpoint_distance(y, d) >= kMarginUlp;
  const double pred = round16(y, d), other = round16(z, d);
  return {pred, other, judged, judged && midpoint_distance(z, d) >= kMarginUlp && pred != other};
}

// A draw of the tier for model m (file comment): shapes "small" (s_q 1-4, h_q 1-4, d_qk 24 or
// 32, d_v d_qk or d_qk - 8, k up to 10 with -1 holes) or, one draw in four, "production" (s_q
// 1-2, h_q 16, 64 or 128, d_qk 576, d_v 512, k 64 with n valid slots, the rest -1); q, kv and
// out bf16 (three draws in four; RapidCheck's first, smallest draws are small bf16) or fp16. Each value column of a row is redrawn (up to 32
// times) until head 0's element is judged and the two models differ there.
TierCase draw_declared_tier_case(Model m) {
  TierCase tc;
  tc.model = m;
  const bool production = draw_in(0, 3) == 3;
  tc.work = draw_in(0, 3) == 3 ? DType::F16 : DType::BF16;
  // Value columns: integers up to 255 (bf16, and fp16 under normalized P: p16 · v then has at
  // most 8 + 8 or 11 + 8 bits), 2047 for fp16 under the sink after rounding (o = S/n must not be
  // an fp16 value: every half-integer up to 1024 is one).
  const int64_t vmax = tc.work == DType::F16 && m == Model::SinkAfterRounding ? 2047 : 255;
  const int64_t s_q = production ? draw_in(1, 2) : draw_in(1, 4);
  const int64_t h = production ? draw_of<int64_t>({16, 64, 128}) : draw_in(1, 4);
  const int64_t d_qk = production ? 576 : draw_of<int64_t>({24, 32});
  const int64_t d_v = production ? 512 : draw_of<int64_t>({d_qk - 8, d_qk});
  std::vector<int64_t> n(static_cast<size_t>(s_q));
  for (auto& x : n) x = m == Model::NormalizedP ? draw_of<int64_t>({3, 5, 6, 7}) : draw_of<int64_t>({4, 8});
  const int64_t n_max = *std::max_element(n.begin(), n.end());
  const int64_t k = production ? 64 : n_max + draw_in(0, 3);
  const int64_t extra = draw_in(0, 2);  // kv rows no slot selects
  const int64_t s_kv = std::accumulate(n.begin(), n.end(), int64_t{0}) + extra;
  const double sm = std::ldexp(1.0, -static_cast<int>(draw_in(2, 4)));
  Rng r(*rc::gen::arbitrary<uint64_t>());

  // ids: row t's keys are its own kv rows, in a random permutation of [0, s_kv)
  std::vector<int64_t> perm(static_cast<size_t>(s_kv));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r);
  std::vector<std::vector<int64_t>> keys(static_cast<size_t>(s_q));
  std::vector<int32_t> idx(static_cast<size_t>(s_q * k), -1);
  for (int64_t t = 0, next = 0; t < s_q; ++t) {
    std::vector<int64_t> slots(static_cast<size_t>(k));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), r);
    for (int64_t j = 0; j < n[static_cast<size_t>(t)]; ++j) {
      const int64_t id = perm[static_cast<size_t>(next++)];
      keys[static_cast<size_t>(t)].push_back(id);
      idx[static_cast<size_t>(t * k + slots[static_cast<size_t>(j)])] = static_cast<int32_t>(id);
    }
  }
  // logit columns: the RoPE columns, or one value column when there are none
  std::vector<int64_t> lcols;
  if (d_qk > d_v) {
    for (int64_t c = d_v; c < d_qk; ++c) lcols.push_back(c);
  } else {
    lcols.push_back(irand(r, 0, d_v - 1));
  }
  std::vector<double> q(static_cast<size_t>(s_q * h * d_qk), 0.0), kv(static_cast<size_t>(s_kv * d_qk), 0.0);
  for (int64_t id = 0; id < s_kv; ++id)  // unselected rows: any values
    for (int64_t c = 0; c < d_qk; ++c) kv[static_cast<size_t>(id * d_qk + c)] = static_cast<double>(irand(r, -255, 255));
  std::vector<double> logit(static_cast<size_t>(s_q * h), 0.0);
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<double> w(static_cast<size_t>(d_qk), 0.0);  // the row's keys' logit columns
    for (int64_t c : lcols) w[static_cast<size_t>(c)] = static_cast<double>(irand(r, -2, 2));
    for (int64_t id : keys[static_cast<size_t>(t)])
      for (int64_t c : lcols) kv[static_cast<size_t>(id * d_qk + c)] = w[static_cast<size_t>(c)];
    for (int64_t hh = 0; hh < h; ++hh) {
      double dot = 0;
      const int64_t nz = std::min<int64_t>(3, static_cast<int64_t>(lcols.size()));
      for (int64_t i = 0; i < nz; ++i) {
        const int64_t c = lcols[static_cast<size_t>(irand(r, 0, static_cast<int64_t>(lcols.size()) - 1))];
        double& qc = q[static_cast<size_t>((t * h + hh) * d_qk + c)];
        if (qc != 0) continue;
        qc = static_cast<double>(irand(r, 1, 2)) * (irand(r, 0, 1) ? 1 : -1);
        dot += qc * w[static_cast<size_t>(c)];
      }
      logit[static_cast<size_t>(t * h + hh)] = sm * dot;  // |logit| <= 3
    }
  }
  std::vector<double> sink(static_cast<size_t>(h), -INFINITY);
  if (m == Model::SinkAfterRounding)
    for (auto& s : sink)
      s = static_cast<double>(static_cast<float>(std::log(3.0) + std::uniform_real_distribution<double>(-3, 2)(r)));
  auto lse_of = [&](int64_t t, int64_t hh) {
    return logit[static_cast<size_t>(t * h + hh)] + std::log(static_cast<double>(n[static_cast<size_t>(t)]));
  };
  // value columns: redrawn until head 0's element is judged and tells the models apart
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t c = 0; c < d_v; ++c) {
      if (std::find(lcols.begin(), lcols.end(), c) != lcols.end()) continue;
      for (int attempt = 0; attempt < 32; ++attempt) {
        double S = 0, A = 0;
        for (int64_t id : keys[static_cast<size_t>(t)]) {
          const double v = static_cast<double>(irand(r, -vmax, vmax));
          kv[static_cast<size_t>(id * d_qk + c)] = v;
          S += v;
          A += std::fabs(v);
        }
        if (element(m, tc.work, S, A, n[static_cast<size_t>(t)], lse_of(t, 0), sink[0]).telling) break;
      }
    }
  tc.c.in.q = Tensor::from_f64({s_q, h, d_qk}, q).to(tc.work);
  tc.c.in.kv = Tensor::from_f64({s_kv, d_qk}, kv).to(tc.work);
  tc.c.in.indices = Tensor::from_i32({s_q, k}, idx);
  tc.c.in.sm_scale = sm;
  tc.c.in.d_v = d_v;
  if (m == Model::SinkAfterRounding) tc.c.in.attn_sink = Tensor::from_f64({h}, sink).to(DType::F32);
  // the prediction, element by element
  const size_t numel = static_cast<size_t>(s_q * h * d_v);
  tc.pred.resize(numel);
  tc.other.resize(numel);
  tc.judged.assign(numel, 0);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t c = 0; c < d_v; ++c) {
        double S = 0, A = 0;
        for (int64_t id : keys[static_cast<size_t>(t)]) {
          S += kv[static_cast<size_t>(id * d_qk + c)];
          A += std::fabs(kv[static_cast<size_t>(id * d_qk + c)]);
        }
        const Element e =
            element(m, tc.work, S, A, n[static_cast<size_t>(t)], lse_of(t, hh), sink[static_cast<size_t>(hh)]);
        const size_t i = static_cast<size_t>((t * h + hh) * d_v + c);
        tc.pred[i] = e.pred;
        tc.other[i] = e.other;
        tc.judged[i] = e.judged;
        tc.n_judged += e.judged;
        tc.n_telling += e.telling;
      }
  std::ostringstream desc;
  desc << "declared-model tier " << model_name(m) << " " << (production ? "production" : "small") << " "
       << dtype_name(tc.work) << " s_q=" << s_q << " h_q=" << h << " d_qk=" << d_qk << " d_v=" << d_v << " k=" << k
       << " s_kv=" << s_kv << " keys/row=";
  for (size_t t = 0; t < n.size(); ++t) desc << (t ? "," : "") << n[t];
  desc << " sm_scale=" << sm << " judged=" << tc.n_judged << " telling=" << tc.n_telling;
  tc.desc = desc.str();
  RC_LOG() << "case: " << tc.desc << "\n";
  return tc;
}

std::string fmt(double x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

// The property body for model m (run_property skips it unless the backend or the run declares
// m: Property::declared_model).
void declared_model_tier(Backend& b, Model m) {
  const oracle::RoundingModel declared = oracle::either(oracle::default_check_options().rounding, b.rounding_model());
  if (!(m == Model::NormalizedP ? declared.normalized_p : declared.sink_after_rounding)) {
    const std::string why = std::string("the rounding model ") + model_name(m) + " is not declared";
    note_judged_nothing(why);
    RC_DISCARD(why);
  }
  const TierCase tc = draw_declared_tier_case(m);
  DumpOnFailure dump([&] {
    fixtures::Fixture f = to_fixture(tc.c, false);
    f.notes = tc.desc;
    return f;
  });
  oracle::OpCase oc;
  oc.mla = tc.c.in;
  const SparseMlaForward f =
      call_twin_tested(b, Op::SparseMlaFwd, oc, [&] { return b.sparse_mla_forward(tc.c.in); });
  if (!f.out.defined() || (f.out.dtype() != DType::BF16 && f.out.dtype() != DType::F16)) {
    // The models round a 16-bit out; another out dtype gets no slack from them (SPEC §9).
    const std::string why = !f.out.defined() ? "out not provided"
                                             : std::string("out is ") + dtype_name(f.out.dtype()) +
                                                   ", not 16-bit: the declared model gives it no slack";
    note_judged_nothing(why);
    RC_DISCARD(why);
  }
  if (f.out.dtype() != tc.work) {
    // SPEC §4: out is q's dtype (the other properties judge that); the model's value is in it.
    const std::string why = std::string("out is ") + dtype_name(f.out.dtype()) + " for " + dtype_name(tc.work) +
                            " q: the tier's values are q's dtype's";
    note_judged_nothing(why);
    RC_DISCARD(why);
  }
  note_failing_op("sparse_mla_fwd");
  RC_ASSERT(f.out.numel() == static_cast<int64_t>(tc.pred.size()));
  int64_t wrong = 0, as_default = 0;
  int64_t first = -1;
  for (size_t i = 0; i < tc.pred.size(); ++i) {
    if (!tc.judged[i]) continue;
    const double got = f.out.get(static_cast<int64_t>(i));
    if (got == tc.pred[i]) continue;
    ++wrong;
    as_default += got == tc.other[i];
    if (first < 0) first = static_cast<int64_t>(i);
  }
  if (wrong == 0) {
    reset_failing_op();
    return;
  }
  const int64_t d_v = tc.c.in.d_v, h = tc.c.in.q.size(1);
  const int64_t t = first / (h * d_v), hh = first / d_v % h, c = first % d_v;
  const size_t fi = static_cast<size_t>(first);
  RC_FAIL("[FAIL] " + b.name() + " sparse_mla_fwd: declared rounding model " + model_name(m) +
          " not followed on its exact tier (" + tc.desc + "): " + std::to_string(wrong) + " of " +
          std::to_string(tc.n_judged) + " judged out elements differ from the one value every evaluation of the "
          "model gives (" + std::to_string(as_default) + " of them equal the default model's: " +
          (m == Model::NormalizedP ? "exp(P - max) with the max key exactly 1" : "the sink applied before out's one rounding") +
          "); first out[" + std::to_string(t) + "," + std::to_string(hh) + "," + std::to_string(c) + "] = " +
          fmt(f.out.get(first)) + ", the model gives " + fmt(tc.pred[fi]) + ", the default model " + fmt(tc.other[fi]) +
          ". The declaration loosens out's bound by one 16-bit rounding elsewhere; a kernel that does not round "
          "this way must not declare it (docs/what-a-pass-means.md, Limits)");
}

void normalized_p_exact_tier(Backend& b, const BlockFactory&) { declared_model_tier(b, Model::NormalizedP); }
void sink_after_rounding_exact_tier(Backend& b, const BlockFactory&) { declared_model_tier(b, Model::SinkAfterRounding); }

}  // namespace

void add_declared_model_properties(std::vector<Property>& out) {
  Property np{"smla.normalized_p_exact_tier", {Op::SparseMlaFwd}, 1, normalized_p_exact_tier};
  np.declared_model = "normalized_p";
  out.push_back(np);
  Property sar{"smla.sink_after_rounding_exact_tier", {Op::SparseMlaFwd}, 1, sink_after_rounding_exact_tier};
  sar.declared_model = "sink_after_rounding";
  out.push_back(sar);
}

}  // namespace dsa::props
