#!/usr/bin/env bash
# The Python route on the GPU machine (issue 10). Run after ci/gpu/test.sh has configured and
# built ${BUILD_DIR:-/tmp/dsa-gpu-build}/main (cuda, LibTorch from the pip PyTorch; pybind11
# then comes from the torch package). Builds the dsa_verify modules there, then audits on CUDA:
# (1) the PyTorch example backend (must pass), (2) the Triton example (when triton is
# installed), (3) the project's torch.ops.dsa library called from Python, compared with
# `dsa-verify audit --backend libtorch-cuda` on the same seed (statuses must be equal). The SPEC
# §10 inference ops (fp8_indexer_scores, paged_indexer_scores, sparse_mla_fp8_fwd) are part of
# (1) and (3): each of the three JSON reports must have a passing case of each, and a planted
# §10 fault (faulty_backend:TileScaleSwapped) must fail on CUDA.
# Logs and JSON reports go to ${OUT:-out}/. Run on the H200 on 2026-11-30 (see
# bench/results/2026-11-30-gpu-python-route.md).
# Standalone (no ci/gpu/test.sh before it): configures ${BUILD_DIR}/main itself the same way,
# with the carried deps (GPU_DEPS, as test.sh). ONLY_TORCH_OPS=1 runs step (3) alone (with the
# SPEC §10 check on its two reports) and builds only what it needs; when the Python audit dies
# on a signal, a gdb backtrace of the §10 ops' audit goes to ${OUT}/py_torch_ops_gdb.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
bd=${BUILD_DIR:-/tmp/dsa-gpu-build}/main
seed=${SEED:-7}
only=${ONLY_TORCH_OPS:-0}
# The interpreter that imports torch (a venv on the H200 machine; ci/gpu/configure.sh says why).
py=$(python3 -c 'import sys; print(sys.executable)')
SECONDS=0
if [ ! -f "$bd/CMakeCache.txt" ]; then
  . ci/gpu/configure.sh
  : >"$out/py_configure.txt"
  gpu_configure "${BUILD_DIR:-/tmp/dsa-gpu-build}" "$out/py_configure.txt" -DDSA_BUILD_BENCH=OFF \
    || { tail -30 "$out/py_configure.txt"; exit 1; }
else
  cmake -S . -B "$bd" -DPython3_EXECUTABLE="$py" >"$out/py_configure.txt" 2>&1 || exit 1
fi
targets="dsa_verify_core dsa-verify dsa_torch_ops"
[ "$only" = 1 ] || targets="$targets dsa_verify_backends"
cmake --build "$bd" -j 16 --target $targets \
  >"$out/py_build.txt" 2>&1 || { grep -B2 -A10 -i error "$out/py_build.txt" | head -40; exit 1; }
echo "configure + build ($targets): ${SECONDS}s" | tee -a "$out/py_summary.txt"
# libdsa_torch_ops.so must use PyTorch's shared C++ runtime, not a static copy of its own
# (dsa_shared_cxx_runtime; the cause of the 2026-11-30 SIGSEGV): 0 stream symbols defined.
so=$bd/optimized/cuda/libdsa_torch_ops.so
echo "libdsa_torch_ops.so: $(nm -D --defined-only "$so" | grep -c '_ZNSo9_M_insertIdEERSoT_\|_ZTVNSt7__cxx1119basic_ostringstream') libstdc++ stream symbols defined (must be 0); needs $(readelf -d "$so" | grep -o 'libstdc++[^]]*\|libgcc_s[^]]*' | tr '\n' ' ')" | tee -a "$out/py_summary.txt"
export PYTHONPATH=$bd/python:$PWD/docs/examples
status=0
run() {  # name, then the command
  local name=$1; shift
  SECONDS=0
  "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc (${SECONDS}s): $(grep -E '^audit:' "$out/$name.txt" | tail -1)" | tee -a "$out/py_summary.txt"
  return $rc
}
if [ "$only" != 1 ]; then
run py_torch_example_cuda $py -m dsa_verify audit torch_backend:TorchBackend --device cuda --seed "$seed" \
  --json "$out/py_torch_example_cuda.json" || status=1
