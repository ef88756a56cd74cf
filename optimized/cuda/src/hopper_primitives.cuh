// Internal: the PTX wrappers the hand-written tensor-core kernels share (indexer.cu,
// sparse_mla_onepass.cu, sparse_mla_wgmma.cu, sparse_mla_bwd.cu): cp.async, ldmatrix,
// mma.sync, named barriers, the async-proxy fence, wgmma with its shared-memory matrix
// descriptors, and the 128-byte swizzle those descriptors address. One inline asm statement
// each, nothing added around it; source of every rule: the PTX ISA (8.x) section named on each
// line.
//
// The wgmma wrappers assemble only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); built for any other
// target they trap, so a caller must keep launches away (as sparse_mla_wgmma_takes() does).
// Accumulator fragments are fp32 registers in the PTX "wgmma D matrix" layout; wgmma operands
// in shared memory are bf16, K-major unless the wrapper says transposed (MN-major).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace dsa::cuda::detail {

// ---------------------------------------------------------------- addresses and conversions

/// 32-bit shared-state-space address of a generic pointer into shared memory
/// (cvta.to.shared; PTX ISA "cvta").
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Two floats rounded to bf16 (round to nearest even) packed lo | hi << 16, the register
/// layout of an mma/wgmma bf16 A fragment pair (cvt.rn.bf16x2.f32; PTX ISA "cvt").
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// 2^x, approximate, subnormal inputs and results flushed to zero; -inf gives +0
/// (ex2.approx.ftz.f32; PTX ISA "ex2").
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------- cp.async (sm_80+)

/// Copies 16 bytes global -> shared, bypassing L1 (cp.async.cg, cp-size 16); dst and src
/// 16-byte aligned (PTX ISA "cp.async").
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

/// As cp_async16 with an L2 cache policy from l2_policy_evict_first / l2_policy_evict_last
/// (cp.async.cg ... .L2::cache_hint; PTX ISA "cp.async").
__device__ __forceinline__ void cp_async16_hint(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "l"(policy));
}

/// An L2 cache policy marking every line an access touches evict-first / evict-last
/// (createpolicy.fractional, fraction 1.0; PTX ISA "createpolicy"), for the .L2::cache_hint
/// operand of loads, cp.async and red.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

/// cp.async.cg of 16 bytes reading only src_bytes (0 or 16) of src and zero-filling the rest:
/// src_bytes 0 writes 16 zero bytes and reads nothing (src-size operand; PTX ISA "cp.async").
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src,
                                                 uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

/// cp.async.ca (through L1) of 4 bytes, 4-byte aligned, reading src_bytes (0 or 4): 0 writes
/// a zero word and reads nothing (PTX ISA "cp.async").
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src,
                                                uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

/// Closes this thread's pending cp.async operations into one group (cp.async.commit_group;
/// PTX ISA "cp.async.commit_group").
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N of this thread's committed cp.async groups are pending; N is an
/// immediate; other threads' copies need a barrier as well (cp.async.wait_group N; PTX ISA
/// "cp.async.wait_group").
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Waits for every committed cp.async group of this thread (cp.async.wait_group 0).
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

/// Stores 16 zero bytes to shared memory, 16-byte aligned (st.shared.v4.u32; PTX ISA "st").
__device__ __forceinline__ void st_shared_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
}

// ---------------------------------------------------------------- ldmatrix, mma.sync (sm_80+)

/// Four 8x8 b16 matrices from shared memory into the mma fragment layout: lane l supplies the
/// 16-byte-aligned row address of row l%8 of matrix l/8; r[i] holds matrix i
/// (ldmatrix.sync.aligned.m8n8.x4.shared.b16, warp-wide; PTX ISA "ldmatrix").
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// As ldsm_x4, each 8x8 matrix transposed (ldmatrix ... .trans; PTX ISA "ldmatrix").
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Two transposed 8x8 b16 matrices: lanes 0-7 address the rows of the first, 8-15 of the
/// second (ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16; PTX ISA "ldmatrix").
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

/// d[0..3] += A (m16 x k16 bf16, 4 registers) * B (k16 x n8 bf16, registers b0 b1), fp32
/// accumulation, warp-wide (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32; PTX ISA
/// "mma", fragment layouts "Matrix Fragments for mma.m16n8k16").
__device__ __forceinline__ void mma16816(float* d, const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------- barriers and fences

/// Waits on named barrier `id` (1..15; 0 is __syncthreads) until `count` threads (a multiple
/// of 32, all warps of the participants) arrive (bar.sync id, count; PTX ISA "bar").
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/// Makes this thread's generic-proxy writes to shared memory visible to the async proxy
/// (wgmma operands, TMA) after a barrier (fence.proxy.async.shared::cta, sm_90; PTX ISA
/// "membar/fence", proxy fences).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Keeps the compiler from moving reads/writes of the register r across the asm statements
/// around it (an empty asm with r as in-out operand): orders accumulator uses against async
/// wgmma, which the compiler cannot see through.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

/// As reg_fence for a 32-bit register (an A fragment that an asynchronous wgmma reads).
__device__ __forceinline__ void reg_fence(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

/// reg_fence on every register of an accumulator fragment.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) reg_fence(d[j]);
}

// ---------------------------------------------------------------- wgmma (sm_90a)

/// Orders this warpgroup's prior register and shared-memory accesses before the wgmma that
/// follow; required before the first wgmma and whenever their accumulators were touched
/// (wgmma.fence.sync.aligned, warpgroup-wide; PTX ISA "wgmma.fence").
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Closes the warpgroup's pending wgmma.mma_async operations into one group
/// (wgmma.commit_group.sync.aligned; PTX ISA "wgmma.commit_group").
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Waits until at most N wgmma groups of the warpgroup are pending; before that their
/// accumulators must not be read (wgmma.wait_group.sync.aligned N; PTX ISA "wgmma.wait_group").
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

/// Waits for every wgmma group of the warpgroup (wgmma.wait_group.sync.aligned 0).
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }

