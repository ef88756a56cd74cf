// Indexer scores and their backward on the tensor cores (SPEC §2), bf16 q_idx/k_idx, fp32
// accumulation, for H_I <= 64 and d_I <= 128 (a multiple of 8).
//
// Forward: one thread block per 2 or 3 query rows (one warpgroup per row; its 64 padded heads
// are the M = 64 rows of the product), tiles of 128 keys over the union of the block's windows,
// so key tiles outside every window of the block are never loaded or multiplied. Key tiles
// stream through a 4-stage cp.async ring in the 128-byte swizzled layout. The epilogue applies
// ReLU, multiplies by w[t,h] and sums the heads: within a thread (2 heads), then across the 8
// lane groups by a transposing butterfly (each step halves the columns a lane carries), then
// across the 4 warps through shared memory. Keys outside the row's window are written -inf.
// Kernels: `Wgmma3` (default: sm_90a wgmma.m64n128k16 with q_idx and the key tile in shared
// memory by descriptor, 3 rows per block; the next tile's product runs while the epilogue of
// the current one executes), `Wgmma` (q_idx as register A fragments, 2 rows per block) and
// `Mma` (mma.sync.m16n8k16 + ldmatrix, same layout, 2 rows per block).
//
// Backward (IndexerBwdKernel::WgmmaOverlap, the default, and WgmmaFactored: the wgmma kernels
// with a cheaper epilogue, w factored out of dq's key sum, Overlap also running each tile's
// epilogue under the previous tile's products; IndexerBwdKernel::Wgmma): the wgmma kernels
// below ("backward on wgmma"). Backward (IndexerBwdKernel::Mma, the mma.sync kernels):
// two kernels, no atomics on values. dq/dw: per pair of query rows, tiles of 64 keys;
// S = Q K^T recomputed, G = dI w 1[S>0] (0 outside the window: dI there is never read into a
// sum), dw += dI ReLU(S) in registers, dq += G K with G split into three bf16 parts hi + mid + lo
// (G carried to fp32 precision), a fixed summation order. dk: per block of 128 keys, every query row
// whose window meets the block in row order: S^T = K Q^T, the same G^T, dk += G^T Q (three parts).
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dsa/cuda/kernels.h"
#include "hopper_primitives.cuh"

namespace dsa::cuda {
namespace {

using namespace detail;  // hopper_primitives.cuh
using bf16 = __nv_bfloat16;

constexpr int kMaxHeads = 64;   // M of one warpgroup product: heads padded to 64
constexpr int kMaxDim = 128;    // d_I padded to 128: two 64-column swizzle atoms
constexpr int kThreads = 256;   // every kernel: 8 warps
constexpr int kFwdKeys = 128;   // keys per forward tile
constexpr int kFwdStages = 4;
constexpr uint32_t kFwdTile = kFwdKeys * 256;  // bytes of one key tile (128 rows x 256 B)
constexpr uint32_t kQTile = kMaxHeads * 256;  // one row's q_idx tile (64 heads x 256 B)
// Forward shared memory for `tok` rows per block: [q tiles (shared-memory A only)] [key stages]
// [per-warpgroup reduction buffers 2 x 4 warps x 128 floats].
constexpr size_t fwd_smem(int tok, bool q_in_smem) {
  return 1024 + (q_in_smem ? tok * kQTile : 0) + kFwdStages * kFwdTile +
         static_cast<size_t>(tok) * 2 * 4 * 128 * sizeof(float);
}
constexpr int kBwdKeys = 64;    // keys per dq/dw tile
constexpr int kBwdStages = 3;
constexpr uint32_t kBwdTile = kBwdKeys * 256 + 2 * kBwdKeys * 4;  // K tile + dI of two rows
constexpr size_t kBwdSmem = 1024 + kBwdStages * kBwdTile;
constexpr int kDkKeys = 128;    // keys per dk block (8 warps x 16)
constexpr int kDkStages = 3;
constexpr uint32_t kDkTile = kMaxHeads * 256 + kDkKeys * 4 + kMaxHeads * 4;  // Q tile, dI, w
constexpr size_t kDkSmem = 1024 + kDkStages * kDkTile + 16;

// Rows [row0, row0 + R) of a row-major bf16 matrix with `nrows` rows of d values into the
// swizzled tile at `sbase`; rows past nrows and columns past d are zero-filled.
template <int R, int NT = kThreads>
__device__ __forceinline__ void load_rows(uint32_t sbase, const bf16* src, int row0, int nrows,
                                          int d, int tid) {
#pragma unroll
  for (int i = tid; i < R * 16; i += NT) {
    const int r = i >> 4, c = i & 15;
    const bool valid = row0 + r < nrows && c * 8 < d;
    const bf16* p = valid ? src + static_cast<size_t>(row0 + r) * d + c * 8 : src;
    cp_async16_zfill(sbase + sw128_offset(R, r, c), p, valid ? 16u : 0u);
  }
}

// The m16 x k128 A fragments (mma.m16n8k16 / wgmma register layout) of rows
// [16 warp, 16 warp + 16) of a row-major bf16 [rows_valid, d] block; zeros past either edge.
__device__ __forceinline__ void load_a_rows(uint32_t (&a)[8][4], const bf16* base,
                                            int rows_valid, int d, int warp, int lane) {
  const int gid = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = warp * 16 + gid + ((r & 1) ? 8 : 0);
      const int col = kk * 16 + 2 * t4 + ((r & 2) ? 8 : 0);
      a[kk][r] = (row < rows_valid && col < d)
                     ? *reinterpret_cast<const uint32_t*>(base + static_cast<size_t>(row) * d + col)
                     : 0u;
    }
}

struct Window {
  int lo, hi;  // [lo, hi) clamped to [0, s_kv]; lo == hi == 0 when empty or past s_q
};

__device__ __forceinline__ Window row_window(const int64_t* ks, const int64_t* ke, int t, int s_q,
                                             int s_kv) {
  if (t >= s_q) return {0, 0};
  long long lo = ks ? ks[t] : 0, hi = ke ? ke[t] : s_kv;
  lo = lo < 0 ? 0 : lo;
  hi = hi > s_kv ? s_kv : hi;
  if (lo >= hi) return {0, 0};
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

// max(x, 0) that keeps NaN (max.NaN, sm_80+): ReLU(NaN) = NaN as in the reference.
__device__ __forceinline__ float relu(float x) {
  float r;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
}

// A fragments (m16 x k16) from the C fragments of two adjacent n8 tiles, each value split into
// three bf16 parts hi + mid + lo (residual below 2^-24 relative: the fp32 value is carried).
__device__ __forceinline__ void c_to_a_split3(const float* c0, const float* c1,
                                              uint32_t (&a)[3][4]) {
  const float v[8] = {c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]};
  float p[3][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    p[0][j] = __bfloat162float(__float2bfloat16_rn(v[j]));
    const float r1 = v[j] - p[0][j];  // exact
    p[1][j] = __bfloat162float(__float2bfloat16_rn(r1));
    p[2][j] = r1 - p[1][j];  // exact; rounded to bf16 by the pack
  }
#pragma unroll
  for (int part = 0; part < 3; ++part)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[part][r] = pack_bf16(p[part][2 * r], p[part][2 * r + 1]);
}

// The split of c_to_a_split3 on a pair of values at once (cvt.rn.bf16x2.f32 rounds each half
// to nearest even, as __float2bfloat16_rn): hi + mid + lo of (x0, x1) as three bf16x2 words
// (x0 in the low half), bitwise the same parts in 11 instructions instead of 15.
__device__ __forceinline__ void split3_x2(float x0, float x1, uint32_t& hi, uint32_t& mid,
                                          uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  const float r0 = x0 - __uint_as_float(hi << 16), r1 = x1 - __uint_as_float(hi & 0xffff0000u);
  mid = pack_bf16(r0, r1);
  lo = pack_bf16(r0 - __uint_as_float(mid << 16), r1 - __uint_as_float(mid & 0xffff0000u));
}

// c_to_a_split3 with split3_x2: the same fragments.
__device__ __forceinline__ void c_to_a_split3_x2(const float* c0, const float* c1,
                                                 uint32_t (&a)[3][4]) {
  split3_x2(c0[0], c0[1], a[0][0], a[1][0], a[2][0]);
  split3_x2(c0[2], c0[3], a[0][1], a[1][1], a[2][1]);
  split3_x2(c1[0], c1[1], a[0][2], a[1][2], a[2][2]);
  split3_x2(c1[2], c1[3], a[0][3], a[1][3], a[2][3]);
}

// ---------------------------------------------------------------- forward
// acc: one warp's 16 heads x 128 keys (wgmma / mma C layout: acc[4 nt + c] = row gid + 8 (c/2),
// column 8 nt + 2 t4 + c%2). Writes the 128 scores of the tile (row `out_row`, may be null).
__device__ __forceinline__ void fwd_epilogue(const float (&acc)[64], float w0, float w1,
                                             float* red, int buf, int warp, int lane, int wtid,
                                             int wg, float* out_row, int key0, Window win,
                                             int s_kv) {
  float part[32];
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      part[nt * 2 + c] = w0 * relu(acc[nt * 4 + c]) + w1 * relu(acc[nt * 4 + 2 + c]);
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int c = 0; c < 16; ++c) {
    const float send = b4 ? part[c] : part[c + 16], keep = b4 ? part[c + 16] : part[c];
    part[c] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const float send = b3 ? part[c] : part[c + 8], keep = b3 ? part[c + 8] : part[c];
    part[c] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float send = b2 ? part[c] : part[c + 4], keep = b2 ? part[c + 4] : part[c];
    part[c] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  const int nt0 = (b2 ? 2 : 0) + (b3 ? 4 : 0) + (b4 ? 8 : 0), t4 = lane & 3;
  float* r = red + buf * 512 + warp * 128;
  *reinterpret_cast<float2*>(r + nt0 * 8 + 2 * t4) = make_float2(part[0], part[1]);
  *reinterpret_cast<float2*>(r + (nt0 + 1) * 8 + 2 * t4) = make_float2(part[2], part[3]);
  named_barrier_sync(1 + wg, 128);
  const float* rb = red + buf * 512;
  const float s = ((rb[wtid] + rb[128 + wtid]) + rb[256 + wtid]) + rb[384 + wtid];
  const int key = key0 + wtid;
  if (out_row && key < s_kv) out_row[key] = (key >= win.lo && key < win.hi) ? s : -INFINITY;
}

// One warp's 16 rows x kCols columns x d 128 on mma.sync: acc = A B^T with A the warp's m16 x
// k128 fragments (load_a_rows) and B the swizzled kCols-row tile at sbase (load_rows); acc in
// the mma C layout (acc[4 nt + c]: row gid + 8 (c/2), column 8 nt + 2 t4 + c%2).
template <int kCols>
__device__ __forceinline__ void mma_tile(float (&acc)[kCols / 2], const uint32_t (&qa)[8][4],
                                         uint32_t sbase, int lane) {
  const int mi = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int j = 0; j < kCols / 2; ++j) acc[j] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int p = 0; p < kCols / 16; ++p) {
      uint32_t b[4];
      ldsm_x4(b, sbase + sw128_offset(kCols, 16 * p + ((mi >> 1) << 3) + r8, kk * 2 + (mi & 1)));
      mma16816(&acc[(2 * p) * 4], qa[kk], b[0], b[1]);
      mma16816(&acc[(2 * p + 1) * 4], qa[kk], b[2], b[3]);
    }
}

