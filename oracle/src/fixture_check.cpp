#include "dsa/oracle/fixture_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <new>
#include <set>
#include <sstream>

#include "dsa/contract/errors.h"
#include "dsa/contract/fp8.h"
#include "dsa/fixtures/fp8_fixture.h"
#include "dsa/oracle/fp8_check.h"


namespace dsa::oracle {

using fixtures::FileError;
using fixtures::Fixture;

namespace {

const Tensor* find(const std::map<std::string, Tensor>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

// Errors name the file (its case name for fixtures built in memory).
std::string label_of(const Fixture& f) { return f.path.empty() ? f.case_name : f.path; }

template <class T>
T param(const Fixture& f, const char* key) {
  if (!f.params.contains(key)) throw FileError(label_of(f), std::string("missing param '") + key + "'");
  try {
    return f.params[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw FileError(label_of(f), std::string("param '") + key + "' has the wrong type: " +
                                     f.params[key].dump());
  }
}
// A param that changes the judgement (top-k's tie_break and sorted, the KL loss's mode and
// coeff) has no default: a missing one is an input error naming it and its allowed values,
// never a guess (a missing tie_break read as `any` accepted ids a `small` golden forbids).
template <class T>
T judged_param(const Fixture& f, const char* key, const std::string& allowed, const std::string& spec) {
  if (!f.params.contains(key))
    throw FileError(label_of(f), std::string("missing param '") + key + "' of op " + f.op + ", expected " +
                                     allowed + " (" + spec + "; it changes the judgement, so it has no default)");
  return param<T>(f, key);
}

// An integer parameter in [lo, hi]: a non-integral number (16.5, 1e12 beyond hi) is an error
// naming params.<key> and the range, never truncated or handed to a backend.
int64_t int_param(const Fixture& f, const char* key, int64_t lo, int64_t hi, const std::string& why) {
  if (!f.params.contains(key)) throw FileError(label_of(f), std::string("missing param '") + key + "'");
  const nlohmann::json& v = f.params[key];
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + why;
  const bool number = v.is_number();
  const double x = number ? v.get<double>() : 0.0;
  if (!number || x != std::floor(x) || x < static_cast<double>(lo) || x > static_cast<double>(hi))
    throw FileError(label_of(f), std::string("params.") + key + " got " + v.dump() + ", expected " + range);
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(x);
}

// The reference's argument errors begin with its function's name ("sparse_mla_forward:
// argument 'kv' ..."); a file's error names the file and the op instead.
std::string without_function(const std::string& what) {
  const size_t colon = what.find(": argument");
  if (colon == std::string::npos || what.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != colon)
    return what;
  return what.substr(colon + 2);
}

std::vector<int64_t> to_i64(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(t.get(i));
  return v;
}

// Input `name` must have `rank` dimensions (`layout` names them): a file error naming the
// tensor, never a Tensor::size error from deeper down.
const Tensor& with_rank(const Fixture& f, const Tensor& t, const char* name, int64_t rank, const char* layout) {
  if (t.dim() != rank)
    throw FileError(label_of(f), std::string("tensor '") + name + "' has shape " + shape_str(t.shape()) +
                                     ", expected " + std::to_string(rank) + (rank == 1 ? " dimension " : " dimensions ") + layout);
  return t;
}

// ks and ke come together (SPEC §1): one alone is an input error naming which was found, never
// a silent full window (a kernel ignoring windows then agreed with a windowed golden).
KeyWindows windows_of(const Fixture& f, int64_t s_q, int64_t s_kv) {
  const Tensor* ks = find(f.inputs, "ks");
  const Tensor* ke = find(f.inputs, "ke");
  if (static_cast<bool>(ks) != static_cast<bool>(ke))
    throw FileError(label_of(f), std::string("ks and ke must both be given (found ") + (ks ? "ks" : "ke") +
                                     " only; SPEC §1: key window [ks[t], ke[t]) per query row; give both, "
                                     "or neither for full windows)");
  if (ks) with_rank(f, *ks, "ks", 1, "[s_q]");
  if (ke) with_rank(f, *ke, "ke", 1, "[s_q]");
  if (ks && ke) return KeyWindows::explicit_windows(to_i64(*ks), to_i64(*ke), s_kv);
  return KeyWindows::full(s_q, s_kv);
}

// Size limits (fixture.h, docs/fixtures.md "Size limits"), checked before anything is
// allocated: a file error naming the tensor or param, never a std::bad_alloc verdict.
void check_input_dims(const Fixture& f) {
  for (const auto& [name, t] : f.inputs)
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) > fixtures::kMaxDimension)
        throw FileError(label_of(f), "tensor '" + name + "' has shape " + shape_str(t.shape()) + ": dimension " +
                                         std::to_string(d) + " is " + std::to_string(t.size(d)) +
                                         ", expected at most 2147483647 (ids, windows and lengths are int32)" +
                                         (t.numel() == 0 ? "; the tensor holds no data (a dimension is 0)" : ""));
}

// An output of `rows` × `cols` elements (`what` names it and where its sizes come from).
void check_output_size(const Fixture& f, int64_t rows, int64_t cols, const std::string& what) {
  if (static_cast<double>(rows) * static_cast<double>(cols) <= static_cast<double>(fixtures::kMaxOutputElements))
    return;
  throw FileError(label_of(f), what + " has " + std::to_string(rows) + " x " + std::to_string(cols) +
                                   " elements, more than the limit of 2^30 = " +
                                   std::to_string(fixtures::kMaxOutputElements) +
                                   " (docs/fixtures.md size limits: 4 GiB as fp32, the float64 reference twice that)");
}

// The indexer's scores [s_q, s_kv] (q_idx dimension 0, k_idx dimension 0).
void check_indexer_output(const Fixture& f, const Tensor& q_idx, const Tensor& k_idx) {
  std::string what = "the scores output [s_q, s_kv] (q_idx " + shape_str(q_idx.shape()) + ", k_idx " +
                     shape_str(k_idx.shape()) + ")";
  if (k_idx.numel() == 0 && k_idx.dim() == 2 && k_idx.size(0) > 0 && k_idx.size(1) == 0)
    what += " (k_idx holds no data: d_I = 0)";
  check_output_size(f, q_idx.size(0), k_idx.size(0), what);
}

}  // namespace

bool FixtureReport::passed() const {
  for (const auto& r : producer_vs_reference)
    if (!r.passed()) return false;
  for (const auto& r : backend_vs_reference)
    if (!r.passed()) return false;
  return true;
}

std::vector<Op> fixture_ops(const Fixture& f) {
  if (f.op == "sparse_mla_fwd+bwd") return {Op::SparseMlaFwd, Op::SparseMlaBwd};
  if (f.op == "sparse_mla_fwd") return {Op::SparseMlaFwd};
  if (f.op == "indexer_scores+bwd") return {Op::IndexerScores, Op::IndexerScoresBackward};
  if (f.op == "indexer_scores") return {Op::IndexerScores};
  if (f.op == "topk") return {Op::Topk};
  if (f.op == "indexer_kl_loss") return {Op::IndexerKlLoss};
  if (f.op == "fp8_indexer_scores") return {Op::Fp8IndexerScores};
  if (f.op == "paged_indexer_scores") return {Op::PagedIndexerScores};
  if (f.op == "sparse_mla_fp8_fwd") return {Op::SparseMlaFp8Fwd};
  throw FileError(label_of(f), "unknown op '" + f.op + "'");
}

namespace {

OpCase op_case_unchecked(const Fixture& f) {
  using fixtures::require_input;
  OpCase c;
  c.memo = std::make_shared<CaseMemo>();  // every candidate judged on this case shares it
  const std::string label = label_of(f);
  for (Op op : fixture_ops(f)) {
    if (op == Op::IndexerScores || op == Op::IndexerScoresBackward) {
      c.q_idx = with_rank(f, require_input(f, "q_idx", label), "q_idx", 3, "[s_q, H_I, d_I]");
      c.k_idx = with_rank(f, require_input(f, "k_idx", label), "k_idx", 2, "[s_kv, d_I]");
      check_indexer_output(f, c.q_idx, c.k_idx);
      c.w = require_input(f, "w", label);
      c.windows = windows_of(f, c.q_idx.size(0), c.k_idx.size(0));
      if (op == Op::IndexerScoresBackward) c.d_scores = require_input(f, "d_scores", label);
    } else if (op == Op::Topk) {
      c.scores = with_rank(f, require_input(f, "scores", label), "scores", 2, "[s_q, s_kv]");
      // SPEC §3: k >= 0, ids int32; the [s_q, k] output is at most 2^30 ids (4 GiB).
      const int64_t s_q = std::max<int64_t>(1, c.scores.size(0));
      const int64_t k_max = std::min<int64_t>(2147483647, (int64_t{1} << 30) / s_q);
      c.k = int_param(f, "k", 0, k_max,
                      k_max == 2147483647 ? " (SPEC §3: int32 ids)"
                                          : " (SPEC §3 allows up to 2^31 - 1; the output [s_q = " +
                                                std::to_string(s_q) + ", k] is held to 2^30 ids)");
      // k > s_kv: columns s_kv..k-1 of every row are -1 padding, which every route allocates
      // (the reference, a narrowed candidate padded to k): held to 2^26 ids beyond what the
      // scores can fill, so a legal but absurd k (2^30 for 8 keys) is an error naming it,
      // never gigabytes of -1 or a std::bad_alloc verdict.
      const int64_t s_kv = c.scores.size(1);
      if (c.k > s_kv) {
        const double fill = std::max(static_cast<double>(fixtures::kMaxPaddedElements),
                                     static_cast<double>(c.scores.size(0)) * static_cast<double>(s_kv));
        const int64_t k_pad = std::max<int64_t>(s_kv, static_cast<int64_t>(fill / static_cast<double>(s_q)));
        if (c.k > k_pad)
          throw FileError(label, "params.k got " + std::to_string(c.k) + ", expected at most " + std::to_string(k_pad) +
                                     " for s_q = " + std::to_string(c.scores.size(0)) + ", s_kv = " + std::to_string(s_kv) +
                                     " (k > s_kv: columns s_kv..k-1 of the [s_q, k] output are -1 padding, held to "
                                     "2^26 ids beyond the s_q x s_kv the scores can fill; docs/fixtures.md size limits)");
      }
      c.policy.tie_break =
          parse_tie_break(judged_param<std::string>(f, "tie_break", "\"any\", \"small\" or \"large\"", "SPEC §3"));
      c.policy.sorted = judged_param<bool>(f, "sorted", "true or false", "SPEC §3");
      if (find(f.inputs, "ks") || find(f.inputs, "ke"))  // one alone: windows_of's error
        c.topk_windows = windows_of(f, c.scores.size(0), c.scores.size(1));
    } else if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd) {
      c.mla.q = require_input(f, "q", label);
      c.mla.kv = require_input(f, "kv", label);
      // One activation dtype for q and kv (the plugin ABI: kv "same dtype as q"; SPEC §4: bf16,
      // or fp32 for reference runs); a mixed pair is no kernel's input.
      if (c.mla.q.defined() && c.mla.kv.defined() && c.mla.q.dtype() != c.mla.kv.dtype())
        throw FileError(label, std::string("tensor 'kv' has dtype ") + dtype_name(c.mla.kv.dtype()) + ", expected " +
                                   dtype_name(c.mla.q.dtype()) + ", q's dtype (SPEC §4: q and kv share one "
                                   "dtype, bf16 or fp32 for reference runs)");
      c.mla.indices = require_input(f, "indices", label);
      if (const Tensor* t = find(f.inputs, "topk_length")) c.mla.topk_length = *t;
      if (const Tensor* t = find(f.inputs, "attn_sink")) c.mla.attn_sink = *t;
      c.mla.sm_scale = param<double>(f, "sm_scale");
      // 0 < d_v <= d_qk (q's last dim; SPEC §4); a q of another rank is the reference's error
      c.mla.d_v = c.mla.q.dim() == 3 ? int_param(f, "d_v", 1, c.mla.q.size(2), " (d_qk, q's last dim; SPEC §4)")
                                     : param<int64_t>(f, "d_v");
      if (op == Op::SparseMlaBwd) c.dout = require_input(f, "dout", label);
    } else if (op == Op::IndexerKlLoss) {
      c.kl.scores = with_rank(f, require_input(f, "scores", label), "scores", 2, "[s_q, s_kv]");
      c.kl.q = require_input(f, "q", label);
      c.kl.kv = require_input(f, "kv", label);
      c.kl.sm_scale = param<double>(f, "sm_scale");
      c.kl.coeff = judged_param<double>(f, "coeff", "a finite number", "SPEC §7: loss = coeff · mean");
      c.kl.mode = parse_kl_mode(judged_param<std::string>(f, "mode", "\"dense\" or \"sparse\"", "SPEC §7"));
      c.kl.windows = windows_of(f, c.kl.scores.size(0), c.kl.scores.size(1));
      if (const Tensor* t = find(f.inputs, "indices")) c.kl.indices = *t;
    } else if (op == Op::Fp8IndexerScores) {  // §10: U8 bytes + fp8_dtypes tags
      c.fp8_indexer = fixtures::fp8_indexer_inputs(f, label);
      if (c.fp8_indexer.q_idx.dim() >= 1 && c.fp8_indexer.k_idx.dim() >= 1)  // a rank error is the reference's
        check_indexer_output(f, c.fp8_indexer.q_idx, c.fp8_indexer.k_idx);
    } else if (op == Op::PagedIndexerScores) {
      c.paged_indexer = fixtures::paged_indexer_inputs(f, label);
    } else if (op == Op::SparseMlaFp8Fwd) {
      c.mla_fp8 = fixtures::sparse_mla_fp8_inputs(f, label);
    }
  }
  return c;
}

// ---- declined cases (SPEC-mandatory features, as the property suite's) -------------------

// The SPEC-mandatory features a case of `op` holds, keys as the property suite's draw features
// (property_tests/src/suite.cpp kFeatures, generators.cpp note_*_features), with their words.
struct CaseFeature {
  const char* key;
  const char* description;
};
const CaseFeature kInvalidIds{"invalid_ids", "invalid ids (-1, negative, >= s_kv or past topk_length: contribute nothing; SPEC §4)"};
const CaseFeature kEmptyRows{"empty_rows", "empty rows (no valid slot: out 0, lse +inf; SPEC §6)"};
const CaseFeature kDuplicateIds{"duplicate_ids", "duplicate ids (separate terms; SPEC §4)"};
const CaseFeature kNegInf{"neg_inf_scores", "-inf scores (never selected, -1 slots; SPEC §3.1-§3.2)"};
const CaseFeature kNan{"nan_scores", "NaN scores (never selected; SPEC §3.1)"};
const CaseFeature kTies{"k_boundary_ties",
                        "ties at the k-th value (more selectable entries equal to v* than free slots: the "
                        "tie fill; SPEC §3.3, 'the normal case')"};
const CaseFeature kPoisoned{"poisoned_unread",
                            "unread parts holding anything (table entries past a context, cache slots, keys or "
                            "tokens no valid read uses; SPEC §10)"};
const CaseFeature kEmptyWindows{"empty_windows",
                                "empty key windows (a query row with ks >= ke: an indexer row all -inf, a KL row "
                                "with no term; SPEC §1, §6, §7)"};
const CaseFeature kNegWeights{"negative_weights", "negative head weights w (SPEC §2: w may be negative)"};
const CaseFeature kShortContext{"short_context",
                                "paged contexts shorter than next_n (the first queries' MTP windows empty; "
                                "SPEC §1, §10)"};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

int64_t fp8_cache_tokens(const SparseMlaFp8Inputs& in) { return in.kv_cache.numel() / kMlaFp8TokenBytes; }

// Token `s` of the FP8 cache made ordinary: NoPE and RoPE bytes 0, tile scales 1.
void clean_token(SparseMlaFp8Inputs& in, int64_t s) {
  uint8_t* tok = in.kv_cache.data<uint8_t>() + s * kMlaFp8TokenBytes;
  std::memset(tok, 0, static_cast<size_t>(kMlaFp8TokenBytes));
  const float one = 1.0f;
  for (int64_t tile = 0; tile < kMlaFp8NumTiles; ++tile)
    std::memcpy(tok + kMlaFp8ScalesOffset + 4 * tile, &one, sizeof one);
}

// True when token `s` decodes to finite values with valid scales (no NaN e4m3fn byte, every tile
// scale positive finite, no non-finite bf16 RoPE value).
bool token_ordinary(const SparseMlaFp8Inputs& in, int64_t s) {
  const uint8_t* tok = in.kv_cache.data<uint8_t>() + s * kMlaFp8TokenBytes;
  for (int64_t i = 0; i < kMlaFp8NopeDim; ++i)
    if ((tok[i] & 0x7F) == 0x7F) return false;
  for (int64_t tile = 0; tile < kMlaFp8NumTiles; ++tile) {
    float sc;
    std::memcpy(&sc, tok + kMlaFp8ScalesOffset + 4 * tile, sizeof sc);
    if (!(sc > 0.0f) || !std::isfinite(sc)) return false;
  }
  for (int64_t i = 0; i < kMlaFp8RopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, tok + kMlaFp8RopeOffset + 2 * i, sizeof bits);
    if ((bits & 0x7F80) == 0x7F80) return false;
  }
  return true;
}

