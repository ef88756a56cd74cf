// Sparse MLA backward on the tensor cores (SPEC §5, §6): dq, dkv (fp32 accumulation), dsink.
//
// Main kernel: one thread block (8 warps) per (query row, group of 64 heads), as the one-pass
// forward (sparse_mla_onepass.cu): the heads are the M dimension of the head-side products.
// Q and dout of the group stay in shared memory; the row's slots are walked in tiles of 32,
// their kv rows gathered with cp.async (16-byte chunks, XOR-swizzled for ldmatrix; invalid
// slots are never dereferenced: zero rows, masked). Per tile, with bf16 mma.sync m16n8k16 and
// fp32 accumulation:
//   S = Q K^T and dP = dout V^T (64 heads x 32 slots; warp w: heads 16(w%4).., slots 16(w/4)..),
//   p = exp(sm_scale S - lse) r (r = 1 / (1 + exp(sink - lse)), the forward's lse recomputes P),
//   dS = p (dP - Δ) with Δ = rowsum(out · dout) from the out the forward returned,
//   P and dS to shared memory as bf16: by default (SparseMlaBwdRounding::Bf16) each rounded
//   once, sm_scale applied to the fp32 products (the 16-bit roundings a FlashMLA-style backward
//   makes and the SPEC §9 floors model since F4); HiLo: P and sm_scale·dS as bf16 hi + lo
//   pairs (about 16 significant bits, every dq / dkv product run twice; the kernel of
//   sessions 9-11, from before the floors modelled those roundings),
//   dq += dS K                 (64 heads x the warp's strip of d_qk, fp32 registers, all tiles),
//   dKV_tile = sm_scale dS^T Q + P^T dout (32 slots x the warp's strip, 3 n8 tiles at a time),
// and dKV_tile goes either (fast) into dkv by fp32 reductions (Bf16: one 16-byte
// red.global.add.v4.f32 per lane and n8 tile, neighbouring lanes trading halves; HiLo: scalar
// atomicAdd), or (deterministic) to a scratch row per (query row, head group, slot), reduced
// afterwards per key row in (query row, slot, head group) order over a stable radix sort of
// the (key id, pair) list: bitwise reproducible.
// dsink[h] = -Σ_t exp(sink - L) Δ: one term per (t, h) in scratch, summed per head in a fixed
// order (both modes). Empty rows (no valid slot): dq 0, no dkv or dsink contribution.
//
// Shared memory at d_qk 576, d_v 512: Q 72 KiB, dout 64 KiB, two kv tiles of 36 KiB (tile
// it+1 is gathered while tile it is computed), P and dS (hi | lo; Bf16 uses the hi half) 8 KiB
// each, ids and row statistics: 230,400 bytes (one block per SM; two barriers per tile).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dsa/cuda/kernels.h"
#include "hopper_primitives.cuh"
#include "sparse_mla_internal.h"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 256;        // 8 warps
constexpr int kHeads = 64;           // heads per block (M of S, dP and dq; K of dKV)
constexpr int kTile = 32;            // slots per tile
constexpr int kMaxDp = 576;          // largest d_qk (rounded up to 64)
constexpr int kMaxDvp = 512;         // largest d_v (rounded up to 64)
constexpr int kMaxNt = kMaxDp / 64;  // n8 tiles in a warp's strip of d_qk (8 warps)
constexpr int kChunkNt = 3;          // n8 tiles of dKV_tile in registers at a time
constexpr float kLog2e = 1.4426950408889634f;
constexpr int64_t kPartialBudget = int64_t{2} << 30;  // deterministic scratch rows, bytes

// ----------------------------------------------------------------- primitives

using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_all;
using detail::ldsm_x2_t;
using detail::ldsm_x4;
using detail::ldsm_x4_t;
using detail::mma16816;
using detail::smem_u32;
using detail::st_shared_zero16;

/// hi = bf16(x), lo = bf16(x - hi) for a pair (packed as a bf16x2 each): hi + lo keeps about
/// 16 significant bits of x.
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// *p += (a, b, c, d) as one 16-byte fp32 reduction, p 16-byte aligned global memory
/// (red.global.add.v4.f32, sm_90; PTX ISA "red"). Each element's add is atomic; the order of
/// the adds to one address is not fixed.
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}
/// As red_add_v4 with an L2 cache policy (red ... .L2::cache_hint; PTX ISA "red").
__device__ __forceinline__ void red_add_v4_hint(float* p, float a, float b, float c, float d,
                                                uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n" ::"l"(p),
               "f"(a), "f"(b), "f"(c), "f"(d), "l"(policy)
               : "memory");
}

/// The kv id of slot `slot` of the row, or -1 when the slot is invalid (SPEC §4).
__device__ __forceinline__ int slot_id(const int32_t* irow, int64_t slot, int64_t lim, int s_kv) {
  if (slot >= lim) return -1;
  const int v = irow[slot];
  return (v >= 0 && v < s_kv) ? v : -1;
}

// ----------------------------------------------------------------- shared-memory layout

struct BwdLayout {
  int dp, dvp;             // d_qk and d_v rounded up to 64 (whole 8-chunk swizzle groups)
  uint32_t q_row, do_row;  // bytes per Q / kv row and per dout row
  uint32_t off_do, off_k, off_p, off_ds, off_ids, off_stat, total;
};

__host__ __device__ inline BwdLayout bwd_layout(int64_t d_qk, int64_t d_v) {
  BwdLayout L{};
  L.dp = static_cast<int>((d_qk + 63) / 64 * 64);
  L.dvp = static_cast<int>((d_v + 63) / 64 * 64);
  L.q_row = static_cast<uint32_t>(L.dp) * 2u;
  L.do_row = static_cast<uint32_t>(L.dvp) * 2u;
  L.off_do = kHeads * L.q_row;             // Q   [kHeads][dp]
  L.off_k = L.off_do + kHeads * L.do_row;  // dO  [kHeads][dvp]
  L.off_p = L.off_k + 2 * kTile * L.q_row;  // K   [2 stages][kTile][dp]
  // P and sm_scale·dS as bf16 hi + lo parts: a 128-byte row per head, chunks 0-3 the hi
  // parts of slots 0..31, chunks 4-7 the lo parts (8 chunks: the usual c ^ (row & 7) swizzle).
  L.off_ds = L.off_p + kHeads * 128;      // P   [kHeads][hi 32 | lo 32] bf16
  L.off_ids = L.off_ds + kHeads * 128;    // dS  [kHeads][hi 32 | lo 32] bf16
  L.off_stat = L.off_ids + 2 * kTile * 4;  // ids [2 stages][kTile]
  L.total = L.off_stat + 3 * kHeads * 4;  // lse, sink factor r, Δ per head
  return L;
}

