"""dsa_verify.audit on the example backends and on backends that break one rule each."""
import json
import os
import subprocess

import pytest

import backends
import dsa_verify
from faulty_backend import Log2LseBackend
from torch_backend import TorchBackend

HERE = os.path.dirname(__file__)
XSD = os.path.join(HERE, "..", "..", "cli", "tests", "junit.xsd")


def statuses(report):
    return {c.status for c in report.cases}


def test_torch_example_passes_the_full_level0_audit(tmp_path):
    rep = dsa_verify.audit(TorchBackend(), json=str(tmp_path / "r.json"), junit=str(tmp_path / "r.xml"),
                           dump_dir=str(tmp_path / "dumps"), progress=False)
    assert rep.passed, rep.summary()
    ran = [c for c in rep.cases if c.status == "pass"]
    ops = {c.op for c in ran}
    # Every op of the contract was judged, by properties and by fixtures.
    assert set(dsa_verify.OPS) <= ops, ops
    assert any(c.property.startswith("property:") for c in ran)
    assert any(c.property.startswith("golden:") for c in ran)
    assert any(c.property.startswith("peer:") for c in ran)
    assert any(c.worst_ratio is not None and c.worst_ratio > 0 for c in ran)
    j = json.loads((tmp_path / "r.json").read_text())
    assert j["format"] == "dsa-verify-audit/1" and j["summary"]["failed"] == 0
    assert j["summary"]["passed"] == len(ran) and j["backend"] == "torch-example"
    assert j["python_backend"] == "torch_backend:TorchBackend"
    if subprocess.run(["which", "xmllint"], capture_output=True).returncode == 0:
        subprocess.run(["xmllint", "--noout", "--schema", XSD, str(tmp_path / "r.xml")], check=True)


def test_planted_fault_fails_with_a_readable_message(tmp_path):
    rep = dsa_verify.audit(Log2LseBackend(), ops=["sparse_mla_fwd"], dump_dir=str(tmp_path), progress=False)
    assert not rep.passed
    fails = rep.failures
    assert fails and all(c.op == "sparse_mla_fwd" for c in fails)
    golden = [c for c in fails if c.property.startswith("golden:")]
    assert golden, rep.summary()
    msg = golden[0].message
    assert "lse" in msg and "over their bound" in msg and "floor" in msg, msg
    assert " -m dsa_verify replay " in golden[0].repro
    prop = [c for c in fails if c.property.startswith("property:")]
    assert prop and prop[0].repro.startswith("RC_PARAMS=") and "--only smla." in prop[0].repro
    assert os.path.exists(prop[0].fixture)
    summary = rep.summary()
    assert "FAIL sparse_mla_fwd" in summary and "reproduce:" in summary


def only_topk(backend, **kw):
    return dsa_verify.audit(backend, ops=["topk"], fixtures=kw.pop("fixtures", False), progress=False,
                            dump_dir=kw.pop("dump_dir", "dsa-verify-failures"), **kw)


def test_exception_is_a_failure_with_the_python_traceback():
    rep = only_topk(backends.Raises(), only=["topk.contract_exact", "topk.nan_never_selected"])
    assert statuses(rep) == {"fail"}
    msg = rep.failures[0].message
    assert "Traceback" in msg and "helper_that_fails" in msg and "kernel launch failed" in msg, msg


def test_not_implemented_is_a_skip():
    rep = only_topk(backends.NotImplementedTopk(), fixtures=True)
    assert statuses(rep) == {"skip"}
    assert "this kernel has no top-k yet" in rep.cases[0].message


@pytest.mark.parametrize("backend, words", [
    (backends.NonContiguous(), ["output 'indices'", "not contiguous"]),
    (backends.Int64Ids(), ["output 'indices'", "I64", "expected I32"]),
    (backends.WrongShape(), ["output 'indices'", "has shape", "expected"]),
    (backends.ModifiesInput(), ["input 'scores'", "modified in place"]),
])
def test_malformed_outputs_fail_naming_them(backend, words):
    rep = only_topk(backend, only=["topk.contract_exact"])
    assert not rep.passed
    msg = rep.failures[0].message
    for w in words:
        assert w in msg, msg


