"""A supervisor for the commands that call a backend in their own process (fresh16 F2).

A kernel that ends the process (C or CUDA library code calling exit(0), Python's os._exit(0))
would make `python3 -m dsa_verify audit` or a pytest session exit 0 with nothing judged after
it: a CI job that reads the exit code would read a pass. supervise(run) therefore forks: the
child runs the command and tells the parent, through an unlinked temporary file, which task it
is running (note_task) and, when the command decided its exit code, that code (note_end). The
parent waits and exits with that code; a child that ended any other way (its status 0 included)
makes the parent print what ended it and during which task, and exit non-zero: 1 for an exit
status of 0, the status itself otherwise, 128 + the signal for a child killed by one. The same
idea as `dsa-verify audit`'s plugin calls, each in a forked child whose exit without a result
is a failure (plugin/include/dsa/plugin/isolation.h).

The fork happens before the command imports torch or loads the backend (no CUDA context, no
thread yet). The child stays in the parent's process group (Ctrl-C reaches both). A SIGINT or
SIGTERM the parent receives is passed on to the child unless the child received it too (its
Python signal wakeup fd, a pipe to the parent, says so within a grace of 0.2 s): a signal sent
to the parent's pid alone stops the audit as before (the child writes its partial report and
exits 128 + signal), a Ctrl-C is not delivered twice. Without os.fork (not POSIX) the command
runs unsupervised.
"""
import atexit
import os
import signal
import sys
import tempfile
import time
import traceback

_FD = None  # the child's end of the supervisor's file; None when not supervised


def supervised():
    """True in the child of supervise(): the command runs under a supervisor."""
    return _FD is not None