// The warpgroup's 64 heads x 128 keys x d 128: 8 wgmma.m64n128k16, committed as one group.
__device__ __forceinline__ void wgmma_tile(float (&acc)[64], const uint32_t (&qa)[8][4],
                                           uint32_t sbase) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t k_off = (kk >> 2) * (kFwdKeys * 128) + (kk & 3) * 32;
    wgmma_m64n128k16_rs(acc, qa[kk], sw128_desc(sbase + k_off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// The same product with q_idx in shared memory (A by descriptor): frees the 32 registers of the
// A fragments, so three warpgroups (three rows) fit in one block.
__device__ __forceinline__ void wgmma_tile_ss(float (&acc)[64], uint32_t qtile, uint32_t sbase) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t q_off = (kk >> 2) * (kMaxHeads * 128) + (kk & 3) * 32;
    const uint32_t k_off = (kk >> 2) * (kFwdKeys * 128) + (kk & 3) * 32;
    wgmma_m64n128k16_ss(acc, sw128_desc(qtile + q_off, 16, 1024),
                        sw128_desc(sbase + k_off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

enum class FwdPath { Mma, WgmmaRs, WgmmaSs };

// kTok query rows per block, one warpgroup each. kProbe (benchmark only): the products and the
// pipeline run, the epilogue is replaced by one store per thread (scores are not valid).
template <FwdPath kPath, int kTok, bool kProbe>
__global__ void __launch_bounds__(128 * kTok, 1)
    indexer_fwd_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                       const float* __restrict__ w, const int64_t* __restrict__ ks,
                       const int64_t* __restrict__ ke, int s_q, int H, int d, int s_kv,
                       float* __restrict__ out) {
  constexpr int kNT = 128 * kTok;
  constexpr bool kQSmem = kPath == FwdPath::WgmmaSs;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t qbase = base, kbase = base + (kQSmem ? kTok * kQTile : 0u);
  float* red_all = reinterpret_cast<float*>(smem_raw + (kbase - raw) + kFwdStages * kFwdTile);
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  // Longest rows first (causal: the last blocks see the most keys).
  const int t0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kTok;
  int rlo = s_kv, rhi = 0;  // union of the block's windows
#pragma unroll
  for (int j = 0; j < kTok; ++j) {
    const Window wj = row_window(ks, ke, t0 + j, s_q, s_kv);
    if (wj.hi > wj.lo) rlo = min(rlo, wj.lo), rhi = max(rhi, wj.hi);
  }
  const int kt0 = rhi > rlo ? rlo / kFwdKeys : 0;
  const int n = rhi > rlo ? (rhi + kFwdKeys - 1) / kFwdKeys - kt0 : 0;
  const int my_t = t0 + wg;
  const Window win = row_window(ks, ke, my_t, s_q, s_kv);
  float* out_row = my_t < s_q ? out + static_cast<size_t>(my_t) * s_kv : nullptr;
  if (out_row) {  // columns of no tile of this block: -inf
    const int a = n ? kt0 * kFwdKeys : s_kv, b = n ? min(s_kv, (kt0 + n) * kFwdKeys) : s_kv;
    for (int c = wtid; c < a; c += 128) out_row[c] = -INFINITY;
    for (int c = b + wtid; c < s_kv; c += 128) out_row[c] = -INFINITY;
  }
  if (n == 0) return;  // uniform over the block

  const bool row_ok = my_t < s_q;
  uint32_t qa[8][4];
  if constexpr (!kQSmem)
    load_a_rows(qa, q + static_cast<size_t>(row_ok ? my_t : 0) * H * d, row_ok ? H : 0, d, warp,
                lane);
  const int h0 = warp * 16 + (lane >> 2), h1 = h0 + 8;
  const float w0 = (row_ok && h0 < H) ? w[static_cast<size_t>(my_t) * H + h0] : 0.f;
  const float w1 = (row_ok && h1 < H) ? w[static_cast<size_t>(my_t) * H + h1] : 0.f;
  float* red = red_all + wg * 1024;

  auto load_tile = [&](int i) {
    if (i < n)
      load_rows<kFwdKeys, kNT>(kbase + (i % kFwdStages) * kFwdTile, k, (kt0 + i) * kFwdKeys, s_kv,
                               d, tid);
    cp_async_commit();
  };
  if constexpr (kQSmem) {  // the rows' q_idx tiles join the first group
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      const int t = t0 + j;
      load_rows<kMaxHeads, kNT>(qbase + j * kQTile, q + static_cast<size_t>(t < s_q ? t : 0) * H * d,
                                0, t < s_q ? H : 0, d, tid);
    }
  }
#pragma unroll
  for (int i = 0; i < kFwdStages - 1; ++i) load_tile(i);

  auto epilogue = [&](const float(&acc)[64], int i) {
    if constexpr (kProbe) {
      const int key = (kt0 + i) * kFwdKeys + wtid;
      if (out_row && key < s_kv) out_row[key] = acc[0] + acc[63];
    } else {
      fwd_epilogue(acc, w0, w1, red, i & 1, warp, lane, wtid, wg, out_row, (kt0 + i) * kFwdKeys,
                   win, s_kv);
    }
  };
  auto issue = [&](float(&acc)[64], int i) {
    const uint32_t stage = kbase + (i % kFwdStages) * kFwdTile;
    if constexpr (kQSmem) wgmma_tile_ss(acc, qbase + wg * kQTile, stage);
    else wgmma_tile(acc, qa, stage);
  };

  if constexpr (kPath != FwdPath::Mma) {
    float acc_a[64], acc_b[64];
    // Step i < n-1: tile i+1 made visible to the block and its product issued (into `nxt`)
    // before the epilogue of tile i (in `cur`) runs, so the tensor cores work during it.
    auto step = [&](int i, float(&cur)[64], float(&nxt)[64]) {
      cp_async_wait<kFwdStages - 3>();
      fence_proxy_async();
      __syncthreads();  // also: every warpgroup has retired tile i-1's product
      load_tile(i + kFwdStages - 1);  // into the stage of tile i-1
      reg_fence(nxt);
      issue(nxt, i + 1);
      wgmma_wait<1>();
      reg_fence(cur);
      epilogue(cur, i);
    };
    auto last = [&](int i, float(&cur)[64]) {  // tile n-1: nothing left to issue
      wgmma_wait<0>();
      reg_fence(cur);
      epilogue(cur, i);
    };
    cp_async_wait<kFwdStages - 2>();
    fence_proxy_async();
    __syncthreads();
    issue(acc_a, 0);
    int i = 0;
    for (; i + 2 < n; i += 2) {  // straight-line pairs: acc_a is in flight at the loop head
      step(i, acc_a, acc_b);
      step(i + 1, acc_b, acc_a);
    }
    if (n - i == 2) {
      step(i, acc_a, acc_b);
      last(i + 1, acc_b);
    } else {
      last(i, acc_a);
    }
  } else {
    float acc[64];
    for (int i = 0; i < n; ++i) {
      cp_async_wait<kFwdStages - 2>();
      __syncthreads();
      load_tile(i + kFwdStages - 1);
      mma_tile<kFwdKeys>(acc, qa, kbase + (i % kFwdStages) * kFwdTile, lane);
      epilogue(acc, i);
    }
  }
}

// ---------------------------------------------------------------- backward: dq, dw
__global__ void __launch_bounds__(kThreads, 1)
    indexer_bwd_dq_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const float* __restrict__ w, const int64_t* __restrict__ ks,
                          const int64_t* __restrict__ ke, const float* __restrict__ d_scores,
                          int s_q, int H, int d, int s_kv, bf16* __restrict__ dq,
                          float* __restrict__ dw) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid & 127) >> 5, lane = tid & 31;
  const int gid = lane >> 2, t4 = lane & 3, mi = lane >> 3, r8 = lane & 7;
  const int t0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * 2;
  const Window wa = row_window(ks, ke, t0, s_q, s_kv), wb = row_window(ks, ke, t0 + 1, s_q, s_kv);
  int rlo = s_kv, rhi = 0;
  if (wa.hi > wa.lo) rlo = min(rlo, wa.lo), rhi = max(rhi, wa.hi);
  if (wb.hi > wb.lo) rlo = min(rlo, wb.lo), rhi = max(rhi, wb.hi);
  const int kt0 = rhi > rlo ? rlo / kBwdKeys : 0;
  const int n = rhi > rlo ? (rhi + kBwdKeys - 1) / kBwdKeys - kt0 : 0;
  const int my_t = t0 + wg;
  const bool row_ok = my_t < s_q;
  const Window win = wg ? wb : wa;

  uint32_t qa[8][4];
  load_a_rows(qa, q + static_cast<size_t>(row_ok ? my_t : 0) * H * d, row_ok ? H : 0, d, warp,
              lane);
  const int h0 = warp * 16 + gid, h1 = h0 + 8;
  const float w0 = (row_ok && h0 < H) ? w[static_cast<size_t>(my_t) * H + h0] : 0.f;
  const float w1 = (row_ok && h1 < H) ? w[static_cast<size_t>(my_t) * H + h1] : 0.f;

  auto load_tile = [&](int i) {
    if (i < n) {
      const uint32_t sb = base + (i % kBwdStages) * kBwdTile;
      const int key0 = (kt0 + i) * kBwdKeys;
      load_rows<kBwdKeys>(sb, k, key0, s_kv, d, tid);
      if (tid < 2 * kBwdKeys) {
        const int j = tid / kBwdKeys, c = tid % kBwdKeys, t = t0 + j, key = key0 + c;
        const bool valid = t < s_q && key < s_kv;
        cp_async4_zfill(sb + kBwdKeys * 256 + tid * 4,
                        valid ? d_scores + static_cast<size_t>(t) * s_kv + key : d_scores,
                        valid ? 4u : 0u);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kBwdStages - 1; ++i) load_tile(i);

  float dqa[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) dqa[j] = 0.f;
  float dw0 = 0.f, dw1 = 0.f;
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kBwdStages - 2>();
    __syncthreads();
    load_tile(i + kBwdStages - 1);
    const uint32_t sb = base + (i % kBwdStages) * kBwdTile;
    const float* dis = reinterpret_cast<const float*>(smem + (i % kBwdStages) * kBwdTile +
                                                      kBwdKeys * 256) + wg * kBwdKeys;
    const int key0 = (kt0 + i) * kBwdKeys;
    float s[32];
    mma_tile<kBwdKeys>(s, qa, sb, lane);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int kl = nt * 8 + 2 * t4 + (c & 1), key = key0 + kl;
        const bool in = key >= win.lo && key < win.hi;
        const float g = in ? dis[kl] : 0.f, x = s[nt * 4 + c];
        if (c & 2) dw1 += in ? g * relu(x) : 0.f;
        else dw0 += in ? g * relu(x) : 0.f;
        s[nt * 4 + c] = in ? g * ((c & 2) ? w1 : w0) * (x > 0.f ? 1.f : 0.f) : 0.f;
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[3][4];
      c_to_a_split3(&s[(2 * kk) * 4], &s[(2 * kk + 1) * 4], a);
#pragma unroll
      for (int dp = 0; dp < 8; ++dp) {
        uint32_t b[4];
        ldsm_x4_t(b, sb + sw128_offset(kBwdKeys, kk * 16 + ((mi & 1) << 3) + r8, dp * 2 + (mi >> 1)));
#pragma unroll
        for (int part = 2; part >= 0; --part) {  // smallest part first
          mma16816(&dqa[(2 * dp) * 4], a[part], b[0], b[1]);
          mma16816(&dqa[(2 * dp + 1) * 4], a[part], b[2], b[3]);
        }
      }
    }
  }
  if (!row_ok) return;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int col = nt * 8 + 2 * t4;
    if (col >= d) continue;
    if (h0 < H)
      *reinterpret_cast<uint32_t*>(dq + (static_cast<size_t>(my_t) * H + h0) * d + col) =
          pack_bf16(dqa[nt * 4], dqa[nt * 4 + 1]);
    if (h1 < H)
      *reinterpret_cast<uint32_t*>(dq + (static_cast<size_t>(my_t) * H + h1) * d + col) =
          pack_bf16(dqa[nt * 4 + 2], dqa[nt * 4 + 3]);
  }
  dw0 += __shfl_xor_sync(0xffffffffu, dw0, 1);
  dw0 += __shfl_xor_sync(0xffffffffu, dw0, 2);
  dw1 += __shfl_xor_sync(0xffffffffu, dw1, 1);
  dw1 += __shfl_xor_sync(0xffffffffu, dw1, 2);
  if (t4 == 0) {
    if (h0 < H) dw[static_cast<size_t>(my_t) * H + h0] = dw0;
    if (h1 < H) dw[static_cast<size_t>(my_t) * H + h1] = dw1;
  }
}

