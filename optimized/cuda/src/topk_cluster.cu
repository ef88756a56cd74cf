// Top-k selection (SPEC §3), one read of the scores: a thread-block cluster of C CTAs (C <= 8,
// sm_90) per row; CTA r copies its slice of the row into shared memory once (16-byte
// cp.async), converts it to order-preserving keys, and the cluster runs an 11/11/10-bit radix
// select on those keys: each pass builds a shared-memory histogram with warp-aggregated
// increments, the cluster adds the C histograms through distributed shared memory (integer
// sums, so every CTA finds the same bin), and the pass stops early once the boundary bin is
// taken whole. The ids above v* and the ties to take are then placed by prefix sums (per
// thread, per CTA, per cluster rank) in id order, never by atomic-order appends, so every
// mode is bitwise deterministic. Rows are exact for any content (all ties, narrow bands,
// 131072 equal values): nothing is buffered beyond the row slice itself. sorted = true sends
// the k_eff (key, id) composites to CTA 0, which sorts them in shared memory.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <cooperative_groups.h>
#include <cub/block/block_radix_sort.cuh>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dsa/cuda/kernels.h"
#include "topk_cluster.h"
#include "topk_common.cuh"

namespace dsa::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 8;
/// Radix digits: bits 31..21, 20..10, 9..0 of the key.
constexpr int kBins1 = 2048, kBins2 = 2048, kBins3 = 1024;
constexpr int kHistWords = kBins1 + kBins2 + kBins3;
constexpr size_t kHistBytes = kHistWords * sizeof(uint32_t);
/// Slice elements a CTA aims for; longer rows get more CTAs (up to kMaxCluster).
constexpr int64_t kTargetSlice = 16384;
/// Largest dynamic shared memory a CTA asks for (227 KB opt-in less the static part).
constexpr size_t kMaxDynSmem = 227 * 1024 - 9 * 1024;

using SortT = cub::BlockRadixSort<uint32_t, kThreads, 4, uint32_t>;

/// Bytes of the key slice region for CH chunks a thread; the sorted path's CUB scratch
/// reuses it, so it is at least that large.
__host__ __device__ constexpr size_t keys_region_bytes(int ch) {
  return (size_t)ch * kThreads * 16 > sizeof(SortT::TempStorage)
             ? (size_t)ch * kThreads * 16
             : sizeof(SortT::TempStorage);
}

struct Plan {
  int cluster = 0;     // CTAs per row (0: not supported)
  int64_t slice = 0;   // elements per CTA, a multiple of 4
  int chunks = 0;      // 16-byte chunks per thread (odd: conflict-free 128-bit smem reads)
  size_t smem = 0;     // dynamic shared memory bytes
};

int64_t next_pow2_host(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

Plan make_plan(int64_t s_q, int64_t s_kv, int64_t k, bool sorted) {
  Plan p;
  if (s_kv <= 0) return p;
  int c = (int)std::min<int64_t>(kMaxCluster, (s_kv + kTargetSlice - 1) / kTargetSlice);
  // Few rows: spread each over more CTAs while the slices stay >= 4096 keys.
  while (c < kMaxCluster && s_q * c < 4 * 132 && s_kv / (2 * c) >= 4096) c *= 2;
  c = std::min(c, kMaxCluster);
  const int64_t slice = ((s_kv + c - 1) / c + 3) / 4 * 4;
  int chunks = (int)((slice / 4 + kThreads - 1) / kThreads);
  // Conflict-free 128-bit shared-memory reads: 8 chunks a thread use an XOR swizzle, other
  // counts an odd stride.
  if (chunks % 2 == 0 && chunks != 8) ++chunks;
  if (chunks > 15) return p;  // per-thread selection masks are 64-bit (4 keys per chunk)
  const int64_t sort_len = sorted ? next_pow2_host(std::min(k, s_kv)) : 0;
  const size_t region = std::max<size_t>(kHistBytes, (size_t)sort_len * 8);
  const size_t smem = keys_region_bytes(chunks) + region;
  if (smem > kMaxDynSmem) return p;
  if (s_q * (int64_t)c > INT32_MAX) return p;
  p.cluster = c;
  p.slice = slice;
  p.chunks = chunks;
  p.smem = smem;
  return p;
}

/// This thread's nbins/512 bins of the cluster-summed histogram h (nbins words at the same
/// offset in every CTA): thread i owns the bins counted down from top = nbins-1-(nbins/512)*i,
/// out[0] = bin top. One vector load per cluster rank through distributed shared memory.
__device__ __forceinline__ void cluster_bins(cg::cluster_group& cluster, uint32_t* h, int nbins,
                                             int csize, int tid, uint32_t (&out)[4]) {
  const int per = nbins / kThreads;  // 2 or 4
  const int top = nbins - 1 - per * tid;
  out[0] = out[1] = out[2] = out[3] = 0u;
  // Several ranks' loads issued before their sums (distributed shared memory latency).
  if (per == 4) {
    for (int r0 = 0; r0 < csize; r0 += 4) {
      uint4 v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + i < csize)  // bins top-3..top
          v[i] = reinterpret_cast<const uint4*>(cluster.map_shared_rank(h, r0 + i))[top >> 2];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        out[0] += v[i].w; out[1] += v[i].z; out[2] += v[i].y; out[3] += v[i].x;
      }
    }
    return;
  }
  for (int r0 = 0; r0 < csize; r0 += 8) {
    {
      uint2 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[i] = make_uint2(0u, 0u);
        if (r0 + i < csize)  // bins top-1..top
          v[i] = reinterpret_cast<const uint2*>(cluster.map_shared_rank(h, r0 + i))[top >> 1];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        out[0] += v[i].y; out[1] += v[i].x;
      }
    }
  }
}

