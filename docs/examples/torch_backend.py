#!/usr/bin/env python3
"""A DSA backend written in plain PyTorch (CPU or CUDA), audited by dsa_verify.

    PYTHONPATH=build/default/python:docs/examples \\
        python3 -m dsa_verify audit torch_backend:TorchBackend [--device cuda]

Every op of the contract (docs/SPEC.md §2-§7, and the §10 inference ops over FP8 bytes and
paged KV caches) in a few lines of torch, computed in fp32 from the exact values of the
inputs, outputs in the dtypes a kernel would return (out and the input gradients in the
input's dtype, statistics and dkv in fp32). Backward ops use autograd. Copy this class and replace a method's body by a call into your kernel; methods
you do not have are simply left out (their properties are skipped), and a method may raise
NotImplementedError for a case it does not handle (a skip, not a failure).

Conventions the audit expects (dsa_verify.Bridge): keyword arguments with SPEC names; key
windows as ks, ke int64 [s_q]; top-k ids int32 with -1 padding; natural-log lse; outputs as
a tensor, a tuple in SPEC order or a dict by name, contiguous. §10 ops: FP8 tensors arrive
as torch.uint8 bytes with `fp8_format` ("e4m3fn" / "e5m2"; on torch >= 2.1 a kernel can use
`t.view(torch.float8_e4m3fn)` instead of fp8_decode below); the FlashMLA KV cache is uint8
with 656 bytes per token, [tokens, 656] or [num_blocks, block_size(, 1), 656]; a paged case
has block_table [batch, max_blocks] and context_lens [batch] int32, block_size, max_context.
"""
import math

import torch

NEG_INF = float("-inf")
FP8_TOKEN_BYTES, FP8_NOPE, FP8_TILE, FP8_SCALES_AT, FP8_ROPE_AT = 656, 512, 128, 512, 528
_FP8_TABLES = {}


def _fp8_value(byte, fp8_format):
    """Exact value of one FP8 byte (OCP FP8: e4m3fn has no inf, NaN = S.1111.111; SPEC §10)."""
    sign = -1.0 if byte & 0x80 else 1.0
    if fp8_format == "e4m3fn":
        e, m = (byte >> 3) & 0xF, byte & 0x7
        if e == 0xF and m == 0x7:
            return math.nan
        return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    if fp8_format == "e5m2":
        e, m = (byte >> 2) & 0x1F, byte & 0x3
        if e == 0x1F:
            return sign * math.inf if m == 0 else math.nan
        return sign * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))
    raise ValueError(f"fp8_decode: argument 'fp8_format' got {fp8_format!r}, expected 'e4m3fn' or 'e5m2'")


def fp8_decode(data, fp8_format):
    """Exact values of FP8 bytes (uint8, any shape) as float32 of the same shape (every FP8 value
    is an fp32): a 256-entry table, built once per format and device. Raises TypeError when
    `data` is not uint8, ValueError for another format. SPEC §10."""
    if data.dtype != torch.uint8:
        raise TypeError(f"fp8_decode: argument 'data' has dtype {data.dtype}, expected torch.uint8 (FP8 bytes)")
    key = (fp8_format, data.device)
    if key not in _FP8_TABLES:
        _FP8_TABLES[key] = torch.tensor([_fp8_value(b, fp8_format) for b in range(256)],
                                        dtype=torch.float32).to(data.device)
    return _FP8_TABLES[key][data.long()]


def check_scales(op, arg, scales, read, where):
    """Raises ValueError naming `arg` and the first scale a kernel reads (`read`, bool like
    `scales`) that is not a positive finite fp32 (SPEC §10); where(i) names flat position i."""
    bad = read & ~((scales > 0) & torch.isfinite(scales))
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(f"{op}: argument '{arg}' got {where(i)} = {float(scales.reshape(-1)[i])}, "
                         "expected a positive finite fp32 scale (SPEC §10)")


