// Sparse MLA forward in one pass on the tensor cores (SPEC §4, §6), the kernel the `cuda`
// backend and the CUDA dispatch of dsa::sparse_mla_fwd run.
//
// One thread block (8 warps) per (query row, group of 64 heads): the heads are the M
// dimension, so every head of the group shares the gathered kv rows of the query's top-k.
// Q of the group stays in shared memory for the whole row. The row's slots are walked in
// tiles of 64 in slot order; the 64 kv rows of the next tile are gathered with cp.async
// (16-byte chunks, XOR-swizzled so that ldmatrix reads are free of bank conflicts) into the
// second of two shared-memory stages while the current tile is computed. Invalid slots
// (id < 0, id >= s_kv, slot >= topk_length) are never dereferenced: their rows are zeroed
// in shared memory and their logits masked to -inf.
//
// Per tile: S = Q K^T with bf16 mma.sync m16n8k16 (fp32 accumulation; warp w computes heads
// 16(w%4).. x slots 32(w/4)..), the two half-rows' maxima meet in shared memory, the online
// softmax runs in fp32 registers (a running max that is still -inf is replaced by 0 in the
// exponent, so a fully masked leading tile gives p = 0 and no exp(-inf - -inf)), P is stored
// in bf16 and O += P V runs with warp w owning the d_v columns 64w..64w+63 for all 64 heads
// (O in fp32 registers). At the end O is scaled by 1/l and the sink factor.
//
// Shared memory (d_qk padded to dp, a multiple of 64): Q and two kv stages of 64 x dp bf16,
// P 64 x 64 bf16, ids, row statistics: 231,424 bytes at dp 576 (one block per SM).
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "hopper_primitives.cuh"
#include "online_softmax.cuh"
#include "sparse_mla_internal.h"
#include "tile_fill.cuh"

namespace dsa::cuda::detail {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kHeads = 64;     // heads per block (M)
constexpr int kTile = 64;      // slots per tile (N of S, K of P V)
constexpr int kMaxDp = 576;    // largest padded d_qk
constexpr int kMaxDv = 512;    // 8 warps x 64 columns

struct OpLayout {
  int dp;            // d_qk rounded up to 64 (whole 8-chunk swizzle groups)
  uint32_t row;      // bytes per Q / kv row in shared memory
  uint32_t off_kv0, off_kv1, off_p, off_ids, off_red, off_alpha, total;
};

__host__ __device__ inline OpLayout op_layout(int64_t d_qk) {
  OpLayout L{};
  L.dp = static_cast<int>((d_qk + 63) / 64 * 64);
  L.row = static_cast<uint32_t>(L.dp) * 2u;
  const uint32_t tile = kTile * L.row;  // == kHeads * L.row (Q)
  L.off_kv0 = tile;
  L.off_kv1 = 2 * tile;
  L.off_p = 3 * tile;
  L.off_ids = L.off_p + kHeads * kTile * 2;  // [2][kTile] int
  L.off_red = L.off_ids + 2 * kTile * 4;     // [2][kHeads] float (half-row maxima, then l)
  L.off_alpha = L.off_red + 2 * kHeads * 4;  // [kHeads] float (rescale, then final factor)
  L.total = L.off_alpha + kHeads * 4;
  return L;
}

__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_fwd_onepass_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                                  const int32_t* __restrict__ indices,
                                  const int32_t* __restrict__ topk_length,
                                  const float* __restrict__ attn_sink, int h_q, int d_qk,
                                  int s_kv, int64_t k, int d_v, float sm_scale,
                                  uint16_t* __restrict__ out, float* __restrict__ lse_out,
                                  float* __restrict__ max_out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const OpLayout L = op_layout(d_qk);
  const uint32_t sb = smem_u32(smem);
  const uint32_t row_b = L.row;
  int* ids_s = reinterpret_cast<int*>(smem + L.off_ids);
  float* red_s = reinterpret_cast<float*>(smem + L.off_red);
  float* alpha_s = reinterpret_cast<float*>(smem + L.off_alpha);
  uint32_t* p_w = reinterpret_cast<uint32_t*>(smem + L.off_p);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_groups = (h_q + kHeads - 1) / kHeads;
  const int64_t t = blockIdx.x / n_groups;
  const int h0 = static_cast<int>(blockIdx.x % n_groups) * kHeads;
  const int chunks = L.dp / 8;  // 16-byte chunks per shared row
  const int src_chunks = d_qk / 8;

  // Q of the group (rows past h_q and columns past d_qk zero).
  for (int i = tid; i < kHeads * chunks; i += kThreads) {
    const int r = i / chunks, c = i - r * chunks;
    const uint32_t dst = sb + r * row_b + ((c ^ (r & 7)) << 4);
    if (h0 + r < h_q && c < src_chunks)
      cp_async16(dst, q + ((t * h_q + h0 + r) * static_cast<int64_t>(d_qk) + c * 8));
    else
      st_shared_zero16(dst);
  }