/// Sums of the counts c[0], c[1] of the cluster ranks below `rank` (distributed shared
/// memory; up to 8 ranks' loads issued before their sums).
__device__ __forceinline__ void lower_rank_counts(cg::cluster_group& cluster, int* counts,
                                                  int rank, int& gt, int& eq) {
  gt = 0;
  eq = 0;
  for (int r0 = 0; r0 < rank; r0 += 8) {
    int2 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = make_int2(0, 0);
      if (r0 + i < rank) v[i] = *reinterpret_cast<const int2*>(cluster.map_shared_rank(counts, r0 + i));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      gt += v[i].x;
      eq += v[i].y;
    }
  }
}

/// Finds the bin d (scanning from the top) holding the target-th largest key, from the bins
/// of cluster_bins: above = #keys in bins > d, cnt = #keys in bin d; also total = #keys.
/// target <= 0 or target > total leave d = -1. Results in sel[0..3]; every thread must call
/// it. Starts and ends with __syncthreads().
__device__ __forceinline__ void find_bin(const uint32_t (&h)[4], int nbins, int64_t target,
                                         int* sel, int (*warp_sums)[kWarps], int tid) {
  const int lane = tid & 31, warp = tid >> 5;
  const int per = nbins / kThreads;
  const int top = nbins - 1 - per * tid;
  const uint32_t g = h[0] + h[1] + h[2] + h[3];
  uint32_t incl = g;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  __syncthreads();  // earlier readers of warp_sums and sel are done
  if (lane == 31) warp_sums[0][warp] = (int)incl;
  if (tid == 0) sel[0] = -1;
  __syncthreads();
  uint32_t before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t x = (uint32_t)warp_sums[0][w];
    if (w < warp) before += x;
    total += x;
  }
  const uint32_t excl = before + incl - g;
  if (target > 0 && (int64_t)excl < target && target <= (int64_t)(excl + g)) {
    uint32_t acc = excl;
    for (int b = 0; b < per; ++b) {
      if ((int64_t)(acc + h[b]) >= target) {
        sel[0] = top - b;
        sel[1] = (int)acc;
        sel[2] = (int)h[b];
        break;
      }
      acc += h[b];
    }
  }
  if (tid == 0) sel[3] = (int)total;
  __syncthreads();
}

/// Block-wide exclusive scan of two counts per thread; returns the block totals.
__device__ __forceinline__ void block_scan2(int a, int b, int& ea, int& eb, int& ta, int& tb,
                                            int (*warp_sums)[kWarps], int tid) {
  const int lane = tid & 31, warp = tid >> 5;
  int ia = a, ib = b;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int va = __shfl_up_sync(0xffffffffu, ia, off);
    const int vb = __shfl_up_sync(0xffffffffu, ib, off);
    if (lane >= off) {
      ia += va;
      ib += vb;
    }
  }
  if (lane == 31) {
    warp_sums[0][warp] = ia;
    warp_sums[1][warp] = ib;
  }
  __syncthreads();
  int oa = 0, ob = 0;
  ta = 0;
  tb = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int x = warp_sums[0][w], y = warp_sums[1][w];
    if (w < warp) {
      oa += x;
      ob += y;
    }
    ta += x;
    tb += y;
  }
  ea = oa + ia - a;
  eb = ob + ib - b;
}

/// Adds the 4 keys of a chunk (bins b[], predicates p[]) of every lane to h: one atomic of 128
/// when the whole warp's 128 keys share a bin (plateaus, narrow bands), else one shared-memory
/// atomic per key with its predicate. Every lane of the warp must call it.
__device__ __forceinline__ void hist_add4(uint32_t* h, const uint32_t (&b)[4], const bool (&p)[4],
                                          int lane) {
  const bool same = p[0] && p[1] && p[2] && p[3] && b[0] == b[1] && b[1] == b[2] && b[2] == b[3];
  const uint32_t b0 = __shfl_sync(0xffffffffu, b[0], 0);
  if (__all_sync(0xffffffffu, same && b[0] == b0)) {
    if (lane == 0) atomicAdd(&h[b0], 128u);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (p[e]) atomicAdd(&h[b[e]], 1u);
  }
}

/// Order-preserving key of raw float bits (SPEC §3.1): larger float → larger key, -0.0 and
/// +0.0 → 0x80000000, NaN and -inf → 0 (every selectable key is >= 0x00800000).
__device__ __forceinline__ uint32_t select_key(uint32_t b) {
  uint32_t key = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
  key = key == 0x7fffffffu ? 0x80000000u : key;  // -0.0 == +0.0
  // Selectable keys lie in [key(-FLT_MAX), key(+inf)] = [0x00800000, 0xff800000].
  return (key - 0x00800000u) <= (0xff800000u - 0x00800000u) ? key : 0u;
}

