// Composite ATen kernels of the SPEC §10 ops and their registration (a fragment of the `dsa`
// library; the public entry points below reference this file, so linking pulls it in).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <array>
#include <functional>
#include <limits>
#include <sstream>

#include "dsa/contract/fp8.h"
#include "dsa/optimized/fp8.h"
#include "dsa/optimized/indexer.h"
#include "dsa/optimized/sparse_mla.h"
#include "internal.h"

namespace dsa::optimized {
namespace kernels {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

Fp8Format parse_format(const char* op, c10::string_view s) {
  const std::string f(s.data(), s.size());
  TORCH_CHECK(f == "e4m3fn" || f == "e5m2", op, ": argument 'fp8_format' got \"", f,
              "\", expected \"e4m3fn\" or \"e5m2\"");
  return f == "e4m3fn" ? Fp8Format::E4M3FN : Fp8Format::E5M2;
}

// Exact decoding of fp8 bytes through a 256-entry f32 table (every fp8 value is an f32).
at::Tensor decode(const at::Tensor& bytes, Fp8Format f) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int b = 0; b < 256; ++b) {
      t[0][b] = static_cast<float>(fp8_to_double(static_cast<uint8_t>(b), Fp8Format::E4M3FN));
      t[1][b] = static_cast<float>(fp8_to_double(static_cast<uint8_t>(b), Fp8Format::E5M2));
    }
    return t;
  }();
  const auto& row = tables[f == Fp8Format::E4M3FN ? 0 : 1];
  const at::Tensor lut = at::from_blob(const_cast<float*>(row.data()), {256}, at::kFloat)
                             .to(bytes.device(), /*non_blocking=*/false, /*copy=*/true);
  return lut.index_select(0, bytes.reshape({-1}).to(at::kLong)).view(bytes.sizes());
}

void check_bytes(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kByte, op, ": argument '", arg, "' got dtype ",
              t.scalar_type(), ", expected uint8 (fp8 bytes)");
}

void check_f32(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": argument '", arg, "' got dtype ",
              t.scalar_type(), ", expected float32");
}

// Throws naming `arg` and the first read scale that is not positive finite; `where(i)` names
// flat position i of `scales`.
void check_read_scales(const char* op, const char* arg, const at::Tensor& scales,
                       const at::Tensor& read, const std::function<std::string(int64_t)>& where) {
  const at::Tensor bad = read & (scales.gt(0) & scales.isfinite()).logical_not();
  if (!bad.any().item<bool>()) return;
  const int64_t i = bad.reshape({-1}).nonzero().index({0, 0}).item<int64_t>();
  const double v = scales.reshape({-1}).index({i}).item<double>();
  TORCH_CHECK_VALUE(false, op, ": argument '", arg, "' got ", where(i), " = ", v,
                    ", expected a positive finite fp32 scale for every key that is read (SPEC §10)");
}

}  // namespace

at::Tensor fp8_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx,
                              const at::Tensor& k_scale, const at::Tensor& w,
                              const c10::optional<at::Tensor>& ks,
                              const c10::optional<at::Tensor>& ke, c10::string_view fp8_format) {
  const char* op = "dsa::fp8_indexer_scores";
  using namespace detail;
  const Fp8Format f = parse_format(op, fp8_format);
  check_rank(op, "q_idx", q_idx, 3, "[s_q, H_I, d_I]");
  check_rank(op, "k_idx", k_idx, 2, "[s_kv, d_I]");
  check_rank(op, "k_scale", k_scale, 1, "[s_kv]");
  check_bytes(op, "q_idx", q_idx);
  check_bytes(op, "k_idx", k_idx);
  check_f32(op, "k_scale", k_scale);
  const int64_t s_q = q_idx.size(0), s_kv = k_idx.size(0);
  check_dim(op, "k_idx", k_idx, 1, q_idx.size(2), "[s_kv, d_I]");
  check_dim(op, "k_scale", k_scale, 0, s_kv, "[s_kv]");
  check_device(op, "k_idx", k_idx, q_idx.device());
  check_device(op, "k_scale", k_scale, q_idx.device());
  const at::Tensor mask = window_mask(op, ks, ke, s_q, s_kv, q_idx.device());
  const at::Tensor read = mask.any(0);  // [s_kv]: keys some window reads
  check_read_scales(op, "k_scale", k_scale, read,
                    [](int64_t i) { return "k_scale[" + std::to_string(i) + "]"; });
  // Unread keys may hold NaN bytes: zero them so nothing non-finite enters a product.
  const at::Tensor k = at::where(read.unsqueeze(1), decode(k_idx, f), at::zeros({}, k_scale.options()));
  const at::Tensor raw = indexer_scores(decode(q_idx, f), k, w, ks, ke);  // fp32 accumulation
  const at::Tensor scale = at::where(read, k_scale, at::ones({}, k_scale.options())).to(raw.scalar_type());
  return raw.mul(scale.unsqueeze(0));  // ReLU(s·x) = s·ReLU(x) for s > 0; -inf stays -inf
}

