"""dsa_verify.audit and its report: the `dsa-verify audit` job for a Python backend.

The tasks (one per property, one per golden/peer fixture), their judgement, the summary
table, the progress line and the JSON/JUnit writers are the C++ ones of `dsa-verify audit`
(dsa_verify._core over the dsa_audit library); this file orders the tasks, runs them in
this process or in a fresh worker process each (isolate=True), and collects the report.
"""
import importlib
import inspect
import json as _json
import multiprocessing
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import List, Optional

from . import _core
from ._bridge import Bridge

DEFAULT_TIMEOUT_S = 300.0
# `python3 -m dsa_verify audit` sets this: a hung call's report (_on_hung_call) then also prints
# the summary, as the command does at the end.
_PRINT_SUMMARY_ON_HANG = False
# The accepted timeout, as `dsa-verify audit --timeout` (cli/src/numeric_options.h): at least one
# millisecond, at most one day, finite.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 86400.0
TIMEOUT_RANGE = "a finite number of seconds from 0.001 to 86400"


def check_timeout(timeout):
    """Returns `timeout` (seconds, int or float) as a float; raises ValueError naming the argument,
    the value and the range (TIMEOUT_RANGE) for NaN, inf, <= 0 or too large (fresh-user F7/F8:
    a NaN or negative timeout made every isolated case fail as "timed out", blaming the kernel)."""
    bad = isinstance(timeout, bool) or not isinstance(timeout, (int, float))
    if not bad:
        t = float(timeout)
        bad = not (MIN_TIMEOUT_S <= t <= MAX_TIMEOUT_S)  # also NaN and inf
    if bad:
        raise ValueError(f"argument 'timeout' (--timeout) got {timeout!r}, expected {TIMEOUT_RANGE}")
    return t


@dataclass
class CaseResult:
    """One audited case: a property run or one op of a golden/peer fixture."""
    op: str
    property: str
    status: str  # "pass" | "fail" | "skip"
    worst_ratio: Optional[float] = None  # worst err(candidate)/err(baseline); None: not measured
    worst_err_over_bound: Optional[float] = None  # worst err/bound (> 1 fails); None: not measured
    not_judged: List[str] = field(default_factory=list)  # outputs not judged: a pass is partial
    cases: int = 0  # generated cases (properties) or 1 (fixtures)
    message: str = ""  # failure or skip reason (oracle report, Python traceback)
    repro: str = ""  # one-line reproduction command
    fixture: str = ""  # dumped failing case or the fixture file
    seconds: float = 0.0
    input_error: bool = False

    def as_dict(self):
        return {k: getattr(self, k) for k in ("op", "property", "status", "worst_ratio", "worst_err_over_bound",
                                              "not_judged", "cases", "message", "repro", "fixture",
                                              "seconds")}


@dataclass
class Report:
    """Result of dsa_verify.audit: the same cases, table, JSON and JUnit as `dsa-verify audit`."""
    backend: str
    cases: List[CaseResult] = field(default_factory=list)
    level: int = 0
    seed: int = 0  # 0: RapidCheck drew a seed per property (see each repro line)
    device: str = "cpu"
    spec: str = ""
    notes: List[str] = field(default_factory=list)  # e.g. a fixture directory that holds no fixture

    @property
    def passed(self):
        """True when no case failed."""
        return not any(c.status == "fail" for c in self.cases)

    @property
    def failures(self):
        return [c for c in self.cases if c.status == "fail"]

    @property
    def input_error(self):
        return any(c.input_error for c in self.cases)

    def verdicts(self):
        """{(op, property): status} of every case."""
        return {(c.op, c.property): c.status for c in self.cases}

    def summary(self):
        """The summary table and failures, exactly as `dsa-verify audit` prints them."""
        return _core.format_summary(self.backend, [c.as_dict() for c in self.cases])

    def to_json(self):
        """The JSON report (format dsa-verify-audit/1) as text."""
        extra = {"level": self.level, "seed": self.seed, "plugin": "", "python_backend": self.spec,
                 "device": self.device, "version": _core.version, "notes": list(self.notes)}
        return _core.to_json(self.backend, [c.as_dict() for c in self.cases], _json.dumps(extra))

    def to_junit(self):
        """JUnit XML (one testsuite per op) as text."""
        return _core.to_junit(self.backend, [c.as_dict() for c in self.cases])

    @property
    def ran_nothing(self):
        """True when no case passed or failed (every one skipped): not a pass."""
        return not any(c.status in ("pass", "fail") for c in self.cases)

    def exit_code(self):
        """0 all passed, 1 a failure, 2 an input error or no case ran (as dsa-verify audit)."""
        if self.input_error:
            return 2
        if not self.passed:
            return 1
        return 2 if self.ran_nothing else 0