// ---------------------------------------------------------------- backward: dk
__global__ void __launch_bounds__(kThreads, 1)
    indexer_bwd_dk_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                          const float* __restrict__ w, const int64_t* __restrict__ ks,
                          const int64_t* __restrict__ ke, const float* __restrict__ d_scores,
                          int s_q, int H, int d, int s_kv, bf16* __restrict__ dk) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  int* range = reinterpret_cast<int*>(smem + kDkStages * kDkTile);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gid = lane >> 2, t4 = lane & 3, mi = lane >> 3, r8 = lane & 7;
  const int s0 = static_cast<int>(blockIdx.x) * kDkKeys;
  // Rows whose window meets [s0, s0 + kDkKeys): first and last (min/max: order-free).
  if (tid == 0) range[0] = s_q, range[1] = -1;
  __syncthreads();
  {
    int lo = s_q, hi = -1;
    for (int t = tid; t < s_q; t += kThreads) {
      const Window wt = row_window(ks, ke, t, s_q, s_kv);
      if (wt.hi > wt.lo && wt.lo < s0 + kDkKeys && wt.hi > s0) lo = min(lo, t), hi = max(hi, t);
    }
    if (hi >= 0) atomicMin(&range[0], lo), atomicMax(&range[1], hi);
  }
  __syncthreads();
  const int tmin = range[0], n = range[1] >= range[0] ? range[1] - range[0] + 1 : 0;

  uint32_t ka[8][4];
  load_a_rows(ka, k + static_cast<size_t>(s0) * d, s_kv - s0, d, warp, lane);
  const int k0 = s0 + warp * 16 + gid, k1 = k0 + 8;

  auto load_tile = [&](int i) {
    if (i < n) {
      const uint32_t sb = base + (i % kDkStages) * kDkTile;
      const int t = tmin + i;
      load_rows<kMaxHeads>(sb, q + static_cast<size_t>(t) * H * d, 0, H, d, tid);
      if (tid < kDkKeys) {
        const bool valid = s0 + tid < s_kv;
        cp_async4_zfill(sb + kMaxHeads * 256 + tid * 4,
                        valid ? d_scores + static_cast<size_t>(t) * s_kv + s0 + tid : d_scores,
                        valid ? 4u : 0u);
      } else if (tid < kDkKeys + kMaxHeads) {
        const int h = tid - kDkKeys;
        cp_async4_zfill(sb + kMaxHeads * 256 + kDkKeys * 4 + h * 4,
                        h < H ? w + static_cast<size_t>(t) * H + h : w, h < H ? 4u : 0u);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kDkStages - 1; ++i) load_tile(i);

  float dka[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) dka[j] = 0.f;
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kDkStages - 2>();
    __syncthreads();
    load_tile(i + kDkStages - 1);
    const int t = tmin + i;
    const Window win = row_window(ks, ke, t, s_q, s_kv);
    const uint32_t sb = base + (i % kDkStages) * kDkTile;
    const float* dis = reinterpret_cast<const float*>(smem + (i % kDkStages) * kDkTile +
                                                      kMaxHeads * 256);
    const float* ws = dis + kDkKeys;
    float s[32];
    mma_tile<kMaxHeads>(s, ka, sb, lane);
    const bool in0 = k0 >= win.lo && k0 < win.hi, in1 = k1 >= win.lo && k1 < win.hi;
    const float g0 = in0 ? dis[k0 - s0] : 0.f, g1 = in1 ? dis[k1 - s0] : 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int h = nt * 8 + 2 * t4 + (c & 1);
        const bool in = (c & 2) ? in1 : in0;
        const float x = s[nt * 4 + c];
        s[nt * 4 + c] = in ? ((c & 2) ? g1 : g0) * ws[h] * (x > 0.f ? 1.f : 0.f) : 0.f;
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[3][4];
      c_to_a_split3(&s[(2 * kk) * 4], &s[(2 * kk + 1) * 4], a);
#pragma unroll
      for (int dp = 0; dp < 8; ++dp) {
        uint32_t b[4];
        ldsm_x4_t(b, sb + sw128_offset(kMaxHeads, kk * 16 + ((mi & 1) << 3) + r8, dp * 2 + (mi >> 1)));
#pragma unroll
        for (int part = 2; part >= 0; --part) {  // smallest part first
          mma16816(&dka[(2 * dp) * 4], a[part], b[0], b[1]);
          mma16816(&dka[(2 * dp + 1) * 4], a[part], b[2], b[3]);
        }
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int col = nt * 8 + 2 * t4;
    if (col >= d) continue;
    if (k0 < s_kv)
      *reinterpret_cast<uint32_t*>(dk + static_cast<size_t>(k0) * d + col) =
          pack_bf16(dka[nt * 4], dka[nt * 4 + 1]);
    if (k1 < s_kv)
      *reinterpret_cast<uint32_t*>(dk + static_cast<size_t>(k1) * d + col) =
          pack_bf16(dka[nt * 4 + 2], dka[nt * 4 + 3]);
  }
}

// ---------------------------------------------------------------- backward on wgmma
// Both gradients with one kernel shape (kDk false: dq/dw, kDk true: dk). Each warpgroup owns a
// fixed 64-row operand F in shared memory (dq: q_idx[t], the 64 padded heads; dk: 64 keys of
// k_idx) and streams 64-row tiles T (dq: 64 keys of k_idx; dk: q_idx[t'] of one query row) with
// side data (dI, and w for dk) through a cp.async ring. Per tile: S = F T^T (8 wgmma m64n64k16,
// both operands K-major by descriptor); G = dI w 1[S>0] (0 outside the window) in registers,
// split into three bf16 parts hi + mid + lo (fp32 precision, smallest part first as in the
// mma.sync kernels); acc += G T (12 wgmma m64n128k16 with G as register A fragments and T read
// MN-major). The S product of tile i+1 is issued before tile i's epilogue, so it runs meanwhile.
// dq: two query rows per block (one per warpgroup) share the key tiles. dk: 64 keys per
// cluster of two CTAs; the four warpgroups take every fourth query row (each its own ring) and
// their fp32 sums are added in a fixed order at the end through shared and distributed shared
// memory (deterministic). One block barrier per tile in both.
constexpr int kWgRows = 64;                       // rows of F and of one streamed tile
constexpr int kWgStages = 5;                      // ring depth; tiles issued 3 ahead
constexpr uint32_t kWgTile = kWgRows * 256;       // 64 rows x 128 bf16, 128-byte swizzle
constexpr uint32_t kWgSide = 1024;                // dI (and w) of one stage; keeps 1 KB alignment
constexpr uint32_t kWgStage = kWgTile + kWgSide;
constexpr uint32_t kWgRing = kWgStages * kWgStage;
// dq: [F of 2 rows][one shared ring]; dk: [F][a ring per warpgroup] (+ the row range).
constexpr size_t kWgSmemDq = 1024 + 2 * kWgTile + kWgRing;
constexpr size_t kWgSmemDk = 1024 + kWgTile + 2 * kWgRing + 16;
constexpr int kDkCluster = 2;                  // dk: CTAs per 64-key block (one cluster)
constexpr int kDkStreams = 2 * kDkCluster;     // dk: query-row streams per key block

// Timing probe (benchmark only): kProbeNoGrad leaves out the G T products.
// kV2 (IndexerBwdKernel::WgmmaFactored): the three-part split on bf16x2 pairs (split3_x2, the
// same parts) in both kernels and, in dq/dw, w factored out of the key sum:
//   dq[t,h,:] = w[t,h] · Σ_s (dI[t,s] 1[S>0]) k_idx[s,:],
// so the A fragments are the three parts of dI[t,s] (a thread splits its 16 keys once per
// tile and uses them for both of its heads) masked by 1[S>0] with a bitwise AND, and w
// multiplies the fp32 sum once at the end. The sum Σ_s |dI k| may exceed FLT_MAX where
// SPEC §2's Σ_s |dI w k| does not (|w| < 1): a block whose factored sums are not all finite
// (or whose w has a value that is not finite or above 2^16 in magnitude, where the parts of
// dI would sit 16 binades below those of dI·w) runs its tiles again with G = dI·w·1[S>0] as
// the Wgmma kernel does, so every valid input gets the Wgmma kernel's range.
// kV3 (IndexerBwdKernel::WgmmaOverlap; implies kV2): the epilogue of tile i is issued one
// k16 step at a time (4 commit groups per tile), each step waiting only until the previous
// tile's products of that step have read their A fragments, so the epilogue of tile i runs
// while tile i-1's G T products of the later steps (and S(i+1)) execute. The same products in
// the same order on the same fragments: results bitwise equal to kV2's.
template <bool kDk, bool kProbeNoGrad, bool kV2 = false, bool kV3 = false>
__device__ __forceinline__ void indexer_bwd_wgmma(const bf16* __restrict__ q,
                                                  const bf16* __restrict__ k,
                                                  const float* __restrict__ w,
                                                  const int64_t* __restrict__ ks,
                                                  const int64_t* __restrict__ ke,
                                                  const float* __restrict__ d_scores, int s_q,
                                                  int H, int d, int s_kv, bf16* __restrict__ grad,
                                                  float* __restrict__ dw) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int gid = lane >> 2, t4 = lane & 3;
  // Loader threads of a ring: the block (dq) or the warpgroup (dk).
  constexpr int kNT = kDk ? 128 : kThreads;
  const int ltid = kDk ? wtid : tid;
  const uint32_t ftile = kDk ? base : base + wg * kWgTile;
  const uint32_t ring = kDk ? base + kWgTile + wg * kWgRing : base + 2 * kWgTile;
  const uint32_t ring_off = ring - base;

  // dq: rows t0, t0 + 1 (longest first), key tiles [kt0, kt0 + n). dk: keys [s0, s0 + 64),
  // rows tmin + stream + 4 i for i < n (stream: 2 cluster rank + warpgroup).
  int n = 0, kt0 = 0, t0 = 0, s0 = 0, tmin = 0, my_t = 0, stream = 0;
  Window win{0, 0};
  float w0 = 0.f, w1 = 0.f;
  if constexpr (!kDk) {
    t0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * 2;
    const Window wa = row_window(ks, ke, t0, s_q, s_kv), wb = row_window(ks, ke, t0 + 1, s_q, s_kv);
    int rlo = s_kv, rhi = 0;
    if (wa.hi > wa.lo) rlo = min(rlo, wa.lo), rhi = max(rhi, wa.hi);
    if (wb.hi > wb.lo) rlo = min(rlo, wb.lo), rhi = max(rhi, wb.hi);
    kt0 = rhi > rlo ? rlo / kWgRows : 0;
    n = rhi > rlo ? (rhi + kWgRows - 1) / kWgRows - kt0 : 0;
    my_t = t0 + wg;
    win = wg ? wb : wa;
    const bool row_ok = my_t < s_q;
    const int h0 = warp * 16 + gid, h1 = h0 + 8;
    w0 = (row_ok && h0 < H) ? w[static_cast<size_t>(my_t) * H + h0] : 0.f;
    w1 = (row_ok && h1 < H) ? w[static_cast<size_t>(my_t) * H + h1] : 0.f;
    load_rows<kWgRows, 128>(ftile, q + static_cast<size_t>(row_ok ? my_t : 0) * H * d, 0,
                            row_ok ? H : 0, d, wtid);
  } else {
    s0 = static_cast<int>(blockIdx.x / kDkCluster) * kWgRows;
    stream = static_cast<int>(cooperative_groups::this_cluster().block_rank()) * 2 + wg;
    int* range = reinterpret_cast<int*>(smem + kWgTile + 2 * kWgRing);
    if (tid == 0) range[0] = s_q, range[1] = -1;
    __syncthreads();
    int lo = s_q, hi = -1;
    for (int t = tid; t < s_q; t += kThreads) {
      const Window wt = row_window(ks, ke, t, s_q, s_kv);
      if (wt.hi > wt.lo && wt.lo < s0 + kWgRows && wt.hi > s0) lo = min(lo, t), hi = max(hi, t);
    }
    if (hi >= 0) atomicMin(&range[0], lo), atomicMax(&range[1], hi);
    __syncthreads();
    tmin = range[0];
    const int rows = range[1] >= range[0] ? range[1] - range[0] + 1 : 0;
    // Both warpgroups run warpgroup 0's count (one block barrier per tile); warpgroup 1's
    // extra tile, if any, is a row past the range or past s_q: zero-filled or masked, G = 0.
    const int first = stream - wg;
    n = rows > first ? (rows - first + kDkStreams - 1) / kDkStreams : 0;
    load_rows<kWgRows, kThreads>(ftile, k, s0, s_kv, d, tid);
  }

  auto load_tile = [&](int i) {
    if (i < n) {
      const uint32_t sb = ring + (i % kWgStages) * kWgStage, side = sb + kWgTile;
      if constexpr (!kDk) {
        const int key0 = (kt0 + i) * kWgRows;
        load_rows<kWgRows, kNT>(sb, k, key0, s_kv, d, ltid);
        if (ltid < 2 * kWgRows) {  // dI of both rows
          const int t = t0 + ltid / kWgRows, key = key0 + ltid % kWgRows;
          const bool valid = t < s_q && key < s_kv;
          cp_async4_zfill(side + ltid * 4,
                          valid ? d_scores + static_cast<size_t>(t) * s_kv + key : d_scores,
                          valid ? 4u : 0u);
        }
      } else {
        const int t = tmin + stream + kDkStreams * i;
        const bool row_ok = t < s_q;
        load_rows<kWgRows, kNT>(sb, q + static_cast<size_t>(row_ok ? t : 0) * H * d, 0,
                                row_ok ? H : 0, d, ltid);
        if (ltid < kWgRows) {  // dI[t, s0 + ltid]
          const bool valid = row_ok && s0 + ltid < s_kv;
          cp_async4_zfill(side + ltid * 4,
                          valid ? d_scores + static_cast<size_t>(t) * s_kv + s0 + ltid : d_scores,
                          valid ? 4u : 0u);
        } else {  // w[t, h]
          const int h = ltid - kWgRows;
          const bool valid = row_ok && h < H;
          cp_async4_zfill(side + ltid * 4, valid ? w + static_cast<size_t>(t) * H + h : w,
                          valid ? 4u : 0u);
        }
      }
    }
    cp_async_commit();
  };
  auto issue_s = [&](float(&s)[32], int i) {
    const uint32_t sb = ring + (i % kWgStages) * kWgStage;
    reg_fence(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t off = (kk >> 2) * (kWgRows * 128) + (kk & 3) * 32;
      wgmma_m64n64k16_ss(s, sw128_desc(ftile + off, 16, 1024), sw128_desc(sb + off, 16, 1024),
                         kk > 0);
    }
    wgmma_commit();
  };
  float acc[64];  // set by the first tile's first product (scale_d 0); zeros when n == 0
  if constexpr (kProbeNoGrad) {
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = 0.f;
  }
  uint32_t a[4][3][4];  // G of the tile as A fragments: [k16 step][part][register]
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int p = 0; p < 3; ++p)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[kk][p][r] = 0u;
  float dw0 = 0.f, dw1 = 0.f;
  // kV2, dq/dw: w factored out of the key sum (block-uniform; false on the retry).
  bool fact = false;
  if constexpr (kV2 && !kDk) {
    const bool ok = fabsf(w0) <= 65536.f && fabsf(w1) <= 65536.f;  // false for NaN
    fact = __syncthreads_and(ok ? 1 : 0) != 0;
  }
  // Tile i's epilogue (S in s, complete) and its G T products.
  auto finish = [&](const float(&s)[32], int i) {
    float gv[32];  // G (S itself is not redefined: wgmma accumulators stay wgmma-only)
    const float* side = reinterpret_cast<const float*>(smem + ring_off +
                                                       (i % kWgStages) * kWgStage + kWgTile);
    bool parts_done = false;
    if constexpr (kV2 && !kDk) {
      if (fact) {  // A = parts of dI[t,s] masked by 1[S>0]; w applied after the sum
        const float* dis = side + wg * kWgRows;
        const int key0 = (kt0 + i) * kWgRows;
        uint32_t pr[8][3][2];  // [n8 tile][part][row h0, h1]
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int kl = nt * 8 + 2 * t4, key = key0 + kl;
          const bool in0 = key >= win.lo && key < win.hi, in1 = key + 1 >= win.lo && key + 1 < win.hi;
          const float g0 = in0 ? dis[kl] : 0.f, g1 = in1 ? dis[kl + 1] : 0.f;
          const float x0 = s[nt * 4], x1 = s[nt * 4 + 1], x2 = s[nt * 4 + 2], x3 = s[nt * 4 + 3];
          dw0 += in0 ? g0 * relu(x0) : 0.f;
          dw0 += in1 ? g1 * relu(x1) : 0.f;
          dw1 += in0 ? g0 * relu(x2) : 0.f;
          dw1 += in1 ? g1 * relu(x3) : 0.f;
          uint32_t p3[3];
          split3_x2(g0, g1, p3[0], p3[1], p3[2]);
          const uint32_t m0 = (x0 > 0.f ? 0x0000ffffu : 0u) | (x1 > 0.f ? 0xffff0000u : 0u);
          const uint32_t m1 = (x2 > 0.f ? 0x0000ffffu : 0u) | (x3 > 0.f ? 0xffff0000u : 0u);
#pragma unroll
          for (int p = 0; p < 3; ++p) pr[nt][p][0] = p3[p] & m0, pr[nt][p][1] = p3[p] & m1;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int p = 0; p < 3; ++p) {
            a[kk][p][0] = pr[2 * kk][p][0];
            a[kk][p][1] = pr[2 * kk][p][1];
            a[kk][p][2] = pr[2 * kk + 1][p][0];
            a[kk][p][3] = pr[2 * kk + 1][p][1];
          }
        parts_done = true;
      }
    }
    if (parts_done) {
    } else if constexpr (!kDk) {  // rows: heads; columns: keys
      const float* dis = side + wg * kWgRows;
      const int key0 = (kt0 + i) * kWgRows;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int kl = nt * 8 + 2 * t4 + (c & 1), key = key0 + kl;
          const bool in = key >= win.lo && key < win.hi;
          const float g = in ? dis[kl] : 0.f, x = s[nt * 4 + c];
          if (c & 2) dw1 += in ? g * relu(x) : 0.f;
          else dw0 += in ? g * relu(x) : 0.f;
          gv[nt * 4 + c] = in ? g * ((c & 2) ? w1 : w0) * (x > 0.f ? 1.f : 0.f) : 0.f;
        }
    } else {  // rows: keys; columns: heads
      const int t = tmin + stream + kDkStreams * i;
      const Window wt = row_window(ks, ke, t, s_q, s_kv);
      const int k0 = s0 + warp * 16 + gid, k1 = k0 + 8;
      const bool in0 = k0 >= wt.lo && k0 < wt.hi, in1 = k1 >= wt.lo && k1 < wt.hi;
      const float g0 = in0 ? side[k0 - s0] : 0.f, g1 = in1 ? side[k1 - s0] : 0.f;
      const float* ws = side + kWgRows;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int h = nt * 8 + 2 * t4 + (c & 1);
          const bool in = (c & 2) ? in1 : in0;
          const float x = s[nt * 4 + c];
          gv[nt * 4 + c] = in ? ((c & 2) ? g1 : g0) * ws[h] * (x > 0.f ? 1.f : 0.f) : 0.f;
        }
    }
    if (!parts_done) {
      if constexpr (kV2) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          c_to_a_split3_x2(&gv[(2 * kk) * 4], &gv[(2 * kk + 1) * 4], a[kk]);
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          c_to_a_split3(&gv[(2 * kk) * 4], &gv[(2 * kk + 1) * 4], a[kk]);
      }
    }
    if constexpr (!kProbeNoGrad) {
      const uint32_t sb = ring + (i % kWgStages) * kWgStage;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int p = 2; p >= 0; --p)  // smallest part first
          wgmma_m64n128k16_rs</*kTransB=*/1>(acc, a[kk][p],
                                             sw128_desc(sb + kk * 16 * 128, kWgRows * 128, 1024),
                                             i > 0 || kk > 0 || p < 2);
      wgmma_commit();
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // keeps the epilogue alive; finite, not a gradient
        uint32_t x = 0u;
