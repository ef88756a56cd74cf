// Sparse MLA forward over the FP8 KV cache (SPEC §10): gather the tokens valid slots read,
// dequantize them, remap ids into the gathered rows, then the §4-§6 reference.
#include "dsa/reference/sparse_mla_fp8.h"

#include <unordered_map>

#include "dsa/reference/sparse_mla.h"
#include "internal.h"
#include "value_limits.h"

namespace dsa::reference {

int64_t mla_fp8_cache_tokens(const char* where, const Tensor& kv_cache) {
  check_dtype(where, "kv_cache", kv_cache, {DType::U8});
  const int64_t r = kv_cache.dim();
  const bool ok = (r >= 2 && r <= 4 && kv_cache.size(-1) == kMlaFp8TokenBytes) &&
                  (r != 4 || kv_cache.size(2) == 1);
  check_arg(ok, where, "kv_cache", "shape " + shape_str(kv_cache.shape()),
            "[tokens, 656], [num_blocks, block_size, 656] or [num_blocks, block_size, 1, 656]");
  return kv_cache.numel() / kMlaFp8TokenBytes;
}

SparseMlaFp8Gather gather_sparse_mla_fp8(const SparseMlaFp8Inputs& in, Precision precision) {
  const char* where = "sparse_mla_fp8_forward";
  detail::check_rank3(where, "q", in.q, "[s_q, h_q, 576]");
  check_shape(where, "q", in.q, {-1, -1, kMlaFp8Dqk});
  detail::check_activation_dtype(where, "q", in.q);
  const int64_t s_q = in.q.size(0);
  const int64_t tokens = mla_fp8_cache_tokens(where, in.kv_cache);
  const bool idx_ok = (in.indices.dim() == 2 && in.indices.size(0) == s_q) ||
                      (in.indices.dim() == 3 && in.indices.size(0) == s_q && in.indices.size(1) == 1);
  check_arg(idx_ok, where, "indices", "shape " + shape_str(in.indices.shape()),
            "shape [" + str(s_q) + ", k] or [" + str(s_q) + ", 1, k]");
  check_dtype(where, "indices", in.indices, {DType::I32});
  if (in.topk_length) {
    check_shape(where, "topk_length", *in.topk_length, {s_q});
    check_dtype(where, "topk_length", *in.topk_length, {DType::I32});
  }
  const int64_t k = in.indices.size(-1);

  // Gather the distinct tokens valid slots address; remap ids, -1 for every invalid slot.
  SparseMlaInputs m;
  m.indices = Tensor(DType::I32, in.indices.shape());
  std::unordered_map<int64_t, int32_t> row_of;
  std::vector<int64_t> used;
  const int32_t* ids = in.indices.data<int32_t>();
  int32_t* out_ids = m.indices.data<int32_t>();
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = in.topk_length ? in.topk_length->data<int32_t>()[t] : k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = ids[t * k + j];
      int32_t mapped = -1;
      if (j < len && id >= 0 && id < tokens) {
        auto it = row_of.find(id);
        if (it == row_of.end()) {
          it = row_of.emplace(id, static_cast<int32_t>(used.size())).first;
          used.push_back(id);
        }
        mapped = it->second;
      }
      out_ids[t * k + j] = mapped;
    }
  }
  const DType kv_dtype = precision == Precision::Reference ? DType::F64
                         : in.q.dtype() == DType::F64      ? DType::F32
                                                           : in.q.dtype();
  m.kv = Tensor(kv_dtype, {static_cast<int64_t>(used.size()), kMlaFp8Dqk});
  const uint8_t* cache = in.kv_cache.data<uint8_t>();
  for (size_t r = 0; r < used.size(); ++r) {
    const MlaFp8TokenView tok(cache + used[r] * kMlaFp8TokenBytes);
    tok.check_scales(where, "kv_cache", used[r]);
    for (int64_t c = 0; c < kMlaFp8Dqk; ++c) {
      const double v = tok.value(c);
      // SPEC §6/§10: a token a valid slot reads holds no NaN (e4m3fn S.1111.111, a bf16 RoPE
      // NaN/inf) and no dequantized value past fp32's range; unread tokens may hold anything.
      if (!detail::fits_fp32(v))
        check_arg(false, where, "kv_cache",
                "token row " + str(used[r]) + " column " + str(c) + " (" +
                    (c < kMlaFp8NopeDim ? "NoPE tile " + str(c / kMlaFp8TileSize) + ", e4m3 value x scale"
                                        : std::string("RoPE, bf16")) +
                    ") = " + str(v),
                detail::fp32_limit_text() + " in every token a valid slot reads (SPEC §6: no valid "
                "input may produce NaN; §10)");
      m.kv.set(static_cast<int64_t>(r) * kMlaFp8Dqk + c, v);  // one rounding
    }
  }
  m.q = in.q;
  m.topk_length = in.topk_length;
  m.attn_sink = in.attn_sink;
  m.sm_scale = in.sm_scale;
  m.d_v = kMlaFp8NopeDim;
  return SparseMlaFp8Gather{std::move(m), std::move(used)};
}

SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in, Precision precision) {
  return sparse_mla_forward(gather_sparse_mla_fp8(in, precision).inputs, precision);
}

}  // namespace dsa::reference