// ----------------------------------------------------------------- main kernel

// kHiLo: P and sm_scale·dS as bf16 hi + lo pairs (SparseMlaBwdRounding::HiLo); else P and dS
// rounded once to bf16 (Bf16), sm_scale applied to the fp32 products. kSkip (timing variants
// only, results wrong): bit 1 no S / dP products, 2 no dq product, 4 no dkv product and
// stores, 8 no dkv stores (atomics).
// kOpt (speed only, same arithmetic; Bf16 runs with 3, HiLo with 0): bit 1 staggers the
// products (warps 4-7 run the dkv product and its reductions before the dq product, so half the
// warps compute while the other half's reductions drain), bit 2 adds L2 cache policies (Q /
// dout loads evict-first, the dkv reductions evict-last: dkv stays in L2 while Q / dout stream
// through).
template <bool kFast, bool kHiLo, int kSkip = 0, int kOpt = 0>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_bwd_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                          const int32_t* __restrict__ indices,
                          const int32_t* __restrict__ topk_length,
                          const float* __restrict__ attn_sink, const uint16_t* __restrict__ out,
                          const float* __restrict__ lse, const uint16_t* __restrict__ dout, int h_q,
                          int d_qk, int s_kv, int64_t k, int d_v, float sm_scale, int64_t t0,
                          float* __restrict__ dq, float* __restrict__ dkv,
                          float* __restrict__ dsink_terms, float* __restrict__ partial) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdLayout L = bwd_layout(d_qk, d_v);
  const uint32_t sb = smem_u32(smem);
  int* ids_s = reinterpret_cast<int*>(smem + L.off_ids);
  float* lse_s = reinterpret_cast<float*>(smem + L.off_stat);  // lse (natural log)
  float* r_s = lse_s + kHeads;                                 // sink factor
  float* delta_s = r_s + kHeads;                               // Δ
  uint32_t* p_w = reinterpret_cast<uint32_t*>(smem + L.off_p);
  uint32_t* ds_w = reinterpret_cast<uint32_t*>(smem + L.off_ds);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_groups = (h_q + kHeads - 1) / kHeads;
  const int64_t lt = blockIdx.x / n_groups;  // row within this launch's chunk
  const int grp = static_cast<int>(blockIdx.x % n_groups);
  const int64_t t = t0 + lt;
  const int h0 = grp * kHeads;
  int64_t lim = k;
  if (topk_length) lim = min(lim, static_cast<int64_t>(max(topk_length[t], 0)));
  const int32_t* irow = indices + t * k;

  // SPEC §6: a row without a valid slot has dq 0 and no dkv / dsink contribution.
  int mine = 0;
  for (int64_t j = tid; j < lim; j += kThreads) {
    const int v = irow[j];
    mine |= (v >= 0 && v < s_kv) ? 1 : 0;
  }
  if (__syncthreads_or(mine) == 0) {
    for (int i = tid; i < kHeads * d_qk; i += kThreads) {
      const int r = i / d_qk, c = i - r * d_qk;
      if (h0 + r < h_q) dq[(t * h_q + h0 + r) * static_cast<int64_t>(d_qk) + c] = 0.f;
    }
    if (dsink_terms && tid < kHeads && h0 + tid < h_q) dsink_terms[t * h_q + h0 + tid] = 0.f;
    return;
  }

  const uint64_t pol_first = (kOpt & 2) ? detail::l2_policy_evict_first() : 0;
  const uint64_t pol_last = (kOpt & 2) ? detail::l2_policy_evict_last() : 0;
  // Q and dout of the group (rows past h_q and columns past d_qk / d_v zero).
  const int q_chunks = L.dp / 8, q_src = d_qk / 8;
  const int do_chunks = L.dvp / 8, do_src = d_v / 8;
  for (int i = tid; i < kHeads * q_chunks; i += kThreads) {
    const int r = i / q_chunks, c = i - r * q_chunks;
    const uint32_t dst = sb + r * L.q_row + ((c ^ (r & 7)) << 4);
    if (h0 + r < h_q && c < q_src && (kOpt & 2))
      detail::cp_async16_hint(dst, q + ((t * h_q + h0 + r) * static_cast<int64_t>(d_qk) + c * 8),
                              pol_first);
    else if (h0 + r < h_q && c < q_src)
      cp_async16(dst, q + ((t * h_q + h0 + r) * static_cast<int64_t>(d_qk) + c * 8));
    else
      st_shared_zero16(dst);
  }
  for (int i = tid; i < kHeads * do_chunks; i += kThreads) {
    const int r = i / do_chunks, c = i - r * do_chunks;
    const uint32_t dst = sb + L.off_do + r * L.do_row + ((c ^ (r & 7)) << 4);
    if (h0 + r < h_q && c < do_src && (kOpt & 2))
      detail::cp_async16_hint(dst, dout + ((t * h_q + h0 + r) * static_cast<int64_t>(d_v) + c * 8),
                              pol_first);
    else if (h0 + r < h_q && c < do_src)
      cp_async16(dst, dout + ((t * h_q + h0 + r) * static_cast<int64_t>(d_v) + c * 8));
    else
      st_shared_zero16(dst);
  }
  cp_async_commit();

  // Row statistics (warp w: heads 8w..8w+7): Δ = out · dout in a fixed order, lse, the sink
  // factor r = exp(lse - L) and the dsink term exp(sink - L) Δ (stable for sink = ±inf).
  for (int i = 0; i < 8; ++i) {
    const int r = 8 * warp + i, h = h0 + r;
    float dl = 0.f, lsv = INFINITY, rf = 1.f;  // padded head: p = 0 (also masked below)
    if (h < h_q) {
      const int64_t at = (t * h_q + h) * static_cast<int64_t>(d_v);
      float a = 0.f;
      for (int c = lane; c < d_v; c += 32)
        a = fmaf(bf16_bits_to_float(out[at + c]), bf16_bits_to_float(dout[at + c]), a);
      dl = warp_sum(a);
      const float ls = lse[t * h_q + h];
      lsv = ls;
      if (attn_sink) {
        const float sk = attn_sink[h];
        rf = 1.f / (1.f + expf(sk - ls));
        if (lane == 0 && dsink_terms) dsink_terms[t * h_q + h] = dl / (1.f + expf(ls - sk));
      }
    }
    if (lane == 0) {
      lse_s[r] = lsv;
      r_s[r] = rf;
      delta_s[r] = dl;
    }
  }

  const int n_tiles = static_cast<int>((lim + kTile - 1) / kTile);
  // Gather: thread tid copies row tid/8 of a tile, chunks tid%8 + 8i.
  const int ld_row = tid >> 3, ld_sub = tid & 7;
  // Fragment addressing. Every shared row a lane hands to ldmatrix has (row & 7) ==
  // (lane & 7), so the swizzle of a logical chunk c is c ^ (lane & 7) throughout.
  const int g = lane >> 2, c4 = lane & 3, sw = lane & 7;
  const int ms = warp & 3, nh = warp >> 2;               // S / dP: heads 16ms.., slots 16nh..
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // A rows; rows of trans B loads
  const int a_cx = lane >> 4;                            // A chunk offset
  const int b_row = (lane & 7) + (lane >> 4) * 8;        // B rows; rows of trans A loads
  const int b_cx = (lane >> 3) & 1;                      // their chunk offset
  const uint32_t q_base = sb, do_base = sb + L.off_do, k_base = sb + L.off_k;
  const uint32_t p_base = sb + L.off_p, ds_base = sb + L.off_ds;
  const int nt = L.dp / 64;     // n8 tiles in a warp's strip of d_qk
  const int strip = nt * warp;  // first 8-column chunk of the strip
  const int dv_chunks = L.dvp / 8;
  const int ksq = L.dp / 16, ksv = L.dvp / 16;
  const int r0 = 16 * ms + g, r1 = r0 + 8;  // S rows (local heads) of this thread
  const bool hv0 = h0 + r0 < h_q, hv1 = h0 + r1 < h_q;

  float acc_dq[4][kMaxNt][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < kMaxNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[mt][j][e] = 0.f;

  // Gather of tile `tile` into stage `st` (K rows and ids): thread tid copies row tid/8,
  // chunks tid%8 + 8i; invalid slots are zero rows, never read through.
  auto gather = [&](int tile, int st) {
    const int r = ld_row;
    const int id = slot_id(irow, static_cast<int64_t>(tile) * kTile + r, lim, s_kv);
    if (ld_sub == 0) ids_s[st * kTile + r] = id;
    const uint32_t rb = k_base + (st * kTile + r) * L.q_row;
    const uint16_t* src = kv + static_cast<int64_t>(id < 0 ? 0 : id) * d_qk;
    for (int c = ld_sub; c < q_chunks; c += 8) {
      const uint32_t dst = rb + ((c ^ (r & 7)) << 4);
      if (id >= 0 && c < q_src)
        cp_async16(dst, src + c * 8);
      else
        st_shared_zero16(dst);
    }
    cp_async_commit();
  };
  gather(0, 0);

  // Two stages: tile it+1 is gathered while tile it is computed. One barrier at the top of a
  // tile (its gather landed; every warp is done with tile it-1, so stage it+1 and P / dS are
  // free) and one after P / dS are written.
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    cp_async_wait_all();
    __syncthreads();  // tile, ids (and on the first tile Q, dout, statistics) visible
    if (it + 1 < n_tiles) gather(it + 1, stage ^ 1);
    const int* ids_t = ids_s + stage * kTile;
    const uint32_t kt_base = k_base + stage * kTile * L.q_row;

    // S = Q K^T and dP = dout V^T: 16 heads x 16 slots per warp.
    float s[2][4], dpv[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dpv[j][e] = 0.f;
    if (!(kSkip & 1)) {
      const uint32_t k0 = kt_base + (16 * nh + b_row) * L.q_row;
      const uint32_t qa = q_base + (16 * ms + a_row) * L.q_row;
      const uint32_t da = do_base + (16 * ms + a_row) * L.do_row;
      if constexpr (kHiLo) {
#pragma unroll 2
        for (int ks = 0; ks < ksq; ++ks) {
          uint32_t a[4], b[4];
          ldsm_x4(a, qa + (((2 * ks + a_cx) ^ sw) << 4));
          ldsm_x4(b, k0 + (((2 * ks + b_cx) ^ sw) << 4));
          mma16816(s[0], a, b[0], b[1]);
          mma16816(s[1], a, b[2], b[3]);
        }
        // V = the first d_v columns of K; dout is zero past d_v, so K's columns in
        // [d_v, dvp) add nothing.
#pragma unroll 2
        for (int ks = 0; ks < ksv; ++ks) {
          uint32_t a[4], b[4];
          ldsm_x4(a, da + (((2 * ks + a_cx) ^ sw) << 4));
          ldsm_x4(b, k0 + (((2 * ks + b_cx) ^ sw) << 4));
          mma16816(dpv[0], a, b[0], b[1]);
          mma16816(dpv[1], a, b[2], b[3]);
        }
      } else {
        // One pass over d_qk: the K fragment of a k-step serves S and (its first d_v columns,
        // ks < ksv <= ksq) dP, four independent accumulator chains per warp; each
        // accumulator adds its k-steps in the same order as the two separate passes.
#pragma unroll 2
        for (int ks = 0; ks < ksq; ++ks) {
          uint32_t a[4], b[4];
          ldsm_x4(b, k0 + (((2 * ks + b_cx) ^ sw) << 4));
          ldsm_x4(a, qa + (((2 * ks + a_cx) ^ sw) << 4));
          mma16816(s[0], a, b[0], b[1]);
          mma16816(s[1], a, b[2], b[3]);
          if (ks < ksv) {
            ldsm_x4(a, da + (((2 * ks + a_cx) ^ sw) << 4));
            mma16816(dpv[0], a, b[0], b[1]);
            mma16816(dpv[1], a, b[2], b[3]);
          }
        }
      }
    }

    // p = exp(sm_scale S - lse) r (0 for invalid slots and padded heads), dS = p (dP - Δ);
    // P and dS to shared memory as bf16 ([head][hi | lo], swizzled): Bf16 the hi half only
    // (one rounding each), HiLo P and sm_scale dS as hi + lo parts (~16 bits).
    {
      const float ls0 = lse_s[r0], ls1 = lse_s[r1], rf0 = r_s[r0], rf1 = r_s[r1];
      const float dl0 = delta_s[r0], dl1 = delta_s[r1];
      // p = exp(P - lse) with P = sm_scale S rounded as the forward rounds it (__fmul_rn, no
      // FMA contraction) and P - lse exact near the max: the forward's one-slot row has
      // lse = P exactly, so p = 1 exactly. exp2(fma(S, sm_scale log2 e, -lse log2 e))
      // rounded both products: at logits ~2^18 that moved p by ~1% (golden
      // smla_extreme_row_in_batch, dkv of its one-slot keys, err/bound 4.18).
      auto prob = [&](float sv, float ls, float rf) {
        return exp2f((__fmul_rn(sv, sm_scale) - ls) * kLog2e) * rf;
      };
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = 16 * nh + 8 * j + 2 * c4;
        const bool v0 = ids_t[col] >= 0, v1 = ids_t[col + 1] >= 0;
        float pv[4], dv[4];
        pv[0] = (hv0 && v0) ? prob(s[j][0], ls0, rf0) : 0.f;
        pv[1] = (hv0 && v1) ? prob(s[j][1], ls0, rf0) : 0.f;
        pv[2] = (hv1 && v0) ? prob(s[j][2], ls1, rf1) : 0.f;
        pv[3] = (hv1 && v1) ? prob(s[j][3], ls1, rf1) : 0.f;
        const int chunk = 2 * nh + j;  // hi chunk of these slots; lo chunk is 4 + chunk
        const int w0 = r0 * 32 + c4, w1 = r1 * 32 + c4;
        const int hi0 = (chunk ^ (r0 & 7)) << 2, hi1 = (chunk ^ (r1 & 7)) << 2;
        if constexpr (kHiLo) {
          dv[0] = pv[0] * (dpv[j][0] - dl0) * sm_scale;
          dv[1] = pv[1] * (dpv[j][1] - dl0) * sm_scale;
          dv[2] = pv[2] * (dpv[j][2] - dl1) * sm_scale;
          dv[3] = pv[3] * (dpv[j][3] - dl1) * sm_scale;
          const int lo0 = ((4 + chunk) ^ (r0 & 7)) << 2, lo1 = ((4 + chunk) ^ (r1 & 7)) << 2;
          uint32_t hi, lo;
          split_bf16(pv[0], pv[1], hi, lo);
          p_w[w0 + hi0] = hi;
          p_w[w0 + lo0] = lo;
          split_bf16(pv[2], pv[3], hi, lo);
          p_w[w1 + hi1] = hi;
          p_w[w1 + lo1] = lo;
          split_bf16(dv[0], dv[1], hi, lo);
          ds_w[w0 + hi0] = hi;
          ds_w[w0 + lo0] = lo;
          split_bf16(dv[2], dv[3], hi, lo);
          ds_w[w1 + hi1] = hi;
          ds_w[w1 + lo1] = lo;
        } else {
          // dS = p (dP - Δ) rounded once to bf16 (sm_scale goes on the fp32 products), P
          // rounded once: the 16-bit roundings the SPEC §9 floors model for a FlashMLA-style
          // backward (docs/what-a-pass-means.md, "Sparse MLA backward": u16 b(dS_j), u16 b(p_j)).
          dv[0] = pv[0] * (dpv[j][0] - dl0);
          dv[1] = pv[1] * (dpv[j][1] - dl0);
          dv[2] = pv[2] * (dpv[j][2] - dl1);
          dv[3] = pv[3] * (dpv[j][3] - dl1);
          p_w[w0 + hi0] = detail::pack_bf16(pv[0], pv[1]);
          p_w[w1 + hi1] = detail::pack_bf16(pv[2], pv[3]);
          ds_w[w0 + hi0] = detail::pack_bf16(dv[0], dv[1]);
          ds_w[w1 + hi1] = detail::pack_bf16(dv[2], dv[3]);
        }
      }
    }
    __syncthreads();  // P and dS visible

    // dq += dS K (HiLo: sm_scale dS): all 64 heads x the warp's strip (nt n8 tiles) of d_qk.
    constexpr int kParts = kHiLo ? 2 : 1;  // hi (and lo) parts of P / dS
    auto dq_product = [&]() {
      if (!(kSkip & 2)) {
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          uint32_t bk[kMaxNt][2];
          const uint32_t krow = kt_base + (16 * kk + a_row) * L.q_row;
#pragma unroll
          for (int j = 0; j < kMaxNt; ++j) {
            bk[j][0] = bk[j][1] = 0u;
            if (j < nt) ldsm_x2_t(bk[j], krow + (((strip + j) ^ sw) << 4));
          }
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
            for (int part = 0; part < kParts; ++part) {  // hi, then lo
              uint32_t a[4];
              ldsm_x4(a,
                      ds_base + (16 * mt + a_row) * 128 + (((4 * part + 2 * kk + a_cx) ^ sw) << 4));
#pragma unroll
              for (int j = 0; j < kMaxNt; ++j)
                if (j < nt) mma16816(acc_dq[mt][j], a, bk[j][0], bk[j][1]);
            }
          }
        }
      }

    };

    // dKV_tile = (sm_scale dS)^T Q + P^T dout: 32 slots x the warp's strip, kChunkNt n8
    // tiles at a time (A from the [head][slot] tiles by transposed ldmatrix). Bf16: the dS^T Q
    // sum over all heads first, times sm_scale, then P^T dout added.
    auto dkv_product = [&]() {
      for (int j0 = 0; j0 < nt && !(kSkip & 4); j0 += kChunkNt) {
        float acc[2][kChunkNt][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int jj = 0; jj < kChunkNt; ++jj)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][jj][e] = 0.f;
        bool on_q[kChunkNt], on_o[kChunkNt];
#pragma unroll
        for (int jj = 0; jj < kChunkNt; ++jj) {
          on_q[jj] = j0 + jj < nt;
          on_o[jj] = on_q[jj] && strip + j0 + jj < dv_chunks;
        }
        // One operand pass: A = dS^T (use_p false) or P^T (true) against Q or dout.
        auto pass = [&](bool use_p, bool both) {
#pragma unroll
          for (int kh = 0; kh < kHeads / 16; ++kh) {
            uint32_t bq[kChunkNt][2], bo[kChunkNt][2];
            const uint32_t qrow = q_base + (16 * kh + a_row) * L.q_row;
            const uint32_t orow = do_base + (16 * kh + a_row) * L.do_row;
#pragma unroll
            for (int jj = 0; jj < kChunkNt; ++jj) {
              const int c = strip + j0 + jj;  // 8-column chunk of d_qk
              bq[jj][0] = bq[jj][1] = bo[jj][0] = bo[jj][1] = 0u;
              if ((both || !use_p) && on_q[jj]) ldsm_x2_t(bq[jj], qrow + ((c ^ sw) << 4));
              if ((both || use_p) && on_o[jj]) ldsm_x2_t(bo[jj], orow + ((c ^ sw) << 4));
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
              for (int part = 0; part < kParts; ++part) {  // hi, then lo
                const uint32_t at =
                    (16 * kh + b_row) * 128 + (((4 * part + 2 * mt + b_cx) ^ sw) << 4);
                uint32_t a[4];
                if (both || !use_p) {
                  ldsm_x4_t(a, ds_base + at);
#pragma unroll
                  for (int jj = 0; jj < kChunkNt; ++jj)
                    if (on_q[jj]) mma16816(acc[mt][jj], a, bq[jj][0], bq[jj][1]);
                }
                if (both || use_p) {
                  ldsm_x4_t(a, p_base + at);
#pragma unroll
                  for (int jj = 0; jj < kChunkNt; ++jj)
                    if (on_o[jj]) mma16816(acc[mt][jj], a, bo[jj][0], bo[jj][1]);
                }
              }
            }
          }
        };
        if constexpr (kHiLo) {
          pass(false, true);
        } else {
          pass(false, false);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int jj = 0; jj < kChunkNt; ++jj)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mt][jj][e] *= sm_scale;
          pass(true, false);
        }
        if constexpr ((kSkip & 8) != 0) continue;
        // Out: rows of valid slots only (an invalid slot's row is all zero and has no key).
        if constexpr (kFast && !kHiLo) {
          // One 16-byte reduction per lane and n8 tile: lanes c4 and c4 ^ 1 trade halves, the
          // even lane adding 4 columns of row g, the odd lane 4 columns of row g + 8.
          const bool odd = (c4 & 1) != 0;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int jj = 0; jj < kChunkNt; ++jj) {
              const int col0 = 8 * (strip + j0 + jj);  // warp-uniform
              if (j0 + jj >= nt || col0 >= d_qk) continue;
              const float* x = acc[mt][jj];
              const float s0 = odd ? x[0] : x[2], s1 = odd ? x[1] : x[3];
              const float t0v = __shfl_xor_sync(0xffffffffu, s0, 1);
              const float t1v = __shfl_xor_sync(0xffffffffu, s1, 1);
              const int id = ids_t[16 * mt + g + (odd ? 8 : 0)];
              if (id < 0) continue;
              float* dst = dkv + static_cast<int64_t>(id) * d_qk + col0 + 4 * (c4 >> 1);
              const float4 v = odd ? make_float4(t0v, t1v, x[2], x[3])
                                   : make_float4(x[0], x[1], t0v, t1v);
              if constexpr ((kOpt & 2) != 0)
                red_add_v4_hint(dst, v.x, v.y, v.z, v.w, pol_last);
              else
                red_add_v4(dst, v.x, v.y, v.z, v.w);
            }
          }
        } else {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int sl = 16 * mt + g + 8 * half;
              const int id = ids_t[sl];
              if (id < 0) continue;
#pragma unroll
              for (int jj = 0; jj < kChunkNt; ++jj) {
                const int col = 8 * (strip + j0 + jj) + 2 * c4;  // even; d_qk % 8 == 0
                if (j0 + jj >= nt || col >= d_qk) continue;
                const float x0 = acc[mt][jj][2 * half], x1 = acc[mt][jj][2 * half + 1];
                if (kFast) {
                  float* dst = dkv + static_cast<int64_t>(id) * d_qk + col;
                  atomicAdd(dst, x0);
                  atomicAdd(dst + 1, x1);
                } else {
                  const int64_t row =
                      (lt * n_groups + grp) * k + static_cast<int64_t>(it) * kTile + sl;
                  *reinterpret_cast<float2*>(partial + row * d_qk + col) = make_float2(x0, x1);
                }
              }
            }
          }
        }
      }
    };
    if ((kOpt & 1) && warp >= 4) {
      dkv_product();
      dq_product();
    } else {
      dq_product();
      dkv_product();
    }
  }

  // dq rows of the group's heads (fp32; HiLo: sm_scale is inside dS, Bf16: applied here).
  const float dq_scale = kHiLo ? 1.f : sm_scale;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = h0 + 16 * mt + g + 8 * half;
      if (h >= h_q) continue;
      float* drow = dq + (t * h_q + h) * static_cast<int64_t>(d_qk);
