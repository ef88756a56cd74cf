#!/usr/bin/env python3
"""A DSA backend written in plain PyTorch (CPU or CUDA), audited by dsa_verify.

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit torch_backend:TorchBackend [--device cuda]

Every op of the contract (docs/SPEC.md §2-§7) in a few lines of torch, computed in fp32 from
the exact values of the inputs, outputs in the dtypes a kernel would return (out and the
input gradients in the input's dtype, statistics and dkv in fp32). Backward ops use
autograd. Copy this class and replace a method's body by a call into your kernel; methods
you do not have are simply left out (their properties are skipped), and a method may raise
NotImplementedError for a case it does not handle (a skip, not a failure).

Conventions the audit expects (dsa_verify.Bridge): keyword arguments with SPEC names; key
windows as ks, ke int64 [s_q]; top-k ids int32 with -1 padding; natural-log lse; outputs as
a tensor, a tuple in SPEC order or a dict by name, contiguous.
"""
import torch

NEG_INF = float("-inf")


def window_mask(ks, ke, s_kv):
    """[s_q, s_kv] bool: key s is visible to row t iff ks[t] <= s < ke[t] (SPEC §1)."""
    cols = torch.arange(s_kv, device=ks.device)[None, :]
    return (cols >= ks[:, None]) & (cols < ke[:, None])


def _indexer(q_idx, k_idx, w):
    """I[t,s] = sum_j w[t,j] ReLU(q_idx[t,j]·k_idx[s]) in fp32, without the window (SPEC §2)."""
    logits = torch.einsum("thd,sd->ths", q_idx.float(), k_idx.float())
    return torch.einsum("th,ths->ts", w.float(), logits.relu())


def _sparse_mla(q, kv, indices, sm_scale, d_v, topk_length, attn_sink):
    """SPEC §4 forward in fp32, differentiable and NaN-free on empty rows (§6)."""
    s_q, h_q, _ = q.shape
    s_kv = kv.shape[0]
    idx = indices.reshape(s_q, -1).long()
    k = idx.shape[1]
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(k, device=idx.device)[None, :] < topk_length.long()[:, None]
    keys = kv[torch.where(valid, idx, torch.zeros_like(idx))]  # invalid slots gather row 0 ...
    keys = torch.where(valid[..., None], keys, torch.zeros_like(keys))  # ... and never use it (poison, NaN)
    logits = torch.einsum("thd,tjd->thj", q, keys) * sm_scale
    mask = valid[:, None, :].expand_as(logits)
    nonempty = valid.any(dim=1)[:, None].expand(s_q, h_q)
    max_logits = torch.where(mask, logits, torch.full_like(logits, NEG_INF)).amax(dim=-1)
    shift = torch.where(nonempty, max_logits, torch.zeros_like(max_logits)).detach()
    e = torch.where(mask, torch.exp(torch.where(mask, logits - shift[..., None], torch.zeros_like(logits))),
                    torch.zeros_like(logits))
    denom = torch.where(nonempty, e.sum(dim=-1), torch.ones_like(shift))
    out = torch.einsum("thj,tjd->thd", e / denom[..., None], keys[..., :d_v])
    lse = torch.where(nonempty, shift + torch.log(denom), torch.full_like(shift, float("inf")))
    if attn_sink is not None:  # out *= exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)
        lse_finite = torch.where(nonempty, lse, torch.zeros_like(lse))
        # Finite sinks: exp(lse - logaddexp(lse, sink)), whose gradient exp(sink - L) keeps its
        # precision down to fp32's normal range (autograd through sigmoid(lse - sink) gives
        # σ(1 - σ) = 0 once σ rounds to 1, e.g. a sink of -80: dsink 0 instead of ~1e-34).
        # ±inf sinks: sigmoid (0 or 1, gradient 0), kept out of logaddexp (inf - inf).
        sink = attn_sink[None, :].expand_as(lse_finite)
        finite = torch.isfinite(sink)
        safe = torch.where(finite, sink, torch.zeros_like(sink))
        scale = torch.where(finite, torch.exp(lse_finite - torch.logaddexp(lse_finite, safe)),
                            torch.sigmoid(lse_finite - torch.where(finite, torch.zeros_like(sink), sink)))
        out = out * scale[..., None]
    return out, lse, max_logits


