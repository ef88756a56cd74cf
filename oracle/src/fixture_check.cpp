#include "dsa/oracle/fixture_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <new>
#include <set>
#include <sstream>

#include "dsa/contract/errors.h"
#include "dsa/fixtures/fp8_fixture.h"


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
  } else if (op == Op::SparseMlaFwd || op == Op::SparseMlaBwd) {
    const SlotFeatures f = sparse_mla_slot_features(c.mla);
    if (f.invalid) out.push_back(kInvalidIds);
    if (f.empty) out.push_back(kEmptyRows);
    if (f.duplicates) out.push_back(kDuplicateIds);
  }
  // The §10 ops' mandatory feature (unread parts holding anything) and the other ops have no
  // twin here: their declines stay skips (docs/what-a-pass-means.md, Verdicts).
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

// The case's twin without its SPEC-mandatory features: same op, shapes, dtypes, optional
// inputs, k, policy and windows. Top-k: distinct finite scores (s_kv - s in column s: no tie,
// no NaN, no -inf). Sparse MLA: ids 0..k-1 in slot order and topk_length = k (every slot
// valid, distinct; non-finite q, kv and dout values zeroed, as rows never read may hold them).
// nullopt when none can be built (sparse MLA with k > s_kv: some slot must then repeat an id or
// be invalid).
std::optional<OpCase> twin_without_mandatory(Op op, const OpCase& c) {
  OpCase twin = c;
  twin.memo = nullptr;  // never judged: the backend runs it, nothing else
  twin.fwd_out.reset();
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
  OpCase twin = c;
  twin.memo = nullptr;  // never judged: the backend runs it, nothing else
  twin.fwd_out.reset();
  const int64_t s_q = c.scores.size(0), s_kv = c.scores.size(1);
  if (ninf || nan) {
    double lowest = 0.0;
    for (int64_t i = 0; i < c.scores.numel(); ++i)
      if (std::isfinite(c.scores.get(i))) lowest = std::min(lowest, c.scores.get(i));
    double next = std::floor(lowest) - 1.0;
    for (int64_t i = 0; i < c.scores.numel(); ++i) {
      const double x = c.scores.get(i);
      if ((ninf && x == -INFINITY) || (nan && std::isnan(x))) twin.scores.set(i, next--);
    }
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

// The case with the last slot of row 0 set to -1 (an invalid id, SPEC §4), everything else
// as given: a sparse MLA case of k >= 1 slots; nullopt for other ops or k = 0.
std::optional<OpCase> twin_with_an_invalid_id(Op op, const OpCase& c) {
  if (op != Op::SparseMlaFwd && op != Op::SparseMlaBwd) return std::nullopt;
  const int64_t k = c.mla.indices.size(-1);
  if (k < 1 || c.mla.indices.numel() < k) return std::nullopt;
  OpCase twin = c;
  twin.memo = nullptr;  // never judged: the backend runs it, nothing else
  twin.fwd_out.reset();
  twin.mla.indices.set(k - 1, -1.0);  // the case's tensors are values: c keeps its ids
  return twin;
}

// True when `b` runs op on `twin` without throwing (a result, whatever its values: the twin is
// not judged). A decline (NotSupported), an argument error or any other error is false.
bool runs_twin(Backend& b, Op op, const OpCase& twin) {
  try {
    switch (op) {
      case Op::Topk: (void)b.select_topk(twin.scores, twin.k, twin.policy, twin.topk_windows); return true;
      case Op::SparseMlaFwd: (void)b.sparse_mla_forward(twin.mla); return true;
      case Op::SparseMlaBwd: (void)b.sparse_mla_backward(twin.mla, twin.dout); return true;
      default: return false;
    }
  } catch (const std::bad_alloc&) {
    throw;  // out of memory is no verdict (ResourceError, judge_fixture_ops)
  } catch (const std::exception&) {
    return false;
  }
}

// A Skip of op on `candidate` that came from a decline (OpReport::declined): INCOMPLETE when
// the case holds SPEC-mandatory features not named in opt.unsupported and the backend runs the
// case's twin without them (the decline is proven to be about them, as the property suite's
// note_declined_for); else a skip whose reason says "declined" and why it is not INCOMPLETE (a
// declared limit, no mandatory feature, the twin declined too: a shape, dtype or optional-input
// limit of the kernel).
void settle_decline(OpReport& r, const Fixture& f, Op op, const OpCase& c, Backend& candidate,
                    const CheckOptions& opt) {
  const std::string why = r.reason;
  auto skip = [&](const std::string& note) { r.reason = "declined: " + why + " (" + note + ")"; };
  if (declared_limitation(why)) return skip("a limit the backend declares up front; not judged");
  const std::vector<CaseFeature> features = mandatory_features(op, c);
  if (features.empty()) {
    // The backend runs a twin that differs from the case only in its values: INCOMPLETE.
    auto value_dependent = [&](const std::string& twin) {
      r.verdict = Verdict::Incomplete;
      r.notes.push_back("declined: " + why);
      r.reason = "INCOMPLETE: backend declined " + label_of(f) + " but ran the same case with " + twin +
                 ": the decline depends on the values, not on a limit of the kernel: " + why;
    };
    // Top-k: the twin's distinct finite scores change nothing but the values (fresh12 F8).
    if (op == Op::Topk) {
      if (const std::optional<OpCase> twin = twin_without_mandatory(op, c); twin && runs_twin(candidate, op, *twin))
        return value_dependent("other finite scores (same shapes, k, windows and policy)");
    }
    if (decline_depends_on_values(candidate, op, c))
      return value_dependent("one id of row 0 set to -1 (same shapes, dtypes and optional inputs)");
    return skip("the case holds no SPEC-mandatory feature: a limit of the kernel (a shape, dtype or optional "
                "input); not judged");
  }
  std::string all_words;
  for (const auto& x : features) all_words += std::string(all_words.empty() ? "" : "; ") + x.description;
  const std::optional<OpCase> twin = twin_without_mandatory(op, c);
  if (!twin)
    return skip("the case holds " + all_words + ", but no twin without them has its shape (k > s_kv): not shown "
                "to be about them; not judged");
  if (!runs_twin(candidate, op, *twin))
    return skip("the case holds " + all_words + ", but the backend declined its twin without them too: a limit "
                "of the kernel, not about them; not judged");
  // Top-k: the features the decline is laid to, one twin each (only that feature taken out); if
  // none alone, the decline needs several of them together and all are named below.
  std::vector<CaseFeature> laid_to;
  if (op == Op::Topk && features.size() > 1)
    for (const auto& x : features)
      if (const std::optional<OpCase> one = topk_twin_without(c, x.key); one && runs_twin(candidate, op, *one))
        laid_to.push_back(x);
  const std::vector<CaseFeature>& judged_features = laid_to.empty() ? features : laid_to;
  std::string keys, words, waived;
  const bool invalid_present =
      std::any_of(features.begin(), features.end(), [](const CaseFeature& x) { return std::string(x.key) == kInvalidIds.key; });
  for (const auto& x : judged_features) {
    const bool named = unsupported_covers(opt.unsupported, x.key, invalid_present);
    if (named) {
      waived += std::string(waived.empty() ? "" : ", ") + x.key;
      continue;
    }
    keys += std::string(keys.empty() ? "" : ",") + x.key;
    words += std::string(words.empty() ? "" : "; ") + x.description;
  }
  if (keys.empty()) return skip("not judged, named unsupported: " + waived);
  r.verdict = Verdict::Incomplete;
  r.notes.push_back("declined: " + why);
  r.reason = "INCOMPLETE: backend declined a SPEC-mandatory case: " + label_of(f) + " holds " + words +
             "; the backend ran the same case with them taken out (its twin) but declined this one: " + why +
             ". A kernel that leaves them out is audited with --unsupported " + keys +
             " (Python: unsupported=[...]); the verdict then names what was not judged.";
}

}  // namespace

bool decline_depends_on_values(Backend& b, Op op, const OpCase& c) {
  // A limit of the kernel is a shape, dtype or optional input: the same case with one id of
  // row 0 made invalid (-1, SPEC §4: contributes nothing) has all of them. A backend that runs
  // that twin declined this case by its values (fresh11 F10: a plugin declining every case
  // whose ids are all valid and distinct passed the audit with those goldens as skips).
  if (!mandatory_features(op, c).empty()) return false;
  const std::optional<OpCase> twin = twin_with_an_invalid_id(op, c);
  return twin && runs_twin(b, op, *twin);
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
