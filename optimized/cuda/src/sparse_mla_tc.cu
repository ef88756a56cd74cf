// Sparse MLA forward on the tensor cores (SPEC §4, §6): bf16 wmma (mma.sync) with fp32
// accumulation, one thread block per (query row, group of 16 heads), tiles of 64 valid kv
// rows staged in shared memory. Two passes over the row's valid ids: the first computes the
// logits S = Q K^T and the exact row statistics (max_logits, lse); the second recomputes the
// same S (bitwise equal), forms p = exp(S - lse) <= 1, splits it into bf16 hi + lo parts
// (p - hi rounded again, so p is carried to ~2^-17) and accumulates O += P_hi V + P_lo V in
// register fragments; no rescaling of O is ever needed. Invalid slots are skipped by the
// compaction and never dereferenced.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "cuda_check.h"
#include "sparse_mla_internal.h"
#include "tile_fill.cuh"

namespace dsa::cuda::detail {
namespace {

using namespace nvcuda;

constexpr int kThreads = 256;  // 8 warps
constexpr int kHeads = 16;     // one wmma M tile
constexpr int kTile = 64;      // valid kv rows per tile: 4 n-tiles of 16
constexpr int kPLd = kTile + 8;

__host__ __device__ inline size_t up(size_t x) { return (x + 127) / 128 * 128; }

struct TcLayout {
  int64_t dpad;  // d_qk rounded up to 32 (two k-halves of whole 16-steps)
  int64_t ldk;   // bf16 row stride of Q and the kv tile (dpad + 8: skews ldmatrix rows)
  int64_t nt;    // 16-column tiles of d_v
  size_t off_q, off_s, off_phi, off_plo, off_stat, off_ids, total;
};

__host__ __device__ inline TcLayout tc_layout(int64_t d_qk, int64_t d_v) {
  TcLayout L{};
  L.dpad = (d_qk + 31) / 32 * 32;
  L.ldk = L.dpad + 8;
  L.nt = (d_v + 15) / 16;
  size_t off = up((size_t)kTile * L.ldk * 2);  // kv tile (bf16), reused as fp32 O staging
  L.off_q = off;
  off = up(off + (size_t)kHeads * L.ldk * 2);
  L.off_s = off;  // S partials [2][kHeads][kTile] fp32
  off = up(off + (size_t)2 * kHeads * kTile * 4);
  L.off_phi = off;
  off = up(off + (size_t)kHeads * kPLd * 2);
  L.off_plo = off;
  off = up(off + (size_t)kHeads * kPLd * 2);
  L.off_stat = off;  // lse[kHeads], fac[kHeads]
  off = up(off + (size_t)2 * kHeads * 4);
  L.off_ids = off;
  off = up(off + (size_t)kTile * 4);
  L.total = off;
  return L;
}

template <int MAXF>
__global__ void __launch_bounds__(kThreads)
    sparse_mla_fwd_tc_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                             const int32_t* __restrict__ indices,
                             const int32_t* __restrict__ topk_length,
                             const float* __restrict__ attn_sink, int64_t h_q, int64_t d_qk,
                             int64_t s_kv, int64_t k, int64_t d_v, float sm_scale,
                             uint16_t* __restrict__ out, float* __restrict__ lse_out,
                             float* __restrict__ max_out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const TcLayout L = tc_layout(d_qk, d_v);
  __nv_bfloat16* kv_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + L.off_q);
  float* s_s = reinterpret_cast<float*>(smem + L.off_s);
  __nv_bfloat16* phi_s = reinterpret_cast<__nv_bfloat16*>(smem + L.off_phi);
  __nv_bfloat16* plo_s = reinterpret_cast<__nv_bfloat16*>(smem + L.off_plo);
  float* lse_s = reinterpret_cast<float*>(smem + L.off_stat);
  float* fac_s = lse_s + kHeads;
  int* ids_s = reinterpret_cast<int*>(smem + L.off_ids);
  __shared__ int sh_cnt;
  __shared__ int64_t sh_cursor;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n_groups = (h_q + kHeads - 1) / kHeads;
  const int64_t t = blockIdx.x / n_groups;
  const int64_t h0 = (blockIdx.x % n_groups) * kHeads;
  const int64_t ldk = L.ldk, dpad = L.dpad;
  const uint16_t* kv_bits = kv;
  uint16_t* kv_s_bits = reinterpret_cast<uint16_t*>(kv_s);
  uint16_t* q_s_bits = reinterpret_cast<uint16_t*>(q_s);

