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
import re
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import _core, _supervisor
from ._bridge import Bridge

DEFAULT_TIMEOUT_S = 300.0
# `python3 -m dsa_verify audit` sets this: a hung call's report (_on_hung_call) then also prints
# the summary, as the command does at the end.
_PRINT_SUMMARY_ON_HANG = False
# `python3 -m dsa_verify audit` sets this: SIGTERM, like SIGINT, then raises AuditInterrupted
# (the command prints the summary and exits 128 + signal); a library caller's process is ended by
# SIGTERM once the reports are written, as SIGTERM's default action would.
_COMMAND_LINE = False
# The accepted timeout, as `dsa-verify audit --timeout` (cli/src/numeric_options.h): at least one
# millisecond, at most one day, finite.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 86400.0
TIMEOUT_RANGE = "a positive decimal number of seconds from 0.001 to 86400"
# A decimal number as `dsa-verify audit --timeout` takes it (numeric_options.h decimal_text):
# digits with at most one '.', an optional exponent; no hex ("0x10"), sign, "_" or space.
_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


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


def timeout_from_text(text, flag="--timeout"):
    """The seconds of a command-line timeout `text` (`flag`: the option's name, --timeout or
    --dsa-timeout) as a float. Raises ValueError naming the option, the text and TIMEOUT_RANGE
    for anything but a decimal number in range: float() would read "1_0" as 10 and "inf" as a
    number; the C++ CLI refuses "0x10", which strtod would read as 16 (fresh12 F11)."""
    body = text[1:] if isinstance(text, str) and text[:1] in ("+", "-") else text
    if not isinstance(text, str) or not (_DECIMAL.fullmatch(body) or body in ("inf", "nan")):
        raise ValueError(f"argument '{flag}' got {text!r}, expected {TIMEOUT_RANGE}")
    value = float(text)
    if not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:  # also nan and inf
        raise ValueError(f"argument '{flag}' got {text}, expected {TIMEOUT_RANGE}")
    return value


def list_from_text(text, flag):
    """The names of a comma-separated list option `text` (`flag`: the option's name, e.g. --ops
    or --dsa-unsupported), in order; "" is the empty list. Raises ValueError naming the option
    and the text for an empty item ("a,,b", "a,") or a name given twice, as the C++ CLI's
    split_list_option (cli/src/judge.cpp): a repeat is never merged silently."""
    if not text:
        return []
    names = text.split(",")
    for i, name in enumerate(names):
        if not name:
            raise ValueError(f"argument '{flag}' got \"{text}\": an empty item, expected comma-separated names "
                             "(e.g. a,b), none empty")
        if name in names[:i]:
            raise ValueError(f"argument '{flag}' names \"{name}\" twice (got \"{text}\"), expected each name once")
    return names


def seconds_text(seconds):
    """A duration in seconds as message text, as the C++ seconds_text (call_watchdog.h): three
    significant digits below 10 s ("0.25"), tenths from 10 s on ("31.4", "300"); never "0" for a
    nonzero duration."""
    if seconds < 10:
        return f"{seconds:.3g}"
    text = f"{seconds:.1f}"
    return text[:-2] if text.endswith(".0") else text