// The slots of an FP8 sparse MLA case as SparseMlaInputs (ids, topk_length, one kv row per cache
// token), for sparse_mla_slot_features.
SparseMlaInputs fp8_slots(const SparseMlaFp8Inputs& in) {
  SparseMlaInputs s;
  s.indices = in.indices;
  s.topk_length = in.topk_length;
  s.kv = Tensor(DType::U8, {fp8_cache_tokens(in)});
  return s;
}

// Clean twin of an FP8 cache: zeroes the fp8 bytes of every row the contract does not read
// (read[r] == 0) and sets that row's scale to 1. `bytes` is a U8 tensor of read.size() rows of
// equal width, `scales` one fp32 scale per row (rows past its end keep no scale). Rule: SPEC §10
// (a kernel never reads those rows, so their content may not change its outputs).
void zero_unread_rows(Tensor& bytes, Tensor& scales, const std::vector<char>& read) {
  const int64_t rows = static_cast<int64_t>(read.size());
  const int64_t width = bytes.numel() / std::max<int64_t>(1, rows);
  for (int64_t r = 0; r < rows; ++r)
    if (!read[static_cast<size_t>(r)]) {
      std::memset(bytes.raw() + r * width, 0, static_cast<size_t>(width));
      if (r < scales.numel()) scales.set(r, 1.0);
    }
}

}  // namespace

// ---- SPEC §10 clean twins (declared in fixture_check.h) ----------------------------------

Fp8IndexerInputs clean_unread(const Fp8IndexerInputs& in) {
  Fp8IndexerInputs out = in;
  zero_unread_rows(out.k_idx, out.k_scale, read_mask(in));
  return out;
}

PagedIndexerInputs clean_unread(const PagedIndexerInputs& in) {
  PagedIndexerInputs out = in;
  const int64_t num_blocks = in.k_cache.size(0), bs = in.k_cache.size(1);
  const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
  const std::vector<char> read = read_mask(in);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t L = b < in.context_lens.numel() ? static_cast<int64_t>(in.context_lens.get(b)) : 0;
    for (int64_t i = std::max<int64_t>(0, (L + bs - 1) / std::max<int64_t>(1, bs)); i < max_blocks; ++i)
      if (num_blocks > 0) out.block_table.set(b * max_blocks + i, 0.0);
  }
  zero_unread_rows(out.k_cache, out.k_scale_cache, read);
  return out;
}

SparseMlaFp8Inputs clean_unread(const SparseMlaFp8Inputs& in) {
  SparseMlaFp8Inputs out = in;
  const int64_t tokens = fp8_cache_tokens(in);
  const std::vector<char> read = read_mask(in);
  for (int64_t s = 0; s < tokens; ++s)
    if (!read[static_cast<size_t>(s)]) clean_token(out, s);
  return out;
}