/// Sorts the keff <= 2048 composites (key << 32 | id-rank part) in sbuf, which are in id
/// order within equal keys, by key descending, stably (CUB's block radix sort): equal keys
/// keep id order ascending (small), or descending (large: fed in reverse). Writes the ids and
/// the -1 padding of orow[0, k). `temp` may alias sbuf. Every thread must call it.
__device__ __forceinline__ void sort_write_small(const unsigned long long* sbuf, int keff,
                                                 int64_t k, bool large,
                                                 typename SortT::TempStorage& temp,
                                                 int32_t* orow, int tid) {
  uint32_t key[4], id[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int e = 4 * tid + r;
    const int src = large ? keff - 1 - e : e;
    unsigned long long c = 0ull;  // padding: key 0, below every selectable key
    if (e < keff) c = sbuf[src];
    key[r] = (uint32_t)(c >> 32);
    const uint32_t low = (uint32_t)(c & 0xffffffffull);
    id[r] = large ? low : ~low;
  }
  __syncthreads();  // sbuf read before temp (which may alias it) is written
  SortT(temp).SortDescending(key, id);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int e = 4 * tid + r;
    if (e < k) orow[e] = e < keff ? (int32_t)id[r] : -1;
  }
  for (int64_t j = 2048 + tid; j < k; j += kThreads) orow[j] = -1;
}

/// Shared-memory slot of logical chunk q (ids 4q..4q+3 of the slice; thread q / CH owns it):
/// with 8 chunks a thread, chunk j of thread t sits at slot 8t + (j ^ (t & 7)), so 8 threads
/// reading their chunk j hit 8 different bank groups; odd CH needs no swizzle.
template <int CH>
__device__ __forceinline__ int phys_chunk(int q) {
  if (CH != 8) return q;
  const int t = q >> 3;
  return (t << 3) | ((q & 7) ^ (t & 7));
}

/// Where a row's top-k boundary lies, from this thread's view (find_boundary).
struct Boundary {
  int64_t keff;                // keys taken: min(k, #selectable keys of the row's window)
  int need_eq;                 // keys taken inside the boundary range [blo, bhi]
  int n_gt;                    // keys taken above it (keff - need_eq)
  int first;                   // tie ranks taken inside it: [first, first + need_eq)
  unsigned long long gt_m;     // this thread's keys above the range (bit 4j+e = chunk j, key e)
  unsigned long long eq_m;     // this thread's keys inside it
};

/// Radix passes 1-3 of a row over the cluster, after this CTA's pass-1 histogram (bits 31..21)
/// of its keys is in h1: sums the histograms over the cluster, narrows the boundary bin with
/// passes 2 (bits 20..10, h2) and 3 (bits 9..0, h3) while the bin holds more keys than are
/// still needed, and returns which of this thread's keys lie above and inside the boundary.
/// `chunk(j)` (j < CH) returns this thread's chunk j of 4 keys (select_key values; 0 = not
/// selectable or outside the window). large != 0 takes ties from the highest ids. Every thread of
/// every CTA of the cluster must call it (it holds cluster barriers). Shared by the cluster
/// and persistent kernels, which keep the keys in shared memory and in registers.
template <int CH, class Chunk>
__device__ __forceinline__ Boundary find_boundary(Chunk chunk, cg::cluster_group& cluster,
                                                  uint32_t* h1, uint32_t* h2, uint32_t* h3,
                                                  int64_t k, int csize, int large, int* sel,
                                                  int (*warp_sums)[kWarps], int tid) {
  const int lane = tid & 31;
  cluster.sync();
  uint32_t hb[4];
  cluster_bins(cluster, h1, kBins1, csize, tid, hb);
  find_bin(hb, kBins1, k, sel, warp_sums, tid);  // k > total: sel[0] = -1, handled below
  const int64_t total = sel[3];
  const int64_t keff = min(k, total);
  int rem = 0, cnt = 0;
  uint32_t prefix = 0;
  int shift = 21;
  if (keff > 0) {
    // keff == total: every selectable key is taken, the boundary bin is the lowest non-empty.
    if (keff == total) find_bin(hb, kBins1, keff, sel, warp_sums, tid);
    prefix = (uint32_t)sel[0];
    rem = (int)keff - sel[1];
    cnt = sel[2];
    if (rem != cnt) {
      // Pass 2: bits 20..10 of the keys in bin `prefix` (>= 4, so key 0 never matches).
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const uint4 v = chunk(j);
        const bool p[4] = {(v.x >> 21) == prefix, (v.y >> 21) == prefix, (v.z >> 21) == prefix,
                           (v.w >> 21) == prefix};
        if (!__any_sync(0xffffffffu, p[0] || p[1] || p[2] || p[3])) continue;
        const uint32_t b[4] = {(v.x >> 10) & 2047u, (v.y >> 10) & 2047u, (v.z >> 10) & 2047u,
                               (v.w >> 10) & 2047u};
        hist_add4(h2, b, p, lane);
      }
      cluster.sync();
      cluster_bins(cluster, h2, kBins2, csize, tid, hb);
      find_bin(hb, kBins2, rem, sel, warp_sums, tid);
      prefix = (prefix << 11) | (uint32_t)sel[0];
      shift = 10;
      rem -= sel[1];
      cnt = sel[2];
      if (rem != cnt) {
        // Pass 3: bits 9..0 of the keys with bits 31..10 equal to `prefix`.
#pragma unroll
        for (int j = 0; j < CH; ++j) {
          const uint4 v = chunk(j);
          const bool p[4] = {(v.x >> 10) == prefix, (v.y >> 10) == prefix,
                             (v.z >> 10) == prefix, (v.w >> 10) == prefix};
          if (!__any_sync(0xffffffffu, p[0] || p[1] || p[2] || p[3])) continue;
          const uint32_t b[4] = {v.x & 1023u, v.y & 1023u, v.z & 1023u, v.w & 1023u};
          hist_add4(h3, b, p, lane);
        }
        cluster.sync();
        cluster_bins(cluster, h3, kBins3, csize, tid, hb);
        find_bin(hb, kBins3, rem, sel, warp_sums, tid);
        prefix = (prefix << 10) | (uint32_t)sel[0];
        shift = 0;
        rem -= sel[1];
        cnt = sel[2];
      }
    }
  }
  // Boundary range [blo, bhi] of keys: everything above is taken, `rem` of the `cnt` keys
  // inside are taken (all of them unless shift == 0, i.e. ties at the exact key v*).
  const uint32_t blo = keff > 0 ? prefix << shift : 0xffffffffu;
  const uint32_t bhi = keff > 0 ? blo + ((1u << shift) - 1u) : 0xffffffffu;
  const int need_eq = keff > 0 ? rem : 0;
  const int n_gt = (int)keff - need_eq;
  const int first = large ? cnt - need_eq : 0;  // tie ranks taken: [first, first + need_eq)

  // This thread's keys above / inside the boundary range as bit masks (bit = local offset).
  unsigned long long gt_m = 0ull, eq_m = 0ull;
  if (keff > 0) {
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const uint4 v = chunk(j);
      const uint32_t r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (r[e] > bhi) gt_m |= 1ull << (4 * j + e);
        if (r[e] >= blo && r[e] <= bhi) eq_m |= 1ull << (4 * j + e);
      }
    }
  }
  return Boundary{keff, need_eq, n_gt, first, gt_m, eq_m};
}