def test_declared_tie_breaks_skip_the_others():
    rep = only_topk(backends.SmallOnly(), only=["topk.contract_exact"])
    assert rep.passed, rep.summary()


def test_undeclared_partial_outputs_fail_and_say_how_to_declare():
    rep = dsa_verify.audit(backends.ForwardTwoUndeclared(), only=["smla.forward_ratio"], progress=False)
    assert not rep.passed
    assert "returned 2 outputs, expected 3" in rep.failures[0].message
    assert "outputs = {'sparse_mla_fwd'" in rep.failures[0].message


def test_declared_partial_outputs_are_not_judged_instead_of_incomplete():
    # outputs = {...} is the CLI's --outputs, for the fixtures and the properties alike.
    rep = dsa_verify.audit(backends.ForwardOutAndLse(), ops=["sparse_mla_fwd"], progress=False)
    assert rep.passed, rep.summary()
    assert any(c.status == "pass" and c.property.startswith("property:smla.") for c in rep.cases)
    assert any(c.status == "pass" and c.property.startswith("golden:smla") for c in rep.cases)
    # Undeclared, the same kernel is INCOMPLETE (SPEC §9 complete outputs).
    undeclared = type("Undeclared", (backends.ForwardOutAndLse,), {"outputs": None, "name": "undeclared"})
    rep = dsa_verify.audit(undeclared(), only=["smla.forward_ratio"], progress=False)
    assert not rep.passed


def test_false_determinism_claim_fails():
    rep = only_topk(backends.Nondeterministic(), only=["topk.contract_exact"])
    assert not rep.passed
    assert "different bytes" in rep.failures[0].message or "bitwise" in rep.failures[0].message


def test_unknown_op_is_a_usage_error():
    with pytest.raises(ValueError, match="--ops"):
        dsa_verify.audit(TorchBackend(), ops=["topkk"], progress=False)


def test_isolated_crash_and_hang_become_failed_cases():
    rep = only_topk("backends:Segfaults", only=["topk.contract_exact"], isolate=True)
    assert statuses(rep) == {"fail"} and "SIGSEGV" in rep.failures[0].message, rep.summary()
    rep = only_topk("backends:Hangs", only=["topk.contract_exact"], isolate=True, timeout=5)
    assert statuses(rep) == {"fail"} and "timed out after 5 s" in rep.failures[0].message, rep.summary()


def test_isolated_passing_backend_gives_the_same_verdicts():
    inproc = only_topk(TorchBackend(), only=["topk.contract_exact", "topk.nan_never_selected"], seed=11)
    iso = only_topk("torch_backend:TorchBackend", only=["topk.contract_exact", "topk.nan_never_selected"],
                    seed=11, isolate=True)
    assert inproc.verdicts() == iso.verdicts() and inproc.passed


def test_triton_example_skips_without_cuda_and_says_why():
    from triton_backend import TritonIndexer
    rep = dsa_verify.audit(TritonIndexer(), ops=["indexer_scores", "topk"], progress=False)
    if torch_cuda_available():
        pytest.skip("a CUDA device is present: the Triton example is audited for real (see its docstring)")
    assert rep.cases and statuses(rep) == {"skip"}, rep.summary()
    judged = [c for c in rep.cases if not c.property.startswith("property:block.")]  # need sparse MLA
    assert judged and all("triton is not installed" in c.message or "CUDA" in c.message for c in judged), rep.summary()


def torch_cuda_available():
    import torch
    return torch.cuda.is_available()


def test_keyboard_interrupt_stops_the_audit():
    with pytest.raises(KeyboardInterrupt):
        only_topk(backends.Interrupts(), only=["topk.contract_exact"])
