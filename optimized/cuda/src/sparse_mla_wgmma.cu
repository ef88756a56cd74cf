// Sparse MLA forward in one pass with Hopper's warpgroup matrix instructions (SPEC §4, §6):
// wgmma.mma_async (sm_90a), the kernel behind SparseMlaKernel::OnePassWgmma.
//
// One thread block per (query row, group of 64 heads), two warpgroups (256 threads). The 64
// heads are wgmma's M. Q of the group, two stages of 64 gathered kv rows and P live in shared
// memory in the 128-byte-swizzled layout wgmma reads through matrix descriptors: each 64-wide
// column block of a 64-row operand is 8 KB of 128-byte rows, the 16-byte chunk c of row r
// stored at chunk c ^ (r % 8), every block 1024-byte aligned.
//
// Per tile of 64 slots (slot order; invalid slots are zero-filled by cp.async with a zero
// source size, never read, and masked to -inf):
//   1. warpgroup w computes S[:, 32w..32w+31] = Q K^T with 4 x d_qk/64 wgmma m64n32k16 (Q and
//      K K-major); meanwhile its threads issue the cp.async gather of the next tile into the
//      other stage;
//   2. the half-row maxima meet in shared memory; the online softmax runs in fp32 registers
//      (a running max still -inf is replaced by 0 in the exponent: a fully masked leading tile
//      gives p = 0, never exp(-inf - -inf)); P is written in bf16 (fence.proxy.async);
//   3. warpgroup w computes O[:, 256w..256w+255] += P V with 4 wgmma m64n256k16 (P K-major, V
//      the same kv rows read MN-major), O (128 fp32 registers per thread) rescaled first.
// At the end O is scaled by 1/l and the sink factor; lse = m + ln l, max_logits = m.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "hopper_primitives.cuh"
#include "online_softmax.cuh"
#include "sparse_mla_internal.h"
#include "tile_fill.cuh"

namespace dsa::cuda::detail {
namespace {

constexpr int kThreads = 256;            // two warpgroups
constexpr int kHeads = 64;               // wgmma M
constexpr int kTile = 64;                // slots per tile
constexpr uint32_t kBlockBytes = 8192;   // one 64-column block of a 64-row operand

struct WgLayout {
  int nb;  // 64-column blocks of d_qk (8 or 9)
  uint32_t tile, off_kv0, off_kv1, off_p, off_ids, off_red, off_y, total;
};

__host__ __device__ inline WgLayout wg_layout(int64_t d_qk) {
  WgLayout L{};
  L.nb = static_cast<int>((d_qk + 63) / 64);
  L.tile = static_cast<uint32_t>(L.nb) * kBlockBytes;
  L.off_kv0 = L.tile;
  L.off_kv1 = 2 * L.tile;
  L.off_p = 3 * L.tile;
  L.off_ids = L.off_p + kBlockBytes;      // [2][kTile] int
  L.off_red = L.off_ids + 2 * kTile * 4;  // [2][kHeads] float
  L.off_y = L.off_red + 2 * kHeads * 4;   // split-d exchange, d_qk <= 512 only (8 KB)
  L.total = L.off_y + (L.nb == 8 ? kBlockBytes : 0) + 1024;  // + slack to align the base
  return L;
}

// NB: 64-column blocks of d_qk, 8 (d_qk 449..512) or 9 (513..576). MODE:
//   0 (OnePassWgmma): S split over the slots between the warpgroups (m64n32k16, all columns);
//   1 (OnePassWgmmaSplitD): S split over d_qk (m64n64k16 over half of the columns for all 64
//     slots, the two partial sums exchanged through shared memory), O rescale skipped when no
//     row of a warp moved its max;
//   2 (OnePassWgmmaOwnHalfFirst): as 0, O rescale skipped likewise, and each warpgroup starts
//     P V on its own half of P (a warpgroup barrier) before the block barrier that publishes
//     the other half;
//   10, 11, 12: timing variants of 0 for the benchmark only, results wrong: no gather after
//     the first tile, no S products, no P V products.
template <int NB, int MODE>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_mla_fwd_wgmma_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                                const int32_t* __restrict__ indices,
                                const int32_t* __restrict__ topk_length,
                                const float* __restrict__ attn_sink, int h_q, int d_qk, int s_kv,
                                int64_t k, int d_v, float sm_scale, uint16_t* __restrict__ out,
                                float* __restrict__ lse_out, float* __restrict__ max_out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool SPLITD = MODE == 1;
  constexpr bool kOwnFirst = MODE == 2;
  constexpr bool kRescaleSkip = MODE == 1 || MODE == 2;
  constexpr bool kNoGather = MODE == 10, kNoS = MODE == 11, kNoPV = MODE == 12;
  extern __shared__ unsigned char smem_raw[];
  const WgLayout L = wg_layout(d_qk);
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t sb = (raw + 1023u) & ~1023u;  // Q at sb; every region 1024-aligned
  unsigned char* smem = smem_raw + (sb - raw);
  int* ids_s = reinterpret_cast<int*>(smem + L.off_ids);
  float* red_s = reinterpret_cast<float*>(smem + L.off_red);
  uint32_t* p_w = reinterpret_cast<uint32_t*>(smem + L.off_p);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, c4 = lane & 3;
  const int n_groups = (h_q + kHeads - 1) / kHeads;
  const int64_t t = blockIdx.x / n_groups;
  const int h0 = static_cast<int>(blockIdx.x % n_groups) * kHeads;
  constexpr int nb = NB;
  const int src_chunks = d_qk / 8;