  // Q of the group, zero-padded (missing heads, columns past d_qk).
  for (int64_t i = tid; i < kHeads * ldk; i += kThreads) {
    const int64_t h = i / ldk, d = i % ldk;
    uint16_t v = 0;
    if (h0 + h < h_q && d < d_qk) v = q[(t * h_q + h0 + h) * d_qk + d];
    q_s_bits[i] = v;
  }
  int64_t lim = k;
  if (topk_length) lim = min(lim, (int64_t)max(topk_length[t], 0));
  const int32_t* irow = indices + t * k;
  const bool vec = (d_qk % 8) == 0;

  // Per-warp heads for the softmax statistics: 2w, 2w+1; lanes cover columns lane, lane+32.
  const int hA = 2 * warp, hB = 2 * warp + 1;
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  float lseA = INFINITY, lseB = INFINITY;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_acc[MAXF];
#pragma unroll
  for (int f = 0; f < MAXF; ++f) wmma::fill_fragment(o_acc[f], 0.f);

  for (int pass = 0; pass < 2; ++pass) {
    if (tid == 0) sh_cursor = 0;
    __syncthreads();
    if (pass == 1) {
      lseA = lA > 0.f ? mA + logf(lA) : INFINITY;
      lseB = lB > 0.f ? mB + logf(lB) : INFINITY;
    }
    for (;;) {
      if (warp == 0)
        fill_valid_id_tile<kTile>(irow, lim, s_kv, lane, ids_s, &sh_cnt, &sh_cursor);
      __syncthreads();
      const int cnt = sh_cnt;
      if (cnt == 0) break;
      // Stage the tile: rows < cnt from kv, the rest zero; columns past d_qk zero.
      for (int r = warp; r < kTile; r += kThreads / 32) {
        uint16_t* dst = kv_s_bits + r * ldk;
        if (r < cnt) {
          const uint16_t* src = kv_bits + (int64_t)ids_s[r] * d_qk;
          if (vec) {
            for (int64_t c = lane; c < d_qk / 8; c += 32)
              reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
          } else {
            for (int64_t d = lane; d < d_qk; d += 32) dst[d] = src[d];
          }
          for (int64_t d = d_qk + lane; d < dpad; d += 32) dst[d] = 0;
        } else {
          for (int64_t d = lane; d < dpad; d += 32) dst[d] = 0;
        }
      }
      __syncthreads();
      {  // S partials: warp w -> kv rows 16*(w&3), k-half (w>>2)
        const int nb = (warp & 3) * 16, half = warp >> 2;
        const int64_t d0 = half * (dpad / 2), d1 = d0 + dpad / 2;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_acc;
        wmma::fill_fragment(s_acc, 0.f);
        for (int64_t d = d0; d < d1; d += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
          wmma::load_matrix_sync(a, q_s + d, (unsigned)ldk);
          wmma::load_matrix_sync(b, kv_s + nb * ldk + d, (unsigned)ldk);
          wmma::mma_sync(s_acc, a, b, s_acc);
        }
        wmma::store_matrix_sync(s_s + half * kHeads * kTile + nb, s_acc, kTile, wmma::mem_row_major);
      }
      __syncthreads();
      {
        float x[2][2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int h = hh ? hB : hA, j = lane + 32 * c;
            const float s = s_s[h * kTile + j] + s_s[kHeads * kTile + h * kTile + j];
            x[hh][c] = j < cnt ? s * sm_scale : -INFINITY;
          }
        if (pass == 0) {
          float tA = fmaxf(x[0][0], x[0][1]), tB = fmaxf(x[1][0], x[1][1]);
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) {
            tA = fmaxf(tA, __shfl_xor_sync(0xffffffffu, tA, off));
            tB = fmaxf(tB, __shfl_xor_sync(0xffffffffu, tB, off));
          }
          const float nA = fmaxf(mA, tA), nB = fmaxf(mB, tB);  // finite: cnt >= 1
          float pA = expf(x[0][0] - nA) + expf(x[0][1] - nA);
          float pB = expf(x[1][0] - nB) + expf(x[1][1] - nB);
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) {
            pA += __shfl_xor_sync(0xffffffffu, pA, off);
            pB += __shfl_xor_sync(0xffffffffu, pB, off);
          }
          lA = lA * expf(mA - nA) + pA;
          lB = lB * expf(mB - nB) + pB;
          mA = nA;
          mB = nB;
        } else {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int h = hh ? hB : hA, j = lane + 32 * c;
              const float p = expf(x[hh][c] - (hh ? lseB : lseA));  // 0 for masked columns
              const __nv_bfloat16 hi = __float2bfloat16_rn(p);
              phi_s[h * kPLd + j] = hi;
              plo_s[h * kPLd + j] = __float2bfloat16_rn(p - __bfloat162float(hi));
            }
        }
      }
      __syncthreads();
      if (pass == 1) {
#pragma unroll
        for (int kk = 0; kk < kTile; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ahi, alo;
          wmma::load_matrix_sync(ahi, phi_s + kk, kPLd);
          wmma::load_matrix_sync(alo, plo_s + kk, kPLd);
#pragma unroll
          for (int f = 0; f < MAXF; ++f) {
            const int64_t n = warp + 8 * f;
            if (n < L.nt) {
              wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
              wmma::load_matrix_sync(b, kv_s + kk * ldk + n * 16, (unsigned)ldk);
              wmma::mma_sync(o_acc[f], ahi, b, o_acc[f]);
              wmma::mma_sync(o_acc[f], alo, b, o_acc[f]);
            }
          }
        }
        __syncthreads();
      }
      if (cnt < kTile) break;
    }
  }

  // Statistics, the sink factor, then O (already normalised) through fp32 staging.
  if (lane == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int hl = hh ? hB : hA;
      const int64_t h = h0 + hl;
      const float l = hh ? lB : lA, m = hh ? mB : mA, lse = hh ? lseB : lseA;
      float fac = 0.f;
      if (h < h_q) {
        lse_out[t * h_q + h] = l > 0.f ? lse : INFINITY;
        max_out[t * h_q + h] = l > 0.f ? m : -INFINITY;
        if (l > 0.f) fac = attn_sink ? 1.f / (1.f + expf(attn_sink[h] - lse)) : 1.f;
      }
      fac_s[hl] = fac;
    }
  }
  float* stage = reinterpret_cast<float*>(smem);  // [kHeads][nt*16], fits in the kv tile
  const int64_t lds = L.nt * 16;
  __syncthreads();