def paged_entries(block_table, read_lens, block_size, width):
    """Block ids of logical keys 0..width-1 of every request (SPEC §10): entry [batch, width] =
    block_table[b, p // block_size] (table ints only, no cache read) and inside [batch, width]
    = p < read_lens[b], the keys a kernel reads; check entry[inside] before gathering."""
    batch, max_blocks = block_table.shape
    p = torch.arange(width, device=block_table.device)
    inside = p[None, :] < read_lens.long()[:, None]
    col = (p // block_size).clamp(max=max(max_blocks - 1, 0))
    entry = block_table.long()[:, col] if max_blocks else torch.zeros_like(inside, dtype=torch.long)
    return entry, inside


def paged_gather(k_cache, k_scale_cache, entry, inside, block_size):
    """Bytes [batch, width, d] and scales [batch, width] of the keys `inside` marks, at block
    entry[b, p], slot p % block_size; other positions read block 0 and must be masked. On CUDA
    an entry inside outside [0, num_blocks) is an illegal memory access: check first."""
    blk = torch.where(inside, entry, torch.zeros_like(entry))
    slot = (torch.arange(entry.shape[1], device=entry.device) % block_size)[None, :].expand_as(blk)
    if k_cache.shape[0] == 0:  # nothing can be read (a read entry would have been rejected)
        return k_cache.new_zeros(*blk.shape, k_cache.shape[2]), k_scale_cache.new_ones(blk.shape)
    return k_cache[blk, slot], k_scale_cache[blk, slot]


def window_mask(ks, ke, s_kv):
    """[s_q, s_kv] bool: key s is visible to row t iff ks[t] <= s < ke[t] (SPEC §1)."""
    cols = torch.arange(s_kv, device=ks.device)[None, :]
    return (cols >= ks[:, None]) & (cols < ke[:, None])


def _indexer(q_idx, k_idx, w):
    """I[t,s] = sum_j w[t,j] ReLU(q_idx[t,j]·k_idx[s]) in fp32, without the window (SPEC §2)."""
    logits = torch.einsum("thd,sd->ths", q_idx.float(), k_idx.float())
    return torch.einsum("th,ths->ts", w.float(), logits.relu())


def valid_slots(indices, s_kv, topk_length):
    """ids [s_q, k] int64 and valid [s_q, k] bool: 0 <= id < s_kv and slot < topk_length (§4)."""
    idx = indices.reshape(indices.shape[0], -1).long()
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(idx.shape[1], device=idx.device)[None, :] < topk_length.long()[:, None]
    return idx, valid


def _sparse_mla(q, kv, indices, sm_scale, d_v, topk_length, attn_sink):
    """SPEC §4 forward in fp32, differentiable and NaN-free on empty rows (§6)."""
    idx, valid = valid_slots(indices, kv.shape[0], topk_length)
    keys = kv[torch.where(valid, idx, torch.zeros_like(idx))]  # invalid slots gather row 0 ...
    keys = torch.where(valid[..., None], keys, torch.zeros_like(keys))  # ... and never use it (poison, NaN)
    return _sparse_mla_gathered(q, keys, valid, sm_scale, d_v, attn_sink)


def _sparse_mla_gathered(q, keys, valid, sm_scale, d_v, attn_sink):
    """SPEC §4 forward on the keys of each slot (keys [s_q, k, d_qk], zero where not valid)."""
    s_q, h_q, _ = q.shape
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

    # ---- SPEC §10 inference ops: FP8 bytes decoded exactly, products exact in fp32 ----------

    def fp8_indexer_scores(self, q_idx, k_idx, k_scale, w, ks, ke, fp8_format):
        s_kv = k_idx.shape[0]
        inside = window_mask(ks, ke, s_kv)
        read = inside.any(dim=0)  # keys some window reads; the others may hold NaN bytes or scales
        check_scales("fp8_indexer_scores", "k_scale", k_scale, read, lambda i: f"k_scale[{i}]")
        k = torch.where(read[:, None], fp8_decode(k_idx, fp8_format), torch.zeros((), device=k_idx.device))
        scale = torch.where(read, k_scale.float(), torch.ones_like(k_scale, dtype=torch.float32))
        logits = torch.einsum("thd,sd->ths", fp8_decode(q_idx, fp8_format), k) * scale
        scores = torch.einsum("th,ths->ts", w.float(), logits.relu())
        return scores.masked_fill(~inside, NEG_INF)

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        op = "paged_indexer_scores"
        batch, next_n, h_i, _ = q_idx.shape
        num_blocks, max_blocks = k_cache.shape[0], block_table.shape[1]
        if block_size != k_cache.shape[1]:
            raise ValueError(f"{op}: argument 'block_size' got {block_size}, expected k_cache.shape[1] = "
                             f"{k_cache.shape[1]}")
        lens = context_lens.long()
        bad = (lens < 0) | (lens > max_blocks * block_size)
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ValueError(f"{op}: argument 'context_lens' got context_lens[{b}] = {int(lens[b])}, expected "
                             f"0 <= L <= max_blocks * block_size = {max_blocks * block_size}")
        width = int(lens.max()) if max_context < 0 and batch else max(int(max_context), 0)
        if batch and int(lens.max()) > width:
            raise ValueError(f"{op}: argument 'max_context' got {max_context}, expected >= {int(lens.max())}")
        entry, inside = paged_entries(block_table, lens, block_size, width)
        # Only table entries inside a context are read; -1 or garbage may follow them (SPEC §10).
        bad = inside & ((entry < 0) | (entry >= num_blocks))
        if bool(bad.any()):
            b, p = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"{op}: argument 'block_table' got block_table[{b}, {p // block_size}] = "
                             f"{int(entry[b, p])}, expected a block id in [0, {num_blocks}) (context {int(lens[b])})")
        keys, scales = paged_gather(k_cache, k_scale_cache, entry, inside, block_size)
        check_scales(op, "k_scale_cache", scales, inside,
                     lambda i: f"the scale of key {i % max(width, 1)} of request {i // max(width, 1)}")
        k = torch.where(inside[..., None], fp8_decode(keys, fp8_format), torch.zeros((), device=keys.device))
        scales = torch.where(inside, scales.float(), torch.ones_like(scales, dtype=torch.float32))
        q = fp8_decode(q_idx, fp8_format)
        logits = torch.einsum("bnhd,bpd->bnhp", q, k) * scales[:, None, None, :]
        scores = torch.einsum("bnh,bnhp->bnp", w.float().reshape(batch, next_n, h_i), logits.relu())
        # MTP windows (SPEC §1): row i of request b sees [0, L - next_n + i + 1), clamped at 0.
        ke = (lens[:, None] - next_n + torch.arange(next_n, device=lens.device)[None, :] + 1).clamp(min=0)
        seen = torch.arange(width, device=lens.device)[None, None, :] < ke[:, :, None]
        return scores.masked_fill(~seen, NEG_INF).reshape(batch * next_n, width)

    def sparse_mla_fp8_fwd(self, q, kv_cache, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        op = "sparse_mla_fp8_fwd"
        if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != FP8_TOKEN_BYTES:
            raise ValueError(f"{op}: argument 'kv_cache' is {kv_cache.dtype} {list(kv_cache.shape)}, expected "
                             f"uint8 [..., {FP8_TOKEN_BYTES}]")
        cache = kv_cache.reshape(-1, FP8_TOKEN_BYTES)
        idx, valid = valid_slots(indices, cache.shape[0], topk_length)
        s_q, k = idx.shape
        # Only tokens valid slots address are read (the others may hold anything, SPEC §10).
        rows = cache[torch.where(valid, idx, torch.zeros_like(idx))] if cache.shape[0] else \
            cache.new_zeros(s_q, k, FP8_TOKEN_BYTES)
        scales = rows[..., FP8_SCALES_AT:FP8_ROPE_AT].contiguous().view(torch.float32)  # [s_q, k, 4]
        check_scales(op, "kv_cache", scales, valid[..., None].expand_as(scales),
                     lambda i: f"token {int(idx.reshape(-1)[i // 4])} tile {i % 4} scale")
        nope = fp8_decode(rows[..., :FP8_NOPE], "e4m3fn").reshape(s_q, k, FP8_NOPE // FP8_TILE, FP8_TILE)
        nope = (nope * scales[..., None]).reshape(s_q, k, FP8_NOPE)
        rope = rows[..., FP8_ROPE_AT:].contiguous().view(torch.bfloat16).float()
        keys = torch.cat([nope, rope], dim=-1)
        keys = torch.where(valid[..., None], keys, torch.zeros((), device=keys.device))
        out, lse, max_logits = _sparse_mla_gathered(q.float(), keys, valid, sm_scale, FP8_NOPE,
                                                    None if attn_sink is None else attn_sink.float())
        return out.to(q.dtype).contiguous(), lse.contiguous(), max_logits.contiguous()


if __name__ == "__main__":
    import sys

    import dsa_verify

    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    report = dsa_verify.audit(TorchBackend(), device=dev)
    print(report.summary())
    sys.exit(report.exit_code())