  // Loads: thread tid fills rows tid/8 and tid/8 + 32, 16-byte chunk tid%8 of every block.
  const int ld_row = tid >> 3, ld_sub = tid & 7;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int r = ld_row + 32 * u;
    const bool head = h0 + r < h_q;
    const uint16_t* src = q + (t * h_q + h0 + (head ? r : 0)) * static_cast<int64_t>(d_qk);
    const uint32_t dst = sb + r * 128 + ((ld_sub ^ (r & 7)) << 4);
#pragma unroll
    for (int b = 0; b < nb; ++b) {
      const int c = 8 * b + ld_sub;
      const bool ok = head && c < src_chunks;
      cp_async16_zfill(dst + b * kBlockBytes, ok ? src + 8 * c : q, ok ? 16u : 0u);
    }
  }

  int64_t lim = k;
  if (topk_length) lim = min(lim, static_cast<int64_t>(max(topk_length[t], 0)));
  const int n_tiles = static_cast<int>((lim + kTile - 1) / kTile);
  const int32_t* irow = indices + t * k;
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
      const uint16_t* src = kv + static_cast<int64_t>(id[u] < 0 ? 0 : id[u]) * d_qk;
      const uint32_t dst = base + r * 128 + ((ld_sub ^ (r & 7)) << 4);
#pragma unroll
      for (int b = 0; b < nb; ++b) {
        const int c = 8 * b + ld_sub;
        const bool ok = id[u] >= 0 && c < src_chunks;
        cp_async16_zfill(dst + b * kBlockBytes, ok ? src + 8 * c : q, ok ? 16u : 0u);
      }
    }
  };

  int pre[2];
  if (n_tiles > 0) {
    fetch_ids(0, pre);
    load_tile(0, pre);
    fetch_ids(1, pre);
  }
  cp_async_commit();

  const int r0 = 16 * wi + g, r1 = r0 + 8;  // accumulator rows of this thread (S and O)
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  constexpr int ksteps = 4 * nb;

  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // tile `it` (and Q) landed; both warpgroups are done with tile it-1
    const uint32_t kb = sb + (stage ? L.off_kv1 : L.off_kv0);

    // 1. S = Q K^T for slots 32wg..32wg+31 (asynchronous), then the next tile's gather.
    float s[16];
    if constexpr (!SPLITD) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        s[i] = 0.f;
        reg_fence(s[i]);
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < ksteps; ++ks) {
        if constexpr (kNoS) break;
        const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
        wgmma_m64n32k16_ss(s, sw128_desc(sb + off, 16, 1024),
                           sw128_desc(kb + off + wg * 32 * 128, 16, 1024), 1);
      }
      wgmma_commit();
      if (it + 1 < n_tiles) {
        if (!kNoGather || it == 0) load_tile(stage ^ 1, pre);
        if (it + 2 < n_tiles) fetch_ids(it + 2, pre);
      }
      cp_async_commit();
      wgmma_wait_all();
      reg_fence(s);
    } else {
      // Partial S over k-steps [wg * ksteps/2, (wg + 1) * ksteps/2) for all 64 slots.
      float sf[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        sf[i] = 0.f;
        reg_fence(sf[i]);
      }
      wgmma_fence();
#pragma unroll
      for (int kq = 0; kq < ksteps / 2; ++kq) {
        const int ks = wg * (ksteps / 2) + kq;
        const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
        wgmma_m64n64k16_ss(sf, sw128_desc(sb + off, 16, 1024), sw128_desc(kb + off, 16, 1024), 1);
      }
      wgmma_commit();
      if (it + 1 < n_tiles) {
        load_tile(stage ^ 1, pre);
        if (it + 2 < n_tiles) fetch_ids(it + 2, pre);
      }
      cp_async_commit();
      wgmma_wait_all();
      reg_fence(sf);
      // Exchange: warpgroup 0 keeps slots 0..31 and hands over its partial of 32..63, and
      // the other way round. Thread i of one warpgroup holds the same (head, slot) positions
      // as thread i of the other, so the buffers are indexed [value][thread]. Warpgroup 0
      // writes the P region (free: the last P V has completed); warpgroup 1 writes block 8 of
      // this stage (read only by its own, completed, S products) or the spare region.
      float* x_buf = reinterpret_cast<float*>(smem + L.off_p);
      float* y_buf = reinterpret_cast<float*>(
          smem + (NB == 9 ? (stage ? L.off_kv1 : L.off_kv0) + 8 * kBlockBytes : L.off_y));
      const int tw = tid & 127;
      float* mine = wg == 0 ? x_buf : y_buf;
      const float* theirs = wg == 0 ? y_buf : x_buf;
#pragma unroll
      for (int i = 0; i < 16; ++i) mine[i * 128 + tw] = wg == 0 ? sf[16 + i] : sf[i];
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = (wg == 0 ? sf[i] : sf[16 + i]) + theirs[i * 128 + tw];
    }

    // 2. Masked, scaled logits; half-row maxima; online softmax; P in bf16.
    mask_scale_row_max(s, ids_s + stage * kTile, wg, c4, r0, r1, sm_scale, red_s);
    __syncthreads();
    float alpha[2], m_base[2];
    softmax_rescale(red_s, r0, r1, m_run, alpha, m_base);
    float ps[2] = {0.f, 0.f};
    write_p(s, m_base, wg, c4, r0, r1, p_w, ps);
    l_run[0] = l_run[0] * alpha[0] + ps[0];
    l_run[1] = l_run[1] * alpha[1] + ps[1];
    // Rescale O (skipped when no row of the warp changed its max: alpha is exactly 1).
    if (!kRescaleSkip || !__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    }
    fence_proxy_async();

    // 3. O[:, 256wg..] += P V (k-steps kk: slots 16kk..16kk+15).
    auto pv_step = [&](int kk) {
      wgmma_m64n256k16_ss</*kTransB=*/1>(
          o, sw128_desc(sb + L.off_p + kk * 32, 16, 1024),
          sw128_desc(kb + 4 * wg * kBlockBytes + kk * 16 * 128, kBlockBytes, 1024), 1);
    };
    if constexpr (kOwnFirst) {
      named_barrier_sync(1 + wg, 128);  // this warpgroup's half of P is complete
      reg_fence(o);
      wgmma_fence();
      pv_step(2 * wg);
      pv_step(2 * wg + 1);
      __syncthreads();  // the other warpgroup's half too
      wgmma_fence();
      pv_step(2 * (1 - wg));
      pv_step(2 * (1 - wg) + 1);
    } else {
      __syncthreads();  // P complete
      reg_fence(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        if constexpr (kNoPV) break;
        pv_step(kk);
      }
    }
    wgmma_commit();
    wgmma_wait_all();
    reg_fence(o);
  }
  cp_async_wait_all();

  // Row statistics: l over the 4 lanes of a row, then over the two warpgroups' halves.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
    l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
  }
  __syncthreads();
  if (c4 == 0) {
    red_s[wg * kHeads + r0] = l_run[0];
    red_s[wg * kHeads + r1] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = i ? r1 : r0;
    const int h = h0 + r;
    if (h >= h_q) continue;
    const float l = red_s[r] + red_s[kHeads + r];
    const int64_t at = t * h_q + h;
    float fac = 0.f;
    if (l > 0.f) {  // l >= 1 whenever the row has a valid slot
      const float lse = m_run[i] + logf(l);
      fac = 1.f / l;
      if (attn_sink) fac *= 1.f / (1.f + expf(attn_sink[h] - lse));
      if (wg == 0 && c4 == 0) {
        lse_out[at] = lse;
        max_out[at] = m_run[i];
      }
    } else if (wg == 0 && c4 == 0) {
      lse_out[at] = INFINITY;
      max_out[at] = -INFINITY;
    }
    uint16_t* orow = out + at * static_cast<int64_t>(d_v);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = 256 * wg + 8 * j + 2 * c4;
      const float x0 = o[4 * j + 2 * i] * fac, x1 = o[4 * j + 2 * i + 1] * fac;
      if ((d_v & 1) == 0) {
        if (col < d_v) *reinterpret_cast<uint32_t*>(orow + col) = pack_bf16(x0, x1);
      } else {
        if (col < d_v) orow[col] = __bfloat16_as_ushort(__float2bfloat16_rn(x0));
        if (col + 1 < d_v) orow[col + 1] = __bfloat16_as_ushort(__float2bfloat16_rn(x1));
      }
    }
  }
