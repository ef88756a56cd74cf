// Mutants: deliberately faulty backends, each imitating one fault the field has shipped
// (named in the one-line comment above it). Most wrap the reference backend and perturb one
// thing; the block mutants are faulty recompute runners (the oracle's DsaBlock model).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "dsa/contract/fp8_op_types.h"
#include "dsa/oracle/reference_backend.h"
#include "dsa/property_tests/flash_style_kernel.h"
#include "dsa/reference/indexer.h"
#include "dsa/reference/kl_loss.h"
#include "dsa/reference/sparse_mla.h"
#include "src/fp8_props_common.h"
#include "src/props_common.h"
#include "src/reference_wrap.h"

namespace dsa::props {
namespace {

using oracle::Backend;
using oracle::Op;

// Forwards every op to the reference and claims every op but the §10 ones (FP8 and paged
// inputs, which WrapAll forwards); a mutant overrides the one it breaks. A mutant claiming an
// op it does not compute would decline every draw of that op's properties (up to 100 each).
class Wrap : public ReferenceWrap {
 public:
  using ReferenceWrap::ReferenceWrap;
  bool supports(Op op) const override {
    return op != Op::Fp8IndexerScores && op != Op::PagedIndexerScores && op != Op::SparseMlaFp8Fwd;
  }
};
// Wrap with the §10 ops too.
class WrapAll : public Wrap {
 public:
  using Wrap::Wrap;
  bool supports(Op) const override { return true; }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override { return ref_->fp8_indexer_scores(in); }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override { return ref_->paged_indexer_scores(in); }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override { return ref_->sparse_mla_fp8_forward(in); }
};

// ---- index helpers -------------------------------------------------------------------------

int64_t row_len(const SparseMlaInputs& in, int64_t t, int64_t k) {
  return in.topk_length ? static_cast<int64_t>(in.topk_length->get(t)) : k;
}
bool slot_valid(const SparseMlaInputs& in, int64_t t, int64_t j) {
  const int64_t k = in.indices.size(-1), s_kv = in.kv.size(0);
  const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
  return j < row_len(in, t, k) && id >= 0 && id < s_kv;
}
bool row_empty(const SparseMlaInputs& in, int64_t t) {
  for (int64_t j = 0; j < in.indices.size(-1); ++j)
    if (slot_valid(in, t, j)) return false;
  return true;
}
// The valid slots of query row t, head hh, in slot order: their ids and their logits
// sm_scale·q·kv (float64).
void row_logits(const SparseMlaInputs& in, int64_t t, int64_t hh, std::vector<int64_t>* ids, std::vector<double>* P) {
  const int64_t k = in.indices.size(-1), h = in.q.size(1), d_qk = in.q.size(2);
  for (int64_t j = 0; j < k; ++j) {
    if (!slot_valid(in, t, j)) continue;
    const int64_t id = static_cast<int64_t>(in.indices.get(t * k + j));
    double dot = 0;
    for (int64_t d = 0; d < d_qk; ++d) dot += in.q.get((t * h + hh) * d_qk + d) * in.kv.get(id * d_qk + d);
    ids->push_back(id);
    P->push_back(in.sm_scale * dot);
  }
}
// Sets lse and out of every head of query row t to NaN.
void set_row_nan(SparseMlaForward& f, int64_t t, int64_t h, int64_t d_v) {
  for (int64_t i = 0; i < h; ++i) {
    f.lse.set(t * h + i, NAN);
    for (int64_t d = 0; d < d_v; ++d) f.out.set((t * h + i) * d_v + d, NAN);
  }
}
// Copy of `in` with indices[t,j] replaced by f(t, j, id).
template <class F>
SparseMlaInputs remap(const SparseMlaInputs& in, F f) {
  SparseMlaInputs out = in;
  const int64_t k = in.indices.size(-1), s_q = in.q.size(0);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < k; ++j)
      out.indices.set(t * k + j, static_cast<double>(f(t, j, static_cast<int64_t>(in.indices.get(t * k + j)))));
  return out;
}

// Sparse MLA faults expressed as an index rewrite, applied to forward and backward alike.
class IndexRewrite : public Wrap {
 public:
  using Wrap::Wrap;
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    return ref_->sparse_mla_forward(rewrite(in));
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return ref_->sparse_mla_backward(rewrite(in), dout);
  }
  virtual SparseMlaInputs rewrite(const SparseMlaInputs& in) const = 0;
};

// Field fault: sparse MLA reads kv through -1 (Python-style negative indexing → last row).
class ReadsThroughMinusOne final : public IndexRewrite {
 public:
  ReadsThroughMinusOne() : IndexRewrite("smla_reads_through_minus1") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    const int64_t s_kv = in.kv.size(0);
    return remap(in, [&](int64_t, int64_t, int64_t id) { return id == -1 ? s_kv - 1 : id; });
  }
};

// Field fault: the kernel stops at the first invalid slot (assumes padding only at the tail).
class StopsAtFirstInvalid final : public IndexRewrite {
 public:
  StopsAtFirstInvalid() : IndexRewrite("smla_stops_at_first_invalid") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    std::vector<int64_t> first(static_cast<size_t>(in.q.size(0)), in.indices.size(-1));
    for (int64_t t = 0; t < in.q.size(0); ++t)
      for (int64_t j = 0; j < in.indices.size(-1); ++j)
        if (!slot_valid(in, t, j)) { first[static_cast<size_t>(t)] = j; break; }
    return remap(in, [&](int64_t t, int64_t j, int64_t id) { return j >= first[static_cast<size_t>(t)] ? -1 : id; });
  }
};

// Field fault: trusts topk_length and skips per-slot checks (invalid ids inside the length are
// read as a wrapped row).
class TrustsTopkLength final : public IndexRewrite {
 public:
  TrustsTopkLength() : IndexRewrite("smla_trusts_topk_length") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    if (!in.topk_length) return in;
    const int64_t s_kv = in.kv.size(0), k = in.indices.size(-1);
    return remap(in, [&](int64_t t, int64_t j, int64_t id) {
      if (j < row_len(in, t, k) && (id < 0 || id >= s_kv)) return ((id % s_kv) + s_kv) % s_kv;
      return id;
    });
  }
};

// Field fault: ids >= s_kv are clamped to the last row instead of being treated as invalid.
class ClampsLargeIds final : public IndexRewrite {
 public:
  ClampsLargeIds() : IndexRewrite("smla_clamps_ids_ge_s_kv") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    const int64_t s_kv = in.kv.size(0);
    return remap(in, [&](int64_t, int64_t, int64_t id) { return id >= s_kv ? s_kv - 1 : id; });
  }
};

// Field fault: empty rows report lse = -inf (log of an empty sum taken as the running max).
class EmptyRowNegInfLse final : public Wrap {
 public:
  EmptyRowNegInfLse() : Wrap("smla_empty_row_neg_inf_lse") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    const int64_t h = in.q.size(1);
    for (int64_t t = 0; t < in.q.size(0); ++t)
      if (row_empty(in, t))
        for (int64_t i = 0; i < h; ++i) f.lse.set(t * h + i, -INFINITY);
    return f;
  }
};

// Field fault: empty rows produce NaN (0/0 normalisation) in out and lse.
class EmptyRowNaN final : public Wrap {
 public:
  EmptyRowNaN() : Wrap("smla_empty_row_nan") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    const int64_t h = in.q.size(1), d_v = in.d_v;
    for (int64_t t = 0; t < in.q.size(0); ++t)
      if (row_empty(in, t)) set_row_nan(f, t, h, d_v);
    return f;
  }
};

// Field fault: a fully masked leading 64-slot block poisons the online softmax
// (exp(-inf - -inf) = NaN carried into later blocks). Effect model on the reference output.
class LeadingBlockPoison final : public Wrap {
 public:
  LeadingBlockPoison() : Wrap("smla_masked_leading_block_nan") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    const int64_t k = in.indices.size(-1), h = in.q.size(1), d_v = in.d_v, block = 64;
    if (k <= block) return f;
    for (int64_t t = 0; t < in.q.size(0); ++t) {
      bool lead_masked = true;
      for (int64_t j = 0; j < block; ++j) lead_masked = lead_masked && !slot_valid(in, t, j);
      if (!lead_masked || row_empty(in, t)) continue;
      set_row_nan(f, t, h, d_v);
    }
    return f;
  }
};

// Field fault: lse reported in base 2 (older FlashMLA / TileLang) where natural log is required.
class Base2Lse final : public Wrap {
 public:
  Base2Lse() : Wrap("smla_base2_lse") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    for (int64_t i = 0; i < f.lse.numel(); ++i) f.lse.set(i, f.lse.get(i) / std::log(2.0));
    return f;
  }
};

// Field fault: dkv rows are assigned (last writer wins) instead of accumulated for keys
// selected by several queries, heads or slots.
class DkvAssigned final : public Wrap {
 public:
  DkvAssigned() : Wrap("smla_dkv_assigned_not_accumulated") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaGrads g = ref_->sparse_mla_backward(in, dout);
    const int64_t s_q = in.q.size(0), h = in.q.size(1), d_qk = in.q.size(2), d_v = in.d_v;
    Tensor dkv(DType::F64, {in.kv.size(0), d_qk});
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t hh = 0; hh < h; ++hh) {
        std::vector<int64_t> ids;
        std::vector<double> P;
        row_logits(in, t, hh, &ids, &P);
        if (ids.empty()) continue;
        const double m = *std::max_element(P.begin(), P.end());
        double sum = 0;
        for (double p : P) sum += std::exp(p - m);
        double L = m + std::log(sum);
        if (in.attn_sink) {
          const double s = in.attn_sink->get(hh);
          L = s == INFINITY ? INFINITY : (s == -INFINITY ? L : std::max(L, s) + std::log1p(std::exp(-std::abs(L - s))));
        }
        std::vector<double> p(ids.size()), out(static_cast<size_t>(d_v), 0.0);
        for (size_t j = 0; j < ids.size(); ++j) {
          p[j] = std::exp(P[j] - L);
          for (int64_t d = 0; d < d_v; ++d) out[static_cast<size_t>(d)] += p[j] * in.kv.get(ids[j] * d_qk + d);
        }
        double delta = 0;
        for (int64_t d = 0; d < d_v; ++d) delta += out[static_cast<size_t>(d)] * dout.get((t * h + hh) * d_v + d);
        for (size_t j = 0; j < ids.size(); ++j) {
          double dv = 0;
          for (int64_t d = 0; d < d_v; ++d) dv += dout.get((t * h + hh) * d_v + d) * in.kv.get(ids[j] * d_qk + d);
          const double dS = p[j] * (dv - delta);
          for (int64_t d = 0; d < d_qk; ++d) {
            double v = in.sm_scale * dS * in.q.get((t * h + hh) * d_qk + d);
            if (d < d_v) v += p[j] * dout.get((t * h + hh) * d_v + d);
            dkv.set(ids[j] * d_qk + d, v);  // the fault: '=' where '+=' is required
          }
        }
      }
    g.dkv = dkv;
    return g;
  }
};