at::Tensor paged_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_cache,
                                const at::Tensor& k_scale_cache, const at::Tensor& w,
                                const at::Tensor& block_table, const at::Tensor& context_lens,
                                int64_t max_context, c10::string_view fp8_format) {
  const char* op = "dsa::paged_indexer_scores";
  using namespace detail;
  const Fp8Format f = parse_format(op, fp8_format);
  check_rank(op, "q_idx", q_idx, 4, "[batch, next_n, H_I, d_I]");
  check_rank(op, "k_cache", k_cache, 3, "[num_blocks, block_size, d_I]");
  check_rank(op, "k_scale_cache", k_scale_cache, 2, "[num_blocks, block_size]");
  check_rank(op, "w", w, 2, "[batch * next_n, H_I]");
  check_rank(op, "block_table", block_table, 2, "[batch, max_blocks]");
  check_rank(op, "context_lens", context_lens, 1, "[batch]");
  check_bytes(op, "q_idx", q_idx);
  check_bytes(op, "k_cache", k_cache);
  check_f32(op, "k_scale_cache", k_scale_cache);
  check_float(op, "w", w, false);
  check_int(op, "block_table", block_table, false);
  check_int(op, "context_lens", context_lens, false);
  const int64_t B = q_idx.size(0), N = q_idx.size(1), H = q_idx.size(2), d = q_idx.size(3);
  const int64_t NB = k_cache.size(0), BS = k_cache.size(1), MB = block_table.size(1);
  check_dim(op, "k_cache", k_cache, 2, d, "[num_blocks, block_size, d_I]");
  check_dim(op, "k_scale_cache", k_scale_cache, 0, NB, "[num_blocks, block_size]");
  check_dim(op, "k_scale_cache", k_scale_cache, 1, BS, "[num_blocks, block_size]");
  check_dim(op, "w", w, 0, B * N, "[batch * next_n, H_I]");
  check_dim(op, "w", w, 1, H, "[batch * next_n, H_I]");
  check_dim(op, "block_table", block_table, 0, B, "[batch, max_blocks]");
  check_dim(op, "context_lens", context_lens, 0, B, "[batch]");
  TORCH_CHECK(BS >= 1, op, ": argument 'k_cache' has block_size 0, expected >= 1");
  for (const auto* t : {&k_cache, &k_scale_cache, &w, &block_table, &context_lens})
    check_device(op, "k_cache/k_scale_cache/w/block_table/context_lens", *t, q_idx.device());
  // The table is validated on the host: only the entries each context reads.
  const at::Tensor lens_h = context_lens.to(at::kCPU).to(at::kLong);
  const at::Tensor table_h = block_table.to(at::kCPU).to(at::kLong);
  const auto L = lens_h.accessor<int64_t, 1>();
  const auto T = table_h.accessor<int64_t, 2>();
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_VALUE(L[b] >= 0 && L[b] <= MB * BS, op, ": argument 'context_lens' got context_lens[", b,
                      "] = ", L[b], ", expected 0 <= context_lens[b] <= block_table.size(1) * block_size = ",
                      MB * BS);
    for (int64_t i = 0; i < (L[b] + BS - 1) / BS; ++i)
      TORCH_CHECK_VALUE(T[b][i] >= 0 && T[b][i] < NB, op, ": argument 'block_table' got block_table[", b,
                        ", ", i, "] = ", T[b][i], " (read for context_lens[", b, "] = ", L[b],
                        "), expected a block id in [0, ", NB, ")");
    longest = std::max(longest, L[b]);
  }
  const int64_t P = max_context < 0 ? longest : max_context;
  TORCH_CHECK_VALUE(P >= longest, op, ": argument 'max_context' got ", max_context,
                    ", expected >= the largest context length ", longest);
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(q_idx.device());
  const at::Tensor p = at::arange(P, lopt);                                  // [P]
  const at::Tensor lens = context_lens.to(at::kLong);                         // [B]
  const at::Tensor valid = p.unsqueeze(0).lt(lens.unsqueeze(1));              // [B, P]
  // Token rows of the read keys; positions past a context point at row 0 and are masked.
  at::Tensor rows = at::zeros({B, P}, lopt);
  if (MB > 0 && P > 0) {
    const at::Tensor col = at::where(valid, p.div(BS, "floor"), at::zeros({}, lopt)).clamp_max(MB - 1);
    const at::Tensor blk = block_table.to(at::kLong).gather(1, col);
    rows = at::where(valid, blk.mul(BS).add(p.remainder(BS).unsqueeze(0)), at::zeros({}, lopt));
  }
  // An empty cache (every context 0) has no row 0 to point masked positions at.
  const bool empty_cache = NB * BS == 0;
  const at::Tensor sc = empty_cache ? at::ones({B, P}, k_scale_cache.options())
                                    : k_scale_cache.reshape({-1}).index_select(0, rows.reshape({-1})).view({B, P});
  const at::Tensor rows_h = rows.to(at::kCPU);
  check_read_scales(op, "k_scale_cache", sc, valid, [&](int64_t i) {
    const int64_t row = rows_h.reshape({-1})[i].item<int64_t>();
    return "k_scale_cache[" + std::to_string(row / BS) + ", " + std::to_string(row % BS) +
           "] (key " + std::to_string(i % std::max<int64_t>(P, 1)) + " of request " +
           std::to_string(i / std::max<int64_t>(P, 1)) + ")";
  });
  const at::Tensor k =
      empty_cache ? at::zeros({B, P, d}, k_scale_cache.options())
                  : at::where(valid.unsqueeze(2),
                              decode(k_cache, f).view({NB * BS, d}).index_select(0, rows.reshape({-1})).view({B, P, d}),
                              at::zeros({}, k_scale_cache.options()));
  const at::ScalarType cdt = compute_dtype({w});
  const at::Tensor q = decode(q_idx, f).to(cdt).view({B, N * H, d});
  const at::Tensor logits = at::matmul(q, k.to(cdt).transpose(1, 2)).view({B, N, H, P});
  at::Tensor scores = logits.relu().mul(w.to(cdt).view({B, N, H, 1})).sum(2);  // [B, N, P]
  scores = scores.mul(at::where(valid, sc, at::ones({}, sc.options())).to(cdt).unsqueeze(1));
  // MTP windows (SPEC §1): row i of request b sees [0, clamp(L - N + i + 1, 0, L)).
  const at::Tensor i = at::arange(N, lopt);
  const at::Tensor ke = (lens.unsqueeze(1) - N + i.unsqueeze(0) + 1).clamp_min(0);  // [B, N]
  const at::Tensor inside = p.view({1, 1, P}).lt(ke.unsqueeze(2));
  return scores.masked_fill(inside.logical_not(), kNegInf).view({B * N, P});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_fp8_fwd(
    const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& indices, double sm_scale,
    const c10::optional<at::Tensor>& topk_length, const c10::optional<at::Tensor>& attn_sink) {
  const char* op = "dsa::sparse_mla_fp8_fwd";
  using namespace detail;
  check_rank(op, "q", q, 3, "[s_q, h_q, 576]");
  check_dim(op, "q", q, 2, kMlaFp8Dqk, "[s_q, h_q, 576]");
  check_bytes(op, "kv_cache", kv_cache);
  TORCH_CHECK(kv_cache.dim() >= 2 && kv_cache.dim() <= 4 && kv_cache.size(-1) == kMlaFp8TokenBytes,
              op, ": argument 'kv_cache' has shape ", sizes_str(kv_cache.sizes()),
              ", expected [tokens, 656] or [num_blocks, block_size(, 1), 656]");
  check_device(op, "kv_cache", kv_cache, q.device());
  const int64_t tokens = kv_cache.numel() / kMlaFp8TokenBytes;
  const at::Tensor cache = kv_cache.reshape({tokens, kMlaFp8TokenBytes});
  const int64_t s_q = q.size(0), k = indices.size(-1);
  check_int(op, "indices", indices, false);
  const at::Tensor ids2d = indices.reshape({s_q, k});
  const auto vs = valid_slots(ids2d, tokens, topk_length);
  // read[t]: some valid slot addresses token t (invalid slots hit the sentinel row `tokens`).
  const at::Tensor hit = at::where(vs.first, vs.second, at::full({}, tokens, vs.second.options()));
  const at::Tensor read = at::zeros({tokens + 1}, q.options().dtype(at::kBool))
                              .index_fill_(0, hit.reshape({-1}), true)
                              .slice(0, 0, tokens);
  // Gather only the tokens valid slots read (the others may hold anything, SPEC §10).
  const at::Tensor used = read.nonzero().reshape({-1});  // ascending token ids
  const at::Tensor rows = cache.index_select(0, used);   // [n, 656]
  const int64_t n = rows.size(0);
  const at::Tensor scales =
      rows.slice(1, kMlaFp8ScalesOffset, kMlaFp8RopeOffset).contiguous().view(at::kFloat);  // [n, 4]
  const at::Tensor bad = (scales.gt(0) & scales.isfinite()).logical_not();
  if (bad.any().item<bool>()) {
    const at::Tensor first = bad.nonzero().index({0});
    const int64_t r = first.index({0}).item<int64_t>(), tile = first.index({1}).item<int64_t>();
    TORCH_CHECK_VALUE(false, op, ": argument 'kv_cache' got token row ", used.index({r}).item<int64_t>(),
                      " tile ", tile, " scale ", scales.index({r, tile}).item<double>(),
                      ", expected a positive finite fp32 scale in every tile a valid slot reads (SPEC §10)");
  }
  // Dequantize (FlashMLA: fp8 · tile scale, converted to the MMA dtype; RoPE stays bf16).
  const at::Tensor nope = decode(rows.slice(1, 0, kMlaFp8NopeDim).contiguous(), Fp8Format::E4M3FN)
                              .view({n, kMlaFp8NumTiles, kMlaFp8TileSize})
                              .mul(scales.unsqueeze(2))
                              .view({n, kMlaFp8NopeDim});
  const at::Tensor rope = rows.slice(1, kMlaFp8RopeOffset, kMlaFp8TokenBytes).contiguous()
                              .view(at::kBFloat16).to(at::kFloat);
  // One zero row at the end keeps kv non-empty when no slot is valid (it is never addressed).
  const at::Tensor kv = at::cat({at::cat({nope, rope}, 1), at::zeros({1, kMlaFp8Dqk}, nope.options())}, 0)
                            .to(q.scalar_type());
  // Ids remapped into the gathered rows (position of the token among `used`); -1 when invalid.
  const at::Tensor pos = read.to(at::kLong).cumsum(0).sub(1);
  const at::Tensor remapped =
      tokens == 0 ? at::full({s_q, k}, -1, ids2d.options().dtype(at::kInt))
                  : at::where(vs.first, pos.index_select(0, vs.second.reshape({-1})).view({s_q, k}),
                              at::full({}, -1, pos.options()))
                        .to(at::kInt);
  return optimized::sparse_mla_fwd(q, kv, remapped, sm_scale, kMlaFp8NopeDim, topk_length, attn_sink);
}

}  // namespace kernels