#else
  __trap();  // built without sm_90a: sparse_mla_wgmma_takes() keeps launches away
#endif
}

}  // namespace

size_t sparse_mla_wgmma_smem_bytes(int64_t d_qk) { return wg_layout(d_qk).total; }

bool sparse_mla_wgmma_takes(int64_t d_qk, int64_t d_v, const void* q, const void* kv) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (!(d_qk % 8 == 0 && d_qk > 448 && d_qk <= 576 && d_v <= 512 && aligned(q) && aligned(kv)))
    return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

void launch_sparse_mla_wgmma(int64_t s_q, cudaStream_t stream, const uint16_t* q,
                             const uint16_t* kv, const int32_t* indices,
                             const int32_t* topk_length, const float* attn_sink, int64_t h_q,
                             int64_t d_qk, int64_t s_kv, int64_t k, int64_t d_v, float sm_scale,
                             uint16_t* out, float* lse, float* max_logits, int mode) {
  const char* where = "sparse_mla_forward_device (one pass, wgmma)";
  const size_t smem = wg_layout(d_qk).total;
  const int64_t blocks = s_q * ((h_q + kHeads - 1) / kHeads);
  auto go = [&](auto kernel) {
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
    kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
        q, kv, indices, topk_length, attn_sink, static_cast<int>(h_q), static_cast<int>(d_qk),
        static_cast<int>(s_kv), k, static_cast<int>(d_v), sm_scale, out, lse, max_logits);
  };
  const bool nb8 = wg_layout(d_qk).nb == 8;
  switch (mode) {
    case 0: nb8 ? go(sparse_mla_fwd_wgmma_kernel<8, 0>) : go(sparse_mla_fwd_wgmma_kernel<9, 0>); break;
    case 1: nb8 ? go(sparse_mla_fwd_wgmma_kernel<8, 1>) : go(sparse_mla_fwd_wgmma_kernel<9, 1>); break;
    case 2: nb8 ? go(sparse_mla_fwd_wgmma_kernel<8, 2>) : go(sparse_mla_fwd_wgmma_kernel<9, 2>); break;
    case 10: go(sparse_mla_fwd_wgmma_kernel<9, 10>); break;  // timing variants: d_qk 576 only
    case 11: go(sparse_mla_fwd_wgmma_kernel<9, 11>); break;
    case 12: go(sparse_mla_fwd_wgmma_kernel<9, 12>); break;
    default:
      throw std::invalid_argument(std::string(where) + ": argument 'mode' got " +
                                  std::to_string(mode) + ", expected 0, 1, 2, 10, 11 or 12");
  }
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

}  // namespace dsa::cuda::detail
