"""dsa_verify.audit on the example backends and on backends that break one rule each."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch

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
    # A clean pass dumps nothing (fresh-user F12: top-k draws with k = 0, redrawn, were dumped).
    assert not (tmp_path / "dumps").exists(), sorted(os.listdir(tmp_path / "dumps"))
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


def test_ops_selects_what_is_judged_and_a_failure_names_its_op(tmp_path):
    # --ops sparse_mla_fwd: the forward properties' backward parts, the block properties and the
    # fixtures' backward are not judged, so a right forward passes; --ops sparse_mla_bwd fails
    # under sparse_mla_bwd; with no --ops a forward property's backward failure is filed there too.
    only = ["smla.empty_rows", "smla.extreme_rows_in_batch", "smla.topk_length_respected"]
    fwd = dsa_verify.audit(backends.HalvedDkv(), ops=["sparse_mla_fwd"], only=only, seed=5,
                           dump_dir=str(tmp_path), progress=False)
    assert fwd.passed, fwd.summary()
    assert {c.op for c in fwd.cases} == {"sparse_mla_fwd"}, fwd.summary()
    bwd = dsa_verify.audit(backends.HalvedDkv(), ops=["sparse_mla_bwd"], only=["smla.backward_parity"], seed=5,
                           dump_dir=str(tmp_path), progress=False)
    assert [(c.op, c.status) for c in bwd.cases] == [("sparse_mla_bwd", "fail")], bwd.summary()
    both = dsa_verify.audit(backends.HalvedDkv(), only=["smla.empty_rows"], seed=5, dump_dir=str(tmp_path),
                            progress=False)
    assert [(c.op, c.status) for c in both.cases] == [("sparse_mla_bwd", "fail")], both.summary()
    msg = both.cases[0].message
    assert msg.startswith("[FAIL] halved-dkv sparse_mla_bwd: dkv: "), msg
    assert "dsa::" not in msg.split("\n")[0] and "RC_FAIL" not in msg, msg


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
    # An audit that ran no case is not a pass (exit 2, as dsa-verify audit), and says so.
    assert rep.ran_nothing and rep.exit_code() == 2
    assert "no case ran" in rep.summary()


def test_declined_draws_are_redrawn_and_counted(tmp_path):
    # A declined draw is discarded and another drawn: the full count is judged (finding F3).
    rep = dsa_verify.audit(backends.DeclinesH1(), only=["smla.forward_ratio"], seed=7, progress=False,
                           dump_dir=str(tmp_path / "dumps"))
    assert rep.passed and rep.exit_code() == 0, rep.summary()
    c = rep.cases[0]
    assert c.status == "pass" and c.cases == 25, rep.summary()
    assert re.match(r"declined \d+ of \d+ draws: .*h_q 1 not supported", c.message), c.message
    assert "(declined " in rep.summary()
    # A declined draw is no failing case: nothing dumped (fresh-user F12).
    assert not (tmp_path / "dumps").exists(), sorted(os.listdir(tmp_path / "dumps"))


def test_only_failing_cases_are_dumped_and_a_dump_reproduces(tmp_path):
    # fresh-user F12: a dump is the failing case of a failed property, and only that.
    d = tmp_path / "dumps"
    rep = dsa_verify.audit(backends.HalvedDkv(), ops=["sparse_mla_fwd", "sparse_mla_bwd"], seed=7, fixtures=False,
                           progress=False, dump_dir=str(d))
    failed = {c.fixture for c in rep.failures}
    assert rep.failures and "" not in failed, rep.summary()
    assert {str(p) for p in d.iterdir()} == failed, (sorted(os.listdir(d)), failed)
    assert any(c.status == "pass" for c in rep.cases), rep.summary()  # passing properties dumped nothing
    for path in failed:
        r = dsa_verify._core.replay_fixture(dsa_verify.Bridge(backends.HalvedDkv()), path)
        assert r["exit"] == 1, r["report"]


def test_declined_mandatory_cases_are_incomplete_unless_named():
    rep = dsa_verify.audit(backends.DeclinesInvalidIds(), only=["smla.forward_ratio"], seed=7, progress=False)
    assert rep.exit_code() == 1, rep.summary()
    msg = rep.failures[0].message
    assert msg.startswith("INCOMPLETE: backend declined mandatory cases: ") and "invalid ids" in msg, msg
    assert "INCOMPLETE: backend declined mandatory cases" in rep.summary()
    named = dsa_verify.audit(backends.DeclinesInvalidIds(), only=["smla.forward_ratio"], seed=7, progress=False,
                             unsupported=["invalid_ids", "empty_rows"])
    # Named: not a failure; nearly every draw declined, so the property is a skip that says so.
    assert not named.failures and named.exit_code() != 1, named.summary()
    assert "named unsupported: " in named.cases[0].message, named.cases[0].message
    with pytest.raises(ValueError, match="--unsupported: unknown entry"):
        dsa_verify.audit(backends.DeclinesH1(), only=["smla.forward_ratio"], progress=False, unsupported=["invalid"])


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


def test_outputs_naming_a_name_twice_is_an_error():
    # As --outputs out,out on the CLI: the backend's declaration names each output once.
    twice = type("Twice", (backends.ForwardOutAndLse,), {"outputs": {"sparse_mla_fwd": ("out", "lse", "out")}})
    with pytest.raises(ValueError, match=r"outputs\['sparse_mla_fwd'\] names \['out'\] twice"):
        dsa_verify.Bridge(twice())


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
    # Partial passes say what was not judged in the table and JUnit, not only in the JSON.
    partial = [c for c in rep.cases if c.status == "pass" and c.not_judged]
    assert partial and all(c.not_judged == ["max_logits"] for c in partial), rep.summary()
    assert "partial" in rep.summary() and "[partial: max_logits not judged]" in rep.to_junit()
    # Undeclared, the same kernel is INCOMPLETE (SPEC §9 complete outputs).
    undeclared = type("Undeclared", (backends.ForwardOutAndLse,), {"outputs": None, "name": "undeclared"})
    rep = dsa_verify.audit(undeclared(), only=["smla.forward_ratio"], progress=False)
    assert not rep.passed


def test_declared_outputs_the_case_does_not_define_judge_nothing(tmp_path):
    # dsink alone on a case without attn_sink: the backward judged nothing, a skip saying so,
    # never "pass (partial)" (the zero dq and dkv are never judged); with a sink, dsink is judged.
    rep = dsa_verify.audit(backends.DsinkOnly(), ops=["sparse_mla_bwd"], progress=False, dump_dir=str(tmp_path))
    by = {c.property: c for c in rep.cases}
    assert by["golden:smla_basic"].status == "skip", rep.summary()
    assert by["golden:smla_basic"].message.startswith(
        "judged nothing: sparse_mla_bwd: the provided outputs (dsink) are not defined for this case")
    assert by["golden:smla_sink"].status == "pass" and by["golden:smla_sink"].not_judged == ["dq", "dkv"]
    assert all(c.status != "pass" or c.cases > 0 for c in rep.cases), rep.summary()


def test_false_determinism_claim_fails():
    # topk.contract_exact alone drew no tie across the k-th value in about 1 of 6 random runs
    # (the alternating tie fill then looked deterministic); the two properties that build ties
    # at the k-th value on purpose catch it on every run.
    rep = only_topk(backends.Nondeterministic(), only=["topk.int32_contiguous_deterministic", "topk.tie_overflow"])
    assert not rep.passed
    assert "different bytes" in rep.failures[0].message or "bitwise" in rep.failures[0].message
    # ... and says which rows and ids differed between the runs, first, on every failing property
    for c in rep.failures:
        assert re.match(r"\[FAIL\] .* topk: deterministic backend returned different bytes on (a second run|run \d): "
                        r"indices: rows? [0-9, .]+ of \d+ differs?; row \d+ slot \d+: id -?\d+ then -?\d+", c.message), c.message


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5])
def test_seed_out_of_range_is_a_usage_error(seed):
    with pytest.raises(ValueError, match="--seed.*from 0 to 18446744073709551615"):
        dsa_verify.audit(backends.Raises(), only=["topk.contract_exact"], seed=seed, progress=False)


def test_unknown_op_is_a_usage_error():
    with pytest.raises(ValueError, match="--ops"):
        dsa_verify.audit(TorchBackend(), ops=["topkk"], progress=False)
    # an --only property of an op --ops does not select: both named, not an empty audit
    with pytest.raises(ValueError, match="'--only' and '--ops' clash.*smla.forward_ratio.*does not select sparse_mla_fwd"):
        dsa_verify.audit(TorchBackend(), ops=["topk"], only=["smla.forward_ratio"], progress=False)


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


def test_a_keyboard_interrupt_the_kernel_raises_itself_is_a_failed_case():
    # Before (fresh16 F2): it stopped the audit as if Ctrl-C had been pressed. No signal came: a
    # failed case with its traceback; only a real SIGINT stops the audit (the signal tests below).
    rep = only_topk(backends.Interrupts(), only=["topk.contract_exact"])
    assert [c.status for c in rep.cases] == ["fail"] and rep.finished, rep.summary()
    assert "raised KeyboardInterrupt without a SIGINT" in rep.cases[0].message, rep.cases[0].message


def cli_audit(tmp_path, *args, timeout=600):
    """`python3 -m dsa_verify audit ARGS` in tmp_path: its CompletedProcess."""
    cmd = [sys.executable, "-m", "dsa_verify", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=timeout)


def test_a_kernel_that_ends_the_process_fails_the_command_line_audit(tmp_path):
    # Before (fresh16 F2): exit 0, nothing printed after the task, the JSON "finished": false; a
    # CI job that reads the exit code read a pass. Now the command's supervisor (a forked child
    # runs the audit) fails it naming the task, and the report keeps what was judged before.
    out = tmp_path / "r.json"
    p = cli_audit(tmp_path, "audit", "backends:ExitsProcess", "--ops", "topk", "--seed", "7", "--json", str(out),
                  "--dump-dir", str(tmp_path / "d"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"the backend ended the process \(exit status 0\) during topk property:topk\.\S+; nothing "
                     r"after it was judged \(\d+ task\(s\) not run\): the audit did not finish", p.stderr), p.stderr
    assert "--isolate" in p.stderr and f"--json {out}" in p.stderr, p.stderr
    j = json.loads(out.read_text())
    assert j["finished"] is False and j["cases"] == [], j
    # The replay, too.
    fixture = os.path.join(os.environ["DSA_FIXTURES_DIR"], "peer", "topk_zero_rows_small.safetensors")
    p = cli_audit(tmp_path, "replay", fixture, "backends:ExitsProcess")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"the backend ended the process (exit status 0) during the replay of {fixture}" in p.stderr, p.stderr


def test_a_kernel_raising_system_exit_fails_its_cases_and_the_audit_goes_on(tmp_path):
    # Before (fresh16 F2): "audit interrupted by SIGINT", exit 130, with no signal sent.
    out = tmp_path / "r.json"
    p = cli_audit(tmp_path, "audit", "backends:SystemExits", "--ops", "topk", "--seed", "7", "--json", str(out),
                  "--dump-dir", str(tmp_path / "d"), "--no-fixtures")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "interrupted" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert "raised SystemExit(0): a kernel must not end the process" in p.stdout, p.stdout
    j = json.loads(out.read_text())
    assert j["finished"] is True and j["cases"] and all(c["status"] != "pass" for c in j["cases"]), j
    assert sum(c["status"] == "fail" for c in j["cases"]) > 1, j  # every property ran, not only the first


# ---- SPEC §10 inference ops through the Python route --------------------------------------

FP8_OPS = ["fp8_indexer_scores", "paged_indexer_scores", "sparse_mla_fp8_fwd"]


def test_planted_paged_fault_fails_naming_the_read_past_the_context(tmp_path):
    from faulty_backend import PagedPrefetchPastContext
    rep = dsa_verify.audit(PagedPrefetchPastContext(), ops=["paged_indexer_scores"], dump_dir=str(tmp_path),
                           progress=False, seed=7)
    fails = {c.property: c for c in rep.failures}
    assert {"property:paged.indexer_ratio", "golden:paged_idx_mtp2"} <= set(fails), rep.summary()
    # The golden case holds garbage past its contexts (SPEC §10); the property poisons them.
    for c in (fails["golden:paged_idx_mtp2"], fails["property:paged.indexer_ratio"]):
        assert "backend threw" in c.message and "IndexError" in c.message and "paged_gather" in c.message, c.message
    assert " -m dsa_verify replay " in fails["golden:paged_idx_mtp2"].repro
    assert "--only paged.indexer_ratio" in fails["property:paged.indexer_ratio"].repro
    assert os.path.exists(fails["property:paged.indexer_ratio"].fixture)


def test_planted_tile_scale_fault_fails_on_out(tmp_path):
    from faulty_backend import TileScaleSwapped
    rep = dsa_verify.audit(TileScaleSwapped(), ops=["sparse_mla_fp8_fwd"], dump_dir=str(tmp_path), progress=False)
    fails = {c.property: c for c in rep.failures}
    assert {"property:smla_fp8.forward_ratio", "golden:smla_fp8_decode"} <= set(fails), rep.summary()
    msg = fails["golden:smla_fp8_decode"].message
    assert "out:" in msg and "over their bound" in msg, msg


def test_section10_poisoning_is_judged_from_python(tmp_path):
    # The C++ mutant that reads one block past the context, served through the Python bridge:
    # the same oracle checks (fp8_check.cpp) fail it, on the poisoned re-run of the property.
    import dsa_verify.builtin as builtin
    rep = dsa_verify.audit(builtin.mutant("paged_reads_one_block_past_context"), only=["paged.indexer_ratio"],
                           dump_dir=str(tmp_path), progress=False, seed=7)
    assert statuses(rep) == {"fail"}, rep.summary()
    assert "illegal memory access" in rep.failures[0].message, rep.failures[0].message


@pytest.mark.parametrize("backend, only, words", [
    (backends.Fp8NonContiguousScores(), "fp8.indexer_ratio", ["fp8_indexer_scores", "output 'scores'",
                                                              "not contiguous"]),
    (backends.Fp8IntScores(), "fp8.indexer_ratio", ["fp8_indexer_scores", "output 'scores'", "I32",
                                                    "expected a floating dtype"]),
    (backends.PagedWrongWidth(), "paged.indexer_ratio", ["paged_indexer_scores", "output 'scores'", "has shape",
                                                         "[batch * next_n, max_context]"]),
])
def test_malformed_section10_outputs_fail_naming_them(tmp_path, backend, only, words):
    rep = dsa_verify.audit(backend, only=[only], dump_dir=str(tmp_path), progress=False)
    assert statuses(rep) == {"fail"}, rep.summary()
    msg = rep.failures[0].message
    for w in words:
        assert w in msg, msg


def test_declared_fp8_formats_skip_the_others(tmp_path):
    rep = dsa_verify.audit(backends.E5m2Only(), ops=["fp8_indexer_scores"], dump_dir=str(tmp_path), progress=False)
    golden = [c for c in rep.cases if c.property.startswith("golden:fp8_idx")]
    assert golden and all(c.status == "skip" and "fp8_formats ['e5m2']" in c.message for c in golden), rep.summary()
    assert not rep.failures, rep.summary()


def test_shared_output_names_must_be_declared_alike():
    with pytest.raises(ValueError, match="sparse_mla_fp8_fwd"):
        dsa_verify.audit(backends.SharedOutputsDeclaredForOne(), ops=["sparse_mla_fwd"], progress=False)


def test_command_line_audits_the_section10_ops(tmp_path):
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "dsa_verify", "audit", "faulty_backend:TileScaleSwapped", "--ops", ",".join(FP8_OPS),
           "--seed", "7", "--dump-dir", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL sparse_mla_fp8_fwd golden:smla_fp8_decode" in p.stdout, p.stdout
    for op in ("fp8_indexer_scores", "paged_indexer_scores"):
        assert re.search(rf"^{op} +golden:\S+ +pass", p.stdout, re.M), p.stdout  # the others pass


@pytest.mark.parametrize("backend, only, words", [
    (backends.PagedClampsBadIds(), "paged.bad_table_rejected", ["accepted a bad block table"]),
    (backends.Fp8AbsScale(), "fp8.invalid_scale_rejected", ["accepted k_scale["]),
    # F3: an IndexError is not the documented rejection (ValueError); F2: every read scale is checked
    (backends.PagedIndexesPastCache(), "paged.bad_table_rejected", ["failed with another error on", "IndexError"]),
    (backends.UncheckedSection10Scales(), "paged.invalid_scale_rejected", ["accepted k_scale_cache["]),
    (backends.UncheckedSection10Scales(), "smla_fp8.invalid_scale_rejected", ["accepted the scale of tile"]),
])
def test_section10_invalid_inputs_must_raise(tmp_path, backend, only, words):
    rep = dsa_verify.audit(backend, only=[only], dump_dir=str(tmp_path), progress=False)
    assert statuses(rep) == {"fail"}, rep.summary()
    for w in words:
        assert w in rep.failures[0].message, rep.failures[0].message


def test_paged_poisoned_reruns_reach_the_python_kernel():
    # fp8_check.cpp's poisoned re-runs, through the bridge: the kernel gets the case as given
    # (twice: determinism), then out-of-range ids past every context, then NaN blocks there.
    rec = backends.RecordsPagedCalls()
    path = os.path.join(HERE, "..", "..", "fixtures", "golden", "paged_idx_mtp2.safetensors")
    res = dsa_verify._core.replay_fixture(dsa_verify.Bridge(rec), path)
    assert res["verdict_line"] == "AGREES", res["report"]
    assert len(rec.calls) == 4, len(rec.calls)
    (table, lens, blocks, _), _, (ids, _, ids_blocks, _), (nan_table, _, nan_blocks, nan_scales) = rec.calls
    assert ids_blocks == blocks and nan_blocks == blocks + 2 and nan_scales
    block_size = dsa_verify.load_fixture(path).kwargs("paged_indexer_scores")["block_size"]
    past = torch.arange(table.shape[1])[None, :] >= ((lens.long() + block_size - 1) // block_size)[:, None]
    assert past.any()
    assert torch.equal(ids[~past], table[~past]) and torch.equal(nan_table[~past], table[~past])
    assert bool(((ids[past] < 0) | (ids[past] >= blocks)).all())  # out-of-range ids
    assert bool((nan_table[past] >= blocks).all())  # the appended NaN blocks


def test_factory_functions_are_called():
    # "module:function" names a factory (dsa_verify.builtin:libtorch_cpu), not a backend whose
    # ops would all be missing (every case skipped).
    import dsa_verify.builtin as builtin
    backend = dsa_verify.load_backend("dsa_verify.builtin:reference")
    assert isinstance(backend, builtin.BuiltinBackend) and backend.name == "reference"


def test_fp8_reduced_accumulation_attribute_selects_the_tensor_core_row():
    path = os.path.join(HERE, "..", "..", "fixtures", "golden", "fp8_idx_prefix_amax.safetensors")
    plain = dsa_verify._core.replay_fixture(dsa_verify.Bridge(backends.Fp8Only()), path)
    tc = type("TensorCore", (backends.Fp8Only,), {"fp8_reduced_accumulation": True})()
    reduced = dsa_verify._core.replay_fixture(dsa_verify.Bridge(tc), path)
    assert plain["exit"] == 0 and reduced["exit"] == 0, plain["report"] + reduced["report"]
    assert "fp8_tensor_core" not in plain["report"]
    assert "judged by table row fp8_indexer_scores:fp8_tensor_core" in reduced["report"], reduced["report"]


def test_declared_reduced_accumulation_is_checked_by_the_paged_exact_tier():
    # fresh-user F4: the declaration loosens the paged bound 1024-fold; a kernel x(1 + 1e-3) passed
    # every paged property and golden behind it. The exact tier (integer grids, exact in a 14-bit
    # accumulator too) is not loosened: the liar fails it, the honest declared kernel passes.
    only = ["paged.indexer_exact_tier"]
    liar = dsa_verify.audit(backends.PagedDeclaredReducedLiar(), ops=["paged_indexer_scores"], only=only, seed=7,
                            progress=False)
    assert not liar.passed and [c.property for c in liar.failures] == ["property:paged.indexer_exact_tier"], \
        liar.summary()
    msg = liar.failures[0].message
    assert "exact tier" in msg and "not bit-exact" in msg and "declares fp8_reduced_accumulation" in msg, msg
    honest = dsa_verify.audit(backends.PagedDeclaredReduced(), ops=["paged_indexer_scores"], only=only, seed=7,
                              progress=False)
    assert honest.passed and {c.status for c in honest.cases} == {"pass"}, honest.summary()


def test_declared_rounding_models_are_checked_by_their_exact_tiers():
    # A declared rounding model loosens out's bound by one bf16 rounding; its exact tier (rows of
    # equal logits and integer values, where the model's bf16 out is one known value) is not: a
    # backend declaring normalized_p that computes otherwise fails it, the honest
    # sink-after-rounding kernel passes its tier, and a backend declaring nothing gets no task.
    liar = dsa_verify.audit(backends.NormalizedPLiar(), ops=["sparse_mla_fwd"],
                            only=["smla.normalized_p_exact_tier"], seed=7, progress=False)
    assert not liar.passed and [c.property for c in liar.failures] == ["property:smla.normalized_p_exact_tier"], \
        liar.summary()
    assert "declared rounding model normalized_p not followed" in liar.failures[0].message, liar.failures[0].message
    honest = dsa_verify.audit(backends.SinkAfterRounding(), ops=["sparse_mla_fwd"],
                              only=["smla.sink_after_rounding_exact_tier"], seed=7, progress=False)
    assert honest.passed and {c.status for c in honest.cases} == {"pass"}, honest.summary()
    plain = dsa_verify.audit(backends.Bf16OwnRounding(), ops=["sparse_mla_fwd"], only=["smla.forward_ratio"],
                             seed=7, progress=False)
    assert not any("exact_tier" in c.property for c in plain.cases), plain.summary()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -5, 0, 0.0001, 1e16, "10", True])
def test_timeout_out_of_range_is_a_usage_error(timeout):
    # fresh-user F7/F8: these made every isolated case "timed out" (blaming the kernel) or raised
    # OverflowError / "cannot convert float NaN to integer"
    with pytest.raises(ValueError, match=r"'timeout' \(--timeout\) got .*, expected a positive decimal number of "
                                         r"seconds from 0\.001 to 86400"):
        dsa_verify.audit(backends.Raises(), only=["topk.contract_exact"], isolate=True, timeout=timeout,
                         progress=False)


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "0x10", "1_0", "5s", " 5"])
def test_timeout_option_out_of_range_exits_2_naming_it(value):
    # fresh12 F11: "0x10" (and float()'s "1_0") must not be read as a number of seconds
    r = subprocess.run([sys.executable, "-m", "dsa_verify", "audit", "backends:Raises", "--only",
                        "topk.contract_exact", "--isolate", "--timeout", value], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    shown = value if value in ("nan", "inf", "-5", "0") else repr(value)
    assert (f"argument '--timeout' got {shown}, expected a positive decimal number of seconds from 0.001 to 86400"
            in r.stderr), r.stderr
    assert "timed out" not in r.stdout + r.stderr


def test_reproduce_lines_repeat_the_run_options():
    # fresh12 F11: --seed, --timeout and --isolate were left out of the reproduce lines
    rep = only_topk("backends:Raises", only=["topk.contract_exact"], seed=5, timeout=12.5, isolate=True,
                    unsupported=["nan_scores"])
    assert rep.failures, rep.summary()
    for c in rep.failures:
        assert " --seed 5 --isolate --timeout 12.5 --unsupported nan_scores --only topk.contract_exact" in c.repro, c.repro
    rep = only_topk(backends.Raises(), only=["topk.contract_exact"], seed=6)
    assert all(" --seed 6 --only topk.contract_exact" in c.repro and "--isolate" not in c.repro
               and "--timeout" not in c.repro for c in rep.failures), rep.summary()


def test_fixture_dirs_without_fixtures_are_an_error_and_one_without_a_note(tmp_path):
    # fresh-user F9: DSA_FIXTURES_DIR with empty golden/ and peer/ judged no fixture, exit 0, no word.
    root = tmp_path / "fx"
    (root / "golden").mkdir(parents=True)
    (root / "peer").mkdir()
    env = dict(os.environ, DSA_FIXTURES_DIR=str(root))
    cli = os.environ.get("DSA_VERIFY_BIN", "")
    dump = ["--dump-dir", str(tmp_path / "d")]
    routes = [[sys.executable, "-m", "dsa_verify", "audit", "backends:TopkOnly", "--ops", "topk", "--seed", "7", *dump],
              [sys.executable, "-m", "pytest", "-p", "dsa_verify.pytest_plugin", "-p", "no:cacheprovider", "-q",
               "--dsa-backend=backends:TopkOnly", "--dsa-ops", "topk", "--dsa-seed", "7", "--dsa-dump-dir", str(tmp_path)]]
    if cli:
        routes.append([cli, "audit", "--backend", "reference", "--ops", "topk", "--seed", "7", *dump])
    for cmd in routes:
        r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode in (2, pytest.ExitCode.USAGE_ERROR), (cmd, r.stdout + r.stderr)
        assert "hold no fixture (*.safetensors)" in r.stderr and "DSA_FIXTURES_DIR" in r.stderr, r.stderr
    # Properties alone (--only) need no fixture.
    only = routes[0] + ["--only", "topk.contract_exact"]
    r = subprocess.run(only, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (only, r.stdout + r.stderr)
    # Fixtures in one directory only: they run, and a note names the empty one (JSON: "notes").
    src = os.path.join(os.environ["DSA_FIXTURES_DIR"], "golden", "topk_plateau_small_sorted.safetensors")
    (root / "peer" / "topk_plateau_small_sorted.safetensors").write_bytes(open(src, "rb").read())
    note = f"audit: no golden fixture (*.safetensors) in {root / 'golden'}: no golden case is judged"
    for cmd in routes:
        pytest_route = "pytest" in cmd
        json_out = tmp_path / "r.json"
        args = cmd + ([] if pytest_route else ["--json", str(json_out)])
        r = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (args, r.stdout + r.stderr)
        assert note in r.stdout + r.stderr, r.stdout + r.stderr
        if not pytest_route:
            j = json.loads(json_out.read_text())
            assert j["notes"] == [note + " (DSA_FIXTURES_DIR)"], j["notes"]
            assert any(c["property"] == "peer:topk_plateau_small_sorted" and c["status"] == "pass"
                       for c in j["cases"]), j["cases"]


# ---- fresh12 F5: signals and the JSON report ----------------------------------------------

def marker_fixture_dir(tmp_path):
    """A DSA_FIXTURES_DIR with one golden (passes) and one peer file on which backends.HangsOnMarker
    hangs: topk_distinct_causal with the marker at row 0, column 71, outside row 0's window."""
    root = tmp_path / "fx"
    (root / "golden").mkdir(parents=True)
    (root / "peer").mkdir()
    src = os.path.join(os.environ["DSA_FIXTURES_DIR"], "golden")
    shutil.copy(os.path.join(src, "topk_plateau_small_sorted.safetensors"), root / "golden")
    data = bytearray(open(os.path.join(src, "topk_distinct_causal.safetensors"), "rb").read())
    n = struct.unpack("<Q", data[:8])[0]
    scores = json.loads(bytes(data[8:8 + n]))["scores"]
    assert scores["dtype"] == "F32" and scores["shape"][1] == 72, scores
    at = 8 + n + scores["data_offsets"][0] + 71 * 4
    data[at:at + 4] = struct.pack("<f", backends.HangsOnMarker.HANG_MARKER)
    (root / "peer" / "hangs.safetensors").write_bytes(bytes(data))
    return root


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_audit_and_its_reports_keep_every_result(tmp_path, sig):
    # Before: Ctrl-C did nothing while a task ran in C++ (the oracle, a hung kernel), and SIGTERM
    # left a 0-byte JSON report. Now the reports are rewritten (atomically) after each task, and a
    # signal stops the audit at once: the running case "interrupted", exit 128 + signal.
    root = marker_fixture_dir(tmp_path)
    marker, out, xml = tmp_path / "hanging", tmp_path / "r.json", tmp_path / "r.xml"
    env = dict(os.environ, DSA_FIXTURES_DIR=str(root), DSA_TEST_HANG_MARKER=str(marker))
    cmd = [sys.executable, "-m", "dsa_verify", "audit", "backends:HangsOnMarker", "--ops", "topk", "--seed", "7",
           "--json", str(out), "--junit", str(xml), "--dump-dir", str(tmp_path / "d")]
    # SIGINT is restored to its default: a test runner started in the background ignores it.
    p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the hanging call never started"
            time.sleep(0.05)
        # The report on disk already holds every case computed before the hung call.
        j = json.loads(out.read_text())
        assert j["finished"] is False and j["interrupted"] is None, j
        assert any(c["property"] == "golden:topk_plateau_small_sorted" and c["status"] == "pass" for c in j["cases"])
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    signame = signal.Signals(sig).name
    assert p.returncode == 128 + sig, stdout + stderr
    assert f"audit interrupted by {signame}: partial report; 0 task(s) not run" in stdout, stdout
    j = json.loads(out.read_text())
    assert j["interrupted"] == signame and j["finished"] is False, j
    by = {c["property"]: c for c in j["cases"]}
    assert by["peer:hangs"]["status"] == "interrupted", by["peer:hangs"]
    assert by["golden:topk_plateau_small_sorted"]["status"] == "pass"
    assert sum(c["property"].startswith("property:") and c["status"] == "pass" for c in j["cases"]) >= 5, j
    assert j["summary"]["interrupted"] == 1
    assert "peer:hangs" in xml.read_text()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temporary file left


