// Sparse MLA forward kernel (SPEC §4, §6): one thread block per (query row, group of 16
// heads). Warp 0 compacts the next 32 valid slots of the row (invalid ids are skipped, never
// dereferenced), the block stages those kv rows in shared memory as fp32, each warp computes
// the logits of two heads (lane = kv row) and its online-softmax update, and every thread
// accumulates out columns for all 16 heads in registers. Tiles hold valid rows only, so no
// masked tile reaches the softmax; fp32 accumulation throughout.
#include <cmath>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dsa/cuda/kernels.h"
#include "sparse_mla_internal.h"
#include "tile_fill.cuh"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeads = 16;  // heads per block: 8 warps x 2
constexpr int kTile = 32;   // valid kv rows per tile (one per lane)
constexpr int64_t kMaxDqk = 1024;
constexpr int64_t kMaxDv = 1024;

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// Odd row stride (floats) of the kv tile so that 32 lanes reading one column of 32 rows
/// hit 32 different banks.
__host__ __device__ inline int64_t kv_ld(int64_t d_qk) { return (d_qk & 1) ? d_qk : d_qk + 1; }

size_t smem_bytes(int64_t d_qk) {
  return sizeof(float) * (size_t)(kTile * kv_ld(d_qk) + kHeads * d_qk + kHeads * kTile +
                                  3 * kHeads) +
         sizeof(int) * kTile;
}

