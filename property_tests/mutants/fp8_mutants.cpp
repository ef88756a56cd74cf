// Mutants of the SPEC §10 inference ops, each imitating one fault (named in the comment
// above it). They wrap the reference backend and implement only the §10 ops.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "dsa/contract/paged_kv.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/reference/fp8_indexer.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/paged_indexer.h"
#include "dsa/reference/sparse_mla.h"
#include "dsa/property_tests/fp8_generators.h"
#include "dsa/reference/sparse_mla_fp8.h"
#include "src/fp8_props_common.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::Op;

// Forwards the §10 ops to the reference; a mutant overrides the one it breaks.
class Fp8Wrap : public Backend {
 public:
  explicit Fp8Wrap(std::string name) : name_(std::move(name)), ref_(oracle::make_reference_backend()) {}
  std::string name() const override { return name_; }
  bool supports(Op op) const override {
    return op == Op::Fp8IndexerScores || op == Op::PagedIndexerScores || op == Op::SparseMlaFp8Fwd;
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override { return ref_->fp8_indexer_scores(in); }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override { return ref_->paged_indexer_scores(in); }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    return ref_->sparse_mla_fp8_forward(in);
  }

 protected:
  std::string name_;
  std::unique_ptr<Backend> ref_;
};

int64_t cache_tokens(const Tensor& cache) { return cache.numel() / kMlaFp8TokenBytes; }

// Sparse MLA FP8: the scale of tile (i+1) mod 4 applied to tile i.
class TileScaleSwapped : public Fp8Wrap {
 public:
  TileScaleSwapped() : Fp8Wrap("fp8_tile_scale_swapped") {}
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaFp8Inputs m = in;
    m.kv_cache = Tensor(DType::U8, in.kv_cache.shape());
    std::memcpy(m.kv_cache.raw(), in.kv_cache.raw(), in.kv_cache.nbytes());
    for (int64_t t = 0; t < cache_tokens(in.kv_cache); ++t) {
      uint8_t* s = m.kv_cache.data<uint8_t>() + t * kMlaFp8TokenBytes + kMlaFp8ScalesOffset;
      uint8_t tmp[16];
      for (int i = 0; i < 4; ++i) std::memcpy(tmp + 4 * i, s + 4 * ((i + 1) % 4), 4);
      std::memcpy(s, tmp, 16);
    }
    return Fp8Wrap::sparse_mla_fp8_forward(m);
  }
};

// Sparse MLA FP8: the 64 bf16 RoPE values dequantized as if they were FP8 bytes (the first
// 64 RoPE bytes as e4m3 with the last tile's scale).
class RopeAsFp8 : public Fp8Wrap {
 public:
  RopeAsFp8() : Fp8Wrap("fp8_rope_dequantized_as_fp8") {}
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    reference::SparseMlaFp8Gather g = reference::gather_sparse_mla_fp8(in);
    for (size_t r = 0; r < g.token_of_row.size(); ++r) {
      const uint8_t* tok = in.kv_cache.data<uint8_t>() + g.token_of_row[r] * kMlaFp8TokenBytes;
      const MlaFp8TokenView v(tok);
      for (int64_t c = 0; c < kMlaFp8RopeDim; ++c)
        g.inputs.kv.set(static_cast<int64_t>(r) * kMlaFp8Dqk + kMlaFp8NopeDim + c,
                        fp8_to_double(tok[kMlaFp8RopeOffset + c], Fp8Format::E4M3FN) * v.tile_scale(3));
    }
    return reference::sparse_mla_forward(g.inputs);
  }
};