// Field fault: a "deterministic" backward whose dkv differs run to run (atomics order).
class NondeterministicDkv final : public Wrap {
 public:
  NondeterministicDkv() : Wrap("smla_run_to_run_dkv") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaGrads g = ref_->sparse_mla_backward(in, dout);
    // Run-to-run variation as atomics give it: from the hardware, not from process state
    // (a counter would repeat itself in every freshly forked child of the plugin path).
    if (std::random_device{}() & 1u) {
      int64_t at = 0;
      for (int64_t i = 0; i < g.dkv.numel(); ++i)
        if (std::abs(g.dkv.get(i)) > std::abs(g.dkv.get(at))) at = i;
      if (g.dkv.numel() > 0) g.dkv.set(at, std::nextafter(g.dkv.get(at), INFINITY));
    }
    return g;
  }
};

// Field fault: invalid slots masked with a finite value (-5e4, the fp16-safe "minus
// infinity") instead of being skipped: each masked slot is a term exp(-5e4 - lse) with a
// zero value row (the load is masked). Harmless on ordinary rows, wrong on empty rows (lse
// finite, max_logits -5e4) and on rows whose real logits lie below -5e4 (out ~ 0).
class SmlaFiniteMask final : public Wrap {
 public:
  SmlaFiniteMask() : Wrap("smla_finite_mask_value") {}
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_forward(in);
    const int64_t s_q = in.q.size(0), h = in.q.size(1), d_qk = in.q.size(2), d_v = in.d_v;
    const int64_t k = in.indices.size(-1);
    constexpr double kMask = -5e4;
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t hh = 0; hh < h; ++hh) {
        std::vector<double> P;
        std::vector<int64_t> ids;
        row_logits(in, t, hh, &ids, &P);
        const int64_t n_masked = k - static_cast<int64_t>(ids.size());
        if (n_masked == 0) continue;
        double m = kMask;
        for (double x : P) m = std::max(m, x);
        double sum = static_cast<double>(n_masked) * std::exp(kMask - m);
        for (double x : P) sum += std::exp(x - m);
        const double lse = m + std::log(sum);
        double scale = 1.0;
        if (in.attn_sink) {
          const double sk = in.attn_sink->get(hh);
          scale = sk == INFINITY ? 0.0 : 1.0 / (1.0 + std::exp(sk - lse));
        }
        for (int64_t d = 0; d < d_v; ++d) {
          double o = 0;
          for (size_t j = 0; j < ids.size(); ++j) o += std::exp(P[j] - lse) * in.kv.get(ids[j] * d_qk + d);
          f.out.set((t * h + hh) * d_v + d, o * scale);
        }
        f.lse.set(t * h + hh, lse);
        f.max_logits.set(t * h + hh, m);
      }
    return f;
  }
};

// Field fault: the attention sink is dropped (the kernel's sink argument is not wired
// through): out is not rescaled and no dsink is returned.
class SmlaSinkDropped final : public IndexRewrite {
 public:
  SmlaSinkDropped() : IndexRewrite("smla_sink_dropped") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    SparseMlaInputs out = in;
    out.attn_sink.reset();
    return out;
  }
};

// Field fault: the sink is indexed by h & 3 (a kernel written for 4 heads per block): heads
// >= 4 use another head's sink.
class SmlaSinkHeadMod4 final : public IndexRewrite {
 public:
  SmlaSinkHeadMod4() : IndexRewrite("smla_sink_indexed_by_h_and_3") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    if (!in.attn_sink) return in;
    SparseMlaInputs out = in;
    for (int64_t hh = 0; hh < in.attn_sink->numel(); ++hh) out.attn_sink->set(hh, in.attn_sink->get(hh & 3));
    return out;
  }
};

// Field fault: the backward's dkv loses the contributions of query rows t >= 8 (the dkv
// reduction covers one 8-row tile of queries); dq and dsink are right.
class SmlaDkvDropsRowsFrom8 final : public Wrap {
 public:
  SmlaDkvDropsRowsFrom8() : Wrap("smla_dkv_drops_query_rows_ge_8") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaGrads g = ref_->sparse_mla_backward(in, dout);
    if (in.q.size(0) <= 8) return g;
    const SparseMlaInputs first = remap(in, [](int64_t t, int64_t, int64_t id) { return t >= 8 ? -1 : id; });
    g.dkv = ref_->sparse_mla_backward(first, dout).dkv;
    return g;
  }
};

// True when every slot of row t is valid (inside topk_length, id in [0, s_kv)) and its ids are
// pairwise distinct: the row the top-k hands over when the context holds >= k keys.
bool row_full_and_distinct(const SparseMlaInputs& in, int64_t t) {
  const int64_t k = in.indices.size(-1);
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < k; ++j) {
    if (!slot_valid(in, t, j)) return false;
    ids.push_back(static_cast<int64_t>(in.indices.get(t * k + j)));
  }
  std::sort(ids.begin(), ids.end());
  return std::adjacent_find(ids.begin(), ids.end()) == ids.end();
}

// Field fault: a "full tile" fast path, taken when k is a multiple of the 64-slot tile and a
// row's k ids are all valid and distinct (no masking, dkv without atomics), fetches kv through
// 16-row boxes whose coordinate it passes in boxes, not rows: it reads row (id >> 4) + id % 16,
// right for ids < 16 and another key for every id >= 16; rows with padding, holes or repeats
// take the general path and are right. Forward and backward.
class SmlaFullTileBoxCoordinate final : public IndexRewrite {
 public:
  SmlaFullTileBoxCoordinate() : IndexRewrite("smla_full_tile_box_coordinate") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    const int64_t k = in.indices.size(-1);
    if (k == 0 || k % 64 != 0) return in;
    std::vector<uint8_t> full(static_cast<size_t>(in.q.size(0)));
    for (int64_t t = 0; t < in.q.size(0); ++t) full[static_cast<size_t>(t)] = row_full_and_distinct(in, t);
    return remap(in, [&](int64_t t, int64_t, int64_t id) {
      return full[static_cast<size_t>(t)] ? (id >> 4) + id % 16 : id;
    });
  }
};

// Field fault (outside tester F3): kv row ids kept in 16 bits (uint16 row offsets, ids &
// 0xFFFF): a valid id past 65535 reads row id & 0xFFFF, forward and backward.
class SmlaIds16Bit final : public IndexRewrite {
 public:
  SmlaIds16Bit() : IndexRewrite("smla_ids_16bit") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    const int64_t s_kv = in.kv.size(0);
    return remap(in, [&](int64_t, int64_t, int64_t id) { return id >= 0 && id < s_kv ? id & 0xFFFF : id; });
  }
};

// Field fault (outside tester F3): FP8 sparse MLA token ids kept in 16 bits: a valid token id
// past 65535 reads token id & 0xFFFF of the cache.
class SmlaFp8TokenIds16Bit final : public WrapAll {
 public:
  SmlaFp8TokenIds16Bit() : WrapAll("smla_fp8_token_ids_16bit") {}
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaFp8Inputs m = in;
    m.indices = Tensor(in.indices.dtype(), in.indices.shape());
    const int64_t tokens = in.kv_cache.numel() / kMlaFp8TokenBytes;
    for (int64_t i = 0; i < in.indices.numel(); ++i) {
      const int64_t id = static_cast<int64_t>(in.indices.get(i));
      m.indices.set(i, static_cast<double>(id >= 0 && id < tokens ? id & 0xFFFF : id));
    }
    return ref_->sparse_mla_fp8_forward(m);
  }
};

// ---- top-k -----------------------------------------------------------------------------

Tensor map_scores(const Tensor& s, double from_nan_or_value, bool nan, double to) {
  Tensor c = s;
  for (int64_t i = 0; i < c.numel(); ++i) {
    const double v = c.get(i);
    if (nan ? std::isnan(v) : v == from_nan_or_value) c.set(i, to);
  }
  return c;
}

// Field fault: top-k selects NaN (torch.topk ranks NaN above +inf).
class TopkSelectsNaN final : public Wrap {
 public:
  TopkSelectsNaN() : Wrap("topk_selects_nan") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    return ref_->select_topk(map_scores(s, 0, true, INFINITY), k, p, w);
  }
};

// Field fault: -inf entries are returned as valid ids instead of -1.
class TopkNegInfValid final : public Wrap {
 public:
  TopkNegInfValid() : Wrap("topk_neg_inf_as_valid_id") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    return ref_->select_topk(map_scores(s, -INFINITY, false, -FLT_MAX), k, p, w);
  }
};

// Field fault: top-k sanitising its scores with !isfinite(x): +inf entries are dropped like
// -inf (SPEC §3.1 selects them; fresh17 F1: passed 9 of 13 level-0 audits).
class TopkDropsPosInf final : public Wrap {
 public:
  TopkDropsPosInf() : Wrap("topk_drops_pos_inf") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    return ref_->select_topk(map_scores(s, INFINITY, false, -INFINITY), k, p, w);
  }
};

// Field fault: top-k comparing with subnormal scores flushed to +0 (fast-math / FTZ comparison,
// SPEC §3 selects on the exact fp32 values; fresh18 F1: passed 5 of 11 level-0 audits).
class TopkFlushesSubnormals final : public Wrap {
 public:
  TopkFlushesSubnormals() : Wrap("topk_flushes_subnormals") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor c = s;
    for (int64_t i = 0; i < c.numel(); ++i) {
      const double v = c.get(i);
      if (v != 0 && std::abs(v) < static_cast<double>(FLT_MIN)) c.set(i, 0.0);
    }
    return ref_->select_topk(c, k, p, w);
  }
};

// Field fault: padding written as 0 instead of -1 (reads kv row 0 downstream).
class TopkZeroPadding final : public Wrap {
 public:
  TopkZeroPadding() : Wrap("topk_zero_padding") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(s, k, p, w);
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (ids.get(i) == -1) ids.set(i, 0);
    return ids;
  }
};

// Field fault: random tie choice under tie_break=small (unstable radix/bitonic tie fill).
class TopkRandomTies final : public Wrap {
 public:
  TopkRandomTies() : Wrap("topk_random_ties_under_small") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (p.tie_break != TieBreak::Small) return ref_->select_topk(s, k, p, w);
    const int64_t s_q = s.size(0), s_kv = s.size(1);
    Tensor out(DType::I32, {s_q, k});
    std::mt19937_64 rng(++calls_);
    for (int64_t t = 0; t < s_q; ++t) {
      std::vector<std::pair<double, uint64_t>> key;
      std::vector<int64_t> ids;
      for (int64_t c = 0; c < s_kv; ++c) {
        const double v = s.get(t * s_kv + c);
        if ((w && !w->contains(t, c)) || std::isnan(v) || v == -INFINITY) continue;
        ids.push_back(c);
        key.push_back({v, rng()});
      }
      std::vector<size_t> order(ids.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return key[a].first != key[b].first ? key[a].first > key[b].first : key[a].second < key[b].second;
      });
      for (int64_t j = 0; j < k; ++j)
        out.set(t * k + j, j < static_cast<int64_t>(order.size()) ? static_cast<double>(ids[order[static_cast<size_t>(j)]]) : -1.0);
    }
    return out;
  }

 private:
  uint64_t calls_ = 0;
};