namespace {
template <class Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
using OptT = c10::optional<at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
}  // namespace

at::Tensor fp8_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_idx,
                              const at::Tensor& k_scale, const at::Tensor& w, const OptT& ks,
                              const OptT& ke, c10::string_view fp8_format) {
  static const auto op =
      handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const OptT&, const OptT&, c10::string_view)>("dsa::fp8_indexer_scores");
  return op.call(q_idx, k_idx, k_scale, w, ks, ke, fp8_format);
}

at::Tensor paged_indexer_scores(const at::Tensor& q_idx, const at::Tensor& k_cache,
                                const at::Tensor& k_scale_cache, const at::Tensor& w,
                                const at::Tensor& block_table, const at::Tensor& context_lens,
                                int64_t max_context, c10::string_view fp8_format) {
  static const auto op =
      handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const at::Tensor&, const at::Tensor&, int64_t, c10::string_view)>(
          "dsa::paged_indexer_scores");
  return op.call(q_idx, k_cache, k_scale_cache, w, block_table, context_lens, max_context, fp8_format);
}

Tensor3 sparse_mla_fp8_fwd(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& indices, double sm_scale, const OptT& topk_length,
                           const OptT& attn_sink) {
  static const auto op =
      handle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const OptT&,
                     const OptT&)>("dsa::sparse_mla_fp8_fwd");
  return op.call(q, kv_cache, indices, sm_scale, topk_length, attn_sink);
}

}  // namespace dsa::optimized

TORCH_LIBRARY_FRAGMENT(dsa, m) {
  namespace k = dsa::optimized::kernels;
  m.def(
      "fp8_indexer_scores(Tensor q_idx, Tensor k_idx, Tensor k_scale, Tensor w, Tensor? ks=None,"
      " Tensor? ke=None, str fp8_format=\"e4m3fn\") -> Tensor",
      &k::fp8_indexer_scores);
  m.def(
      "paged_indexer_scores(Tensor q_idx, Tensor k_cache, Tensor k_scale_cache, Tensor w,"
      " Tensor block_table, Tensor context_lens, int max_context=-1, str fp8_format=\"e4m3fn\")"
      " -> Tensor",
      &k::paged_indexer_scores);
  m.def(
      "sparse_mla_fp8_fwd(Tensor q, Tensor kv_cache, Tensor indices, float sm_scale,"
      " Tensor? topk_length=None, Tensor? attn_sink=None)"
      " -> (Tensor out, Tensor lse, Tensor max_logits)",
      &k::sparse_mla_fp8_fwd);
}