[ "${SKIP_ISOLATE:-0}" = 1 ] || run py_torch_example_cuda_isolated $py -m dsa_verify audit torch_backend:TorchBackend --device cuda --seed "$seed" \
  --ops topk,sparse_mla_fwd --isolate --timeout 300 || status=1
if $py -c "import triton" 2>/dev/null; then
  run py_triton_indexer_cuda $py -m dsa_verify audit triton_backend:TritonIndexer --device cuda \
    --ops indexer_scores,topk --seed "$seed" --json "$out/py_triton_indexer_cuda.json" || status=1
else
  echo "py_triton_indexer_cuda: skipped (triton not installed)" | tee -a "$out/py_summary.txt"
fi
fi
export DSA_TORCH_OPS_LIB=$bd/optimized/cuda/libdsa_torch_ops.so
run py_torch_ops_cuda timeout 150 $py -X faulthandler -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOpsCuda \
  --device cuda --seed "$seed" --json "$out/py_torch_ops_cuda.json"
rc=$?
if [ $rc -ge 128 ]; then  # died on a signal: where (the SPEC §10 ops, where it died on 2026-11-30)
  tail -40 "$out/py_torch_ops_cuda.txt"
  command -v gdb >/dev/null && timeout 60 gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args \
    $py -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOpsCuda --device cuda --seed "$seed" \
    --ops fp8_indexer_scores >"$out/py_torch_ops_gdb.txt" 2>&1
  grep -E "^#[0-9]" "$out/py_torch_ops_gdb.txt" 2>/dev/null | head -30
fi
unset DSA_TORCH_OPS_LIB
run cli_libtorch_cuda timeout 120 "$bd/cli/dsa-verify" audit --backend libtorch-cuda --seed "$seed" \
  --json "$out/cli_libtorch_cuda.json"
$py - "$out/cli_libtorch_cuda.json" "$out/py_torch_ops_cuda.json" <<'PY' | tee -a "$out/py_summary.txt" || status=1
import json, sys
cli, py = (json.load(open(p)) for p in sys.argv[1:3])
a = {(c["op"], c["property"]): c["status"] for c in cli["cases"]}
b = {(c["op"], c["property"]): c["status"] for c in py["cases"]}
diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
print(f"libtorch-cuda CLI vs torch.ops.dsa from Python: {len(a)} vs {len(b)} cases, {len(diff)} differ")
for k, v in sorted(diff.items()):
    print("  differ:", k, v)
sys.exit(1 if diff else 0)
PY
# SPEC §10 on CUDA: judged (not skipped) on every route; a planted fault fails (exit 1).
reports="$out/py_torch_ops_cuda.json $out/cli_libtorch_cuda.json"
[ "$only" = 1 ] || reports="$out/py_torch_example_cuda.json $reports"
$py - $reports <<'PY' | tee -a "$out/py_summary.txt" || status=1
import json, sys
ops = ("fp8_indexer_scores", "paged_indexer_scores", "sparse_mla_fp8_fwd")
bad = 0
for path in sys.argv[1:]:
    cases = json.load(open(path))["cases"]
    missing = [op for op in ops if not any(c["op"] == op and c["status"] == "pass" for c in cases)]
    bad += bool(missing)
    print(f"{path}: SPEC §10 ops with a passing case: {len(ops) - len(missing)}/3" + (f", none for {missing}" if missing else ""))
sys.exit(1 if bad else 0)
PY
if [ "$only" != 1 ]; then
run py_faulty_tile_scale_cuda $py -m dsa_verify audit faulty_backend:TileScaleSwapped --device cuda \
  --ops sparse_mla_fp8_fwd --seed "$seed"
[ $? -eq 1 ] || { echo "py_faulty_tile_scale_cuda: expected exit 1 (the planted §10 fault fails)" | tee -a "$out/py_summary.txt"; status=1; }
fi
echo "=== python_audit summary"; cat "$out/py_summary.txt"
exit $status