#pragma unroll
      for (int j = 0; j < kMaxNt; ++j) {
        const int col = 8 * (strip + j) + 2 * c4;
        if (j < nt && col < d_qk)
          *reinterpret_cast<float2*>(drow + col) =
              make_float2(acc_dq[mt][j][2 * half] * dq_scale,
                          acc_dq[mt][j][2 * half + 1] * dq_scale);
      }
    }
  }
}

// ----------------------------------------------------------------- deterministic reduction

/// keys[p] = the kv id of pair p = t·k + slot when the slot is valid, else s_kv (sorted last);
/// vals[p] = p.
__global__ void pair_keys_kernel(const int32_t* __restrict__ indices,
                                 const int32_t* __restrict__ topk_length, int64_t s_q, int64_t k,
                                 int s_kv, unsigned* __restrict__ keys, int* __restrict__ vals) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= s_q * k) return;
  const int64_t t = p / k, j = p - t * k;
  int64_t lim = k;
  if (topk_length) lim = min(lim, static_cast<int64_t>(max(topk_length[t], 0)));
  const int v = indices[p];
  keys[p] =
      (j < lim && v >= 0 && v < s_kv) ? static_cast<unsigned>(v) : static_cast<unsigned>(s_kv);
  vals[p] = static_cast<int>(p);
}

