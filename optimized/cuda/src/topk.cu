// Top-k selection kernel (SPEC §3): one thread block per row; radix select on
// order-preserving uint32 keys (four 8-bit digit passes, shared-memory histograms) finds the
// k_eff-th largest selectable key v* and how many ties at v* to take; an ordered block-wide
// compaction collects the ids above v* and the tied ids in id order (deterministic); a
// bitonic sort on 64-bit (key, id) composites orders the prefix when sorted.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dsa/cuda/kernels.h"
#include "topk_cluster.h"
#include "topk_common.cuh"

namespace dsa::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
/// Sort buffers up to this many composites live in shared memory (64 KB), larger in scratch.
constexpr int64_t kSmemSortCap = 8192;

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

using detail::float_key;
using detail::next_pow2_dev;
using detail::row_window;

__device__ __forceinline__ void bitonic_sort_desc(unsigned long long* buf, int64_t count,
                                                  int64_t n, int tid) {
  detail::bitonic_sort_desc<kThreads>(buf, count, n, tid);
}

/// Sorts buf[0, keff) descending (bitonic over next_pow2(keff), padding with 0 which is below
/// every selectable key) when sorted, then writes the ids and -1 padding to orow[0, k).
__device__ __forceinline__ void sort_and_write(unsigned long long* buf, int keff, int64_t k,
                                               int large, int sorted, int32_t* orow) {
  const int tid = threadIdx.x;
  if (sorted && keff > 1) {
    bitonic_sort_desc(buf, keff, next_pow2_dev(keff), tid);
  }
  __syncthreads();
  for (int64_t j = tid; j < k; j += kThreads) {
    int32_t id = -1;
    if (j < keff) {
      const uint32_t low = (uint32_t)(buf[j] & 0xffffffffull);
      id = (int32_t)(large ? low : ~low);
    }
    orow[j] = id;
  }
}

/// Keys [lo, hi) of one row: four 8-bit radix passes over the row, then an ordered collection.
__device__ __forceinline__ void topk_row_radix(const float* __restrict__ row, int64_t lo,
                                               int64_t hi, int64_t k, int large, int sorted,
                                               int32_t* __restrict__ orow,
                                               unsigned long long* __restrict__ buf) {
  __shared__ uint32_t hist[256];
  __shared__ int warp_gt[kWarps];
  __shared__ int warp_eq[kWarps];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_remaining;  // ties at v* still to take after the last pass
  __shared__ int sh_keff;
  __shared__ int sh_neq;  // number of selectable keys equal to v*

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  uint32_t prefix = 0, pmask = 0;
  int remaining = 0;
  int keff = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t i = lo + tid; i < hi; i += kThreads) {
      bool sel;
      const uint32_t key = float_key(row[i], sel);
      if (sel && (key & pmask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l owns digits 255-8l down to 248-8l; scan group sums from the top digit down.
      uint32_t g = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) g += hist[255 - 8 * lane - b];
      uint32_t incl = g;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
      }
      const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
      int target;
      if (pass == 0) {
        const int64_t ke_ = min((int64_t)total, k);
        target = (int)ke_;
        if (lane == 0) sh_keff = target;
      } else {
        target = sh_remaining;
      }
      __syncwarp();  // every lane has read sh_remaining before one lane rewrites it below
      const uint32_t excl = incl - g;
      if (target > 0 && excl < (uint32_t)target && (uint32_t)target <= incl) {
        uint32_t acc = excl;
        for (int b = 0; b < 8; ++b) {
          const int d = 255 - 8 * lane - b;
          const uint32_t h = hist[d];
          if (acc + h >= (uint32_t)target) {
            sh_prefix = prefix | ((uint32_t)d << shift);
            sh_remaining = target - (int)acc;
            sh_neq = (int)h;
            break;
          }
          acc += h;
        }
      }
    }
    __syncthreads();
    if (pass == 0) {
      keff = sh_keff;
      if (keff == 0) break;
    }
    prefix = sh_prefix;
    pmask |= 255u << shift;
    remaining = sh_remaining;
    __syncthreads();  // everyone has read sh_* before warp 0 rewrites them
  }

  if (keff > 0) {
    const uint32_t vstar = prefix;
    const int need_eq = remaining;
    const int n_eq = sh_neq;
    const int n_gt = keff - need_eq;
    const int eq_first = large ? n_eq - need_eq : 0;  // tie rank window [eq_first, +need_eq)
    int cnt_gt = 0, cnt_eq = 0;
    const uint32_t lt_mask = (1u << lane) - 1u;
    for (int64_t base = lo; base < hi; base += kThreads) {
      const int64_t i = base + tid;
      bool gt = false, eq = false;
      uint32_t key = 0;
      if (i < hi) {
        bool sel;
        key = float_key(row[i], sel);
        gt = sel && key > vstar;
        eq = sel && key == vstar;
      }
      const uint32_t mgt = __ballot_sync(0xffffffffu, gt);
      const uint32_t meq = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) {
        warp_gt[warp] = __popc(mgt);
        warp_eq[warp] = __popc(meq);
      }
      __syncthreads();
      int off_gt = 0, off_eq = 0, tot_gt = 0, tot_eq = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const int a = warp_gt[w], b = warp_eq[w];
        if (w < warp) {
          off_gt += a;
          off_eq += b;
        }
        tot_gt += a;
        tot_eq += b;
      }
      const uint32_t low = large ? (uint32_t)i : ~(uint32_t)i;
      const unsigned long long comp = ((unsigned long long)key << 32) | low;
      if (gt) buf[cnt_gt + off_gt + __popc(mgt & lt_mask)] = comp;
      if (eq) {
        const int r = cnt_eq + off_eq + __popc(meq & lt_mask) - eq_first;
        if (r >= 0 && r < need_eq) buf[n_gt + r] = comp;
      }
      cnt_gt += tot_gt;
      cnt_eq += tot_eq;
      __syncthreads();
    }
  }
  sort_and_write(buf, keff, k, large, sorted, orow);
}

