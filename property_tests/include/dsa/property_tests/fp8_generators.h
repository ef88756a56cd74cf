// Case generators for the SPEC §10 inference ops (call inside a RapidCheck property).
// FP8 values: per-row scales as powers of two or arbitrary, bytes at ±448 (±max), subnormals,
// exact zeros, NaN bytes and garbage scales in slots no window reads. Paged cases: block
// sizes 1, 16, 64; shuffled tables; contexts not a multiple of the block size; zero-length
// contexts; next_n 1 to 4; -1 and garbage ids in table entries past a context.
#pragma once

#include <string>

#include "dsa/contract/fp8_op_types.h"
#include "dsa/contract/op_types.h"

namespace dsa::props {

/// FP8 indexer case. `flavor`: "" (any), "exact" (power-of-two scales, small integer
/// values: every path is exact in fp32), "bad_scale" (one key some window reads gets a
/// scale <= 0, NaN or inf; `bad_key` names it).
struct Fp8IndexerCase {
  Fp8IndexerInputs in;
  int64_t bad_key = -1;
  std::string desc;
};
Fp8IndexerCase draw_fp8_indexer_case(const std::string& flavor = "");

/// Paged FP8 indexer case. `flavor`: "" (any), "mtp" (next_n >= 2), "bad_table" (a read table
/// entry out of range, or a context longer than the table holds).
struct PagedIndexerCase {
  PagedIndexerInputs in;
  std::string desc;
};
PagedIndexerCase draw_paged_indexer_case(const std::string& flavor = "");

/// Sparse MLA over the FP8 cache: q BF16 [s_q,h_q,576], cache [num_blocks,block_size,656]
/// with block sizes 1/16/64; ids with -1, out-of-range ids, duplicates, all-invalid rows,
/// rows with fewer valid ids than k; optional topk_length and attn_sink; tiles at ±448·scale
/// and subnormal bytes; tokens no valid slot reads hold 0xFF (NaN) bytes.
struct SmlaFp8Case {
  SparseMlaFp8Inputs in;
  std::string desc;
};
SmlaFp8Case draw_smla_fp8_case();

/// A correct FlashMLA-style FP8 sparse decode kernel (a control, mutants/fp8_mutants.cpp):
/// e4m3 → bf16, times the tile scale rounded to bf16 in bf16 arithmetic when `scale_in_bf16`
/// (else the fp32 scale, product rounded once to bf16), bf16 products summed in fp32, P
/// rounded to bf16 before P·V, fp32 accumulation. Returns out BF16 [s_q,h_q,512], lse and
/// max_logits F32 [s_q,h_q] (natural log; SPEC §6 values on empty rows). Reads only tokens
/// valid slots address; inputs as SparseMlaFp8Inputs (SPEC §10), q BF16; no argument checks.
SparseMlaForward flashmla_fp8_forward(const SparseMlaFp8Inputs& in, bool scale_in_bf16);

}  // namespace dsa::props