#pragma unroll
        for (int p = 0; p < 3; ++p)
#pragma unroll
          for (int r = 0; r < 4; ++r) x ^= a[kk][p][r];
        acc[kk] += (x & 1u) ? 1.f : 0.f;
      }
    }
  };
  auto keep_a = [&] {  // the previous tile's G T products have completed: a may change
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int p = 0; p < 3; ++p)
#pragma unroll
        for (int r = 0; r < 4; ++r) reg_fence(a[kk][p][r]);
  };
  // kV3: tile i's epilogue and products one k16 step kk at a time. Commit groups in order:
  // ... S(i), G(i-1, kk 0..3), S(i+1), G(i, 0..kk-1). Before a[kk] is rewritten, G(i-1, kk)
  // (and with it S(i)) must be complete: at most 4 later groups pending (3 on the last tile,
  // which issues no S(i+1)); tile 0 has no G(-1): its first step waits for S(0) alone.
  auto finish3 = [&](float(&s)[32], int i, bool last_tile) {
    static_assert(!kV3 || (kV2 && !kProbeNoGrad), "kV3 is kV2 with the products");
    const float* side = reinterpret_cast<const float*>(smem + ring_off +
                                                       (i % kWgStages) * kWgStage + kWgTile);
    const uint32_t sb = ring + (i % kWgStages) * kWgStage;
    const float* dis = side + wg * kWgRows;  // dq: dI of this warpgroup's row
    const int key0 = (kt0 + i) * kWgRows;
    bool in0 = false, in1 = false;  // dk: keys k0, k1 in row t's window
    float g0 = 0.f, g1 = 0.f;
    if constexpr (kDk) {
      const int t = tmin + stream + kDkStreams * i;
      const Window wt = row_window(ks, ke, t, s_q, s_kv);
      const int k0 = s0 + warp * 16 + gid, k1 = k0 + 8;
      in0 = k0 >= wt.lo && k0 < wt.hi, in1 = k1 >= wt.lo && k1 < wt.hi;
      g0 = in0 ? side[k0 - s0] : 0.f, g1 = in1 ? side[k1 - s0] : 0.f;
    }
    const float* ws = side + kWgRows;
    (void)dis, (void)key0, (void)ws;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if (kk == 0 && i == 0) {
        if (last_tile) wgmma_wait<0>();
        else wgmma_wait<1>();
      } else if (last_tile) {
        wgmma_wait<3>();
      } else {
        wgmma_wait<4>();
      }
      if (kk == 0) reg_fence(s);
#pragma unroll
      for (int p = 0; p < 3; ++p)
#pragma unroll
        for (int r = 0; r < 4; ++r) reg_fence(a[kk][p][r]);
      if constexpr (!kDk) {
        if (fact) {
          uint32_t pr[2][3][2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int nt = 2 * kk + u;
            const int kl = nt * 8 + 2 * t4, key = key0 + kl;
            const bool i0 = key >= win.lo && key < win.hi;
            const bool i1 = key + 1 >= win.lo && key + 1 < win.hi;
            const float h0v = i0 ? dis[kl] : 0.f, h1v = i1 ? dis[kl + 1] : 0.f;
            const float x0 = s[nt * 4], x1 = s[nt * 4 + 1], x2 = s[nt * 4 + 2], x3 = s[nt * 4 + 3];
            dw0 += i0 ? h0v * relu(x0) : 0.f;
            dw0 += i1 ? h1v * relu(x1) : 0.f;
            dw1 += i0 ? h0v * relu(x2) : 0.f;
            dw1 += i1 ? h1v * relu(x3) : 0.f;
            uint32_t p3[3];
            split3_x2(h0v, h1v, p3[0], p3[1], p3[2]);
            const uint32_t m0 = (x0 > 0.f ? 0x0000ffffu : 0u) | (x1 > 0.f ? 0xffff0000u : 0u);
            const uint32_t m1 = (x2 > 0.f ? 0x0000ffffu : 0u) | (x3 > 0.f ? 0xffff0000u : 0u);
#pragma unroll
            for (int p = 0; p < 3; ++p) pr[u][p][0] = p3[p] & m0, pr[u][p][1] = p3[p] & m1;
          }
#pragma unroll
          for (int p = 0; p < 3; ++p) {
            a[kk][p][0] = pr[0][p][0];
            a[kk][p][1] = pr[0][p][1];
            a[kk][p][2] = pr[1][p][0];
            a[kk][p][3] = pr[1][p][1];
          }
        } else {
          float gv[8];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int nt = 2 * kk + u;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int kl = nt * 8 + 2 * t4 + (c & 1), key = key0 + kl;
              const bool in = key >= win.lo && key < win.hi;
              const float g = in ? dis[kl] : 0.f, x = s[nt * 4 + c];
              if (c & 2) dw1 += in ? g * relu(x) : 0.f;
              else dw0 += in ? g * relu(x) : 0.f;
              gv[u * 4 + c] = in ? g * ((c & 2) ? w1 : w0) * (x > 0.f ? 1.f : 0.f) : 0.f;
            }
          }
          c_to_a_split3_x2(&gv[0], &gv[4], a[kk]);
        }
      } else {
        float gv[8];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int nt = 2 * kk + u;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int h = nt * 8 + 2 * t4 + (c & 1);
            const bool in = (c & 2) ? in1 : in0;
            const float x = s[nt * 4 + c];
            gv[u * 4 + c] = in ? ((c & 2) ? g1 : g0) * ws[h] * (x > 0.f ? 1.f : 0.f) : 0.f;
          }
        }
        c_to_a_split3_x2(&gv[0], &gv[4], a[kk]);
      }
      wgmma_fence();
