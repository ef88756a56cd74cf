// Cross-checks of the GEMM-based reference against plain scalar loops written from the
// SPEC formulas, at odd sizes larger than any SIMD packet (catches gather, blocking and
// Eigen aliasing mistakes that tiny hand cases and FD checks of detached terms cannot).
#include <gtest/gtest.h>

#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "test_support.h"

namespace dsa {
namespace {

using test::kInf;

constexpr int64_t kSq = 5, kH = 7, kD = 19, kDv = 13, kSkv = 41, kK = 37;

Tensor random_ids(uint64_t seed) {  // valid, duplicate and invalid ids mixed
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(-3, kSkv + 2);
  std::vector<int32_t> v(kSq * kK);
  for (auto& x : v) x = id(rng);
  for (int64_t j = 0; j < kK; ++j) v[2 * kK + j] = -1;  // row 2 empty
  return Tensor::from_i32({kSq, kK}, v);
}

TEST(NaiveCrosscheckTest, SparseMlaForwardMatchesScalarLoops) {
  SparseMlaInputs in;
  in.q = test::random_f64({kSq, kH, kD}, 41);
  in.kv = test::random_f64({kSkv, kD}, 42);
  in.indices = random_ids(43);
  in.sm_scale = 0.3;
  in.d_v = kDv;
  in.attn_sink = test::random_f64({kH}, 44);
  const SparseMlaForward f = reference::sparse_mla_forward(in);
  Tensor out(DType::F64, {kSq, kH, kDv}), lse(DType::F64, {kSq, kH}), mx(DType::F64, {kSq, kH});
  for (int64_t t = 0; t < kSq; ++t)
    for (int64_t h = 0; h < kH; ++h) {
      std::vector<double> logit;
      std::vector<int32_t> ids;
      for (int64_t j = 0; j < kK; ++j) {
        const int32_t id = in.indices.data<int32_t>()[t * kK + j];
        if (id < 0 || id >= kSkv) continue;
        double dot = 0;
        for (int64_t e = 0; e < kD; ++e) dot += in.q.get((t * kH + h) * kD + e) * in.kv.get(id * kD + e);
        logit.push_back(in.sm_scale * dot);
        ids.push_back(id);
      }
      if (ids.empty()) {
        lse.set(t * kH + h, kInf);
        mx.set(t * kH + h, -kInf);
        continue;
      }
      const double m = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (double l : logit) sum += std::exp(l - m);
      const double L = m + std::log(sum);
      const double sink = in.attn_sink->get(h);
      const double scale = std::exp(L) / (std::exp(L) + std::exp(sink));
      for (size_t j = 0; j < ids.size(); ++j)
        for (int64_t e = 0; e < kDv; ++e) {
          const int64_t o = (t * kH + h) * kDv + e;
          out.set(o, out.get(o) + scale * std::exp(logit[j] - L) * in.kv.get(ids[j] * kD + e));
        }
      lse.set(t * kH + h, L);
      mx.set(t * kH + h, m);
    }
  EXPECT_GT(test::max_abs(out), 0.0);
  EXPECT_TRUE(test::close(f.out, out, test::kReassocRelTol));
  EXPECT_TRUE(test::close(f.lse, lse, test::kReassocRelTol));
  EXPECT_TRUE(test::identical(f.max_logits, mx));
}

TEST(NaiveCrosscheckTest, IndexerMatchesScalarLoops) {
  const Tensor q = test::random_f64({kSq, kH, kD}, 51), k = test::random_f64({kSkv, kD}, 52);
  const Tensor w = test::random_f64({kSq, kH}, 53);
  const KeyWindows win = KeyWindows::explicit_windows({0, 3, 40, 7, 0}, {41, 30, 40, 8, 1}, kSkv);
  Tensor I(DType::F64, {kSq, kSkv});
  for (int64_t t = 0; t < kSq; ++t)
    for (int64_t s = 0; s < kSkv; ++s) {
      double acc = 0;
      for (int64_t j = 0; j < kH; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < kD; ++e) dot += q.get((t * kH + j) * kD + e) * k.get(s * kD + e);
        acc += w.get(t * kH + j) * std::max(dot, 0.0);
      }
      I.set(t * kSkv + s, win.contains(t, s) ? acc : -kInf);
    }
  EXPECT_TRUE(test::close(reference::indexer_scores(q, k, w, win), I, test::kReassocRelTol));
}

TEST(NaiveCrosscheckTest, KlLossMatchesScalarLoops) {
  for (KlMode mode : {KlMode::Dense, KlMode::Sparse}) {
    IndexerKlInputs in;
    in.scores = test::random_f64({kSq, kSkv}, 61);
    in.q = test::random_f64({kSq, kH, kD}, 62);
    in.kv = test::random_f64({kSkv, kD}, 63);
    in.sm_scale = 0.4;
    in.windows = KeyWindows::explicit_windows({0, 3, 40, 7, 0}, {41, 30, 40, 28, 33}, kSkv);
    in.mode = mode;
    in.indices = random_ids(64);
    in.coeff = 1.7;
    double total = 0;
    int64_t rows = 0;
    Tensor dI(DType::F64, {kSq, kSkv});
    std::vector<std::vector<double>> grads(kSq);
    std::vector<std::vector<int32_t>> sets(kSq);
    for (int64_t t = 0; t < kSq; ++t) {
      std::vector<int32_t>& S = sets[t];
      for (int32_t s = 0; s < kSkv; ++s) {
        bool in_set = in.windows.contains(t, s);
        if (mode == KlMode::Sparse) {
          bool selected = false;
          for (int64_t j = 0; j < kK; ++j) selected |= in.indices->data<int32_t>()[t * kK + j] == s;
          in_set = in_set && selected;
        }
        if (in_set) S.push_back(s);
      }
      if (S.empty()) continue;
      ++rows;
      std::vector<double> p(S.size(), 0.0), qs(S.size());
      for (int64_t h = 0; h < kH; ++h) {
        std::vector<double> l(S.size());
        for (size_t j = 0; j < S.size(); ++j) {
          double dot = 0;
          for (int64_t e = 0; e < kD; ++e) dot += in.q.get((t * kH + h) * kD + e) * in.kv.get(S[j] * kD + e);
          l[j] = in.sm_scale * dot;
        }
        double z = 0;
        for (double x : l) z += std::exp(x);
        for (size_t j = 0; j < S.size(); ++j) p[j] += std::exp(l[j]) / z / kH;
      }
      double zq = 0;
      for (int32_t s : S) zq += std::exp(in.scores.get(t * kSkv + s));
      for (size_t j = 0; j < S.size(); ++j) {
        qs[j] = std::exp(in.scores.get(t * kSkv + S[j])) / zq;
        total += p[j] * std::log(p[j] / qs[j]);
        grads[t].push_back(qs[j] - p[j]);
      }
    }
    for (int64_t t = 0; t < kSq; ++t)
      for (size_t j = 0; j < sets[t].size(); ++j)
        dI.set(t * kSkv + sets[t][j], in.coeff / rows * grads[t][j]);
    const IndexerKlResult r = reference::indexer_kl_loss(in);
    EXPECT_TRUE(test::close(r.loss, Tensor::from_f64({1}, {in.coeff * total / rows}),
                            test::kReassocRelTol)) << to_string(mode);
    EXPECT_TRUE(test::close(r.d_scores, dI, test::kReassocRelTol)) << to_string(mode);
  }
}

}  // namespace
}  // namespace dsa