// Field fault: sorted=true ignored (prefix returned in column order).
class TopkIgnoresSorted final : public Wrap {
 public:
  TopkIgnoresSorted() : Wrap("topk_ignores_sorted") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(s, k, p, w);
    if (!p.sorted) return ids;
    for (int64_t t = 0; t < ids.size(0); ++t) {
      std::vector<int32_t> row;
      for (int64_t j = 0; j < k; ++j)
        if (ids.get(t * k + j) >= 0) row.push_back(static_cast<int32_t>(ids.get(t * k + j)));
      std::sort(row.begin(), row.end());
      for (size_t j = 0; j < row.size(); ++j) ids.set(t * k + static_cast<int64_t>(j), row[j]);
    }
    return ids;
  }
};

// Field fault: ids returned as int64 (torch.topk's dtype) where int32 is required.
class TopkInt64Ids final : public Wrap {
 public:
  TopkInt64Ids() : Wrap("topk_int64_ids") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    return ref_->select_topk(s, k, p, w).to(DType::I64);
  }
};

// Field fault: non-contiguous ids (a transposed [k, s_q] view) copied out by raw bytes.
class TopkNonContiguousIds final : public Wrap {
 public:
  TopkNonContiguousIds() : Wrap("topk_non_contiguous_ids") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    const Tensor ids = ref_->select_topk(s, k, p, w);
    const int64_t s_q = ids.size(0);
    Tensor out(DType::I32, {s_q, k});
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < k; ++j) out.set(j * s_q + t, ids.get(t * k + j));
    return out;
  }
};

// Order-preserving uint32 key of an fp32 score (the radix-select key); -0.0 is folded onto
// +0.0 first (SPEC §3.3: they tie), as a correct radix kernel does, so the overflow below is
// the mutant's only fault.
uint32_t radix_key(double v) {
  const float f = v == 0.0 ? 0.0f : static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Field fault (vLLM, SGLang, FlashInfer, TensorRT-LLM, 2026): radix top-k whose first pass
// builds a histogram of the top `bits` bits of the key, takes every key above the threshold
// bin, and collects the threshold bin's keys into a candidate buffer of `capacity` slots for
// the refining passes; candidates past the buffer are silently dropped (no overflow path).
// Slots the buffer cannot fill stay -1.
class TopkCandidateOverflow final : public Wrap {
 public:
  TopkCandidateOverflow(const char* name, int bits, int64_t capacity)
      : Wrap(name), bits_(bits), capacity_(capacity) {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    const int64_t s_q = s.size(0), s_kv = s.size(1);
    Tensor kept = s;  // entries the kernel can still select; the rest become -inf
    const int shift = 32 - bits_;
    for (int64_t t = 0; t < s_q; ++t) {
      std::vector<int64_t> hist(size_t{1} << bits_, 0);
      auto selectable = [&](int64_t c) {
        const double v = s.get(t * s_kv + c);
        return (!w || w->contains(t, c)) && !std::isnan(v) && v != -INFINITY;
      };
      int64_t n_sel = 0;
      for (int64_t c = 0; c < s_kv; ++c)
        if (selectable(c)) { ++hist[radix_key(s.get(t * s_kv + c)) >> shift]; ++n_sel; }
      const int64_t k_eff = std::min(k, n_sel);
      if (k_eff == 0) continue;
      int64_t above = 0, bin = static_cast<int64_t>(hist.size()) - 1;
      while (above + hist[static_cast<size_t>(bin)] < k_eff) above += hist[static_cast<size_t>(bin--)];
      int64_t buffered = 0;
      for (int64_t c = 0; c < s_kv; ++c) {
        if (!selectable(c)) continue;
        const int64_t b = static_cast<int64_t>(radix_key(s.get(t * s_kv + c)) >> shift);
        const bool keep = b > bin || (b == bin && buffered++ < capacity_);
        if (!keep) kept.set(t * s_kv + c, -INFINITY);
      }
    }
    return ref_->select_topk(kept, k, p, w);
  }

 private:
  int bits_;
  int64_t capacity_;
};

// Field fault: the scan reads past the row's end: scores are loaded 8 at a time (two float4)
// from ks and the last chunk is not masked, so up to 7 keys past ke (or past s_kv, into the
// next row of the row-major table) are candidates.
class TopkReadsPastRowEnd final : public Wrap {
 public:
  TopkReadsPastRowEnd() : Wrap("topk_reads_past_row_end") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    const int64_t s_q = s.size(0), s_kv = s.size(1), wide = s_kv + 7;
    Tensor big(DType::F32, {s_q, wide});  // each row followed by what memory holds after it
    std::vector<int64_t> ks(static_cast<size_t>(s_q)), ke(static_cast<size_t>(s_q));
    for (int64_t t = 0; t < s_q; ++t) {
      for (int64_t c = 0; c < wide; ++c) {
        const int64_t flat = t * s_kv + c;
        big.set(t * wide + c, flat < s.numel() ? s.get(flat) : -INFINITY);
      }
      const int64_t a = w ? w->ks[t] : 0, e = w ? w->ke[t] : s_kv;
      ks[static_cast<size_t>(t)] = a;
      ke[static_cast<size_t>(t)] = e > a ? a + (e - a + 7) / 8 * 8 : e;
    }
    Tensor ids = ref_->select_topk(big, k, p, KeyWindows::explicit_windows(ks, ke, wide));
    return ids;  // ids >= s_kv are the reads past the row
  }
};

// Field fault: an all-tie row (nothing above v*) is written twice by the threshold pass and
// the tie-fill pass (a '>=' where '>' is required): the first half of the tie candidates
// appears twice and the rest is missing.
class TopkDuplicateIdsOnAllTieRow final : public Wrap {
 public:
  TopkDuplicateIdsOnAllTieRow() : Wrap("topk_duplicate_ids_all_tie_row") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(s, k, p, w);
    const int64_t s_kv = s.size(1);
    for (int64_t t = 0; t < s.size(0); ++t) {
      int64_t n = 0;
      while (n < k && ids.get(t * k + n) >= 0) ++n;
      if (n < 2) continue;
      const double first = s.get(t * s_kv + static_cast<int64_t>(ids.get(t * k)));
      bool all_tie = true;
      for (int64_t c = 0; c < s_kv; ++c) {
        const double v = s.get(t * s_kv + c);
        if ((!w || w->contains(t, c)) && !std::isnan(v) && v != -INFINITY && v != first) all_tie = false;
      }
      if (!all_tie) continue;
      const int64_t half = (n + 1) / 2;
      for (int64_t j = half; j < n; ++j) ids.set(t * k + j, ids.get(t * k + j - half));
    }
    return ids;
  }
};

// Field fault: when the ties at v* outnumber the free slots, the tie fill takes its overflow
// exit and leaves those slots unwritten: they hold what the (zero-initialised) output
// buffer held.
class TopkUnwrittenOnTieOverflow final : public Wrap {
 public:
  TopkUnwrittenOnTieOverflow() : Wrap("topk_unwritten_slots_on_tie_overflow") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(s, k, p, w);
    const int64_t s_kv = s.size(1);
    for (int64_t t = 0; t < s.size(0); ++t) {
      int64_t n = 0;
      while (n < k && ids.get(t * k + n) >= 0) ++n;
      if (n == 0) continue;
      // v* = the smallest selected value; count the selectable ties at v*.
      double vstar = INFINITY;
      for (int64_t j = 0; j < n; ++j) vstar = std::min(vstar, s.get(t * s_kv + static_cast<int64_t>(ids.get(t * k + j))));
      int64_t ties = 0, picked_ties = 0;
      for (int64_t c = 0; c < s_kv; ++c)
        if ((!w || w->contains(t, c)) && s.get(t * s_kv + c) == vstar) ++ties;
      for (int64_t j = 0; j < n; ++j)
        if (s.get(t * s_kv + static_cast<int64_t>(ids.get(t * k + j))) == vstar) ++picked_ties;
      if (ties <= picked_ties) continue;  // the ties fit: no overflow
      for (int64_t j = 0; j < n; ++j)
        if (s.get(t * s_kv + static_cast<int64_t>(ids.get(t * k + j))) == vstar) ids.set(t * k + j, 0);
    }
    return ids;
  }
};

// Field fault: a negative row length (ke < ks: an inverted window, or an end below the start)
// is not clamped to 0; taken as unsigned it is huge and the scan runs from ks to the row end.
class TopkNegativeEndNotClamped final : public Wrap {
 public:
  TopkNegativeEndNotClamped() : Wrap("topk_negative_row_end_not_clamped") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (!w) return ref_->select_topk(s, k, p, w);
    std::vector<int64_t> ke = w->ke;
    for (int64_t t = 0; t < w->s_q(); ++t)
      if (ke[static_cast<size_t>(t)] < w->ks[static_cast<size_t>(t)]) ke[static_cast<size_t>(t)] = w->s_kv;
    return ref_->select_topk(s, k, p, KeyWindows::explicit_windows(w->ks, ke, w->s_kv));
  }
};

// Field fault: a packed batch passes each row's end local to its sequence (ke - ks, the
// position inside the sequence) where the kernel expects the global column end: rows of
// every sequence but the first see [ks, ke - ks).
class TopkLocalRowEnds final : public Wrap {
 public:
  TopkLocalRowEnds() : Wrap("topk_packed_local_row_ends") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    if (!w) return ref_->select_topk(s, k, p, w);
    std::vector<int64_t> ke = w->ke;
    for (int64_t t = 0; t < w->s_q(); ++t)
      ke[static_cast<size_t>(t)] = w->ke[static_cast<size_t>(t)] - w->ks[static_cast<size_t>(t)];
    return ref_->select_topk(s, k, p, KeyWindows::explicit_windows(w->ks, ke, w->s_kv));
  }
};

// ---- indexer ---------------------------------------------------------------------------

// Field fault: causal window off by one (the key at ke is visible).
class CausalOffByOne final : public Wrap {
 public:
  CausalOffByOne() : Wrap("indexer_causal_window_off_by_one") {}
  static KeyWindows widen(const KeyWindows& w) {
    std::vector<int64_t> ke = w.ke;
    for (auto& e : ke) e = std::min(e + 1, w.s_kv);
    return KeyWindows::explicit_windows(w.ks, ke, w.s_kv);
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, k, w, widen(win));
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(q, k, w, widen(win), d);
  }
};