bool holds_poisoned_unread(const Fp8IndexerInputs& in) {
  const Fp8IndexerInputs clean = clean_unread(in);
  return !same_bytes(clean.k_idx, in.k_idx) || !same_bytes(clean.k_scale, in.k_scale);
}

bool holds_poisoned_unread(const PagedIndexerInputs& in) {
  const PagedIndexerInputs clean = clean_unread(in);
  return !same_bytes(clean.k_cache, in.k_cache) || !same_bytes(clean.k_scale_cache, in.k_scale_cache) ||
         !same_bytes(clean.block_table, in.block_table);
}

bool holds_poisoned_unread(const SparseMlaFp8Inputs& in) { return !same_bytes(clean_unread(in).kv_cache, in.kv_cache); }

namespace {

// True when the op's check also runs the case with its unread parts poisoned (check_paged_
// indexer_scores: table entries past a context and unread slots; check_sparse_mla_fp8_forward:
// tokens no valid slot reads): a decline of that run is a decline of poisoned_unread.
bool check_poisons(Op op, const OpCase& c) {
  if (op == Op::PagedIndexerScores) return true;  // its NaN-block run adds blocks, always
  if (op == Op::SparseMlaFp8Fwd) return !same_bytes(poison_unread_tokens(c.mla_fp8).kv_cache, c.mla_fp8.kv_cache);
  return false;
}

// True when some row of `w` has an empty window (ks >= ke after clamping; SPEC §1, §6).
bool any_empty_window(const KeyWindows& w) {
  for (int64_t t = 0; t < w.s_q() && t < static_cast<int64_t>(w.ke.size()); ++t)
    if (w.length(t) == 0) return true;
  return false;
}

// True when some element of `w` (head weights) is negative (SPEC §2); -0 and NaN are not.
bool any_negative(const Tensor& w) {
  for (int64_t i = 0; i < w.numel(); ++i)
    if (w.get(i) < 0) return true;
  return false;
}

// next_n of a paged indexer case (q_idx [batch, next_n, H_I, d_I]); 0 for another rank.
int64_t paged_next_n(const PagedIndexerInputs& in) { return in.q_idx.dim() == 4 ? in.q_idx.size(1) : 0; }

// True when some request's context is shorter than next_n (SPEC §1, §10: its first queries'
// MTP windows are empty).
bool holds_short_context(const PagedIndexerInputs& in) {
  const int64_t next_n = paged_next_n(in);
  for (int64_t b = 0; b < in.context_lens.numel(); ++b)
    if (in.context_lens.get(b) < static_cast<double>(next_n)) return true;
  return false;
}

std::vector<CaseFeature> mandatory_features(Op op, const OpCase& c) {
  std::vector<CaseFeature> out;
  if (op == Op::Topk) {
    const int64_t s_q = c.scores.size(0), s_kv = c.scores.size(1);
    bool nan = false, ninf = false, ties = false;
    std::vector<double> v;
    for (int64_t t = 0; t < s_q; ++t) {
      v.clear();
      for (int64_t s = 0; s < s_kv; ++s) {
        const double x = c.scores.get(t * s_kv + s);
        // -inf and NaN count wherever they are: the kernel is handed the whole tensor, and §2
        // writes -inf outside every window, so a top-k that cannot take them is not conforming
        // (fresh12 F8: a kernel declining any -inf skipped topk_distinct_causal, whose -inf lie
        // outside its windows only). As the property suite's note_topk_features.
        nan = nan || std::isnan(x);
        ninf = ninf || x == -INFINITY;
        // Outside the windows nothing is selectable, so no tie there.
        if (c.topk_windows && !c.topk_windows->contains(t, s)) continue;
        if (!std::isnan(x) && x != -INFINITY) v.push_back(x);
      }
      const int64_t n = static_cast<int64_t>(v.size()), k_eff = std::min(c.k, n);
      if (ties || k_eff == 0 || k_eff == n) continue;
      std::nth_element(v.begin(), v.begin() + (k_eff - 1), v.end(), std::greater<double>());
      const double kth = v[static_cast<size_t>(k_eff - 1)];
      ties = std::any_of(v.begin() + k_eff, v.end(), [&](double x) { return x == kth; });
    }
    if (ties) out.push_back(kTies);
    if (ninf) out.push_back(kNegInf);
    if (nan) out.push_back(kNan);
  } else if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd || op == Op::SparseMlaFp8Fwd) {
    const SlotFeatures f = sparse_mla_slot_features(op == Op::SparseMlaFp8Fwd ? fp8_slots(c.mla_fp8) : c.mla);
    if (f.invalid) out.push_back(kInvalidIds);
    if (f.empty) out.push_back(kEmptyRows);
    if (f.duplicates) out.push_back(kDuplicateIds);
    if (op == Op::SparseMlaFp8Fwd && holds_poisoned_unread(c.mla_fp8))
      out.push_back(kPoisoned);
  } else if (op == Op::IndexerKlLoss) {
    // SPEC §7: a -inf score takes its key out of S_t; wherever it is, as top-k's (§2 writes
    // -inf outside every window, and the loss is handed the whole tensor).
    for (int64_t i = 0; i < c.kl.scores.numel(); ++i)
      if (c.kl.scores.get(i) == -INFINITY) {
        out.push_back(kNegInf);
        break;
      }
    // SPEC §1, §7: a row whose window is empty has no term (fresh15 F2).
    if (any_empty_window(c.kl.windows)) out.push_back(kEmptyWindows);
  } else if (op == Op::IndexerScores || op == Op::IndexerScoresBackward) {
    // SPEC §1, §6: an empty window is legal (a row all -inf); §2: w may be negative (fresh15 F2).
    if (any_empty_window(c.windows)) out.push_back(kEmptyWindows);
    if (any_negative(c.w)) out.push_back(kNegWeights);
  } else if (op == Op::Fp8IndexerScores) {
    if (any_empty_window(c.fp8_indexer.windows)) out.push_back(kEmptyWindows);
    if (any_negative(c.fp8_indexer.w)) out.push_back(kNegWeights);
    if (holds_poisoned_unread(c.fp8_indexer)) out.push_back(kPoisoned);
  } else if (op == Op::PagedIndexerScores) {
    // SPEC §10 uses §1's MTP windows, clamped: a context shorter than next_n empties the first
    // queries' windows (the paged indexer's empty windows).
    if (holds_short_context(c.paged_indexer)) out.push_back(kShortContext);
    if (any_negative(c.paged_indexer.w)) out.push_back(kNegWeights);
    if (holds_poisoned_unread(c.paged_indexer)) out.push_back(kPoisoned);
  }
  return out;
}

// A copy of `src` with every non-finite element set to 0 (values a twin reads that the case
// never read: poisoned rows behind invalid ids).
Tensor finite_copy(const Tensor& src) {
  Tensor t = src;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i))) t.set(i, 0.0);
  return t;
}

// A fresh twin of `c`: never judged (no shared results, no forward out), the backend runs it.
OpCase twin_of(const OpCase& c) {
  OpCase twin = c;
  twin.memo = nullptr;
  twin.fwd_out.reset();
  return twin;
}

// `t` with each -inf entry (and NaN entry, `nan`) replaced by its own finite value below every
// finite entry of `t`, the others kept.
void replace_non_finite_below(Tensor& t, bool ninf, bool nan) {
  double lowest = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) lowest = std::min(lowest, t.get(i));
  double next = std::floor(lowest) - 1.0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.get(i);
    if ((ninf && x == -INFINITY) || (nan && std::isnan(x))) t.set(i, next--);
  }
}

// The slots of a sparse MLA case over `rows` key rows (kv rows, or the FP8 cache's tokens), for
// the twins that give slots new valid ids: `ordinary(r)` is true when row r holds finite values
// (valid scales), `make_ordinary(r)` makes it so (its non-finite values zeroed; an FP8 token
// cleaned). The ids read before are the case's (`ids`, `len`).
struct SlotRows {
  int64_t rows = 0;
  std::function<bool(int64_t)> ordinary;
  std::function<void(int64_t)> make_ordinary;
};

// Gives new valid ids to the slots of `indices` (and widens `topk_length`) so that the case no
// longer holds the slot feature `key`, the others kept as far as they can be; the new ids are key
// rows unused in their row, ordinary ones first (another is made ordinary when read):
// "duplicate_ids" gives each repeat of a valid id in a row such an id; "invalid_ids" gives every
// invalid slot one and widens topk_length to k (no row is then empty); "empty_rows" gives slot 0
// of each row without a valid slot one and widens that row's topk_length to 1 (a row's other
// invalid slots kept). False for another key, k = 0, or more ids needed in a row than rows.
bool refill_slots(const std::string& key, const Tensor& ids, const std::optional<Tensor>& len_in, Tensor& indices,
                  std::optional<Tensor>& topk_length, const SlotRows& kv) {
  const bool dup = key == kDuplicateIds.key, invalid = key == kInvalidIds.key, empty = key == kEmptyRows.key;
  if (!dup && !invalid && !empty) return false;
  const int64_t s_q = ids.size(0), k = ids.size(-1), s_kv = kv.rows;
  if (k < 1 || ids.numel() != s_q * k) return false;
  std::vector<int64_t> rows, poisoned;
  for (int64_t r = 0; r < s_kv; ++r) (kv.ordinary(r) ? rows : poisoned).push_back(r);
  const size_t n_ordinary = rows.size();
  rows.insert(rows.end(), poisoned.begin(), poisoned.end());
  std::set<int64_t> used;
  size_t next = 0;
  auto fresh_id = [&]() -> std::optional<int64_t> {  // a key row unused in the current row
    while (next < rows.size() && used.count(rows[next])) ++next;
    if (next == rows.size()) return std::nullopt;
    const int64_t r = rows[next];
    used.insert(r);
    if (next >= n_ordinary) kv.make_ordinary(r);
    return r;
  };
  for (int64_t t = 0; t < s_q; ++t) {
    used.clear();
    next = 0;
    const int64_t len = len_in ? static_cast<int64_t>(len_in->get(t)) : k;
    auto valid = [&](int64_t j) {
      const double id = ids.get(t * k + j);
      return j < len && id >= 0 && id < static_cast<double>(s_kv);
    };
    std::vector<int64_t> repeats, invalid_slots;
    for (int64_t j = 0; j < k; ++j) {
      if (!valid(j)) invalid_slots.push_back(j);
      else if (!used.insert(static_cast<int64_t>(ids.get(t * k + j))).second) repeats.push_back(j);
    }
    std::vector<int64_t> to_fill;
    if (dup) to_fill = repeats;
    if (invalid) to_fill = invalid_slots;
    if (empty && static_cast<int64_t>(invalid_slots.size()) == k) to_fill = {0};
    for (const int64_t j : to_fill) {
      const std::optional<int64_t> id = fresh_id();
      if (!id) return false;
      indices.set(t * k + j, static_cast<double>(*id));
    }
    if (topk_length && invalid) topk_length->set(t, static_cast<double>(k));
    if (topk_length && empty && !to_fill.empty() && len < 1) topk_length->set(t, 1.0);
  }
  return true;
}