/// wgmma shared-memory matrix descriptor in the 128-byte swizzle mode: start address, leading
/// and stride byte offsets (each >> 4 into 14 bits), layout type 1 (bits 62-63); addresses
/// 16-byte aligned, swizzle atoms 1024-byte aligned (PTX ISA "Matrix Descriptor").
/// K-major operand of 128-byte rows: lbo 16 (unused when swizzled), sbo 1024 (8-row groups).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

/// Byte offset of 16-byte chunk c (8 bf16) of row r in a tile of `rows` rows stored as
/// 64-column blocks of rows x 128 bytes in the 128-byte swizzle: block c / 8, chunk
/// (c % 8) XOR (r % 8) (PTX ISA "Shared Memory Matrix Layout", 128B swizzling).
__device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Operand lists of the wgmma wrappers: accumulator registers %0.. and "+f" constraints on d[].
#define DSA_WGMMA_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define DSA_WGMMA_R16 \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DSA_WGMMA_R32 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define DSA_WGMMA_R48 \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DSA_WGMMA_R64 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define DSA_WGMMA_R80 \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define DSA_WGMMA_R96 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define DSA_WGMMA_R112 \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define DSA_WGMMA_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define DSA_WGMMA_D16(i) \
  DSA_WGMMA_D4(i), DSA_WGMMA_D4(i + 4), DSA_WGMMA_D4(i + 8), DSA_WGMMA_D4(i + 12)
#define DSA_WGMMA_D64(i) \
  DSA_WGMMA_D16(i), DSA_WGMMA_D16(i + 16), DSA_WGMMA_D16(i + 32), DSA_WGMMA_D16(i + 48)

/// d += A B, wgmma m64n32k16, bf16 A and B in shared memory by descriptor, fp32 accumulators
/// (16 per thread); scale_d 0 ignores d's old value; B MN-major when kTransB. Asynchronous:
/// wgmma_fence before, commit and wait before reading d (PTX ISA "wgmma.mma_async").
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" DSA_WGMMA_R0 "}, "
      "%16, %17, p, 1, 1, 0, %19;\n}\n"
      : DSA_WGMMA_D16(0)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  (void)d; (void)desc_a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

/// As wgmma_m64n32k16_ss for m64n64k16 (32 accumulators per thread).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" DSA_WGMMA_R0 ", " DSA_WGMMA_R16
      "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : DSA_WGMMA_D16(0), DSA_WGMMA_D16(16)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  (void)d; (void)desc_a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

/// As wgmma_m64n32k16_ss for m64n128k16 (64 accumulators per thread).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DSA_WGMMA_R0 ", " DSA_WGMMA_R16
      ", " DSA_WGMMA_R32 ", " DSA_WGMMA_R48 "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : DSA_WGMMA_D64(0)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  (void)d; (void)desc_a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

/// d += A B, wgmma m64n128k16 with A from registers (4 per thread: the m16 x k16 mma.sync A
/// fragment of the thread's warp) and B in shared memory by descriptor, K-major, or MN-major
/// when kTransB; the A registers are read asynchronously (keep them unchanged until the wait);
/// otherwise as wgmma_m64n32k16_ss (PTX ISA "wgmma.mma_async", register-A form).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DSA_WGMMA_R0 ", " DSA_WGMMA_R16
      ", " DSA_WGMMA_R32 ", " DSA_WGMMA_R48 "}, {%64, %65, %66, %67}, %69, p, 1, 1, %70;\n}\n"
      : DSA_WGMMA_D64(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc_b), "n"(kTransB));
#else
  (void)d; (void)a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

/// As wgmma_m64n32k16_ss for m64n256k16 (128 accumulators per thread).
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DSA_WGMMA_R0 ", " DSA_WGMMA_R16
      ", " DSA_WGMMA_R32 ", " DSA_WGMMA_R48 ", " DSA_WGMMA_R64 ", " DSA_WGMMA_R80
      ", " DSA_WGMMA_R96 ", " DSA_WGMMA_R112 "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
      : DSA_WGMMA_D64(0), DSA_WGMMA_D64(64)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
#else
  (void)d; (void)desc_a; (void)desc_b; (void)scale_d;
  __trap();
#endif
}

#undef DSA_WGMMA_R0
#undef DSA_WGMMA_R16
#undef DSA_WGMMA_R32
#undef DSA_WGMMA_R48
#undef DSA_WGMMA_R64
#undef DSA_WGMMA_R80
#undef DSA_WGMMA_R96
#undef DSA_WGMMA_R112
#undef DSA_WGMMA_D4
#undef DSA_WGMMA_D16
#undef DSA_WGMMA_D64

}  // namespace dsa::cuda::detail
