#!/usr/bin/env bash
# Where did the Python audit of torch.ops.dsa on CUDA die (SIGSEGV at the first input the op
# must reject, fp8.invalid_scale_rejected; bench/results/2026-11-30-gpu-python-route.md)? Run on
# the GPU machine (no gdb there) from the repo root or .gpu-deps/wt, standalone: builds
# dsa_verify_core and dsa_torch_ops (ci/gpu/python_audit.sh's configure), preloads
# ci/gpu/segv_report.c (faulting pc and a stack scan, symbolized with addr2line here), then runs
# one process per probe, each a rejected FP8 scale:
#   plain   torch.ops.dsa.fp8_indexer_scores on CUDA, nothing of dsa_verify imported
#   import  the same after `import dsa_verify` (its modules loaded, no audit)
#   aten    the audit of a backend whose op raises a c10::Error from ATen (no dsa library)
#   cpu     the audit of torch.ops.dsa with --device cpu
#   audit   the audit of torch.ops.dsa on CUDA (--ops fp8_indexer_scores)
# Output: ${OUT}/probe_*.txt and a table. Run on the H200 on 2026-11-30 (all but `aten` died in
# libdsa_torch_ops.so's own static copy of libstdc++; fixed by dsa_shared_cxx_runtime in the
# top-level CMakeLists.txt). After the fix every probe must print "rejected" / pass.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
bd=${BUILD_DIR:-/tmp/dsa-gpu-build}/main
py=$(python3 -c 'import sys; print(sys.executable)')
SECONDS=0
if [ ! -f "$bd/CMakeCache.txt" ]; then
  deps=${GPU_DEPS:-$PWD/.gpu-deps}
  [ -d "$deps/googletest" ] || deps=$(cd .. && pwd)
  gt=${BUILD_DIR:-/tmp/dsa-gpu-build}
  torch_dir=$($py -c "import torch;print(torch.utils.cmake_prefix_path)")/Torch
  { cmake -S "$deps/googletest" -B "$gt/gtest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$gt/gtest-prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    && cmake --build "$gt/gtest" -j 16 --target install \
    && cmake -S . -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSA_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DDSA_BUILD_BENCH=OFF -DTorch_DIR="$torch_dir" \
      -DCMAKE_PREFIX_PATH="$deps/prefix;$gt/gtest-prefix" -DDSA_GTEST_SOURCE_DIR= \
      -DPython3_EXECUTABLE="$py"; } >"$out/probe_configure.txt" 2>&1 || { tail -30 "$out/probe_configure.txt"; exit 1; }
fi
cmake --build "$bd" -j 16 --target dsa_verify_core dsa_torch_ops >"$out/probe_build.txt" 2>&1 \
  || { grep -B2 -A10 -i error "$out/probe_build.txt" | head -40; exit 1; }
gcc -shared -fPIC -O1 -o /tmp/segv_report.so ci/gpu/segv_report.c -ldl || exit 1
echo "build: ${SECONDS}s; $(${CXX:-c++} --version | head -1); $($py -c 'import torch; print("torch", torch.__version__)')" | tee "$out/probe_summary.txt"
lib=$bd/optimized/cuda/libdsa_torch_ops.so
export PYTHONPATH=$bd/python:$PWD/docs/examples:/tmp/probe
mkdir -p /tmp/probe
cat >/tmp/probe/probe_reject.py <<'PY'
import sys, torch
if sys.argv[1] == "import":
    import dsa_verify  # noqa: F401
torch.ops.load_library(sys.argv[2])
dev = "cuda"
q = torch.zeros(2, 1, 4, dtype=torch.uint8, device=dev); k = torch.zeros(3, 4, dtype=torch.uint8, device=dev)
s = torch.tensor([1.0, -1.0, 1.0], device=dev); w = torch.ones(2, 1, device=dev)
for _ in range(3):
    try:
        torch.ops.dsa.fp8_indexer_scores(q, k, s, w, None, None, "e4m3fn")
        print("probe: accepted (wrong)")
    except RuntimeError as e:
        print("probe: rejected:", str(e).splitlines()[0][:90])
PY
cat >/tmp/probe/probe_backends.py <<'PY'
import torch
class AtenRaiser:
    """fp8_indexer_scores raises a c10::Error from ATen (mm of mismatched shapes) on every call."""
    name = "aten-raiser"
    def fp8_indexer_scores(self, q_idx, k_idx, k_scale, w, ks, ke, fp8_format):
        return torch.ops.aten.mm(w.new_ones(2, 3), w.new_ones(2, 3))
PY
torch_lib=$($py -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
declare -A lib_path
symbolize() {  # the segv_report lines of $1, with addr2line for libraries found here
  grep "^segv_report" "$1" | head -70 | while read -r tag kind pc rest; do
    loc=${rest%% *}; libname=${loc%%+*}; off=${loc#*+}
    [ -n "${lib_path[$libname]+x}" ] || lib_path[$libname]=$(find "$bd" "$torch_lib" -name "$libname" 2>/dev/null | head -1)
    path=${lib_path[$libname]}
    sym=""
    [ -n "$path" ] && [ "$off" != "$loc" ] && sym=$(addr2line -f -C -e "$path" "$off" 2>/dev/null | head -1)
    echo "$kind $rest ${sym:+[$sym]}"
  done
}
probe() {  # name, then the command
  local name=$1; shift
  SECONDS=0
  LD_PRELOAD=/tmp/segv_report.so timeout 100 "$@" >"$out/probe_$name.txt" 2>&1
  local rc=$?
  echo "probe $name rc=$rc (${SECONDS}s): $(grep -E '^probe:|^audit:' "$out/probe_$name.txt" | tail -1)" | tee -a "$out/probe_summary.txt"
  if grep -q "^segv_report" "$out/probe_$name.txt"; then symbolize "$out/probe_$name.txt" > "$out/probe_${name}_sym.txt"; head -25 "$out/probe_${name}_sym.txt"; fi
}
probe plain $py /tmp/probe/probe_reject.py plain "$lib"
probe import $py /tmp/probe/probe_reject.py import "$lib"
probe aten $py -m dsa_verify audit probe_backends:AtenRaiser --device cuda --ops fp8_indexer_scores --seed 7
DSA_TORCH_OPS_LIB=$lib probe cpu $py -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOps --device cpu \
  --ops fp8_indexer_scores --seed 7
DSA_TORCH_OPS_LIB=$lib probe audit $py -m dsa_verify audit dsa_torch_ops_backend:DsaTorchOpsCuda --device cuda \
  --ops fp8_indexer_scores --seed 7
echo "=== probe summary"; cat "$out/probe_summary.txt"