// The key rows of a sparse MLA case's kv (SlotRows of `in`).
SlotRows kv_rows(SparseMlaInputs& in) {
  SlotRows r;
  r.rows = in.kv.size(0);
  const int64_t row_len = r.rows > 0 ? in.kv.numel() / r.rows : 0;
  r.ordinary = [&in, row_len](int64_t row) {
    for (int64_t i = 0; i < row_len; ++i)
      if (!std::isfinite(in.kv.get(row * row_len + i))) return false;
    return true;
  };
  r.make_ordinary = [&in, row_len](int64_t row) {
    for (int64_t i = 0; i < row_len; ++i)
      if (!std::isfinite(in.kv.get(row * row_len + i))) in.kv.set(row * row_len + i, 0.0);
  };
  return r;
}

// The tokens of an FP8 sparse MLA case's cache (SlotRows of `in`).
SlotRows token_rows(SparseMlaFp8Inputs& in) {
  SlotRows r;
  r.rows = fp8_cache_tokens(in);
  r.ordinary = [&in](int64_t s) { return token_ordinary(in, s); };
  r.make_ordinary = [&in](int64_t s) { clean_token(in, s); };
  return r;
}

// ---- the indexer, KL and §10 indexer features taken out (fresh15 F2) ----------------------

// `t` (fp8 bytes) with every byte that decodes to NaN or inf in `format` set to 0.
void fp8_finite_bytes(Tensor& t, Fp8Format format) {
  uint8_t* b = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(fp8_to_double(b[i], format))) b[i] = 0;
}

// Each empty window of `w` widened to the one key chosen by `key_for(row)` (in [0, s_kv)).
// False when s_kv = 0 (no key to widen to).
bool widen_empty_windows(KeyWindows& w, int64_t s_kv, const std::function<int64_t(int64_t)>& key_for) {
  if (s_kv < 1) return false;
  for (int64_t t = 0; t < w.s_q() && t < static_cast<int64_t>(w.ke.size()); ++t)
    if (w.length(t) == 0) {
      const int64_t s = key_for(t);
      w.ks[static_cast<size_t>(t)] = s;
      w.ke[static_cast<size_t>(t)] = s + 1;
    }
  return true;
}

// The key an empty window of row t is widened to when nothing else matters: its ks clamped
// into [0, s_kv).
int64_t clamped_start(const KeyWindows& w, int64_t t, int64_t s_kv) {
  return std::clamp<int64_t>(w.ks[static_cast<size_t>(t)], 0, std::max<int64_t>(0, s_kv - 1));
}

// The §2 indexer twin without empty windows: each widened to one key; values no row read
// before (non-finite q_idx, w rows of empty rows, k_idx rows outside every window, d_scores
// outside the windows) zeroed, as they are read now.
bool indexer_without_empty_windows(Op op, OpCase& t) {
  const int64_t s_kv = t.k_idx.dim() > 0 ? t.k_idx.size(0) : 0;
  if (!widen_empty_windows(t.windows, s_kv, [&](int64_t r) { return clamped_start(t.windows, r, s_kv); }))
    return false;
  t.q_idx = finite_copy(t.q_idx);
  t.k_idx = finite_copy(t.k_idx);
  t.w = finite_copy(t.w);
  if (op == Op::IndexerScoresBackward) t.d_scores = finite_copy(t.d_scores);
  return true;
}

// The KL twin without empty windows: each widened to one key whose score is set to -inf, so
// the row still has no term (SPEC §7: a -inf key is not in S_t); q and kv rows never read
// before made finite (zeroed).
bool kl_without_empty_windows(OpCase& t) {
  IndexerKlInputs& in = t.kl;
  const int64_t s_kv = in.scores.dim() == 2 ? in.scores.size(1) : 0;
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < in.windows.s_q(); ++r)
    if (in.windows.length(r) == 0) rows.push_back(r);
  if (!widen_empty_windows(in.windows, s_kv, [&](int64_t r) { return clamped_start(in.windows, r, s_kv); }))
    return false;
  for (const int64_t r : rows)
    if (in.scores.numel() == in.windows.s_q() * s_kv) in.scores.set(r * s_kv + in.windows.ks[static_cast<size_t>(r)], -INFINITY);
  in.q = finite_copy(in.q);
  in.kv = finite_copy(in.kv);
  return true;
}

// The FP8 indexer twin without empty windows: each widened to one key, the same for every row,
// chosen so that the unread keys change as little as they can (poisoned_unread kept): a key
// some other window reads; else an unread key already clean (bytes 0, scale 1); else one
// holding finite values and a valid scale; else key 0 made ordinary (bytes 0, scale 1).
// Non-finite q_idx bytes and w values (rows never read before) zeroed.
bool fp8_indexer_without_empty_windows(Fp8IndexerInputs& in) {
  const int64_t s_kv = in.k_idx.size(0), d = s_kv > 0 ? in.k_idx.numel() / s_kv : 0;
  if (s_kv < 1) return false;
  auto key_bytes = [d](const Tensor& k, int64_t s) { return k.data<uint8_t>() + s * d; };
  auto is_clean = [&](int64_t s) {
    return in.k_scale.get(s) == 1.0 &&
           std::all_of(key_bytes(in.k_idx, s), key_bytes(in.k_idx, s) + d, [](uint8_t x) { return x == 0; });
  };
  auto ordinary = [&](int64_t s) {
    const double sc = in.k_scale.get(s);
    if (!(sc > 0.0) || !std::isfinite(sc)) return false;
    for (int64_t c = 0; c < d; ++c)
      if (!std::isfinite(fp8_to_double(key_bytes(in.k_idx, s)[c], in.format))) return false;
    return true;
  };
  int64_t key = -1;
  for (int64_t r = 0; r < in.windows.s_q() && key < 0; ++r)
    if (in.windows.length(r) > 0) key = std::clamp<int64_t>(in.windows.ks[static_cast<size_t>(r)], 0, s_kv - 1);
  for (int64_t s = 0; s < s_kv && key < 0; ++s)
    if (is_clean(s)) key = s;
  for (int64_t s = 0; s < s_kv && key < 0; ++s)
    if (ordinary(s)) key = s;
  if (key < 0) {
    key = 0;
    std::memset(in.k_idx.raw(), 0, static_cast<size_t>(d));
    in.k_scale.set(0, 1.0);
  }
  widen_empty_windows(in.windows, s_kv, [key](int64_t) { return key; });
  fp8_finite_bytes(in.q_idx, in.format);
  in.w = finite_copy(in.w);
  return true;
}

// True when paged cache slot `slot` (block · block_size + position) decodes to finite values
// with a positive finite scale.
bool paged_slot_ordinary(const PagedIndexerInputs& in, int64_t slot, int64_t d) {
  const double sc = slot < in.k_scale_cache.numel() ? in.k_scale_cache.get(slot) : 0.0;
  if (!(sc > 0.0) || !std::isfinite(sc)) return false;
  const uint8_t* b = in.k_cache.data<uint8_t>() + slot * d;
  for (int64_t c = 0; c < d; ++c)
    if (!std::isfinite(fp8_to_double(b[c], in.format))) return false;
  return true;
}

// The paged twin without short contexts: each context shorter than next_n lengthened to next_n
// (max_context too when it is given and shorter). The positions added read ordinary slots:
// a table entry past the old context (may hold anything) is pointed at its own block when in
// range and ordinary there, else at the first block ordinary at those positions, else at block
// 0 (or its own) with those slots made ordinary (bytes 0, scale 1); an entry the old context
// already read is kept, its added slots made ordinary. Non-finite q_idx bytes and w values
// (rows never read before) zeroed. False when the table cannot hold next_n keys or the cache is
// empty.
bool paged_without_short_contexts(PagedIndexerInputs& in) {
  const int64_t next_n = paged_next_n(in), num_blocks = in.k_cache.size(0), bs = in.k_cache.size(1);
  const int64_t batch = in.block_table.size(0), max_blocks = in.block_table.size(1);
  if (num_blocks < 1 || bs < 1 || max_blocks * bs < next_n) return false;
  const int64_t d = in.k_cache.numel() / (num_blocks * bs);
  for (int64_t b = 0; b < batch && b < in.context_lens.numel(); ++b) {
    const int64_t L = std::max<int64_t>(0, static_cast<int64_t>(in.context_lens.get(b)));
    if (L >= next_n) continue;
    const int64_t first_new_entry = (L + bs - 1) / bs;
    for (int64_t i = L / bs; i * bs < next_n; ++i) {
      const int64_t lo = std::max(L, i * bs), hi = std::min(next_n, (i + 1) * bs);  // positions added
      auto ordinary_in = [&](int64_t blk) {
        for (int64_t p = lo; p < hi; ++p)
          if (!paged_slot_ordinary(in, blk * bs + p % bs, d)) return false;
        return true;
      };
      const double entry = in.block_table.get(b * max_blocks + i);
      int64_t blk = entry >= 0 && entry < static_cast<double>(num_blocks) ? static_cast<int64_t>(entry) : -1;
      if (blk < 0 || (i >= first_new_entry && !ordinary_in(blk))) {
        int64_t found = -1;
        for (int64_t x = 0; x < num_blocks && found < 0; ++x)
          if (ordinary_in(x)) found = x;
        blk = found >= 0 ? found : std::max<int64_t>(0, blk);
        in.block_table.set(b * max_blocks + i, static_cast<double>(blk));
      }
      for (int64_t p = lo; p < hi; ++p)
        if (!paged_slot_ordinary(in, blk * bs + p % bs, d)) {
          std::memset(in.k_cache.raw() + (blk * bs + p % bs) * d, 0, static_cast<size_t>(d));
          in.k_scale_cache.set(blk * bs + p % bs, 1.0);
        }
    }
    in.context_lens.set(b, static_cast<double>(next_n));
  }
  if (in.max_context >= 0 && in.max_context < next_n) in.max_context = next_n;
  fp8_finite_bytes(in.q_idx, in.format);
  in.w = finite_copy(in.w);
  return true;
}

