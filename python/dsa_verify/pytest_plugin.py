"""pytest plugin: one test per (op, property) and per (op, fixture) of a dsa-verify audit.

    python3 -m pytest -p dsa_verify.pytest_plugin --dsa-backend=mypkg.kernels:MyKernel \\
        [--dsa-level 1] [--dsa-ops topk] [--dsa-device cuda] [--dsa-isolate] [-k contract_exact] \\
        [--dsa-unsupported invalid_ids] [--junitxml report.xml]

(or `pytest_plugins = ["dsa_verify.pytest_plugin"]` in a conftest.py, or
PYTEST_PLUGINS=dsa_verify.pytest_plugin). Test ids are `dsa-verify::<op>::<case>`, e.g.
`dsa-verify::topk::property:topk.contract_exact` or `dsa-verify::sparse_mla_bwd::golden:smla_sink`;
-k selects on them; in JUnit XML the classname is `dsa-verify.<op>` and the name the case. A failure's message is the oracle's report followed by its one-line
reproduction and the dumped fixture. Verdicts are those of dsa_verify.audit (the C++ judgement):
every case the audit fails fails a test (a forward property's backward failure, filed under
sparse_mla_bwd, fails that property's test), and where `python3 -m dsa_verify audit` exits 2
(an input error, or an audit that judged nothing: every selected case skipped) the session
exits 4 (pytest's usage error) with the CLI's error line.

Process exits: with --dsa-backend the session runs in a forked child that pytest's process waits
for (dsa_verify._supervisor): a kernel that ends the process (exit(0) in C or CUDA code,
os._exit) fails the session (exit 1, "dsa-verify: error: the backend ended the process (exit
status 0) during dsa-verify::<op>::<case>; nothing after it was judged ...") instead of exiting 0
with the later tests never run. sys.exit() or a KeyboardInterrupt raised by the kernel itself (no
signal) fails that test; the session goes on. With --junitxml the child hands every test report to
the supervisor, which writes the JUnit file when the child ends before pytest does: the tests
reported before, the running one as a failure (the error line), the ones never run as skipped.

pytest-xdist: with --dsa-backend, -n N (N > 0), --dist or --tx is a usage error (exit 4) naming the
flag: xdist workers would each run part of the audit in a process of their own, unsupervised, and
decide the session's no-verdict exit where the controller does not read it.

Timeouts: every call of the backend is watched with --dsa-timeout seconds (default 300). With
--dsa-isolate each task runs in a worker process that is killed at it (a failed test; the
session goes on). Without it the backend runs in this process, each task in a worker thread: a
call still running at the timeout fails its test ("timed out after S s: the topk call of backend
'x' was still running ..."). A thread cannot be killed, so the stuck call keeps running in the
background, and every later dsa-verify test of the session fails without running ("not run: a
call of the backend hung ..."): restart pytest (or use --dsa-isolate) once it is fixed. A call
that holds the GIL in C code without releasing it stops even that: use --dsa-isolate.
"""
import re

import pytest

_KEY = "dsa_verify_state"
# The audit's option names (in the C++ and dsa_verify.audit messages) as this plugin spells them.
_FLAGS = re.compile(r"(?<![\w-])--(ops|only|level|seed|device|timeout|dump-dir|unsupported|allow-weak|"
                    r"no-fixtures|isolate)\b")


def _pytest_flags(message):
    """`message` with the audit's option names (--timeout) written as this plugin's (--dsa-timeout)."""
    return _FLAGS.sub(r"--dsa-\1", message)