template <int CH>
__global__ void __launch_bounds__(kThreads, 2)
    topk_cluster_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k,
                        const int64_t* __restrict__ ks, const int64_t* __restrict__ ke,
                        int large, int sorted, int32_t* __restrict__ out, int64_t slice) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int warp_sums[2][kWarps];
  __shared__ int sel[4];
  __shared__ __align__(8) int cta_counts[2];  // this CTA's #gt, #eq; read by higher ranks

  cg::cluster_group cluster = cg::this_cluster();
  const int csize = (int)cluster.num_blocks();
  const int rank = (int)cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t t = blockIdx.x / csize;

  uint4* keys4 = reinterpret_cast<uint4*>(smem);
  const uint32_t* keys = reinterpret_cast<const uint32_t*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + keys_region_bytes(CH));
  uint32_t* h1 = hist;
  uint32_t* h2 = hist + kBins1;
  uint32_t* h3 = hist + kBins1 + kBins2;
  unsigned long long* sortbuf = reinterpret_cast<unsigned long long*>(hist);

  // Slice [s0, s0 + n) of the row; local coordinates (int) from here on.
  int64_t lo, hi;
  row_window(ks, ke, t, s_kv, lo, hi);
  const int64_t s0 = (int64_t)rank * slice;
  const int n = (int)max((int64_t)0, min(slice, s_kv - s0));
  const int wl = (int)min(max(lo - s0, (int64_t)0), (int64_t)n);  // window, local: [wl, wh)
  const int wh = (int)min(max(hi - s0, (int64_t)0), (int64_t)n);
  const float* src = scores + t * s_kv + s0;

  // Copy the window part of the slice into shared memory (16-byte copies when aligned).
  {
    const bool aligned = (reinterpret_cast<uintptr_t>(src) & 15u) == 0;
    const int nchunk = (n + 3) / 4;
    for (int q = tid; q < nchunk; q += kThreads) {
      const int base = 4 * q;
      if (base >= wh || base + 4 <= wl) continue;
      const uint32_t dst = (uint32_t)__cvta_generic_to_shared(keys4 + phys_chunk<CH>(q));
      if (aligned && base + 4 <= n) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + base)
                     : "memory");
      } else {
        for (int e = 0; e < 4; ++e)
          if (base + e >= wl && base + e < wh)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst + 4u * e),
                         "l"(src + base + e)
                         : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    for (int i = tid; i < kHistWords; i += kThreads) hist[i] = 0u;
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  }

  // Pass 1: keys in place (0 = not selectable or outside the window), histogram of bits 31..21.
  const int my0 = tid * CH * 4;  // first local id of this thread's chunks
  // This thread's chunk j (ids my0 + 4j .. my0 + 4j + 3) is keys4[phys_chunk<CH>(tid*CH + j)].
  uint4* mine = keys4 + tid * CH;
  const int swz = CH == 8 ? (tid & 7) : 0;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int base = my0 + 4 * j;
    uint32_t o[4] = {0u, 0u, 0u, 0u};
    if (base >= wl && base + 4 <= wh) {
      const uint4 raw = mine[j ^ swz];
      o[0] = select_key(raw.x);
      o[1] = select_key(raw.y);
      o[2] = select_key(raw.z);
      o[3] = select_key(raw.w);
    } else if (base < wh && base + 4 > wl) {
      const uint4 raw = mine[j ^ swz];
      const uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[e] = (base + e >= wl && base + e < wh) ? select_key(r[e]) : 0u;
    }
    mine[j ^ swz] = make_uint4(o[0], o[1], o[2], o[3]);  // every chunk of the buffer holds keys
    const uint32_t b[4] = {o[0] >> 21, o[1] >> 21, o[2] >> 21, o[3] >> 21};
    const bool p[4] = {o[0] != 0u, o[1] != 0u, o[2] != 0u, o[3] != 0u};
    hist_add4(h1, b, p, lane);
  }
  const Boundary bd = find_boundary<CH>([&](int j) { return mine[j ^ swz]; }, cluster, h1, h2, h3,
                                         k, csize, large, sel, warp_sums, tid);
  const int64_t keff = bd.keff;
  const int need_eq = bd.need_eq, n_gt = bd.n_gt, first = bd.first;
  const unsigned long long gt_m = bd.gt_m, eq_m = bd.eq_m;
  const int my_gt = __popcll(gt_m), my_eq = __popcll(eq_m);
  int off_gt, off_eq, cta_gt, cta_eq;
  block_scan2(my_gt, my_eq, off_gt, off_eq, cta_gt, cta_eq, warp_sums, tid);
  if (tid == 0) {
    cta_counts[0] = cta_gt;
    cta_counts[1] = cta_eq;
  }
  cluster.sync();  // counts visible; every histogram read of the passes is finished
  int base_gt, base_eq;
  lower_rank_counts(cluster, cta_counts, rank, base_gt, base_eq);
  unsigned long long* dst_sort = cluster.map_shared_rank(sortbuf, 0);
  int32_t* orow = out + t * k;
  const uint32_t id0 = (uint32_t)(s0 + my0);
  {
    int pg = base_gt + off_gt;
    for (unsigned long long m = gt_m; m; m &= m - 1) {
      const int bit = __ffsll((long long)m) - 1;
      const uint32_t id = id0 + (uint32_t)bit;
      if (sorted) {
        dst_sort[pg] = ((unsigned long long)keys[4 * phys_chunk<CH>(tid * CH + (bit >> 2)) + (bit & 3)] << 32) | (large ? id : ~id);
      } else {
        orow[pg] = (int32_t)id;
      }
      ++pg;
    }
    int pe = base_eq + off_eq - first;
    for (unsigned long long m = eq_m; m; m &= m - 1, ++pe) {
      if (pe < 0 || pe >= need_eq) continue;
      const int bit = __ffsll((long long)m) - 1;
      const uint32_t id = id0 + (uint32_t)bit;
      if (sorted) {
        dst_sort[n_gt + pe] = ((unsigned long long)keys[4 * phys_chunk<CH>(tid * CH + (bit >> 2)) + (bit & 3)] << 32) | (large ? id : ~id);
      } else {
        orow[n_gt + pe] = (int32_t)id;
      }
    }
  }
  if (!sorted) {
    for (int64_t j = keff + (int64_t)rank * kThreads + tid; j < k; j += (int64_t)csize * kThreads)
      orow[j] = -1;
  }
  cluster.sync();  // composites in CTA 0; no CTA reads another's shared memory after this
  if (!sorted || rank != 0) return;
  if (keff <= 2048) {
    // The key slice of this CTA is no longer needed: the sort's scratch lives there.
    sort_write_small(sortbuf, (int)keff, k, large != 0,
                     *reinterpret_cast<typename SortT::TempStorage*>(smem), orow, tid);
    return;
  }
  bitonic_sort_desc<kThreads>(sortbuf, keff, next_pow2_dev(keff), tid);
  for (int64_t j = tid; j < k; j += kThreads) {
    int32_t id = -1;
    if (j < keff) {
      const uint32_t low = (uint32_t)(sortbuf[j] & 0xffffffffull);
      id = (int32_t)(large ? low : ~low);
    }
    orow[j] = id;
  }
}