__global__ void __launch_bounds__(kThreads)
    topk_radix_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k,
                      const int64_t* __restrict__ ks, const int64_t* __restrict__ ke, int large,
                      int sorted, int32_t* __restrict__ out,
                      unsigned long long* __restrict__ scratch, int64_t buf_len) {
  extern __shared__ unsigned long long smem_buf[];
  const int64_t t = blockIdx.x;
  int64_t lo, hi;
  row_window(ks, ke, t, s_kv, lo, hi);
  topk_row_radix(scores + t * s_kv, lo, hi, k, large, sorted, out + t * k,
                 scratch ? scratch + t * buf_len : smem_buf);
}

constexpr int kTopBits = 11;               // first digit of the two-read path
constexpr int kTopBins = 1 << kTopBits;    // 2048 bins
constexpr int kCandCap = 4096;             // candidates of the boundary bin kept in smem

/// Two reads of the row: an 11-bit histogram finds the bin of v*; the second read collects the
/// ids above that bin (ordered compaction) and the bin's candidates (key, id) into shared
/// memory, where a bitonic sort picks the rest by (key desc, id by policy). Rows whose boundary
/// bin holds more than kCandCap keys (plateaus) take the radix path instead.
__global__ void __launch_bounds__(kThreads)
    topk_two_read_kernel(const float* __restrict__ scores, int64_t s_kv, int64_t k,
                         const int64_t* __restrict__ ks, const int64_t* __restrict__ ke,
                         int large, int sorted, int32_t* __restrict__ out,
                         unsigned long long* __restrict__ scratch, int64_t buf_len) {
  extern __shared__ unsigned long long smem_buf[];
  __shared__ uint32_t hist[kTopBins];
  __shared__ unsigned long long cand[kCandCap];
  __shared__ int warp_gt[kWarps];
  __shared__ int sh_keff, sh_digit, sh_ngt, sh_ncand, sh_count;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x;
  int64_t lo, hi;
  row_window(ks, ke, t, s_kv, lo, hi);
  const float* row = scores + t * s_kv;
  int32_t* orow = out + t * k;
  unsigned long long* buf = scratch ? scratch + t * buf_len : smem_buf;

  for (int i = tid; i < kTopBins; i += kThreads) hist[i] = 0;
  if (tid == 0) sh_count = 0;
  __syncthreads();
  for (int64_t i = lo + tid; i < hi; i += kThreads) {
    bool sel;
    const uint32_t key = float_key(row[i], sel);
    if (sel) atomicAdd(&hist[key >> (32 - kTopBits)], 1u);
  }
  __syncthreads();
  if (warp == 0) {
    constexpr int per = kTopBins / 32;  // bins per lane, lane 0 owns the top ones
    uint32_t g = 0;
    for (int b = 0; b < per; ++b) g += hist[kTopBins - 1 - per * lane - b];
    uint32_t incl = g;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
    const int target = (int)min((int64_t)total, k);
    if (lane == 0) sh_keff = target;
    const uint32_t excl = incl - g;
    if (target > 0 && excl < (uint32_t)target && (uint32_t)target <= incl) {
      uint32_t acc = excl;
      for (int b = 0; b < per; ++b) {
        const int d = kTopBins - 1 - per * lane - b;
        const uint32_t h = hist[d];
        if (acc + h >= (uint32_t)target) {
          sh_digit = d;
          sh_ngt = (int)acc;
          sh_ncand = (int)h;
          break;
        }
        acc += h;
      }
    }
  }
  __syncthreads();
  const int keff = sh_keff;
  if (keff == 0) {
    for (int64_t j = tid; j < k; j += kThreads) orow[j] = -1;
    return;
  }
  const int ncand = sh_ncand;
  if (ncand > kCandCap) {  // block-uniform
    topk_row_radix(row, lo, hi, k, large, sorted, orow, buf);
    return;
  }
  const uint32_t digit = (uint32_t)sh_digit;
  const int n_gt = sh_ngt;
  const uint32_t lt_mask = (1u << lane) - 1u;
  int cnt_gt = 0;
  for (int64_t base = lo; base < hi; base += kThreads) {
    const int64_t i = base + tid;
    bool gt = false, in_bin = false;
    uint32_t key = 0;
    if (i < hi) {
      bool sel;
      key = float_key(row[i], sel);
      gt = sel && (key >> (32 - kTopBits)) > digit;
      in_bin = sel && (key >> (32 - kTopBits)) == digit;
    }
    const uint32_t low = large ? (uint32_t)i : ~(uint32_t)i;
    const unsigned long long comp = ((unsigned long long)key << 32) | low;
    if (in_bin) cand[atomicAdd(&sh_count, 1)] = comp;  // order fixed later by the sort
    const uint32_t mgt = __ballot_sync(0xffffffffu, gt);
    if (lane == 0) warp_gt[warp] = __popc(mgt);
    __syncthreads();
    int off = 0, tot = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int a = warp_gt[w];
      if (w < warp) off += a;
      tot += a;
    }
    if (gt) buf[cnt_gt + off + __popc(mgt & lt_mask)] = comp;
    cnt_gt += tot;
    __syncthreads();
  }
  // Sort the candidates descending; the first keff - n_gt complete the selection.
  bitonic_sort_desc(cand, ncand, next_pow2_dev(ncand), tid);
  for (int j = tid; j < keff - n_gt; j += kThreads) buf[n_gt + j] = cand[j];
  __syncthreads();
  sort_and_write(buf, keff, k, large, sorted, orow);
}

}  // namespace

