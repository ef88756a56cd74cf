"""Backends that break the Python route's rules one at a time (tests of dsa_verify)."""
import os
import signal
import time

import torch

from torch_backend import NEG_INF, TorchBackend, _sparse_mla, valid_slots


class TopkOnly(TorchBackend):
    """Only top-k (other ops absent: their properties are skipped)."""
    name = "topk-only"
    indexer_scores = indexer_scores_backward = sparse_mla_fwd = sparse_mla_bwd = indexer_kl_loss = None


class Raises(TopkOnly):
    name = "raises"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        return helper_that_fails(scores)


def helper_that_fails(scores):
    raise RuntimeError(f"kernel launch failed for scores of shape {list(scores.shape)}")


class NotImplementedTopk(TopkOnly):
    name = "not-implemented"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        raise NotImplementedError("this kernel has no top-k yet")


class NonContiguous(TopkOnly):
    name = "non-contiguous"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        ids = super().topk(scores, k, tie_break, sorted, ks, ke)
        return ids.t().contiguous().t() if ids.shape[0] > 1 and ids.shape[1] > 1 else ids


class Int64Ids(TopkOnly):
    name = "int64-ids"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        return super().topk(scores, k, tie_break, sorted, ks, ke).long()


class WrongShape(TopkOnly):
    name = "wrong-shape"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        return super().topk(scores, k, tie_break, sorted, ks, ke)[:, :max(k - 1, 0)].contiguous()


class ModifiesInput(TopkOnly):
    name = "modifies-input"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        ids = super().topk(scores, k, tie_break, sorted, ks, ke)
        scores.zero_()
        return ids


class SmallOnly(TopkOnly):
    """Declares the one tie policy it implements; the others are skipped, never sent."""
    name = "small-only"
    tie_breaks = ("small",)

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        assert tie_break == "small", tie_break
        return super().topk(scores, k, tie_break, sorted, ks, ke)


class ForwardOutAndLse(TorchBackend):
    """A sparse MLA forward that returns only out and lse, and says so (without the FP8 forward,
    whose outputs share these names)."""
    name = "fwd-out-lse"
    outputs = {"sparse_mla_fwd": ("out", "lse")}
    sparse_mla_fp8_fwd = None

    def sparse_mla_fwd(self, *a, **kw):
        out, lse, _ = super().sparse_mla_fwd(*a, **kw)
        return out, lse


class ForwardTwoUndeclared(TorchBackend):
    name = "fwd-two-undeclared"

    def sparse_mla_fwd(self, *a, **kw):
        out, lse, _ = super().sparse_mla_fwd(*a, **kw)
        return out, lse


class Segfaults(TopkOnly):
    name = "segfaults"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        os.kill(os.getpid(), signal.SIGSEGV)


class Hangs(TopkOnly):
    name = "hangs"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        time.sleep(3600)


class HangsOnMarker(TopkOnly):
    """Top-k, except that a call whose scores hold HANG_MARKER at row 0, column 71 creates the file
    $DSA_TEST_HANG_MARKER (so a test knows the call is running) and sleeps: an in-process kernel
    that hangs on one case (test_audit's signal tests plant the marker in a fixture)."""
    name = "hangs-on-marker"
    HANG_MARKER = 12345.678

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        if scores.dim() == 2 and scores.shape[1] > 71 and float(scores[0, 71]) == float(torch.tensor(
                self.HANG_MARKER, dtype=torch.float32)):
            open(os.environ["DSA_TEST_HANG_MARKER"], "w").close()
            time.sleep(3600)
        return super().topk(scores, k, tie_break, sorted, ks, ke)


class DeclinesNegInf(TopkOnly):
    """Declines (NotImplementedError) every top-k whose scores hold a -inf, inside or outside the
    windows: SPEC §3.1 and §2 make -inf part of every top-k's input (fresh12 F8)."""
    name = "declines-neg-inf"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        if bool(torch.isneginf(scores).any()):
            raise NotImplementedError("-inf scores not supported")
        return super().topk(scores, k, tie_break, sorted, ks, ke)


class Nondeterministic(TopkOnly):
    """Claims determinism, but under tie_break "any" alternates the tie fill between calls."""
    name = "nondeterministic"
    calls = 0

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        Nondeterministic.calls += 1
        if tie_break == "any":
            tie_break = "small" if Nondeterministic.calls % 2 else "large"
        return super().topk(scores, k, tie_break, sorted, ks, ke)


class Interrupts(TopkOnly):
    """Raises KeyboardInterrupt itself, no signal sent: a failed case, the audit goes on (fresh16 F2)."""
    name = "interrupts"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        raise KeyboardInterrupt


