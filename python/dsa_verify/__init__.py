"""dsa_verify: audit a DeepSeek Sparse Attention kernel written in Python (PyTorch, Triton,
TileLang, ...) with the dsa-verify oracle, property suite and fixtures (docs/SPEC.md).

    import dsa_verify
    report = dsa_verify.audit(MyKernel(), ops=["topk"], level=0, device="cuda")
    print(report.summary())

    python3 -m dsa_verify audit mypkg.kernels:MyKernel [--ops topk --level 1 --device cuda]
    python3 -m pytest -p dsa_verify.pytest_plugin --dsa-backend=mypkg.kernels:MyKernel

Every verdict comes from the C++ judgement of `dsa-verify` (the same oracle, tolerance table,
properties, fixtures and report writers). Import errors of dsa_verify._core mean the module
was not built: `cmake --build build/default --target dsa_verify_core`, then
PYTHONPATH=build/default/python.
"""
from __future__ import annotations  # the torch.Tensor annotations below are not evaluated

import json as _json
from dataclasses import dataclass, field
from typing import Dict

# torch is imported by the functions that convert tensors, not with the package: a command
# that stops at a usage error (`python3 -m dsa_verify audit --timeout 0`, the pytest plugin's
# option checks) never pays for importing torch (~2 s of CPU per process).
from . import _core
from ._audit import CaseResult, Report, audit, flag_argument, load_backend, names_argument  # noqa: F401
from ._bridge import OPS, OUTPUTS, Bridge  # noqa: F401

__version__ = _core.version
__all__ = ["audit", "load_fixture", "compare", "Report", "CaseResult", "Fixture", "CompareResult",
           "load_backend", "Bridge", "OPS", "OUTPUTS"]


def _torch(caps, device):
    from torch.utils import dlpack as _dlpack
    return {n: (None if c is None else _dlpack.from_dlpack(c).to(device)) for n, c in caps.items()}


@dataclass
class Fixture:
    """A dsa-verify-fixture/1 file as torch tensors (docs/fixtures.md)."""
    path: str
    case: str
    op: str  # e.g. "sparse_mla_fwd+bwd", "topk"
    producer: str
    notes: str
    params: dict  # sm_scale, d_v, k, tie_break, sorted, mode, coeff, ...
    inputs: Dict[str, torch.Tensor]  # SPEC names, as stored
    expected: Dict[str, torch.Tensor]  # expected.<name>, prefix stripped
    calls: Dict[str, dict] = field(default_factory=dict)

    @property
    def ops(self):
        """The op names this fixture covers, e.g. ["sparse_mla_fwd", "sparse_mla_bwd"]."""
        return list(self.calls)

    def kwargs(self, op):
        """Keyword arguments of backend.<op>(...) for this case, exactly as the audit passes
        them (windows as ks/ke int64, absent optional inputs None, scalars). sparse_mla_bwd also
        needs out and lse from your forward (SPEC §5). Raises KeyError naming the op."""
        if op not in self.calls:
            raise KeyError(f"fixture {self.case} ({self.op}) has no op '{op}'; it covers {self.ops}")
        return dict(self.calls[op])


def load_fixture(path, device="cpu"):
    """Reads a fixture (golden, peer or a dumped failing case) as torch tensors on `device`.
    Raises RuntimeError naming the file when it is not a valid dsa-verify-fixture/1 file."""
    d = _core.load_fixture(str(path))
    calls = {}
    for op, (tensors, none, scalars) in d["calls"].items():
        kw = _torch(tensors, device)
        kw.update({n: None for n in none})
        kw.update(scalars)
        calls[op] = kw
    return Fixture(path=str(path), case=d["case"], op=d["op"], producer=d["producer"], notes=d["notes"],
                   params=_json.loads(d["params"]), inputs=_torch(d["inputs"], device),
                   expected=_torch(d["expected"], device), calls=calls)


@dataclass
class CompareResult:
    """Verdict of compare(), as `dsa-verify compare` prints it."""
    passed: bool  # the verdict line is AGREES (possibly "partial")
    verdict_line: str  # "AGREES", "AGREES (partial: max_logits not judged)", "DISAGREES", "INCOMPLETE", ...
    report: str  # the op reports: per-output table, bounds, notes
    ops: list  # one dict per op judged: op, verdict, reason, worst_ratio, nonfinite_mismatches, notes, details
    conventions_applied: list

    def __bool__(self):
        return self.passed


