"""dsa_verify's C++ modules stay out of torch's exception handling.

dsa_verify._core carries its own static C++ runtime. When its pybind11 state was shared with
torch._C and its exception translator was global, every C++ error of a torch op called from
Python (a c10::Error, e.g. torch.ops.dsa.* rejecting a bad FP8 scale) was rethrown by _core's
code under that second runtime (seen in gdb with Debian's torch 1.13). Here the translator
counts what reaches it: a torch error must reach none of ours, while our own modules' errors
still pass through them.
"""
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