// ---------------------------------------------------------------------------------------
// Persistent variant: a grid of as many clusters as fit at once (G); cluster c takes rows
// c, c + G, c + 2G, ... A CTA holds its slice's keys in registers (CH 16-byte chunks a
// thread), so its shared memory is free to receive the NEXT row's slice by cp.async while
// the current row is selected: the copy of row i+1 overlaps the radix passes, the cluster
// barriers and the id placement of row i. Same selection, placement and exactness as the
// kernel above (keys never leave the CTA, nothing is buffered beyond the slice); it writes
// the unsorted order (sorted: topk_sort_rows_kernel afterwards).

/// Issues the cp.async copies of the window part of row t's slice [s0, s0 + slice) into
/// keys4 (layout phys_chunk<CH>) and commits them as one group. Every thread must call it.
template <int CH>
__device__ __forceinline__ void issue_slice_copy(const float* __restrict__ scores, int64_t s_kv,
                                                 const int64_t* __restrict__ ks,
                                                 const int64_t* __restrict__ ke, int64_t t,
                                                 int64_t s0, int64_t slice, uint4* keys4,
                                                 int tid) {
  int64_t lo, hi;
  row_window(ks, ke, t, s_kv, lo, hi);
  const int n = (int)max((int64_t)0, min(slice, s_kv - s0));
  const int wl = (int)min(max(lo - s0, (int64_t)0), (int64_t)n);
  const int wh = (int)min(max(hi - s0, (int64_t)0), (int64_t)n);
  const float* src = scores + t * s_kv + s0;
  const bool aligned = (reinterpret_cast<uintptr_t>(src) & 15u) == 0;
  const int nchunk = (n + 3) / 4;
  for (int q = tid; q < nchunk; q += kThreads) {
    const int base = 4 * q;
    if (base >= wh || base + 4 <= wl) continue;
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(keys4 + phys_chunk<CH>(q));
    if (aligned && base + 4 <= n) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + base)
                   : "memory");
    } else {
      for (int e = 0; e < 4; ++e)
        if (base + e >= wl && base + e < wh)
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst + 4u * e),
                       "l"(src + base + e)
                       : "memory");
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int CH, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    topk_persist_kernel(const float* __restrict__ scores, int64_t s_q, int64_t s_kv, int64_t k,
                        const int64_t* __restrict__ ks, const int64_t* __restrict__ ke,
                        int large, int32_t* __restrict__ out, int64_t slice) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int warp_sums[2][kWarps];
  __shared__ int sel[4];
  __shared__ __align__(8) int cta_counts[2];  // #gt, #eq of this CTA's row slice; read by higher ranks

  cg::cluster_group cluster = cg::this_cluster();
  const int csize = (int)cluster.num_blocks();
  const int rank = (int)cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t nclusters = gridDim.x / csize;
  const int64_t s0 = (int64_t)rank * slice;
  const int n = (int)max((int64_t)0, min(slice, s_kv - s0));

  uint4* keys4 = reinterpret_cast<uint4*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + (size_t)CH * kThreads * 16);
  uint32_t* h1 = hist;
  uint32_t* h2 = hist + kBins1;
  uint32_t* h3 = hist + kBins1 + kBins2;

  int64_t t = blockIdx.x / csize;  // the same row for every CTA of the cluster
  if (t < s_q) issue_slice_copy<CH>(scores, s_kv, ks, ke, t, s0, slice, keys4, tid);
  for (int i = tid; i < kHistWords; i += kThreads) hist[i] = 0u;

  const int my0 = tid * CH * 4;  // first local id of this thread's chunks
  const int swz = CH == 8 ? (tid & 7) : 0;
  const uint4* mine = keys4 + tid * CH;
  for (; t < s_q; t += nclusters) {
    int64_t lo, hi;
    row_window(ks, ke, t, s_kv, lo, hi);
    const int wl = (int)min(max(lo - s0, (int64_t)0), (int64_t)n);  // window, local: [wl, wh)
    const int wh = (int)min(max(hi - s0, (int64_t)0), (int64_t)n);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();  // row t's slice landed; the histograms are zero

    // Keys of this thread's chunks into registers (0 = not selectable or outside the window).
    uint32_t key[CH][4];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int base = my0 + 4 * j;
      key[j][0] = key[j][1] = key[j][2] = key[j][3] = 0u;
      if (base >= wl && base + 4 <= wh) {
        const uint4 raw = mine[j ^ swz];
        key[j][0] = select_key(raw.x);
        key[j][1] = select_key(raw.y);
        key[j][2] = select_key(raw.z);
        key[j][3] = select_key(raw.w);
      } else if (base < wh && base + 4 > wl) {
        const uint4 raw = mine[j ^ swz];
        const uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          key[j][e] = (base + e >= wl && base + e < wh) ? select_key(r[e]) : 0u;
      }
    }
    __syncthreads();  // every thread has read the slice: the buffer takes the next row
    if (t + nclusters < s_q)
      issue_slice_copy<CH>(scores, s_kv, ks, ke, t + nclusters, s0, slice, keys4, tid);

    // Pass 1: histogram of bits 31..21.
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const uint32_t b[4] = {key[j][0] >> 21, key[j][1] >> 21, key[j][2] >> 21, key[j][3] >> 21};
      const bool p[4] = {key[j][0] != 0u, key[j][1] != 0u, key[j][2] != 0u, key[j][3] != 0u};
      hist_add4(h1, b, p, lane);
    }
    const Boundary bd = find_boundary<CH>(
        [&](int j) { return make_uint4(key[j][0], key[j][1], key[j][2], key[j][3]); }, cluster,
        h1, h2, h3, k, csize, large, sel, warp_sums, tid);
    const int64_t keff = bd.keff;
    const int need_eq = bd.need_eq, n_gt = bd.n_gt, first = bd.first;
    const unsigned long long gt_m = bd.gt_m, eq_m = bd.eq_m;
    const int my_gt = __popcll(gt_m), my_eq = __popcll(eq_m);
    int off_gt, off_eq, cta_gt, cta_eq;
    block_scan2(my_gt, my_eq, off_gt, off_eq, cta_gt, cta_eq, warp_sums, tid);
    if (tid == 0) {
      cta_counts[0] = cta_gt;
      cta_counts[1] = cta_eq;
    }
    // Counts visible; every remote read of this row's histograms is finished (each CTA reads
    // them before it arrives here), so the histograms can be cleared for the next row.
    cluster.sync();
    int base_gt, base_eq;
    lower_rank_counts(cluster, cta_counts, rank, base_gt, base_eq);
    for (int i = tid; i < kHistWords; i += kThreads) hist[i] = 0u;
    int32_t* orow = out + t * k;
    const uint32_t id0 = (uint32_t)(s0 + my0);
    int pg = base_gt + off_gt;
    for (unsigned long long m = gt_m; m; m &= m - 1)
      orow[pg++] = (int32_t)(id0 + (uint32_t)(__ffsll((long long)m) - 1));
    int pe = base_eq + off_eq - first;
    for (unsigned long long m = eq_m; m; m &= m - 1, ++pe) {
      if (pe < 0 || pe >= need_eq) continue;
      orow[n_gt + pe] = (int32_t)(id0 + (uint32_t)(__ffsll((long long)m) - 1));
    }
    for (int64_t j = keff + (int64_t)rank * kThreads + tid; j < k; j += (int64_t)csize * kThreads)
      orow[j] = -1;
    // The next row's cta_counts are written only after its first cluster barrier, which every
    // CTA reaches after reading these.
  }
  cluster.sync();  // no CTA exits while another may still read its shared memory
}