@dataclass
class CaseResult:
    """One audited case: a property run or one op of a golden/peer fixture."""
    op: str
    property: str
    status: str  # "pass" | "fail" | "skip"
    worst_ratio: Optional[float] = None  # worst err(candidate)/err(baseline); None: not measured
    worst_err_over_bound: Optional[float] = None  # worst err/bound (> 1 fails); None: not measured
    # NaN/±inf positions whose class differs from the reference's (SPEC §9: must be 0); when > 0
    # the two ratios above (over the matching positions) miss the failure: the table says "nonfinite"
    nonfinite_mismatches: int = 0
    not_judged: List[str] = field(default_factory=list)  # outputs not judged: a pass is partial
    cases: int = 0  # generated cases (properties) or 1 (fixtures)
    message: str = ""  # failure or skip reason (oracle report, Python traceback)
    repro: str = ""  # one-line reproduction command
    fixture: str = ""  # dumped failing case or the fixture file
    seconds: float = 0.0
    input_error: bool = False

    def as_dict(self):
        return {k: getattr(self, k) for k in ("op", "property", "status", "worst_ratio", "worst_err_over_bound",
                                              "nonfinite_mismatches", "not_judged", "cases", "message", "repro", "fixture",
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
    # "SIGINT" / "SIGTERM" when the audit was interrupted (the running case is then "interrupted",
    # not a verdict), else None; tasks_not_run: tasks of the audit that never started.
    interrupted: Optional[str] = None
    tasks_not_run: int = 0
    # False while the audit runs (the reports written after each task say so) and when it stopped
    # early (interrupted, a hung call); True once every task ran.
    finished: bool = False
    # The ops named by `ops=` (empty: every op). An op named there of which no case passed or
    # failed (all skipped: a misnamed or missing method) is not a pass (fresh17 F6).
    ops_named: List[str] = field(default_factory=list)
    op_hints: Dict[str, str] = field(default_factory=dict)  # near_miss_hint of each named op

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
                 "device": self.device, "version": _core.version, "notes": list(self.notes),
                 "interrupted": self.interrupted, "tasks_not_run": self.tasks_not_run, "finished": self.finished,
                 "ops_that_ran_no_case": [f"{self.backend}/{op}" for op in self.ops_that_ran_no_case]}
        return _core.to_json(self.backend, [c.as_dict() for c in self.cases], _json.dumps(extra))

    def to_junit(self):
        """JUnit XML (one testsuite per op) as text."""
        return _core.to_junit(self.backend, [c.as_dict() for c in self.cases])

    @property
    def ran_nothing(self):
        """True when no case passed or failed (every one skipped): not a pass."""
        return not any(c.status in ("pass", "fail") for c in self.cases)

    @property
    def ops_that_ran_no_case(self):
        """The ops named by `ops=` of which some case was selected and none passed or failed
        (every one skipped). An op that `only=` left without a case is not listed."""
        judged = {c.op for c in self.cases if c.status in ("pass", "fail")}
        selected = {c.op for c in self.cases}
        return [op for op in self.ops_named if op in selected and op not in judged]

    def exit_code(self):
        """0 all passed, 1 a failure, 2 an input error, no case ran, or an op named by `ops=` ran
        no case (as dsa-verify audit)."""
        if self.input_error:
            return 2
        if not self.passed:
            return 1
        return 2 if self.ran_nothing or self.ops_that_ran_no_case else 0


def near_miss_hint(backend, op):
    """A hint for an op the backend object `backend` does not provide: "; it has a method
    <name>, but the op's method is named <op>" when one of its public callables is a close
    spelling of `op` and not another op's name (difflib, cutoff 0.6: e.g. sparse_mla_backward for
    sparse_mla_bwd), else "".
    Used by the error line of an op named by `ops=` that judged no case (fresh17 F6)."""
    import difflib
    from ._bridge import OPS  # another op's method is not a misspelling of this one
    names = [n for n in dir(backend) if not n.startswith("_") and n not in OPS and callable(getattr(backend, n, None))]
    close = difflib.get_close_matches(op, names, n=1, cutoff=0.6)
    return f"; it has a method {close[0]}, but the op's method is named {op}" if close else ""


def write_atomically(path, text):
    """Writes `text` to `path` through a temporary file in the same directory, renamed over it,
    so that `path` always holds a whole report (the previous one or this one), never a truncated
    one, whatever stops the process (SIGKILL, a crash, a full disk). A path that exists and is not
    a regular file (/dev/stdout, a pipe) is written directly. Raises OSError naming `path`."""
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(e.errno, f"{path}: cannot write the report: {e.strerror}") from e
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_reports(report, json_path, junit_path):
    """The JSON and JUnit reports of `report` as it stands (write_atomically)."""
    if json_path:
        write_atomically(json_path, report.to_json())
    if junit_path:
        write_atomically(junit_path, report.to_junit())


def load_backend(spec):
    """The backend named by "package.module:Attr" (Attr a class is instantiated without
    arguments, a plain function that is not an op is a factory called without arguments, e.g.
    dsa_verify.builtin:libtorch_cpu; an object or a module is used as is) or "package.module"
    (the module's functions are the ops). Raises ValueError naming the spec when it cannot be
    imported or found, or when a "package.module" spec names a module with no op function
    (e.g. one defining the backend class: the message names its classes, fresh14 F5)."""
    from ._bridge import OPS
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"backend '{spec}': cannot import module '{module_name}': {e}") from e
    if not attr:
        if not any(callable(getattr(module, op, None)) for op in OPS):
            classes = [c for n, c in vars(module).items()
                       if isinstance(c, type) and c.__module__ == module.__name__ and not n.startswith("_")]
            with_ops = [c for c in classes if any(hasattr(c, op) for op in OPS)]
            names = [c.__name__ for c in (with_ops or classes)]
            here = f"classes here: {', '.join(names)}" if names else "it defines no class"
            raise ValueError(f"backend '{spec}' is a module with no op methods (no function named after an op, "
                             f"e.g. topk or sparse_mla_fwd); name its class: {module_name}:<Class> ({here})")
        return module
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"backend '{spec}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
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


