// The `cuda` backend: the hand-written kernels of dsa/cuda/kernels.h behind the oracle's
// Backend interface (host tensors in, host tensors out; copies to device 0 and back).
#pragma once

#include <memory>

#include "dsa/cuda/kernels.h"
#include "dsa/oracle/backend.h"

namespace dsa::cuda {

/// Backend "cuda": Op::IndexerScores / Op::IndexerScoresBackward (SPEC §2; q_idx/k_idx BF16,
/// w F32, H_I <= 64, d_I <= 128; scores F32, dq_idx/dk_idx BF16, dw F32), Op::SparseMlaBwd
/// unless CudaBackendOptions::mla_bwd is Fallback (SPEC §5; q/kv BF16, dout BF16, F16 or F32
/// (F16/F32 split exactly into bf16 parts, one kernel run each), d_qk and d_v up to 576 / 512
/// after padding to multiples of 8; dq, dkv, dsink F32), Op::Topk (SPEC §3; scores F32
/// [s_q,s_kv], returns I32 [s_q,k]) and Op::SparseMlaFwd (SPEC §4, §6; q/kv BF16, returns out
/// BF16, lse/max_logits F32); every other op, and other dtypes or shapes past the kernel
/// limits (F32/F16/F64 q, F64 scores or dout, H_I > 64), throw oracle::NotSupported.
/// unavailable_reason() is "no CUDA device" when cudaGetDeviceCount fails or reports 0.
/// Bad shapes or dtypes throw std::invalid_argument naming the argument; CUDA failures throw
/// std::runtime_error naming the call. Deterministic.
/// Kernel choice of a cuda backend (every choice meets SPEC §3/§4/§6 and passed the oracle
/// on the H200, bench/results/2026-11-30-gpu-topk-sparse-mla.md and
/// 2026-11-30-gpu-sparse-mla-fwd.md; the defaults are what the registered "cuda" backend uses:
/// the one-pass wgmma MLA kernel (OnePassWgmma, faster than its SplitD and OwnHalfFirst
/// variants on the H200), with its mma.sync fallback).
/// How the backend runs Op::SparseMlaBwd (SPEC §5). Kernel (the default): the tensor-core
/// backward in its deterministic mode (sparse_mla_backward_device,
/// SparseMlaBwdMode::Deterministic) after the backend's own forward (Δ from its bf16 out);
/// dq, dkv, dsink F32. KernelFast: the same with atomic dkv (the backend then reports
/// deterministic() false). Fallback: not supported (throws oracle::NotSupported).
enum class SparseMlaBwdPath { Fallback, Kernel, KernelFast };

/// The path named by the environment variable DSA_CUDA_SMLA_BWD: unset, empty or "kernel"
/// -> Kernel, "fast" -> KernelFast, "fallback" -> Fallback; other values throw
/// std::invalid_argument naming the variable.
SparseMlaBwdPath sparse_mla_bwd_path_from_env();

/// The backward's P / dS rounding named by the environment variable DSA_CUDA_SMLA_BWD_PDS:
/// unset, empty or "bf16" -> Bf16 (one bf16 rounding each, the default; a BF16 dout, one run),
/// "hilo" -> HiLo (bf16 hi + lo pairs, the kernel of sessions 9-11, which an F32 / F16 dout
/// split into bf16 parts always takes); other values throw std::invalid_argument naming the
/// variable.
SparseMlaBwdRounding sparse_mla_bwd_rounding_from_env();

/// The top-k kernel named by the environment variable DSA_CUDA_TOPK: unset or empty ->
/// Cluster (the default), "radix", "two-read", "cluster", "cluster-fused-sort", "persistent",
/// "persistent-wide"; other values throw std::invalid_argument naming the variable.
TopkKernel topk_kernel_from_env();

/// The forward kernel named by the environment variable DSA_CUDA_SMLA_FWD: unset, empty or
/// "wgmma" -> OnePassWgmma, "mma" -> OnePass (the mma.sync one-pass kernel); other values
/// throw std::invalid_argument naming the variable (an audit of a non-default kernel).
SparseMlaKernel sparse_mla_kernel_from_env();

struct CudaBackendOptions {
  TopkKernel topk_kernel = topk_kernel_from_env();
  SparseMlaKernel mla_kernel = sparse_mla_kernel_from_env();
  IndexerKernel indexer_kernel = IndexerKernel::Wgmma3;
  IndexerBwdKernel indexer_bwd_kernel = IndexerBwdKernel::WgmmaOverlap;
  SparseMlaBwdPath mla_bwd = sparse_mla_bwd_path_from_env();
  SparseMlaBwdRounding mla_bwd_rounding = sparse_mla_bwd_rounding_from_env();
};
std::unique_ptr<oracle::Backend> make_cuda_backend(const CudaBackendOptions& options = {});

/// Registers make_cuda_backend under the name "cuda" (oracle::register_backend; idempotent).
void register_cuda_backend();

}  // namespace dsa::cuda
