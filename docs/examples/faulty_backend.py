#!/usr/bin/env python3
"""The PyTorch backend of torch_backend.py with one planted fault, to see what a failure
looks like:

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit faulty_backend:Log2LseBackend --ops sparse_mla_fwd

Log2LseBackend returns the sparse MLA log-sum-exp in base 2, as FlashMLA did before 2026-01
and TileLang does (SPEC §4 fixes the natural log). The audit fails every sparse MLA forward
case on `lse` with the measured error, the bound it broke and a one-line reproduction.

Two faults of the SPEC §10 inference ops, seen in 2026 FP8 decode kernels:

    python3 -m dsa_verify audit faulty_backend:PagedPrefetchPastContext --ops paged_indexer_scores
    python3 -m dsa_verify audit faulty_backend:TileScaleSwapped --ops sparse_mla_fp8_fwd

PagedPrefetchPastContext loads the block table entry one block past each context (a
prefetch) and gathers that block: correct while the entry holds a valid id, an out-of-bounds
read once it holds -1 or garbage, as SPEC §10 allows. The audit's poisoned re-run (entries
past every context replaced by out-of-range ids) fails it with the kernel's IndexError (on
CUDA an illegal memory access that ends the process: audit it there with --isolate).
TileScaleSwapped dequantizes NoPE tile i of the 656-byte FP8 KV cache with the scale of tile
(i + 1) mod 4: `out` misses its bound.
"""
import math

import torch

from torch_backend import FP8_ROPE_AT, FP8_SCALES_AT, TorchBackend, paged_entries, paged_gather


class Log2LseBackend(TorchBackend):
    """sparse_mla_fwd returns lse / ln 2 (base 2): a convention bug the audit must name."""

    name = "torch-example-log2-lse"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        out, lse, max_logits = super().sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)
        return out, lse / math.log(2.0), max_logits


class PagedPrefetchPastContext(TorchBackend):
    """paged_indexer_scores gathers ceil(L / block_size) + 1 blocks of each request: the table
    entry past the context is used as a block id (SPEC §10 says it is never read)."""

    name = "torch-example-paged-prefetch"

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        lens = context_lens.long()
        prefetch = ((lens + block_size - 1) // block_size + 1) * block_size
        prefetch = prefetch.clamp(max=block_table.shape[1] * block_size)
        width = int(prefetch.max()) if prefetch.numel() else 0
        entry, inside = paged_entries(block_table, prefetch, block_size, width)
        paged_gather(k_cache, k_scale_cache, entry, inside, block_size)  # the prefetch, unchecked
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens,
                                            block_size, max_context, fp8_format)


class TileScaleSwapped(TorchBackend):
    """sparse_mla_fp8_fwd reads the scale of NoPE tile (i + 1) mod 4 for tile i."""

    name = "torch-example-tile-scale-swapped"

    def sparse_mla_fp8_fwd(self, q, kv_cache, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        cache = kv_cache.reshape(-1, kv_cache.shape[-1]).clone()
        scales = cache[:, FP8_SCALES_AT:FP8_ROPE_AT].reshape(-1, 4, 4)  # [tokens, tile, fp32 bytes]
        cache[:, FP8_SCALES_AT:FP8_ROPE_AT] = torch.roll(scales, shifts=-1, dims=1).reshape(-1, 16)
        return super().sparse_mla_fp8_fwd(q, cache.reshape(kv_cache.shape), indices, sm_scale, d_v,
                                          topk_length, attn_sink)