// The head weights of an indexer op's case (§2, FP8, paged, backward); null for another op.
Tensor* head_weights(Op op, OpCase& c) {
  switch (op) {
    case Op::IndexerScores:
    case Op::IndexerScoresBackward: return &c.w;
    case Op::Fp8IndexerScores: return &c.fp8_indexer.w;
    case Op::PagedIndexerScores: return &c.paged_indexer.w;
    default: return nullptr;
  }
}

// Takes the one feature `key` out of the twin `t` of an indexer (§2, its backward, FP8, paged)
// or KL loss case in place, the other features kept as far as they can be:
// "negative_weights" w made |w|; "empty_windows" each empty window widened to one key
// (indexer_without_empty_windows, kl_without_empty_windows, fp8_indexer_without_empty_windows);
// "short_context" contexts lengthened to next_n (paged_without_short_contexts);
// "poisoned_unread" the clean twin (clean_unread); the KL loss's "neg_inf_scores" its -inf
// scores made distinct finite values below every score. False for another op or key, or when
// the twin cannot be built (no key to widen to, a table too narrow for next_n keys).
bool take_out_indexer_feature(Op op, OpCase& t, const std::string& key) {
  if (key == kNegWeights.key) {
    Tensor* w = head_weights(op, t);
    if (!w) return false;
    for (int64_t i = 0; i < w->numel(); ++i)
      if (w->get(i) < 0) w->set(i, -w->get(i));
    return true;
  }
  if (key == kEmptyWindows.key) {
    if (op == Op::IndexerScores || op == Op::IndexerScoresBackward) return indexer_without_empty_windows(op, t);
    if (op == Op::IndexerKlLoss) return kl_without_empty_windows(t);
    if (op == Op::Fp8IndexerScores) return fp8_indexer_without_empty_windows(t.fp8_indexer);
    return false;
  }
  if (key == kShortContext.key) return op == Op::PagedIndexerScores && paged_without_short_contexts(t.paged_indexer);
  if (key == kPoisoned.key && op == Op::Fp8IndexerScores) {
    t.fp8_indexer = clean_unread(t.fp8_indexer);
    return true;
  }
  if (key == kPoisoned.key && op == Op::PagedIndexerScores) {
    t.paged_indexer = clean_unread(t.paged_indexer);
    return true;
  }
  if (key == kNegInf.key && op == Op::IndexerKlLoss) {
    replace_non_finite_below(t.kl.scores, true, false);
    return true;
  }
  return false;
}

// The order in which the twin without every feature takes them out: widening a KL window
// writes a -inf score (taken out after), lengthening a context reads slots (cleaned after).
const CaseFeature* const kTakeOutOrder[] = {&kEmptyWindows, &kShortContext, &kNegWeights, &kNegInf, &kPoisoned};

// The case's twin without its SPEC-mandatory features: same op, shapes, dtypes, optional
// inputs, k, policy and windows. Top-k: distinct finite scores (s_kv - s in column s: no tie,
// no NaN, no -inf). Sparse MLA (FP8 cache too): ids 0..k-1 in slot order and topk_length = k
// (every slot valid, distinct; non-finite q, kv and dout values zeroed, as rows never read may
// hold them; FP8: tokens read made ordinary, the others cleaned). KL loss: its -inf scores made
// finite. FP8 and paged indexer: the clean twin. nullopt when none can be built (sparse MLA with
// k > s_kv: some slot must then repeat an id or be invalid) or for another op.
std::optional<OpCase> twin_without_mandatory(Op op, const OpCase& c) {
  OpCase twin = twin_of(c);
  if (op == Op::Topk) {
    const int64_t s_q = c.scores.size(0), s_kv = c.scores.size(1);
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t s = 0; s < s_kv; ++s) twin.scores.set(t * s_kv + s, static_cast<double>(s_kv - s));
    return twin;
  }
  if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd) {
    SparseMlaInputs& in = twin.mla;
    const int64_t s_q = in.indices.size(0), k = in.indices.size(-1), s_kv = in.kv.size(0);
    if (k > s_kv) return std::nullopt;
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < k; ++j) in.indices.set(t * k + j, static_cast<double>(j));
    if (in.topk_length)
      for (int64_t t = 0; t < s_q; ++t) in.topk_length->set(t, static_cast<double>(k));
    in.q = finite_copy(in.q);
    in.kv = finite_copy(in.kv);
    if (op == Op::SparseMlaBwd) twin.dout = finite_copy(twin.dout);
    return twin;
  }
  if (op == Op::SparseMlaFp8Fwd) {
    SparseMlaFp8Inputs& in = twin.mla_fp8;
    const int64_t s_q = in.indices.size(0), k = in.indices.size(-1), tokens = fp8_cache_tokens(in);
    if (k > tokens) return std::nullopt;
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t j = 0; j < k; ++j) in.indices.set(t * k + j, static_cast<double>(j));
    if (in.topk_length)
      for (int64_t t = 0; t < s_q; ++t) in.topk_length->set(t, static_cast<double>(k));
    for (int64_t s = 0; s < k; ++s)
      if (!token_ordinary(in, s)) clean_token(in, s);
    in = clean_unread(in);
    in.q = finite_copy(in.q);
    return twin;
  }
  if (op == Op::IndexerKlLoss || op == Op::IndexerScores || op == Op::IndexerScoresBackward ||
      op == Op::Fp8IndexerScores || op == Op::PagedIndexerScores) {
    std::set<std::string> held;
    for (const auto& x : mandatory_features(op, c)) held.insert(x.key);
    for (const CaseFeature* x : kTakeOutOrder)
      if (held.count(x->key) && !take_out_indexer_feature(op, twin, x->key)) return std::nullopt;
    return twin;
  }
  return std::nullopt;
}

// The top-k case's twin without one SPEC-mandatory feature (`key`), every other one kept, so that
// a decline can be laid to that feature alone: "neg_inf_scores" and "nan_scores" replace each
// such entry by its own finite value below every finite score of the case; "k_boundary_ties"
// gives every finite entry of a row its own value, in the row's order (equal values by column),
// -inf and NaN kept. nullopt for another op or key.
std::optional<OpCase> topk_twin_without(const OpCase& c, const std::string& key) {
  const bool ninf = key == kNegInf.key, nan = key == kNan.key, ties = key == kTies.key;
  if (!ninf && !nan && !ties) return std::nullopt;
  OpCase twin = twin_of(c);
  const int64_t s_q = c.scores.size(0), s_kv = c.scores.size(1);
  if (ninf || nan) {
    replace_non_finite_below(twin.scores, ninf, nan);
    return twin;
  }
  std::vector<int64_t> cols;
  for (int64_t t = 0; t < s_q; ++t) {
    cols.clear();
    for (int64_t s = 0; s < s_kv; ++s)
      if (std::isfinite(c.scores.get(t * s_kv + s))) cols.push_back(s);
    std::stable_sort(cols.begin(), cols.end(), [&](int64_t a, int64_t b) {
      return c.scores.get(t * s_kv + a) > c.scores.get(t * s_kv + b);
    });
    for (size_t r = 0; r < cols.size(); ++r)
      twin.scores.set(t * s_kv + cols[r], static_cast<double>(cols.size() - r));
  }
  return twin;
}

// The case's twin without the one mandatory feature `key`, the others kept as far as they can be,
// or nullopt. Top-k: topk_twin_without. Sparse MLA (FP8 cache too): refill_slots, non-finite q
// and dout values zeroed for the rows made readable. KL loss, FP8 and paged indexer (one feature
// each), FP8 sparse MLA's poisoned_unread: twin_without_mandatory's change for that feature alone.
std::optional<OpCase> twin_without(Op op, const OpCase& c, const std::string& key) {
  if (op == Op::Topk) return topk_twin_without(c, key);
  OpCase twin = twin_of(c);
  if (op == Op::IndexerKlLoss || op == Op::IndexerScores || op == Op::IndexerScoresBackward ||
      op == Op::Fp8IndexerScores || op == Op::PagedIndexerScores) {
    if (!take_out_indexer_feature(op, twin, key)) return std::nullopt;
    return twin;
  }
  if (op == Op::SparseMlaFp8Fwd) {
    SparseMlaFp8Inputs& in = twin.mla_fp8;
    if (key == kPoisoned.key) {
      in = clean_unread(c.mla_fp8);
      return twin;
    }
    if (!refill_slots(key, c.mla_fp8.indices, c.mla_fp8.topk_length, in.indices, in.topk_length, token_rows(in)))
      return std::nullopt;
    if (key != kDuplicateIds.key) in.q = finite_copy(in.q);
    return twin;
  }
  if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd) {
    SparseMlaInputs& in = twin.mla;
    if (!refill_slots(key, c.mla.indices, c.mla.topk_length, in.indices, in.topk_length, kv_rows(in)))
      return std::nullopt;
    if (key != kDuplicateIds.key) {
      in.q = finite_copy(in.q);
      if (op == Op::SparseMlaBwd) twin.dout = finite_copy(twin.dout);
    }
    return twin;
  }
  return std::nullopt;
}