/// Sorts each row's prefix in place (sorted = true after an unsorted selection): out[t, 0..k),
/// k <= 2048, holds the ids above the boundary range in id order, then the boundary ids taken
/// in id order, then -1. Keys are recomputed from the scores (select_key); a stable radix sort
/// by key descending (CUB) of that sequence (reversed for large) orders equal keys by id
/// ascending (small) or descending (large), since equal keys never straddle the two parts.
/// Sorts only the bits the row's keys span (key - min + 1; padding -1 gets key 0, last).
constexpr int kSortThreads = 256;
constexpr int kSortItems = 8;
constexpr int64_t kPostSortMax = (int64_t)kSortThreads * kSortItems;  // 2048
using RowSortT = cub::BlockRadixSort<uint32_t, kSortThreads, kSortItems, int32_t>;

__global__ void __launch_bounds__(kSortThreads)
    topk_sort_rows_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k, int large,
                          int32_t* __restrict__ out) {
  __shared__ typename RowSortT::TempStorage temp;
  __shared__ uint32_t sh_min, sh_max;
  const int tid = threadIdx.x;
  const int64_t t = blockIdx.x;
  int32_t* orow = out + t * k;
  const uint32_t* row = reinterpret_cast<const uint32_t*>(scores + t * s_kv);
  const int n = (int)k;
  uint32_t key[kSortItems];
  int32_t id[kSortItems];
  uint32_t lmin = 0xffffffffu, lmax = 0u;
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    const int e = kSortItems * tid + r;
    id[r] = -1;
    key[r] = 0u;
    if (e < n) {
      id[r] = orow[large ? n - 1 - e : e];
      if (id[r] >= 0) {
        key[r] = select_key(row[id[r]]);
        lmin = min(lmin, key[r]);
        lmax = max(lmax, key[r]);
      }
    }
  }
  if (tid == 0) {
    sh_min = 0xffffffffu;
    sh_max = 0u;
  }
  lmin = __reduce_min_sync(0xffffffffu, lmin);
  lmax = __reduce_max_sync(0xffffffffu, lmax);
  __syncthreads();  // initialised; every orow read is done before any write below
  if ((tid & 31) == 0) {
    atomicMin(&sh_min, lmin);  // min / max: the same result in any order
    atomicMax(&sh_max, lmax);
  }
  __syncthreads();
  const uint32_t kmin = sh_min, kmax = sh_max;
  if (kmax == 0u) return;  // no id in this row (every thread returns)
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) key[r] = id[r] >= 0 ? key[r] - kmin + 1u : 0u;
  const int end_bit = 32 - __clz((int)(kmax - kmin + 1u));
  RowSortT(temp).SortDescending(key, id, 0, end_bit);
