"""The project's own C++ backends as Python backends (for auditing them through the Python
route and comparing with `dsa-verify audit`): the registered ones (reference, libtorch-cpu,
libtorch-cuda, cuda; module dsa_verify._backends, built when the project has LibTorch) and
the property suite's mutants (one field fault each).

    rep = dsa_verify.audit(dsa_verify.builtin.BuiltinBackend("libtorch-cpu"), seed=7)
    # same verdicts as: dsa-verify audit --backend libtorch-cpu --seed 7
"""
from torch.utils import dlpack as _dlpack

from . import _core
from ._bridge import OPS


class BuiltinBackend:
    """A C++ dsa::oracle::Backend with the Python backend interface (torch tensors in and out;
    inputs are moved to the host, as the C++ backend copies to its own device). Ops the C++
    backend does not support are absent (their properties are skipped, as in the CLI)."""

    def __init__(self, name=None, cpp=None):
        if cpp is None:
            if name == "reference":
                cpp = _core.make_reference()
            else:
                from . import _backends  # links LibTorch; absent when built without it
                cpp = _backends.make(name)
        self._cpp = cpp
        self.name = cpp.name
        self.deterministic = cpp.deterministic
        self.fp8_reduced_accumulation = cpp.fp8_reduced_accumulation
        for op in OPS:
            if not cpp.supports(op):
                setattr(self, op, None)

    def unavailable_reason(self):
        return self._cpp.unavailable_reason()

    def _call(self, op, tensors, scalars):
        caps = {n: None if t is None else _dlpack.to_dlpack(t.detach().cpu().contiguous())
                for n, t in tensors.items()}
        return {n: _dlpack.from_dlpack(c) for n, c in self._cpp.call(op, caps, scalars).items()}

    def indexer_scores(self, q_idx, k_idx, w, ks, ke):
        return self._call("indexer_scores", dict(q_idx=q_idx, k_idx=k_idx, w=w, ks=ks, ke=ke), {})

    def indexer_scores_backward(self, q_idx, k_idx, w, ks, ke, d_scores):
        return self._call("indexer_scores_backward",
                          dict(q_idx=q_idx, k_idx=k_idx, w=w, ks=ks, ke=ke, d_scores=d_scores), {})

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        return self._call("topk", dict(scores=scores, ks=ks, ke=ke), dict(k=k, tie_break=tie_break, sorted=sorted))

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        return self._call("sparse_mla_fwd", dict(q=q, kv=kv, indices=indices, topk_length=topk_length,
                                                 attn_sink=attn_sink), dict(sm_scale=sm_scale, d_v=d_v))

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        return self._call("sparse_mla_bwd", dict(q=q, kv=kv, indices=indices, dout=dout, topk_length=topk_length,
                                                 attn_sink=attn_sink), dict(sm_scale=sm_scale, d_v=d_v))

    def indexer_kl_loss(self, scores, q, kv, sm_scale, ks, ke, mode, coeff, indices=None):
        return self._call("indexer_kl_loss", dict(scores=scores, q=q, kv=kv, ks=ks, ke=ke, indices=indices),
                          dict(sm_scale=sm_scale, mode=mode, coeff=coeff))

    # SPEC §10: FP8 bytes as torch.uint8 with fp8_format, as the audit passes them.
    def fp8_indexer_scores(self, q_idx, k_idx, k_scale, w, ks, ke, fp8_format):
        return self._call("fp8_indexer_scores", dict(q_idx=q_idx, k_idx=k_idx, k_scale=k_scale, w=w, ks=ks, ke=ke),
                          dict(fp8_format=fp8_format))

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        return self._call("paged_indexer_scores",
                          dict(q_idx=q_idx, k_cache=k_cache, k_scale_cache=k_scale_cache, w=w,
                               block_table=block_table, context_lens=context_lens),
                          dict(max_context=max_context, fp8_format=fp8_format))

    def sparse_mla_fp8_fwd(self, q, kv_cache, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        return self._call("sparse_mla_fp8_fwd", dict(q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length,
                                                     attn_sink=attn_sink), dict(sm_scale=sm_scale))


def mutant(name):
    """The property suite's mutant `name` (see _core.mutant_names()) as a Python backend."""
    return BuiltinBackend(cpp=_core.make_mutant(name))


def reference():
    return BuiltinBackend("reference")


# Spec-style factories for `python3 -m dsa_verify audit dsa_verify.builtin:libtorch_cpu`.
def libtorch_cpu():
    return BuiltinBackend("libtorch-cpu")


def libtorch_cuda():
    return BuiltinBackend("libtorch-cuda")