// Scalar indexer with a switchable fault (float64 or bf16 accumulation; ReLU placement).
Tensor indexer_loop(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win,
                    bool relu_after_weight, bool bf16_acc) {
  const int64_t s_q = q.size(0), H = q.size(1), d_I = q.size(2), s_kv = k.size(0);
  auto round = [&](double v) { return bf16_acc ? static_cast<double>(bf16_to_float(double_to_bf16(v))) : v; };
  Tensor out(bf16_acc ? DType::F32 : DType::F64, {s_q, s_kv});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < s_kv; ++s) {
      if (!win.contains(t, s)) { out.set(t * s_kv + s, -INFINITY); continue; }
      double acc = 0;
      for (int64_t j = 0; j < H; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < d_I; ++d) dot = round(dot + q.get((t * H + j) * d_I + d) * k.get(s * d_I + d));
        const double wj = w.get(t * H + j);
        acc = round(acc + (relu_after_weight ? std::max(0.0, wj * dot) : wj * std::max(0.0, dot)));
      }
      out.set(t * s_kv + s, acc);
    }
  return out;
}

// Field fault: ReLU applied after the head weight (negative weights clipped).
class ReluAfterWeight final : public Wrap {
 public:
  ReluAfterWeight() : Wrap("indexer_relu_after_weight") {}
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return indexer_loop(q, k, w, win, true, false);
  }
};

// Field fault: indexer products accumulated in bf16 (overflow / precision loss).
class Bf16Accumulation final : public Wrap {
 public:
  Bf16Accumulation() : Wrap("indexer_bf16_accumulation") {}
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return indexer_loop(q, k, w, win, false, true);
  }
};

// Field fault (outside tester F3): indexer key rows addressed in 16 bits: key s past 65535
// is scored (and its gradients formed) with k_idx row s & 0xFFFF.
class IndexerKeys16Bit final : public Wrap {
 public:
  IndexerKeys16Bit() : Wrap("indexer_keys_16bit") {}
  static Tensor alias_keys(const Tensor& k) {
    Tensor out = k;
    const int64_t s_kv = k.size(0), d = k.size(1);
    for (int64_t s = 0x10000; s < s_kv; ++s)
      for (int64_t x = 0; x < d; ++x) out.set(s * d + x, k.get((s & 0xFFFF) * d + x));
    return out;
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, alias_keys(k), w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(q, alias_keys(k), w, win, d);
  }
};

// Field fault (outside tester F3): FP8 indexer key rows addressed in 16 bits: key s past
// 65535 is scored with k_idx row s & 0xFFFF and its k_scale.
class Fp8IndexerKeys16Bit final : public WrapAll {
 public:
  Fp8IndexerKeys16Bit() : WrapAll("fp8_indexer_keys_16bit") {}
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    Fp8IndexerInputs m = in;
    const int64_t s_kv = in.k_idx.size(0), d = in.k_idx.size(1);
    for (int64_t s = 0x10000; s < s_kv; ++s) {
      std::memcpy(m.k_idx.data<uint8_t>() + s * d, in.k_idx.data<uint8_t>() + (s & 0xFFFF) * d, static_cast<size_t>(d));
      m.k_scale.data<float>()[s] = in.k_scale.data<float>()[s & 0xFFFF];
    }
    return ref_->fp8_indexer_scores(m);
  }
};

// Field fault (outside tester F3): paged indexer block_table entries kept in 16 bits (uint16
// physical block ids): a read block id past 65535 reads block id & 0xFFFF.
class PagedBlockIds16Bit final : public WrapAll {
 public:
  PagedBlockIds16Bit() : WrapAll("paged_block_ids_16bit") {}
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    PagedIndexerInputs m = in;
    const int64_t num_blocks = in.k_cache.size(0);
    int32_t* tab = m.block_table.data<int32_t>();
    for (int64_t i = 0; i < m.block_table.numel(); ++i)
      if (tab[i] >= 0 && tab[i] < num_blocks) tab[i] &= 0xFFFF;
    return ref_->paged_indexer_scores(m);
  }
};

// Field fault (outside tester F3): paged indexer key positions kept in 16 bits (with block
// size 1 that is the logical block index into block_table): key p past 65535 of a request is
// read at position p & 0xFFFF, so row r's score of key p is its score of key p & 0xFFFF
// (inside r's window, which starts at 0: SPEC §10).
class PagedPositions16Bit final : public WrapAll {
 public:
  PagedPositions16Bit() : WrapAll("paged_positions_16bit") {}
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    Tensor out = ref_->paged_indexer_scores(in);
    const int64_t rows = out.size(0), width = out.size(1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0x10000; p < width; ++p) {
        const double v = out.get(r * width + p);
        if (v != -INFINITY) out.set(r * width + p, out.get(r * width + (p & 0xFFFF)));
      }
    return out;
  }
};

// Field fault (outside tester F4): the indexer converts q_idx and k_idx to bf16 before its
// GEMM whatever their dtype (fp16 and fp32 inputs lose their low bits), forward and backward.
class IndexerRoundsInputsToBf16 final : public Wrap {
 public:
  IndexerRoundsInputsToBf16() : Wrap("indexer_rounds_inputs_to_bf16") {}
  static Tensor bf16(const Tensor& t) { return t.to(DType::BF16).to(t.dtype()); }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(bf16(q), bf16(k), w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(bf16(q), bf16(k), w, win, d);
  }
};

// ---- KL loss ---------------------------------------------------------------------------

// Field fault: the KL teacher Σ_h softmax is not L1-normalised (sums to h_q).
class UnnormalisedTeacher final : public Wrap {
 public:
  UnnormalisedTeacher() : Wrap("kl_unnormalised_teacher") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = ref_->indexer_kl_loss(in);
    // With p' = h·p: loss' = h·loss + coeff·h·ln h (over non-empty rows), d' = h·d.
    const double h = static_cast<double>(in.q.size(1));
    bool any_row = false;
    for (int64_t t = 0; t < in.windows.s_q(); ++t) {
      if (in.mode == KlMode::Dense) any_row = any_row || in.windows.length(t) > 0;
      else {
        const int64_t k = in.indices->size(-1);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = static_cast<int64_t>(in.indices->get(t * k + j));
          any_row = any_row || (id >= 0 && id < in.windows.s_kv && in.windows.contains(t, id));
        }
      }
    }
    for (int64_t i = 0; i < r.loss.numel(); ++i)
      r.loss.set(i, h * r.loss.get(i) + (any_row ? in.coeff * h * std::log(h) : 0.0));
    for (int64_t i = 0; i < r.d_scores.numel(); ++i) r.d_scores.set(i, h * r.d_scores.get(i));
    return r;
  }
};

// Field fault: the KL loss is averaged over all s_q rows, empty ones included (the mean is
// taken over the batch instead of over rows with a non-empty key set S_t): loss and
// d_scores are scaled by n_rows / s_q.
class KlMeanOverAllRows final : public Wrap {
 public:
  KlMeanOverAllRows() : Wrap("kl_mean_over_all_rows") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = ref_->indexer_kl_loss(in);
    const int64_t s_q = in.windows.s_q(), s_kv = in.windows.s_kv;
    int64_t n_rows = 0;
    for (int64_t t = 0; t < s_q; ++t) {
      bool any = false;
      auto in_set = [&](int64_t s) {
        return s >= 0 && s < s_kv && in.windows.contains(t, s) && in.scores.get(t * s_kv + s) != -INFINITY;
      };
      if (in.mode == KlMode::Dense) {
        for (int64_t s = 0; s < s_kv && !any; ++s) any = in_set(s);
      } else {
        const int64_t k = in.indices->size(-1);
        for (int64_t j = 0; j < k && !any; ++j) any = in_set(static_cast<int64_t>(in.indices->get(t * k + j)));
      }
      n_rows += any;
    }
    if (s_q == 0 || n_rows == 0) return r;
    const double f = static_cast<double>(n_rows) / static_cast<double>(s_q);
    for (int64_t i = 0; i < r.loss.numel(); ++i) r.loss.set(i, f * r.loss.get(i));
    for (int64_t i = 0; i < r.d_scores.numel(); ++i) r.d_scores.set(i, f * r.d_scores.get(i));
    return r;
  }
};

// Field fault (fresh16 F1): the KL loss ignores ks/ke (S_t = every key, or every valid
// selected id, whose score is not -inf), relying on -inf scores outside the windows; SPEC §1/§7
// exclude keys outside the window whatever their score. Caught only where a draw holds finite
// scores outside a window (fill_kl_outside_windows, generators.cpp).
class KlIgnoresWindows final : public Wrap {
 public:
  KlIgnoresWindows() : Wrap("kl_ignores_windows") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlInputs all = in;
    all.windows = KeyWindows::full(in.windows.s_q(), in.windows.s_kv);
    return ref_->indexer_kl_loss(all);
  }
};

// Field fault: -inf scores stay in S_t, so a row whose keys all score -inf gives NaN
// (log_softmax over only -inf) in its d_scores and in the loss; other rows are correct.
class KlNegInfRowNaN final : public Wrap {
 public:
  KlNegInfRowNaN() : Wrap("kl_neg_inf_row_nan") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = ref_->indexer_kl_loss(in);
    const int64_t s_kv = in.windows.s_kv;
    for (int64_t t = 0; t < in.windows.s_q(); ++t) {
      std::vector<int64_t> keys;  // S_t without the -inf rule
      if (in.mode == KlMode::Dense) {
        for (int64_t s = in.windows.ks[t]; s < in.windows.ke[t]; ++s) keys.push_back(s);
      } else {
        const int64_t k = in.indices->size(-1);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = static_cast<int64_t>(in.indices->get(t * k + j));
          if (id >= 0 && id < s_kv && in.windows.contains(t, id)) keys.push_back(id);
        }
      }
      bool all_neg_inf = !keys.empty();
      for (int64_t s : keys) all_neg_inf = all_neg_inf && in.scores.get(t * s_kv + s) == -INFINITY;
      if (!all_neg_inf) continue;
      for (int64_t s : keys) r.d_scores.set(t * s_kv + s, NAN);
      r.loss.set(0, NAN);
    }
    return r;
  }
};