def pytest_addoption(parser):
    g = parser.getgroup("dsa-verify", "audit a Python DSA kernel (dsa_verify)")
    g.addoption("--dsa-backend", default=None, help="module:Class of the backend to audit")
    g.addoption("--dsa-level", type=int, default=0, choices=(0, 1, 2), help="test level 0 (CI), 1, 2 (soak)")
    g.addoption("--dsa-ops", default="", help="ops to audit (comma-separated)")
    g.addoption("--dsa-only", default="", help="properties to run (comma-separated; no fixtures)")
    g.addoption("--dsa-seed", type=int, default=0, help="seed of the property runs (0: random)")
    g.addoption("--dsa-device", default="cpu", help="device of the input tensors: cpu | cuda[:n]")
    g.addoption("--dsa-isolate", action="store_true", help="run each task in a fresh worker process")
    g.addoption("--dsa-timeout", default=None,
                help="seconds per isolated task (--dsa-isolate), else per call of the backend in this process: a "
                     "positive decimal number from 0.001 to 86400 (default 300). An in-process call still "
                     "running at it fails its test; it cannot be killed, so the later dsa-verify tests of the "
                     "session fail unrun (restart the process, or use --dsa-isolate)")
    g.addoption("--dsa-dump-dir", default="dsa-verify-failures", help="where failing cases are dumped")
    g.addoption("--dsa-no-fixtures", action="store_true", help="properties only")
    g.addoption("--dsa-allow-weak", action="store_true", help="a WEAK output does not fail (SPEC §9)")
    g.addoption("--dsa-sink-after-rounding", action="store_true",
                help="the kernel rounds out to 16 bits before applying attn_sink (the CLI's --sink-after-rounding)")
    g.addoption("--dsa-normalized-p", action="store_true",
                help="the kernel rounds softmax(P) to 16 bits before P·V, the max key's too (the CLI's --normalized-p)")
    g.addoption("--dsa-unsupported", default="",
                help="what the kernel leaves out (comma-separated feature keys such as invalid_ids, empty_rows, "
                     "duplicate_ids, or property names): declining them is not INCOMPLETE (the CLI's --unsupported)")


