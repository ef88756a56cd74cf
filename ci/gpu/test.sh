#!/usr/bin/env bash
# Run on the GPU machine (one H200) with .gpu-deps carried (made here by ci/gpu/stage-deps.sh),
# from the repo root or from .gpu-deps/wt: configures with the LibTorch inside PyTorch and the
# staged deps, builds dsa_cuda_tests, dsa_prop_tests and dsa_gpu_bench for sm_90, then runs
# (1) the CUDA tests, (2) compute-sanitizer memcheck and racecheck on the small sanitizer case
# (exit codes must be 0), (3) the property suite's top-k properties on the `cuda` backend,
# (4) the benchmark. Logs and the benchmark table go to ${OUT:-out}/ (at most 8 files); the
# last lines printed are the summary. SKIP_BENCH=1 / SKIP_PROPS=1 leave steps out; REF_BENCH=1
# adds the float64 reference's thread-scaling benchmark (issue 13) on the host's CPUs.
# PROP_FILTER: the property filter (default the cuda backend's top-k and indexer properties);
# DSA_BENCH_INDEXER_ONLY=1 (read by the benchmark) times the indexer alone.
# GPU_DEPS=DIR names the carried .gpu-deps when the tree was staged elsewhere.
# BENCH_ONLY=1: build dsa_gpu_bench alone and run only the benchmark (no tests, sanitizers,
# properties or Python check: a timing call, never a gate); with DSA_BENCH_SMLA_BWD_ONLY=1 the
# benchmark times the sparse MLA backward section alone.
# Filters for short runs: CUDA_TEST_FILTER / TORCH_OPS_FILTER (gtest filters of dsa_cuda_tests /
# dsa_torch_ops_tests), SAN_FILTER (the sanitizer case's gtest filter), SKIP_PY=1 (no Python
# check); DSA_BENCH_MLA_ONLY=1 / DSA_BENCH_TOPK_ONLY=1 and DSA_MLA_ONEPASS_ONLY=1 reach the
# benchmark and the tests through the environment. AUDIT_OPS=op,op adds `dsa-verify audit
# --backend cuda --ops AUDIT_OPS` at levels 0 and 1 (seed SEED, default 7; AUDIT_TIMEOUT s each),
# once per top-k kernel in AUDIT_TOPK_KERNELS (comma-separated DSA_CUDA_TOPK values; default:
# the backend's default kernel).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
{ date -u; cat COMMIT 2>/dev/null || git log -1 --format='commit %H' 2>/dev/null;
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv; } | tee "$out/gpu.txt"
SECONDS=0
bd=${BUILD_DIR:-/tmp/dsa-gpu-build}
. ci/gpu/configure.sh
: >"$out/build.txt"
gpu_configure "$bd" "$out/build.txt" -DDSA_BUILD_BENCH=$([ "${REF_BENCH:-0}" = 1 ] && echo ON || echo OFF) \
  && cmake --build "$bd/main" -j 16 --target dsa_gpu_bench \
    $([ "${BENCH_ONLY:-0}" = 1 ] || echo dsa_cuda_tests dsa_torch_ops dsa_torch_ops_tests) \
    $([ "${SKIP_PROPS:-0}" = 1 ] || [ "${BENCH_ONLY:-0}" = 1 ] || echo dsa_prop_tests) $([ "${REF_BENCH:-0}" = 1 ] && echo dsa_reference_bench) \
    $([ -n "${AUDIT_OPS:-}" ] && echo dsa-verify) \
    >>"$out/build.txt" 2>&1