def test_a_ctrl_c_to_the_process_group_stops_the_supervised_audit_once(tmp_path):
    # Ctrl-C reaches the command's supervisor and its child (one process group): the supervisor
    # does not pass it on a second time (the child's signal wakeup fd says it got it).
    root = marker_fixture_dir(tmp_path)
    marker, out = tmp_path / "hanging", tmp_path / "r.json"
    env = dict(os.environ, DSA_FIXTURES_DIR=str(root), DSA_TEST_HANG_MARKER=str(marker))
    cmd = [sys.executable, "-m", "dsa_verify", "audit", "backends:HangsOnMarker", "--ops", "topk", "--seed", "7",
           "--json", str(out), "--dump-dir", str(tmp_path / "d")]
    p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the hanging call never started"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, stdout + stderr
    assert stdout.count("audit interrupted by SIGINT") == 1 and "Traceback" not in stderr, stdout + stderr
    assert json.loads(out.read_text())["interrupted"] == "SIGINT"


def test_a_finished_audit_says_so_and_an_unwritable_report_path_is_an_error_before_the_run(tmp_path):
    rep = only_topk(backends.TopkOnly(), only=["topk.contract_exact"], json=str(tmp_path / "r.json"))
    j = json.loads((tmp_path / "r.json").read_text())
    assert j["finished"] is True and j["interrupted"] is None and rep.finished
    with pytest.raises(OSError, match="cannot write the report"):
        only_topk(backends.TopkOnly(), only=["topk.contract_exact"], json=str(tmp_path / "no" / "r.json"))
    assert not (tmp_path / "no").exists()


