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
  if (chunks % 2 == 0) ++chunks;
  const int64_t sort_len = sorted ? next_pow2_host(std::min(k, s_kv)) : 0;
  const size_t region = std::max<size_t>(kHistBytes, (size_t)sort_len * 8);
  const size_t smem = (size_t)chunks * kThreads * 16 + region;
  if (smem > kMaxDynSmem) return p;
  if (s_q * (int64_t)c > INT32_MAX) return p;
  p.cluster = c;
  p.slice = slice;
  p.chunks = chunks;
  p.smem = smem;
  return p;
}

/// Adds 1 to h[bin] for every lane with `active`. When every active lane of the warp has the
/// same bin (plateaus, narrow bands) one lane adds the count; otherwise each active lane
/// issues its own shared-memory atomic. Every lane of the warp must call it.
__device__ __forceinline__ void hist_add(uint32_t* h, uint32_t bin, bool active, int lane) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (act == 0u) return;
  const int leader = __ffs(act) - 1;
  const uint32_t lb = __shfl_sync(0xffffffffu, bin, leader);
  if (__all_sync(0xffffffffu, !active || bin == lb)) {
    if (lane == leader) atomicAdd(&h[lb], (uint32_t)__popc(act));
  } else if (active) {
    atomicAdd(&h[bin], 1u);
  }
}

/// Cluster sum of the histograms h (nbins words at the same offset in every CTA) into tot.
__device__ __forceinline__ void combine(cg::cluster_group& cluster, uint32_t* h, uint32_t* tot,
                                        int nbins, int csize, int tid) {
  for (int b = tid; b < nbins; b += kThreads) {
    uint32_t s = 0;
    for (int r = 0; r < csize; ++r) s += cluster.map_shared_rank(h, r)[b];
    tot[b] = s;
  }
  __syncthreads();
}

