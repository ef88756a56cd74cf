// Op checkers of the SPEC §10 inference ops (FP8 indexer, paged FP8 indexer, sparse MLA over
// the FP8 KV cache): run, judge by the §9 local rule (per-row E_row and floors, WEAK rows a
// verdict) against the float64 reference on the exact bytes the backend was given, and prove that entries past a context / unread tokens
// are never read by re-running with them poisoned (out-of-range ids, NaN blocks).
#pragma once

#include "dsa/oracle/op_check.h"

namespace dsa::oracle {

/// FP8 indexer (c.fp8_indexer). Judged by the table row "fp8_indexer_scores", or
/// "fp8_indexer_scores:fp8_tensor_core" when b.fp8_reduced_accumulation(): a looser bound
/// with its own measured θ; a note says so and names the δ it detects; WEAK rows fail unless
/// opt.allow_weak, as for every row. §10, §9.
OpReport check_fp8_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt = {});
/// Paged FP8 indexer (c.paged_indexer), run three times: as given, with every table entry
/// past a context replaced by an out-of-range block id, and with those entries pointing at
/// extra blocks full of NaN bytes and NaN scales (unread slots of read blocks NaN too). Each
/// run is judged against the reference ("scores", "scores[poisoned ids]", "scores[NaN
/// blocks]"); a crash, an exception or a non-finite output on a poisoned run fails. §10.
OpReport check_paged_indexer_scores(Backend& b, const OpCase& c, const CheckOptions& opt = {});
/// Sparse MLA over the FP8 cache (c.mla_fp8), run as given and with every token no valid
/// slot reads overwritten by 0xFF bytes (NaN values, NaN scales, NaN RoPE) and slots past
/// topk_length pointed at such tokens; out, lse, max_logits judged for both. The baseline
/// dequantizes kv (fp8 · scale) to the candidate's working dtype (its out dtype: bf16 for a
/// FlashMLA-style kernel, else fp32), SPEC §9; with a 16-bit working dtype and tile scales
/// not exact in it, also with the scales rounded to it (fp8_scale_rounded_problem), and E_row
/// per (t, h) is the larger of the two baselines' errors. A 16-bit out's baseline term is
/// min(E_row, inherited16_e + κ_row·s_e): the exact shift of the float64 reference under
/// either 16-bit dequantization, plus the baseline's arithmetic error on that kv measured in
/// each element's own scale (OutputFloor::inherited16; one huge tile no longer loosens the
/// other columns). opt.rounding (RoundingModel:
/// --normalized-p, --sink-after-rounding) adds its rounding to a 16-bit out's bound as for
/// check_sparse_mla_forward (judge_tensor; the same floors). §10, §4-§6, §9.
OpReport check_sparse_mla_fp8_forward(Backend& b, const OpCase& c, const CheckOptions& opt = {});

/// The poisoned variants used above (exposed for tests and mutants).
/// Table entries past each context → out-of-range ids (num_blocks, -1, INT32_MAX, ...).
PagedIndexerInputs poison_paged_table_ids(const PagedIndexerInputs& in);
/// Two extra NaN blocks appended to the cache; entries past a context point at them; every
/// (block, slot) no request reads gets NaN bytes (0x7F) and a NaN scale.
PagedIndexerInputs poison_paged_nan_blocks(const PagedIndexerInputs& in);
/// Every token no valid slot reads → 0xFF bytes; slots past topk_length → such a token.
SparseMlaFp8Inputs poison_unread_tokens(const SparseMlaFp8Inputs& in);

/// The §4 problem a FlashMLA-style kernel solves on the FP8 cache: the tokens valid slots
/// read (as reference::gather_sparse_mla_fp8), kv = fl16(fp8 · fl16(scale)) in `work` (tile
/// scale rounded to `work`, then the exact product rounded once; RoPE as given), ids
/// remapped. `changed` (optional) is set false when every read scale is exact in `work`
/// (powers of two), in which case kv equals the baseline's fl16(fp8 · scale). `work`: BF16 or
/// F16 (std::invalid_argument naming 'work' otherwise); other errors as
/// reference::gather_sparse_mla_fp8. Used as the second baseline of
/// check_sparse_mla_fp8_forward (SPEC §9: the baseline at the candidate's precision, §10).
SparseMlaInputs fp8_scale_rounded_problem(const SparseMlaFp8Inputs& in, DType work, bool* changed = nullptr);

/// Term magnitude of the FP8 indexer scores: H_I·d_I·max|w|·max|q|·max over read keys of
/// |k|·k_scale (decoded values). SPEC §10.
double fp8_indexer_term_scale(const Fp8IndexerInputs& in);

}  // namespace dsa::oracle
