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
  for (int r = 0; r < csize; ++r) {
    const uint32_t* hr = cluster.map_shared_rank(h, r);
    if (per == 4) {
      const uint4 v = reinterpret_cast<const uint4*>(hr)[top >> 2];  // bins top-3..top
      out[0] += v.w; out[1] += v.z; out[2] += v.y; out[3] += v.x;
    } else {
      const uint2 v = reinterpret_cast<const uint2*>(hr)[top >> 1];  // bins top-1..top
      out[0] += v.y; out[1] += v.x;
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

template <int CH>
__global__ void __launch_bounds__(kThreads, 2)
    topk_cluster_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k,
                        const int64_t* __restrict__ ks, const int64_t* __restrict__ ke,
                        int large, int sorted, int32_t* __restrict__ out, int64_t slice) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int warp_sums[2][kWarps];
  __shared__ int sel[4];
  __shared__ int cta_counts[2];  // this CTA's #gt, #eq; read by higher ranks

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
        const uint4 v = mine[j ^ swz];
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
          const uint4 v = mine[j ^ swz];
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
      const uint4 v = mine[j ^ swz];
      const uint32_t r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (r[e] > bhi) gt_m |= 1ull << (4 * j + e);
        if (r[e] >= blo && r[e] <= bhi) eq_m |= 1ull << (4 * j + e);
      }
    }
  }
  const int my_gt = __popcll(gt_m), my_eq = __popcll(eq_m);
  int off_gt, off_eq, cta_gt, cta_eq;
  block_scan2(my_gt, my_eq, off_gt, off_eq, cta_gt, cta_eq, warp_sums, tid);
  if (tid == 0) {
    cta_counts[0] = cta_gt;
    cta_counts[1] = cta_eq;
  }
  cluster.sync();  // counts visible; every histogram read of the passes is finished
  int base_gt = 0, base_eq = 0;
  for (int r = 0; r < rank; ++r) {
    const int* c = cluster.map_shared_rank(cta_counts, r);
    base_gt += c[0];
    base_eq += c[1];
  }
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

}  // namespace

bool topk_cluster_supported(int64_t s_q, int64_t s_kv, int64_t k, bool sorted) {
  return make_plan(s_q, s_kv, k, sorted).cluster > 0;
}

void topk_cluster_launch(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                         const int64_t* ks, const int64_t* ke, bool large, bool sorted,
                         int32_t* out, cudaStream_t stream) {
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
                                           sorted ? 1 : 0, out, p.slice));
}

}  // namespace dsa::cuda::detail
