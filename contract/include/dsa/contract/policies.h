// Policy enums of the contract: top-k tie policy (SPEC §3), recompute policy (SPEC §8),
// KL loss mode (SPEC §7), and the precision a reference op computes at (SPEC §9).
#pragma once

#include <string>

namespace dsa {

/// Which entries equal to the k_eff-th value v* fill the remaining slots (SPEC §3.3).
enum class TieBreak { Any, Small, Large };

/// Top-k policy. `sorted`: prefix ordered by score descending, ties by the tie policy.
struct TopkPolicy {
  TieBreak tie_break = TieBreak::Small;
  bool sorted = true;
};

/// What a DSA block saves for backward (SPEC §8).
enum class RecomputePolicy { None, Full, SaveDsaIndexer };

/// Key set of the indexer KL loss (SPEC §7): every window key, or the selected valid ids.
enum class KlMode { Dense, Sparse };

/// "any" | "small" | "large"; parse throws std::invalid_argument naming the text.
const char* to_string(TieBreak v);
TieBreak parse_tie_break(const std::string& text);
/// "none" | "full" | "save_dsa_indexer".
const char* to_string(RecomputePolicy v);
RecomputePolicy parse_recompute_policy(const std::string& text);
/// "dense" | "sparse".
const char* to_string(KlMode v);
KlMode parse_kl_mode(const std::string& text);

}  // namespace dsa
