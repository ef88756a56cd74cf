#!/usr/bin/env python3
"""Compact table of bench/reference_bench.cpp's thread-count benchmarks (issue 13).

Reads the console output of dsa_reference_bench run with --benchmark_counters_tabular=true
(ci/gpu/ref_bench_cpu.sh's ref_bench.txt) and prints, per benchmark family, x_linear at each
thread count (the first run of each count; the repeated 1-thread run is the drift check), the
wall time at 1 thread and at the most threads, and util there; first the BM_Scaling* rows
(best of 3 interleaved runs per count), then the single-series BM_*Threads rows if present.
Strong-scaling rows (the
reference, the split GEMM peer): x_linear = 1-thread wall / wall / threads. Ceiling rows
(BM_Ceiling*: each thread does the 1-thread work): x_linear = 1-thread wall / wall. Then the
reference's x_linear over its ceiling's at the most threads.
Usage: ref_bench_table.py ref_bench.txt
"""
import re
import sys

SCALING = [  # interleaved best-of-3 runs (bench/reference_bench.cpp measure_scaling)
    ("BM_ScalingGemmRowsSplit", "Eigen GEMM same shapes, 64 rows split (peer)"),
    ("BM_ScalingCeilingGemm", "ceiling: N x 1-thread GEMM rows"),
    ("BM_ScalingCeilingForward", "ceiling: N x 1-thread reference forward"),
    ("BM_ScalingForward", "reference sparse MLA forward"),
    ("BM_ScalingCeilingBackward", "ceiling: N x 1-thread reference backward"),
    ("BM_ScalingBackward", "reference sparse MLA backward"),
]

ROWS = [  # (family, label)
    ("BM_EigenGemmF64SameShapesThreads", "Eigen GEMM same shapes, 64 rows split (peer)"),
    ("BM_CeilingGemmF64Threads", "ceiling: N x 1-thread GEMM rows"),
    ("BM_CeilingForwardThreads", "ceiling: N x 1-thread reference forward"),
    ("BM_ReferenceSparseMlaForwardThreads", "reference sparse MLA forward"),
    ("BM_CeilingBackwardThreads", "ceiling: N x 1-thread reference backward"),
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


def print_scaling(path):
    runs = parse_scaling(path)
    if not runs:
        return False
    counts = sorted({t for fam in runs.values() for t in fam})
    top = counts[-1]
    print(f"Best of 3 interleaved runs per thread count. x_linear (1 = linear; ceilings: same work "
          f"per thread, x = 1-thread wall / N-thread wall); best wall at 1 and {top} threads; util at {top}")
    print(f"{'work':46s} " + " ".join(f"{'x@' + str(t):>6s}" for t in counts) +
          f" {'1 thr ms':>9s} {str(top) + ' thr ms':>9s} {'util':>5s}")
    for family, label in SCALING:
        r = runs.get(family)
        if not r:
            print(f"{label:46s} (not run)")
            continue
        cells = [f"{r[t]['x']:6.2f}" if t in r and "x" in r[t] else f"{'-':>6s}" for t in counts]
        ms1 = r.get(1, {}).get("ms")
        mst = r.get(top, {}).get("ms")
        u = r.get(top, {}).get("util")
        fmt = lambda v, f: (f % v) if v is not None else "-"
        print(f"{label:46s} " + " ".join(cells) +
              f" {fmt(ms1, '%9.1f'):>9s} {fmt(mst, '%9.1f'):>9s} {fmt(u, '%5.2f'):>5s}")
    for ref, ceil, what in [("BM_ScalingForward", "BM_ScalingCeilingForward", "forward"),
                            ("BM_ScalingBackward", "BM_ScalingCeilingBackward", "backward")]:
        try:
            x = runs[ref][top]["x"]
            c = runs[ceil][top]["x"]
            print(f"reference {what} at {top} threads: x_linear {x:.2f} ({x / c:.2f} of its ceiling "
                  f"{c:.2f}); target 0.70 {'met' if x >= 0.7 else 'missed'}")
        except (KeyError, TypeError, ZeroDivisionError):
            print(f"reference {what}: incomplete run, no figure")
    print()
    return True


def main():
    print_scaling(sys.argv[1])
    runs = parse(sys.argv[1])
    if not runs:
        return
    counts = sorted({t for fam in runs.values() for t in fam})
    top = counts[-1] if counts else 1
    head = f"{'work':46s} " + " ".join(f"{'x@' + str(t):>6s}" for t in counts)
    print(f"x_linear per thread count (1 = linear); wall at 1 and {top} threads; util at {top}")
    print(head + f" {'1 thr ms':>9s} {str(top) + ' thr ms':>9s} {'util':>5s}")
    for family, label in ROWS:
        if family not in runs:
            continue
        r = runs[family]
        cells = []
        for t in counts:
            x = r.get(t, {}).get("x_linear")
            cells.append(f"{x:6.2f}" if x is not None else f"{'-':>6s}")
        w1 = r.get(1, {}).get("wall")
        wt = r.get(top, {}).get("wall")
        u = r.get(top, {}).get("util")
        fmt = lambda v, f: (f % v) if v is not None else "-"
        print(f"{label:46s} " + " ".join(cells) +
              f" {fmt(w1, '%9.1f'):>9s} {fmt(wt, '%9.1f'):>9s} {fmt(u, '%5.2f'):>5s}")
    for ref, ceil, what in [("BM_ReferenceSparseMlaForwardThreads", "BM_CeilingForwardThreads", "forward"),
                            ("BM_ReferenceSparseMlaBackwardThreads", "BM_CeilingBackwardThreads", "backward")]:
        try:
            x = runs[ref][top]["x_linear"]
            c = runs[ceil][top]["x_linear"]
            print(f"reference {what} at {top} threads: x_linear {x:.2f} = {x / c:.2f} of the host's "
                  f"ceiling ({c:.2f}); target 0.70 {'met' if x >= 0.7 else 'missed'}")
        except (KeyError, TypeError, ZeroDivisionError):
            if ref in runs:
                print(f"reference {what}: incomplete run, no ratio")


if __name__ == "__main__":
    main()