def load_backend(spec):
    """The backend named by "package.module:Attr" (Attr a class is instantiated without
    arguments, a plain function that is not an op is a factory called without arguments, e.g.
    dsa_verify.builtin:libtorch_cpu; an object or a module is used as is) or "package.module"
    (the module's functions are the ops). Raises ValueError naming the spec when it cannot be
    imported or found."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"backend '{spec}': cannot import module '{module_name}': {e}") from e
    if not attr:
        return module
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"backend '{spec}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    from ._bridge import OPS
    if isinstance(obj, type) or (inspect.isfunction(obj) and obj.__name__ not in OPS):
        return obj()
    return obj


def spec_of(backend):
    """"module:Class" naming a backend object in reproduction lines ("" when not importable)."""
    if isinstance(backend, str):
        return backend
    if type(backend).__name__ == "module":
        return backend.__name__
    cls = type(backend)
    if cls.__module__ in ("__main__", "builtins"):
        return ""
    return f"{cls.__module__}:{cls.__qualname__}"


def python_command():
    """"python3", or this interpreter's path when "python3" on PATH is another one (e.g. a
    pyenv shim without torch), so that reproduction lines run where the audit ran."""
    import shutil
    found = shutil.which("python3")
    same = found and os.path.realpath(found) == os.path.realpath(sys.executable)
    return "python3" if same else sys.executable


def provided_outputs(bridge):
    """The --outputs list of a backend's `outputs` attribute: for each op it has, the names it
    declares, or every output of an op it does not declare; None when it declares none. (Ops
    sharing names must declare them alike: Bridge checks it.)"""
    from ._bridge import OUTPUTS
    if not bridge.outputs:
        return None
    # Ops share names (sparse_mla_fwd and sparse_mla_fp8_fwd: out, lse, max_logits): each once,
    # as the CLI's --outputs takes them (a repeated name is a usage error there).
    names = [n for op, names in OUTPUTS.items() if bridge.supports(op) for n in bridge.outputs.get(op, names)]
    return list(dict.fromkeys(names))


def flag_argument(name, value):
    """`value` of the boolean argument `name` (allow_weak, sink_after_rounding, normalized_p,
    fixtures, ...), which must be True or False. Raises ValueError naming the argument for any
    other value: bool() would read the string "false" as True (fresh11 F6: a model switched on
    by compare(sink_after_rounding="false"))."""
    if not isinstance(value, bool):
        raise ValueError(f"argument '{name}' got {value!r}, expected True or False")
    return value


def sink_after_rounding_of(backend):
    """The backend's `sink_after_rounding` attribute (default False): True declares that its
    sparse MLA rounds out to 16 bits before applying attn_sink (the CLI's
    --sink-after-rounding). Raises ValueError for a value that is not a bool."""
    v = getattr(backend, "sink_after_rounding", False)
    if not isinstance(v, bool):
        raise ValueError(f"backend attribute 'sink_after_rounding' is {v!r}, expected True or False")
    return v


def normalized_p_of(backend):
    """The backend's `normalized_p` attribute (default False): True declares that its sparse
    MLA rounds softmax(P) to 16 bits before P·V, the max key's probability too (the CLI's
    --normalized-p). Raises ValueError for a value that is not a bool."""
    v = getattr(backend, "normalized_p", False)
    if not isinstance(v, bool):
        raise ValueError(f"backend attribute 'normalized_p' is {v!r}, expected True or False")
    return v


def _options(spec, ops, only, level, seed, dump_dir, fixtures, device):
    # A uint64, as `dsa-verify audit --seed`: a negative or larger value is an error, not a wrap.
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise ValueError(f"argument 'seed' (--seed) got {seed!r}, expected an integer from 0 to {2**64 - 1}")
    target = spec or "<module:Class>"
    dev = "" if device == "cpu" else f" --device {device}"
    py = python_command()
    return {
        "ops": list(ops or []), "only": list(only or []), "level": int(level), "seed": int(seed or 0),
        "dump_dir": dump_dir, "fixtures": flag_argument("fixtures", fixtures),
        "repro_audit": f"{py} -m dsa_verify audit {target}{dev}",
        "repro_replay": f"{py} -m dsa_verify replay {{fixture}} {target}{dev}",
    }


def _cases(dicts):
    return [CaseResult(**d) for d in dicts]


def _worker(payload, device, options, prop, conn):
    """Runs one task in a fresh process and sends its case dicts back."""
    try:
        backend = load_backend(payload) if isinstance(payload, str) else payload
        conn.send(("ok", _core.run_task(Bridge(backend, device), options, prop)))
    except BaseException:  # noqa: BLE001 - reported to the parent as a failed case
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _signal_name(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def run_isolated(payload, device, options, task, timeout_s):
    """One task in a fresh (spawned) worker process: a crash, a CUDA fault or a hang becomes a
    failed case with a message; the caller's process is untouched."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(payload, device, options, task["property"], send), daemon=True)
    proc.start()
    send.close()
    msg, timed_out = None, False
    if recv.poll(timeout_s):
        try:
            msg = recv.recv()
        except EOFError:  # the worker died before sending
            msg = None
    else:
        timed_out = True
    recv.close()
    if timed_out:
        proc.kill()
        proc.join()
        why = f"timed out after {timeout_s:g} s in an isolated worker; killed (isolate=True, timeout)"
    else:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if msg is not None and msg[0] == "ok":
            return _cases(msg[1])
        if msg is not None:
            why = "isolated worker raised:\n" + msg[1]
        elif proc.exitcode is not None and proc.exitcode < 0:
            why = (f"isolated worker crashed with {_signal_name(-proc.exitcode)} "
                   "(a fault in the kernel, e.g. an illegal memory access)")
        else:
            why = f"isolated worker exited with code {proc.exitcode} without a result"
    is_property = not task["fixture"]
    repro = options["repro_audit"]
    if is_property:
        repro += f" --only {task['property']} --level {options['level']}"
    return [CaseResult(op=task["op"], property=("property:" if is_property else "") + task["property"],
                       status="fail", message=why, repro=repro, fixture=task["fixture"])]