/// First position in [lo, hi) whose value is >= x (a[] ascending).
template <class T>
__device__ int64_t lower_bound_dev(const T* a, int64_t lo, int64_t hi, int64_t x) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(a[mid]) < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

constexpr int kReduceVec = 5;  // float4 chunks per lane: 5 x 32 x 4 = 640 >= 576 columns

/// One warp per key row s: dkv[s] += the scratch rows of the pairs (t, slot) with t in
/// [t0, t1) that selected s, in ascending pair order (t, then slot), head groups in order.
/// The sorted pair list is stable, so the sum is the same sequence of fp32 adds every run
/// and for every chunking of the rows.
__global__ void dkv_reduce_kernel(const unsigned* __restrict__ keys, const int* __restrict__ vals,
                                  int64_t n, const float* __restrict__ partial, int s_kv, int d_qk,
                                  int64_t k, int n_groups, int64_t t0, int64_t t1,
                                  float* __restrict__ dkv) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (s >= s_kv) return;
  const int64_t b = lower_bound_dev(keys, 0, n, s);
  const int64_t e = lower_bound_dev(keys, b, n, s + 1);
  const int64_t lo = lower_bound_dev(vals, b, e, t0 * k);
  const int64_t hi = lower_bound_dev(vals, lo, e, t1 * k);
  if (lo >= hi) return;
  const int nc = d_qk / 4;
  float4* row = reinterpret_cast<float4*>(dkv + s * d_qk);
  float4 acc[kReduceVec];