def test_declining_neg_inf_scores_is_incomplete_not_a_skip():
    # fresh12 F8: topk_distinct_causal holds -inf outside its windows only; a kernel declining
    # every -inf made it a skip ("no SPEC-mandatory feature"). Named, it is a skip saying so.
    rep = only_topk(backends.DeclinesNegInf(), fixtures=True, seed=7)
    by = {c.property: c for c in rep.cases}
    c = by["golden:topk_distinct_causal"]
    assert c.status == "fail" and c.message.startswith("INCOMPLETE: backend declined a SPEC-mandatory case"), c.message
    assert "holds -inf scores" in c.message and "--unsupported neg_inf_scores" in c.message, c.message
    rep = only_topk(backends.DeclinesNegInf(), fixtures=True, seed=7, unsupported=["neg_inf_scores"])
    by = {c.property: c for c in rep.cases}
    c = by["golden:topk_distinct_causal"]
    assert c.status == "skip" and "named unsupported: neg_inf_scores" in c.message, c.message
    # a property that passed without the declined draws is partial, never a plain pass
    waived = [c for c in rep.cases if c.status == "pass" and "named unsupported: neg_inf_scores" in c.message]
    assert waived and all("neg_inf_scores cases" in c.not_judged for c in waived), rep.summary()


@pytest.mark.parametrize("flag,value,shown", [("--ops", "topk,topk", 'names "topk" twice'),
                                              ("--only", "topk.contract_exact,", "an empty item"),
                                              ("--unsupported", "neg_inf_scores,neg_inf_scores",
                                               'names "neg_inf_scores" twice'),
                                              ("--unsupported", ",nan_scores", "an empty item")])
