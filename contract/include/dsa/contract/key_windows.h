// Per-row key windows [ks[t], ke[t]) (SPEC §1): causality, prefixes, packed batches, MTP.
#pragma once

#include <cstdint>
#include <vector>

namespace dsa {

/// Half-open key windows of `s_q()` query rows over `s_kv` keys. Invariant (established by
/// every builder): 0 <= ks[t], ke[t] <= s_kv; ks >= ke is an empty window (legal, SPEC §6).
struct KeyWindows {
  std::vector<int64_t> ks;
  std::vector<int64_t> ke;
  int64_t s_kv = 0;

  int64_t s_q() const { return static_cast<int64_t>(ks.size()); }
  /// True iff key s is visible to row t.
  bool contains(int64_t t, int64_t s) const { return s >= ks[t] && s < ke[t]; }
  /// Number of visible keys of row t (0 for an empty window).
  int64_t length(int64_t t) const { return ke[t] > ks[t] ? ke[t] - ks[t] : 0; }

  /// Every row sees every key.
  static KeyWindows full(int64_t s_q, int64_t s_kv);
  /// Causal, one sequence: ks = 0, ke = offset + t + 1, clamped to [0, s_kv].
  /// `offset < 0` means the default `s_kv - s_q` (prefix / chunked prefill). SPEC §1.
  static KeyWindows causal(int64_t s_q, int64_t s_kv, int64_t offset = -1);
  /// Packed varlen: cu_seqlens_q/k are prefix sums of equal length B+1 starting at 0, with
  /// len_k[b] >= len_q[b]. Row i of segment b: ks = cu_k[b], ke = cu_k[b]+len_k-len_q+i+1.
  static KeyWindows varlen(const std::vector<int64_t>& cu_seqlens_q,
                           const std::vector<int64_t>& cu_seqlens_k);
  /// MTP / speculative decode: request b has context context_lens[b] >= next_n keys packed
  /// one after another; its next_n queries sit at L-next_n+i: ke = ks + L - next_n + i + 1.
  static KeyWindows mtp(const std::vector<int64_t>& context_lens, int64_t next_n);
  /// Explicit ks/ke (equal length), clamped to [0, s_kv]. Throws std::invalid_argument on
  /// size mismatch or s_kv < 0.
  static KeyWindows explicit_windows(std::vector<int64_t> ks, std::vector<int64_t> ke,
                                     int64_t s_kv);
};

}  // namespace dsa