// Field fault (fresh-user F17): the KL teacher's logits come out of a 16-bit GEMM: with bf16
// (or fp16) q/kv the dot q·kv is accumulated exactly but returned in q's dtype, then scaled
// by sm_scale and softmaxed; the student, loss and d_scores are computed as the reference
// does, outputs fp32. SPEC §7's source (Megatron-LM) forms fp32 logits from bf16 activations.
// fp32 q/kv: the reference (an fp32 GEMM rounds nothing that matters here).
class KlTeacher16BitLogits final : public Wrap {
 public:
  KlTeacher16BitLogits() : Wrap("kl_teacher_16bit_logits") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    const DType dt = in.q.dtype();
    if (dt != DType::BF16 && dt != DType::F16) return ref_->indexer_kl_loss(in);
    auto round16 = [dt](double v) {
      return dt == DType::BF16 ? static_cast<double>(bf16_to_float(double_to_bf16(v)))
                               : static_cast<double>(f16_to_float(double_to_f16(v)));
    };
    const int64_t s_q = in.scores.size(0), s_kv = in.scores.size(1), h = in.q.size(1), d = in.q.size(2);
    std::vector<double> d_scores(static_cast<size_t>(s_q * s_kv), 0.0), kl_rows;
    std::vector<int64_t> S;
    std::vector<double> p, logq, P;
    for (int64_t t = 0; t < s_q; ++t) {
      // S_t (SPEC §7): window keys (dense) or distinct valid ids in the window (sparse),
      // without keys whose score is -inf.
      S.clear();
      if (in.mode == KlMode::Dense) {
        for (int64_t s = in.windows.ks[t]; s < in.windows.ke[t]; ++s) S.push_back(s);
      } else {
        const int64_t k = in.indices->size(-1);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = static_cast<int64_t>(in.indices->get(t * k + j));
          if (id >= 0 && id < s_kv && in.windows.contains(t, id)) S.push_back(id);
        }
        std::sort(S.begin(), S.end());
        S.erase(std::unique(S.begin(), S.end()), S.end());
      }
      S.erase(std::remove_if(S.begin(), S.end(), [&](int64_t s) { return in.scores.get(t * s_kv + s) == -INFINITY; }),
              S.end());
      const size_t n = S.size();
      if (n == 0) continue;
      p.assign(n, 0.0);
      P.resize(n);
      for (int64_t hh = 0; hh < h; ++hh) {  // teacher: Σ_h softmax over 16-bit logits
        double mx = -INFINITY, sum = 0;
        for (size_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += in.q.get((t * h + hh) * d + c) * in.kv.get(S[j] * d + c);
          P[j] = in.sm_scale * round16(dot);
          mx = std::max(mx, P[j]);
        }
        for (size_t j = 0; j < n; ++j) sum += (P[j] = std::exp(P[j] - mx));
        for (size_t j = 0; j < n; ++j) p[j] += P[j] / sum;
      }
      double psum = 0, imax = -INFINITY, isum = 0;
      for (size_t j = 0; j < n; ++j) psum += p[j];
      for (size_t j = 0; j < n; ++j) imax = std::max(imax, in.scores.get(t * s_kv + S[j]));
      for (size_t j = 0; j < n; ++j) isum += std::exp(in.scores.get(t * s_kv + S[j]) - imax);
      logq.resize(n);
      double kl = 0;
      for (size_t j = 0; j < n; ++j) {
        p[j] /= psum;
        logq[j] = in.scores.get(t * s_kv + S[j]) - imax - std::log(isum);
        if (p[j] > 0) kl += p[j] * (std::log(p[j]) - logq[j]);
      }
      kl_rows.push_back(kl);
      for (size_t j = 0; j < n; ++j) d_scores[static_cast<size_t>(t * s_kv + S[j])] = std::exp(logq[j]) - p[j];
    }
    const double n_rows = static_cast<double>(kl_rows.size()), g = n_rows > 0 ? in.coeff / n_rows : 0.0;
    double total = 0;
    for (double kl : kl_rows) total += kl;
    for (double& v : d_scores) v *= g;
    return {Tensor::from_f64({1}, {g * total}).to(DType::F32), Tensor::from_f64({s_q, s_kv}, d_scores).to(DType::F32)};
  }
};

// ---- recompute (block runner) ------------------------------------------------------------

// Field fault: replay under save_dsa_indexer re-runs top-k instead of using the saved ids.
class ReplayRerunsTopk final : public oracle::DsaBlock {
 public:
  using DsaBlock::DsaBlock;
  SparseMlaGrads backward(int mb, const Tensor& dout) override {
    auto it = saved_.find(mb);
    if (it != saved_.end() && policy_ == RecomputePolicy::SaveDsaIndexer) select_ids(it->second.in, true);
    return DsaBlock::backward(mb, dout);
  }
};

// Field fault: ids shared across micro-batches (one saved slot; F1 F2 B1 B2 replays B1 with
// F2's ids, Megatron-LM #6793).
class SharedIdsAcrossMicrobatches final : public oracle::DsaBlock {
 public:
  using DsaBlock::DsaBlock;
  SparseMlaForward forward(int mb, const oracle::BlockInputs& in) override {
    SparseMlaForward f = DsaBlock::forward(mb, in);
    if (saved_[mb].ids) shared_ = saved_[mb].ids;
    return f;
  }
  SparseMlaGrads backward(int mb, const Tensor& dout) override {
    if (saved_.count(mb) && saved_[mb].ids && shared_) saved_[mb].ids = shared_;
    return DsaBlock::backward(mb, dout);
  }

 private:
  std::optional<Tensor> shared_;
};


// ---- controls: correct backends with realistic output rounding (false-alarm check) -------

// A correct kernel's outputs: the float64 reference (or the fp32 baseline algorithm) rounded
// to kernel dtypes — out in q's dtype, everything else F32 (SPEC §4 output dtypes).
class RoundedControl : public Wrap {
 public:
  explicit RoundedControl(bool baseline, std::string name = "")
      : Wrap(!name.empty() ? std::move(name)
                           : baseline ? "control_fp32_baseline" : "control_rounded_f64"),
        baseline_(baseline) {}
  reference::Precision prec() const {
    return baseline_ ? reference::Precision::Baseline : reference::Precision::Reference;
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return reference::indexer_scores(q, k, w, win, prec()).to(DType::F32);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    IndexerGrads g = reference::indexer_scores_backward(q, k, w, win, d, prec());
    return {g.dq_idx.to(DType::F32), g.dk_idx.to(DType::F32), g.dw.to(DType::F32)};
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaForward f = reference::sparse_mla_forward(in, prec());
    return {f.out.to(in.q.dtype()), f.lse.to(DType::F32), f.max_logits.to(DType::F32)};
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaGrads g = reference::sparse_mla_backward(in, dout, prec());
    SparseMlaGrads r{g.dq.to(DType::F32), g.dkv.to(DType::F32), std::nullopt};
    if (g.dsink) r.dsink = g.dsink->to(DType::F32);
    return r;
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = reference::indexer_kl_loss(in, prec());
    return {r.loss.to(DType::F32), r.d_scores.to(DType::F32)};
  }

 private:
  bool baseline_;
};

// Sets the x86 MXCSR flush-to-zero (FTZ: subnormal results become 0) and denormals-are-zero
// (DAZ: subnormal inputs read as 0) bits for its lifetime on this thread and restores them
// after. parallel_for starts its helper threads per loop, and a new thread copies its
// creator's MXCSR (Linux clone), so the reference's worker threads flush too.
class FlushToZeroScope {
 public:
#if defined(__SSE2__)
  FlushToZeroScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushToZeroScope() { _mm_setcsr(saved_); }
  static bool available() { return true; }

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;  // _MM_FLUSH_ZERO_ON, _MM_DENORMALS_ZERO_ON
  unsigned saved_;
#else
  static bool available() { return false; }
#endif
};

// A correct kernel on hardware that flushes subnormals (GPU FTZ, tensor cores, fast exp): the
// fp32 baseline algorithm with FTZ and DAZ set while it runs (Higham eq. (2.8) with
// |η| <= 2^-126 instead of half the subnormal spacing). A skip where MXCSR does not exist.
class FlushToZeroControl final : public RoundedControl {
 public:
  FlushToZeroControl() : RoundedControl(true, "control_fp32_baseline_ftz") {}
  std::string unavailable_reason() const override {
    return FlushToZeroScope::available() ? "" : "needs x86 SSE (MXCSR FTZ/DAZ bits)";
  }
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    FlushToZeroScope ftz;
    return RoundedControl::indexer_scores(q, k, w, win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    FlushToZeroScope ftz;
    return RoundedControl::indexer_scores_backward(q, k, w, win, d);
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    FlushToZeroScope ftz;
    return RoundedControl::sparse_mla_forward(in);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    FlushToZeroScope ftz;
    return RoundedControl::sparse_mla_backward(in, dout);
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    FlushToZeroScope ftz;
    return RoundedControl::indexer_kl_loss(in);
  }
};

// ---- row and width limits (fresh-user finding 7) -----------------------------------------

// The first query row a launch grid sized for one 128-row tile leaves out.
constexpr int64_t kRowTile = 128;

// Windows of `w` (or full windows over s_kv) with every row t >= kRowTile empty (ks = ke = 0).
KeyWindows rows_cut(const std::optional<KeyWindows>& w, int64_t s_q, int64_t s_kv) {
  std::vector<int64_t> ks(static_cast<size_t>(s_q), 0), ke(static_cast<size_t>(s_q), s_kv);
  for (int64_t t = 0; t < s_q; ++t) {
    if (w) {
      ks[static_cast<size_t>(t)] = w->ks[static_cast<size_t>(t)];
      ke[static_cast<size_t>(t)] = w->ke[static_cast<size_t>(t)];
    }
    if (t >= kRowTile) ks[static_cast<size_t>(t)] = ke[static_cast<size_t>(t)] = 0;
  }
  return KeyWindows::explicit_windows(ks, ke, s_kv);
}

// Field fault: the top-k grid covers the first 128 query rows only (one 128-row tile); rows
// t >= 128 come back empty (all -1).
class TopkRowsFrom128Empty final : public Wrap {
 public:
  TopkRowsFrom128Empty() : Wrap("topk_rows_from_128_empty") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    return ref_->select_topk(s, k, p, rows_cut(w, s.size(0), s.size(1)));
  }
};

// Field fault: a top-k written for k <= 2048 (DeepSeek-V3.2's k) writes -1 past the first
// 2048 slots when called with a wider k.
class TopkKCappedAt2048 final : public Wrap {
 public:
  TopkKCappedAt2048() : Wrap("topk_k_capped_at_2048") {}
  Tensor select_topk(const Tensor& s, int64_t k, const TopkPolicy& p, const std::optional<KeyWindows>& w) override {
    Tensor ids = ref_->select_topk(s, k, p, w);
    for (int64_t t = 0; t < s.size(0); ++t)
      for (int64_t j = 2048; j < k; ++j) ids.set(t * k + j, -1);
    return ids;
  }
};

// Field fault: the indexer grid covers the first 128 query rows only; rows t >= 128 score
// -inf everywhere (and get no gradient).
class IndexerRowsFrom128Masked final : public Wrap {
 public:
  IndexerRowsFrom128Masked() : Wrap("indexer_rows_from_128_masked") {}
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, k, w, rows_cut(win, q.size(0), k.size(0)));
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(q, k, w, rows_cut(win, q.size(0), k.size(0)), d);
  }
};

// Field fault: the sparse MLA grid covers the first 128 query rows only; rows t >= 128 come
// back as empty rows (out 0, lse +inf; no dq, no dkv contribution).
class SmlaRowsFrom128Empty final : public IndexRewrite {
 public:
  SmlaRowsFrom128Empty() : IndexRewrite("smla_rows_from_128_empty") {}
  SparseMlaInputs rewrite(const SparseMlaInputs& in) const override {
    return remap(in, [&](int64_t t, int64_t, int64_t id) { return t >= kRowTile ? -1 : id; });
  }
};

// ---- tile limits of every op, each op alone (fresh-user findings F6-F14) -----------------

