#!/usr/bin/env python3
"""Compact table of bench/reference_bench.cpp's thread-count benchmarks (issue 13).

Reads the console output of dsa_reference_bench run with --benchmark_counters_tabular=true
(ci/gpu/ref_bench_cpu.sh's ref_bench.txt) and prints, per benchmark family, x_linear at each
thread count (the first run of each count; the repeated 1-thread run is the drift check), the
wall time at 1 thread and at the most threads, and util there; first the BM_Scaling* rows
(best of 3 interleaved runs per count), then the single-series BM_*Threads rows if present.
Strong-scaling rows (the
reference, the split GEMM peer): x_linear = 1-thread wall / wall / threads. Ceiling rows
(BM_Ceiling*: each thread does the 1-thread work, N jobs at once): x_linear = 1-thread wall / wall;
they read below the reference itself on the H200 host (bench/results/2026-11-30-gpu-run-session5.md,
call 2), so they are shown, not used as a ceiling. Then the reference's x_linear at the most threads
against the target and the same-shape GEMM peer of the same run.
Usage: ref_bench_table.py ref_bench.txt
"""
import re
import sys

SCALING = [  # interleaved best-of-3 runs (bench/reference_bench.cpp measure_scaling)
    ("BM_ScalingGemmRowsSplit", "Eigen GEMM same shapes, 64 rows split (peer)"),
    ("BM_ScalingCeilingGemm", "N concurrent 1-thread GEMM jobs"),
    ("BM_ScalingCeilingForward", "N concurrent 1-thread forwards"),
    ("BM_ScalingForward", "reference sparse MLA forward"),
    ("BM_ScalingCeilingBackward", "N concurrent 1-thread backwards"),
    ("BM_ScalingBackward", "reference sparse MLA backward"),
]

ROWS = [  # (family, label)
    ("BM_EigenGemmF64SameShapesThreads", "Eigen GEMM same shapes, 64 rows split (peer)"),
    ("BM_CeilingGemmF64Threads", "N concurrent 1-thread GEMM jobs"),
    ("BM_CeilingForwardThreads", "N concurrent 1-thread forwards"),
    ("BM_ReferenceSparseMlaForwardThreads", "reference sparse MLA forward"),
    ("BM_CeilingBackwardThreads", "N concurrent 1-thread backwards"),
    ("BM_ReferenceSparseMlaBackwardThreads", "reference sparse MLA backward"),
    ("BM_ReferenceSparseMlaFixedPartThreads", "fixed part of a call (fwd + bwd, empty rows)"),
]


def number(text):
    """'16.2k' -> 16200.0, '8.08/s' -> 8.08, '4.9m' -> 0.0049."""
    m = re.match(r"^(-?[0-9.eE+-]+)([kMGmunT]?)(/s)?$", text)
    if not m:
        return None
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    return float(m.group(1)) * scale[m.group(2)]


def parse(path):
    runs = {}  # family -> {threads: {"wall": ms, counters...}} (first run of each count)
    columns = []
    for line in open(path, errors="replace"):
        words = line.split()
        if len(words) > 3 and words[0] == "Benchmark" and words[1] == "Time":
            columns = words[4:]  # after Benchmark Time CPU Iterations
            continue
        if not words or not words[0].startswith("BM_") or len(words) < 6:
            continue
        name = words[0].split("/")
        family = name[0]
        if len(name) < 2 or not name[1].isdigit():
            continue
        threads = int(name[1])
        wall = number(words[1])
        if words[2] == "s":
            wall *= 1e3
        elif words[2] == "us":
            wall *= 1e-3
        row = {"wall": wall}
        for col, value in zip(columns, words[6:]):
            row[col] = number(value)
        runs.setdefault(family, {}).setdefault(threads, row)
    return runs


def parse_scaling(path):
    """family -> {threads: {"x": .., "ms": .., "util": ..}} from the BM_Scaling* counters."""
    out = {}
    columns = []
    for line in open(path, errors="replace"):
        words = line.split()
        if len(words) > 3 and words[0] == "Benchmark" and words[1] == "Time":
            columns = words[4:]
            continue
        if not words or not words[0].startswith("BM_Scaling") or len(words) < 6:
            continue
        family = words[0].split("/")[0]
        counters = {c: number(v) for c, v in zip(columns, words[6:])}
        per = {}
        for c, v in counters.items():
            m = re.match(r"^(x|ms|util)([0-9]+)$", c)
            if m and v is not None:
                per.setdefault(int(m.group(2)), {})[m.group(1)] = v
        out[family] = per
    return out


def print_rows(title, rows, runs, xkey, mskey):
    """One table: per family of `rows` present in `runs`, x_linear per thread count (counter
    `xkey`), the wall time (counter `mskey`, ms) at 1 thread and at the most threads, util there."""
    counts = sorted({t for fam in runs.values() for t in fam})
    top = counts[-1] if counts else 1
    fmt = lambda v, f: (f % v) if v is not None else "-"
    print(title.format(top=top))
    print(f"{'work':46s} " + " ".join(f"{'x@' + str(t):>6s}" for t in counts) +
          f" {'1 thr ms':>9s} {str(top) + ' thr ms':>9s} {'util':>5s}")
    for family, label in rows:
        r = runs.get(family)
        if not r:
            continue
        cells = [fmt(r.get(t, {}).get(xkey), "%6.2f").rjust(6) for t in counts]
        print(f"{label:46s} " + " ".join(cells) +
              f" {fmt(r.get(1, {}).get(mskey), '%9.1f'):>9s} {fmt(r.get(top, {}).get(mskey), '%9.1f'):>9s}"
              f" {fmt(r.get(top, {}).get('util'), '%5.2f'):>5s}")
    return top


def print_verdicts(runs, top, xkey, peer, pairs):
    """The target line per (family, what) of `pairs`: x_linear at `top` threads against 0.70
    (issue 13) and the `peer` family's x_linear in the same run."""
    p = runs.get(peer, {}).get(top, {}).get(xkey)
    for family, what in pairs:
        x = runs.get(family, {}).get(top, {}).get(xkey)
        if x is None:
            if family in runs:
                print(f"reference {what}: incomplete run, no figure")
            continue
        print(f"reference {what} at {top} threads: x_linear {x:.2f}"
              + (f" (same-shape GEMM peer {p:.2f})" if p is not None else "")
              + f"; target 0.70 {'met' if x >= 0.7 else 'missed'}")


def main():
    runs = parse_scaling(sys.argv[1])
    if runs:
        top = print_rows("Best of 3 interleaved runs per thread count. x_linear (1 = linear; concurrent "
                         "jobs: same work per thread, x = 1-thread wall / N-thread wall); best wall at 1 "
                         "and {top} threads; util at {top}", SCALING, runs, "x", "ms")
        print_verdicts(runs, top, "x", "BM_ScalingGemmRowsSplit",
                       [("BM_ScalingForward", "forward"), ("BM_ScalingBackward", "backward")])
        print()
    runs = parse(sys.argv[1])
    if runs:
        top = print_rows("x_linear per thread count (1 = linear); wall at 1 and {top} threads; util at {top}",
                         ROWS, runs, "x_linear", "wall")
        print_verdicts(runs, top, "x_linear", "BM_EigenGemmF64SameShapesThreads",
                       [("BM_ReferenceSparseMlaForwardThreads", "forward"),
                        ("BM_ReferenceSparseMlaBackwardThreads", "backward")])


if __name__ == "__main__":
    main()
