// A sparse MLA case for the CUDA tests (cuda_backend_test.cpp, sparse_mla_bwd_test.cpp):
// random bf16 q/kv, indices with invalid ids of every kind, duplicates, leading invalid blocks
// and empty rows, optional topk_length and sinks; conditioned for the bf16 class as the
// property suite's draws are (dsa::props::condition_bf16_case), so that no row is WEAK (SPEC
// §9) and the tests judge without allow_weak.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dsa/oracle/op_check.h"
#include "dsa/property_tests/generators.h"

namespace dsa_cuda_test {

struct MlaShape {
  int64_t s_q, h_q, d_qk, d_v, s_kv, k;
};

/// Case of shape s (q [s_q,h_q,d_qk], kv [s_kv,d_qk] bf16 normal(0,1), indices [s_q,k]):
/// one slot in 10 an invalid id (-1, INT32_MIN, s_kv, INT32_MAX), one in 10 a duplicate of the
/// previous slot, rows t%4==1 a leading invalid block of 70 slots, rows t%4==3 empty;
/// with_len: topk_length in [-2, k+3] (row 0: 0); sink_mode 1: normal sinks, 2: also ±inf.
/// sm_scale 1/sqrt(d_qk), d_v = s.d_v. Then conditioned (condition_case below): q rows whose
/// bf16 out would be WEAK are redrawn uniform(-1, 1).
inline dsa::oracle::OpCase make_mla(const MlaShape& s, uint64_t seed, bool with_len,
                                    int sink_mode) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  dsa::oracle::OpCase c;
  c.mla.q = dsa::Tensor(dsa::DType::BF16, {s.s_q, s.h_q, s.d_qk});
  c.mla.kv = dsa::Tensor(dsa::DType::BF16, {s.s_kv, s.d_qk});
  for (int64_t i = 0; i < c.mla.q.numel(); ++i) c.mla.q.set(i, normal(rng));
  for (int64_t i = 0; i < c.mla.kv.numel(); ++i) c.mla.kv.set(i, normal(rng));
  std::vector<int32_t> idx(s.s_q * s.k);
  std::uniform_int_distribution<int64_t> id(0, s.s_kv - 1);
  std::uniform_int_distribution<int> kind(0, 9);
  const int32_t bad[4] = {-1, INT32_MIN, static_cast<int32_t>(s.s_kv), INT32_MAX};
  for (int64_t t = 0; t < s.s_q; ++t) {
    for (int64_t j = 0; j < s.k; ++j) {
      int32_t v = static_cast<int32_t>(id(rng));
      const int r = kind(rng);
      if (r == 0) v = bad[j % 4];                       // holes of every invalid kind
      if (r == 1 && j > 0) v = idx[t * s.k + j - 1];     // duplicates
      if (t % 4 == 1 && j < 70) v = bad[j % 4];         // leading invalid block (> one tile of
                                                        // every kernel: 32, 64, 64 slots)
      if (t % 4 == 3) v = bad[(t + j) % 4];             // empty row
      idx[t * s.k + j] = v;
    }
  }
  c.mla.indices = dsa::Tensor::from_i32({s.s_q, s.k}, idx);
  if (with_len) {
    std::vector<int32_t> len(s.s_q);
    std::uniform_int_distribution<int64_t> l(-2, s.k + 3);
    for (int64_t t = 0; t < s.s_q; ++t) len[t] = static_cast<int32_t>(t == 0 ? 0 : l(rng));
    c.mla.topk_length = dsa::Tensor::from_i32({s.s_q}, len);
  }
  if (sink_mode) {
    dsa::Tensor sink(dsa::DType::F32, {s.h_q});
    const double inf = std::numeric_limits<double>::infinity();
    for (int64_t h = 0; h < s.h_q; ++h)
      sink.set(h, sink_mode == 2 && h % 3 == 0 ? inf : sink_mode == 2 && h % 3 == 1 ? -inf
                                                                                   : normal(rng));
    c.mla.attn_sink = sink;
  }
  c.mla.sm_scale = 1.0 / std::sqrt(static_cast<double>(s.d_qk));
  c.mla.d_v = s.d_v;
  dsa::props::condition_bf16_case(c.mla, nullptr, seed);
  return c;
}

/// Conditions c (bf16 q; dout when defined) for a bf16 kernel as the property suite's draws
/// (dsa::props::condition_bf16_case: q rows whose bf16 out row would be WEAK redrawn, then dout
/// rows whose dq row would be), after a test changed the case (indices, dout). CPU model of
/// these tests' cases (the float64 reference rounded to the kernels' output dtypes, judged by
/// the oracle): before the conditioning 2 of 44 forward and 1 of 16 backward cases had WEAK
/// rows (a bf16 out row; dsink of h_q 3, d_v 17), none after (docs/what-a-pass-means.md).
inline void condition_case(dsa::oracle::OpCase& c, uint64_t seed) {
  dsa::props::condition_bf16_case(c.mla, c.dout.defined() ? &c.dout : nullptr, seed);
}

}  // namespace dsa_cuda_test