class _State:
    """The audit of one session: backend, options and each task's results (run once)."""

    def __init__(self, config):
        from . import _audit, _core
        from ._bridge import Bridge
        opt = config.getoption
        self.spec = opt("--dsa-backend")
        self.device = opt("--dsa-device")
        self.isolate = opt("--dsa-isolate")
        # A usage error before anything runs, as `python3 -m dsa_verify audit --timeout` (fresh-user F13).
        text = opt("--dsa-timeout")
        self.timeout = _audit.DEFAULT_TIMEOUT_S if text is None else _audit.timeout_from_text(text, "--dsa-timeout")
        _audit.path_argument("--dsa-dump-dir", opt("--dsa-dump-dir"), "a directory path")  # "" (fresh14 F1)
        def split(flag):  # a usage error for an empty item or a repeated name, as the CLIs
            return _audit.list_from_text(opt(flag), flag)
        # Checked before the backend is loaded, as `python3 -m dsa_verify audit` does: a usage
        # error imports neither the backend's module nor torch.
        unsupported, ops, only = split("--dsa-unsupported"), split("--dsa-ops"), split("--dsa-only")
        self.bridge = Bridge(_audit.load_backend(self.spec), self.device)
        self.options = _audit._options(self.spec, ops, only,
                                       opt("--dsa-level"), opt("--dsa-seed"), opt("--dsa-dump-dir"),
                                       not opt("--dsa-no-fixtures"), self.device, isolate=bool(self.isolate),
                                       timeout=self.timeout, unsupported=unsupported,
                                       allow_weak=bool(opt("--dsa-allow-weak")),
                                       sink_after_rounding=bool(opt("--dsa-sink-after-rounding")),
                                       normalized_p=bool(opt("--dsa-normalized-p")))
        self.options["provided_outputs"] = _audit.provided_outputs(self.bridge)
        self.options["allow_weak"] = bool(opt("--dsa-allow-weak"))
        self.options["sink_after_rounding"] = (bool(opt("--dsa-sink-after-rounding")) or
                                               _audit.sink_after_rounding_of(self.bridge.backend))
        self.options["normalized_p"] = (bool(opt("--dsa-normalized-p")) or
                                        _audit.normalized_p_of(self.bridge.backend))
        self.options["unsupported"] = unsupported
        if not self.isolate:
            # Every call of the backend in this process is watched (CallWatchdog): one still
            # running at the timeout fails its test (run() below).
            self.options["call_timeout"] = self.timeout
        self.hung = ""  # set when a call hung: the message of the later tests, which do not run
        _core.request_stop(False)
        self.tasks = _core.list_tasks(self.bridge, self.options)
        # A fixture directory that holds no fixture (neither holding any: a usage error above).
        self.notes = list(_core.check_fixture_dirs()) if self.options["fixtures"] and not self.options["only"] else []
        self.results = {}
        self.items_run = 0  # dsa-verify tests that ran
        self.judged = 0  # cases that passed or failed (not skipped), over the tasks run
        self.ops_named = list(ops)  # --dsa-ops; each must judge a case (fresh17 F6)
        self.judged_ops = set()  # ops with a case that passed or failed
        self.ops_run = set()  # ops of the tasks run (-k may deselect an op's tests)
        self.input_error = False  # an unreadable fixture or out of memory: the CLI exits 2

    def run(self, task):
        from . import _audit, _core
        key = task["property"]
        if key not in self.results:
            why = self.bridge.unavailable_reason()
            if why:
                self.results[key] = [_audit.CaseResult(op="*", property=key, status="skip", message=why)]
            elif self.isolate:
                self.results[key] = _audit.run_isolated(self.spec, self.device, self.options, task, self.timeout)
            elif self.hung:
                self.results[key] = [_audit.CaseResult(op=op, property=_audit._task_label(task), status="fail",
                                                       message=self.hung) for op in _task_ops(task)]
            else:
                self.results[key] = self._run_in_process(task)
            cases = self.results[key]
            self.judged += sum(c.status in ("pass", "fail") for c in cases)
            self.judged_ops.update(c.op for c in cases if c.status in ("pass", "fail"))
            self.ops_run.update(_task_ops(task))
            self.input_error |= any(c.input_error for c in cases)
        return self.results[key]


    def _run_in_process(self, task):
        """One task in this process, its calls watched with the timeout: a call still running
        at it fails this task's test with a message naming the call; it cannot be killed, so it
        keeps running in its (daemon) thread, and every later dsa-verify test of the session fails
        without running (self.hung): restart the process, or use --dsa-isolate."""
        import threading
        from . import _audit
        hung = threading.Event()
        _audit._RUNNING = {"keep_process": True, "hung_event": hung}
        try:
            cases = _audit._run_in_worker(self.bridge, self.options, task["property"], hung_event=hung)
        finally:
            run, _audit._RUNNING = _audit._RUNNING, None
        if cases is not None:
            return cases
        what, seconds = run["hung"]
        label = f"{task['op']}::{_audit._task_label(task)}"
        self.hung = (f"not run: a call of the backend hung in the test of {label} ({what.split(': ', 1)[-1]}) and "
                     "still runs in this process, which it may have left in any state; restart pytest, or use "
                     "--dsa-isolate (each task in a worker process that is killed at --dsa-timeout)")
        why = _audit._hung_message(what, seconds, self.timeout, "--dsa-timeout", "--dsa-isolate",
                                   "it keeps running in a background thread, and the later dsa-verify tests of this "
                                   "session fail without running; restart the process")
        return [_audit.CaseResult(op=op, property=_audit._task_label(task), status="fail", message=why,
                                  repro=_audit._task_repro(task, self.options), fixture=task["fixture"],
                                  seconds=seconds) for op in _task_ops(task)]


def _task_ops(task):
    """The ops of `task` that have a test (its first op when it lists none): a task that did not
    run, because its call hung or an earlier one did, fails the test of every one of them, never
    only the first one's (the others would read as skipped)."""
    return list(task.get("ops") or [task["op"]])


