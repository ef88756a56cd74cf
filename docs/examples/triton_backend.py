#!/usr/bin/env python3
"""A DSA indexer written in Triton (CUDA), audited by dsa_verify.

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit triton_backend:TritonIndexer --device cuda --ops indexer_scores,topk

indexer_scores is one Triton program per (query row, block of BLOCK_S keys): for each
indexer head it loads q_idx[t, h, :], forms q·k for the block in fp32, applies ReLU and the
head weight, and writes -inf outside the row's key window [ks[t], ke[t]) (SPEC §1, §2).
topk is the plain-PyTorch one of torch_backend.py, so the audit's fused indexer + top-k
property runs too. Without Triton or without a CUDA device every method raises
NotImplementedError: the audit reports skips, naming the reason.

Status: written for the H200 machine and NOT run yet (this repository's CI has no GPU and
no Triton); the CPU path (skips) is run by the Python tests.
"""
import torch

from torch_backend import TorchBackend

try:  # Triton is optional: without it the backend only reports skips.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

if triton is not None:

    @triton.jit
    def _indexer_scores_kernel(q_ptr, k_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr, s_kv, n_heads, d_idx,
                               BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        t = tl.program_id(0)
        offs_s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        in_s = offs_s < s_kv
        in_d = offs_d < d_idx
        k = tl.load(k_ptr + offs_s[:, None] * d_idx + offs_d[None, :],
                    mask=in_s[:, None] & in_d[None, :], other=0.0).to(tl.float32)  # [BLOCK_S, BLOCK_D]
        acc = tl.zeros([BLOCK_S], dtype=tl.float32)
        for h in range(n_heads):
            q = tl.load(q_ptr + (t * n_heads + h) * d_idx + offs_d, mask=in_d, other=0.0).to(tl.float32)
            logits = tl.sum(k * q[None, :], axis=1)  # fp32 accumulation (SPEC §2)
            w = tl.load(w_ptr + t * n_heads + h)
            acc += w * tl.maximum(logits, 0.0)  # ReLU before the weight
        ks = tl.load(ks_ptr + t)
        ke = tl.load(ke_ptr + t)
        inside = (offs_s >= ks) & (offs_s < ke)
        acc = tl.where(inside, acc, float("-inf"))
        tl.store(out_ptr + t * s_kv + offs_s, acc, mask=in_s)


def _require_cuda(*tensors):
    if triton is None:
        raise NotImplementedError("triton is not installed")
    if not all(x.is_cuda for x in tensors):
        raise NotImplementedError("the Triton kernel runs on CUDA tensors only (audit with --device cuda)")


class TritonIndexer:
    """indexer_scores in Triton; topk from the PyTorch example."""

    name = "triton-indexer"
    deterministic = True  # one program writes each output element; no atomics

    def indexer_scores(self, q_idx, k_idx, w, ks, ke, BLOCK_S=64):
        _require_cuda(q_idx, k_idx, w, ks, ke)
        s_q, n_heads, d_idx = q_idx.shape
        s_kv = k_idx.shape[0]
        scores = torch.empty((s_q, s_kv), dtype=torch.float32, device=q_idx.device)
        if s_q == 0 or s_kv == 0:
            return scores
        grid = (s_q, triton.cdiv(s_kv, BLOCK_S))
        _indexer_scores_kernel[grid](q_idx.contiguous(), k_idx.contiguous(), w.float().contiguous(),
                                     ks.contiguous(), ke.contiguous(), scores, s_kv, n_heads, d_idx,
                                     BLOCK_S=BLOCK_S, BLOCK_D=triton.next_power_of_2(max(d_idx, 16)))
        return scores

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        _require_cuda(scores)
        return TorchBackend().topk(scores, k, tie_break, sorted, ks, ke)