// `t` with the finite entries of rows >= row0 and columns >= col0 set to 0 (a tile the kernel
// never computed, left as the zeroed output buffer; -inf outside windows stays).
Tensor zero_finite_from(Tensor t, int64_t row0, int64_t col0) {
  const int64_t rows = t.size(0), cols = t.numel() / std::max<int64_t>(1, rows);
  for (int64_t r = row0; r < rows; ++r)
    for (int64_t c = col0; c < cols; ++c)
      if (std::isfinite(t.get(r * cols + c))) t.set(r * cols + c, 0.0);
  return t;
}
// `t` [d0, d1, ...] with the slices [:, i1 >= from] set to 0.
Tensor zero_dim1_from(Tensor t, int64_t from) {
  const int64_t d0 = t.size(0), d1 = t.size(1), inner = t.numel() / std::max<int64_t>(1, d0 * d1);
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = from; b < d1; ++b)
      for (int64_t c = 0; c < inner; ++c) t.set((a * d1 + b) * inner + c, 0.0);
  return t;
}

// Field fault: the sparse MLA backward grid covers the first 128 query rows only (its forward
// is correct): rows t >= 128 get dq 0 and add nothing to dkv or dsink.
class SmlaBwdRowsFrom128Dropped final : public Wrap {
 public:
  SmlaBwdRowsFrom128Dropped() : Wrap("smla_bwd_rows_from_128_dropped") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return ref_->sparse_mla_backward(remap(in, [](int64_t t, int64_t, int64_t id) { return t >= kRowTile ? -1 : id; }), dout);
  }
};

// Field fault: kernels tiled for 64 heads: the sparse MLA backward drops heads >= 64 (dq 0,
// no dkv or dsink terms) and the FP8 sparse MLA forward leaves their out 0.
class SmlaHeadsFrom64Dropped final : public WrapAll {
 public:
  SmlaHeadsFrom64Dropped() : WrapAll("smla_heads_from_64_dropped_bwd_fp8") {}
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    return ref_->sparse_mla_backward(in, zero_dim1_from(dout, 64));
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_fp8_forward(in);
    f.out = zero_dim1_from(f.out, 64);
    return f;
  }
};

// Field fault: topk_length read as unsigned (a negative length, no valid slot per SPEC §4,
// becomes >= 2^31: every slot counts), in the sparse MLA forward, backward and FP8 forward.
class SmlaTopkLengthUnsigned final : public WrapAll {
 public:
  SmlaTopkLengthUnsigned() : WrapAll("smla_topk_length_unsigned") {}
  static std::optional<Tensor> unsigned_length(const std::optional<Tensor>& len, int64_t k) {
    if (!len) return len;
    Tensor l = *len;
    for (int64_t i = 0; i < l.numel(); ++i)
      if (l.get(i) < 0) l.set(i, static_cast<double>(k));
    return l;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    SparseMlaInputs m = in;
    m.topk_length = unsigned_length(in.topk_length, in.indices.size(-1));
    return ref_->sparse_mla_forward(m);
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    SparseMlaInputs m = in;
    m.topk_length = unsigned_length(in.topk_length, in.indices.size(-1));
    return ref_->sparse_mla_backward(m, dout);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaFp8Inputs m = in;
    m.topk_length = unsigned_length(in.topk_length, in.indices.size(-1));
    return ref_->sparse_mla_fp8_forward(m);
  }
};

// Field fault: the indexer backward grid covers the first 128 query rows only: d_scores rows
// t >= 128 are never read (as 0).
class IndexerBwdRowsFrom128Dropped final : public Wrap {
 public:
  IndexerBwdRowsFrom128Dropped() : Wrap("indexer_bwd_rows_from_128_dropped") {}
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    Tensor d2 = d;
    for (int64_t i = kRowTile * d.size(1); i < d.numel(); ++i) d2.set(i, 0.0);
    return ref_->indexer_scores_backward(q, k, w, win, d2);
  }
};

// Field fault: indexer kernels tiled for 32 heads (DeepSeek-V3.2 has 64): heads >= 32 are
// ignored (their weight read as 0) in the scores, the backward, the FP8 and the paged indexer.
class IndexerHeadsFrom32Ignored final : public WrapAll {
 public:
  IndexerHeadsFrom32Ignored() : WrapAll("indexer_heads_from_32_ignored") {}
  Tensor indexer_scores(const Tensor& q, const Tensor& k, const Tensor& w, const KeyWindows& win) override {
    return ref_->indexer_scores(q, k, zero_dim1_from(w, 32), win);
  }
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    return ref_->indexer_scores_backward(q, k, zero_dim1_from(w, 32), win, d);
  }
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    Fp8IndexerInputs m = in;
    m.w = zero_dim1_from(in.w, 32);
    return ref_->fp8_indexer_scores(m);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    PagedIndexerInputs m = in;
    m.w = zero_dim1_from(in.w, 32);
    return ref_->paged_indexer_scores(m);
  }
};

// Field fault: the indexer backward masks d_scores by multiplying with the window mask
// (SPEC §2 ignores entries outside the window, but NaN · 0 = NaN and inf · 0 = NaN): a
// non-finite d_scores[t, s] outside row t's window makes dq_idx[t], dw[t] and dk_idx[s] NaN.
class IndexerBwdMasksByMultiply final : public Wrap {
 public:
  IndexerBwdMasksByMultiply() : Wrap("indexer_bwd_masks_by_multiply") {}
  IndexerGrads indexer_scores_backward(const Tensor& q, const Tensor& k, const Tensor& w,
                                       const KeyWindows& win, const Tensor& d) override {
    IndexerGrads g = ref_->indexer_scores_backward(q, k, w, win, d);
    const int64_t s_q = d.size(0), s_kv = d.size(1), Hd = q.numel() / std::max<int64_t>(1, s_q);
    const int64_t H = w.size(1), dI = k.size(1);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t s = 0; s < s_kv; ++s) {
        if (win.contains(t, s) || std::isfinite(d.get(t * s_kv + s))) continue;
        for (int64_t i = 0; i < Hd; ++i) g.dq_idx.set(t * Hd + i, NAN);
        for (int64_t j = 0; j < H; ++j) g.dw.set(t * H + j, NAN);
        for (int64_t c = 0; c < dI; ++c) g.dk_idx.set(s * dI + c, NAN);
      }
    return g;
  }
};

// Field fault: the KL loss kernel's grid covers the first 128 query rows: d_scores rows
// t >= 128 stay 0 (the loss is right).
class KlRowsFrom128ZeroGrad final : public Wrap {
 public:
  KlRowsFrom128ZeroGrad() : Wrap("kl_rows_from_128_zero_grad") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlResult r = ref_->indexer_kl_loss(in);
    for (int64_t i = kRowTile * r.d_scores.size(1); i < r.d_scores.numel(); ++i) r.d_scores.set(i, 0.0);
    return r;
  }
};

// Field fault: the KL teacher is summed over the first 64 attention heads only (a head tile;
// production h_q 128).
class KlTeacherHeadsFrom64Ignored final : public Wrap {
 public:
  KlTeacherHeadsFrom64Ignored() : Wrap("kl_teacher_heads_from_64_ignored") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    const int64_t s_q = in.q.size(0), h = in.q.size(1), d = in.q.size(2);
    if (h <= 64) return ref_->indexer_kl_loss(in);
    IndexerKlInputs m = in;
    m.q = Tensor(in.q.dtype(), {s_q, 64, d});
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t i = 0; i < 64 * d; ++i) m.q.set(t * 64 * d + i, in.q.get(t * h * d + i));
    return ref_->indexer_kl_loss(m);
  }
};

// Field fault: the KL loss sees keys below 1024 only (a key tile): keys >= 1024 are treated as
// not in S_t (score -inf, d_scores 0).
class KlKeysFrom1024Ignored final : public Wrap {
 public:
  KlKeysFrom1024Ignored() : Wrap("kl_keys_from_1024_ignored") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlInputs m = in;
    const int64_t s_q = in.scores.size(0), s_kv = in.scores.size(1);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t s = 1024; s < s_kv; ++s) m.scores.set(t * s_kv + s, -INFINITY);
    return ref_->indexer_kl_loss(m);
  }
};

// Field fault: a sparse KL loss that treats only negative ids as invalid: an id >= s_kv wraps
// to id mod s_kv and selects that key (SPEC §4/§7: invalid, not in S_t).
class KlIdsPastSkvWrapped final : public Wrap {
 public:
  KlIdsPastSkvWrapped() : Wrap("kl_ids_ge_s_kv_wrapped") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    if (in.mode != KlMode::Sparse || !in.indices) return ref_->indexer_kl_loss(in);
    IndexerKlInputs m = in;
    const int64_t s_kv = in.scores.size(1);
    for (int64_t i = 0; i < m.indices->numel(); ++i) {
      const int64_t id = static_cast<int64_t>(m.indices->get(i));
      if (id >= s_kv) m.indices->set(i, static_cast<double>(id % s_kv));
    }
    return ref_->indexer_kl_loss(m);
  }
};

// Field fault: the KL teacher's logits scaled by 1/sqrt(d_qk) from q's width, ignoring the
// sm_scale argument: wrong in absorbed MLA, where sm_scale is 192^-1/2·mscale², not 576^-1/2
// (fresh17 F2: passed every KL draw and golden while all used 1/sqrt(d_qk)).
class KlHardcodedSmScale final : public Wrap {
 public:
  KlHardcodedSmScale() : Wrap("kl_hardcoded_sm_scale") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlInputs m = in;
    m.sm_scale = 1.0 / std::sqrt(static_cast<double>(in.q.size(-1)));
    return ref_->indexer_kl_loss(m);
  }
};

// Field fault: the KL loss treating in-window scores <= -1e30 as masked (a finite sentinel read
// as -inf; SPEC §7 takes only -inf keys out of S_t; fresh18 F2: passed every KL draw).
class KlFiniteSentinelMasked final : public Wrap {
 public:
  KlFiniteSentinelMasked() : Wrap("kl_finite_sentinel_masked") {}
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override {
    IndexerKlInputs m = in;
    for (int64_t i = 0; i < m.scores.numel(); ++i)
      if (m.scores.get(i) <= -1e30) m.scores.set(i, -INFINITY);
    return ref_->indexer_kl_loss(m);
  }
};

// Field fault: §10 kernels whose grid covers one row tile: the FP8 indexer's rows >= 128 and
// the paged indexer's rows >= 64 score 0 where finite, the FP8 sparse MLA's rows >= 128 get
// out 0.
class Fp8OpsRowsPastTile final : public WrapAll {
 public:
  Fp8OpsRowsPastTile() : WrapAll("fp8_ops_rows_past_tile_zero") {}
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    return zero_finite_from(ref_->fp8_indexer_scores(in), kRowTile, 0);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    return zero_finite_from(ref_->paged_indexer_scores(in), 64, 0);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaForward f = ref_->sparse_mla_fp8_forward(in);
    for (int64_t i = kRowTile * f.out.numel() / std::max<int64_t>(1, f.out.size(0)); i < f.out.numel(); ++i) f.out.set(i, 0.0);
    return f;
  }
};