#pragma unroll
      for (int p = 2; p >= 0; --p)  // smallest part first
        wgmma_m64n128k16_rs</*kTransB=*/1>(acc, a[kk][p],
                                           sw128_desc(sb + kk * 16 * 128, kWgRows * 128, 1024),
                                           i > 0 || kk > 0 || p < 2);
      wgmma_commit();
    }
  };
  // Iteration i < n-1: tile i+1 made visible (and the stage of tile i-2, whose products completed
  // before iteration i-1's wait, refilled with tile i+3); S(i+1) issued; wait until only S(i+1)
  // may be pending (S(i) and the G T products of tile i-1 done); tile i's epilogue and products.
  // kV3: the waits are finish3's (G(i-2) completed before iteration i-1 ended: its last step
  // waited for G(i-2, 3)).
  auto step = [&](int i, float(&cur)[32], float(&nxt)[32]) {
    cp_async_wait<kWgStages - 4>();
    fence_proxy_async();
    __syncthreads();
    load_tile(i + kWgStages - 2);
    issue_s(nxt, i + 1);
    if constexpr (kV3) {
      finish3(cur, i, false);
    } else {
      wgmma_wait<1>();
      keep_a();
      reg_fence(cur);
      finish(cur, i);
    }
  };
  auto last = [&](int i, float(&cur)[32]) {  // tile n-1: nothing left to load or issue
    if constexpr (kV3) {
      finish3(cur, i, true);
    } else {
      wgmma_wait<0>();
      keep_a();
      reg_fence(cur);
      finish(cur, i);
    }
  };
  // All tiles: acc (and dw0 / dw1) complete, every cp.async landed. Straight-line twice at most
  // (kV2 dq/dw: a second, unfactored pass when the first overflowed; a loop around the
  // pipeline made ptxas serialise the wgmma chain, C7515).
  auto run_tiles = [&] {
#pragma unroll
    for (int i = 0; i < kWgStages - 2; ++i) load_tile(i);  // F joins the first group
    cp_async_wait<kWgStages - 3>();
    fence_proxy_async();
    __syncthreads();  // F and tile 0 visible
    if (n > 0) {
      float s_a[32], s_b[32];
      issue_s(s_a, 0);
      int i = 0;
      for (; i + 2 < n; i += 2) {  // straight-line pairs: S(i) is in flight in s_a at the head
        step(i, s_a, s_b);
        step(i + 1, s_b, s_a);
      }
      if (n - i == 2) {
        step(i, s_a, s_b);
        last(i + 1, s_b);
      } else {
        last(i, s_a);
      }
      wgmma_wait<0>();
      reg_fence(acc);
      keep_a();
    } else {
#pragma unroll
      for (int j = 0; j < 64; ++j) acc[j] = 0.f;
    }
    cp_async_wait_all();
  };
  run_tiles();
  if constexpr (kV2 && !kDk) {
    if (fact) {
      bool bad = false;
#pragma unroll
      for (int j = 0; j < 64; ++j) {
        const float y = acc[j] * ((j & 2) ? w1 : w0);
        bad |= !isfinite(acc[j]) || !isfinite(y);
      }
      if (__syncthreads_or(bad ? 1 : 0) != 0) {  // also: every thread is done with the ring
        fact = false;
        dw0 = dw1 = 0.f;
        run_tiles();
      } else {
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] *= (j & 2) ? w1 : w0;
      }
    }
  }

  if constexpr (!kDk) {
    if (my_t >= s_q) return;
    const int h0 = warp * 16 + gid, h1 = h0 + 8;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      const int col = nt * 8 + 2 * t4;
      if (col >= d) continue;
      if (h0 < H)
        *reinterpret_cast<uint32_t*>(grad + (static_cast<size_t>(my_t) * H + h0) * d + col) =
            pack_bf16(acc[nt * 4], acc[nt * 4 + 1]);
      if (h1 < H)
        *reinterpret_cast<uint32_t*>(grad + (static_cast<size_t>(my_t) * H + h1) * d + col) =
            pack_bf16(acc[nt * 4 + 2], acc[nt * 4 + 3]);
    }
    dw0 += __shfl_xor_sync(0xffffffffu, dw0, 1);
    dw0 += __shfl_xor_sync(0xffffffffu, dw0, 2);
    dw1 += __shfl_xor_sync(0xffffffffu, dw1, 1);
    dw1 += __shfl_xor_sync(0xffffffffu, dw1, 2);
    if (t4 == 0) {
      if (h0 < H) dw[static_cast<size_t>(my_t) * H + h0] = dw0;
      if (h1 < H) dw[static_cast<size_t>(my_t) * H + h1] = dw1;
    }
  } else {
    // dk = (rank 0: warpgroup 0 + warpgroup 1) + (rank 1: warpgroup 0 + warpgroup 1), through
    // shared memory and the cluster's distributed shared memory (the rings are free: every
    // product has completed and the barrier orders their last reads before the writes).
    (void)dw0; (void)dw1;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const bool rank0 = cluster.block_rank() == 0;
    __syncthreads();
    float* x = reinterpret_cast<float*>(smem + kWgTile);  // [64 rows][128 cols] fp32, 32 KB
    const int r0 = warp * 16 + gid;
    if (wg == 1) {
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int col = nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(x + r0 * 128 + col) = make_float2(acc[nt * 4], acc[nt * 4 + 1]);
        *reinterpret_cast<float2*>(x + (r0 + 8) * 128 + col) =
            make_float2(acc[nt * 4 + 2], acc[nt * 4 + 3]);
      }
    }
    __syncthreads();
    if (wg == 0) {  // this CTA's sum, kept in acc; rank 1 leaves it in x for rank 0
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int col = nt * 8 + 2 * t4;
        float2* y0 = reinterpret_cast<float2*>(x + r0 * 128 + col);
        float2* y1 = reinterpret_cast<float2*>(x + (r0 + 8) * 128 + col);
        acc[nt * 4] += y0->x, acc[nt * 4 + 1] += y0->y;
        acc[nt * 4 + 2] += y1->x, acc[nt * 4 + 3] += y1->y;
        if (!rank0) {
          *y0 = make_float2(acc[nt * 4], acc[nt * 4 + 1]);
          *y1 = make_float2(acc[nt * 4 + 2], acc[nt * 4 + 3]);
        }
      }
    }
    cluster.sync();  // rank 1's sum visible to rank 0
    if (rank0 && wg == 0) {
      const float* xr = cluster.map_shared_rank(x, 1);
      const int k0 = s0 + r0, k1 = k0 + 8;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const int col = nt * 8 + 2 * t4;
        if (col >= d) continue;
        const float2 y0 = *reinterpret_cast<const float2*>(xr + r0 * 128 + col);
        const float2 y1 = *reinterpret_cast<const float2*>(xr + (r0 + 8) * 128 + col);
        if (k0 < s_kv)
          *reinterpret_cast<uint32_t*>(grad + static_cast<size_t>(k0) * d + col) =
              pack_bf16(acc[nt * 4] + y0.x, acc[nt * 4 + 1] + y0.y);
        if (k1 < s_kv)
          *reinterpret_cast<uint32_t*>(grad + static_cast<size_t>(k1) * d + col) =
              pack_bf16(acc[nt * 4 + 2] + y1.x, acc[nt * 4 + 3] + y1.y);
      }
    }
    cluster.sync();  // rank 1's shared memory stays until rank 0 has read it
  }
}