#pragma unroll
  for (int r = 0; r < kSortItems; ++r) {
    const int e = kSortItems * tid + r;
    if (e < n) orow[e] = id[r];
  }
}

using KernelFn = void (*)(const float*, int64_t, int64_t, const int64_t*, const int64_t*, int,
                          int, int32_t*, int64_t);

KernelFn kernel_for(int chunks) {
  switch (chunks) {
    case 1: return topk_cluster_kernel<1>;
    case 3: return topk_cluster_kernel<3>;
    case 5: return topk_cluster_kernel<5>;
    case 7: return topk_cluster_kernel<7>;
    case 8: return topk_cluster_kernel<8>;
    case 9: return topk_cluster_kernel<9>;
    case 11: return topk_cluster_kernel<11>;
    case 13: return topk_cluster_kernel<13>;
    case 15: return topk_cluster_kernel<15>;
    default: return nullptr;
  }
}

using PersistFn = void (*)(const float*, int64_t, int64_t, int64_t, const int64_t*,
                           const int64_t*, int, int32_t*, int64_t);

/// Plan of the persistent kernel: CTAs per row (cluster), slice, chunks a thread and shared
/// memory. Default: slices of at most 16384 keys (up to 8 CTAs a row, 128 registers, 1 CTA an
/// SM), 1, 3, 5, 7 or 8 chunks (the conflict-free layouts of phys_chunk). wide: slices of at
/// most 8192 keys (up to 16 CTAs a row: a non-portable cluster size), 1, 3 or 4 chunks, 64
/// registers, 2 CTAs an SM.
Plan make_persist_plan(int64_t s_q, int64_t s_kv, bool wide) {
  Plan p;
  if (s_kv <= 0 || s_q <= 0) return p;
  const int64_t target = wide ? kTargetSlice / 2 : kTargetSlice;
  const int max_c = wide ? 2 * kMaxCluster : kMaxCluster;
  const int64_t cmin = (s_kv + target - 1) / target;
  if (cmin > max_c) return p;  // the keys of a slice live in registers
  int c = (int)cmin;
  // Few rows: spread each over more CTAs while the slices stay long enough.
  const int64_t min_slice = wide ? 2048 : 4096;
  const int64_t rows_ctas = wide ? 4 * 132 : 2 * 132;
  while (2 * c <= max_c && s_q * c < rows_ctas && s_kv / (2 * c) >= min_slice) c *= 2;
  const int64_t slice = ((s_kv + c - 1) / c + 3) / 4 * 4;
  int chunks = (int)((slice / 4 + kThreads - 1) / kThreads);
  if (chunks % 2 == 0 && chunks != 8 && !(wide && chunks == 4)) ++chunks;  // odd or 8: no bank conflicts
  if (chunks > (wide ? 4 : 8)) return p;
  p.cluster = c;
  p.slice = slice;
  p.chunks = chunks;
  p.smem = (size_t)chunks * kThreads * 16 + kHistBytes;
  return p;
}