  int64_t lim = k;
  if (topk_length) lim = min(lim, static_cast<int64_t>(max(topk_length[t], 0)));
  const int n_tiles = static_cast<int>((lim + kTile - 1) / kTile);
  const int32_t* irow = indices + t * k;

  // Gather: thread tid copies rows tid/8 and tid/8 + 32 of a tile, chunks tid%8 + 8i.
  const int ld_row = tid >> 3, ld_sub = tid & 7;
  auto fetch_ids = [&](int tile, int (&id)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u)
      id[u] = slot_id(irow, static_cast<int64_t>(tile) * kTile + ld_row + 32 * u, lim, s_kv);
  };
  auto load_tile = [&](int stage, const int (&id)[2]) {
    const uint32_t base = sb + (stage ? L.off_kv1 : L.off_kv0);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = ld_row + 32 * u;
      if (ld_sub == 0) ids_s[stage * kTile + r] = id[u];
      const uint32_t rb = base + r * row_b;
      const uint16_t* src = kv + static_cast<int64_t>(id[u] < 0 ? 0 : id[u]) * d_qk;
      for (int c = ld_sub; c < chunks; c += 8) {
        const uint32_t dst = rb + ((c ^ (r & 7)) << 4);
        if (id[u] >= 0 && c < src_chunks)
          cp_async16(dst, src + c * 8);
        else
          st_shared_zero16(dst);
      }
    }
  };

  int pre[2];
  if (n_tiles > 0) {
    fetch_ids(0, pre);
    load_tile(0, pre);
    fetch_ids(1, pre);  // ids of the next tile, in flight while tile 0 is computed
  }
  cp_async_commit();

  // Fragment addressing. Every shared row this lane hands to ldmatrix has (row & 7) ==
  // (lane & 7), so the swizzle of a logical chunk c is c ^ (lane & 7) throughout.
  const int g = lane >> 2, c4 = lane & 3, sw = lane & 7;
  const int ms = warp & 3, nh = warp >> 2;                 // S tile: heads 16ms.., slots 32nh..
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;    // A (row-major) and V (trans) rows
  const int a_cx = lane >> 4;                              // their chunk offset
  const int b_row = (lane & 7) + (lane >> 4) * 8;          // B rows (kv slots) for S
  const int b_cx = (lane >> 3) & 1;
  const uint32_t q_addr = sb + (16 * ms + a_row) * row_b;
  const uint32_t k_off = (32 * nh + b_row) * row_b;
  const uint32_t p_addr = sb + L.off_p + a_row * 128;
  const uint32_t v_off = a_row * row_b;
  const int col0 = 64 * warp;  // O columns of this warp
  const bool pv_on = col0 < d_v;
  const int r0 = 16 * ms + g, r1 = r0 + 8;  // S rows of this thread

  float o[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int ksteps = L.dp / 16;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    cp_async_wait_all();
    __syncthreads();  // tile `it` visible; every warp is done with tile it-1 (stage^1, P, red)
    if (it + 1 < n_tiles) {
      load_tile(stage ^ 1, pre);
      if (it + 2 < n_tiles) fetch_ids(it + 2, pre);
    }
    cp_async_commit();
    const uint32_t kb = sb + (stage ? L.off_kv1 : L.off_kv0);

    // S = Q K^T: 16 heads x 32 slots per warp.
    float s[16];  // n8 tile j: s[4 j .. 4 j + 3]
#pragma unroll
    for (int j = 0; j < 16; ++j) s[j] = 0.f;
    {
      const uint32_t k0 = kb + k_off, k1 = k0 + 16 * row_b;
#pragma unroll 4
      for (int ks = 0; ks < ksteps; ++ks) {
        uint32_t a[4], b0[4], b1[4];
        ldsm_x4(a, q_addr + (((2 * ks + a_cx) ^ sw) << 4));
        const uint32_t kc = ((2 * ks + b_cx) ^ sw) << 4;
        ldsm_x4(b0, k0 + kc);
        ldsm_x4(b1, k1 + kc);
        mma16816(&s[0], a, b0[0], b0[1]);
        mma16816(&s[4], a, b0[2], b0[3]);
        mma16816(&s[8], a, b1[0], b1[1]);
        mma16816(&s[12], a, b1[2], b1[3]);
      }
    }

    // Masked, scaled logits and the half-row maxima; online softmax (both half-row warps
    // compute the same new max), P in bf16.
    mask_scale_row_max(s, ids_s + stage * kTile, nh, c4, r0, r1, sm_scale, red_s);
    __syncthreads();
    float alpha[2], m_base[2];
    softmax_rescale(red_s, r0, r1, m_run, alpha, m_base);
    float ps[2] = {0.f, 0.f};
    write_p(s, m_base, nh, c4, r0, r1, p_w, ps);
    l_run[0] = l_run[0] * alpha[0] + ps[0];
    l_run[1] = l_run[1] * alpha[1] + ps[1];
    if (nh == 0 && c4 == 0) {
      alpha_s[r0] = alpha[0];
      alpha_s[r1] = alpha[1];
    }
    __syncthreads();

    // O = alpha O + P V: all 64 heads x the warp's 64 columns.
    if (pv_on) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const float al0 = alpha_s[16 * mt + g], al1 = alpha_s[16 * mt + g + 8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o[mt][j][0] *= al0;
          o[mt][j][1] *= al0;
          o[mt][j][2] *= al1;
          o[mt][j][3] *= al1;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t b[4][4];
        const uint32_t vrow = kb + (16 * kk) * row_b + v_off;
#pragma unroll
        for (int np = 0; np < 4; ++np)
          ldsm_x4_t(b[np], vrow + (((col0 / 8 + 2 * np + a_cx) ^ sw) << 4));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          uint32_t a[4];
          ldsm_x4(a, p_addr + mt * 16 * 128 + (((2 * kk + a_cx) ^ sw) << 4));
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            mma16816(o[mt][2 * np], a, b[np][0], b[np][1]);
            mma16816(o[mt][2 * np + 1], a, b[np][2], b[np][3]);
          }
        }
      }
    }
  }

  // Row statistics: l summed over the 4 lanes of a row, then over the two half-row warps.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  __syncthreads();  // every warp is done reading red_s / alpha_s of the last tile
  if (c4 == 0) {
    red_s[nh * kHeads + r0] = l_run[0];
    red_s[nh * kHeads + r1] = l_run[1];
  }
  __syncthreads();
  if (nh == 0 && c4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = i ? r1 : r0;
      const int h = h0 + r;
      const float l = red_s[r] + red_s[kHeads + r];
      float fac = 0.f;
      if (h < h_q) {
        const int64_t at = t * h_q + h;
        if (l > 0.f) {  // l >= 1 whenever the row has a valid slot (its max term is 1)
          const float lse = m_run[i] + logf(l);
          lse_out[at] = lse;
          max_out[at] = m_run[i];
          fac = 1.f / l;
          if (attn_sink) fac *= 1.f / (1.f + expf(attn_sink[h] - lse));
        } else {
          lse_out[at] = INFINITY;
          max_out[at] = -INFINITY;
        }
      }
      alpha_s[r] = fac;
    }
  }
  __syncthreads();
  if (pv_on) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 16 * mt + g + 8 * half;
        if (h0 + r >= h_q) continue;
        const float f = alpha_s[r];
        uint16_t* orow = out + (t * h_q + h0 + r) * static_cast<int64_t>(d_v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = col0 + 8 * j + 2 * c4;
          const float x0 = o[mt][j][2 * half] * f, x1 = o[mt][j][2 * half + 1] * f;
          if ((d_v & 1) == 0) {
            if (col < d_v) *reinterpret_cast<uint32_t*>(orow + col) = pack_bf16(x0, x1);
          } else {
            if (col < d_v) orow[col] = __bfloat16_as_ushort(__float2bfloat16_rn(x0));
            if (col + 1 < d_v) orow[col + 1] = __bfloat16_as_ushort(__float2bfloat16_rn(x1));
          }
        }
      }
    }
  }
}

}  // namespace

