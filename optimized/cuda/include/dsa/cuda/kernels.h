// Hand-written CUDA kernels for the H200 (sm_90) on device pointers: indexer scores and their
// backward (SPEC §2), top-k selection (SPEC §3), the sparse MLA forward (SPEC §4, §6) and backward (§5). Plain CUDA runtime, no LibTorch.
// Every launcher is asynchronous on `stream`, checks its launch and throws
// std::runtime_error("<function>: <CUDA error>") on a CUDA failure, std::invalid_argument
// naming the argument on bad sizes. Pointers are device pointers unless said otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "dsa/contract/policies.h"

namespace dsa::cuda {

/// Scratch bytes select_topk_device needs for (s_q, s_kv, k): 0 when the sort buffer of a
/// row (next_pow2(min(k, s_kv)) 8-byte keys) fits in shared memory, else one such buffer per row.
size_t topk_scratch_bytes(int64_t s_q, int64_t s_kv, int64_t k);

/// Which top-k kernel runs (same results, SPEC §3). Radix: four 8-bit radix passes over the
/// row plus an ordered collection (five reads). TwoRead: an 11-bit histogram, then one read
/// that collects the ids above the boundary bin and sorts the bin's candidates in shared
/// memory (two reads); rows whose boundary bin holds over 4096 keys fall back to Radix.
/// Cluster: one read; a cluster of up to 8 CTAs per row keeps the row in shared memory and
/// runs an 11/11/10-bit radix select with cluster-combined histograms, then places ids by
/// prefix sums (sm_90; shapes it does not take, s_kv over 245760 or sorted k over
/// 16384, run Radix); sorted with k <= 2048 selects unsorted, then a second kernel sorts each
/// row's ids (one CTA a row, keys re-read from the scores). ClusterFusedSort: Cluster with the
/// sort inside the cluster kernel (CTA 0 of each row's cluster sorts; the round-2 path).
/// Persistent: the cluster selection with a grid of as many clusters as fit at once, each
/// running several rows, keys in registers, the next row's slice copied while the current one
/// is selected; sorted sorts afterwards like Cluster (shapes it does not take, s_kv over
/// 131072 or sorted k over 2048, run Cluster). PersistentWide: Persistent with half-length
/// slices over up to 16 CTAs a row (a non-portable cluster size) and 2 CTAs an SM.
/// Cluster is the default and the fastest on the H200; the others are kept for comparison
/// (bench/results/2026-11-30-gpu-topk-cluster.md).
enum class TopkKernel { Radix, TwoRead, Cluster, ClusterFusedSort, Persistent, PersistentWide };

/// Top-k per row (SPEC §3). scores [s_q,s_kv] fp32 row-major; ks/ke [s_q] int64 key windows
/// (both null = every key; clamped to [0,s_kv], ks >= ke empty); k >= 0 (k > s_kv legal);
/// out [s_q,k] int32: the k_eff = min(k, #selectable) ids as a compact prefix, then -1.
/// NaN and -inf are never selected; -0.0 == +0.0; ties at v* by policy.tie_break (Any acts
/// as Small); policy.sorted orders the prefix by (score desc, id asc|desc). Deterministic.
/// `scratch` holds topk_scratch_bytes(s_q, s_kv, k) bytes (may be null when that is 0).
/// Throws std::invalid_argument for negative sizes, k or s_kv > INT32_MAX, a missing scratch.
void select_topk_device(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                        const int64_t* ks, const int64_t* ke, const TopkPolicy& policy,
                        int32_t* out, void* scratch, cudaStream_t stream,
                        TopkKernel kernel = TopkKernel::Cluster);

/// Largest d_qk / d_v the sparse MLA forward kernel takes (shared-memory tile and
/// per-thread accumulator limits); larger shapes throw std::invalid_argument.
int64_t sparse_mla_max_d_qk();
int64_t sparse_mla_max_d_v();

/// Which sparse MLA forward kernel runs. CudaCore: fp32 FMA on the CUDA cores, one online
/// softmax pass. TensorCore: bf16 wmma (mma.sync) with fp32 accumulation in two passes (exact
/// row statistics first, then O += P V with p = exp(S - lse) split into bf16 hi + lo parts).
/// OnePass: one pass, 64 heads per block as the M dimension, kv rows gathered by cp.async
/// into a two-stage shared-memory pipeline, mma.sync m16n8k16 with fp32 accumulation, online
/// softmax in fp32 registers, P rounded to bf16 for P V (as FlashMLA); shapes it does not
/// take (d_qk not a multiple of 8 or over 576, d_v over 512, q or kv not 16-byte aligned)
/// run TensorCore. OnePassWgmma: the same algorithm on Hopper's wgmma (sm_90a; two
/// warpgroups, S = Q K^T as m64n32k16 per half of the slots, O += P V as m64n256k16 per half
/// of d_v, operands in 128-byte-swizzled shared memory); shapes it does not take (d_qk outside
/// (448, 576], d_v over 512, a device other than compute capability 9.0) run OnePass.
/// OnePassWgmmaSplitD: as OnePassWgmma, but S split over d_qk between the warpgroups
/// (m64n64k16 over half of the columns for all 64 slots, the partial sums exchanged through
/// shared memory), fewer shared-memory bytes per FLOP; the O rescale is skipped for warps
/// whose rows kept their max. OnePassWgmmaOwnHalfFirst: as OnePassWgmma with that rescale
/// skip, and each warpgroup starts P V on its own half of P before the block barrier that
/// publishes the other warpgroup's half.
enum class SparseMlaKernel {
  CudaCore,
  TensorCore,
  OnePass,
  OnePassWgmma,
  OnePassWgmmaSplitD,
  OnePassWgmmaOwnHalfFirst
};

/// Sparse MLA forward (SPEC §4, §6), MQA with one KV head. q [s_q,h_q,d_qk] bf16 (raw bits),
/// kv [s_kv,d_qk] bf16, indices [s_q,k] int32 (any value; slot j of row t is valid iff
/// 0 <= id < s_kv and j < topk_length[t]; invalid slots are never dereferenced), topk_length
/// [s_q] int32 or null, attn_sink [h_q] fp32 or null (±inf allowed), sm_scale finite,
/// 0 < d_v <= d_qk. Outputs: out [s_q,h_q,d_v] bf16 (round to nearest even), lse and
/// max_logits [s_q,h_q] fp32 (natural log). fp32 accumulation, online softmax over tiles of
/// valid ids only. Rows without a valid slot: out 0, lse +inf, max_logits -inf.
/// Sink: out *= 1 / (1 + exp(sink - lse)). Duplicate ids are separate terms. Deterministic.
/// Throws std::invalid_argument for negative sizes, d_v out of (0, d_qk], d_qk or d_v over
/// the limits above, or a non-finite sm_scale.
void sparse_mla_forward_device(const uint16_t* q, const uint16_t* kv, const int32_t* indices,
                               const int32_t* topk_length, const float* attn_sink,
                               int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                               int64_t d_v, float sm_scale, uint16_t* out, float* lse,
                               float* max_logits, cudaStream_t stream,
                               SparseMlaKernel kernel = SparseMlaKernel::CudaCore);

/// Sparse MLA backward modes (SPEC §5). Deterministic: every (query row, 64-head group, slot)
/// writes its fp32 dkv row to scratch, then each key row sums its rows in (query row, slot,
/// head group) order over a stable radix sort of the pair list: dq, dkv and dsink are bitwise
/// reproducible. Fast: dkv by fp32 atomicAdd (order-dependent last bits); dq and dsink as in
/// Deterministic.
enum class SparseMlaBwdMode { Deterministic, Fast };

/// How the sparse MLA backward rounds P and dS before the dq / dkv products (SPEC §5, §9).
/// HiLo: P and sm_scale·dS as bf16 hi + lo pairs (about 16 significant bits, each product run
/// twice). Bf16: P and dS = p (dP - Δ) rounded once to bf16 (round to nearest even), sm_scale
/// applied to the fp32 products: the 16-bit roundings of a FlashMLA-style backward that the
/// SPEC §9 floors model (docs/what-a-pass-means.md, "Sparse MLA backward"), for one kernel run;
/// callers that split an fp32 / fp16 dout into several bf16 parts (the cuda backend, the torch
/// op) run HiLo, since one rounding per part can exceed those floors.
enum class SparseMlaBwdRounding { HiLo, Bf16 };

/// Largest d_qk / d_v the sparse MLA backward kernel takes (shared-memory tiles): 576 / 512.
int64_t sparse_mla_backward_max_d_qk();
int64_t sparse_mla_backward_max_d_v();

/// Scratch bytes sparse_mla_backward_device needs for the shape and mode: s_q·h_q fp32 dsink
/// terms; Deterministic adds the sorted pair list (4 int32 arrays of s_q·k plus CUB's sort
/// storage) and up to 2 GiB of fp32 dkv rows (query rows are processed in chunks that fit).
/// Throws std::invalid_argument when Deterministic and s_q·k > 2^31-1, std::runtime_error on
/// a CUDA error of the sort-size query.
size_t sparse_mla_backward_scratch_bytes(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv,
                                         int64_t k, SparseMlaBwdMode mode);

/// Sparse MLA backward (SPEC §5, §6) on the tensor cores (bf16 mma.sync, fp32 accumulation).
/// Inputs as sparse_mla_forward_device (q [s_q,h_q,d_qk], kv [s_kv,d_qk] bf16, indices [s_q,k]
/// int32 of any value, topk_length [s_q] int32 or null, attn_sink [h_q] fp32 or null, ±inf
/// allowed), plus out [s_q,h_q,d_v] bf16 and lse [s_q,h_q] fp32 as the forward returned them
/// (Δ = rowsum(out·dout) is taken from this out; P is recomputed as exp(sm_scale q·k - lse)
/// times the sink factor, sm_scale q·k rounded as the forward rounds it: a one-slot row has p = 1) and dout [s_q,h_q,d_v] bf16. Outputs (fp32, overwritten): dq
/// [s_q,h_q,d_qk] = sm_scale Σ_j dS_j kv[idx_j]; dkv [s_kv,d_qk] (zeroed first, then every
/// valid (t, h, slot) adds sm_scale dS q[t,h] + p dout[t,h] (first d_v)); dsink [h_q] =
/// -Σ_t exp(sink - L) Δ when attn_sink is given (else must be null). P and dS enter the
/// products as `rounding` says (SparseMlaBwdRounding). Invalid slots are never dereferenced; duplicate ids add once per slot; rows without
/// a valid slot give dq 0 and add nothing. `scratch`: sparse_mla_backward_scratch_bytes bytes.
/// Kernel limits: d_qk and d_v multiples of 8, d_qk <= 576, d_v <= min(d_qk, 512), q, kv,
/// dout, dq, dkv, scratch 16-byte aligned; Deterministic needs s_q·k <= 2^31-1. Violations
/// throw std::invalid_argument naming the argument; CUDA errors std::runtime_error.
void sparse_mla_backward_device(const uint16_t* q, const uint16_t* kv, const int32_t* indices,
                                const int32_t* topk_length, const float* attn_sink,
                                const uint16_t* out, const float* lse, const uint16_t* dout,
                                int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                                int64_t d_v, float sm_scale, float* dq, float* dkv, float* dsink,
                                void* scratch, cudaStream_t stream,
                                SparseMlaBwdMode mode = SparseMlaBwdMode::Deterministic,
                                SparseMlaBwdRounding rounding = SparseMlaBwdRounding::Bf16);

/// Largest H_I / d_I the indexer kernels take; d_I must also be a multiple of 8 (16-byte rows).
int64_t indexer_max_heads();
int64_t indexer_max_dim();

/// Which indexer forward kernel runs (same results up to fp32 summation order, SPEC §2).
/// Wgmma: sm_90a wgmma.m64n128k16, two query rows per block, q_idx in registers, the next key
/// tile's product overlapping the current tile's epilogue. Wgmma3 (the default; 429 TFLOP/s
/// against 348 for Wgmma on the H200, bench/results/2026-11-30-gpu-indexer.md): the same with
/// q_idx in shared memory and three rows per block (one key tile read serves three rows). Mma:
/// mma.sync.m16n8k16 with ldmatrix (the auditing fallback). ProbeNoEpilogue(3): timing probes
/// of Wgmma(3) for the benchmark, the epilogue left out: their scores are NOT valid.
enum class IndexerKernel { Wgmma, Wgmma3, Mma, ProbeNoEpilogue, ProbeNoEpilogue3 };

/// Indexer scores (SPEC §2): scores[t,s] = Σ_h w[t,h]·ReLU(q_idx[t,h,:]·k_idx[s,:]) for s in
/// [ks[t], ke[t]) (clamped to [0, s_kv]; both null = every key), -inf outside. q_idx
/// [s_q,H,d] and k_idx [s_kv,d] bf16 (raw bits), w [s_q,H] fp32, ks/ke [s_q] int64 or null,
/// scores [s_q,s_kv] fp32. Products exact, fp32 accumulation; ReLU keeps NaN. Key tiles outside
/// every window of a pair of rows are neither loaded nor multiplied. Deterministic.
/// Throws std::invalid_argument for negative sizes, H > indexer_max_heads(), d > 128 or not a
/// multiple of 8, s_q or s_kv too large for int32 indexing; std::runtime_error on a CUDA error.
void indexer_scores_device(const uint16_t* q_idx, const uint16_t* k_idx, const float* w,
                           const int64_t* ks, const int64_t* ke, int64_t s_q, int64_t H,
                           int64_t d, int64_t s_kv, float* scores, cudaStream_t stream,
                           IndexerKernel kernel = IndexerKernel::Wgmma3);

/// Which indexer backward kernels run (same results up to fp32 summation order, SPEC §2).
/// Wgmma (the default until session 14; about 3x faster than Mma at s_q = s_kv 8192 causal on the H200,
/// bench/results/2026-12-02-gpu-session13.md): sm_90a wgmma, S = q·k recomputed per 64x64 tile
/// and G·k / Gᵀ·q with G as register A fragments; dq/dw per pair of query rows, dk per 64 keys
/// on a cluster of two CTAs whose four warpgroups take every fourth row, summed in a fixed
/// order. Mma: the mma.sync kernels of bench/results/2026-11-30-gpu-indexer.md (dq/dw per pair
/// of rows, dk per 128 keys).
/// WgmmaFactored: Wgmma with a cheaper epilogue, the same products and fp32 precision: G's
/// three bf16 parts split on pairs, and in dq/dw w[t,h] taken out of the key sum
/// (dq = w · Σ_s dI 1[S>0] k_idx: the parts of dI per key, masked by 1[S>0], w multiplying
/// the fp32 sum once); a block whose factored sum overflows (or whose |w| exceeds 2^16) runs
/// its tiles again unfactored, so its range is Wgmma's. dk and dw bitwise equal to Wgmma's;
/// dq differs by the rounding of one fp32 product per element
/// (bench/results/2026-12-02-gpu-session14.md).
/// WgmmaOverlap (the default): WgmmaFactored with the epilogue of each tile issued one k16
/// step at a time, overlapping the previous tile's G products; bitwise equal to WgmmaFactored.
/// ProbeDqOnly / ProbeDkOnly / ProbeNoGradProducts (of Wgmma), ProbeFactoredDqOnly /
/// ProbeFactoredDkOnly (of WgmmaFactored), ProbeOverlapDqOnly / ProbeOverlapDkOnly (of
/// WgmmaOverlap): timing probes for the benchmark (only the dq/dw
/// kernel, only the dk kernel, no G products): their outputs are NOT valid.
enum class IndexerBwdKernel {
  Wgmma,
  Mma,
  ProbeDqOnly,
  ProbeDkOnly,
  ProbeNoGradProducts,
  WgmmaFactored,
  ProbeFactoredDqOnly,
  ProbeFactoredDkOnly,
  WgmmaOverlap,
  ProbeOverlapDqOnly,
  ProbeOverlapDkOnly
};

/// Backward of indexer_scores (SPEC §2) for upstream d_scores [s_q,s_kv] fp32 (entries outside
/// the windows are never read into a sum, NaN included; ReLU'(0) = 0): dq_idx [s_q,H,d] and
/// dk_idx [s_kv,d] bf16 (round to nearest even), dw [s_q,H] fp32. fp32 accumulation on the
/// tensor cores (dI·w·1[q·k>0] split into three bf16 parts: fp32 precision), fixed order, no atomics:
/// bitwise deterministic. Same sizes and errors as indexer_scores_device.
void indexer_scores_backward_device(const uint16_t* q_idx, const uint16_t* k_idx, const float* w,
                                    const int64_t* ks, const int64_t* ke, const float* d_scores,
                                    int64_t s_q, int64_t H, int64_t d, int64_t s_kv,
                                    uint16_t* dq_idx, uint16_t* dk_idx, float* dw,
                                    cudaStream_t stream,
                                    IndexerBwdKernel kernel = IndexerBwdKernel::WgmmaOverlap);

/// Number of CUDA devices, 0 when cudaGetDeviceCount fails (no driver, no device).
int device_count();

}  // namespace dsa::cuda
