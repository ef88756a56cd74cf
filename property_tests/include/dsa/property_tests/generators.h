// Case generators for the property suite. Call only inside a RapidCheck property (they draw
// with `*gen`). Structure (shapes, windows, index layouts, special values) is drawn through
// RapidCheck so it shrinks; bulk values come from a drawn seed. Shapes straddle tile edges
// (1, 63, 64, 65, 2047, 2049, k > s_kv); the exact tier uses small integer grids (bit-exact
// paths, deliberate ties), the random tier uniform values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dsa/contract/op_types.h"
#include "dsa/oracle/dsa_block.h"

namespace dsa::props {

/// The level (0 CI, 1, 2 soak) of the property being run: the long-row and production-shape
/// generators scale with it. Set by run_property for the duration of a property; 0 otherwise.
int generation_level();
void set_generation_level(int level);

/// The number of draws the running property has made so far, judged or declined by the
/// backend (set by run_property before each execution of its body, and to the failing draw's
/// index while shrinking; 0 outside a property). The many-row and wide-k generators make the
/// first draw of every run their largest shape, so it is reached on every seed; a backend that
/// declines it gets the other draws.
int draw_index();
void set_draw_index(int n);

/// Records that the draw being generated exercises `feature` (a key of draw_feature_keys():
/// "invalid_ids", "empty_rows", "duplicate_ids", "neg_inf_scores", "nan_scores" are SPEC
/// behaviour every kernel must handle; "attn_sink", "topk_length", "indices_view",
/// "fp32_inputs" are optional inputs). run_property tallies, per feature, the draws the backend
/// judged and declined (NotSupported), to tell a declined mandatory behaviour from a declined
/// shape. Thread-local; cleared by run_property before each draw.
void note_draw_feature(const std::string& feature);
/// The features noted since the last clear_draw_features() (sorted keys).
const std::vector<std::string>& draw_features();
void clear_draw_features();

/// Value tier (STYLE "Exact where possible").
enum class Tier { Exact, Random };

/// Windows for s_q rows over s_kv keys: full, causal (offset), packed varlen, MTP next_n,
/// ragged ks > 0, and explicit empty rows. `kind` (optional) forces one of "full", "causal",
/// "varlen", "mtp", "ragged", "empty"; the drawn kind is written to *drawn when given.
KeyWindows draw_windows(int64_t s_q, int64_t s_kv, const char* kind = nullptr,
                        std::string* drawn = nullptr);

/// Top-k case (SPEC §3): scores [s_q,s_kv] F32 with ReLU 0.0 plateaus, ±0.0, all -inf rows,
/// NaN, integer ties, and +inf on a run's first draw and one other draw in three (one key inside
/// each row's window but all -inf rows, about one key in eight elsewhere: selectable, SPEC
/// §3.1; fresh17 F1), and subnormals on a run's first draw and one other in three (one finite
/// key in four a subnormal of either sign or ±0; a boundary row decided by distinct positive
/// subnormals against +0/-0 and negative subnormals, k redrawn in [1, n) on a first draw that has
/// no such row; fresh18 F1); k in {0, 1, ..., s_kv, > s_kv, 64, 2048}; policy any/small/large,
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

/// Long top-k rows (issue 9): s_kv >= 32768 at level 0 (32768 or 32769), up to 131072 at
/// levels 1 and 2; k = 2048 (levels >= 1: 512 or 4096 one case in four); 1-2 rows (1-3 at
/// level >= 1). Each row draws
/// its own distribution: a narrow band inside one radix bin at the 8-, 11- or 16-bit prefix
/// of the order-preserving key (half of the rows), thousands of exact ties at the k-th
/// value, an all-tie row, ReLU plateaus of +0.0/-0.0, mixed magnitudes (subnormal to 2^127),
/// NaN/+inf/-inf sprinkled, fewer selectable keys than k; and its own window (full, a prefix,
/// or raw ends that may be negative, inverted or past s_kv, clamped per SPEC §1). The row
/// length and k are shrinkable integers (toward 1): a failure shrinks to a short row when the
/// fault allows it.
TopkCase draw_topk_long_case();
/// Rows whose selected ids need more than 16 bits: s_q 1-2 (1-3 at levels >= 1) rows of 65537
/// or 131072 keys, k 2048 (at levels >= 1 also 512), each row a band, tie, ReLU-plateau or
/// mixed-magnitude distribution with its largest value (3e38) on a key in [65536, s_kv); full
/// windows. A top-k that keeps ids in 16 bits (mod 65536) fails every draw (finding F2).
TopkCase draw_topk_wide_ids_case();

/// Per-row windows (SPEC §1) on rows of 1..300 keys (or tile edges up to 2049): packed varlen
/// with 2-4 segments, MTP next_n 1..4 with start positions > 0, causal with offsets, raw
/// per-row ends (negative, inverted, past s_kv; clamped). Scores outside the windows are
/// large finite garbage (or -inf, as an indexer writes them); +inf on about one key in 32,
/// inside and outside the windows (fresh17 F1).
TopkCase draw_topk_windows_case();

/// Tie overflow (SPEC §3.3): rows of 1..6000 keys (shrinkable) where every selectable entry
/// ties, or thousands tie at the k-th value, or ReLU plateaus; k up to 2048.
TopkCase draw_topk_ties_case();

/// Many query rows (prefill; fresh-user finding 7: a kernel that returns empty rows from row
/// 128 on passed every audit): s_q in [257, 1100] on every draw (shrinkable toward 1, so a
/// row cutoff shrinks to cutoff + 1), the run's first draw in [1025, 1100]; 1 draw in
/// 2 at a tile edge (257, 383, 384, 511, 512, 513, 640, 767, 768, 1023, 1024, 1025). Few keys
/// (s_kv 1-65) with full windows or per-row windows of >= 1 key, or causal prefill (s_kv =
/// s_q, row t sees t + 1 keys; 1 in 4), or packed varlen sequences; k 1..s_kv+2; uniform,
/// integer-tie or ReLU values with NaN/-inf/+inf sprinkled (1/64 each) in rows of >= 8 keys, so every
/// row has a selectable key but for a rare all-NaN/-inf short window. The limit rows (128,
/// 256, 512, 1024 and the last row, those below s_q) always hold a selectable key (one key of
/// the window gets a value of the row's kind): a kernel dropping rows from one of them on, or
/// its last row, changes every draw that has the row.
TopkCase draw_topk_many_rows_case();

/// Wide k (k > 2048; DeepSeek-V3.2 uses 2048, GLM-5 and others more, and kernels special-case
/// k <= 2048): k in [2049, 4096] on every draw (the run's first draw 4096; shrinkable
/// toward 1), s_kv = k + 1, k + 2, k + 7, k + 64 or 2k; 2-3 rows: row 0 sees every key, row
/// 1 a window of exactly k + 1 keys, row 2 (when drawn) a window of k - 8..k keys (fewer
/// selectable than k: -1 padding). Band, tie, ReLU, mixed-magnitude, all-tie or uniform
/// rows, no NaN/-inf: every row holds min(k, window) selectable keys. A top-k that drops the
/// ids past the first 2048 fails every draw.
TopkCase draw_topk_wide_k_case();

/// Indexer case (SPEC §2): q_idx [s_q,H_I,d_I], k_idx [s_kv,d_I] BF16, w [s_q,H_I] F32 (may be
/// negative), d_scores [s_q,s_kv] F32. Exact tier: integers in [-3,3], w and d_scores in
/// [-2,2]. `window_kind` forwards to draw_windows. d_scores outside the windows (SPEC §2:
/// ignored) is finite garbage in one draw in three, NaN or NaN/±inf in the others (also in
/// the many-row and production draws; fresh-user F10).
struct IndexerCase {
  Tensor q_idx, k_idx, w, d_scores;
  KeyWindows windows;
  Tier tier = Tier::Random;
  std::string desc;
};
/// q_idx and k_idx are fp32 on a run's draw 1, fp16 on draw 2, bf16 on the others (outside
/// tester F4). Keys past 2^16 on draw 3 and, when `keys_past_2_17`, past 2^17 on draw 5
/// (outside tester F3): the key
/// rows and windows move by 2^16 - m (2^17 - m), m in [0, the largest window key], so that key
/// and every window key >= m lie past the power of two; the row s & 0xFFFF of each such key s
/// holds -k_idx[s], the other added rows 0; d_scores' added columns (outside every window) NaN
/// or finite garbage as the draw's; such a draw has no s_q tile edge, d_I <= 8, and row 0's
/// window over all keys when every window was empty.
IndexerCase draw_indexer_case(std::optional<Tier> tier = std::nullopt,
                              const char* window_kind = nullptr, bool keys_past_2_17 = true);

/// Many query rows (prefill, as draw_topk_many_rows_case): s_q in [257, 1100] on every draw,
/// the run's first draw in [1025, 1100] (shrinkable toward 1); s_kv 1-65, H_I 1-2,
/// d_I 4, 8 or 16; full windows or per-row windows of >= 1 key; exact or random tier (random
/// logits kept off 0 as draw_indexer_case's). `tier` forces the tier (the backward part of the
/// property draws the exact tier: integer products, no ReLU' flip near 0). The limit rows
/// (128, 256, 512, 1024, the last) each have a window key s with I[t, s] != 0 and
/// d_scores[t, s] != 0 (where none is drawn, head 0's q row is signed as k_idx[s, :], w and
/// d_scores set to 1 where 0; the exact tier's other heads signed against it), so a kernel
/// writing -inf or leaving 0 from one of them on changes the draw.
IndexerCase draw_indexer_many_rows_case(std::optional<Tier> tier = std::nullopt);

/// Production indexer shapes (DeepSeek-V3.2: H_I 64, d_I 128; fresh-user finding F8: a kernel
/// ignoring heads past 32 passed): exact tier, s_q 1-3 (1-4 at levels >= 1) over s_kv 129, 257
/// or 1025 keys (levels >= 1 also 2049, 4097; the run's first draw 1025), so keys past 128 are
/// read; windows full, a prefix (causal, offset s_kv - s_q) or MTP. Integer products: scores
/// and gradients are exact in fp32.
IndexerCase draw_indexer_production_case();

/// The s_q of a many-row draw (prefill; finding 7): in [257, 1100], the run's first draw in
/// [1025, 1100], 1 in 2 a tile edge; shrinkable toward 1. For the §10 generators.
int64_t draw_many_row_count();
/// The rows of a many-row draw a row-limit fault shows in: 128, 256, 512, 1024 and the last
/// row, those below s_q. Each must hold something to judge.
std::vector<int64_t> many_row_limit_rows(int64_t s_q);

/// Keeps every logit q_idx[t, j]·k_idx[s] that `windows` shows away from 0 as draw_indexer_case
/// does for its random tier, for cases built outside RapidCheck (the CUDA tests' own cases):
/// each key row s with a visible dot |q·k| < 2^-12 · Σ_i |q_i k_i| (where ReLU' may flip within
/// a correct kernel's rounding, SPEC §9 WEAK) gets k_idx[s, :] redrawn uniform(-1, 1), at most 32
/// times. Deterministic in `seed`. Shapes: q_idx [s_q, H_I, d_I], k_idx [s_kv, d_I] (any float
/// dtype; the redrawn values are stored in k_idx's dtype). Not for exact-tier integer grids (a
/// 0 there is exact). Throws std::invalid_argument naming 'k_idx' on a shape mismatch.
void keep_indexer_logits_off_zero(const Tensor& q_idx, Tensor& k_idx, const KeyWindows& windows,
                                  uint64_t seed);

/// Sparse MLA case (SPEC §4-§6): q [s_q,h_q,d_qk], kv [s_kv,d_qk] BF16 (or F32), dout F32; indices
/// [s_q,k] I32 with invalid ids (-1, -2^31, s_kv, 2^31-1, ...) in front, behind and in holes,
/// all-invalid rows, duplicates; optional topk_length with valid-looking garbage past it (one
/// row in eight a negative length: -1, -5, INT32_MIN, no valid slot; fresh-user F11);
/// optional attn_sink with ±inf, ±80. `layout`: "" (any), "poison" (kv rows 0 and s_kv-1 are
/// NaN and never validly selected), "empty" (some all-invalid rows), "dups" (few keys,
/// many repeats), "leading_block" (first 64 slots invalid, k >= 65), "topk_length".
struct SmlaCase {
  SparseMlaInputs in;
  Tensor dout;
  std::string desc;
};
///
/// Shapes (issue 9), one regime per case: "small" (s_q 1-6, h_q 1-4, s_kv <= 65, k <= 65,
/// d_qk 24 or 32 with d_v d_qk or d_qk - 8 in every regime but 576/512 one case in ten), "heads" (h_q 5-16; 64 or 128 at level >= 1), "rows" (s_q 8, 9,
/// 16, 17, 64 or 65 over few keys, so key rows are shared across 64-row tiles), "wide" (k
/// 1025, 2048 or 2049 over s_kv 1025-4097 keys). Level 0 stays under ~2^20
/// multiply-adds a case.
/// Full rows (the rows production kernels are handed: k valid, distinct ids): one draw in six
/// of the layouts "mixed", "poison", "empty" and "topk_length" (not "dups", "leading_block" nor
/// the "many_rows" regime), and the run's draw 2 of those layouts (`layout` "" then draws one of
/// them), has k = 64 (levels >= 1: 64 or 128; the "wide" regime 2048) over s_kv k+1, k+17, 2k,
/// 2k+1 or 4k+3 (wide: 2049 or 4097; "poison" at least k+2), the "rows" regime then s_q 8-17;
/// row 0 and half the other rows hold k distinct valid ids in random order (so ids >= 16 and
/// past one 64-key tile), topk_length (when drawn) k; the other rows keep their padding,
/// holes, repeats and empty rows. A kernel wrong only on such rows (a full-tile fast path:
/// mutant smla_full_tile_box_coordinate) fails smla.forward_ratio, invalid_slots_never_read,
/// empty_rows and topk_length_respected at level 0 on every seed.
/// Detectable draws (SPEC §9, no WEAK row at the fp32 class nor, for bf16 q/kv, at the bf16
/// class, docs/what-a-pass-means.md): with bf16 q/kv each (t, h) row whose bf16-class out
/// bound exceeds 0.8 θ of its row scale gets q[t, h, :] redrawn (up to 12 judgements, the
/// row's best draw kept), then each dq row above 0.9 θ its dout row (a dkv or dsink row:
/// every dout row; magnitudes only, signs kept; up to 6 judgements), judged by the oracle's
/// own bound code as a bf16-output kernel is (judge_outputs). A row holds one key in at most 8 slots
/// (coherent rounding of duplicated terms; "dups" draws its few keys from a pool of at least
/// k/8); with a sink, the columns of dout with the largest |out_c dout_c| take the sign of
/// out_c until Δ = out·dout >= min(4 sqrt(Σ_c (out_c dout_c)²), Σ_c |out_c dout_c|) > 0 in
/// every row, so dsink = -Σ p_sink Δ does not cancel below Δ's fp32 or bf16 errors; head dims
/// 24 or 32 with at least 16 value columns (4-12 value columns left bf16 rows near θ). The "wide" regime draws no sink,
/// and each value column of its dout keeps one sign in every row (the p·dout terms of a key's
/// dkv row add up). Big shapes (d_v 512) draw no +80 sink (dsink at fp32's underflow edge).
/// `in_dtype`: the dtype of q and kv, BF16 (the default) or F32 (a kernel's fp32 path,
/// judged at the fp32 class); anything else throws std::invalid_argument.
/// `regime`: "" draws one of the regimes above; "many_rows" (prefill, not drawn by "") forces
/// s_q in [257, 1100] (the run's first draw in [1025, 1100]; shrinkable toward 1), h_q
/// 1-2, d_qk 24 or 32, s_kv 2-65, k 1-17, no +80 sink, so rows past 128, 256, 512 and 1024 are
/// reached on every seed (fresh-user finding 7); rows 128, 256, 512, 1024 and the last row
/// (those below s_q) each hold a valid slot in every layout (a row with none gets one: slot 0
/// under topk_length, with topk_length >= 1, else a drawn slot), so a kernel emptying rows
/// from one of them on changes the draw (fresh-user finding: row 1024 of an s_q = 1025 draw
/// with topk_length 0 let a kernel emptying rows >= 1024 pass 2 seeds in 30).
/// Ids past 16 bits (outside tester F3): a run's draw 3 with `regime` "", bf16 q/kv and
/// `layout` "", "poison", "leading_block" or "dups" holds a valid slot (the first row without
/// a negative length; d_qk 24/32), then has its kv rows moved by 65536 - m, m in [0, the
/// largest selected id]: that id and every selected id >= m lie past 65535; ids follow their
/// rows (invalid ones stay invalid: s_kv, s_kv + 7 past the new end); the rows id & 0xFFFF
/// reads hold NaN, the other added rows 0; values and roundings are unchanged.
SmlaCase draw_smla_case(const std::string& layout = "", DType in_dtype = DType::BF16,
                        const std::string& regime = "");

/// Extreme rows inside an ordinary batch (issue 9): some rows have one valid slot whose logit
/// is +-2^18 (a dedicated key row that no ordinary row selects: well conditioned for fp32,
/// since the row's softmax is exact whatever the offset), some rows are empty, one "hot" key
/// is selected by most rows, two RoPE columns (>= d_v) hold +-100 in q (small in kv) and in
/// kv (small in q) so the logits stay O(1); sinks +-80, +-inf or finite per head, dout signed as in
/// draw_smla_case when a sink is drawn; bf16 draws conditioned as in draw_smla_case (ordinary
/// rows only; the large RoPE columns are kept); sm_scale 0.5, 1.5 or 2 over sqrt(d_qk) (fresh17 F2).
/// `in_dtype`: q and kv dtype, BF16 (default) or F32, as for draw_smla_case.
SmlaCase draw_smla_extreme_case(DType in_dtype = DType::BF16);

/// Production shapes: h_q 64 or 128, d_qk 576/d_v 512 or 512/512 at every level; at level 0
/// s_q 1 and k 16 or 32 over k+1 or 2k+1 keys (CI), at levels >= 1 k 2048 over
/// 2048-4097 keys; ids distinct per row with tail padding or holes; sm_scale the absorbed-MLA
/// 192^-1/2·mscale² (mscale 1 or 0.1·ln 40 + 1; fresh17 F2), not 1/sqrt(d_qk). Out rows conditioned for
/// the bf16 class as draw_smla_case's (q rows above 0.8 θ redrawn); the backward rows too at
/// level 0 (at levels >= 1 not: measured at most 0.56 θ).
SmlaCase draw_smla_production_case();

/// Conditions a sparse MLA case with bf16 q for a bf16 kernel (SPEC §9 WEAK at the bf16 class,
/// θ = 1e-2) as draw_smla_case conditions its bf16 draws, for cases built outside RapidCheck
/// (the CUDA tests' own cases): each (t, h) row whose out bound (the float64 reference rounded
/// to bf16, judged by judge_outputs) exceeds 0.8 θ of its row scale gets q[t, h, :] redrawn
/// uniform(-1, 1), up to 12 judgements, the row's best draw kept. When `dout` is given: with a
/// sink, dout's signs keep Δ = out·dout large (as draw_smla_case); then each dq row above 0.9 θ
/// (bf16 dq, Δ from the bf16 out) gets dout[t, h, :] new magnitudes uniform(0, 1), signs kept
/// (every row for a dkv or dsink row above it), up to 6 judgements. Deterministic in `seed`.
/// Shapes/dtypes: SparseMlaInputs (SPEC §4), dout [s_q, h_q, d_v] any float dtype. Throws
/// std::invalid_argument naming 'q' when q is not BF16, and what the reference throws.
void condition_bf16_case(SparseMlaInputs& in, Tensor* dout, uint64_t seed);

/// KL loss case (SPEC §7): scores F32 (-inf outside windows), q [s_q,h_q>=2,d], kv, dense or
/// sparse (with indices) mode, coeff > 0. One case in four is long (issue 9): causal rows over
/// 256-1024 keys, or MTP next_n 1-4 with start positions > 0. Sparse ids: three slots in four
/// a key in [0, s_kv), the others -1, -5, INT32_MIN, s_kv, s_kv + a key, INT32_MAX (invalid,
/// SPEC §4/§7: not in S_t; finding F14). Every KL generator: on a run's draw 2 and one other
/// draw in two, keys outside the windows hold finite scores uniform(-3, 3) instead of -inf, and
/// sparse rows whose window leaves keys out select one of them in their last slot (k >= 3):
/// legal, not in S_t (SPEC §1/§7; fresh16 F1: a kernel ignoring ks/ke passed). desc names it
/// (" outside=finite"). draw_kl_case also shifts every finite score by ±16, ±64, ±100 or ±200
/// (halved while the draw would be WEAK; none if 16 is) on a run's draw 1 and one other draw in three (shift invariant; fresh16 F4: an exp2-form
/// kernel errs by about u·|I|), named in desc (" scores+=100").
/// q and kv of every KL generator: uniform(-1, 1) in `dtype` when given (BF16, F16 or F32),
/// else in fp32 or bf16, one draw in two (SPEC §7: the §4 attention inputs; fresh-user F17: a
/// teacher formed from bf16 logits passed fp32-only draws). The dtype is the generator's last
/// draw and is named in `desc` (" q/kv=BF16"). Throws std::invalid_argument naming 'dtype'
/// for another dtype. The outputs are judged at their own fp32 class (SPEC §7/§9).
/// sm_scale of every KL generator: factor/sqrt(d), the factor 0.5, 0.75, 1.5, 2 or
/// sqrt(3)·mscale² ≈ 3.25 (the absorbed-MLA 192^-1/2·mscale² against 576^-1/2), never 1
/// (fresh17 F2: a kernel recomputing 1/sqrt(d_qk) passed every KL case); drawn after the
/// generator's other draws and named in `desc` (" sm_scale=1.5/sqrt(d)").
struct KlCase {
  IndexerKlInputs in;
  std::string desc;
};
/// `shift` false: no score shift (a caller that changes the scores first, then calls
/// shift_kl_scores itself, as kl.neg_inf_scores does).
KlCase draw_kl_case(std::optional<DType> dtype = std::nullopt, bool shift = true);
/// Moves every finite score of `c` by ±16, ±64, ±100 or ±200 on `force` or one draw in three,
/// halved while the draw would be WEAK (none if 16 is); appends " scores+=<shift>" to desc.
/// Softmax is shift invariant: the outputs do not move, the student floor does (fresh16 F4).
void shift_kl_scores(KlCase& c, bool force);

/// Large-magnitude finite scores in S_t (fresh18 F2; SPEC §7: only -inf keys leave S_t): on
/// `force` or one call in three, one key of each row's S_t with >= 2 keys (not its largest
/// score) gets -65504, -1e5 or -1e30 (the first such row -1e30). Every KL generator calls
/// it after its other draws with force on a run's first draw (kl.neg_inf_scores again after its
/// -inf keys). Named in `desc` (" sentinels=N").
void put_kl_finite_sentinels(KlCase& c, bool force);
/// Many query rows (prefill KL; fresh-user finding F7: a KL kernel leaving d_scores rows past
/// 128 at 0 passed): s_q as draw_many_row_count over s_kv 2-65 keys, h_q 2-4, d 4-16; full
/// windows or per-row windows of >= 2 keys; dense or sparse (k 2..s_kv+2, ids as draw_kl_case);
/// each limit row selects two keys of its window.
KlCase draw_kl_many_rows_case(std::optional<DType> dtype = std::nullopt);
/// Production KL shapes (fresh-user finding F8: a teacher ignoring heads past 64 and a kernel
/// ignoring keys past 1024 passed): h_q 128 (levels >= 1 also 64; the first draw 128), s_q 1-2
/// over s_kv 1025, 1100 or 2049 keys (levels >= 1: 2049, 4097; the first draw 2049), d 32 or
/// 64; windows full, a prefix or MTP; dense, or sparse with k = min(2048, s_kv) distinct ids
/// per row and one slot in eight any KL id (invalid ones included).
KlCase draw_kl_production_case(std::optional<DType> dtype = std::nullopt);

/// DSA block case (SPEC §8): small indexer + attention inputs, causal windows, policy small;
/// sm_scale 0.125, 0.375 or 0.5 (d_qk 16: not 1/sqrt(d_qk); drawn after the sink); a sink (±inf, ±80, 0.5, -1.5 per head) on half the draws; q rows conditioned so no bf16 out
/// row is WEAK (condition_bf16_out_rows, generators.cpp).
struct BlockCase {
  oracle::BlockInputs in;
  Tensor dout;
};
BlockCase draw_block_case();

/// True when every element is 0 (or the tensor is empty): "not trivially zero" guard.
bool all_zero(const Tensor& t);

}  // namespace dsa::props
