"""dsa_verify's C++ modules stay out of torch's exception handling, and a LibTorch op library
loaded into Python uses PyTorch's C++ runtime.

dsa_verify._core carries its own static C++ runtime. When its pybind11 state was shared with
torch._C and its exception translator was global, every C++ error of a torch op called from
Python (a c10::Error, e.g. torch.ops.dsa.* rejecting a bad FP8 scale) was rethrown by _core's
code under that second runtime (seen in gdb with Debian's torch 1.13). Here the translator
counts what reaches it: a torch error must reach none of ours, while our own modules' errors
still pass through them.
"""
import os
import subprocess
import sys

import pytest
import torch

from dsa_verify import _core


def _modules():
    mods = [_core]
    try:
        from dsa_verify import _backends
        mods.append(_backends)
    except ImportError:  # built without LibTorch
        pass
    return mods


def test_torch_op_errors_never_reach_dsa_verify_translators():
    mods = _modules()
    before = [m._translator_calls() for m in mods]
    for _ in range(3):  # a c10::Error through torch's pybind11 dispatcher each time
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.ops.aten.mm(torch.ones(2, 3), torch.ones(2, 3))
    after = [m._translator_calls() for m in mods]
    assert after == before, (f"torch's errors reached dsa_verify's translators ({before} -> {after}): a "
                             "module's exception translator is global or its pybind11 internals are shared")


def test_own_errors_still_translated():
    before = _core._translator_calls()
    with pytest.raises(ValueError, match="expected an op name"):
        _core.make_reference().call("no_such_op", {}, {})
    assert _core._translator_calls() == before + 1


PROBE_OP = os.environ.get("DSA_RUNTIME_PROBE_OP", "")
PROBE = """
import sys, torch
torch.ops.load_library(sys.argv[1])
print("kept:", torch.ops.dsa_runtime_probe.reject(torch.tensor([2.0])).tolist())
for _ in range(2):
    try:
        torch.ops.dsa_runtime_probe.reject(torch.tensor([-1.5]))
        print("accepted")
    except RuntimeError as e:
        print("rejected:", str(e).splitlines()[0])
"""


@pytest.mark.skipif(not PROBE_OP, reason="DSA_RUNTIME_PROBE_OP not set (built with LibTorch only)")
def test_op_library_with_static_toolchain_runtime_formats_its_errors():
    """The op library is linked as a static-libstdc++ toolchain links (the GPU machine's), plus
    dsa_shared_cxx_runtime, as libdsa_torch_ops.so is: its TORCH_CHECK message, which formats a
    double, must arrive whole. Without the shared runtime the message lost everything from the
    double on (this machine) or the process died with SIGSEGV (H200). A subprocess, so that a
    crash is a failed test."""
    r = subprocess.run([sys.executable, "-c", PROBE, PROBE_OP], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"probe died (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert "kept: [2.0]" in r.stdout
    expected = "rejected: dsa_runtime_probe::reject: argument 'x' got x[0] = -1.5, expected a positive scale"
    assert r.stdout.count(expected) == 2, r.stdout
