"""Backends that break the Python route's rules one at a time (tests of dsa_verify)."""
import os
import signal
import time

from torch_backend import TorchBackend


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
    """A sparse MLA forward that returns only out and lse, and says so."""
    name = "fwd-out-lse"
    outputs = {"sparse_mla_fwd": ("out", "lse")}

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
    """Ctrl-C inside the kernel: the audit stops with KeyboardInterrupt (not a failed case)."""
    name = "interrupts"

    def topk(self, scores, k, tie_break, sorted, ks=None, ke=None):
        raise KeyboardInterrupt