template <bool kProbeNoGrad, bool kV2 = false, bool kV3 = false>
__global__ void __launch_bounds__(kThreads, 1)
    indexer_bwd_dq_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                const float* __restrict__ w, const int64_t* __restrict__ ks,
                                const int64_t* __restrict__ ke, const float* __restrict__ d_scores,
                                int s_q, int H, int d, int s_kv, bf16* __restrict__ dq,
                                float* __restrict__ dw) {
  indexer_bwd_wgmma<false, kProbeNoGrad, kV2, kV3>(q, k, w, ks, ke, d_scores, s_q, H, d, s_kv, dq,
                                                   dw);
}

template <bool kProbeNoGrad, bool kV2 = false, bool kV3 = false>
__global__ void __cluster_dims__(kDkCluster, 1, 1) __launch_bounds__(kThreads, 1)
    indexer_bwd_dk_wgmma_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                const float* __restrict__ w, const int64_t* __restrict__ ks,
                                const int64_t* __restrict__ ke, const float* __restrict__ d_scores,
                                int s_q, int H, int d, int s_kv, bf16* __restrict__ dk,
                                float* __restrict__ dw) {
  indexer_bwd_wgmma<true, kProbeNoGrad, kV2, kV3>(q, k, w, ks, ke, d_scores, s_q, H, d, s_kv, dk,
                                                  dw);
}