class TorchBackend:
    """The contract in PyTorch; passes the full dsa-verify audit on CPU and CUDA."""

    name = "torch-example"
    deterministic = True  # no atomics: identical inputs give identical bytes (SPEC §3.5)

    def indexer_scores(self, q_idx, k_idx, w, ks, ke):
        scores = _indexer(q_idx, k_idx, w)
        return scores.masked_fill(~window_mask(ks, ke, k_idx.shape[0]), NEG_INF)

    def indexer_scores_backward(self, q_idx, k_idx, w, ks, ke, d_scores):
        q = q_idx.float().requires_grad_(True)
        k = k_idx.float().requires_grad_(True)
        wf = w.float().requires_grad_(True)
        grad = d_scores.float().masked_fill(~window_mask(ks, ke, k_idx.shape[0]), 0.0)
        dq, dk, dw = torch.autograd.grad(_indexer(q, k, wf), (q, k, wf), grad_outputs=grad)
        return dq.to(q_idx.dtype).contiguous(), dk.to(k_idx.dtype).contiguous(), dw.contiguous()

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        s_q, s_kv = scores.shape
        selectable = ~torch.isnan(scores) & (scores != NEG_INF)
        if ks is not None:
            selectable &= window_mask(ks, ke, s_kv)
        # -0.0 + 0.0 = +0.0: equal scores compare equal (SPEC §3.3); excluded entries sort last.
        keyed = torch.where(selectable, scores + 0.0, torch.full_like(scores, NEG_INF))
        if tie_break == "large":  # equal scores: largest column id first
            keyed = keyed.flip(1)
        _, order = torch.sort(keyed, dim=1, descending=True, stable=True)
        if tie_break == "large":
            order = s_kv - 1 - order
        order = order[:, :k]
        if order.shape[1] < k:  # k > s_kv is legal: pad
            order = torch.cat([order, order.new_full((s_q, k - order.shape[1]), -1)], dim=1)
        k_eff = selectable.sum(dim=1).clamp(max=k)
        slots = torch.arange(k, device=scores.device)[None, :]
        return torch.where(slots < k_eff[:, None], order, torch.full_like(order, -1)).to(torch.int32).contiguous()

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        out, lse, max_logits = _sparse_mla(q.float(), kv.float(), indices, sm_scale, d_v, topk_length,
                                           None if attn_sink is None else attn_sink.float())
        return out.to(q.dtype), lse, max_logits

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        qf = q.float().requires_grad_(True)
        kvf = kv.float().requires_grad_(True)
        leaves = [qf, kvf]
        sink = None
        if attn_sink is not None:
            sink = attn_sink.float().requires_grad_(True)
            leaves.append(sink)
        o, _, _ = _sparse_mla(qf, kvf, indices, sm_scale, d_v, topk_length, sink)
        grads = torch.autograd.grad(o, leaves, grad_outputs=dout.float())
        return tuple(g.contiguous() for g in (grads[0].to(q.dtype),) + grads[1:])

    def indexer_kl_loss(self, scores, q, kv, sm_scale, ks, ke, mode, coeff, indices=None):
        s_q, s_kv = scores.shape
        keys = window_mask(ks, ke, s_kv) & (scores != NEG_INF)  # -inf is never in S_t (SPEC §7)
        if mode == "sparse":
            ids = indices.reshape(s_q, -1).long()
            ids = torch.where((ids >= 0) & (ids < s_kv), ids, torch.full_like(ids, s_kv))  # invalid: extra column
            chosen = torch.zeros(s_q, s_kv + 1, dtype=torch.bool, device=scores.device)
            chosen.scatter_(1, ids, True)
            keys &= chosen[:, :s_kv]
        rows = keys.any(dim=1)
        n_rows = int(rows.sum())
        # Teacher: sum over heads of softmax over S_t of the attention logits, L1-normalised.
        logits = torch.einsum("thd,sd->ths", q.float(), kv.float()) * sm_scale
        teacher = torch.softmax(logits.masked_fill(~keys[:, None, :], NEG_INF), dim=-1)
        teacher = torch.nan_to_num(teacher, nan=0.0).sum(dim=1)
        teacher = teacher / teacher.sum(dim=1, keepdim=True).clamp_min(1e-30)
        student = torch.log_softmax(scores.float().masked_fill(~keys, NEG_INF), dim=-1)
        student = torch.where(keys, student, torch.zeros_like(student))
        terms = torch.where(teacher > 0, teacher * (torch.log(teacher.clamp_min(1e-45)) - student),
                            torch.zeros_like(teacher))
        scale = coeff / n_rows if n_rows else 0.0
        loss = terms.sum().reshape(1) * scale
        d_scores = torch.where(keys, torch.exp(student) - teacher, torch.zeros_like(teacher)) * scale
        return loss, d_scores


if __name__ == "__main__":
    import sys

    import dsa_verify

    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    report = dsa_verify.audit(TorchBackend(), device=dev)
    print(report.summary())
    sys.exit(report.exit_code())