def _tell(line):
    if _FD is not None:
        try:
            os.write(_FD, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def note_task(what, not_run=0):
    """Tells the supervisor that the task `what` (e.g. "topk property:topk.contract_exact") starts
    and that `not_run` tasks come after it. No-op when not supervised."""
    _tell(f"task {int(not_run)} {what}")


def note_record(text):
    """Gives the supervisor one line of `text` (newlines become spaces) that it hands, with the
    others, to supervise()'s on_abnormal_end when the child ends without noting an end (e.g. the
    pytest plugin's test reports, from which it writes the JUnit XML file the child could not).
    No-op when not supervised."""
    _tell(f"rec {text}")


def note_end(code):
    """Tells the supervisor that the command decided its exit code `code` (int): the parent exits
    with it, whatever ends the child afterwards. No-op when not supervised."""
    _tell(f"end {int(code)}")


def _exit_code(code):
    """The exit status of sys.exit(code): None is 0, an int is itself, anything else is printed
    and is 1 (as the interpreter does)."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _die_with_parent():
    """Asks Linux for SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG): a killed
    supervisor leaves no audit running. Best effort: nothing elsewhere."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(run, what="the audit", isolate_flag="--isolate", prefix="dsa_verify: error: ", note="",
              on_abnormal_end=None):
    """Runs `run()` (a function returning the command's exit code, an int) in a forked child and
    returns the exit code of the command for the parent: the code the child noted (note_end;
    supervise notes run()'s return value itself), or, when the child ended without noting one,
    1 for an exit status of 0, the status for another, 128 + signal for a signal, after printing
    to stderr what ended it and during which task (note_task). `what` names the command in that
    message ("the audit", "the pytest session", "the replay"), `isolate_flag` the option that runs
    each task in a worker process (None: none), `prefix` starts the message, `note` (e.g. where
    the partial reports are) ends it. `on_abnormal_end(records, message)`, when given, is called in
    the parent after that message when the child ended without noting an end: `records` the
    child's note_record lines in order (str), `message` the message's text without the prefix; an
    exception it raises is printed as a warning and changes nothing else. The child never returns: it ends with os._exit after running
    the atexit functions (when run() returned) and flushing stdout and stderr. Without os.fork, or
    outside the main thread (signal handlers), returns run() unsupervised. Raises OSError when the
    temporary file or the pipe cannot be made or fork fails."""
    global _FD
    import threading
    if not hasattr(os, "fork") or _FD is not None or threading.current_thread() is not threading.main_thread():
        return run()  # signal handlers can only be set in the main thread
    log = tempfile.TemporaryFile(prefix="dsa-verify-supervisor-")
    seen_r, seen_w = os.pipe()  # the child's signal wakeup fd: which signals it received
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: runs the command, never returns
        code = 1
        try:
            _FD = log.fileno()
            os.close(seen_r)
            os.set_blocking(seen_w, False)
            signal.set_wakeup_fd(seen_w, warn_on_full_buffer=False)
            _die_with_parent()
            code = run()
            code = 0 if code is None else int(code)
            note_end(code)
            atexit._run_exitfuncs()  # as a normal exit would (e.g. a coverage plugin saving its data)
        except SystemExit as e:  # raised outside a kernel call (e.g. by the backend's module): not noted
            code = _exit_code(e.code)
        except BaseException as e:  # noqa: BLE001 - an uncaught exception: its traceback says what ended it
            traceback.print_exc()
            code = 128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1  # Ctrl-C: as Python's 130
            note_end(code)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    os.close(seen_w)
    os.set_blocking(seen_r, False)
    received = []  # signal numbers the child received (its wakeup fd's bytes), not yet matched
    forwarded = []  # signal numbers passed on to the child whose wakeup byte has not been read

    def forward(signum, frame):
        time.sleep(0.2)  # a Ctrl-C reaches the child too: its wakeup byte is written at delivery
        try:
            for b in os.read(seen_r, 4096):
                if b in forwarded:
                    forwarded.remove(b)  # the child got what this process passed on
                else:
                    received.append(b)
        except OSError:  # BlockingIOError: nothing new
            pass
        if signum in received:
            received.remove(signum)
            return
        try:
            os.kill(pid, signum)
            forwarded.append(signum)
        except OSError:
            pass
    # A signal this process ignores (a runner started in the background ignores SIGINT) the child,
    # which inherited that, ignores too: it stays ignored here.
    previous_int, previous_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for signum, previous in ((signal.SIGINT, previous_int), (signal.SIGTERM, previous_term)):
        if previous is not signal.SIG_IGN:
            signal.signal(signum, forward)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGINT, previous_int if previous_int is not None else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, previous_term if previous_term is not None else signal.SIG_DFL)
        os.close(seen_r)
    log.seek(0)
    lines = log.read().decode("utf-8", "replace").splitlines()
    log.close()
    ends = [ln for ln in lines if ln.startswith("end ")]
    if ends:
        return int(ends[-1].split()[1])
    tasks = [ln.split(" ", 2) for ln in lines if ln.startswith("task ")]
    if tasks:
        not_run, task = int(tasks[-1][1]), tasks[-1][2]
        where = f"during {task}"
        after = (f"nothing after it was judged ({not_run} task(s) not run)" if not_run else
                 "nothing after it was judged")
    else:
        where, after = "before the first task (loading the backend)", "nothing was judged"
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (
        os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        cause, result = f"the process was killed by {name} {where}", 128 - code
        advice = "a fault in the kernel (e.g. an illegal memory access) or a kill from outside"
        isolated = "a crash"
    else:
        cause, result = f"the backend ended the process (exit status {code}) {where}", code if code else 1
        advice = "a kernel must not end the process (C/CUDA code calling exit(), os._exit)"
        isolated = "this"
    if isolate_flag:
        advice += (f"; {isolate_flag} runs each task in a worker process, where {isolated} is a failed case and "
                   "the audit goes on")
    message = (f"{cause}; {after}: {what} did not finish, which is never a pass (exit {result}). "
               f"{advice[0].upper()}{advice[1:]}.{(' ' + note) if note else ''}")
    sys.stdout.flush()
    sys.stderr.write(f"\n{prefix}{message}\n")
    sys.stderr.flush()
    if on_abnormal_end is not None:
        records = [ln[4:] for ln in lines if ln.startswith("rec ")]
        try:
            on_abnormal_end(records, message)
        except Exception as e:  # noqa: BLE001 - the exit code above stands; say what was not written
            sys.stderr.write(f"{prefix.replace('error', 'warning')}{type(e).__name__}: {e}\n")
            sys.stderr.flush()
    return result
