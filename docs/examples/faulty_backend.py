#!/usr/bin/env python3
"""The PyTorch backend of torch_backend.py with one planted fault, to see what a failure
looks like:

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit faulty_backend:Log2LseBackend --ops sparse_mla_fwd

Log2LseBackend returns the sparse MLA log-sum-exp in base 2, as FlashMLA did before 2026-01
and TileLang does (SPEC §4 fixes the natural log). The audit fails every sparse MLA forward
case on `lse` with the measured error, the bound it broke and a one-line reproduction.
"""
import math

from torch_backend import TorchBackend


class Log2LseBackend(TorchBackend):
    """sparse_mla_fwd returns lse / ln 2 (base 2): a convention bug the audit must name."""

    name = "torch-example-log2-lse"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        out, lse, max_logits = super().sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)
        return out, lse / math.log(2.0), max_logits
