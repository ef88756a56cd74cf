// Case generators for the property suite. Call only inside a RapidCheck property (they draw
// with `*gen`). Structure (shapes, windows, index layouts, special values) is drawn through
// RapidCheck so it shrinks; bulk values come from a drawn seed. Shapes straddle tile edges
// (1, 63, 64, 65, 2047, 2049, k > s_kv); the exact tier uses small integer grids (bit-exact
// paths, deliberate ties), the random tier uniform values.
#pragma once

#include <optional>
#include <string>

#include "dsa/contract/op_types.h"
#include "dsa/oracle/dsa_block.h"

namespace dsa::props {

/// Value tier (STYLE "Exact where possible").
enum class Tier { Exact, Random };

/// Windows for s_q rows over s_kv keys: full, causal (offset), packed varlen, MTP next_n,
/// ragged ks > 0, and explicit empty rows. `kind` (optional) forces one of "full", "causal",
/// "varlen", "mtp", "ragged", "empty"; the drawn kind is written to *drawn when given.
KeyWindows draw_windows(int64_t s_q, int64_t s_kv, const char* kind = nullptr,
                        std::string* drawn = nullptr);

/// Top-k case (SPEC §3): scores [s_q,s_kv] F32 with ReLU 0.0 plateaus, ±0.0, all -inf rows,
/// NaN, integer ties; k in {0, 1, ..., s_kv, > s_kv, 64, 2048}; policy any/small/large,
/// sorted or not; windows or none.
struct TopkCase {
  Tensor scores;
  int64_t k = 0;
  TopkPolicy policy;
  std::optional<KeyWindows> windows;
  std::string desc;
};
/// `flavor`: "" (any), "plateau" (integer grid, ties at v*, small/large sorted), "neg_inf"
/// (mostly -inf rows), "nan" (NaN sprinkled).
TopkCase draw_topk_case(const std::string& flavor = "");

/// Indexer case (SPEC §2): q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I] BF16, w [s_q,H_I] F32 (may be
/// negative), d_scores [s_q,s_kv] F32. Exact tier: integers in [-3,3], w and d_scores in
/// [-2,2]. `window_kind` forwards to draw_windows.
struct IndexerCase {
  Tensor q_idx, k_idx, w, d_scores;
  KeyWindows windows;
  Tier tier = Tier::Random;
  std::string desc;
};
IndexerCase draw_indexer_case(std::optional<Tier> tier = std::nullopt,
                              const char* window_kind = nullptr);

/// Sparse MLA case (SPEC §4-§6): q [s_q,h_q,d_qk], kv [s_kv,d_qk] BF16, dout F32; indices
/// [s_q,k] I32 with invalid ids (-1, -2^31, s_kv, 2^31-1, ...) in front, behind and in holes,
/// all-invalid rows, duplicates; optional topk_length with valid-looking garbage past it;
/// optional attn_sink with ±inf, ±80. `layout`: "" (any), "poison" (kv rows 0 and s_kv-1 are
/// NaN and never validly selected), "empty" (some all-invalid rows), "dups" (few keys,
/// many repeats), "leading_block" (first 64 slots invalid, k >= 65), "topk_length".
struct SmlaCase {
  SparseMlaInputs in;
  Tensor dout;
  std::string desc;
};
SmlaCase draw_smla_case(const std::string& layout = "");

/// KL loss case (SPEC §7): scores F32 (-inf outside windows), q [s_q,h_q>=2,d], kv, dense or
/// sparse (with indices) mode, coeff > 0.
struct KlCase {
  IndexerKlInputs in;
  std::string desc;
};
KlCase draw_kl_case();

/// DSA block case (SPEC §8): small indexer + attention inputs, causal windows, policy small.
struct BlockCase {
  oracle::BlockInputs in;
  Tensor dout;
};
BlockCase draw_block_case();

/// True when every element is 0 (or the tensor is empty): "not trivially zero" guard.
bool all_zero(const Tensor& t);

}  // namespace dsa::props