# The non-isolated audit in progress (audit(), isolate=False): what _on_hung_call needs to write
# its report. None outside one (e.g. the pytest plugin's run).
_RUNNING = None


def _on_hung_call(what, seconds):
    """Called by the C++ CallWatchdog (on its own thread, with the GIL) when a call of the backend
    in this process is still running at the timeout (isolate=False): adds the hung task as a
    failed case naming the call, writes the JSON/JUnit reports and the summary of every result
    already computed, and returns; the caller then ends the process (exit 1) without waiting for
    the stuck call, which cannot be killed in this process (isolate=True runs each task in a
    worker process that is killed instead)."""
    run = _RUNNING
    why = (f"timed out after {run['timeout'] if run else 0:g} s: the {what.split(': ', 1)[-1]} was still running "
           f"after {seconds:.0f} s (timeout, per call; isolate=False: a call in this process cannot be killed, so "
           "the audit stopped here and wrote this report without waiting for it; isolate=True runs each task in a "
           "worker process that is killed)")
    sys.stdout.flush()
    if run is None:
        sys.stderr.write(f"\ndsa_verify: {what}: {why}\n")
        sys.stderr.flush()
        return
    report, task, options = run["report"], run["task"], run["options"]
    is_property = not task["fixture"]
    repro = options["repro_audit"] + (f" --only {task['property']} --level {options['level']}" if is_property else "")
    report.cases.append(CaseResult(op=task["op"], property=("property:" if is_property else "") + task["property"],
                                   status="fail", message=why, repro=repro, fixture=task["fixture"],
                                   seconds=float(seconds)))
    report.notes.append(f"audit stopped: an in-process call hung ({what}); {run['not_run']} task(s) not run")
    sys.stderr.write("\n")
    if run["json"]:
        with open(run["json"], "w", encoding="utf-8") as f:
            f.write(report.to_json())
    if run["junit"]:
        with open(run["junit"], "w", encoding="utf-8") as f:
            f.write(report.to_junit())
    if run["print_summary"]:
        sys.stdout.write(report.summary())
    sys.stdout.flush()
    sys.stderr.flush()