// The case with the last slot of row 0 set to -1 (an invalid id, SPEC §4), everything else
// as given: a sparse MLA case (FP8 cache too) of k >= 1 slots; nullopt for other ops or k = 0.
std::optional<OpCase> twin_with_an_invalid_id(Op op, const OpCase& c) {
  if (op != Op::SparseMlaFwd && op != Op::SparseMlaBwd && op != Op::SparseMlaFp8Fwd) return std::nullopt;
  const Tensor& ids = op == Op::SparseMlaFp8Fwd ? c.mla_fp8.indices : c.mla.indices;
  const int64_t k = ids.size(-1);
  if (k < 1 || ids.numel() < k) return std::nullopt;
  OpCase twin = twin_of(c);
  (op == Op::SparseMlaFp8Fwd ? twin.mla_fp8.indices : twin.mla.indices).set(k - 1, -1.0);
  return twin;
}

// ---- value twins that keep every feature (fresh11 F2) -------------------------------------
// A backend that declines by value (say whenever indices[0,0] == 0) declines a twin that only
// takes features out as well, when the twin keeps that value. These twins keep every feature,
// shape, dtype and optional input of the case and move its values: a kernel that runs one but
// declined the case declined it by value.

// Rows [0, n) of `t` (leading dimension n, contiguous) in reverse order.
void reverse_rows(Tensor& t) {
  const int64_t n = t.dim() > 0 ? t.size(0) : 0;
  if (n < 2) return;
  const size_t row = t.nbytes() / static_cast<size_t>(n);
  std::vector<std::byte> tmp(row);
  for (int64_t a = 0, b = n - 1; a < b; ++a, --b) {
    std::memcpy(tmp.data(), t.raw() + a * row, row);
    std::memcpy(t.raw() + a * row, t.raw() + b * row, row);
    std::memcpy(t.raw() + b * row, tmp.data(), row);
  }
}

// The `rows` leading rows of `t` (contiguous, `t.nbytes() / rows` bytes each) moved one down
// cyclically: row r goes to row (r + 1) % rows.
void shift_rows(Tensor& t, int64_t rows) {
  if (rows < 2) return;
  const size_t row = t.nbytes() / static_cast<size_t>(rows);
  std::vector<std::byte> copy(t.raw(), t.raw() + t.nbytes());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(t.raw() + ((r + 1) % rows) * row, copy.data() + r * row, row);
}

// Each id of `ids` in [0, rows) relabelled r -> (r + 1) % rows (the others kept): ids over key
// rows moved by shift_rows.
void relabel_ids(Tensor& ids, int64_t rows) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const double id = ids.get(i);
    if (id >= 0 && id < static_cast<double>(rows)) ids.set(i, static_cast<double>((static_cast<int64_t>(id) + 1) % rows));
  }
}

// The H heads (dimension `dim` of size H) of `t` reversed; t contiguous.
void reverse_heads(Tensor& t, int dim) {
  if (t.dim() <= dim || t.size(dim) < 2) return;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= t.size(i);
  for (int i = dim + 1; i < t.dim(); ++i) inner *= t.size(i);
  const int64_t h = t.size(dim);
  const size_t elem = t.nbytes() / static_cast<size_t>(std::max<int64_t>(1, t.numel()));
  const size_t chunk = static_cast<size_t>(inner) * elem;
  std::vector<std::byte> copy(t.raw(), t.raw() + t.nbytes());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < h; ++j)
      std::memcpy(t.raw() + (o * h + (h - 1 - j)) * chunk, copy.data() + (o * h + j) * chunk, chunk);
}

// Every finite element of `t` times `f` (non-finite ones kept).
void scale_finite(Tensor& t, double f) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) t.set(i, t.get(i) * f);
}

// Head weights `w` times -1/2 when they hold both signs, else times 1/2: other values, the
// feature negative_weights kept (all >= 0 stays so, some < 0 stays so).
void move_weights(Tensor& w) {
  bool neg = false, pos = false;
  for (int64_t i = 0; i < w.numel(); ++i) {
    neg = neg || w.get(i) < 0;
    pos = pos || w.get(i) > 0;
  }
  scale_finite(w, neg && pos ? -0.5 : 0.5);
}

// Top-k: in each row the entries inside its window in reverse column order, and the finite values
// replaced by ranks (equal values equal, order kept): -1, -2, ... from the largest, or n, n-1,
// ... when the first finite score is negative, so that it changes sign. -inf and NaN kept.
OpCase topk_other_values(const OpCase& c) {
  OpCase twin = twin_of(c);
  const int64_t s_q = c.scores.size(0), s_kv = c.scores.size(1);
  double first = 0.0;  // the first finite score, flat order
  for (int64_t i = 0; i < c.scores.numel(); ++i)
    if (std::isfinite(c.scores.get(i))) {
      first = c.scores.get(i);
      break;
    }
  const bool positive = first < 0;
  std::vector<double> row(static_cast<size_t>(s_kv)), distinct;
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t s = 0; s < s_kv; ++s) row[static_cast<size_t>(s)] = c.scores.get(t * s_kv + s);
    int64_t lo = 0, hi = s_kv;
    if (c.topk_windows && t < c.topk_windows->s_q()) {
      lo = std::clamp<int64_t>(c.topk_windows->ks[t], 0, s_kv);
      hi = std::clamp<int64_t>(c.topk_windows->ke[t], lo, s_kv);
    }
    std::reverse(row.begin() + lo, row.begin() + hi);
    distinct.clear();
    for (double x : row)
      if (std::isfinite(x)) distinct.push_back(x);
    std::sort(distinct.begin(), distinct.end(), std::greater<double>());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const double n = static_cast<double>(distinct.size());
    for (int64_t s = 0; s < s_kv; ++s) {
      double x = row[static_cast<size_t>(s)];
      if (std::isfinite(x)) {
        const double rank = static_cast<double>(
            std::lower_bound(distinct.begin(), distinct.end(), x, std::greater<double>()) - distinct.begin());
        x = positive ? n - rank : -1.0 - rank;
      }
      twin.scores.set(t * s_kv + s, x);
    }
  }
  return twin;
}

// The case's twin with other values and every feature kept (nullopt when the op has none):
// top-k: topk_other_values; sparse MLA (FP8 cache too): key rows (tokens) moved by one, ids
// relabelled with them, query rows (q, ids, topk_length, dout) in reverse order: the same
// attention, rows permuted; KL loss: finite scores times -1/2, heads of q reversed; FP8 and paged
// indexer: heads of q and w reversed, w times -1/2 (paged: cache blocks moved by one, the table
// relabelled with them); indexer: heads of q_idx and w reversed, w times -1/2.
std::optional<OpCase> twin_with_other_values(Op op, const OpCase& c) {
  OpCase twin = twin_of(c);
  switch (op) {
    case Op::Topk: return topk_other_values(c);
    case Op::SparseMlaFwd:
    case Op::SparseMlaBwd: {
      SparseMlaInputs& in = twin.mla;
      shift_rows(in.kv, in.kv.size(0));
      relabel_ids(in.indices, in.kv.size(0));
      reverse_rows(in.q);
      reverse_rows(in.indices);
      if (in.topk_length) reverse_rows(*in.topk_length);
      if (op == Op::SparseMlaBwd) reverse_rows(twin.dout);
      return twin;
    }
    case Op::SparseMlaFp8Fwd: {
      SparseMlaFp8Inputs& in = twin.mla_fp8;
      const int64_t tokens = fp8_cache_tokens(in);
      shift_rows(in.kv_cache, tokens);
      relabel_ids(in.indices, tokens);
      reverse_rows(in.q);
      reverse_rows(in.indices);
      if (in.topk_length) reverse_rows(*in.topk_length);
      return twin;
    }
    case Op::IndexerKlLoss:
      scale_finite(twin.kl.scores, -0.5);
      reverse_heads(twin.kl.q, 1);
      return twin;
    case Op::Fp8IndexerScores:
      reverse_heads(twin.fp8_indexer.q_idx, 1);
      reverse_heads(twin.fp8_indexer.w, 1);
      move_weights(twin.fp8_indexer.w);
      return twin;
    case Op::PagedIndexerScores: {
      PagedIndexerInputs& in = twin.paged_indexer;
      const int64_t blocks = in.k_cache.size(0);
      shift_rows(in.k_cache, blocks);
      shift_rows(in.k_scale_cache, blocks);
      // the entries a context reads relabelled with their blocks; those past it kept (unread)
      const int64_t bs = std::max<int64_t>(1, in.k_cache.size(1)), batch = in.block_table.size(0),
                    max_blocks = in.block_table.size(1);
      for (int64_t b = 0; b < batch && b < in.context_lens.numel(); ++b) {
        const int64_t used = std::min(max_blocks, (static_cast<int64_t>(in.context_lens.get(b)) + bs - 1) / bs);
        for (int64_t i = 0; i < used; ++i) {
          const double id = in.block_table.get(b * max_blocks + i);
          if (id >= 0 && id < static_cast<double>(blocks))
            in.block_table.set(b * max_blocks + i, static_cast<double>((static_cast<int64_t>(id) + 1) % blocks));
        }
      }
      reverse_heads(in.q_idx, 2);
      reverse_heads(in.w, 1);
      move_weights(in.w);
      return twin;
    }
    case Op::IndexerScores:
    case Op::IndexerScoresBackward:
      reverse_heads(twin.q_idx, 1);
      reverse_heads(twin.w, 1);
      move_weights(twin.w);
      if (op == Op::IndexerScoresBackward) scale_finite(twin.d_scores, -0.5);
      return twin;
    default: return std::nullopt;
  }
}