class DsaFailure(Exception):
    """A failed audit case; its text is the oracle's report and the reproduction."""


def owned_cases(task, op, cases):
    """The cases of `task` that its test of `op` reports: those filed under `op`, the "*" ones
    (backend unavailable) and, on the test of the task's first op, every case filed under an op
    the task has no test of (a forward property's backward failure under sparse_mla_bwd, a
    fixture's producer failure under "fixture"), so that every case is reported by a test."""
    ops = task["ops"]
    return [c for c in cases if c.op == "*" or (c.op if c.op in ops else ops[0]) == op]


class DsaItem(pytest.Item):
    def __init__(self, *, task, op, first, **kw):
        super().__init__(**kw)
        self.task, self.op, self.first = task, op, first
        self.add_marker(pytest.mark.dsa_verify)

    def runtest(self):
        from . import _supervisor
        state = self.config.stash[_STASH]
        state.items_run += 1
        _supervisor.note_task(self.nodeid)  # the supervisor names the test a process exit ended
        mine = owned_cases(self.task, self.op, state.run(self.task))
        fails = [c for c in mine if c.status == "fail"]
        if fails:
            parts = []
            for c in fails:
                parts.append(f"FAIL {c.op} {c.property}\n  {c.message}")
                if c.repro:
                    parts.append(f"  reproduce: {c.repro}")
                if c.fixture:
                    parts.append(f"  fixture:   {c.fixture}")
            raise DsaFailure("\n".join(parts))
        if not any(c.status == "pass" for c in mine):
            # Every case of this test skipped, or none was filed under this op (a fixture op that
            # was not judged): a skip, never a pass.
            skipped = [c for c in mine if c.status == "skip"]
            pytest.skip(skipped[0].message if skipped and skipped[0].message else
                        f"{self.op} not judged by this {'fixture' if self.task['fixture'] else 'property'} "
                        "for this backend")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, DsaFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"dsa-verify {self.op} {self.task['property']}"


_STASH = pytest.StashKey[_State]()


class DsaAudit(pytest.Collector):
    def collect(self):
        return []


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With --dsa-backend, the session runs in a forked child that this process waits for
    (dsa_verify._supervisor): a kernel that ends the process (exit(0) in C or CUDA code,
    os._exit) fails the session with a message naming the test that was running, instead of
    exiting 0 with the tests after it never run (fresh16 F2). The child runs pytest's own
    pytest_cmdline_main (this hook returns None there) and never returns to the caller."""
    if not config.getoption("--dsa-backend", None):
        return None
    from . import _supervisor
    if _supervisor.supervised():
        return None  # the child: pytest's own main loop runs the session

    flag = _distributing_flag(config)
    if flag:
        raise pytest.UsageError(
            f"dsa-verify: --dsa-backend does not run under pytest-xdist ({flag} given): each xdist worker would "
            "load the backend and audit in a process of its own (the tests of one fixture or property split "
            "over workers, each drawing its own cases), the session's no-verdict exit (4: an input error, or "
            "nothing judged) and notes are decided in a worker that the controller does not read, and a kernel "
            "that ends a worker's process is outside dsa-verify's supervisor; run the dsa-verify tests without "
            "-n (or with -n 0, or -p no:xdist). --dsa-isolate runs each task in a worker process of its own")

    def run():
        try:
            return int(config.hook.pytest_cmdline_main(config=config))
        except pytest.UsageError as e:  # as pytest's own main() reports it (exit 4)
            import sys
            for msg in e.args:
                sys.stderr.write(f"ERROR: {msg}\n\n")
            return int(pytest.ExitCode.USAGE_ERROR)
    return _supervisor.supervise(run, what="the pytest session", isolate_flag="--dsa-isolate",
                                 prefix="dsa-verify: error: ",
                                 on_abnormal_end=(lambda records, message: _write_junit(config, records, message))
                                 if _junit_path(config) else None)


def _distributing_flag(config):
    """The pytest-xdist option that distributes this session over worker processes, as given
    ("-n 2", "--dist load", "--tx popen"), or "" when it runs in one process (no xdist, -n 0)."""
    n = getattr(config.option, "numprocesses", None)
    if n:  # an int, or "auto" / "logical" (xdist resolves those later)
        return f"-n {n}"
    dist = getattr(config.option, "dist", "no")
    if dist and dist != "no":
        return f"--dist {dist}"
    if getattr(config.option, "tx", None):
        return "--tx " + " ".join(config.option.tx)
    if hasattr(config, "workerinput"):
        return "an xdist worker"
    return ""


def _junit_path(config):
    """--junitxml's path where pytest's junitxml plugin writes one in this process, else None."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller writes the file
        return None
    return getattr(config.option, "xmlpath", None) or None