class ExitsProcess(TopkOnly):
    """Ends the process with status 0 in the kernel, as C or CUDA code calling exit(0) would
    (fresh16 F2: the in-process audit then exited 0 with nothing judged after it)."""
    name = "exits-process"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        os._exit(0)


class ExitsOnLongRows(TopkOnly):
    """Top-k, except that a call on rows of more than 16384 keys (topk.long_rows draws 32768 and
    more; topk.contract_exact fewer) ends the process with status 0: tests judged before the
    process ends (the pytest plugin's JUnit XML file records them and the ended one)."""
    name = "exits-on-long-rows"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        if scores.shape[-1] > 16384:
            self.end()
        return super().topk(scores, k, tie_break, sorted, ks, ke)

    def end(self):
        os._exit(0)


class SegfaultsOnLongRows(ExitsOnLongRows):
    """ExitsOnLongRows, killed by SIGSEGV instead of exiting."""
    name = "segfaults-on-long-rows"

    def end(self):
        os.kill(os.getpid(), signal.SIGSEGV)


class SystemExits(TopkOnly):
    """sys.exit(0) in the kernel: a failed case with its traceback, the audit goes on (fresh16 F2:
    it was "audit interrupted by SIGINT", exit 130, in the CLI and a KeyboardInterrupt in pytest)."""
    name = "system-exits"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        raise SystemExit(0)


# ---- SPEC §10 ops: outputs that break the contract's form, declared formats ---------------

class Fp8Only(TorchBackend):
    """Only the §10 inference ops."""
    name = "fp8-only"
    indexer_scores = indexer_scores_backward = topk = sparse_mla_fwd = sparse_mla_bwd = indexer_kl_loss = None


class Fp8NonContiguousScores(Fp8Only):
    name = "fp8-non-contiguous"

    def fp8_indexer_scores(self, *a, **kw):
        s = super().fp8_indexer_scores(*a, **kw)
        rows = s.new_empty(s.shape[0], s.shape[1] + 1)  # row stride s_kv + 1: not contiguous when s_q > 1
        rows[:, :s.shape[1]] = s
        return rows[:, :s.shape[1]]


class Fp8IntScores(Fp8Only):
    name = "fp8-int-scores"

    def fp8_indexer_scores(self, *a, **kw):
        return super().fp8_indexer_scores(*a, **kw).nan_to_num(0.0, 0.0, 0.0).to(torch.int32)


class PagedWrongWidth(Fp8Only):
    """Returns max_context - 1 columns (drops the last logical key)."""
    name = "paged-wrong-width"

    def paged_indexer_scores(self, *a, **kw):
        s = super().paged_indexer_scores(*a, **kw)
        return s[:, :-1].contiguous() if s.shape[1] else s


class PagedDeclaredReduced(Fp8Only):
    """Declares FP8 tensor-core accumulation (fp8_reduced_accumulation: the FP8 and paged indexer
    scores are judged by the 1024x looser ":fp8_tensor_core" rows) and computes them correctly."""
    name = "paged-declared-reduced"
    fp8_reduced_accumulation = True


class PagedDeclaredReducedLiar(PagedDeclaredReduced):
    """The same declaration, paged scores x(1 + 1e-3): under the declared bound's theta (4e-3 of a
    row's scale), so only the paged exact tier can catch it (fresh-user F4)."""
    name = "paged-declared-reduced-liar"

    def paged_indexer_scores(self, *a, **kw):
        return super().paged_indexer_scores(*a, **kw) * (1 + 1e-3)


class E5m2Only(Fp8Only):
    """Declares the FP8 format it decodes: e4m3fn cases are skipped, never sent."""
    name = "e5m2-only"
    fp8_formats = ("e5m2",)

    def fp8_indexer_scores(self, *a, **kw):
        assert kw["fp8_format"] == "e5m2", kw["fp8_format"]
        return super().fp8_indexer_scores(*a, **kw)


class SharedOutputsDeclaredForOne(TorchBackend):
    """Declares partial outputs for sparse_mla_fwd only, while sparse_mla_fp8_fwd (same names) is
    present: a usage error, not a silent partial judgement of the FP8 forward."""
    name = "shared-outputs-one"
    outputs = {"sparse_mla_fwd": ("out", "lse")}


class PagedClampsBadIds(Fp8Only):
    """Clamps block ids into the cache instead of rejecting a bad table (SPEC §10)."""
    name = "paged-clamps-ids"

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        table = block_table.clamp(0, max(k_cache.shape[0] - 1, 0))
        lens = context_lens.clamp(0, block_table.shape[1] * block_size)
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, table, lens, block_size,
                                            max_context, fp8_format)


