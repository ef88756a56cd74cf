// FP8 indexer (SPEC §10): decode exactly, fold the positive k scale into k (float64) or
// apply it after fp32 accumulation (Baseline), then the §2 reference.
#include "dsa/reference/fp8_indexer.h"

#include <cmath>

#include "dsa/reference/indexer.h"
#include "internal.h"

namespace dsa::reference {

Tensor fp8_indexer_scores(const Fp8IndexerInputs& in, Precision precision) {
  const char* where = "fp8_indexer_scores";
  detail::check_rank3(where, "q_idx", in.q_idx, "[s_q, H_I, d_I] (fp8 bytes)");
  check_dtype(where, "q_idx", in.q_idx, {DType::U8});
  detail::check_rank2(where, "k_idx", in.k_idx, "[s_kv, d_I] (fp8 bytes)");
  check_dtype(where, "k_idx", in.k_idx, {DType::U8});
  detail::check_same_last_dim(where, "q_idx", in.q_idx, "k_idx", in.k_idx, "d_I");
  const int64_t s_q = in.q_idx.size(0), s_kv = in.k_idx.size(0), d_i = in.k_idx.size(1);
  check_shape(where, "k_scale", in.k_scale, {s_kv});
  check_dtype(where, "k_scale", in.k_scale, {DType::F32});
  check_shape(where, "w", in.w, {s_q, in.q_idx.size(1)});
  detail::check_wide_dtype(where, "w", in.w);
  detail::check_windows(where, in.windows, s_q, s_kv);
  // Keys read by some window must carry a valid scale; the others are never read.
  std::vector<char> read(static_cast<size_t>(s_kv), 0);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = in.windows.ks[t]; s < in.windows.ke[t]; ++s) read[static_cast<size_t>(s)] = 1;
  const float* scale = in.k_scale.data<float>();
  for (int64_t s = 0; s < s_kv; ++s)
    if (read[static_cast<size_t>(s)]) check_fp8_scale(where, "k_scale", s, scale[s]);

  const Tensor q = fp8_decode(in.q_idx, in.format);
  Tensor k = fp8_decode(in.k_idx, in.format);
  double* kd = k.data<double>();
  if (precision == Precision::Reference) {
    // k·scale is exact in float64 (4 + 24 significant bits); ReLU(s·x) = s·ReLU(x) for s > 0.
    for (int64_t s = 0; s < s_kv; ++s)
      for (int64_t c = 0; c < d_i; ++c)
        kd[s * d_i + c] = read[static_cast<size_t>(s)] ? kd[s * d_i + c] * scale[s] : 0.0;
    return indexer_scores(q, k, in.w, in.windows, Precision::Reference);
  }
  for (int64_t s = 0; s < s_kv; ++s)
    if (!read[static_cast<size_t>(s)])
      for (int64_t c = 0; c < d_i; ++c) kd[s * d_i + c] = 0.0;
  // fp8 values are exact in fp32 and their products are exact in fp32 (8 bits).
  Tensor out = indexer_scores(q.to(DType::F32), k.to(DType::F32), in.w, in.windows,
                              Precision::Baseline);
  float* o = out.data<float>();
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < s_kv; ++s)
      if (std::isfinite(o[t * s_kv + s])) o[t * s_kv + s] *= scale[s];
  return out;
}

}  // namespace dsa::reference