#pragma unroll
  for (int u = 0; u < kReduceVec; ++u) {
    const int c = lane + 32 * u;
    acc[u] = c < nc ? row[c] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t p = vals[i];
    const int64_t lt = p / k - t0, slot = p % k;
    for (int grp = 0; grp < n_groups; ++grp) {
      const float4* src =
          reinterpret_cast<const float4*>(partial + ((lt * n_groups + grp) * k + slot) * d_qk);
#pragma unroll
      for (int u = 0; u < kReduceVec; ++u) {
        const int c = lane + 32 * u;
        if (c < nc) {
          const float4 v = src[c];
          acc[u].x += v.x;
          acc[u].y += v.y;
          acc[u].z += v.z;
          acc[u].w += v.w;
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kReduceVec; ++u) {
    const int c = lane + 32 * u;
    if (c < nc) row[c] = acc[u];
  }
}

/// dsink[h] = -Σ_t terms[t, h]: thread i sums rows i, i+256, ... in order, then a fixed tree.
__global__ void dsink_reduce_kernel(const float* __restrict__ terms, int64_t s_q, int h_q,
                                    float* __restrict__ dsink) {
  __shared__ float red[256];
  const int h = blockIdx.x, tid = threadIdx.x;
  float a = 0.f;
  for (int64_t t = tid; t < s_q; t += 256) a += terms[t * h_q + h];
  red[tid] = a;
  __syncthreads();
  for (int off = 128; off > 0; off >>= 1) {
    if (tid < off) red[tid] += red[tid + off];
    __syncthreads();
  }
  if (tid == 0) dsink[h] = -red[0];
}

// ----------------------------------------------------------------- host side

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

/// Multiprocessors of the current device (1 when the query fails).
int64_t sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();  // a failed query leaves no error for a later check
    return 1;
  }
  return n;
}