#pragma unroll
  for (int f = 0; f < MAXF; ++f) {
    const int64_t n = warp + 8 * f;
    if (n < L.nt) wmma::store_matrix_sync(stage + n * 16, o_acc[f], (unsigned)lds, wmma::mem_row_major);
  }
  __syncthreads();
  for (int64_t i = tid; i < kHeads * d_v; i += kThreads) {
    const int64_t h = i / d_v, c = i % d_v;
    if (h0 + h < h_q)
      out[(t * h_q + h0 + h) * d_v + c] =
          __bfloat16_as_ushort(__float2bfloat16_rn(stage[h * lds + c] * fac_s[h]));
  }
}

}  // namespace

size_t sparse_mla_tc_smem_bytes(int64_t d_qk, int64_t d_v) { return tc_layout(d_qk, d_v).total; }

void launch_sparse_mla_tc(int64_t blocks, cudaStream_t stream, const uint16_t* q,
                          const uint16_t* kv, const int32_t* indices, const int32_t* topk_length,
                          const float* attn_sink, int64_t h_q, int64_t d_qk, int64_t s_kv,
                          int64_t k, int64_t d_v, float sm_scale, uint16_t* out, float* lse,
                          float* max_logits) {
  const char* where = "sparse_mla_forward_device (tensor cores)";
  const size_t smem = sparse_mla_tc_smem_bytes(d_qk, d_v);
  const int64_t nt = (d_v + 15) / 16;
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      DSA_CUDA_CHECK(where, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem));
    kernel<<<(unsigned)blocks, kThreads, smem, stream>>>(q, kv, indices, topk_length, attn_sink,
                                                         h_q, d_qk, s_kv, k, d_v, sm_scale, out,
                                                         lse, max_logits);
  };
  if (nt <= 8 * 4)
    go(sparse_mla_fwd_tc_kernel<4>);
  else
    go(sparse_mla_fwd_tc_kernel<8>);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

}  // namespace dsa::cuda::detail
