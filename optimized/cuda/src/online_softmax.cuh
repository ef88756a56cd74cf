// Internal: the online-softmax step of the one-pass sparse MLA forward kernels
// (sparse_mla_onepass.cu on mma.sync, sparse_mla_wgmma.cu on wgmma), SPEC §4, §6. A block holds
// 64 heads (rows) x one tile of 64 slots; the slots are split in two halves of 32 columns
// between two groups of warps. A thread holds, in the mma/wgmma C layout, rows r0 and r0 + 8
// and columns 32 half + 8 j + 2 c4 + {0, 1} (j = 0..3) of its half: s[4 j + e] is row
// r0 + 8 (e / 2), column 32 half + 8 j + 2 c4 + e % 2.
#pragma once

#include <cmath>
#include <cstdint>

#include "hopper_primitives.cuh"

namespace dsa::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = 2^(x log2 e)

/// Masks and scales the thread's logits in place (s * sm_scale, -inf where ids[column] < 0:
/// an invalid slot) and writes the maxima of rows r0, r0 + 8 over this half to
/// red_s[half * 64 + row] (one lane of each quad). The caller synchronises before
/// softmax_rescale reads both halves.
__device__ __forceinline__ void mask_scale_row_max(float (&s)[16], const int* ids, int half,
                                                   int c4, int r0, int r1, float sm_scale,
                                                   float* red_s) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = 32 * half + 8 * j + 2 * c4;
    const bool v0 = ids[col] >= 0, v1 = ids[col + 1] >= 0;
    // __fmul_rn: never contracted into a later FMA, so write_p's s - m is exactly 0 at the
    // max (p = 1: a one-slot row has l = 1 and lse = max_logits exactly).
    s[4 * j + 0] = v0 ? __fmul_rn(s[4 * j + 0], sm_scale) : -INFINITY;
    s[4 * j + 1] = v1 ? __fmul_rn(s[4 * j + 1], sm_scale) : -INFINITY;
    s[4 * j + 2] = v0 ? __fmul_rn(s[4 * j + 2], sm_scale) : -INFINITY;
    s[4 * j + 3] = v1 ? __fmul_rn(s[4 * j + 3], sm_scale) : -INFINITY;
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j + 0], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], off));
    mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], off));
  }
  if (c4 == 0) {
    red_s[half * 64 + r0] = mx[0];
    red_s[half * 64 + r1] = mx[1];
  }
}

/// The online-softmax update of rows r0, r1 = r0 + 8 from both halves' maxima in red_s
/// (written by mask_scale_row_max, then a barrier): m_run becomes the new running max;
/// alpha = exp(m_old - m_new) (0 while m_old = -inf) rescales O and l; base = m_new for
/// write_p, with a max still -inf replaced by 0 (a fully masked leading tile gives p = 0,
/// never exp(-inf - -inf)). exp by ex2.approx (hopper_primitives.cuh).
__device__ __forceinline__ void softmax_rescale(const float* red_s, int r0, int r1,
                                                float (&m_run)[2], float (&alpha)[2],
                                                float (&base_out)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = i ? r1 : r0;
    const float mn = fmaxf(m_run[i], fmaxf(red_s[r], red_s[64 + r]));
    const float base = mn == -INFINITY ? 0.f : mn;  // all masked so far: p = 0, no NaN
    alpha[i] = ex2((m_run[i] - base) * kLog2e);     // m_run = -inf -> 0
    m_run[i] = mn;
    base_out[i] = base;
  }
}

/// p = exp(s - m_new) = 2^((s - base) log2(e)) of the thread's 16 logits (s - base is exact
/// near the max, so the max itself gets p = 1 exactly; 2^(s log2(e) - m log2(e)) by one FMA
/// gave 2^(rounding error of m log2(e)), which moved lse of a one-slot row off max_logits and,
/// at logits ~2^18, by 1% of p), written as bf16 into P (64 rows x 64 slots, 128-byte rows,
/// 16-byte chunk c of row r at chunk c ^ (r % 8); p_w its 32-bit words); ps[i] += the sum of
/// row r0 + 8 i's p (the rows' share of l).
__device__ __forceinline__ void write_p(const float (&s)[16], const float (&base)[2], int half,
                                        int c4, int r0, int r1, uint32_t* p_w, float (&ps)[2]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float p0 = ex2((s[4 * j + 0] - base[0]) * kLog2e);
    const float p1 = ex2((s[4 * j + 1] - base[0]) * kLog2e);
    const float p2 = ex2((s[4 * j + 2] - base[1]) * kLog2e);
    const float p3 = ex2((s[4 * j + 3] - base[1]) * kLog2e);
    ps[0] += p0 + p1;
    ps[1] += p2 + p3;
    const int chunk = 4 * half + j;
    p_w[r0 * 32 + ((chunk ^ (r0 & 7)) << 2) + c4] = pack_bf16(p0, p1);
    p_w[r1 * 32 + ((chunk ^ (r1 & 7)) << 2) + c4] = pack_bf16(p2, p3);
  }
}

}  // namespace dsa::cuda::detail