struct ScratchPlan {
  size_t terms = 0, keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0, cub = 0, partial = 0;
  size_t cub_bytes = 0, total = 0;
  int64_t rows = 0;  // query rows per main launch (deterministic: per scratch fill)
  int end_bit = 1;
};

ScratchPlan plan_scratch(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                         SparseMlaBwdMode mode) {
  ScratchPlan P;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += align256(bytes);
    return here;
  };
  P.terms = take(sizeof(float) * static_cast<size_t>(s_q * h_q));
  P.rows = s_q;
  if (mode == SparseMlaBwdMode::Deterministic && s_q > 0 && h_q > 0) {
    const int64_t n = s_q * k;
    if (n > INT32_MAX)
      throw std::invalid_argument(
          "sparse_mla_backward_scratch_bytes: argument 'k' got s_q * k = " + std::to_string(n) +
          ", expected s_q * k <= 2^31-1 (deterministic pair list)");
    while (P.end_bit < 32 && (int64_t{1} << P.end_bit) <= s_kv) ++P.end_bit;
    P.keys_in = take(4 * static_cast<size_t>(n));
    P.keys_out = take(4 * static_cast<size_t>(n));
    P.vals_in = take(4 * static_cast<size_t>(n));
    P.vals_out = take(4 * static_cast<size_t>(n));
    size_t cub_bytes = 0;
    DSA_CUDA_CHECK("sparse_mla_backward_device (sort size)",
                   cub::DeviceRadixSort::SortPairs(
                       nullptr, cub_bytes, static_cast<const unsigned*>(nullptr),
                       static_cast<unsigned*>(nullptr), static_cast<const int*>(nullptr),
                       static_cast<int*>(nullptr), static_cast<int>(n), 0, P.end_bit));
    P.cub_bytes = cub_bytes;
    P.cub = take(cub_bytes);
    const int64_t groups = (h_q + kHeads - 1) / kHeads;
    const int64_t row_bytes = std::max<int64_t>(1, groups * k * d_qk * 4);
    P.rows = std::max<int64_t>(1, std::min<int64_t>(s_q, kPartialBudget / row_bytes));
    // Chunks of whole waves (one block per SM): rows · groups a multiple of the SM count, so
    // only the last chunk has a partial wave (4 chunks of 227 rows at h_q 128, k 2048 left
    // 3.44 waves each: 18 waves where the fast mode's one launch needs 16). The order of
    // the adds does not depend on the chunking.
    const int64_t sms = sm_count();
    const int64_t unit = sms / std::gcd(sms, groups);
    if (P.rows < s_q && P.rows >= unit) P.rows = P.rows / unit * unit;
    P.partial = take(static_cast<size_t>(P.rows * row_bytes));
  }
  P.total = at;
  return P;
}

