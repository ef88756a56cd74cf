#!/usr/bin/env bash
# Prints the default parallel job count of `make build` / `make test` (the Makefile's JOBS):
# the CPUs this process may use (nproc), at most one job per DSA_JOB_MEM_MB of available
# memory (MemAvailable of /proc/meminfo), at least 1.
# DSA_JOB_MEM_MB (default 1536): memory one job may need. The heaviest translation unit,
# optimized/src/autograd.cpp (LibTorch), peaks at 1.19 GB resident (GCC -O3, measured with
# /usr/bin/time -f %M, 2026-12-01); tests and other units need less.
# Where /proc/meminfo is unreadable the CPU count alone decides.
set -euo pipefail
cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
per_job_mb=${DSA_JOB_MEM_MB:-1536}
if ! [[ "$per_job_mb" =~ ^[1-9][0-9]*$ ]]; then
  echo "ci/jobs.sh: DSA_JOB_MEM_MB got '$per_job_mb', expected a positive whole number of MB" >&2
  exit 2
fi
jobs=$cpus
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || true)
if [[ "$avail_kb" =~ ^[0-9]+$ ]]; then
  by_mem=$((avail_kb / 1024 / per_job_mb))
  ((by_mem < jobs)) && jobs=$by_mem
fi
((jobs < 1)) && jobs=1
echo "$jobs"