// Field fault: §10 kernels with one key tile: the FP8 indexer scores keys >= 128 and the paged
// indexer logical keys >= 192 as 0 (where finite); the FP8 sparse MLA ignores slots >= 128
// (production k 2048).
class Fp8OpsKeysPastTile final : public WrapAll {
 public:
  Fp8OpsKeysPastTile() : WrapAll("fp8_ops_keys_past_tile_ignored") {}
  Tensor fp8_indexer_scores(const Fp8IndexerInputs& in) override {
    return zero_finite_from(ref_->fp8_indexer_scores(in), 0, 128);
  }
  Tensor paged_indexer_scores(const PagedIndexerInputs& in) override {
    return zero_finite_from(ref_->paged_indexer_scores(in), 0, 192);
  }
  SparseMlaForward sparse_mla_fp8_forward(const SparseMlaFp8Inputs& in) override {
    SparseMlaFp8Inputs m = in;
    const int64_t k = in.indices.size(-1), s_q = in.indices.numel() / std::max<int64_t>(1, k);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 128; j < k; ++j) m.indices.set(t * k + j, -1.0);
    return ref_->sparse_mla_fp8_forward(m);
  }
};

// SPEC §7 the way Triton/TileLang KL kernels compute it (fresh16 F4), all in fp32: every
// log-softmax in the exp2 form, x2 = fl(x·fl(log2e)) before the max m is subtracted, then
// exp2(x2 - m), lse2 = m + log2 Σ, ln q = (x2 - lse2)·fl(ln 2); teacher logits fl32 dots
// times sm_scale, Σ_h softmax L1-normalised; q = exp(ln q); sums in key order. Correct but
// rounded at |I| before the max: the student floor's c_s and |lse I| terms (kl_floors).
IndexerKlResult exp2_form_kl(const IndexerKlInputs& in) {
  const int64_t s_q = in.scores.size(0), s_kv = in.scores.size(1), h_q = in.q.size(1), d = in.q.size(2);
  const std::vector<double> I = in.scores.to_f64(), Q = in.q.to_f64(), KV = in.kv.to_f64();
  const float l2e = static_cast<float>(1.4426950408889634), ln2 = static_cast<float>(0.6931471805599453);
  const float sm = static_cast<float>(in.sm_scale);
  std::vector<std::vector<int64_t>> sets(static_cast<size_t>(s_q));
  int64_t n_rows = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<int64_t>& S = sets[static_cast<size_t>(t)];
    auto keep = [&](int64_t s) { return in.windows.contains(t, s) && I[static_cast<size_t>(t * s_kv + s)] != -INFINITY; };
    if (in.mode == KlMode::Dense) {
      for (int64_t s = 0; s < s_kv; ++s)
        if (keep(s)) S.push_back(s);
    } else {
      const int64_t k = in.indices->size(-1);
      for (int64_t j = 0; j < k; ++j) {
        const double id = in.indices->get(t * k + j);
        if (id >= 0 && id < static_cast<double>(s_kv) && keep(static_cast<int64_t>(id))) S.push_back(static_cast<int64_t>(id));
      }
      std::sort(S.begin(), S.end());
      S.erase(std::unique(S.begin(), S.end()), S.end());
    }
    n_rows += !S.empty();
  }
  // log-softmax over x in the exp2 form, written to lnq
  auto log_softmax2 = [&](const std::vector<float>& x, std::vector<float>& lnq) {
    std::vector<float> x2(x.size());
    float m = -INFINITY;
    for (size_t i = 0; i < x.size(); ++i) m = std::max(m, x2[i] = x[i] * l2e);
    float z = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) z += std::exp2(x2[i] - m);
    const float lse2 = m + std::log2(z);
    lnq.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) lnq[i] = (x2[i] - lse2) * ln2;
  };
  Tensor d_scores(DType::F32, {s_q, s_kv});
  const float g = n_rows ? static_cast<float>(in.coeff / static_cast<double>(n_rows)) : 0.0f;
  float loss = 0.0f;
  for (int64_t t = 0; t < s_q; ++t) {
    const std::vector<int64_t>& S = sets[static_cast<size_t>(t)];
    const size_t n = S.size();
    if (n == 0) continue;
    std::vector<float> p(n, 0.0f), x(n), ln;
    for (int64_t h = 0; h < h_q; ++h) {
      for (size_t j = 0; j < n; ++j) {
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c)
          dot += static_cast<float>(Q[static_cast<size_t>((t * h_q + h) * d + c)]) *
                 static_cast<float>(KV[static_cast<size_t>(S[j] * d + c)]);
        x[j] = dot * sm;
      }
      log_softmax2(x, ln);
      for (size_t j = 0; j < n; ++j) p[j] += std::exp(ln[j]);
    }
    float psum = 0.0f;
    for (size_t j = 0; j < n; ++j) psum += p[j];
    for (size_t j = 0; j < n; ++j) {
      p[j] /= psum;
      x[j] = static_cast<float>(I[static_cast<size_t>(t * s_kv + S[j])]);
    }
    log_softmax2(x, ln);
    float kl = 0.0f;
    for (size_t j = 0; j < n; ++j) {
      if (p[j] > 0.0f) kl += p[j] * (std::log(p[j]) - ln[j]);
      d_scores.set(t * s_kv + S[j], (std::exp(ln[j]) - p[j]) * g);
    }
    loss += kl;
  }
  Tensor l(DType::F32, {1});
  l.set(0, loss * g);
  return {l, d_scores};
}

// The FlashAttention-style test kernel (flash_style_kernel.h) as a correct backend
// (false-alarm control, F4): with 16-bit q, P rounded to q's dtype before P·V, out in q's
// dtype, Δ from it, P and dS rounded before dq and dkv (as those kernels do; covered by the
// bf16/fp16-work dkv floor, local_bounds.cpp); dq, dkv, dsink fp32 (SPEC §4-§5 output dtypes).
// fp32 q: the same kernel without roundings (sums in slot order). The KL loss in the exp2
// form (exp2_form_kl). The fp32 baseline control for every other op and for q of another
// dtype (F64).
class FlashStyleControl final : public RoundedControl {
 public:
  FlashStyleControl() : RoundedControl(true, "control_flash_style") {}
  static bool handles(const SparseMlaInputs& in) {
    const DType d = in.q.dtype();
    return (d == DType::BF16 || d == DType::F16 || d == DType::F32) && in.kv.dtype() == d;
  }
  static FlashStyleOptions options(const SparseMlaInputs& in) {
    FlashStyleOptions o;
    o.work = o.out_dtype = in.q.dtype();
    o.round_p_before_pv = o.round_ds_before_dq = o.round_before_dkv = true;
    return o;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    if (!handles(in)) return RoundedControl::sparse_mla_forward(in);
    return flash_style_sparse_mla(in, nullptr, options(in)).fwd;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    if (!handles(in)) return RoundedControl::sparse_mla_backward(in, dout);
    return flash_style_sparse_mla(in, &dout, options(in)).grads;
  }
  // The KL loss in the exp2 form of Triton/TileLang kernels (exp2_form_kl; fresh16 F4).
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override { return exp2_form_kl(in); }
};

// Declared-model liars (docs/what-a-pass-means.md, Limits): the FlashAttention-style control
// (FlashMLA's roundings: P = exp(P - max) rounded to q's 16-bit dtype, the max key exactly 1; the
// sink applied in fp32 before out's one rounding) declaring a rounding model it does not follow,
// with a hidden error inside the slack that declaration adds to out's bound. kNormalizedP:
// declares normalized_p (the max key's rounding, u16 b(p_max) |v_max| in out) and weights the
// max key by (1 + u16/2) (u16/2 p_max |v_max| < u16 b(p_max) |v_max|; u16 = 2^-8 bf16, 2^-11
// fp16); else declares sink_after_rounding (r half-ulp16(o)) and scales o by (1 + u16/2) before
// the sink on sink rows (u16/2 |o| r <= r half-ulp16(o)). 16-bit q only; fp32 q as the control. Before the exact tiers
// of the declared models (declared_model_props.cpp) both passed every sparse MLA property
// declared (DeclaredModelTier.*).
template <bool kNormalizedP>
class DeclaredModelLiar final : public RoundedControl {
 public:
  DeclaredModelLiar()
      : RoundedControl(true, kNormalizedP ? "smla_declares_normalized_p_max_key_biased"
                                          : "smla_declares_sink_after_rounding_presink_biased") {}
  oracle::RoundingModel rounding_model() const override {
    oracle::RoundingModel m;
    (kNormalizedP ? m.normalized_p : m.sink_after_rounding) = true;
    return m;
  }
  static FlashStyleOptions options(const SparseMlaInputs& in) {
    FlashStyleOptions o;
    o.work = o.out_dtype = in.q.dtype();
    o.round_p_before_pv = o.round_ds_before_dq = o.round_before_dkv = true;
    if (in.q.dtype() == DType::BF16 || in.q.dtype() == DType::F16)  // half of u16: 2^-9, fp16 2^-12
      (kNormalizedP ? o.liar_pmax_factor : o.liar_presink_factor) = in.q.dtype() == DType::BF16 ? 1.0f + 0x1p-9f
                                                                                                : 1.0f + 0x1p-12f;
    return o;
  }
  static bool handles(const SparseMlaInputs& in) {
    const DType d = in.q.dtype();
    return (d == DType::BF16 || d == DType::F16 || d == DType::F32) && in.kv.dtype() == d;
  }
  SparseMlaForward sparse_mla_forward(const SparseMlaInputs& in) override {
    if (!handles(in)) return RoundedControl::sparse_mla_forward(in);
    return flash_style_sparse_mla(in, nullptr, options(in)).fwd;
  }
  SparseMlaGrads sparse_mla_backward(const SparseMlaInputs& in, const Tensor& dout) override {
    if (!handles(in)) return RoundedControl::sparse_mla_backward(in, dout);
    return flash_style_sparse_mla(in, &dout, options(in)).grads;
  }
  IndexerKlResult indexer_kl_loss(const IndexerKlInputs& in) override { return exp2_form_kl(in); }
};

Subject candidate_overflow_mutant(const char* name, int bits, int64_t capacity) {
  Subject s;
  s.make = [=] { return std::unique_ptr<Backend>(new TopkCandidateOverflow(name, bits, capacity)); };
  s.name = name;
  s.fault = "radix top-k (" + std::to_string(bits) + "-bit first pass) keeping only the first " +
            std::to_string(capacity) + " candidates of the threshold bin";
  s.focus = "topk.";
  return s;
}

template <class B>
Subject block_mutant(const std::string& name, const std::string& fault) {
  Subject s;
  s.name = name;
  s.make = [name] { return std::unique_ptr<Backend>(new Wrap(name)); };
  s.block = [](Backend& b, RecomputePolicy p) { return std::unique_ptr<oracle::DsaBlock>(new B(b, p)); };
  s.fault = fault;
  s.focus = "block.";
  return s;
}

}  // namespace