bool sparse_mla_onepass_takes(int64_t d_qk, int64_t d_v, const void* q, const void* kv) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return d_qk % 8 == 0 && (d_qk + 63) / 64 * 64 <= kMaxDp && d_v <= kMaxDv && aligned(q) &&
         aligned(kv);
}

size_t sparse_mla_onepass_smem_bytes(int64_t d_qk) { return op_layout(d_qk).total; }

void launch_sparse_mla_onepass(int64_t s_q, cudaStream_t stream, const uint16_t* q,
                               const uint16_t* kv, const int32_t* indices,
                               const int32_t* topk_length, const float* attn_sink, int64_t h_q,
                               int64_t d_qk, int64_t s_kv, int64_t k, int64_t d_v,
                               float sm_scale, uint16_t* out, float* lse, float* max_logits) {
  const char* where = "sparse_mla_forward_device (one pass)";
  const size_t smem = sparse_mla_onepass_smem_bytes(d_qk);
  const int64_t blocks = s_q * ((h_q + kHeads - 1) / kHeads);
  if (smem > 48 * 1024)
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(sparse_mla_fwd_onepass_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
  sparse_mla_fwd_onepass_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      q, kv, indices, topk_length, attn_sink, static_cast<int>(h_q), static_cast<int>(d_qk),
      static_cast<int>(s_kv), k, static_cast<int>(d_v), sm_scale, out, lse, max_logits);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

}  // namespace dsa::cuda::detail