size_t topk_scratch_bytes(int64_t s_q, int64_t s_kv, int64_t k) {
  if (s_q <= 0 || s_kv <= 0 || k <= 0) return 0;
  const int64_t len = next_pow2(std::min(k, s_kv));
  if (len <= kSmemSortCap) return 0;
  return (size_t)s_q * (size_t)len * sizeof(unsigned long long);
}

void select_topk_device(const float* scores, int64_t s_q, int64_t s_kv, int64_t k,
                        const int64_t* ks, const int64_t* ke, const TopkPolicy& policy,
                        int32_t* out, void* scratch, cudaStream_t stream, TopkKernel variant) {
  const char* where = "select_topk_device";
  if (s_q < 0) throw std::invalid_argument(std::string(where) + ": argument 's_q' is negative");
  if (s_kv < 0 || s_kv > INT32_MAX)
    throw std::invalid_argument(std::string(where) + ": argument 's_kv' got " +
                                std::to_string(s_kv) + ", expected 0 <= s_kv <= 2^31-1");
  if (k < 0 || k > INT32_MAX)
    throw std::invalid_argument(std::string(where) + ": argument 'k' got " + std::to_string(k) +
                                ", expected 0 <= k <= 2^31-1");
  if ((ks == nullptr) != (ke == nullptr))
    throw std::invalid_argument(std::string(where) + ": arguments 'ks'/'ke' must both be given or both null");
  if (s_q == 0 || k == 0) return;
  if (s_q > INT32_MAX)
    throw std::invalid_argument(std::string(where) + ": argument 's_q' got " +
                                std::to_string(s_q) + ", expected <= 2^31-1");
  const bool large = policy.tie_break == TieBreak::Large;
  if (variant == TopkKernel::Persistent || variant == TopkKernel::PersistentWide) {
    const bool wide = variant == TopkKernel::PersistentWide;
    if (detail::topk_persist_supported(s_q, s_kv, k, policy.sorted, wide)) {
      detail::topk_persist_launch(scores, s_q, s_kv, k, ks, ke, large, policy.sorted, out, stream,
                                  wide);
      return;
    }
    variant = TopkKernel::Cluster;
  }
  if (variant == TopkKernel::Cluster || variant == TopkKernel::ClusterFusedSort) {
    if (detail::topk_cluster_supported(s_q, s_kv, k, policy.sorted)) {
      detail::topk_cluster_launch(scores, s_q, s_kv, k, ks, ke, large, policy.sorted, out, stream,
                                  variant == TopkKernel::ClusterFusedSort);
      return;
    }
    variant = TopkKernel::Radix;
  }
  const int64_t len = next_pow2(std::max<int64_t>(1, std::min(k, s_kv)));
  const bool use_scratch = len > kSmemSortCap;
  if (use_scratch && scratch == nullptr)
    throw std::invalid_argument(std::string(where) + ": argument 'scratch' is null, expected " +
                                std::to_string(topk_scratch_bytes(s_q, s_kv, k)) + " bytes");
  const size_t smem = use_scratch ? 0 : (size_t)len * sizeof(unsigned long long);
  auto* fn = variant == TopkKernel::TwoRead ? topk_two_read_kernel : topk_radix_kernel;
  // Always set: the two-read kernel's 41 KB of static shared memory leaves only 7 KB of
  // dynamic shared memory under the default 48 KB limit.
  DSA_CUDA_CHECK(where, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
  fn<<<(unsigned)s_q, kThreads, smem, stream>>>(
      scores, s_kv, k, ks, ke, large ? 1 : 0, policy.sorted ? 1 : 0, out,
      use_scratch ? static_cast<unsigned long long*>(scratch) : nullptr, len);
  DSA_CUDA_CHECK(where, cudaGetLastError());
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace dsa::cuda