void require(bool ok, const char* arg, const std::string& got, const std::string& expected) {
  if (!ok)
    throw std::invalid_argument(std::string("sparse_mla_backward_device: argument '") + arg +
                                "' got " + got + ", expected " + expected);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// The main kernel's arguments (as sparse_mla_bwd_kernel's), for the launchers.
struct MainArgs {
  const uint16_t *q, *kv;
  const int32_t *indices, *topk_length;
  const float* attn_sink;
  const uint16_t* out;
  const float* lse;
  const uint16_t* dout;
  int64_t h_q, d_qk, s_kv, k, d_v;
  float sm_scale;
  float *dq, *dkv, *dsink_terms, *partial;
};

template <bool kFast, bool kHiLo, int kSkip, int kOpt = 0>
void launch_main(int64_t rows, int64_t groups, size_t smem, cudaStream_t stream, int64_t t0,
                 const MainArgs& a) {
  const char* where = "sparse_mla_backward_device";
  auto* kernel = sparse_mla_bwd_kernel<kFast, kHiLo, kSkip, kOpt>;
  DSA_CUDA_CHECK(where, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(rows * groups), kThreads, smem, stream>>>(
      a.q, a.kv, a.indices, a.topk_length, a.attn_sink, a.out, a.lse, a.dout,
      static_cast<int>(a.h_q), static_cast<int>(a.d_qk), static_cast<int>(a.s_kv), a.k,
      static_cast<int>(a.d_v), a.sm_scale, t0, a.dq, a.dkv, a.dsink_terms, a.partial);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

/// The main kernel for the mode and rounding (Bf16 with both speed options, kOpt 3; HiLo
/// without); skip != 0: a variant of the fast Bf16 kernel (sparse_mla_backward_timing_variant:
/// 1, 2, 4, 8 timing only, of the kOpt 3 kernel; 16, 32, 64 kOpt 1, 2, 0).
void launch_main_for(bool fast, SparseMlaBwdRounding rounding, int skip, int64_t rows,
                     int64_t groups, size_t smem, cudaStream_t stream, int64_t t0,
                     const MainArgs& a) {
  const bool hilo = rounding == SparseMlaBwdRounding::HiLo;
  switch (skip) {
    case 0:
      if (fast && hilo) launch_main<true, true, 0>(rows, groups, smem, stream, t0, a);
      if (fast && !hilo) launch_main<true, false, 0, 3>(rows, groups, smem, stream, t0, a);
      if (!fast && hilo) launch_main<false, true, 0>(rows, groups, smem, stream, t0, a);
      if (!fast && !hilo) launch_main<false, false, 0, 3>(rows, groups, smem, stream, t0, a);
      return;
    case 1: launch_main<true, false, 1, 3>(rows, groups, smem, stream, t0, a); return;
    case 2: launch_main<true, false, 2, 3>(rows, groups, smem, stream, t0, a); return;
    case 4: launch_main<true, false, 4, 3>(rows, groups, smem, stream, t0, a); return;
    case 8: launch_main<true, false, 8, 3>(rows, groups, smem, stream, t0, a); return;
    case 16: launch_main<true, false, 0, 1>(rows, groups, smem, stream, t0, a); return;
    case 32: launch_main<true, false, 0, 2>(rows, groups, smem, stream, t0, a); return;
    case 64: launch_main<true, false, 0, 0>(rows, groups, smem, stream, t0, a); return;
    default:
      throw std::invalid_argument("sparse_mla_backward_timing_variant: argument 'variant' got " +
                                  std::to_string(skip) + ", expected 1, 2, 4, 8, 16, 32 or 64");
  }
}

/// The backward after argument checks: dkv zeroed, the main kernel (fast: one launch;
/// deterministic: the pair sort, then main + reduction per chunk of rows), dsink reduced.
void run_backward(const MainArgs& in, int64_t s_q, SparseMlaBwdMode mode,
                  SparseMlaBwdRounding rounding, int skip, float* dsink, void* scratch,
                  cudaStream_t stream) {
  const char* where = "sparse_mla_backward_device";
  const int64_t h_q = in.h_q, d_qk = in.d_qk, s_kv = in.s_kv, k = in.k, d_v = in.d_v;
  const int32_t* indices = in.indices;
  const int32_t* topk_length = in.topk_length;
  const float* attn_sink = in.attn_sink;
  float* dkv = in.dkv;
  const int64_t groups = (h_q + kHeads - 1) / kHeads;
  const ScratchPlan plan = plan_scratch(s_q, h_q, d_qk, s_kv, k, mode);
  if (s_kv > 0) DSA_CUDA_CHECK(where, cudaMemsetAsync(dkv, 0, sizeof(float) * s_kv * d_qk, stream));
  if (s_q == 0 || h_q == 0) {
    if (dsink && h_q > 0)
      DSA_CUDA_CHECK(where, cudaMemsetAsync(dsink, 0, sizeof(float) * h_q, stream));
    return;
  }
  char* base = static_cast<char*>(scratch);
  float* terms = attn_sink ? reinterpret_cast<float*>(base + plan.terms) : nullptr;
  const size_t smem = bwd_layout(d_qk, d_v).total;

  MainArgs a = in;
  a.dsink_terms = terms;
  if (mode == SparseMlaBwdMode::Fast) {
    launch_main_for(true, rounding, skip, s_q, groups, smem, stream, 0, a);
  } else {
    const int64_t n = s_q * k;
    auto* keys_in = reinterpret_cast<unsigned*>(base + plan.keys_in);
    auto* keys_out = reinterpret_cast<unsigned*>(base + plan.keys_out);
    auto* vals_in = reinterpret_cast<int*>(base + plan.vals_in);
    auto* vals_out = reinterpret_cast<int*>(base + plan.vals_out);
    auto* partial = reinterpret_cast<float*>(base + plan.partial);
    if (n > 0) {
      pair_keys_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
          indices, topk_length, s_q, k, static_cast<int>(s_kv), keys_in, vals_in);
      DSA_CUDA_CHECK(where, cudaGetLastError());
      size_t cub_bytes = plan.cub_bytes;
      DSA_CUDA_CHECK(where, cub::DeviceRadixSort::SortPairs(
                                base + plan.cub, cub_bytes, keys_in, keys_out, vals_in, vals_out,
                                static_cast<int>(n), 0, plan.end_bit, stream));
    }
    for (int64_t t0 = 0; t0 < s_q; t0 += plan.rows) {
      const int64_t t1 = std::min(s_q, t0 + plan.rows);
      a.partial = partial;
      launch_main_for(false, rounding, 0, t1 - t0, groups, smem, stream, t0, a);
      if (n > 0 && s_kv > 0) {
        const int64_t blocks = (s_kv + 7) / 8;  // 8 warps (key rows) per block
        dkv_reduce_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
            keys_out, vals_out, n, partial, static_cast<int>(s_kv), static_cast<int>(d_qk), k,
            static_cast<int>(groups), t0, t1, dkv);
        DSA_CUDA_CHECK(where, cudaGetLastError());
      }
    }
  }
  if (attn_sink) {
    dsink_reduce_kernel<<<static_cast<unsigned>(h_q), 256, 0, stream>>>(
        terms, s_q, static_cast<int>(h_q), dsink);
    DSA_CUDA_CHECK(where, cudaGetLastError());
  }
}

}  // namespace