def names_argument(name, value):
    """`value` of the list-of-names argument `name` (ops, only, unsupported, conventions,
    provided_outputs) as a list of str; None stays None. Raises TypeError naming the argument
    for a single str (list("out") would judge the letters 'o', 'u', 't': fresh14 F3), a
    non-iterable, or an item that is not a str."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError(f"argument '{name}' expected a list of names, got {type(value).__name__} {value!r}")
    try:
        names = list(value)
    except TypeError:
        raise TypeError(f"argument '{name}' expected a list of names, got {type(value).__name__} {value!r}") from None
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"argument '{name}' expected a list of names, got an item {n!r} "
                            f"({type(n).__name__}) in {value!r}")
    return names


def path_argument(name, value, what="a file path"):
    """`value` of the path argument `name` (json, junit, dump_dir): None, or a non-empty str or
    os.PathLike. Raises ValueError naming the argument for "": a report asked for with an empty
    path (a CI line `--json $REPORT` with REPORT unset) must not be dropped silently (fresh14 F1)."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"argument '{name}' got {value!r}, expected {what}")
    if os.fspath(value) == "":
        raise ValueError(f"argument '{name}' got \"\" (empty), expected {what}")
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


def _options(spec, ops, only, level, seed, dump_dir, fixtures, device, isolate=False, timeout=DEFAULT_TIMEOUT_S,
             unsupported=(), allow_weak=False, sink_after_rounding=False, normalized_p=False):
    """The options dict of _core.list_tasks / run_task, with the reproduction commands. These
    repeat every option of this run that changes what runs or how it is judged (fresh12 F11):
    --ops, --seed, --isolate, --timeout (when not the default), --unsupported and the judging
    flags given by the caller (allow_weak, sink_after_rounding, normalized_p; a backend's own
    declarations are read again from it); a property's --only and --level are added per task."""
    # A uint64, as `dsa-verify audit --seed`: a negative or larger value is an error, not a wrap.
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
        raise ValueError(f"argument 'seed' (--seed) got {seed!r}, expected an integer from 0 to {2**64 - 1}")
    target = spec or "<module:Class>"
    dev = "" if device == "cpu" else f" --device {device}"
    judging = "".join(f" --{flag}" for flag, on in (("allow-weak", allow_weak),
                                                    ("sink-after-rounding", sink_after_rounding),
                                                    ("normalized-p", normalized_p)) if on is True)
    run = ""
    if ops:
        run += " --ops " + ",".join(ops)
    if seed:
        run += f" --seed {int(seed)}"
    if isolate is True:
        run += " --isolate"
    if timeout != DEFAULT_TIMEOUT_S:
        run += f" --timeout {float(timeout)!r}"
    if unsupported:
        run += " --unsupported " + ",".join(unsupported)
    py = python_command()
    return {
        "ops": list(ops or []), "only": list(only or []), "level": int(level), "seed": int(seed or 0),
        "dump_dir": dump_dir, "fixtures": flag_argument("fixtures", fixtures),
        "repro_audit": f"{py} -m dsa_verify audit {target}{dev}{judging}{run}",
        "repro_replay": f"{py} -m dsa_verify replay {{fixture}} {target}{dev}{judging}",
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
    try:
        if recv.poll(timeout_s):
            try:
                msg = recv.recv()
            except EOFError:  # the worker died before sending
                msg = None
        else:
            timed_out = True
    except BaseException:
        # SIGINT / SIGTERM while the worker runs: it is killed, the caller writes the reports.
        proc.kill()
        proc.join()
        raise
    finally:
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
    return [CaseResult(op=task["op"], property=_task_label(task), status="fail", message=why,
                       repro=_task_repro(task, options), fixture=task["fixture"])]


# The in-process task in progress (audit() with isolate=False, the pytest plugin): what
# _on_hung_call needs. None outside one.
_RUNNING = None


def _hung_message(what, seconds, timeout, flag, isolate_flag, ending):
    """The failed case's message of a call still running at the timeout."""
    return (f"timed out after {timeout:g} s: the {what.split(': ', 1)[-1]} was still running after "
            f"{seconds_text(seconds)} s ({flag}, per call; a call in this process cannot be killed: {ending}; "
            f"{isolate_flag} runs each task in a worker process that is killed)")


def _on_hung_call(what, seconds):
    """Called by the C++ CallWatchdog (on its own thread, with the GIL) when a call of the backend
    in this process is still running at the timeout. Returns True when handled without ending the
    process (the pytest plugin: the waiting test fails, see _run_in_worker), else False after
    adding the hung task as a failed case naming the call and writing the JSON/JUnit reports and
    the summary of every result already computed (audit(), isolate=False); the caller then ends
    the process (exit 1) without waiting for the stuck call, which cannot be killed in this
    process (isolate=True runs each task in a worker process that is killed instead)."""
    run = _RUNNING
    sys.stdout.flush()
    if run is None:
        sys.stderr.write(f"\ndsa_verify: {what}: a call was still running after {seconds_text(seconds)} s "
                         "(timeout, per call); the process ends without waiting for it\n")
        sys.stderr.flush()
        _supervisor.note_end(1)  # the exit status the caller ends the process with
        return False
    if run.get("keep_process"):
        run["hung"] = (what, float(seconds))
        run["hung_event"].set()
        return True
    why = _hung_message(what, seconds, run["timeout"], "timeout", "isolate=True",
                        "the audit stopped here and wrote this report without waiting for it")
    report, task, options = run["report"], run["task"], run["options"]
    report.cases.append(CaseResult(op=task["op"], property=_task_label(task), status="fail", message=why,
                                   repro=_task_repro(task, options), fixture=task["fixture"],
                                   seconds=float(seconds)))
    report.notes.append(f"audit stopped: an in-process call hung ({what}); {run['not_run']} task(s) not run")
    report.tasks_not_run = run["not_run"]
    report.finished = False
    sys.stderr.write("\n")
    try:
        _write_reports(report, run["json"], run["junit"])
    except OSError as e:
        sys.stderr.write(f"dsa_verify: {e}\n")
    if run["print_summary"]:
        sys.stdout.write(report.summary())
    sys.stdout.flush()
    sys.stderr.flush()
    _supervisor.note_end(1)  # the exit status the caller ends the process with
    return False


def _task_label(task):
    """The property column of a task's cases: "property:<name>" or the fixture's "golden:<name>"."""
    return task["property"] if task["fixture"] else "property:" + task["property"]


def _task_name(task):
    """A task as messages name it: its ops and its property column, e.g. "topk
    property:topk.contract_exact" or "sparse_mla_fwd,sparse_mla_bwd golden:smla_sink"."""
    return f"{','.join(task.get('ops') or [task['op']])} {_task_label(task)}"


def _task_repro(task, options):
    """The reproduction command of a task as a whole (a property re-run, or the audit's line)."""
    repro = options["repro_audit"]
    return repro + (f" --only {task['property']} --level {options['level']}" if not task["fixture"] else "")


# The worker thread of the last in-process task (_run_in_worker): a new audit waits for it to wind
# down before re-enabling backend calls.
_LAST_WORKER = None


class _Stopped(BaseException):
    """SIGTERM during audit() (raised by its handler in the main thread)."""

    def __init__(self, signame):
        super().__init__(signame)
        self.signame = signame


def _run_in_worker(bridge, options, key, hung_event=None):
    """_core.run_task(bridge, options, key) on a daemon worker thread while this thread waits in
    short slices, so that SIGINT (KeyboardInterrupt) and SIGTERM reach this (main) thread at once,
    whatever the task computes. Returns its CaseResults; re-raises what run_task raised; returns
    None when `hung_event` is set (a call hung, _on_hung_call): the stuck thread cannot be
    stopped and keeps running. The worker inherits this thread's CUDA device and grad mode."""
    global _LAST_WORKER
    import threading
    import torch
    device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    grad = torch.is_grad_enabled()
    box = {}

    def work():
        try:
            if device is not None:
                torch.cuda.set_device(device)
            torch.set_grad_enabled(grad)
            box["cases"] = _core.run_task(bridge, options, key)
        except BaseException as e:  # noqa: BLE001 - re-raised in the waiting thread
            box["error"] = e

    worker = threading.Thread(target=work, name=f"dsa-verify {key}", daemon=True)
    _LAST_WORKER = worker
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
        if hung_event is not None and hung_event.is_set():
            return None
    if "error" in box:
        raise box["error"]
    return _cases(box["cases"])


def _wind_down_last_worker(seconds=30.0):
    """Waits up to `seconds` for the worker of an interrupted audit (its calls raise at once) and
    re-enables backend calls for a new run."""
    if _LAST_WORKER is not None and _LAST_WORKER.is_alive():
        _LAST_WORKER.join(seconds)
    _core.request_stop(False)


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
    ValueError for unknown ops/properties, a timeout outside TIMEOUT_RANGE, an empty json,
    junit or dump_dir path ("") or a bad backend attribute, TypeError when ops, only or
    unsupported is a single str instead of a list of names, OSError for an
    unwritable report path.
    """
    timeout = check_timeout(timeout)  # a usage error before anything runs or is written
    ops, only, unsupported = (names_argument("ops", ops), names_argument("only", only),
                              names_argument("unsupported", unsupported))
    json, junit = path_argument("json", json), path_argument("junit", junit)
    path_argument("dump_dir", dump_dir, "a directory path")
    for name, value in (("allow_weak", allow_weak), ("sink_after_rounding", sink_after_rounding),
                        ("normalized_p", normalized_p), ("fixtures", fixtures)):
        flag_argument(name, value)
    spec = spec_of(backend)
    obj = load_backend(backend) if isinstance(backend, str) else backend
    bridge = Bridge(obj, device)
    options = _options(spec, ops, only, level, seed, dump_dir, fixtures, device, isolate=isolate, timeout=timeout,
                       unsupported=unsupported, allow_weak=allow_weak, sink_after_rounding=sink_after_rounding,
                       normalized_p=normalized_p)
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
    report = Report(backend=bridge.name, level=int(level), seed=int(seed or 0), device=device, spec=spec,
                    ops_named=list(ops or []), op_hints={op: near_miss_hint(obj, op) for op in ops or []})
    # The report paths are checked before the run, and hold a valid report from now on: this
    # one ("finished": false), then one after each task, so that whatever ends the process, the
    # results already computed are on disk (write_atomically: never a truncated file).
    _write_reports(report, json, junit)
    why = bridge.unavailable_reason()
    if why:
        report.cases.append(CaseResult(op="*", property=f"backend {bridge.name}", status="skip", message=why))
        report.finished = True
        _write_reports(report, json, junit)
        return report
    _wind_down_last_worker()  # an earlier interrupted audit's worker; backend calls enabled
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
    running, not_run, signame, write_error = None, 0, None, None
    previous_sigterm = _catch_sigterm()
    try:
        for i, task in enumerate(tasks):
            running, not_run = task, len(tasks) - i - 1
            _supervisor.note_task(_task_name(task), not_run)  # python3 -m dsa_verify: whose call ended it
            if isolate:
                results = run_isolated(payload, device, options, task, timeout)
            else:
                _RUNNING = {"report": report, "task": task, "options": options, "timeout": timeout, "json": json,
                            "junit": junit, "not_run": not_run, "print_summary": _PRINT_SUMMARY_ON_HANG}
                try:
                    results = _run_in_worker(bridge, options, task["property"])
                finally:
                    _RUNNING = None
            running = None
            report.cases.extend(results)
            try:
                _write_reports(report, json, junit)
            except OSError as e:  # e.g. a full disk: said once; the final write raises it
                if write_error is None and progress:
                    sys.stderr.write(f"\ndsa_verify: warning: {e}; the audit goes on\n")
                write_error = e
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
    except KeyboardInterrupt:
        signame = "SIGINT"
    except _Stopped as e:
        signame = e.signame
    finally:
        _RUNNING = None
        _restore_sigterm(previous_sigterm)
    if bar:
        bar.finish()
    if signame:
        _core.request_stop(True)  # the running task's later calls raise at once, the kernel is not called
        if running is not None:
            report.cases.append(CaseResult(op=running["op"], property=_task_label(running), status="interrupted",
                                           message=f"interrupted by {signame} while this case ran; not a verdict",
                                           fixture=running["fixture"]))
        report.interrupted, report.tasks_not_run = signame, not_run
        _write_reports(report, json, junit)
        if not _COMMAND_LINE:
            if signame == "SIGTERM":
                # SIGTERM's default action, now that the reports are written: the process ends.
                sys.stdout.flush()
                sys.stderr.flush()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            _wind_down_last_worker(10.0)  # its calls raise at once: it ends within a call or two
        raise AuditInterrupted(report, signame)
    report.finished = True
    _write_reports(report, json, junit)
    return report


class AuditInterrupted(KeyboardInterrupt):
    """Raised by audit() when SIGINT (Ctrl-C) or SIGTERM stopped it, after its JSON/JUnit reports
    were written with the cases computed so far ("interrupted": the signal's name; the running
    case reported "interrupted", not a verdict). report: that Report; signame: "SIGINT" or
    "SIGTERM". A KeyboardInterrupt, so code that stops on Ctrl-C stops on it."""

    def __init__(self, report, signame):
        super().__init__(f"audit interrupted by {signame}: partial report; {report.tasks_not_run} task(s) not run")
        self.report, self.signame = report, signame


def _catch_sigterm():
    """From here SIGTERM raises _Stopped("SIGTERM") in the main thread (so audit() writes the
    reports of what it computed), when audit() runs in the main thread and SIGTERM has its default
    action; returns what _restore_sigterm needs (None: nothing changed)."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def stop(signum, frame):
        raise _Stopped("SIGTERM")
    signal.signal(signal.SIGTERM, stop)
    return signal.SIG_DFL


def _restore_sigterm(previous):
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
