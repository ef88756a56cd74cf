"""The Python route gives the CLI's verdicts: the project's own LibTorch operator library called
from Python (torch.ops.dsa.*, docs/examples/dsa_torch_ops_backend.py) audited by dsa_verify
against `dsa-verify audit --backend libtorch-cpu` (the same ops through C++), and mutants through
dsa_verify against the same mutants as plugins; same seed."""
import json
import os
import subprocess

import pytest

import dsa_verify
import dsa_verify.builtin as builtin

CLI = os.environ.get("DSA_VERIFY_BIN", "")
PLUGINS = os.environ.get("DSA_MUTANT_PLUGIN_DIR", "")
SEED = 7


def cli_audit(tmp_path, *args):
    out = tmp_path / "cli.json"
    subprocess.run([CLI, "audit", "--seed", str(SEED), "--json", str(out), "--dump-dir", str(tmp_path), *args],
                   capture_output=True, text=True, timeout=900)
    return {(c["op"], c["property"]): (c["status"], c["worst_ratio"], c["cases"])
            for c in json.loads(out.read_text())["cases"]}


def py_audit(tmp_path, backend, **kw):
    rep = dsa_verify.audit(backend, seed=SEED, dump_dir=str(tmp_path), progress=False, **kw)
    return {(c.op, c.property): (c.status, c.worst_ratio, c.cases) for c in rep.cases}


@pytest.mark.skipif(not CLI, reason="DSA_VERIFY_BIN not set")
def test_torch_ops_from_python_same_verdicts_ratios_and_counts_as_libtorch_cpu(tmp_path):
    try:
        from dsa_torch_ops_backend import DsaTorchOps
        backend = DsaTorchOps()
    except ImportError as e:
        pytest.skip(f"dsa_verify._backends not built (no LibTorch): {e}")
    cli = cli_audit(tmp_path, "--backend", "libtorch-cpu")
    py = py_audit(tmp_path, backend)
    assert len(cli) > 50 and any(s == "pass" for s, _, _ in cli.values())
    # Every op, the SPEC §10 inference ops included (ran, not skipped, on both routes).
    section10 = {"fp8_indexer_scores", "paged_indexer_scores", "sparse_mla_fp8_fwd"}
    assert {op for (op, _), (s, _, _) in py.items() if s == "pass"} >= section10
    assert py == cli


@pytest.mark.skipif(not (CLI and PLUGINS), reason="DSA_VERIFY_BIN / DSA_MUTANT_PLUGIN_DIR not set")
@pytest.mark.parametrize("name, only", [  # a failing and a passing property each (plugin calls fork: kept few)
    ("smla_base2_lse", "smla.forward_ratio,smla.invalid_slots_never_read"),
    ("topk_selects_nan", "topk.nan_never_selected,topk.ties_resolved_bitwise"),
    ("paged_reads_one_block_past_context", "paged.indexer_ratio,fp8.indexer_ratio")])
def test_mutants_same_verdicts_as_their_plugins(tmp_path, name, only):
    index = dsa_verify._core.mutant_names().index(name)
    plugin = os.path.join(PLUGINS, f"libdsa_mutant_plugin_{index}.so")
    cli = cli_audit(tmp_path, "--plugin", plugin, "--only", only)
    py = py_audit(tmp_path, builtin.mutant(name), only=only.split(","))
    status = lambda d: {k: v[0] for k, v in d.items()}  # noqa: E731 - plugin ratios may differ in dtype handling
    assert any(s == "fail" for s in status(cli).values()), cli
    assert status(py) == status(cli)