/// Finds the bin d (scanning from the top) holding the target-th largest key: above = #keys
/// in bins > d, cnt = #keys in bin d; also total = #keys. target <= 0 or target > total
/// leave d = -1. Results in sel[0..3]; every thread must call it (nbins = 1024 or 2048:
/// thread i owns the nbins/512 bins counted down from nbins-1-(nbins/512)*i, read as one
/// conflict-free vector). Ends with __syncthreads().
__device__ __forceinline__ void find_bin(const uint32_t* tot, int nbins, int64_t target,
                                         int* sel, int (*warp_sums)[kWarps], int tid) {
  const int lane = tid & 31, warp = tid >> 5;
  const int per = nbins / kThreads;  // 2 or 4
  const int top = nbins - 1 - per * tid;  // highest bin of this thread
  uint32_t h[4] = {0u, 0u, 0u, 0u};
  if (per == 4) {
    const uint4 v = reinterpret_cast<const uint4*>(tot)[top >> 2];  // bins top-3..top
    h[0] = v.w; h[1] = v.z; h[2] = v.y; h[3] = v.x;
  } else {
    const uint2 v = reinterpret_cast<const uint2*>(tot)[top >> 1];  // bins top-1..top
    h[0] = v.y; h[1] = v.x;
  }
  const uint32_t g = h[0] + h[1] + h[2] + h[3];
  uint32_t incl = g;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
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

__global__ void __launch_bounds__(kThreads, 2)
    topk_cluster_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k,
                        const int64_t* __restrict__ ks, const int64_t* __restrict__ ke,
                        int large, int sorted, int32_t* __restrict__ out, int64_t slice,
                        int chunks) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) uint32_t tot[kBins1];
  __shared__ int warp_sums[2][kWarps];
  __shared__ int sel[4];
  __shared__ int cta_counts[2];  // this CTA's #gt, #eq; read by higher ranks

  cg::cluster_group cluster = cg::this_cluster();
  const int csize = (int)cluster.num_blocks();
  const int rank = (int)cluster.block_rank();
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t t = blockIdx.x / csize;

  uint4* keys4 = reinterpret_cast<uint4*>(smem);
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem + (size_t)chunks * kThreads * 16);
  uint32_t* h1 = hist;
  uint32_t* h2 = hist + kBins1;
  uint32_t* h3 = hist + kBins1 + kBins2;
  unsigned long long* sortbuf = reinterpret_cast<unsigned long long*>(hist);

  int64_t lo, hi;
  row_window(ks, ke, t, s_kv, lo, hi);
  const int64_t s0 = (int64_t)rank * slice;
  const int64_t s1 = min(s0 + slice, s_kv);
  const int64_t w0 = max(s0, lo), w1 = min(s1, hi);  // selectable part of this slice
  const float* row = scores + t * s_kv;

  // Copy the window part of the slice into shared memory (16-byte copies when aligned).
  {
    const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
    const int64_t nchunk = (s1 - s0 + 3) / 4;
    for (int64_t q = tid; q < nchunk; q += kThreads) {
      const int64_t base = s0 + 4 * q;
      if (base >= w1 || base + 4 <= w0) continue;
      const uint32_t dst = (uint32_t)__cvta_generic_to_shared(keys4 + q);
      if (aligned && base + 4 <= s1) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(row + base)
                     : "memory");
      } else {
        for (int e = 0; e < 4; ++e)
          if (base + e >= w0 && base + e < w1)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst + 4u * e),
                         "l"(row + base + e)
                         : "memory");
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    for (int i = tid; i < kHistWords; i += kThreads) hist[i] = 0u;
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  }

  // Pass 1: keys in place (0 = not selectable), histogram of bits 31..21.
  const int64_t my0 = s0 + (int64_t)tid * chunks * 4;  // first id of this thread's chunks
  for (int j = 0; j < chunks; ++j) {
    const int64_t base = my0 + 4 * j;
    const bool any = base < w1 && base + 4 > w0;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (any) {
      const uint4 raw = keys4[(int64_t)tid * chunks + j];
      uint32_t r[4] = {raw.x, raw.y, raw.z, raw.w};
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        bool ok = false;
        const uint32_t key = float_key(__uint_as_float(r[e]), ok);
        o[e] = (ok && base + e >= w0 && base + e < w1) ? key : 0u;
      }
      v = make_uint4(o[0], o[1], o[2], o[3]);
      keys4[(int64_t)tid * chunks + j] = v;
    } else {
      keys4[(int64_t)tid * chunks + j] = v;  // every chunk of the buffer holds keys (0 here)
    }
    hist_add(h1, v.x >> 21, v.x != 0u, lane);
    hist_add(h1, v.y >> 21, v.y != 0u, lane);
    hist_add(h1, v.z >> 21, v.z != 0u, lane);
    hist_add(h1, v.w >> 21, v.w != 0u, lane);
  }
  cluster.sync();
  combine(cluster, h1, tot, kBins1, csize, tid);
  find_bin(tot, kBins1, k, sel, warp_sums, tid);  // k > total: sel[0] = -1, handled below
  const int64_t total = sel[3];
  const int64_t keff = min(k, total);
  int64_t above = 0, cnt = 0, rem = keff;
  uint32_t prefix = 0;
  int shift = 21;
  bool done = false;
  if (keff > 0) {
    if (keff == total) {
      // Every selectable key is taken: the boundary bin is the lowest non-empty one.
      __syncthreads();
      find_bin(tot, kBins1, keff, sel, warp_sums, tid);
    }
    prefix = (uint32_t)sel[0];
    above = sel[1];
    cnt = sel[2];
    rem = keff - above;
    done = rem == cnt;
    if (!done) {
      // Pass 2: bits 20..10 of the keys in bin `prefix`.
      for (int j = 0; j < chunks; ++j) {
        const uint4 v = keys4[(int64_t)tid * chunks + j];
        hist_add(h2, (v.x >> 10) & 2047u, v.x != 0u && (v.x >> 21) == prefix, lane);
        hist_add(h2, (v.y >> 10) & 2047u, v.y != 0u && (v.y >> 21) == prefix, lane);
        hist_add(h2, (v.z >> 10) & 2047u, v.z != 0u && (v.z >> 21) == prefix, lane);
        hist_add(h2, (v.w >> 10) & 2047u, v.w != 0u && (v.w >> 21) == prefix, lane);
      }
      cluster.sync();
      combine(cluster, h2, tot, kBins2, csize, tid);
      find_bin(tot, kBins2, rem, sel, warp_sums, tid);
      prefix = (prefix << 11) | (uint32_t)sel[0];
      shift = 10;
      rem -= sel[1];
      cnt = sel[2];
      done = rem == cnt;
    }
    if (!done) {
      // Pass 3: bits 9..0 of the keys with bits 31..10 equal to `prefix`.
      for (int j = 0; j < chunks; ++j) {
        const uint4 v = keys4[(int64_t)tid * chunks + j];
        hist_add(h3, v.x & 1023u, v.x != 0u && (v.x >> 10) == prefix, lane);
        hist_add(h3, v.y & 1023u, v.y != 0u && (v.y >> 10) == prefix, lane);
        hist_add(h3, v.z & 1023u, v.z != 0u && (v.z >> 10) == prefix, lane);
        hist_add(h3, v.w & 1023u, v.w != 0u && (v.w >> 10) == prefix, lane);
      }
      cluster.sync();
      combine(cluster, h3, tot, kBins3, csize, tid);
      find_bin(tot, kBins3, rem, sel, warp_sums, tid);
      prefix = (prefix << 10) | (uint32_t)sel[0];
      shift = 0;
      rem -= sel[1];
      cnt = sel[2];
    }
  }
  // Boundary range [blo, bhi] of keys: everything above is taken, `rem` of the `cnt` keys
  // inside are taken (all of them unless shift == 0, i.e. ties at the exact key v*).
  const uint32_t blo = keff > 0 ? prefix << shift : 0xffffffffu;
  const uint32_t bhi = keff > 0 ? blo + ((1u << shift) - 1u) : 0xffffffffu;
  const int64_t need_eq = keff > 0 ? rem : 0;
  const int64_t n_gt = keff - need_eq;
  const int64_t first = large ? cnt - need_eq : 0;  // tie ranks taken: [first, first + need_eq)

  // Count this thread's keys above / inside the boundary range, in id order.
  int my_gt = 0, my_eq = 0;
  if (keff > 0) {
    for (int j = 0; j < chunks; ++j) {
      if (my0 + 4 * j >= s1) break;
      const uint4 v = keys4[(int64_t)tid * chunks + j];
      const uint32_t r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        my_gt += r[e] > bhi;
        my_eq += (r[e] >= blo && r[e] <= bhi);
      }
    }
  }
  int off_gt, off_eq, cta_gt, cta_eq;
  block_scan2(my_gt, my_eq, off_gt, off_eq, cta_gt, cta_eq, warp_sums, tid);
  if (tid == 0) {
    cta_counts[0] = cta_gt;
    cta_counts[1] = cta_eq;
  }
  cluster.sync();  // counts visible; every histogram read of the passes is finished
  int64_t base_gt = 0, base_eq = 0;
  for (int r = 0; r < rank; ++r) {
    const int* c = cluster.map_shared_rank(cta_counts, r);
    base_gt += c[0];
    base_eq += c[1];
  }
  unsigned long long* dst_sort = cluster.map_shared_rank(sortbuf, 0);
  int32_t* orow = out + t * k;
  if (my_gt + my_eq > 0) {
    int64_t pg = base_gt + off_gt, pe = base_eq + off_eq;
    for (int j = 0; j < chunks; ++j) {
      const int64_t base = my0 + 4 * j;
      if (base >= s1) break;
      const uint4 v = keys4[(int64_t)tid * chunks + j];
      const uint32_t r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int64_t pos = -1;
        if (r[e] > bhi) {
          pos = pg++;
        } else if (r[e] >= blo && r[e] <= bhi) {
          const int64_t rk = pe++ - first;
          if (rk >= 0 && rk < need_eq) pos = n_gt + rk;
        }
        if (pos >= 0) {
          const uint32_t id = (uint32_t)(base + e);
          if (sorted) {
            dst_sort[pos] = ((unsigned long long)r[e] << 32) | (large ? id : ~id);
          } else {
            orow[pos] = (int32_t)id;
          }
        }
      }
    }
  }
  if (!sorted) {
    for (int64_t j = keff + (int64_t)rank * kThreads + tid; j < k; j += (int64_t)csize * kThreads)
      orow[j] = -1;
  }
  cluster.sync();  // composites in CTA 0; no CTA reads another's shared memory after this
  if (!sorted || rank != 0) return;
  if (keff > 1) bitonic_sort_desc<kThreads>(sortbuf, keff, next_pow2_dev(keff), tid);
  for (int64_t j = tid; j < k; j += kThreads) {
    int32_t id = -1;
    if (j < keff) {
      const uint32_t low = (uint32_t)(sortbuf[j] & 0xffffffffull);
      id = (int32_t)(large ? low : ~low);
    }
    orow[j] = id;
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
  static bool attr_set = false;  // one process-wide opt-in to the large shared memory size
  if (!attr_set) {
    DSA_CUDA_CHECK(where, cudaFuncSetAttribute(topk_cluster_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)kMaxDynSmem));
    attr_set = true;
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
  DSA_CUDA_CHECK(where, cudaLaunchKernelEx(&cfg, topk_cluster_kernel, scores, s_kv, k, ks, ke,
                                           large ? 1 : 0, sorted ? 1 : 0, out, p.slice,
                                           p.chunks));
}

}  // namespace dsa::cuda::detail