rc=$?
echo "build rc=$rc (${SECONDS}s)" | tee -a "$out/summary.txt"
[ $rc = 0 ] || { grep -v "ptxas info\|bytes stack frame" "$out/build.txt" | grep -B2 -A10 -i "error" | head -60; exit 1; }
grep -A2 "topk_cluster_kernel" "$out/build.txt" | grep -E "registers|spill" | head -3
grep -A2 -E "sparse_mla_fwd_(onepass|wgmma)_kernel" "$out/build.txt" | grep -E "registers|spill" | head -6; grep -E "C75[0-9][0-9]" "$out/build.txt" | head -3
grep -A3 "Compiling entry function.*indexer_" "$out/build.txt" | grep -E "entry|registers|spill" | sed 's/_ZN3dsa4cuda[^ ]*_\(indexer_[a-z_]*\)[^ ]*/\1/' | head -8
cuobj=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
[ -x "$cuobj" ] && [ "${BENCH_ONLY:-0}" != 1 ] && echo "SASS of dsa_cuda_tests: $("$cuobj" -sass "$bd/main/optimized/cuda/dsa_cuda_tests" 2>/dev/null | grep -c HGMMA) HGMMA, $("$cuobj" -sass "$bd/main/optimized/cuda/dsa_cuda_tests" 2>/dev/null | grep -c HMMA) HMMA instructions" | tee -a "$out/summary.txt"
bin=$bd/main/optimized/cuda
if [ "${BENCH_ONLY:-0}" != 1 ]; then
SECONDS=0
timeout 170 "$bin/dsa_cuda_tests" --gtest_filter="${CUDA_TEST_FILTER:-*}" >"$out/tests.txt" 2>&1
echo "dsa_cuda_tests rc=$? (${SECONDS}s)" | tee -a "$out/summary.txt"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|^\[       OK|^\[  FAILED" "$out/tests.txt" | tail -20
grep -B2 -A14 "Failure" "$out/tests.txt" | head -50
SECONDS=0
timeout 120 "$bin/dsa_torch_ops_tests" --gtest_filter="${TORCH_OPS_FILTER:-*}" >>"$out/tests.txt" 2>&1
echo "dsa_torch_ops_tests (C++, CUDA dispatch) rc=$? (${SECONDS}s): $(grep -E '^\[  PASSED|^\[  FAILED|SKIPPED' "$out/tests.txt" | tail -2 | tr '\n' ' ')" | tee -a "$out/summary.txt"
SECONDS=0
if [ "${SKIP_PY:-0}" != 1 ]; then
PYTHONUNBUFFERED=1 timeout 120 python3 optimized/cuda/tests/torch_ops_check.py "$bin/libdsa_torch_ops.so" >>"$out/tests.txt" 2>&1
echo "torch_ops_check.py (Python, torch.ops.load_library) rc=$? (${SECONDS}s): $(grep -E 'torch_ops_check:|MISMATCH|Error' "$out/tests.txt" | tail -3 | tr '\n' ' ')" | tee -a "$out/summary.txt"
fi
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
small=${SAN_FILTER:-'*TopkSanitizerSmall*:*EmptyRows*:*Unselectable*:*SparseMlaSanitizerSmall*:*SparseMlaBwdSanitizerSmall*:*IndexerSanitizerSmall*'}
for tool in memcheck racecheck; do
  SECONDS=0
  timeout 100 "$san" --tool $tool --error-exitcode 3 "$bin/dsa_cuda_tests" --gtest_filter="$small" \
    >"$out/sanitizer.txt.$tool" 2>&1
  echo "compute-sanitizer $tool rc=$? (${SECONDS}s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer.txt.$tool" | tail -1)" | tee -a "$out/summary.txt"
done
cat "$out/sanitizer.txt.memcheck" > "$out/sanitizer.txt"; cat "$out/sanitizer.txt.racecheck" >> "$out/sanitizer.txt"
rm -f "$out"/sanitizer.txt.*
if [ "${SKIP_PROPS:-0}" != 1 ]; then
  SECONDS=0
  timeout 120 "$bd/main/property_tests/dsa_prop_tests" --gtest_filter="${PROP_FILTER:-Prop_cuda.topk*:Prop_cuda.indexer*}" >"$out/props.txt" 2>&1
  echo "dsa_prop_tests ${PROP_FILTER:-Prop_cuda.topk*:Prop_cuda.indexer*} rc=$? (${SECONDS}s): $(grep -E '^\[  PASSED|^\[  FAILED' "$out/props.txt" | tr '\n' ' ')" | tee -a "$out/summary.txt"
  grep -E "^\[  FAILED|repro" "$out/props.txt" | head -10
fi
fi  # BENCH_ONLY
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  SECONDS=0
  OUT=$out timeout 150 "$bin/dsa_gpu_bench" >"$out/bench.txt" 2>&1
  echo "dsa_gpu_bench rc=$? (${SECONDS}s)" | tee -a "$out/summary.txt"
fi
if [ -n "${AUDIT_OPS:-}" ]; then  # dsa-verify audit --backend cuda on these ops, levels 0 and 1
  for kern in $(echo "${AUDIT_TOPK_KERNELS:-default}" | tr , ' '); do  # DSA_CUDA_TOPK values
  for lvl in 0 1; do
    SECONDS=0
    echo "=== level $lvl, top-k kernel $kern" >>"$out/audit.txt"
    env $([ "$kern" = default ] || echo "DSA_CUDA_TOPK=$kern") \
    timeout "${AUDIT_TIMEOUT:-150}" "$bd/main/cli/dsa-verify" audit --backend cuda --level $lvl \
      --seed "${SEED:-7}" --ops "$AUDIT_OPS" >>"$out/audit.txt" 2>&1
    echo "audit --backend cuda --ops $AUDIT_OPS level $lvl (DSA_CUDA_SMLA_BWD=${DSA_CUDA_SMLA_BWD:-unset}, DSA_CUDA_TOPK=$kern) rc=$? (${SECONDS}s): $(grep -E '^audit:' "$out/audit.txt" | tail -1)" | tee -a "$out/summary.txt"
  done
  done
  grep -E "^\[[0-9]+/[0-9]+\] (fail|weak|incomplete)|FAIL" "$out/audit.txt" | head -20
fi
if [ "${REF_BENCH:-0}" = 1 ]; then  # CPU: reference sparse MLA at the glm5 shape, 1..16 threads
  SECONDS=0
  { lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"; nproc; } >"$out/ref_bench.txt"
  timeout 300 "$bd/main/bench/dsa_reference_bench" --benchmark_counters_tabular=true \
    --benchmark_filter="${REF_BENCH_FILTER:-Threads|SameShapes|ReferenceSparseMlaForward/iter}" >>"$out/ref_bench.txt" 2>&1
  echo "dsa_reference_bench rc=$? (${SECONDS}s)" | tee -a "$out/summary.txt"
  grep -E "^BM_|Model name|^CPU" "$out/ref_bench.txt"
fi
if [ "${PROFILE:-0}" = 1 ]; then  # one launch of the cluster top-k kernel under Nsight Compute
  SECONDS=0
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  env -u OUT DSA_BENCH_TOPK_ONLY=1 timeout 120 "$ncu" --clock-control none -k regex:topk_cluster \
    --launch-skip ${PROFILE_SKIP:-3} --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section InstructionStats --section SourceCounters --page raw \
    "$bin/dsa_gpu_bench" >"$out/ncu.txt" 2>&1
  echo "ncu rc=$? (${SECONDS}s)" | tee -a "$out/summary.txt"
  grep -E "gpu__time_duration.sum|smsp__inst_executed.sum |smsp__inst_issued.sum |issue_stalled.*per_issue_active|bank_conflicts|op_shared" "$out/ncu.txt" | head -60
fi
echo "=== summary"; cat "$out/summary.txt"
[ -f "$out/gpu_bench.md" ] && cat "$out/gpu_bench.md" || tail -20 "$out/bench.txt" 2>/dev/null
# Exit status: 1 when any step above reported a non-zero rc (a test, a sanitizer, the Python
# check, a benchmark), so a caller (ci/gpu/round.sh) sees a failing round.
! grep -qE " rc=[1-9]" "$out/summary.txt"