// Paged indexer: each request also loads the table entry one block past its context
// (a prefetch), faulting on an id outside the cache and folding the block in with a masked
// multiply (0 · x), which NaN in that block turns into NaN scores.
class ReadsOneBlockPast : public Fp8Wrap {
 public:
  ReadsOneBlockPast() : Fp8Wrap("paged_reads_one_block_past_context") {}
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    Tensor out = Fp8Wrap::paged_indexer_scores(in);
    const int64_t num_blocks = in.k_cache.size(0), bs = in.k_cache.size(1), d = in.k_cache.size(2);
    const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
    const int64_t next_n = in.q_idx.size(1), width = out.size(1);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t i = (static_cast<int64_t>(in.context_lens.get(b)) + bs - 1) / bs;
      if (i >= max_blocks) continue;
      const int64_t blk = static_cast<int64_t>(in.block_table.get(b * max_blocks + i));
      if (blk < 0 || blk >= num_blocks)
        throw std::runtime_error("illegal memory access: block id " + std::to_string(blk) +
                                 " read past the context of request " + std::to_string(b));
      double sum = 0;
      for (int64_t s = 0; s < bs; ++s)
        for (int64_t c = 0; c < d; ++c)
          sum += fp8_to_double(in.k_cache.data<uint8_t>()[(blk * bs + s) * d + c], in.format) *
                 in.k_scale_cache.get(blk * bs + s);
      for (int64_t r = b * next_n; r < (b + 1) * next_n; ++r)
        for (int64_t p = 0; p < width; ++p)
          if (std::isfinite(out.get(r * width + p))) out.set(r * width + p, out.get(r * width + p) + 0.0 * sum);
    }
    return out;
  }
};

// Paged indexer: every next_n row of a request uses the last row's window [0, L).
class NextNSharedWindow : public Fp8Wrap {
 public:
  NextNSharedWindow() : Fp8Wrap("paged_next_n_rows_share_one_window") {}
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    reference::PagedGather g = reference::gather_paged_indexer(in);
    const int64_t next_n = in.q_idx.size(1), rows = g.windows.s_q(), width = g.max_context;
    const int64_t total = g.packed.k_idx.size(0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / next_n;
      g.packed.windows.ke[static_cast<size_t>(r)] = g.offsets[b + 1];
    }
    const Tensor packed = reference::fp8_indexer_scores(g.packed);
    Tensor out(DType::F64, {rows, width});
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / next_n, L = g.offsets[b + 1] - g.offsets[b];
      for (int64_t p = 0; p < width; ++p)
        out.set(r * width + p, p < L ? packed.get(r * total + g.offsets[b] + p)
                                     : -std::numeric_limits<double>::infinity());
    }
    return out;
  }
};

// FP8 indexer: k_scale applied after the ReLU and never validated, so a negative scale is
// accepted (and flips the sign of the key's scores).
class ScaleAfterRelu : public Fp8Wrap {
 public:
  ScaleAfterRelu() : Fp8Wrap("fp8_k_scale_after_relu_negative_allowed") {}
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    const Tensor q = fp8_decode(in.q_idx, in.format), k = fp8_decode(in.k_idx, in.format);
    Tensor out = reference::indexer_scores(q, k, in.w, in.windows);
    const int64_t s_q = out.size(0), s_kv = out.size(1);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t s = 0; s < s_kv; ++s)
        if (in.windows.contains(t, s)) out.set(t * s_kv + s, out.get(t * s_kv + s) * in.k_scale.get(s));
    return out;
  }
};

// A scale that is not positive finite, used without a check: its magnitude, 1 for 0/NaN/inf
// (what a kernel that never validates its scales computes with, one way or another).
float unchecked_scale(float s) {
  return std::isfinite(s) && s != 0.0f ? std::fabs(s) : 1.0f;
}

// Paged indexer: k_scale_cache never validated (fresh-user F2): a read scale <= 0, NaN or
// inf is used as if it were valid, no error.
class PagedScaleNotValidated : public Fp8Wrap {
 public:
  PagedScaleNotValidated() : Fp8Wrap("paged_read_scale_not_validated") {}
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    PagedIndexerInputs m = in;
    m.k_scale_cache = Tensor(DType::F32, in.k_scale_cache.shape());
    for (int64_t i = 0; i < in.k_scale_cache.numel(); ++i)
      m.k_scale_cache.data<float>()[i] = unchecked_scale(in.k_scale_cache.data<float>()[i]);
    return Fp8Wrap::paged_indexer_scores(m);
  }
};

// Paged indexer hiding behind fp8_reduced_accumulation (fresh-user F4): it declares FP8
// tensor-core accumulation, which judges the paged scores by a 1024x looser bound (the
// ":fp8_tensor_core" row, θ 4e-3 of a row's scale), and returns every score x(1 + 1e-3), an
// error under that θ that the ratio rule alone does not catch. The exact tier (integer grids,
// exact in a 14-bit accumulator too) is not loosened and fails it.
class PagedDeclaredReducedScaled : public Fp8Wrap {
 public:
  PagedDeclaredReducedScaled() : Fp8Wrap("paged_declared_reduced_accumulation_scaled") {}
  bool fp8_reduced_accumulation() const override { return true; }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    Tensor s = Fp8Wrap::paged_indexer_scores(in);
    for (int64_t i = 0; i < s.numel(); ++i)
      if (std::isfinite(s.get(i))) s.set(i, static_cast<float>(s.get(i) * (1 + 1e-3)));
    return s;
  }
};