class Fp8AbsScale(Fp8Only):
    """Uses |k_scale| (and 1 for a non-finite one) instead of rejecting an invalid scale."""
    name = "fp8-abs-scale"

    def fp8_indexer_scores(self, q_idx, k_idx, k_scale, w, ks, ke, fp8_format):
        scale = torch.where(torch.isfinite(k_scale) & (k_scale != 0), k_scale.abs(), torch.ones_like(k_scale))
        return super().fp8_indexer_scores(q_idx, k_idx, scale, w, ks, ke, fp8_format)


class PagedIndexesPastCache(Fp8Only):
    """Indexes the cache through every table entry a context reads without a check: a bad entry
    raises torch's IndexError, not the documented rejection (ValueError; fresh-user F3)."""
    name = "paged-indexes-past-cache"

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        for b in range(block_table.shape[0]):
            n = (int(context_lens[b]) + block_size - 1) // block_size
            ids = [int(block_table[b, i]) if i < block_table.shape[1] else -1 for i in range(n)]
            if any(i < 0 or i >= k_cache.shape[0] for i in ids):  # what k_cache[...] of such an id raises
                raise IndexError(f"index {ids} is out of bounds for dimension 0 with size {k_cache.shape[0]}")
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                                            max_context, fp8_format)


class UncheckedSection10Scales(Fp8Only):
    """The paged indexer and the FP8 sparse MLA with every scale replaced by |scale| (1 when 0 or
    not finite) instead of rejecting a read scale that is not positive finite (fresh-user F2)."""
    name = "unchecked-section10-scales"

    @staticmethod
    def _fixed(s):
        return torch.where(torch.isfinite(s) & (s != 0), s.abs(), torch.ones_like(s))

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, *a, **kw):
        return super().paged_indexer_scores(q_idx, k_cache, self._fixed(k_scale_cache), *a, **kw)

    def sparse_mla_fp8_fwd(self, q, kv_cache, *a, **kw):
        cache = kv_cache.clone()
        scales = cache[..., 512:528].contiguous().view(torch.float32)
        cache[..., 512:528] = self._fixed(scales).contiguous().view(torch.uint8)
        return super().sparse_mla_fp8_fwd(q, cache, *a, **kw)


class RecordsPagedCalls(Fp8Only):
    """Records what each paged_indexer_scores call receives (block_table, context_lens, k_cache
    blocks, whether a scale is NaN), then computes correctly."""
    name = "records-paged-calls"

    def __init__(self):
        self.calls = []

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, *a, **kw):
        self.calls.append((block_table.clone(), context_lens.clone(), k_cache.shape[0],
                           bool(torch.isnan(k_scale_cache).any())))
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens, *a, **kw)


class HalvedDkv(TorchBackend):
    """A right forward with a backward whose dkv is halved: --ops sparse_mla_fwd must not judge
    (nor report) its backward; --ops sparse_mla_bwd fails it under sparse_mla_bwd."""
    name = "halved-dkv"

    def sparse_mla_bwd(self, *a, **kw):
        dq, dkv, *rest = super().sparse_mla_bwd(*a, **kw)
        return (dq, (dkv * 0.5).contiguous(), *rest)


class DeclinesInvalidIds(TorchBackend):
    """Declines (NotImplementedError) every sparse MLA forward with an invalid id or
    topk_length: SPEC §4 behaviour every kernel must handle (finding F3)."""
    name = "declines-invalid-ids"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        ids = indices.reshape(indices.shape[0], -1)
        if topk_length is not None or bool(((ids < 0) | (ids >= kv.shape[0])).any()):
            raise NotImplementedError("only valid ids")
        return super().sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length=topk_length, attn_sink=attn_sink)


class HangsSmla(TorchBackend):
    """Every sparse MLA forward sleeps: an in-process kernel that hangs on its first call (the
    pytest plugin's tests of what a hang does to later tasks covering two ops)."""
    name = "hangs-smla"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        time.sleep(3600)


class DeclinesH1(TorchBackend):
    """Declines h_q == 1 (a shape it does not implement); correct otherwise."""
    name = "declines-h1"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        if q.shape[1] == 1:
            raise NotImplementedError("h_q 1 not supported")
        return super().sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length=topk_length, attn_sink=attn_sink)