// True when `b` runs op on `twin` without throwing (a result, whatever its values: the twin is
// not judged). A decline (NotSupported), an argument error or any other error is false.
bool runs_twin(Backend& b, Op op, const OpCase& twin) {
  try {
    switch (op) {
      case Op::Topk: (void)b.select_topk(twin.scores, twin.k, twin.policy, twin.topk_windows); return true;
      case Op::SparseMlaFwd: (void)b.sparse_mla_forward(twin.mla); return true;
      case Op::SparseMlaBwd: (void)b.sparse_mla_backward(twin.mla, twin.dout); return true;
      case Op::IndexerKlLoss: (void)b.indexer_kl_loss(twin.kl); return true;
      case Op::Fp8IndexerScores: (void)b.fp8_indexer_scores(twin.fp8_indexer); return true;
      case Op::PagedIndexerScores: (void)b.paged_indexer_scores(twin.paged_indexer); return true;
      case Op::SparseMlaFp8Fwd: (void)b.sparse_mla_fp8_forward(twin.mla_fp8); return true;
      case Op::IndexerScores: (void)b.indexer_scores(twin.q_idx, twin.k_idx, twin.w, twin.windows); return true;
      case Op::IndexerScoresBackward:
        (void)b.indexer_scores_backward(twin.q_idx, twin.k_idx, twin.w, twin.windows, twin.d_scores);
        return true;
      default: return false;
    }
  } catch (const std::bad_alloc&) {
    throw;  // out of memory is no verdict (ResourceError, judge_fixture_ops)
  } catch (const std::exception&) {
    return false;
  }
}

// A Skip of op on `candidate` that came from a decline (OpReport::declined), settled by
// decline_cause (the one twin test of every route): INCOMPLETE when the decline is proven to be
// about the values (a mandatory feature not named in opt.unsupported, or, with none, the
// values); else a skip whose reason says "declined" and why it is not INCOMPLETE (a declared
// limit, named unsupported, no mandatory feature, the twins declined too: a shape, dtype or
// optional-input limit of the kernel).
void settle_decline(OpReport& r, const Fixture& f, Op op, const OpCase& c, Backend& candidate,
                    const CheckOptions& opt) {
  const std::string why = r.reason;
  auto skip = [&](const std::string& note) { r.reason = "declined: " + why + " (" + note + ")"; };
  if (declared_limitation(why)) return skip("a limit the backend declares up front; not judged");
  const DeclineCause cause = decline_cause(candidate, op, c, opt.unsupported);
  if (cause.by_values) {
    r.verdict = Verdict::Incomplete;
    r.notes.push_back("declined: " + why);
    r.reason = "INCOMPLETE: backend declined " + label_of(f) + " but ran the same case with " + cause.twin +
               ": the decline depends on the values, not on a limit of the kernel: " + why;
    return;
  }
  std::string waived;
  for (const auto& k : cause.waived) waived += (waived.empty() ? "" : ", ") + k;
  if (!cause.incomplete()) {
    if (!waived.empty()) return skip("not judged, named unsupported: " + waived);
    return skip(cause.not_shown + "; not judged");
  }
  std::string keys, words;
  for (const auto& k : cause.depends_on) {
    keys += (keys.empty() ? "" : ",") + k;
    words += (words.empty() ? "" : "; ") + decline_feature_words(k);
  }
  r.verdict = Verdict::Incomplete;
  r.notes.push_back("declined: " + why);
  r.reason = "INCOMPLETE: backend declined a SPEC-mandatory case: " + label_of(f) + " holds " + words +
             "; the backend ran the same case with them taken out (its twin" +
             (cause.twin.empty() ? std::string() : ": " + cause.twin) + ") but declined this one: " + why +
             ". A kernel that leaves them out is audited with --unsupported " + keys +
             " (Python: unsupported=[...]); the verdict then names what was not judged.";
}

}  // namespace

std::string decline_feature_words(const std::string& key) {
  for (const CaseFeature& x :
       {kInvalidIds, kEmptyRows, kDuplicateIds, kNegInf, kNan, kTies, kPoisoned, kEmptyWindows, kNegWeights, kShortContext})
    if (key == x.key) return x.description;
  return key;
}

DeclineCause decline_cause(Backend& b, Op op, const OpCase& c, const std::vector<std::string>& unsupported) {
  DeclineCause r;
  const std::vector<CaseFeature> features = mandatory_features(op, c);
  for (const auto& x : features) r.held.push_back(x.key);
  auto held_by = [&](const OpCase& twin) {
    std::set<std::string> keys;
    for (const auto& x : mandatory_features(op, twin)) keys.insert(x.key);
    return keys;
  };
  std::vector<std::vector<std::string>> ran;  // per twin run: the features it took out
  std::vector<std::string> ran_words;
  // The paged and FP8 sparse MLA checks also run the case with its unread parts poisoned: when
  // the backend runs the case as given, the run it declined was that one (poisoned_unread).
  if (check_poisons(op, c) && runs_twin(b, op, twin_of(c))) {
    if (std::find(r.held.begin(), r.held.end(), kPoisoned.key) == r.held.end()) r.held.push_back(kPoisoned.key);
    ran.push_back({kPoisoned.key});
    ran_words.push_back("as given (the check's run with its unread parts poisoned was the one declined)");
  } else {
    // A twin with other values that keeps every feature (fresh11 F2: a decline keyed on a value
    // such as indices[0,0] declines every twin that keeps it, and stayed a skip): a limit of the
    // kernel or a declined feature is in the twin too, so a kernel that runs it declined by value.
    const std::set<std::string> held_set(r.held.begin(), r.held.end());
    const std::optional<OpCase> moved = twin_with_other_values(op, c);
    if (moved && held_by(*moved) == held_set && runs_twin(b, op, *moved)) {
      r.by_values = true;
      r.twin = op == Op::Topk
                   ? "other finite scores (window entries reversed, scores replaced by their ranks; every "
                     "SPEC-mandatory feature, shape, k, windows and policy kept)"
                   : std::string("other values (") +
                         (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd || op == Op::SparseMlaFp8Fwd
                              ? "key rows and ids relabelled, query rows reversed"
                          : op == Op::IndexerKlLoss ? "finite scores times -1/2, heads reversed"
                          : op == Op::PagedIndexerScores
                              ? "cache blocks and table relabelled, heads reversed, w times +-1/2"
                          : op == Op::IndexerScoresBackward ? "heads reversed, w times +-1/2, d_scores times -1/2"
                                                            : "heads reversed, w times +-1/2") +
                         "; every SPEC-mandatory feature, shape, dtype and optional input kept)";
      return r;
    }
    if (features.empty()) {
      // A limit of the kernel is a shape, dtype, policy or optional input: the twin keeps them
      // all and changes values only (top-k: fresh12 F8; sparse MLA: an id made invalid, SPEC §4,
      // contributes nothing; fresh11 F10: a plugin declining every case whose ids are all valid
      // and distinct passed the audit with those goldens as skips).
      const std::optional<OpCase> twin =
          op == Op::Topk ? twin_without_mandatory(op, c) : twin_with_an_invalid_id(op, c);
      if (twin && runs_twin(b, op, *twin)) {
        r.by_values = true;
        r.twin = op == Op::Topk ? "other finite scores (same shapes, k, windows and policy)"
                                : "one id of row 0 set to -1 (same shapes, dtypes and optional inputs)";
        return r;
      }
      r.not_shown =
          "the case holds no SPEC-mandatory feature: a limit of the kernel (a shape, dtype or optional input)";
      return r;
    }
    // One twin per feature: what each twin the backend runs no longer holds (fresh-user F6: a
    // draw with NaN and -inf declined for its -inf was laid to both, and --unsupported
    // neg_inf_scores left it INCOMPLETE as NaN).
    std::set<std::string> declined_alone;  // features whose own twin the backend declined
    std::vector<std::pair<std::string, std::vector<std::string>>> runs;  // feature, what its twin took out
    for (const auto& x : features) {
      const std::optional<OpCase> twin = twin_without(op, c, x.key);
      if (!twin) continue;
      if (!runs_twin(b, op, *twin)) {
        declined_alone.insert(x.key);
        continue;
      }
      const std::set<std::string> left = held_by(*twin);
      std::vector<std::string> out;
      for (const auto& k : r.held)
        if (!left.count(k)) out.push_back(k);
      runs.push_back({x.key, out});
    }
    // The indexer and KL twins may take out another feature with theirs (an FP8 indexer whose
    // every key is unread and poisoned has to have one cleaned to widen an empty window to it):
    // such a feature whose own twin the backend declined is not laid the decline (the twin
    // without it alone, the feature itself kept, was declined). Sparse MLA's invalid ids and
    // empty rows go together as unsupported_covers says.
    const bool indexer_op = op == Op::IndexerScores || op == Op::IndexerScoresBackward || op == Op::IndexerKlLoss ||
                            op == Op::Fp8IndexerScores || op == Op::PagedIndexerScores;
    for (auto& [key, out] : runs) {
      if (indexer_op)
        out.erase(std::remove_if(out.begin(), out.end(),
                                 [&, k = key](const std::string& y) { return y != k && declined_alone.count(y); }),
                  out.end());
      if (out.empty()) continue;  // took nothing out: shows nothing
      ran.push_back(out);
      ran_words.push_back(std::string("without ") + key);
    }
    std::string all_words;
    for (const auto& x : features) all_words += std::string(all_words.empty() ? "" : "; ") + x.description;
    if (ran.empty()) {
      const std::optional<OpCase> twin = twin_without_mandatory(op, c);
      if (!twin) {
        r.not_shown = "the case holds " + all_words +
                      ", but no twin without them has its shape (k > s_kv): not shown to be about them";
        return r;
      }
      if (!runs_twin(b, op, *twin)) {
        r.not_shown = "the case holds " + all_words +
                      ", but the backend declined its twin without them too: a limit of the kernel, not about them";
        return r;
      }
      ran.push_back(r.held);
      ran_words.push_back("without them all");
    }
  }
  const bool invalid_present = std::find(r.held.begin(), r.held.end(), kInvalidIds.key) != r.held.end();
  auto covered = [&](const std::string& k) { return unsupported_covers(unsupported, k, invalid_present); };
  // A twin run without named features only: the decline is about what the user named.
  for (size_t i = 0; i < ran.size(); ++i)
    if (std::all_of(ran[i].begin(), ran[i].end(), covered)) {
      r.waived = ran[i];
      r.twin = ran_words[i];
      return r;
    }
  std::set<std::string> blamed, named;
  for (size_t i = 0; i < ran.size(); ++i) {
    for (const auto& k : ran[i]) (covered(k) ? named : blamed).insert(k);
    r.twin += (r.twin.empty() ? "" : "; ") + ran_words[i];
  }
  for (const auto& k : r.held) {  // in the case's order
    if (blamed.count(k)) r.depends_on.push_back(k);
    if (named.count(k)) r.waived.push_back(k);
  }
  return r;
}