def _host_capsule(name, t):
    import torch
    from torch.utils import dlpack as _dlpack
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"compare: output '{name}' is {type(t).__name__}, expected a torch.Tensor")
    if not t.is_contiguous():
        raise ValueError(f"compare: output '{name}' is not contiguous (strides {list(t.stride())})")
    try:
        return _dlpack.to_dlpack(t.detach().cpu())
    except (RuntimeError, BufferError, TypeError) as e:
        # DLPack carries no torch.bool (and some other dtypes): no SPEC output has such a dtype,
        # so the error names the output and its dtype rather than DLPack's own words.
        raise ValueError(f"compare: output '{name}' has dtype {t.dtype}, which no SPEC output has and "
                         f"DLPack cannot carry ({e}); expected the dtype the op defines for '{name}'") from e


def compare(golden, outputs, conventions=(), provided_outputs=None, allow_weak=False, sink_after_rounding=False,
            normalized_p=False):
    """`dsa-verify compare` without files: judges a kernel's outputs on a golden fixture.

    golden: path of a fixture (or a Fixture). outputs: {name: torch tensor} under the SPEC
    output names (out, lse, max_logits, dq, dkv, dsink, indices, scores, dq_idx, dk_idx, dw,
    loss, d_scores), any device, in the dtypes the kernel produces; moved to the host once.
    conventions: names from the closed list (lse_base2, int64_ids, ids_s_q_1_k,
    topk_width_min_k_s_kv) converting a representation, never loosening a check.
    provided_outputs: the output names the kernel provides (--outputs): the others are "not
    judged"; without it a missing output is INCOMPLETE (SPEC §9). allow_weak: --allow-weak.
    sink_after_rounding: --sink-after-rounding (the kernel rounds out to 16 bits before
    applying attn_sink; out's bound on sink rows adds that first rounding). normalized_p:
    --normalized-p (the kernel rounds softmax(P) to 16 bits before P·V, the max key's too).
    The judgement is the candidate-file route's (oracle::CandidateBackend, check_op).
    Raises ValueError for an unknown output or convention name, a convention named twice or
    one that converts none of the golden's ops (as the CLI's --convention), a flag argument (allow_weak,
    sink_after_rounding, normalized_p) that is not True or False, when no output of the
    fixture's op is given ("holds no output of the golden's op ...", naming the op and its
    outputs, as the CLI's exit 2), or when nothing was judged ("compare: judged nothing: ...":
    an empty case, or provided outputs the case does not define), for an output whose dtype
    DLPack cannot carry (torch.bool), naming it, and when the golden's inputs break the contract
    (naming the file and the argument, as the CLI's exit 2). Raises TypeError when
    conventions or provided_outputs is a single str instead of a list of names.
    """
    path = golden.path if isinstance(golden, Fixture) else str(golden)
    known = set(_core.output_name_list())
    unknown = [n for n in outputs if n not in known]
    if unknown:
        raise ValueError(f"compare: outputs {unknown} are not output names; expected some of {sorted(known)}")
    caps = {n: _host_capsule(n, t) for n, t in outputs.items()}
    try:
        r = _core.compare_outputs(path, caps, names_argument("conventions", conventions) or [],
                                  names_argument("provided_outputs", provided_outputs),
                                  flag_argument("allow_weak", allow_weak),
                                  flag_argument("sink_after_rounding", sink_after_rounding),
                                  flag_argument("normalized_p", normalized_p))
    except RuntimeError as e:
        raise ValueError(str(e)) from e
    if r["verdict"] == "skip":
        # Nothing judged is never a pass (the CLI exits 2): an empty case, or provided outputs
        # this case does not define (dsink without attn_sink), says so; else no output fits.
        nothing = [o["reason"] for o in r["ops"] if o["reason"].startswith("judged nothing")]
        if nothing:
            raise ValueError("compare: " + "; ".join(nothing))
        raise ValueError(f"compare: none of the given outputs {sorted(outputs)} belongs to the op of {path}")
    return CompareResult(passed=r["exit"] == 0, verdict_line=r["verdict_line"], report=r["report"], ops=r["ops"],
                         conventions_applied=list(r["conventions_applied"]))