def own_rounding_bf16(x):
    """x (float64) in bf16, rounded to the other bf16 neighbour wherever x lies within 1/16 of the
    neighbours' gap from their midpoint: one ulp off round-to-nearest, as a kernel's own fp32
    errors move such values across the midpoint."""
    near = x.to(torch.bfloat16)
    bits = near.view(torch.int16)  # sign-magnitude: bits +- 1 moves |x| by one ulp
    other = torch.where(near.double().abs() < x.abs(), bits + 1, bits - 1).to(torch.int16).view(torch.bfloat16)
    half_gap = (other.double() - near.double()).abs() / 2
    flip = (x != near.double()) & torch.isfinite(other.double()) & ((x - near.double()).abs() >= half_gap * (1 - 1 / 16))
    return torch.where(flip, other, near).contiguous()


class Bf16OwnRounding(TorchBackend):
    """A correct sparse MLA kernel (SPEC §4/§5) whose bf16 out is rounded its own way
    (own_rounding_bf16) and whose backward takes Delta = out.dout from the out it is handed: its
    own forward's (dsa_verify.Bridge runs it first, as the plugin loader does). Float64
    otherwise; dq, dkv, dsink in fp32. The Python twin of plugin/tests/bf16_out_kernel.h."""
    name = "bf16-own-rounding"

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        out, lse, max_logits = _sparse_mla(q.double(), kv.double(), indices, sm_scale, d_v, topk_length,
                                           None if attn_sink is None else attn_sink.double())
        return own_rounding_bf16(out), lse.float(), max_logits.float()

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        if out is None:
            out = self.sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)[0]
        qd, kvd, gd = q.double(), kv.double(), dout.double()
        idx, valid = valid_slots(indices, kv.shape[0], topk_length)
        keys = kvd[torch.where(valid, idx, torch.zeros_like(idx))]
        keys = torch.where(valid[..., None], keys, torch.zeros_like(keys))
        logits = torch.einsum("thd,tjd->thj", qd, keys) * sm_scale
        _, lse_v, _ = _sparse_mla(qd, kvd, indices, sm_scale, d_v, topk_length, None)
        lse_v = torch.where(valid.any(dim=1)[:, None].expand_as(lse_v), lse_v, torch.full_like(lse_v, NEG_INF))
        sink = None if attn_sink is None else attn_sink.double()[None, :].expand_as(lse_v)
        L = lse_v if sink is None else torch.logaddexp(lse_v, sink)  # SPEC §5: the sink is one more logit
        p = torch.where(valid[:, None, :].expand_as(logits), torch.exp(logits - L[..., None]), torch.zeros_like(logits))
        g = torch.einsum("thv,tjv->thj", gd, keys[..., :d_v])
        delta = (out.double() * gd).sum(dim=-1)  # from the out as the forward returned it
        ds = p * (g - delta[..., None])
        dq = sm_scale * torch.einsum("thj,tjd->thd", ds, keys)
        dkeys = sm_scale * torch.einsum("thj,thd->tjd", ds, qd)
        dkeys[..., :d_v] += torch.einsum("thj,thv->tjv", p, gd)
        dkv = torch.zeros_like(kvd).index_add_(0, idx[valid], dkeys[valid])
        grads = (dq.float().contiguous(), dkv.float().contiguous())
        if sink is None:
            return grads
        p_sink = torch.where(sink == float("inf"), torch.ones_like(sink),
                             torch.where(sink == NEG_INF, torch.zeros_like(sink), torch.exp(sink - L)))
        return grads + ((-(p_sink * delta).sum(dim=0)).float().contiguous(),)


class SinkAfterRounding(Bf16OwnRounding):
    """A correct sparse MLA kernel that rounds out to bf16 before applying attn_sink, as its own
    step: out = bf16(fp32(bf16(o) * r)), r = exp(lse) / (exp(lse) + exp(sink)) (SPEC §4's
    `out *=`), so it rounds twice. Its backward takes Delta from that out (Bf16OwnRounding's).
    Declares it with the attribute below (the CLI's --sink-after-rounding)."""
    name = "sink-after-rounding"
    sink_after_rounding = True

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        o, lse, max_logits = _sparse_mla(q.double(), kv.double(), indices, sm_scale, d_v, topk_length, None)
        o16 = o.to(torch.bfloat16)
        if attn_sink is None:
            return o16.contiguous(), lse.float(), max_logits.float()
        sink = attn_sink.double()[None, :].expand_as(lse)
        r = torch.where(torch.isfinite(lse), torch.exp(lse - torch.logaddexp(lse, sink)), torch.ones_like(lse))
        out = (o16.float() * r.float()[..., None]).to(torch.bfloat16)  # fp32 product, then bf16
        return out.contiguous(), lse.float(), max_logits.float()