OpCase op_case_from_fixture(const Fixture& f) {
  check_input_dims(f);
  try {
    return op_case_unchecked(f);
  } catch (const std::invalid_argument& e) {
    // Bad windows, policy names, ranks: the file is at fault, so the error names it.
    throw FileError(label_of(f), without_function(e.what()));
  } catch (const std::out_of_range& e) {
    throw FileError(label_of(f), without_function(e.what()));
  }
}

CandidateBackend expected_candidate(const Fixture& f) {
  return CandidateBackend(f.expected, label_of(f), f.conventions, "producer");
}

std::vector<OpReport> judge_fixture_ops(const Fixture& f, Backend& candidate,
                                        const CheckOptions& opt) {
  return judge_fixture_ops(f, op_case_from_fixture(f), candidate, opt);
}

std::vector<OpReport> judge_fixture_ops(const Fixture& f, const OpCase& c, Backend& candidate,
                                        const CheckOptions& opt) {
  const auto* stored = dynamic_cast<const CandidateBackend*>(&candidate);
  // Outputs a backend declares it writes (a plugin's provided_outputs) narrow the judged set
  // like --outputs does; the others are listed as not judged.
  CheckOptions eff = opt;
  if (auto declared = candidate.provided_outputs()) {
    if (!eff.provided_outputs) {
      eff.provided_outputs = *declared;
    } else {
      std::set<std::string> both;
      for (const auto& n : *eff.provided_outputs)
        if (declared->count(n)) both.insert(n);
      eff.provided_outputs = both;
    }
  }
  // A rounding model it declares (a plugin's rounding_models) joins the user's: either declares.
  eff.rounding = either(eff.rounding, candidate.rounding_model());
  std::vector<OpReport> out;
  for (Op op : fixture_ops(f)) {
    OpReport r;
    try {
      r = check_op(candidate, op, c, eff);
    } catch (const std::bad_alloc&) {
      std::string inputs;
      for (const auto& [name, t] : f.inputs)
        inputs += (inputs.empty() ? "" : ", ") + name + " " + dtype_name(t.dtype()) + " " + shape_str(t.shape());
      throw ResourceError(label_of(f) + ": out of memory (std::bad_alloc) judging op " + to_string(op) + " of " +
                              candidate.name() + " on " + f.op + " inputs " + inputs +
                              (op == Op::Topk ? ", k = " + std::to_string(c.k) : std::string()) +
                              ": no verdict (not a disagreement); free memory or judge a smaller case",
                          std::move(out));
    } catch (const std::invalid_argument& e) {
      // Usually the reference rejecting the fixture's inputs: the error names the file.
      throw FileError(label_of(f), std::string(to_string(op)) + " inputs: " + without_function(e.what()));
    }
    // A decline of this case (NotSupported although the backend supports the op): INCOMPLETE
    // when it is a proven decline of a SPEC-mandatory case, else a skip saying why not.
    if (!stored && r.verdict == Verdict::Skip && r.declined) settle_decline(r, f, op, c, candidate, eff);
    // Stored outputs: an op of the fixture for which the candidate holds nothing is not a
    // skip (a backend that cannot run it) but missing outputs (SPEC §9 complete outputs).
    if (stored && r.verdict == Verdict::Skip && stored->stored_outputs(op).empty()) {
      std::vector<std::string> names;
      for (const auto& n : op_output_names(op))
        if (n != "dsink" || c.mla.attn_sink) names.push_back(n);
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      bool named = false;
      for (const auto& n : names) named |= eff.provided_outputs && eff.provided_outputs->count(n);
      if (eff.provided_outputs && !named) {
        // The file holds none of the op's outputs and the provided outputs name none: the
        // kernel does not compute this op (e.g. a backward-only kernel beside a fwd+bwd
        // golden), so it is not judged, not "judged in full" (provided_outputs_for).
        const std::string full = judged_in_full_note(op, eff.provided_outputs);
        r.notes.erase(std::remove(r.notes.begin(), r.notes.end(), full), r.notes.end());
        r.not_judged = names;
        r.reason = list + ": not provided; not judged";
      } else {
        r.verdict = Verdict::Pass;
        r.mark(Verdict::Incomplete, list + ": not returned by the candidate (SPEC §9: every output "
                                           "is judged unless the provided outputs are named)");
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

const std::vector<std::string>& fixture_input_names(const std::string& op) {
  static const std::map<std::string, std::vector<std::string>> names = {
      {"indexer_scores+bwd", {"q_idx", "k_idx", "w", "ks", "ke", "d_scores"}},
      {"indexer_scores", {"q_idx", "k_idx", "w", "ks", "ke", "d_scores"}},
      {"topk", {"scores", "ks", "ke"}},
      {"sparse_mla_fwd+bwd", {"q", "kv", "indices", "topk_length", "attn_sink", "dout", "ks", "ke"}},
      {"sparse_mla_fwd", {"q", "kv", "indices", "topk_length", "attn_sink", "dout", "ks", "ke"}},
      {"indexer_kl_loss", {"scores", "q", "kv", "ks", "ke", "indices"}},
      {"fp8_indexer_scores", {"q_idx", "k_idx", "k_scale", "w", "ks", "ke"}},
      {"paged_indexer_scores", {"q_idx", "k_cache", "k_scale_cache", "w", "block_table", "context_lens"}},
      {"sparse_mla_fp8_fwd", {"q", "kv_cache", "indices", "topk_length", "attn_sink"}}};
  static const std::vector<std::string> none;
  const auto it = names.find(op);
  return it == names.end() ? none : it->second;
}

FixtureReport check_fixture(const Fixture& f, Backend* backend, const CheckOptions& opt) {
  return check_fixture(f, op_case_from_fixture(f), backend, opt);
}

FixtureReport check_fixture(const Fixture& f, const OpCase& c, Backend* backend,
                            const CheckOptions& opt) {
  FixtureReport rep;
  rep.case_name = f.case_name;
  rep.op = f.op;
  rep.producer = f.producer;
  rep.path = f.path;
  for (fixtures::Convention c : f.conventions) rep.conventions.push_back(fixtures::to_string(c));
  // The producer's expected.* are one more candidate: same OpCase, same check_op. It provides
  // what the fixture stores (a fixture without dsink does not judge dsink); a stored file
  // returns the same bytes twice, so there is no determinism run.
  CandidateBackend producer = expected_candidate(f);
  CheckOptions popt = opt;
  popt.check_determinism = false;
  popt.provided_outputs.emplace();
  for (const auto& [name, t] : f.expected) popt.provided_outputs->insert(name);
  rep.producer_vs_reference = judge_fixture_ops(f, c, producer, popt);
  // Stored tensors that are no output of the ops: said, never silently dropped (fresh20: a
  // peer's expected.out_bf16 halved read "agree")
  std::set<std::string> outputs;
  std::string listed;
  for (Op op : fixture_ops(f))
    for (const auto& n : op_output_names(op))
      if (outputs.insert(n).second) listed += (listed.empty() ? "" : ", ") + n;
  for (const auto& [name, t] : f.expected)
    if (!outputs.count(name)) rep.not_outputs.push_back(name);
  const std::vector<std::string>& inputs = fixture_input_names(f.op);
  std::string inputs_listed;
  for (const auto& n : inputs) inputs_listed += (inputs_listed.empty() ? "" : ", ") + n;
  for (const auto& [name, t] : f.inputs)
    if (std::find(inputs.begin(), inputs.end(), name) == inputs.end()) rep.not_inputs.push_back(name);
  if (!rep.not_inputs.empty() && !rep.producer_vs_reference.empty()) {
    std::string names;
    for (const auto& n : rep.not_inputs) names += (names.empty() ? "" : ", ") + n;
    rep.producer_vs_reference.front().notes.push_back("tensor(s) " + names + ": not an input of op " + f.op +
                                                      " (its inputs: " + inputs_listed + ") nor expected.*; not read");
  }
  if (!rep.not_outputs.empty() && !rep.producer_vs_reference.empty()) {
    std::string names;
    for (const auto& n : rep.not_outputs) names += (names.empty() ? "expected." : ", expected.") + n;
    rep.producer_vs_reference.front().notes.push_back(names + ": not an output of op " + f.op + " (its outputs: " +
                                                      listed + "); not judged");
  }
  for (auto& r : rep.producer_vs_reference)
    for (const auto& n : producer.adapter_notes()) r.notes.push_back("convention " + n);
  if (backend) rep.backend_vs_reference = judge_fixture_ops(f, c, *backend, opt);
  return rep;
}

Verdict overall_verdict(const std::vector<OpReport>& reports) {
  // Severity as in report.h: Fail > Incomplete > Weak > Pass > Skip.
  auto rank = [](Verdict v) {
    switch (v) {
      case Verdict::Skip: return 0;
      case Verdict::Pass: return 1;
      case Verdict::Weak: return 2;
      case Verdict::Incomplete: return 3;
      case Verdict::Fail: return 4;
    }
    return 4;
  };
  Verdict worst = Verdict::Skip;
  for (const auto& r : reports)
    if (rank(r.verdict) > rank(worst)) worst = r.verdict;
  return worst;
}

std::string format_fixture_report(const FixtureReport& r) {
  std::ostringstream os;
  os << "== " << r.case_name << " (" << r.op << ") " << (r.passed() ? "pass" : "FAIL") << "\n";
  if (!r.path.empty()) os << "   file: " << r.path << "\n";
  os << "   producer: " << r.producer << "\n";
  if (!r.conventions.empty()) {
    os << "   conventions of expected.*:";
    for (const auto& c : r.conventions) os << " " << c;
    os << "\n";
  }
  for (const auto& p : r.producer_vs_reference) os << format_op_report(p);
  for (const auto& b : r.backend_vs_reference) os << format_op_report(b);
  return os.str();
}

}  // namespace dsa::oracle
