"""python3 -m dsa_verify: the dsa-verify command line for Python backends.

    python3 -m dsa_verify audit mypkg.kernels:MyKernel [--ops topk,sparse_mla_fwd] [--only P]
        [--level 0|1|2] [--seed N] [--device cpu|cuda] [--json F] [--junit F] [--isolate]
        [--timeout S] [--dump-dir D] [--fail-fast] [--no-fixtures] [--allow-weak]
    python3 -m dsa_verify replay FIXTURE mypkg.kernels:MyKernel [--device cuda] [--allow-weak]

Exit code: 0 everything passed, 1 a failure, 2 usage or input errors (as dsa-verify). The
command runs in a forked child that this process waits for (dsa_verify._supervisor): a backend
that ends the process before the command finished (exit(0) in C or CUDA code, os._exit) makes it
exit 1 naming the running task (a signal: 128 + signal; another status: that status).
"""
import argparse
import os
import signal
import sys

SINK_AFTER_ROUNDING_HELP = ("The kernel rounds sparse MLA's out to 16 bits before applying attn_sink "
                            "(out = bf16(bf16(o) * r)): out's bound on sink rows adds that first rounding (SPEC §4, §9)")
NORMALIZED_P_HELP = ("The kernel rounds softmax(P) to 16 bits before P·V, the max key's probability too "
                     "(FlashMLA's exp(P - max) = 1 is exact): out's bound adds that rounding (SPEC §4, §9)")


def _path_type(what):
    """An argparse `type` for a path option: "" is a usage error (exit 2) naming the option and
    `what` ("a file path", "a directory path"), as the C++ CLI's output_path: a CI line
    `--json $REPORT` with REPORT unset must not run and silently write no report (fresh14 F1)."""
    def check(text):
        if text == "":
            raise argparse.ArgumentTypeError(f"got \"\" (empty), expected {what}")
        return text
    return check


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m dsa_verify",
                                description="Audit a Python DSA kernel with the dsa-verify oracle")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("audit", help="Audit a backend: properties, golden and peer fixtures")
    a.add_argument("backend", help="module:Class (instantiated without arguments), module:object or module")
    a.add_argument("--ops", default="", help="Ops to audit (comma-separated)")
    a.add_argument("--only", default="", help="Run only these properties (comma-separated names)")
    a.add_argument("--level", type=int, default=0, choices=(0, 1, 2), help="Test level 0 (CI), 1, 2 (soak)")
    a.add_argument("--seed", type=int, default=0, help="Seed of the property runs (0: random)")
    a.add_argument("--device", default="cpu", help="Device of the input tensors: cpu | cuda[:n]")
    a.add_argument("--json", type=_path_type("a file path"), help="Write the full report as JSON")
    a.add_argument("--junit", type=_path_type("a file path"), help="Write JUnit XML")
    a.add_argument("--isolate", action="store_true", help="Run each task in a fresh worker process")
    a.add_argument("--timeout", default=None,
                   help="Seconds per isolated task (--isolate), else per call of the backend in this process "
                        "(a hung call ends the audit: reports written, exit 1): a positive decimal number from "
                        "0.001 to 86400 (default 300)")
    a.add_argument("--dump-dir", default="dsa-verify-failures", type=_path_type("a directory path"),
                   help="Where failing cases are dumped")
    a.add_argument("--fail-fast", action="store_true", help="Stop at the first failure")
    a.add_argument("--no-fixtures", action="store_true", help="Properties only")
    a.add_argument("--allow-weak", action="store_true", help="A WEAK output does not fail (SPEC §9)")
    a.add_argument("--sink-after-rounding", action="store_true", help=SINK_AFTER_ROUNDING_HELP)
    a.add_argument("--normalized-p", action="store_true", help=NORMALIZED_P_HELP)
    a.add_argument("--unsupported", default="",
                   help="What the kernel leaves out (comma-separated feature keys such as invalid_ids, "
                        "empty_rows, duplicate_ids, or property names): declining them is not INCOMPLETE")
    r = sub.add_parser("replay", help="Re-run one fixture (e.g. a dumped failing case)")
    r.add_argument("fixture")
    r.add_argument("backend")
    r.add_argument("--device", default="cpu")
    r.add_argument("--allow-weak", action="store_true", help="A WEAK output does not fail (SPEC §9)")
    r.add_argument("--sink-after-rounding", action="store_true", help=SINK_AFTER_ROUNDING_HELP)
    r.add_argument("--normalized-p", action="store_true", help=NORMALIZED_P_HELP)
    args = p.parse_args(argv)
    # The command runs in a forked child that the parent waits for (dsa_verify._supervisor): a
    # kernel that ends the process (exit(0) in C or CUDA code, os._exit) fails the command with a
    # message naming the task, instead of exiting 0 with nothing judged after it (fresh16 F2).
    from dsa_verify import _supervisor
    if args.command == "replay":
        return _supervisor.supervise(lambda: _run(args), what="the replay", isolate_flag=None)
    reports = " and ".join(f"{flag} {path}" for flag, path in (("--json", args.json), ("--junit", args.junit)) if path)
    note = (f"The reports ({reports}) hold the cases judged before it (\"finished\": false)." if reports else "")
    return _supervisor.supervise(lambda: _run(args), what="the audit", note=note)