class _JunitRelay:
    """In the supervised child of a session with --junitxml: gives the supervisor (note_record,
    one JSON object a line) the session's start time, its tests, each test's start and every
    report pytest's junitxml plugin records, so that the parent can write the JUnit XML file when
    the child ends before pytest writes it (_write_junit)."""

    def __init__(self, config):
        self.config = config

    def _send(self, **record):
        import json
        from . import _supervisor
        _supervisor.note_record(json.dumps(record))

    def pytest_sessionstart(self):
        import time
        self._send(kind="session", time=time.time())

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        self._send(kind="items", items=[[item.nodeid, list(item.location)] for item in session.items])

    def pytest_runtest_logstart(self, nodeid, location):
        import time
        self._send(kind="start", nodeid=nodeid, location=list(location), time=time.time())

    def pytest_runtest_logreport(self, report):
        self._send(kind="report", report=self.config.hook.pytest_report_to_serializable(config=self.config,
                                                                                         report=report))

    def pytest_collectreport(self, report):
        if not report.passed:  # what junitxml records of collection
            self._send(kind="report", report=self.config.hook.pytest_report_to_serializable(config=self.config,
                                                                                             report=report))


def _write_junit(config, records, message):
    """Writes --junitxml's file, as pytest's junitxml plugin would have at the end of the session,
    from the child's records (_JunitRelay) after the child ended without finishing the session
    (a kernel's os._exit, a signal): every test reported before it as reported; the test that was
    running (started, no teardown report) a failure whose message is `message` (the supervisor's);
    the tests that never started skipped ("not run: ..."). Without a running test (the end came
    while loading the backend, or after the last test) the failure is a test of its own,
    dsa-verify::session. Uses pytest's own writer (_pytest.junitxml.LogXML) with the session's
    junit_* ini options; raises OSError when the file cannot be written."""
    import json
    import sys
    import time
    from _pytest.junitxml import LogXML
    from _pytest.reports import TestReport
    xml = LogXML(config.option.xmlpath, config.option.junitprefix, config.getini("junit_suite_name"),
                 config.getini("junit_logging"), config.getini("junit_duration_report"),
                 config.getini("junit_family"), config.getini("junit_log_passing_tests"))
    xml.pytest_sessionstart()
    items, started, finished = [], {}, set()
    for line in records:
        rec = json.loads(line)
        if rec["kind"] == "session":
            xml.suite_start_time = rec["time"]
        elif rec["kind"] == "items":
            items = [(nodeid, tuple(location)) for nodeid, location in rec["items"]]
        elif rec["kind"] == "start":
            started[rec["nodeid"]] = (tuple(rec["location"]), rec["time"])
        elif rec["kind"] == "report":
            report = config.hook.pytest_report_from_serializable(config=config, data=rec["report"])
            if isinstance(report, TestReport):
                xml.pytest_runtest_logreport(report)
                if report.when == "teardown":
                    finished.add(report.nodeid)
            else:
                xml.pytest_collectreport(report)
    running = [nodeid for nodeid in started if nodeid not in finished]
    killed = running[-1] if running else "dsa-verify::session"
    location, t0 = started.get(killed, (("dsa-verify", None, "dsa-verify session"), xml.suite_start_time))

    def one(nodeid, location, outcome, longrepr, when, duration=0.0):
        xml.pytest_runtest_logreport(TestReport(nodeid, location, {}, outcome, longrepr, when, duration=duration))
        xml.pytest_runtest_logreport(TestReport(nodeid, location, {}, "passed", None, "teardown"))
    one(killed, location, "failed", f"dsa-verify: error: {message}", "call", duration=max(0.0, time.time() - t0))
    why = f"not run: the pytest session ended during {killed} (dsa-verify's supervisor)"
    for nodeid, location in items:
        if nodeid not in started:
            one(nodeid, location, "skipped", (str(location[0]), location[1], why), "setup")
    xml.pytest_sessionfinish()
    sys.stderr.write(f"dsa-verify: note: wrote {xml.logfile} from the tests' reports ({killed} failed)\n")