class NormalizedPLiar(Bf16OwnRounding):
    """Declares normalized_p (softmax(P) rounded to bf16 before P.V) but returns the exact out
    rounded its own way (Bf16OwnRounding): the declared model's exact tier
    (smla.normalized_p_exact_tier) must fail it."""
    name = "normalized-p-liar"
    normalized_p = True


class DsinkOnly(TorchBackend):
    """Declares only dsink of the backward and returns zeros as dq and dkv (never judged): on a
    case without attn_sink it provides nothing the case defines."""
    name = "dsink-only"
    outputs = {"sparse_mla_bwd": ("dsink",)}

    def sparse_mla_bwd(self, *a, **kw):
        g = super().sparse_mla_bwd(*a, **kw)
        res = {"dq": torch.zeros_like(g[0]), "dkv": torch.zeros_like(g[1])}
        if len(g) == 3:
            res["dsink"] = g[2]
        return res


class RowTileBwd(TorchBackend):
    """A right forward with a backward that drops every query row past a 128-row tile (dout
    taken as 0 there): only smla.backward_many_rows draws that many rows for the backward, so
    the failure is filed under sparse_mla_bwd's own test (each many-row property judges one
    direction since ee3728d)."""
    name = "row-tile-bwd"

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        dout = dout.clone()
        dout[128:] = 0
        return super().sparse_mla_bwd(q, kv, indices, sm_scale, d_v, dout, out, lse, topk_length, attn_sink)


class RecordsCalls(TorchBackend):
    """A correct backend that records the name of every sparse MLA and paged indexer call
    (self.calls), to show which ops ran on a case (none may run on inputs the reference rejects)."""
    name = "records-calls"

    def __init__(self):
        self.calls = []

    def sparse_mla_fwd(self, q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
        self.calls.append("sparse_mla_fwd")
        return super().sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length=topk_length, attn_sink=attn_sink)

    def sparse_mla_bwd(self, q, kv, indices, sm_scale, d_v, dout, out=None, lse=None, topk_length=None,
                       attn_sink=None):
        self.calls.append("sparse_mla_bwd")
        return super().sparse_mla_bwd(q, kv, indices, sm_scale, d_v, dout, out, lse, topk_length, attn_sink)

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        self.calls.append("paged_indexer_scores")
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                                            max_context, fp8_format)


class IndexerDeclinesLegalInputs(TorchBackend):
    """The §2 indexer (forward and backward) declining negative head weights, and the paged
    indexer declining contexts shorter than next_n: legal inputs (SPEC §2: w may be negative;
    §1, §10: an MTP window of a short context is empty), no twin feature before fresh15 F2."""
    name = "declines-legal-indexer-inputs"
    topk = sparse_mla_fwd = sparse_mla_bwd = indexer_kl_loss = sparse_mla_fp8_fwd = fp8_indexer_scores = None

    def indexer_scores(self, q_idx, k_idx, w, ks, ke):
        if bool((w < 0).any()):
            raise NotImplementedError("negative head weights")
        return super().indexer_scores(q_idx, k_idx, w, ks, ke)

    def indexer_scores_backward(self, q_idx, k_idx, w, ks, ke, d_scores):
        if bool((w < 0).any()):
            raise NotImplementedError("negative head weights")
        return super().indexer_scores_backward(q_idx, k_idx, w, ks, ke, d_scores)

    def paged_indexer_scores(self, q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                             max_context, fp8_format):
        if bool((context_lens < q_idx.shape[1]).any()):
            raise NotImplementedError("context shorter than next_n")
        return super().paged_indexer_scores(q_idx, k_cache, k_scale_cache, w, block_table, context_lens, block_size,
                                            max_context, fp8_format)


class MisnamedTopk(TopkOnly):
    """Top-k under a misspelt method name (top_k): the audit judges no top-k case (fresh17 F6)."""
    name = "misnamed-topk"
    topk = None

    def top_k(self, *args, **kwargs):
        return TorchBackend.topk(self, *args, **kwargs)


class NanOutForward(TorchBackend):
    """The example's sparse MLA forward with out's flat element 3 NaN (the reference's is finite):
    a kernel whose only fault is a non-finite value (fresh18 F4). Forward only."""
    name = "nan-out-fwd"
    sparse_mla_bwd = None
    sparse_mla_fp8_fwd = None

    def sparse_mla_fwd(self, *a, **kw):
        out, lse, max_logits = super().sparse_mla_fwd(*a, **kw)
        out = out.clone()
        if out.numel() > 3:
            out.view(-1)[3] = float("nan")
        return out, lse, max_logits