template <int COLS>
__global__ void __launch_bounds__(kThreads)
    sparse_mla_fwd_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                          const int32_t* __restrict__ indices,
                          const int32_t* __restrict__ topk_length,
                          const float* __restrict__ attn_sink, int64_t h_q, int64_t d_qk,
                          int64_t s_kv, int64_t k, int64_t d_v, float sm_scale,
                          uint16_t* __restrict__ out, float* __restrict__ lse_out,
                          float* __restrict__ max_out) {
  extern __shared__ float smem[];
  const int64_t ld = kv_ld(d_qk);
  float* kv_s = smem;                          // [kTile][ld]
  float* q_s = kv_s + kTile * ld;              // [d_qk][kHeads] (heads interleaved)
  float* p_s = q_s + kHeads * d_qk;            // [kHeads][kTile]
  float* scale_s = p_s + kHeads * kTile;       // [kHeads]
  float* fac_s = scale_s + kHeads;             // [kHeads] final out factor
  float* spare_s = fac_s + kHeads;             // [kHeads] (unused, keeps layout simple)
  int* ids_s = reinterpret_cast<int*>(spare_s + kHeads);  // [kTile]
  __shared__ int sh_cnt;
  __shared__ int64_t sh_cursor;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t n_groups = (h_q + kHeads - 1) / kHeads;
  const int64_t t = blockIdx.x / n_groups;
  const int64_t h0 = (blockIdx.x % n_groups) * kHeads;

  // q of this group, upcast, heads interleaved; missing heads are zero.
  for (int64_t i = tid; i < kHeads * d_qk; i += kThreads) {
    const int64_t h = i / d_qk, d = i % d_qk;
    float v = 0.f;
    if (h0 + h < h_q) v = bf16_bits_to_float(q[(t * h_q + h0 + h) * d_qk + d]);
    q_s[d * kHeads + h] = v;
  }
  int64_t lim = k;
  if (topk_length) lim = min(lim, (int64_t)max(topk_length[t], 0));
  const int32_t* irow = indices + t * k;

  const int hA = 2 * warp, hB = 2 * warp + 1;  // local heads of this warp
  float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
  float acc[kHeads][COLS];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
#pragma unroll
    for (int c = 0; c < COLS; ++c) acc[h][c] = 0.f;

  if (tid == 0) sh_cursor = 0;
  __syncthreads();
  for (;;) {
    if (warp == 0)
      detail::fill_valid_id_tile<kTile>(irow, lim, s_kv, lane, ids_s, &sh_cnt, &sh_cursor);
    __syncthreads();
    const int cnt = sh_cnt;
    if (cnt == 0) break;
    // Stage the tile's kv rows (fp32); rows past cnt are zero so 0-weight terms stay finite.
    for (int r = warp; r < kTile; r += kThreads / 32) {
      float* dst = kv_s + r * ld;
      if (r < cnt) {
        const uint16_t* src = kv + (int64_t)ids_s[r] * d_qk;
        for (int64_t d = lane; d < d_qk; d += 32) dst[d] = bf16_bits_to_float(src[d]);
      } else {
        for (int64_t d = lane; d < d_qk; d += 32) dst[d] = 0.f;
      }
    }
    __syncthreads();
    {
      const float* kr = kv_s + lane * ld;
      // Four partial sums per head (ILP, and shorter fp32 summation chains).
      float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
      int64_t d = 0;
      for (; d + 4 <= d_qk; d += 4) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float x = kr[d + u];
          const float2 qq = *reinterpret_cast<const float2*>(q_s + (d + u) * kHeads + hA);
          a[u] = fmaf(qq.x, x, a[u]);
          b[u] = fmaf(qq.y, x, b[u]);
        }
      }
      for (; d < d_qk; ++d) {
        const float x = kr[d];
        const float2 qq = *reinterpret_cast<const float2*>(q_s + d * kHeads + hA);
        a[0] = fmaf(qq.x, x, a[0]);
        b[0] = fmaf(qq.y, x, b[0]);
      }
      const float sA = (a[0] + a[1]) + (a[2] + a[3]);
      const float sB = (b[0] + b[1]) + (b[2] + b[3]);
      const bool valid = lane < cnt;
      const float xA = valid ? sA * sm_scale : -INFINITY;
      const float xB = valid ? sB * sm_scale : -INFINITY;
      const float nA = fmaxf(mA, warp_max(xA));  // finite: the tile has a valid row
      const float nB = fmaxf(mB, warp_max(xB));
      const float scA = expf(mA - nA);  // mA = -inf on the first tile → 0
      const float scB = expf(mB - nB);
      const float pA = valid ? expf(xA - nA) : 0.f;
      const float pB = valid ? expf(xB - nB) : 0.f;
      lA = lA * scA + warp_sum(pA);
      lB = lB * scB + warp_sum(pB);
      mA = nA;
      mB = nB;
      p_s[hA * kTile + lane] = pA;
      p_s[hB * kTile + lane] = pB;
      if (lane == 0) {
        scale_s[hA] = scA;
        scale_s[hB] = scB;
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float sc = scale_s[h];
#pragma unroll
      for (int c = 0; c < COLS; ++c) acc[h][c] *= sc;
    }
    for (int j = 0; j < cnt; ++j) {
      const float* vr = kv_s + j * ld;
      float v[COLS];
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const int64_t col = tid + c * kThreads;
        v[c] = col < d_v ? vr[col] : 0.f;
      }
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        const float p = p_s[h * kTile + j];
#pragma unroll
        for (int c = 0; c < COLS; ++c) acc[h][c] = fmaf(p, v[c], acc[h][c]);
      }
    }
    __syncthreads();
    if (cnt < kTile) break;  // the row is exhausted
  }

  // Statistics and the final factor per head (1/l, times the sink factor).
  if (lane == 0) {
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const int hl = which ? hB : hA;
      const float m = which ? mB : mA;
      const float l = which ? lB : lA;
      const int64_t h = h0 + hl;
      float fac = 0.f;
      if (h < h_q) {
        const bool nonempty = l > 0.f;
        const float lse = nonempty ? m + logf(l) : INFINITY;
        lse_out[t * h_q + h] = lse;
        max_out[t * h_q + h] = nonempty ? m : -INFINITY;
        if (nonempty) {
          fac = 1.f / l;
          if (attn_sink) fac *= 1.f / (1.f + expf(attn_sink[h] - lse));
        }
      }
      fac_s[hl] = fac;
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h0 + h >= h_q) break;
    const float f = fac_s[h];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      const int64_t col = tid + c * kThreads;
      if (col < d_v)
        out[(t * h_q + h0 + h) * d_v + col] =
            __bfloat16_as_ushort(__float2bfloat16_rn(acc[h][c] * f));
    }
  }
}