def pytest_configure(config):
    config.addinivalue_line("markers", "dsa_verify: a case of a dsa-verify audit")
    from . import _supervisor
    if _supervisor.supervised() and _junit_path(config):
        config.pluginmanager.register(_JunitRelay(config), "dsa-verify-junit-relay")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--dsa-backend"):
        return
    try:
        state = _State(config)
    except (ValueError, RuntimeError) as e:
        raise pytest.UsageError(f"dsa-verify: {_pytest_flags(str(e))}") from e
    config.stash[_STASH] = state
    root = DsaAudit.from_parent(session, name="dsa-verify", nodeid="dsa-verify")
    new = []
    for task in state.tasks:
        for i, op in enumerate(task["ops"]):
            label = task["property"] if task["fixture"] else "property:" + task["property"]
            new.append(DsaItem.from_parent(root, name=f"{op}::{label}", task=task, op=op, first=i == 0))
    items[:0] = new


def _no_verdict(config):
    """The CLI's exit-2 error line of this session's audit ("" when the audit gave a verdict):
    an input error, or dsa-verify tests ran and no case passed or failed."""
    state = config.stash.get(_STASH, None)
    if state is None or state.items_run == 0:
        return ""
    if state.input_error:
        return ("dsa-verify: error: audit: an input error (an unreadable fixture, or out of memory: see the "
                "failed tests' messages) leaves the audit without a verdict")
    if state.judged == 0:
        return (f"dsa-verify: error: audit: backend {state.bridge.name} ran no case: every selected property and "
                "fixture was skipped (reasons in the skip messages, -rs; check --dsa-ops, --dsa-only, -k and what "
                "the backend supports)")
    missing = [op for op in state.ops_named if op in state.ops_run and op not in state.judged_ops]
    if missing:
        from . import _audit
        return "\n".join(f"dsa-verify: error: audit: --dsa-ops names {op} but backend {state.bridge.name} judged no "
                         f"case of it: every one was skipped (reasons in the skip messages, -rs; does the backend "
                         f"provide that op?{_audit.near_miss_hint(state.bridge.backend, op)})" for op in missing)
    return ""


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(_STASH, None)
    for note in state.notes if state is not None else []:
        terminalreporter.write_line(f"dsa-verify: note: {note}", yellow=True)
    line = _no_verdict(config)
    if line:
        terminalreporter.write_line(line, red=True, bold=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    # An audit that judged nothing is never a pass, and an input error gives no verdict: where
    # `python3 -m dsa_verify audit` exits 2, the session exits 4 (pytest has no exit code 2 of
    # this meaning; 1 stays "a case failed", as the CLI's 1). An input error outranks failures,
    # as in the CLI; a session that judged nothing keeps a failure of the user's own tests.
    line = _no_verdict(session.config)
    state = session.config.stash.get(_STASH, None)
    overridden = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) if line and state.input_error else \
        (pytest.ExitCode.OK,)
    if line and exitstatus in overridden:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
