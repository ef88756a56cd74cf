#!/usr/bin/env python3
"""Runs a sparse MLA "kernel" written in PyTorch on dsa-verify's golden fixtures and saves
its outputs for `dsa-verify compare` (the file route of docs/auditing-a-kernel.md).

    dsa-verify fixtures generate --preset ci --out golden/
    python3 docs/examples/run_torch_kernel.py --golden golden/ --out candidate/ [--device cuda]
    dsa-verify compare --golden golden/smla_basic.safetensors \
                       --candidate candidate/smla_basic.safetensors

With --dsa-verify PATH the script runs the compare step itself for every case and exits 1
when any case disagrees.

The kernel is `sparse_mla_fwd` below (SPEC §4 forward with the §6 empty-row rules); its
backward (SPEC §5: dq, dkv, dsink) comes from autograd. Replace the body of
`sparse_mla_fwd` by a call into your own kernel and keep the rest.

Needs: Python 3.9+, torch, safetensors. Not run in CI (CI has no PyTorch). Where it was
run: see "Runs" at the end of this docstring.

Runs:
- not yet run on a machine with PyTorch when committed; the lead runs it on the GPU
  machine (H200, PyTorch 2.11) and records the outcome here.
"""
import argparse
import fnmatch
import json
import os
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def sparse_mla_fwd(q, kv, indices, sm_scale, d_v, topk_length=None, attn_sink=None):
    """The kernel under test: SPEC §4 sparse MLA forward, MQA/absorbed mode.

    q [s_q, h_q, d_qk], kv [s_kv, d_qk] (any float dtype; computed in fp32),
    indices [s_q, k] or [s_q, 1, k] int32 (a slot is valid iff 0 <= id < s_kv and
    slot < topk_length[t]), attn_sink [h_q] fp32 or None.
    Returns out [s_q, h_q, d_v] fp32, lse and max_logits [s_q, h_q] fp32 (natural log).
    Empty rows (§6): out 0, lse +inf, max_logits -inf, and no NaN in the gradients.
    """
    s_q, h_q, _ = q.shape
    s_kv = kv.shape[0]
    idx = indices.reshape(s_q, -1).long()
    k = idx.shape[1]
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        slots = torch.arange(k, device=idx.device)[None, :]
        valid &= slots < topk_length.long()[:, None]
    # Invalid slots never read kv through their id: they gather row 0 and are masked out.
    keys = kv[torch.where(valid, idx, torch.zeros_like(idx))]  # [s_q, k, d_qk]
    logits = torch.einsum("thd,tjd->thj", q, keys) * sm_scale  # [s_q, h_q, k]
    mask = valid[:, None, :].expand_as(logits)
    nonempty = valid.any(dim=1)[:, None].expand(s_q, h_q)
    max_logits = torch.where(mask, logits, torch.full_like(logits, float("-inf"))).amax(dim=-1)
    # Shift by the (detached) row max; masked entries are replaced before exp, so neither
    # the forward nor the backward ever sees -inf - -inf.
    shift = torch.where(nonempty, max_logits, torch.zeros_like(max_logits)).detach()
    z = torch.where(mask, logits - shift[..., None], torch.zeros_like(logits))
    e = torch.where(mask, torch.exp(z), torch.zeros_like(z))
    denom = torch.where(nonempty, e.sum(dim=-1), torch.ones_like(shift))
    p = e / denom[..., None]
    out = torch.einsum("thj,tjd->thd", p, keys[..., :d_v])
    lse = torch.where(nonempty, shift + torch.log(denom), torch.full_like(shift, float("inf")))
    if attn_sink is not None:
        # out *= exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink); lse is unchanged.
        lse_finite = torch.where(nonempty, lse, torch.zeros_like(lse))
        out = out * torch.sigmoid(lse_finite - attn_sink[None, :])[..., None]
    return out, lse, max_logits


def run_case(path, device):
    """Runs the kernel on one golden fixture; returns (case, outputs dict, notes)."""
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    params = json.loads(meta.get("params", "{}"))
    t = load_file(path, device=device)
    # Exact fp32 copies of the bf16 inputs are the autograd leaves: gradients in fp32.
    q = t["q"].float().requires_grad_(True)
    kv = t["kv"].float().requires_grad_(True)
    sink = t["attn_sink"].float().requires_grad_(True) if "attn_sink" in t else None
    out, lse, max_logits = sparse_mla_fwd(q, kv, t["indices"], float(params["sm_scale"]),
                                          int(params["d_v"]), t.get("topk_length"), sink)
    leaves = [q, kv] + ([sink] if sink is not None else [])
    grads = torch.autograd.grad(out, leaves, grad_outputs=t["dout"].float())
    outputs = {
        "out": out.detach().to(t["q"].dtype),  # the kernel returns out in q's dtype (bf16)
        "lse": lse.detach(),
        "max_logits": max_logits.detach(),
        "dq": grads[0],
        "dkv": grads[1],
    }
    if sink is not None:
        outputs["dsink"] = grads[2]
    outputs = {k: v.contiguous().cpu() for k, v in outputs.items()}
    # Information only (the verdict is dsa-verify's): distance to the stored reference.
    notes = []
    for name in ("out", "lse", "dq", "dkv"):
        ref = t.get("expected." + name)
        if ref is not None:
            a, b = outputs[name].double(), ref.double().cpu()
            finite = torch.isfinite(a) & torch.isfinite(b)
            same_nonfinite = bool(torch.equal(~torch.isfinite(a), ~torch.isfinite(b)))
            err = (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0
            notes.append(f"{name} max|d|={err:.3g}" + ("" if same_nonfinite else " (inf/nan differ!)"))
    return meta.get("case", os.path.basename(path)), outputs, "; ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--golden", required=True, help="directory from `dsa-verify fixtures generate`")
    ap.add_argument("--out", required=True, help="directory for the candidate files")
    ap.add_argument("--cases", default="smla_*", help="glob over case names (default smla_*)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dsa-verify", dest="dsa_verify", help="path of dsa-verify: run compare too")
    args = ap.parse_args()

    # fp32 means fp32: TF32 matmuls would be judged (and fail) as a lower precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    files = sorted(f for f in os.listdir(args.golden) if f.endswith(".safetensors")
                   and fnmatch.fnmatch(f[: -len(".safetensors")], args.cases))
    if not files:
        sys.exit(f"no fixtures matching {args.cases!r} in {args.golden}")
    producer = f"docs/examples/run_torch_kernel.py (torch {torch.__version__}, {args.device})"
    failed, ran = [], 0
    for name in files:
        golden = os.path.join(args.golden, name)
        with safe_open(golden, framework="pt") as f:
            op = (f.metadata() or {}).get("op", "")
        if not op.startswith("sparse_mla"):
            print(f"skip {name}: op {op!r} is not sparse MLA")
            continue
        case, outputs, notes = run_case(golden, args.device)
        ran += 1
        candidate = os.path.join(args.out, name)
        save_file(outputs, candidate, metadata={"producer": producer, "case": case})
        cmd = [args.dsa_verify or "dsa-verify", "compare", "--golden", golden, "--candidate", candidate]
        print(f"{case}: wrote {candidate} ({notes})")
        if args.dsa_verify:
            rc = subprocess.run(cmd).returncode
            print(f"{case}: dsa-verify compare exit {rc}")
            if rc != 0:
                failed.append(case)
        else:
            print("  " + " ".join(cmd))
    if args.dsa_verify:
        print(f"{ran - len(failed)} of {ran} cases agree" +
              (f"; disagree: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
