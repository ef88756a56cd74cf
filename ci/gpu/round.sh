#!/usr/bin/env bash
# One device call for a whole round of GPU work (the H200's time is short; see shared/GPU.md):
# (1) ci/gpu/test.sh: build, CUDA tests, compute-sanitizer memcheck + racecheck, the sparse MLA
#     forward/backward benchmark (DSA_BENCH_MLA_ONLY=1 unless BENCH_ALL=1) and the float64
#     reference's thread scaling (REF_BENCH=1, filter 'Threads');
# (2) `dsa-verify audit --backend cuda` at level 0 with the sparse MLA backward kernel switched on
#     (DSA_CUDA_SMLA_BWD=kernel): every property and fixture of the ops the cuda backend runs;
# (3) ci/gpu/python_audit.sh (the Python route on CUDA, §10 ops included);
# (4) if time is left (LEVEL1_BY seconds into the call), the cuda backend at level 1 (production
#     shapes) for sparse MLA, the indexer and top-k.
# (5) REF_CPU=1: ci/gpu/ref_bench_cpu.sh (the float64 reference's 1..16-thread scaling) when
#     the call is fewer than REF_BY seconds old. PY_TIMEOUT bounds step (3) (ONLY_TORCH_OPS=1
#     reaches python_audit.sh through the environment).
# The device returns at most 8 files, so every log goes to a scratch folder that is packed into
# $OUT/round.tgz after each step (a call cut short still returns what was done); the summary
# lines are also in $OUT/summary.txt. Run from the repo root or from .gpu-deps/wt.
set -uo pipefail
cd "$(dirname "$0")/../.."
final=${OUT:-out}
mkdir -p "$final"
res=$(mktemp -d /tmp/dsa-round.XXXX)
export OUT=$res
start=$SECONDS
pack() { tar czf "$final/round.tgz" -C "$res" . 2>/dev/null; cp "$res/summary.txt" "$final/summary.txt" 2>/dev/null; }
step() { echo "$*" | tee -a "$res/summary.txt"; pack; }
if [ "${BENCH_ALL:-0}" = 1 ]; then unset DSA_BENCH_MLA_ONLY; else export DSA_BENCH_MLA_ONLY=1; fi
REF_BENCH=${REF_BENCH:-1} REF_BENCH_FILTER=${REF_BENCH_FILTER:-Threads} SKIP_PROPS=${SKIP_PROPS:-1} \
  bash ci/gpu/test.sh
step "test.sh rc=$? (at $((SECONDS - start)) s)"
bd=${BUILD_DIR:-/tmp/dsa-gpu-build}/main
cli=$bd/cli/dsa-verify
cmake --build "$bd" -j 16 --target dsa-verify >"$res/cli_build.txt" 2>&1
DSA_CUDA_SMLA_BWD=kernel timeout 150 "$cli" audit --backend cuda --seed "${SEED:-7}" \
  --json "$res/cuda_audit_l0.json" >"$res/cuda_audit_l0.txt" 2>&1
step "audit --backend cuda (DSA_CUDA_SMLA_BWD=kernel) level 0 rc=$?: $(grep -E '^audit:' "$res/cuda_audit_l0.txt" | tail -1) (at $((SECONDS - start)) s)"
grep -E "^\[[0-9]+/[0-9]+\] (fail|weak|incomplete)" "$res/cuda_audit_l0.txt" | head -20
SKIP_ISOLATE=1 timeout "${PY_TIMEOUT:-240}" bash ci/gpu/python_audit.sh >"$res/python_audit.txt" 2>&1
step "python_audit.sh rc=$? (at $((SECONDS - start)) s)"
cat "$res/py_summary.txt" 2>/dev/null
if [ $((SECONDS - start)) -lt "${LEVEL1_BY:-380}" ]; then
  DSA_CUDA_SMLA_BWD=kernel timeout 120 "$cli" audit --backend cuda --level 1 --seed "${SEED:-7}" \
    --ops sparse_mla_fwd,sparse_mla_bwd,indexer_scores,topk \
    --json "$res/cuda_audit_l1.json" >"$res/cuda_audit_l1.txt" 2>&1
  step "audit --backend cuda level 1 rc=$?: $(grep -E '^audit:' "$res/cuda_audit_l1.txt" | tail -1) (at $((SECONDS - start)) s)"
else
  step "audit --backend cuda level 1: not run (no time left in this call)"
fi
if [ "${REF_CPU:-0}" = 1 ]; then  # issue 13: the reference's thread scaling, g++ only, last
  if [ $((SECONDS - start)) -lt "${REF_BY:-420}" ]; then
    OUT=$res/ref bash ci/gpu/ref_bench_cpu.sh >"$res/ref_cpu.txt" 2>&1
    step "ref_bench_cpu.sh rc=$? (at $((SECONDS - start)) s)"
  else
    step "ref_bench_cpu.sh: not run (no time left in this call)"
  fi
fi
echo "=== round summary"; cat "$res/summary.txt"
[ -f "$res/gpu_bench.md" ] && cat "$res/gpu_bench.md"
grep -E "^BM_" "$res/ref_bench.txt" 2>/dev/null
pack