def _run(args):
    """The audit or replay command of `args` in this process; returns its exit code."""
    import dsa_verify
    from dsa_verify import _supervisor
    from dsa_verify import _audit, _core
    _audit._PRINT_SUMMARY_ON_HANG = True  # a hung call ends the process: its summary is printed then
    _audit._COMMAND_LINE = True  # SIGTERM as SIGINT: AuditInterrupted, handled below
    try:
        if args.command == "replay":
            from dsa_verify._audit import normalized_p_of, provided_outputs, sink_after_rounding_of
            bridge = dsa_verify.Bridge(dsa_verify.load_backend(args.backend), args.device)
            _supervisor.note_task(f"the replay of {args.fixture}")
            res = _core.replay_fixture(bridge, args.fixture, provided_outputs(bridge), args.allow_weak,
                                     args.sink_after_rounding or sink_after_rounding_of(bridge.backend),
                                     args.normalized_p or normalized_p_of(bridge.backend))
            sys.stdout.write(res["report"])
            print(f"replay: {res['verdict_line']}")
            if res["verdict"] == "skip":
                print(f"replay: judged nothing: every op of '{args.fixture}' was skipped (see the reasons above)")
            return res["exit"]
        timeout = (_audit.DEFAULT_TIMEOUT_S if args.timeout is None else
                   _audit.timeout_from_text(args.timeout, "--timeout"))
        report = dsa_verify.audit(args.backend, ops=_audit.list_from_text(args.ops, "--ops"),
                                  only=_audit.list_from_text(args.only, "--only"), level=args.level,
                                  seed=args.seed, device=args.device, json=args.json,
                                  junit=args.junit, isolate=args.isolate, timeout=timeout,
                                  dump_dir=args.dump_dir, fail_fast=args.fail_fast,
                                  fixtures=not args.no_fixtures, allow_weak=args.allow_weak,
                                  sink_after_rounding=args.sink_after_rounding, normalized_p=args.normalized_p,
                                  unsupported=_audit.list_from_text(args.unsupported, "--unsupported"))
    except _audit.AuditInterrupted as e:
        # The reports of every case computed are written; the running task may still wind down
        # in its worker thread: the process ends now, without waiting for it (exit 128 + signal,
        # as `dsa-verify audit`).
        sys.stderr.write("\n")
        sys.stdout.write(e.report.summary())
        print(f"audit interrupted by {e.signame}: partial report; {e.report.tasks_not_run} task(s) not run")
        sys.stdout.flush()
        sys.stderr.flush()
        code = 128 + (signal.SIGTERM if e.signame == "SIGTERM" else signal.SIGINT)
        _supervisor.note_end(code)
        os._exit(code)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"dsa_verify: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report.summary())
    if report.ran_nothing and report.passed and not report.input_error:
        print(f"dsa_verify: error: audit: backend {report.backend} ran no case: every selected property and "
              "fixture was skipped (reasons in the table; check --ops, --only and what the backend supports"
              f"{''.join(report.op_hints.values())})", file=sys.stderr)
    elif report.passed and not report.input_error:
        for op in report.ops_that_ran_no_case:
            print(f"dsa_verify: error: audit: --ops names {op} but backend {report.backend} judged no case of it: "
                  f"every one was skipped (reasons in the table; does the backend provide that op?"
                  f"{report.op_hints.get(op, '')})", file=sys.stderr)
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
