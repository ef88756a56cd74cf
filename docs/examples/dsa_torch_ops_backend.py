#!/usr/bin/env python3
"""The project's own operator library, torch.ops.dsa.* (optimized/: LibTorch composites on CPU
and CUDA, and with the CUDA build the hand-written top-k kernel), audited from Python the way
a user audits a vLLM / SGLang / FlashMLA op: a thin Python backend that calls the ops.

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOps --seed 7
    # the same verdicts as: build/default/cli/dsa-verify audit --backend libtorch-cpu --seed 7

    # GPU machine (cuda preset): the CUDA dispatch of the same library
    DSA_TORCH_OPS_LIB=$BUILD/optimized/cuda/libdsa_torch_ops.so PYTHONPATH=... \\
        python3 -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOpsCuda --device cuda --seed 7
    # to compare with: dsa-verify audit --backend libtorch-cuda --seed 7

The library is loaded from $DSA_TORCH_OPS_LIB (torch.ops.load_library) when set, else by
importing dsa_verify._backends, which links the same operator library (the `dsa` namespace
can be registered once per process). The CPU comparison with the CLI runs in CI
(python/tests/test_same_verdicts.py). On the H200 the CUDA one crashed at the first rejected
input (the library carried its own static libstdc++; fixed by linking PyTorch's shared runtime,
dsa_shared_cxx_runtime in CMakeLists.txt) and has not been re-run since.
"""
import os

import torch


def load_ops():
    """Registers torch.ops.dsa once per process."""
    if getattr(load_ops, "done", False):
        return
    lib = os.environ.get("DSA_TORCH_OPS_LIB")
    if lib:
        torch.ops.load_library(lib)
    else:
        import dsa_verify._backends  # noqa: F401 - registers the `dsa` operator library
    load_ops.done = True


class DsaTorchOps:
    """torch.ops.dsa.* on the audit's device; deterministic on the CPU (SPEC §3.5)."""

    name = "dsa-torch-ops"
    deterministic = True

    def __init__(self):
        load_ops()
        self.ops = torch.ops.dsa

    def indexer_scores(self, q_idx, k_idx, w, ks, ke):
        return self.ops.indexer_scores(q_idx, k_idx, w, ks, ke)

    def indexer_scores_backward(self, q_idx, k_idx, w, ks, ke, d_scores):
        return self.ops.indexer_scores_backward(q_idx, k_idx, w, d_scores, ks, ke)

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        return self.ops.topk_indices(scores, k, ks, ke, tie_break, sorted)

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        return self.ops.sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        if out is None or lse is None:  # the audit passes this backend's own forward (SPEC §5)
            out, lse, _ = self.sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)
        dq, dkv, dsink = self.ops.sparse_mla_bwd(q, kv, indices, out, lse, dout, sm_scale, d_v, topk_length,
                                                 attn_sink)
        return (dq, dkv) if attn_sink is None else (dq, dkv, dsink)

    def indexer_kl_loss(self, scores, q, kv, sm_scale, ks, ke, mode, coeff, indices=None):
        return self.ops.indexer_kl_loss(scores, q, kv, sm_scale, ks, ke, mode, indices, coeff)

    # SPEC §10 (FP8 bytes as uint8 + fp8_format; block_size is k_cache.shape[1] for the op).
    def fp8_indexer_scores(self, q_idx, k_idx, k_scale, w, ks, ke, fp8_format):
        return self.ops.fp8_indexer_scores(q_idx, k_idx, k_scale, w, ks, ke, fp8_format)

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        return self.ops.paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens,
                                             max_context, fp8_format)

    def sparse_mla_fp8_fwd(self, q, kv_cache, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        return self.ops.sparse_mla_fp8_fwd(q, kv_cache, indices, sm_scale, topk_length, attn_sink)


class DsaTorchOpsCuda(DsaTorchOps):
    """The same ops on CUDA tensors: dkv accumulates with atomics, so not bitwise deterministic
    (as the libtorch-cuda backend declares)."""

    name = "dsa-torch-ops-cuda"
    deterministic = False