void check_indexer_sizes(const char* where, int64_t s_q, int64_t H, int64_t d, int64_t s_kv) {
  auto bad = [&](const char* arg, int64_t got, const std::string& want) {
    throw std::invalid_argument(std::string(where) + ": argument '" + arg + "' got " +
                                std::to_string(got) + ", expected " + want);
  };
  if (s_q < 0 || s_q > INT32_MAX) bad("s_q", s_q, "0 <= s_q <= 2^31-1");
  if (s_kv < 0 || s_kv > INT32_MAX - kDkKeys) bad("s_kv", s_kv, "0 <= s_kv <= 2^31-129");
  if (H < 0 || H > kMaxHeads) bad("H_I", H, "0 <= H_I <= 64 (cuda indexer kernel limit)");
  if (d < 0 || d > kMaxDim || d % 8 != 0)
    bad("d_I", d, "0 <= d_I <= 128, a multiple of 8 (cuda indexer kernel limit)");
}

}  // namespace

int64_t indexer_max_heads() { return kMaxHeads; }
int64_t indexer_max_dim() { return kMaxDim; }

void indexer_scores_device(const uint16_t* q_idx, const uint16_t* k_idx, const float* w,
                           const int64_t* ks, const int64_t* ke, int64_t s_q, int64_t H,
                           int64_t d, int64_t s_kv, float* scores, cudaStream_t stream,
                           IndexerKernel kernel) {
  const char* where = "indexer_scores_device";
  check_indexer_sizes(where, s_q, H, d, s_kv);
  if (s_q == 0 || s_kv == 0) return;
  const auto* q = reinterpret_cast<const bf16*>(q_idx);
  const auto* k = reinterpret_cast<const bf16*>(k_idx);
  auto launch = [&](auto kernel, int tok, bool q_in_smem) {
    const size_t smem = fwd_smem(tok, q_in_smem);
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>((s_q + tok - 1) / tok), 128 * tok, smem, stream>>>(
        q, k, w, ks, ke, static_cast<int>(s_q), static_cast<int>(H), static_cast<int>(d),
        static_cast<int>(s_kv), scores);
  };
  switch (kernel) {
    case IndexerKernel::Wgmma: launch(indexer_fwd_kernel<FwdPath::WgmmaRs, 2, false>, 2, false); break;
    case IndexerKernel::Wgmma3: launch(indexer_fwd_kernel<FwdPath::WgmmaSs, 3, false>, 3, true); break;
    case IndexerKernel::Mma: launch(indexer_fwd_kernel<FwdPath::Mma, 2, false>, 2, false); break;
    case IndexerKernel::ProbeNoEpilogue:
      launch(indexer_fwd_kernel<FwdPath::WgmmaRs, 2, true>, 2, false);
      break;
    case IndexerKernel::ProbeNoEpilogue3:
      launch(indexer_fwd_kernel<FwdPath::WgmmaSs, 3, true>, 3, true);
      break;
  }
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

void indexer_scores_backward_device(const uint16_t* q_idx, const uint16_t* k_idx, const float* w,
                                    const int64_t* ks, const int64_t* ke, const float* d_scores,
                                    int64_t s_q, int64_t H, int64_t d, int64_t s_kv,
                                    uint16_t* dq_idx, uint16_t* dk_idx, float* dw,
                                    cudaStream_t stream, IndexerBwdKernel kernel) {
  const char* where = "indexer_scores_backward_device";
  check_indexer_sizes(where, s_q, H, d, s_kv);
  const auto* q = reinterpret_cast<const bf16*>(q_idx);
  const auto* k = reinterpret_cast<const bf16*>(k_idx);
  auto* dq = reinterpret_cast<bf16*>(dq_idx);
  auto* dk = reinterpret_cast<bf16*>(dk_idx);
  const int sq = static_cast<int>(s_q), h = static_cast<int>(H), dd = static_cast<int>(d),
            skv = static_cast<int>(s_kv);
  auto launch = [&](auto kern, unsigned blocks, size_t smem, bf16* grad, float* dw_out) {
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
    kern<<<blocks, kThreads, smem, stream>>>(q, k, w, ks, ke, d_scores, sq, h, dd, skv, grad,
                                             dw_out);
    DSA_CUDA_CHECK(where, cudaGetLastError());
  };
  const unsigned dq_blocks = static_cast<unsigned>((s_q + 1) / 2);
  if (kernel == IndexerBwdKernel::Mma) {
    if (s_q > 0) {
      DSA_CUDA_CHECK(where, cudaFuncSetAttribute(indexer_bwd_dq_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kBwdSmem)));
      indexer_bwd_dq_kernel<<<dq_blocks, kThreads, kBwdSmem, stream>>>(
          q, k, w, ks, ke, d_scores, sq, h, dd, skv, dq, dw);
      DSA_CUDA_CHECK(where, cudaGetLastError());
    }
    if (s_kv > 0) {
      DSA_CUDA_CHECK(where, cudaFuncSetAttribute(indexer_bwd_dk_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kDkSmem)));
      indexer_bwd_dk_kernel<<<static_cast<unsigned>((s_kv + kDkKeys - 1) / kDkKeys), kThreads,
                              kDkSmem, stream>>>(q, k, w, ks, ke, d_scores, sq, h, dd, skv, dk);
      DSA_CUDA_CHECK(where, cudaGetLastError());
    }
    return;
  }
  const bool probe = kernel == IndexerBwdKernel::ProbeNoGradProducts;
  const unsigned dk_blocks = static_cast<unsigned>((s_kv + kWgRows - 1) / kWgRows * kDkCluster);
  const bool v2 = kernel == IndexerBwdKernel::WgmmaFactored ||
                  kernel == IndexerBwdKernel::ProbeFactoredDqOnly ||
                  kernel == IndexerBwdKernel::ProbeFactoredDkOnly;
  const bool v3 = kernel == IndexerBwdKernel::WgmmaOverlap ||
                  kernel == IndexerBwdKernel::ProbeOverlapDqOnly ||
                  kernel == IndexerBwdKernel::ProbeOverlapDkOnly;
  const bool dq_on = kernel != IndexerBwdKernel::ProbeDkOnly &&
                     kernel != IndexerBwdKernel::ProbeFactoredDkOnly &&
                     kernel != IndexerBwdKernel::ProbeOverlapDkOnly;
  const bool dk_on = kernel != IndexerBwdKernel::ProbeDqOnly &&
                     kernel != IndexerBwdKernel::ProbeFactoredDqOnly &&
                     kernel != IndexerBwdKernel::ProbeOverlapDqOnly;
  if (s_q > 0 && dq_on) {
    if (probe) launch(indexer_bwd_dq_wgmma_kernel<true>, dq_blocks, kWgSmemDq, dq, dw);
    else if (v3)
      launch(indexer_bwd_dq_wgmma_kernel<false, true, true>, dq_blocks, kWgSmemDq, dq, dw);
    else if (v2) launch(indexer_bwd_dq_wgmma_kernel<false, true>, dq_blocks, kWgSmemDq, dq, dw);
    else launch(indexer_bwd_dq_wgmma_kernel<false>, dq_blocks, kWgSmemDq, dq, dw);
  }
  if (s_kv > 0 && dk_on) {
    if (probe) launch(indexer_bwd_dk_wgmma_kernel<true>, dk_blocks, kWgSmemDk, dk, nullptr);
    else if (v3)
      launch(indexer_bwd_dk_wgmma_kernel<false, true, true>, dk_blocks, kWgSmemDk, dk, nullptr);
    else if (v2) launch(indexer_bwd_dk_wgmma_kernel<false, true>, dk_blocks, kWgSmemDk, dk, nullptr);
    else launch(indexer_bwd_dk_wgmma_kernel<false>, dk_blocks, kWgSmemDk, dk, nullptr);
  }
}

}  // namespace dsa::cuda