template <int COLS>
void launch(int64_t blocks, size_t smem, cudaStream_t stream, const uint16_t* q,
            const uint16_t* kv, const int32_t* indices, const int32_t* topk_length,
            const float* attn_sink, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
            int64_t d_v, float sm_scale, uint16_t* out, float* lse, float* max_logits) {
  const char* where = "sparse_mla_forward_device";
  if (smem > 48 * 1024)
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(sparse_mla_fwd_kernel<COLS>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
  sparse_mla_fwd_kernel<COLS><<<(unsigned)blocks, kThreads, smem, stream>>>(
      q, kv, indices, topk_length, attn_sink, h_q, d_qk, s_kv, k, d_v, sm_scale, out, lse,
      max_logits);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

void require(bool ok, const char* arg, const std::string& got, const std::string& expected) {
  if (!ok)
    throw std::invalid_argument(std::string("sparse_mla_forward_device: argument '") + arg +
                                "' got " + got + ", expected " + expected);
}

}  // namespace

int64_t sparse_mla_max_d_qk() { return kMaxDqk; }
int64_t sparse_mla_max_d_v() { return kMaxDv; }

void sparse_mla_forward_device(const uint16_t* q, const uint16_t* kv, const int32_t* indices,
                               const int32_t* topk_length, const float* attn_sink,
                               int64_t s_q, int64_t h_q, int64_t d_qk, int64_t s_kv, int64_t k,
                               int64_t d_v, float sm_scale, uint16_t* out, float* lse,
                               float* max_logits, cudaStream_t stream, SparseMlaKernel kernel) {
  using std::to_string;
  require(s_q >= 0, "s_q", to_string(s_q), ">= 0");
  require(h_q >= 0, "h_q", to_string(h_q), ">= 0");
  require(s_kv >= 0 && s_kv <= INT32_MAX, "s_kv", to_string(s_kv), "0 <= s_kv <= 2^31-1");
  require(k >= 0, "k", to_string(k), ">= 0");
  require(d_qk > 0 && d_qk <= kMaxDqk, "d_qk", to_string(d_qk),
          "0 < d_qk <= " + to_string(kMaxDqk) + " (cuda kernel limit)");
  require(d_v > 0 && d_v <= d_qk && d_v <= kMaxDv, "d_v", to_string(d_v),
          "0 < d_v <= min(d_qk, " + to_string(kMaxDv) + ")");
  require(std::isfinite(sm_scale), "sm_scale", to_string(sm_scale), "a finite value");
  if (s_q == 0 || h_q == 0) return;
  const int64_t blocks = s_q * ((h_q + kHeads - 1) / kHeads);
  require(blocks <= INT32_MAX, "s_q", to_string(s_q), "s_q * ceil(h_q/16) <= 2^31-1");
  const bool wgmma = kernel == SparseMlaKernel::OnePassWgmma ||
                     kernel == SparseMlaKernel::OnePassWgmmaSplitD ||
                     kernel == SparseMlaKernel::OnePassWgmmaOwnHalfFirst;
  if (wgmma && detail::sparse_mla_wgmma_takes(d_qk, d_v, q, kv)) {
    const int mode = kernel == SparseMlaKernel::OnePassWgmmaSplitD         ? 1
                     : kernel == SparseMlaKernel::OnePassWgmmaOwnHalfFirst ? 2
                                                                           : 0;
    detail::launch_sparse_mla_wgmma(s_q, stream, q, kv, indices, topk_length, attn_sink, h_q,
                                    d_qk, s_kv, k, d_v, sm_scale, out, lse, max_logits, mode);
    return;
  }
  if ((kernel == SparseMlaKernel::OnePass || wgmma) &&
      detail::sparse_mla_onepass_takes(d_qk, d_v, q, kv)) {
    detail::launch_sparse_mla_onepass(s_q, stream, q, kv, indices, topk_length, attn_sink, h_q,
                                      d_qk, s_kv, k, d_v, sm_scale, out, lse, max_logits);
    return;
  }
  if (kernel != SparseMlaKernel::CudaCore) {
    detail::launch_sparse_mla_tc(blocks, stream, q, kv, indices, topk_length, attn_sink, h_q,
                                 d_qk, s_kv, k, d_v, sm_scale, out, lse, max_logits);
    return;
  }
  const size_t smem = smem_bytes(d_qk);
  if (d_v <= kThreads)
    launch<1>(blocks, smem, stream, q, kv, indices, topk_length, attn_sink, h_q, d_qk, s_kv, k,
              d_v, sm_scale, out, lse, max_logits);
  else if (d_v <= 2 * kThreads)
    launch<2>(blocks, smem, stream, q, kv, indices, topk_length, attn_sink, h_q, d_qk, s_kv, k,
              d_v, sm_scale, out, lse, max_logits);
  else
    launch<4>(blocks, smem, stream, q, kv, indices, topk_length, attn_sink, h_q, d_qk, s_kv, k,
              d_v, sm_scale, out, lse, max_logits);
}

}  // namespace dsa::cuda