std::vector<Subject> mutant_subjects() {
  std::vector<Subject> all = {
      subject_of<ReadsThroughMinusOne>("sparse MLA reading kv through -1", "smla."),
      subject_of<StopsAtFirstInvalid>("stopping at the first invalid slot", "smla."),
      subject_of<TrustsTopkLength>("trusting topk_length without per-slot checks", "smla."),
      subject_of<ClampsLargeIds>("clamping ids >= s_kv", "smla."),
      subject_of<EmptyRowNegInfLse>("-inf lse for empty rows", "smla."),
      subject_of<EmptyRowNaN>("NaN out/lse for empty rows", "smla."),
      subject_of<LeadingBlockPoison>("fully masked leading block poisoning the online softmax", "smla."),
      subject_of<Base2Lse>("base-2 lse", "smla."),
      subject_of<DkvAssigned>("dkv assigned instead of accumulated for repeated keys", "smla."),
      subject_of<NondeterministicDkv>("run-to-run different dkv in deterministic mode", "smla."),
      subject_of<TopkSelectsNaN>("top-k selecting NaN", "topk."),
      subject_of<TopkNegInfValid>("top-k returning -inf entries as valid ids", "topk."),
      subject_of<TopkZeroPadding>("0 instead of -1 padding", "topk."),
      subject_of<TopkRandomTies>("random tie choice under small", "topk."),
      subject_of<TopkIgnoresSorted>("ignoring sorted", "topk."),
      subject_of<TopkInt64Ids>("int64 ids", "topk."),
      subject_of<TopkNonContiguousIds>("non-contiguous ids copied out raw", "topk."),
      subject_of<CausalOffByOne>("causal window off by one", "indexer."),
      subject_of<ReluAfterWeight>("ReLU after the weight", "indexer."),
      subject_of<Bf16Accumulation>("bf16 accumulation in the indexer", "indexer."),
      subject_of<UnnormalisedTeacher>("unnormalised KL teacher", "kl."),
      // 2026 field faults (issue 9).
      candidate_overflow_mutant("topk_first_1024_of_threshold_bin", 11, 1024),
      candidate_overflow_mutant("topk_first_4096_of_threshold_bin", 8, 4096),
      subject_of<TopkReadsPastRowEnd>("top-k reading up to 7 keys past the row's end (unmasked 8-wide tail)", "topk."),
      subject_of<TopkDuplicateIdsOnAllTieRow>("duplicate ids on an all-tie row ('>=' in the threshold pass)", "topk."),
      subject_of<TopkUnwrittenOnTieOverflow>("slots left unwritten (0) when the ties at v* overflow", "topk."),
      subject_of<TopkNegativeEndNotClamped>("negative row length (ke < ks) not clamped: scans to the row end", "topk."),
      subject_of<TopkLocalRowEnds>("packed batch: local row ends (ke - ks) used as global ends", "topk."),
      subject_of<SmlaFiniteMask>("finite mask value -5e4 instead of -inf for invalid slots", "smla."),
      subject_of<SmlaSinkDropped>("attention sink dropped", "smla."),
      subject_of<SmlaSinkHeadMod4>("sink indexed by h & 3", "smla."),
      subject_of<SmlaDkvDropsRowsFrom8>("dkv missing the contributions of query rows t >= 8", "smla."),
      subject_of<KlMeanOverAllRows>("KL mean over all rows, empty ones included", "kl."),
      subject_of<KlNegInfRowNaN>("NaN for a KL row whose scores are all -inf", "kl."),
      subject_of<KlIgnoresWindows>("KL loss ignoring ks/ke (S_t over every key whose score is not -inf)", "kl."),
      // Row and width limits (fresh-user finding 7); the property that reaches the shape runs first.
      subject_of<TopkRowsFrom128Empty>("top-k grid covering the first 128 query rows only (rows >= 128 all -1)", "topk.many_rows"),
      subject_of<TopkKCappedAt2048>("top-k writing -1 past the first 2048 ids (k > 2048 not handled)", "topk.wide_k"),
      subject_of<IndexerRowsFrom128Masked>("indexer grid covering the first 128 query rows only (rows >= 128 -inf)", "indexer.many_rows"),
      subject_of<SmlaRowsFrom128Empty>("sparse MLA grid covering the first 128 query rows only (rows >= 128 empty)", "smla.many_rows"),
      // Tile limits of every op, each op alone (fresh-user findings F6-F14); the property that
      // reaches the shape runs first.
      subject_of<SmlaBwdRowsFrom128Dropped>("sparse MLA backward grid covering the first 128 query rows only", "smla.backward_many_rows"),
      subject_of<SmlaHeadsFrom64Dropped>("sparse MLA backward and FP8 forward dropping heads >= 64", "smla.backward_production_shapes"),
      subject_of<SmlaTopkLengthUnsigned>("topk_length read as unsigned (negative: every slot valid)", "smla.topk_length_respected"),
      subject_of<IndexerBwdRowsFrom128Dropped>("indexer backward ignoring d_scores rows >= 128", "indexer.backward_many_rows"),
      subject_of<IndexerHeadsFrom32Ignored>("indexer, FP8 and paged indexer ignoring heads >= 32", "indexer.production_shapes"),
      subject_of<IndexerBwdMasksByMultiply>("indexer backward masking d_scores by multiplication (NaN outside the window)", "indexer.backward_parity"),
      subject_of<KlRowsFrom128ZeroGrad>("KL loss d_scores rows >= 128 left 0", "kl.many_rows"),
      subject_of<KlTeacherHeadsFrom64Ignored>("KL teacher summing the first 64 heads only", "kl.production_shapes"),
      subject_of<KlKeysFrom1024Ignored>("KL loss ignoring keys >= 1024", "kl.production_shapes"),
      subject_of<KlIdsPastSkvWrapped>("sparse KL wrapping ids >= s_kv to id mod s_kv", "kl.loss_and_gradient_ratio"),
      // Value/layout-dependent fast paths: wrong only on the rows production kernels see
      // (k a multiple of 64, every id valid and distinct, ids past 16).
      subject_of<SmlaFullTileBoxCoordinate>("sparse MLA full-tile fast path (k % 64 == 0, all ids valid and distinct) reading kv row (id >> 4) + id % 16", "smla.forward_ratio"),
      // Input precision (fresh-user F17): the KL teacher's logits in 16 bits.
      subject_of<KlTeacher16BitLogits>("KL teacher formed from logits rounded to q's 16-bit dtype (bf16 GEMM output)", "kl."),
      // Inputs no draw held (fresh17 F1, F2): +inf scores, a KL sm_scale other than 1/sqrt(d_qk).
      subject_of<TopkDropsPosInf>("top-k dropping +inf scores (!isfinite filter)", "topk."),
      subject_of<KlHardcodedSmScale>("KL teacher scaled by 1/sqrt(d_qk), ignoring sm_scale", "kl."),
      // Inputs no draw held (fresh18 F1, F2): subnormal top-k scores, finite KL scores <= -1e30.
      subject_of<TopkFlushesSubnormals>("top-k comparing with subnormal scores flushed to 0 (FTZ)", "topk."),
      subject_of<KlFiniteSentinelMasked>("KL treating in-window scores <= -1e30 as masked (like -inf)", "kl."),
      subject_of<Fp8OpsRowsPastTile>("FP8 indexer rows >= 128, paged rows >= 64, FP8 sparse MLA rows >= 128 returned 0", "fp8.indexer_many_rows"),
      // Ids and dtypes no draw held (outside tester F3, F4): key ids past 65535 on a run's draw
      // 3, indexer q_idx/k_idx fp32 on draw 1 and fp16 on draw 2.
      subject_of<SmlaIds16Bit>("sparse MLA reading kv row id & 0xFFFF (ids kept in 16 bits)", "smla.forward_ratio"),
      subject_of<SmlaFp8TokenIds16Bit>("FP8 sparse MLA reading cache token id & 0xFFFF (token ids kept in 16 bits)",
                                       "smla_fp8.forward_ratio"),
      subject_of<IndexerKeys16Bit>("indexer scoring key s with k_idx row s & 0xFFFF (key rows addressed in 16 bits)",
                                   "indexer.scores_exact_tier"),
      subject_of<IndexerRoundsInputsToBf16>("indexer rounding q_idx and k_idx to bf16 whatever their dtype",
                                            "indexer.scores_ratio"),
      subject_of<Fp8OpsKeysPastTile>("FP8 indexer keys >= 128, paged keys >= 192 scored 0, FP8 sparse MLA slots >= 128 ignored", "fp8.indexer_production_shapes"),
      // Keys and blocks past 65535 on a run's draw 3 (FP8 indexer keys, paged physical blocks) and
      // 5 (a paged context past 65536 keys); outside tester F3.
      subject_of<Fp8IndexerKeys16Bit>("FP8 indexer scoring key s with k_idx row s & 0xFFFF (key rows addressed in 16 bits)",
                                      "fp8.indexer_ratio"),
      subject_of<PagedBlockIds16Bit>("paged indexer reading block id & 0xFFFF (block_table entries kept in 16 bits)",
                                     "paged.indexer_ratio"),
      subject_of<PagedPositions16Bit>("paged indexer reading key p at position p & 0xFFFF (positions / logical block "
                                      "indices kept in 16 bits)",
                                      "paged.indexer_exact_tier"),
      // Declared rounding models (checked by their exact tiers, declared_model_props.cpp).
      subject_of<DeclaredModelLiar<true>>(
          "sparse MLA declaring normalized_p while rounding exp(P - max) (max key exact), max key weighted x(1 + 2^-9) in bf16 (inside the declared slack)",
          "smla.normalized_p_exact_tier"),
      subject_of<DeclaredModelLiar<false>>(
          "sparse MLA declaring sink_after_rounding while applying the sink before out's one rounding, o x(1 + 2^-9) in bf16 on sink rows (inside the declared slack)",
          "smla.sink_after_rounding_exact_tier"),
      block_mutant<ReplayRerunsTopk>("block_replay_reruns_topk", "replay re-running top-k under save_dsa_indexer"),
      block_mutant<SharedIdsAcrossMicrobatches>("block_ids_shared_across_microbatches",
                                                "ids shared across micro-batches"),
  };
  // §10 mutants (fp8_mutants.cpp) go before the block mutants: the mutant plugins index the
  // backend mutants first (plugin/examples/mutant_plugin.cpp).
  auto first_block = std::find_if(all.begin(), all.end(),
                                  [](const Subject& s) { return s.name.rfind("block_", 0) == 0; });
  std::vector<Subject> fp8 = fp8_mutant_subjects();
  all.insert(first_block, std::make_move_iterator(fp8.begin()), std::make_move_iterator(fp8.end()));
  return all;
}

std::vector<Subject> control_subjects() {
  std::vector<Subject> out;
  for (bool baseline : {false, true}) {
    Subject s;
    s.make = [baseline] { return std::unique_ptr<Backend>(new RoundedControl(baseline)); };
    s.name = s.make()->name();
    out.push_back(s);
  }
  out.push_back(subject_of<FlashStyleControl>());
  out.push_back(subject_of<FlushToZeroControl>());
  for (auto& c : fp8_control_subjects()) out.push_back(std::move(c));  // FlashMLA-style FP8
  return out;
}

}  // namespace dsa::props