// Sparse MLA FP8: the cache's tile scales never validated (fresh-user F2): a read tile
// scale <= 0, NaN or inf is used as if it were valid, no error.
class SmlaFp8ScaleNotValidated : public Fp8Wrap {
 public:
  SmlaFp8ScaleNotValidated() : Fp8Wrap("smla_fp8_read_scale_not_validated") {}
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaFp8Inputs m = in;
    m.kv_cache = Tensor(DType::U8, in.kv_cache.shape());
    std::memcpy(m.kv_cache.raw(), in.kv_cache.raw(), in.kv_cache.nbytes());
    for (int64_t t = 0; t < cache_tokens(in.kv_cache); ++t)
      for (int64_t tile = 0; tile < kMlaFp8NumTiles; ++tile) {
        uint8_t* p = m.kv_cache.data<uint8_t>() + t * kMlaFp8TokenBytes + kMlaFp8ScalesOffset + 4 * tile;
        float v;
        std::memcpy(&v, p, sizeof v);
        v = unchecked_scale(v);
        std::memcpy(p, &v, sizeof v);
      }
    return Fp8Wrap::sparse_mla_fp8_forward(m);
  }
};

// ---- control: a correct FlashMLA-style FP8 decode kernel (false-alarm check) -------------

// FlashMLA's FP8 sparse decode (SPEC §10): e4m3 → bf16 (exact), times the tile scale in bf16
// arithmetic (the scale rounded to bf16, the product rounded to bf16) when `scale_in_bf16`,
// else times the fp32 scale rounded once to bf16; bf16 q·kv products summed in fp32 (blocks
// of 64, as MMA k-slices), P = exp(logit - max) rounded to bf16 before P·V, fp32
// accumulation, out / Σ exp in bf16, lse and max_logits in fp32.
SparseMlaForward flashmla_fp8_forward_impl(const SparseMlaFp8Inputs& in, bool scale_in_bf16) {
  const int64_t s_q = in.q.size(0), h_q = in.q.size(1), k = in.indices.size(-1);
  const int64_t tokens = cache_tokens(in.kv_cache);
  constexpr int64_t D = kMlaFp8Dqk, DV = kMlaFp8NopeDim;
  auto bf = [](double x) { return static_cast<double>(bf16_to_float(double_to_bf16(x))); };
  std::vector<double> out(static_cast<size_t>(s_q * h_q * DV), 0.0);
  std::vector<double> lse(static_cast<size_t>(s_q * h_q), INFINITY), mx(lse.size(), -INFINITY);
  std::vector<float> kv;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = in.topk_length ? std::min<int64_t>(k, in.topk_length->get(t)) : k;
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < len; ++j) {
      const double id = in.indices.get(t * k + j);
      if (id >= 0 && id < static_cast<double>(tokens)) ids.push_back(static_cast<int64_t>(id));
    }
    const size_t n = ids.size();
    if (n == 0) continue;  // SPEC §6: out 0, lse +inf, max_logits -inf
    kv.assign(n * static_cast<size_t>(D), 0.0f);
    for (size_t j = 0; j < n; ++j) {
      const MlaFp8TokenView tok(in.kv_cache.data<uint8_t>() + ids[j] * kMlaFp8TokenBytes);
      for (int64_t c = 0; c < D; ++c) {
        double v;
        if (c < DV) {
          const double s = tok.tile_scale(c / kMlaFp8TileSize);
          v = bf(fp8_to_double(tok.nope_byte(c), Fp8Format::E4M3FN) * (scale_in_bf16 ? bf(s) : s));
        } else {
          v = tok.value(c);  // bf16 RoPE
        }
        kv[j * D + static_cast<size_t>(c)] = static_cast<float>(v);
      }
    }
    for (int64_t h = 0; h < h_q; ++h) {
      const int64_t row = t * h_q + h;
      std::vector<float> P(n), e(n);
      for (size_t j = 0; j < n; ++j) {
        float acc = 0;
        for (int64_t b = 0; b < D; b += 64) {
          float part = 0;
          for (int64_t c = b; c < std::min<int64_t>(D, b + 64); ++c)
            part += static_cast<float>(in.q.get(row * D + c)) * kv[j * D + static_cast<size_t>(c)];
          acc += part;
        }
        P[j] = static_cast<float>(in.sm_scale) * acc;
      }
      const float m = *std::max_element(P.begin(), P.end());
      float S = 0;
      for (size_t j = 0; j < n; ++j) S += (e[j] = std::exp(P[j] - m));
      const float L0 = m + std::log(S);
      float r = 1.0f;
      if (in.attn_sink) {
        const float sk = static_cast<float>(in.attn_sink->get(h));
        if (sk == INFINITY) r = 0.0f;
        else if (sk != -INFINITY) r = 1.0f / (1.0f + std::exp(sk - L0));
      }
      lse[static_cast<size_t>(row)] = L0;
      mx[static_cast<size_t>(row)] = m;
      for (int64_t c = 0; c < DV; ++c) {
        float acc = 0;
        for (size_t j = 0; j < n; ++j)
          acc += static_cast<float>(bf(e[j])) * kv[j * D + static_cast<size_t>(c)];
        out[static_cast<size_t>(row * DV + c)] = acc / S * r;
      }
    }
  }
  SparseMlaForward f;
  f.out = Tensor::from_f64({s_q, h_q, DV}, out).to(DType::BF16);
  f.lse = Tensor::from_f64({s_q, h_q}, lse).to(DType::F32);
  f.max_logits = Tensor::from_f64({s_q, h_q}, mx).to(DType::F32);
  return f;
}