def test_list_options_reject_repeats_and_empty_items(flag, value, shown):
    # fresh13 F7: the Python CLI dropped empty items and kept repeats, which the C++ CLI rejects
    r = subprocess.run([sys.executable, "-m", "dsa_verify", "audit", "backends:Raises", flag, value],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"argument '{flag}'" in r.stderr and shown in r.stderr, r.stderr
    assert "topk.contract_exact" not in r.stdout, r.stdout  # nothing ran


@pytest.mark.parametrize("flag,what", [("--json", "a file path"), ("--junit", "a file path"),
                                       ("--dump-dir", "a directory path")])
def test_empty_path_options_are_usage_errors(flag, what):
    # fresh14 F1: `--json ""` (a CI line `--json $REPORT` with REPORT unset) ran and wrote no report.
    r = subprocess.run([sys.executable, "-m", "dsa_verify", "audit", "backends:TopkOnly", "--only",
                        "topk.contract_exact", flag, ""], capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"argument {flag}: got \"\" (empty), expected {what}" in r.stderr, r.stderr
    assert "topk.contract_exact" not in r.stdout, r.stdout  # nothing ran


def test_a_module_spec_without_op_functions_names_its_classes(tmp_path, monkeypatch):
    # fresh14 F5: `replay FIXTURE mymod` (no :Class) loaded the module as the backend and judged nothing.
    (tmp_path / "f14_onlyclass.py").write_text(
        "class MyKernel:\n    def topk(self, scores, k):\n        raise NotImplementedError\n\n"
        "class Helper:\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    fixture = os.path.join(HERE, "..", "..", "fixtures", "golden", "topk_mtp.safetensors")
    for cmd in (["replay", fixture, "f14_onlyclass"], ["audit", "f14_onlyclass", "--only", "topk.contract_exact"]):
        r = subprocess.run([sys.executable, "-m", "dsa_verify", *cmd], capture_output=True, text=True, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert ("backend 'f14_onlyclass' is a module with no op methods" in r.stderr and
                "name its class: f14_onlyclass:<Class> (classes here: MyKernel)" in r.stderr), r.stderr
        assert "judged nothing" not in r.stdout, r.stdout
    # A module whose functions are the ops is still a backend, and module:Class still works.
    (tmp_path / "f14_funcs.py").write_text("def topk(scores, k):\n    raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert dsa_verify.load_backend("f14_funcs").__name__ == "f14_funcs"
    assert type(dsa_verify.load_backend("f14_onlyclass:MyKernel")).__name__ == "MyKernel"


def test_declining_negative_weights_or_short_contexts_is_incomplete_not_a_skip():
    # fresh15 F2: negative head weights (SPEC §2) and paged contexts shorter than next_n (§1, §10)
    # were no twin feature, and the indexer backward had no twin: a kernel declining them got
    # skips ("no twin for op ...") and redrawn draws, exit 0. Named, they are skips saying so.
    ops = ["indexer_scores_backward", "paged_indexer_scores"]
    rep = dsa_verify.audit(backends.IndexerDeclinesLegalInputs(), ops=ops, fixtures=True, seed=7, progress=False)
    by = {(c.op, c.property): c for c in rep.cases}
    for key, words, feature in [(("indexer_scores_backward", "golden:idx_causal"), "holds negative head weights",
                                 "negative_weights"),
                                (("paged_indexer_scores", "golden:paged_idx_mtp2"),
                                 "holds paged contexts shorter than next_n", "short_context")]:
        c = by[key]
        assert c.status == "fail" and c.message.startswith("INCOMPLETE: backend declined a SPEC-mandatory case"), c.message
        assert words in c.message and "--unsupported " + feature in c.message, c.message
    for key, words in [(("indexer_scores_backward", "property:indexer.backward_parity"), "negative head weights"),
                       (("paged_indexer_scores", "property:paged.indexer_ratio"), "paged contexts shorter than next_n")]:
        c = by[key]
        assert c.status == "fail" and c.message.startswith("INCOMPLETE: backend declined mandatory cases: " + words), c.message
    named = dsa_verify.audit(backends.IndexerDeclinesLegalInputs(), ops=ops, fixtures=True, seed=7, progress=False,
                             unsupported=["negative_weights", "empty_windows"])
    by = {(c.op, c.property): c for c in named.cases}
    for key in [("indexer_scores_backward", "golden:idx_causal"), ("paged_indexer_scores", "golden:paged_idx_mtp2")]:
        assert by[key].status == "skip" and "named unsupported: " in by[key].message, by[key].message
    assert not [c for c in named.cases if c.status == "fail"], named.summary()


def test_a_non_finite_mismatch_is_named_in_the_table_never_a_zero_error(tmp_path):
    # fresh18 F4: a golden case whose only fault is a NaN where the reference is finite showed
    # "fail 0 0" in the summary (err/base and err/bound are measured over the positions that
    # match). The Python route prints the same table through the C++ core: "nonfinite" there.
    rep = dsa_verify.audit(backends.NanOutForward(), ops=["sparse_mla_fwd"], progress=False,
                           dump_dir=str(tmp_path), json=str(tmp_path / "r.json"))
    golden = [c for c in rep.cases if c.property == "golden:smla_basic"]
    assert [c.status for c in golden] == ["fail"], rep.summary()  # the verdict stands
    assert golden[0].nonfinite_mismatches == 1, rep.summary()
    row = [line for line in rep.summary().splitlines() if "golden:smla_basic" in line and " fail " in line]
    assert len(row) == 1, rep.summary()
    assert row[0].split()[3:5] == ["nonfinite", "nonfinite"], row[0]
    assert "1 non-finite position mismatch(es), first flat 3" in golden[0].message
    cases = json.load(open(tmp_path / "r.json"))["cases"]
    assert [c["nonfinite_mismatches"] for c in cases if c["property"] == "golden:smla_basic"] == [1]
