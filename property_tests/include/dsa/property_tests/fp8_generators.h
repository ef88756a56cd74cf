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
/// scale <= 0, NaN or inf; `bad_key` names it), "many_rows" (s_q as draw_many_row_count over
/// 1-65 keys, H_I 1-2, full or per-row windows; each limit row scores a key > 0),
/// "production" (H_I 64, d_I 128, s_q 1-2 (1-4 at levels >= 1) over 129, 257 or 1025 keys (up
/// to 4097 above; the first draw 1025); windows full, a prefix or MTP). With `wide_keys` a
/// run's draw 3 of the "" and "exact" flavors (d_I 16; row 0's window over all keys when
/// every window was empty) has its key rows and windows moved by 65536 - m, m in [0, the largest
/// window key], so that key and every window key >= m lie past 65535; the row s & 0xFFFF of
/// each such key s holds s's bytes with their sign bits flipped and s's scale (a kernel
/// addressing keys in 16 bits scores ReLU(-x) for ReLU(x)), the other added rows NaN bytes
/// and scale 0 (outside tester F3). Throws std::invalid_argument naming an unknown flavor.
struct Fp8IndexerCase {
  Fp8IndexerInputs in;
  int64_t bad_key = -1;
  std::string desc;
};
Fp8IndexerCase draw_fp8_indexer_case(const std::string& flavor = "", bool wide_keys = false);

/// Paged FP8 indexer case. `flavor`: "" (any), "mtp" (next_n >= 2), "bad_table" (a read table
/// entry out of range, or a context longer than the table holds), "many_rows" (batch · next_n
/// >= 257 rows, contexts next_n .. next_n + 40, H_I 1-2; each limit row scores key 0 of its
/// request > 0), "production" (H_I 64, d_I 128, block_size 64, batch 1-2, next_n 1-2, contexts
/// 193-1100 keys (up to 4097 above; the first draw's first request 1025)), "exact" (the
/// regular draw's shapes and tables with the FP8 indexer's exact grid: e4m3fn, power-of-two
/// scales, small integer values and weights, so every product and sum is exact in fp32).
/// With `wide_keys` (outside tester F3), block size 1 and d_I <= 32 on two draws of a run:
/// draw 3 of the "" and "exact" flavors moves the cache's blocks by 65536 - m, m in [0, the largest
/// read block id], table entries following them (-1 and ids past the end stay invalid), so
/// that block and every read block >= m lie past 65535; block e & 0xFFFF of each such block e
/// holds e's keys with their sign bits flipped and e's scales, the other added blocks NaN
/// bytes and scale 0. Draw 5 of "exact" gives one request a context of 65537-65584 keys (batch, next_n, H_I <= 2, d_I 16): key p
/// >= 65536 holds key p - 65536's bytes with their sign bits flipped and its scale, so a kernel
/// keeping positions (or, block size 1, logical block indices) in 16 bits scores ReLU(-x) for
/// ReLU(x). Throws std::invalid_argument naming an unknown flavor.
struct PagedIndexerCase {
  PagedIndexerInputs in;
  std::string desc;
};
PagedIndexerCase draw_paged_indexer_case(const std::string& flavor = "", bool wide_keys = false);

/// Sparse MLA over the FP8 cache: q BF16 [s_q,h_q,576], cache [num_blocks,block_size,656]
/// with block sizes 1/16/64; ids with -1, out-of-range ids, duplicates, all-invalid rows,
/// rows with fewer valid ids than k; optional topk_length and attn_sink; tiles at ±448·scale
/// and subnormal bytes; tokens no valid slot reads hold 0xFF (NaN) bytes.
struct SmlaFp8Case {
  SparseMlaFp8Inputs in;
  std::string desc;
};
/// `flavor`: "" (any), "many_rows" (s_q as draw_many_row_count, h_q 1-2, k 1-17; each limit
/// row holds a valid slot), "production" (s_q 1; "heads" draws h_q 128 with k 16 or 32, 64
/// above level 0; "slots" draws h_q 1-2 with k 129 or 256 (512 or 2048 above level 0);
/// the first draw heads, the second slots; over k + 1 .. 2k + 1 tokens in 64-token blocks;
/// most slots valid), "wide_ids" (the regular draws; a run's draw 3 holds a valid slot and
/// then has its cache tokens moved past 65535, every added token 0xFF bytes (NaN): a kernel
/// keeping token ids in 16 bits reads NaN; outside tester F3). topk_length (half the draws) is
/// negative in one row in eight (SPEC §4: no valid slot). Throws std::invalid_argument naming
/// an unknown flavor.
SmlaFp8Case draw_smla_fp8_case(const std::string& flavor = "");

/// A correct FlashMLA-style FP8 sparse decode kernel (a control, mutants/fp8_mutants.cpp):
/// e4m3 → bf16, times the tile scale rounded to bf16 in bf16 arithmetic when `scale_in_bf16`
/// (else the fp32 scale, product rounded once to bf16), bf16 products summed in fp32, P
/// rounded to bf16 before P·V, fp32 accumulation. Returns out BF16 [s_q,h_q,512], lse and
/// max_logits F32 [s_q,h_q] (natural log; SPEC §6 values on empty rows). Reads only tokens
/// valid slots address; inputs as SparseMlaFp8Inputs (SPEC §10), q BF16; no argument checks.
SparseMlaForward flashmla_fp8_forward(const SparseMlaFp8Inputs& in, bool scale_in_bf16);

}  // namespace dsa::props