int64_t sparse_mla_backward_max_d_qk() { return kMaxDp; }
int64_t sparse_mla_backward_max_d_v() { return kMaxDvp; }

size_t sparse_mla_backward_scratch_bytes(int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv,
                                         int64_t k, SparseMlaBwdMode mode) {
  return plan_scratch(s_q, h_q, d_qk, s_kv, k, mode).total;
}

void sparse_mla_backward_device(const uint16_t* q, const uint16_t* kv, const int32_t* indices,
                                const int32_t* topk_length, const float* attn_sink,
                                const uint16_t* out, const float* lse, const uint16_t* dout,
                                int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                                int64_t d_v, float sm_scale, float* dq, float* dkv, float* dsink,
                                void* scratch, cudaStream_t stream, SparseMlaBwdMode mode,
                                SparseMlaBwdRounding rounding) {
  using std::to_string;
  require(s_q >= 0, "s_q", to_string(s_q), ">= 0");
  require(h_q >= 0 && h_q <= INT32_MAX, "h_q", to_string(h_q), "0 <= h_q <= 2^31-1");
  require(s_kv >= 0 && s_kv < INT32_MAX, "s_kv", to_string(s_kv), "0 <= s_kv < 2^31-1");
  require(k >= 0, "k", to_string(k), ">= 0");
  require(d_qk > 0 && d_qk % 8 == 0 && d_qk <= kMaxDp, "d_qk", to_string(d_qk),
          "a multiple of 8 in (0, " + to_string(kMaxDp) + "] (kernel limit)");
  require(d_v > 0 && d_v % 8 == 0 && d_v <= d_qk && d_v <= kMaxDvp, "d_v", to_string(d_v),
          "a multiple of 8 in (0, min(d_qk, " + to_string(kMaxDvp) + ")]");
  require(std::isfinite(sm_scale), "sm_scale", to_string(sm_scale), "a finite value");
  require((attn_sink == nullptr) == (dsink == nullptr), "dsink", dsink ? "a pointer" : "null",
          "given exactly when attn_sink is given");
  require(mode == SparseMlaBwdMode::Fast || s_q * k <= INT32_MAX, "k", to_string(k),
          "s_q * k <= 2^31-1 (deterministic pair list)");
  const int64_t groups = (h_q + kHeads - 1) / kHeads;
  require(s_q * groups <= INT32_MAX, "s_q", to_string(s_q), "s_q * ceil(h_q/64) <= 2^31-1");
  for (const void* p :
       {static_cast<const void*>(q), static_cast<const void*>(kv), static_cast<const void*>(dout),
        static_cast<const void*>(dq), static_cast<const void*>(dkv)})
    require(p == nullptr || aligned16(p), "q/kv/dout/dq/dkv", "a pointer not 16-byte aligned",
            "16-byte aligned device pointers (cp.async, vector stores)");
  const size_t need = plan_scratch(s_q, h_q, d_qk, s_kv, k, mode).total;
  require(need == 0 || (scratch != nullptr && aligned16(scratch)), "scratch",
          scratch ? "a pointer not 16-byte aligned" : "null",
          to_string(need) + " bytes (sparse_mla_backward_scratch_bytes), 16-byte aligned");

  require(rounding == SparseMlaBwdRounding::HiLo || rounding == SparseMlaBwdRounding::Bf16,
          "rounding", to_string(static_cast<int>(rounding)), "HiLo or Bf16");
  const MainArgs args{q,   kv,   indices, topk_length, attn_sink, out, lse,     dout,
                      h_q, d_qk, s_kv,    k,           d_v,       sm_scale, dq, dkv,
                      nullptr, nullptr};
  run_backward(args, s_q, mode, rounding, 0, dsink, scratch, stream);
}

namespace detail {
void sparse_mla_backward_timing_variant(int variant, const uint16_t* q, const uint16_t* kv,
                                        const int32_t* indices, const uint16_t* out,
                                        const float* lse, const uint16_t* dout, int64_t s_q,
                                        int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                                        int64_t d_v, float sm_scale, float* dq, float* dkv,
                                        cudaStream_t stream) {
  if (variant != 1 && variant != 2 && variant != 4 && variant != 8 && variant != 16 &&
      variant != 32 && variant != 64)
    throw std::invalid_argument("sparse_mla_backward_timing_variant: argument 'variant' got " +
                                std::to_string(variant) + ", expected 1, 2, 4, 8, 16, 32 or 64");
  const MainArgs args{q,   kv,   indices, nullptr, nullptr,  out, lse,     dout,
                      h_q, d_qk, s_kv,    k,       d_v,      sm_scale, dq, dkv,
                      nullptr, nullptr};
  run_backward(args, s_q, SparseMlaBwdMode::Fast, SparseMlaBwdRounding::Bf16, variant, nullptr,
               nullptr, stream);
}
}  // namespace detail

}  // namespace dsa::cuda