PersistFn persist_kernel_for(int chunks, bool wide) {
  if (wide) {
    switch (chunks) {
      case 1: return topk_persist_kernel<1, 2>;
      case 3: return topk_persist_kernel<3, 2>;
      case 4: return topk_persist_kernel<4, 2>;
      default: return nullptr;
    }
  }
  switch (chunks) {
    case 1: return topk_persist_kernel<1, 1>;
    case 3: return topk_persist_kernel<3, 1>;
    case 5: return topk_persist_kernel<5, 1>;
    case 7: return topk_persist_kernel<7, 1>;
    case 8: return topk_persist_kernel<8, 1>;
    default: return nullptr;
  }
}

/// Optional cap on the persistent grid (clusters) from DSA_CUDA_TOPK_MAX_CLUSTERS (a positive
/// integer; tests use it so that each cluster runs several rows); 0 when unset or invalid.
int64_t max_clusters_from_env() {
  const char* v = std::getenv("DSA_CUDA_TOPK_MAX_CLUSTERS");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return (end != nullptr && *end == '\0' && x > 0) ? (int64_t)x : 0;
}

void sort_rows_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k, bool large,
                      int32_t* out, cudaStream_t stream, const char* where) {
  topk_sort_rows_kernel<<<(unsigned)s_q, kSortThreads, 0, stream>>>(scores, s_kv, k,
                                                                    large ? 1 : 0, out);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

}  // namespace

bool topk_cluster_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted) {
  return make_plan(s_q, s_kv, k, sorted).cluster > 0;
}

void topk_cluster_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream, bool fused_sort) {
  const char* where = "select_topk_device (cluster)";
  const Plan p = make_plan(s_q, s_kv, k, sorted);
  if (p.cluster == 0)
    throw std::invalid_argument(std::string(where) + ": shape s_kv=" + std::to_string(s_kv) +
                                ", k=" + std::to_string(k) + " exceeds the cluster kernel");
  const KernelFn fn = kernel_for(p.chunks);
  if (fn == nullptr)
    throw std::invalid_argument(std::string(where) + ": internal plan with " +
                                std::to_string(p.chunks) + " chunks a thread");
  static bool attr_set[16] = {};  // one opt-in to the large shared memory size per variant
  if (!attr_set[p.chunks]) {
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)kMaxDynSmem));
    attr_set[p.chunks] = true;
  }
  // Sorted with k <= 2048 and !fused_sort: the unsorted selection, then topk_sort_rows_kernel.
  const bool sort_after = sorted && !fused_sort && k <= kPostSortMax;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(s_q * p.cluster), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)p.cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DSA_CUDA_CHECK(where, cudaLaunchKernelEx(&cfg, fn, scores, s_kv, k, ks, ke, large ? 1 : 0,
                                           (sorted && !sort_after) ? 1 : 0, out, p.slice));
  if (sort_after) sort_rows_launch(scores, s_q, s_kv, k, large, out, stream, where);
}

bool topk_persist_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted, bool wide) {
  return make_persist_plan(s_q, s_kv, wide).cluster > 0 && (!sorted || k <= kPostSortMax);
}

void topk_persist_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream, bool wide) {
  const char* where = "select_topk_device (persistent)";
  const Plan p = make_persist_plan(s_q, s_kv, wide);
  if (p.cluster == 0 || (sorted && k > kPostSortMax))
    throw std::invalid_argument(std::string(where) + ": shape s_kv=" + std::to_string(s_kv) +
                                ", k=" + std::to_string(k) + " exceeds the persistent kernel");
  const PersistFn fn = persist_kernel_for(p.chunks, wide);
  if (fn == nullptr)
    throw std::invalid_argument(std::string(where) + ": internal plan with " +
                                std::to_string(p.chunks) + " chunks a thread");
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)p.cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // Clusters resident at once for (width, chunks, cluster size): queried once, then cached.
  static int max_active[2][9][2 * kMaxCluster + 1] = {};
  int& fit = max_active[wide ? 1 : 0][p.chunks][p.cluster];
  if (fit == 0) {
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)p.smem));
    if (p.cluster > kMaxCluster)
      DSA_CUDA_CHECK(where, cudaFuncSetAttribute(
                                fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cfg.gridDim = dim3((unsigned)(p.cluster * 1024), 1, 1);
    DSA_CUDA_CHECK(where, cudaOccupancyMaxActiveClusters(&fit, fn, &cfg));
    if (fit <= 0)
      throw std::runtime_error(std::string(where) + ": no cluster of " +
                               std::to_string(p.cluster) + " CTAs fits on the device");
  }
  int64_t grid = std::min<int64_t>(s_q, fit);
  const int64_t cap = max_clusters_from_env();
  if (cap > 0) grid = std::min(grid, cap);
  cfg.gridDim = dim3((unsigned)(grid * p.cluster), 1, 1);
  DSA_CUDA_CHECK(where, cudaLaunchKernelEx(&cfg, fn, scores, s_q, s_kv, k, ks, ke,
                                           large ? 1 : 0, out, p.slice));
  if (sorted) sort_rows_launch(scores, s_q, s_kv, k, large, out, stream, where);
}

}  // namespace dsa::cuda::detail