def _payload(backend):
    """What a worker process rebuilds the backend from: its "module:Class" spec, or the object
    itself (pickled). Raises ValueError when neither is possible."""
    if isinstance(backend, str):
        return backend
    import pickle
    try:
        pickle.dumps(backend)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"isolate=True: the backend object cannot be pickled ({e}); pass it as a "
                         "'module:Class' string instead") from e
    return backend


def audit(backend, ops=None, level=0, seed=None, device="cpu", json=None, junit=None, only=None,
          fixtures=True, isolate=False, timeout=DEFAULT_TIMEOUT_S, dump_dir="dsa-verify-failures",
          fail_fast=False, progress=True, allow_weak=False, unsupported=None, sink_after_rounding=False,
          normalized_p=False):
    """Audits a Python backend with the full suite of `dsa-verify audit`.

    backend: an object with methods named after the ops (indexer_scores,
      indexer_scores_backward, topk, sparse_mla_fwd, sparse_mla_bwd, indexer_kl_loss and the
      SPEC §10 ops fp8_indexer_scores, paged_indexer_scores, sparse_mla_fp8_fwd, whose FP8
      inputs are torch.uint8 bytes with fp8_format) taking SPEC argument names and torch
      tensors, or a "module:Class" string. Optional attributes: name, deterministic, outputs,
      tie_breaks, dtypes, fp8_formats, fp8_reduced_accumulation (see dsa_verify._bridge.Bridge).
    ops: op names to audit (default all the backend has); only: property names (runs only
      those, no fixtures); level: 0 (CI) / 1 / 2 (soak) cases per property; seed: property
      seed (None: random per property, printed in each repro line); device: "cpu" | "cuda":
      where inputs are placed; json / junit: report paths (checked before the run);
      fixtures: also run the golden and peer fixtures; isolate: each task (property or
      fixture) in a fresh spawned worker process with `timeout` seconds, so a crash or hang
      is a failed case (default False: in this process, fastest, shares its faults; each call
      of the backend is then watched with `timeout` seconds: a call still running at it is a
      failed case "timed out after N s" naming the call, the JSON/JUnit reports of every result
      computed so far are written and the process exits with status 1 without waiting for the
      stuck call, which cannot be killed in-process);
      dump_dir: where failing property cases are dumped as fixtures; allow_weak: a WEAK
      output (a bound too wide to detect a fault, SPEC §9) does not fail (--allow-weak);
      sink_after_rounding: the kernel rounds sparse MLA's out to 16 bits before applying
      attn_sink (--sink-after-rounding; also a backend attribute of that name); normalized_p:
      the kernel rounds softmax(P) to 16 bits before P·V, the max key's too (--normalized-p;
      also a backend attribute of that name).
      The backend's `outputs` attribute is the CLI's --outputs: outputs it does not return
      are "not judged" instead of INCOMPLETE. unsupported: what the kernel leaves out
      (--unsupported: feature keys such as invalid_ids, empty_rows, duplicate_ids, or property
      names); a backend that declines SPEC-mandatory cases not named here makes the property
      fail "INCOMPLETE: backend declined mandatory cases: ..." (props::run_property).
    Returns a Report (same verdicts, ratios, repro lines and dumps as the CLI). Raises
    ValueError for unknown ops/properties, a timeout outside TIMEOUT_RANGE or a bad backend
    attribute, OSError for an
    unwritable report path.
    """
    timeout = check_timeout(timeout)  # a usage error before anything runs or is written
    for name, value in (("allow_weak", allow_weak), ("sink_after_rounding", sink_after_rounding),
                        ("normalized_p", normalized_p), ("fixtures", fixtures)):
        flag_argument(name, value)
    spec = spec_of(backend)
    obj = load_backend(backend) if isinstance(backend, str) else backend
    bridge = Bridge(obj, device)
    for path in (json, junit):
        if path:
            with open(path, "w", encoding="utf-8"):
                pass
    options = _options(spec, ops, only, level, seed, dump_dir, fixtures, device)
    options["provided_outputs"] = provided_outputs(bridge)
    options["allow_weak"] = flag_argument("allow_weak", allow_weak)
    options["sink_after_rounding"] = flag_argument("sink_after_rounding", sink_after_rounding) or \
        sink_after_rounding_of(obj)
    options["normalized_p"] = flag_argument("normalized_p", normalized_p) or normalized_p_of(obj)
    options["unsupported"] = list(unsupported or [])
    if not isolate:
        # Every call of the backend in this process is watched: one still running at `timeout`
        # ends the audit with the report written (_on_hung_call) and exit 1 (CallWatchdog).
        options["call_timeout"] = timeout
    report = Report(backend=bridge.name, level=int(level), seed=int(seed or 0), device=device, spec=spec)
    why = bridge.unavailable_reason()
    if why:
        report.cases.append(CaseResult(op="*", property=f"backend {bridge.name}", status="skip", message=why))
    else:
        tasks = _core.list_tasks(bridge, options)
        # Fixtures judged: a directory holding none is a note (neither holding any: ValueError above).
        report.notes = list(_core.check_fixture_dirs()) if fixtures and not only else []
        if progress:
            for note in report.notes:
                sys.stderr.write(f"note: {note}\n")
        if progress:
            sys.stdout.flush()
            sys.stderr.write(f"audit {bridge.name}: {len(tasks)} tasks (level {level}, seed "
                             f"{seed if seed else 'random per property'}, device {device}"
                             f"{', isolated' if isolate else ''})\n")
            sys.stderr.flush()
        bar = _core.Progress(len(tasks)) if progress else None
        payload = _payload(backend) if isolate else None
        global _RUNNING
        for i, task in enumerate(tasks):
            if isolate:
                results = run_isolated(payload, device, options, task, timeout)
            else:
                _RUNNING = {"report": report, "task": task, "options": options, "timeout": timeout, "json": json,
                            "junit": junit, "not_run": len(tasks) - i - 1, "print_summary": _PRINT_SUMMARY_ON_HANG}
                try:
                    results = _cases(_core.run_task(bridge, options, task["property"]))
                finally:
                    _RUNNING = None
            report.cases.extend(results)
            failed = any(r.status == "fail" for r in results)
            # A task none of whose cases ran is a skip in the progress line, never a pass
            # (issue 12 item 8), as in `dsa-verify audit`.
            skipped = all(r.status == "skip" for r in results)  # also none (a fixture of other ops)
            if bar:
                status = "fail" if failed else ("skip" if skipped else "pass")
                partial = next((r.not_judged for r in results if r.status == "pass" and r.not_judged), [])
                skipped = ", ".join(r.op for r in results if r.status == "skip")
                # a property's failure shows the op whose check failed, as the table does
                shown_op = next((r.op for r in results if r.status == "fail"), task["op"]) \
                    if failed and not task["fixture"] else task["op"]
                bar.update({"op": shown_op, "property": task["property"], "status": status,
                            "not_judged": partial,
                            "message": f"skip: {skipped}" if status == "pass" and skipped else ""})
            if fail_fast and failed:
                break
        if bar:
            bar.finish()
    if json:
        with open(json, "w", encoding="utf-8") as f:
            f.write(report.to_json())
    if junit:
        with open(junit, "w", encoding="utf-8") as f:
            f.write(report.to_junit())
    return report