class FlashMlaFp8Control final : public Fp8Wrap {
 public:
  explicit FlashMlaFp8Control(bool scale_in_bf16)
      : Fp8Wrap(scale_in_bf16 ? "control_flashmla_fp8_bf16_scale" : "control_flashmla_fp8_fp32_scale"),
        scale_in_bf16_(scale_in_bf16) {}
  bool supports(Op op) const override { return op == Op::SparseMlaFp8Fwd; }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    reference::gather_sparse_mla_fp8(in);  // the reference's argument checks (bad scales, ids)
    return flashmla_fp8_forward_impl(in, scale_in_bf16_);
  }

 private:
  bool scale_in_bf16_;
};

}  // namespace

SparseMlaForward flashmla_fp8_forward(const SparseMlaFp8Inputs& in, bool scale_in_bf16) {
  return flashmla_fp8_forward_impl(in, scale_in_bf16);
}

std::vector<Subject> fp8_control_subjects() {
  std::vector<Subject> out;
  for (bool bf16_scale : {true, false}) {
    Subject s;
    s.make = [bf16_scale] { return std::unique_ptr<Backend>(new FlashMlaFp8Control(bf16_scale)); };
    s.name = s.make()->name();
    out.push_back(s);
  }
  return out;
}

std::vector<Subject> fp8_mutant_subjects() {
  return {
      subject_of<TileScaleSwapped>("FP8 KV cache: the scale of one tile applied to another", "smla_fp8."),
      subject_of<RopeAsFp8>("FP8 KV cache: RoPE part dequantized as FP8", "smla_fp8."),
      subject_of<ReadsOneBlockPast>("paged KV: reading one block past the context", "paged."),
      subject_of<NextNSharedWindow>("paged MTP: next_n rows sharing one window", "paged."),
      subject_of<ScaleAfterRelu>("FP8 indexer: k scale after ReLU, negative scale allowed", "fp8."),
      subject_of<PagedScaleNotValidated>("paged indexer: read scales not validated (used as given)",
                                         "paged.invalid_scale_rejected"),
      subject_of<SmlaFp8ScaleNotValidated>("FP8 KV cache: tile scales not validated (used as given)",
                                           "smla_fp8.invalid_scale_rejected"),
      subject_of<PagedDeclaredReducedScaled>(
          "paged indexer: declares fp8_reduced_accumulation, scores x(1 + 1e-3) (under its looser bound)",
          "paged.indexer_exact_tier"),
  };
}

}  // namespace dsa::props
