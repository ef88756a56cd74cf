// Internal: device helpers shared by the top-k kernels (topk.cu, topk_cluster.cu), SPEC §3.
#pragma once

#include <cstdint>

namespace dsa::cuda::detail {

/// Order-preserving key: larger float → larger key; -0.0 canonicalised to +0.0.
/// `selectable` is false for NaN and -inf (SPEC §3.1). Every selectable key is >= 0x00800000
/// (the key of -FLT_MAX), so 0 can stand for "not selectable".
__device__ __forceinline__ uint32_t float_key(float x, bool& selectable) {
  uint32_t b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0u;
  selectable = ((b & 0x7fffffffu) <= 0x7f800000u) && (b != 0xff800000u);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ int64_t next_pow2_dev(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

/// Key window [lo, hi) of row t (SPEC §1): ks/ke clamped to [0, s_kv], empty when ke <= ks.
__device__ __forceinline__ void row_window(const int64_t* ks, const int64_t* ke, int64_t t,
                                           int64_t s_kv, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = s_kv;
  if (ks) lo = min(max(ks[t], (int64_t)0), s_kv);
  if (ke) hi = min(max(ke[t], (int64_t)0), s_kv);
  if (hi < lo) hi = lo;
}

/// Block-wide bitonic sort of buf[0, n) into descending order over NT threads; first pads
/// buf[count, n) with 0 (below every selectable composite). n = next_pow2_dev(count) <= 2^30;
/// every thread of the block must call it. Ends with __syncthreads(). 32-bit index math
/// (shifts and masks: stride is a power of two).
template <int NT>
__device__ __forceinline__ void bitonic_sort_desc(unsigned long long* buf, int64_t count,
                                                  int64_t n64, int tid) {
  const int n = (int)n64;
  for (int i = (int)count + tid; i < n; i += NT) buf[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int j = tid; j < n / 2; j += NT) {
        const int a = ((j & ~(stride - 1)) << 1) | (j & (stride - 1));
        const int b = a + stride;
        const bool desc = (a & size) == 0;
        const unsigned long long x = buf[a], y = buf[b];
        if (desc ? (x < y) : (x > y)) {
          buf[a] = y;
          buf[b] = x;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace dsa::cuda::detail
