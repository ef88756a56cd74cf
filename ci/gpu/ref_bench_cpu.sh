#!/usr/bin/env bash
# The float64 reference's thread scaling on the GPU machine's CPUs, without CUDA, LibTorch or
# the project's CMake (issue 13): compiles dsa_reference_bench from the contract sources, the
# reference's sparse MLA and bench/reference_bench.cpp with the flags of the Release build
# (-O3 -DNDEBUG, no -march), then runs the forward first (with the same-shape GEMM peer and
# the fixed part of a call and the host's throughput ceilings), the backward last, each under
# its own timeout so that a run cut short still returns the forward, then prints a table of
# x_linear per thread count (also in $OUT/ref_bench_table.txt; python3, skipped without it).
# Run from a tree staged by ci/gpu/stage-deps.sh; output in $OUT (ref_bench.txt).
# ~90 s on 16 cores (build 20 s, forward part ~30 s, backward part ~40 s).
# Env: GPU_DEPS (default ../ : .gpu-deps when run from .gpu-deps/wt), FWD_TIMEOUT, BWD_TIMEOUT.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
deps=${GPU_DEPS:-$(cd .. && pwd)}
bd=${BUILD_DIR:-/tmp/dsa-ref-bench}
mkdir -p "$bd"
eigen=/usr/include/eigen3
[ -d "$eigen/Eigen" ] || eigen=$(dirname "$(find / -xdev -type d -name Eigen -path '*eigen3/Eigen' 2>/dev/null | head -1)")
flags=(-O3 -DNDEBUG -std=c++17 -DDSA_CONTRACT_VERSION='"1"' -Icontract/include -Ireference/include
       -isystem "$eigen" -isystem "$deps/prefix/include")
{ date -u; cat COMMIT 2>/dev/null; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L1d|L2|L3|MHz"; nproc;
  g++ --version | head -1; echo "eigen: $eigen"; } >"$out/ref_bench.txt" 2>&1
SECONDS=0
pids=()
for f in contract/src/*.cpp reference/src/sparse_mla.cpp bench/reference_bench.cpp; do
  g++ "${flags[@]}" -c "$f" -o "$bd/$(basename "$f" .cpp).o" >>"$out/build.txt" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc = 0 ] && g++ -o "$bd/dsa_reference_bench" "$bd"/*.o -L"$deps/prefix/lib/x86_64-linux-gnu" \
  -lbenchmark -lpthread >>"$out/build.txt" 2>&1 || rc=1
echo "build rc=$rc (${SECONDS}s)" | tee -a "$out/ref_bench.txt"
[ $rc = 0 ] || { tail -20 "$out/build.txt"; exit 1; }
export LD_LIBRARY_PATH="$deps/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run() {  # run TIMEOUT FILTER
  SECONDS=0
  timeout "$1" "$bd/dsa_reference_bench" --benchmark_counters_tabular=true --benchmark_filter="$2" \
    >>"$out/ref_bench.txt" 2>&1
  echo "filter '$2' rc=$? (${SECONDS}s)" | tee -a "$out/ref_bench.txt"
}
# Scaling: each work's thread counts in interleaved rounds, best of 3 (BM_Scaling*); the
# same-shape GEMM alone for the single-thread rate; the fixed part of a call.
run "${FWD_TIMEOUT:-120}" '^BM_EigenGemmF64SameShapes(/after)?$|^BM_Scaling(GemmRowsSplit|CeilingGemm|Forward|CeilingForward)/|FixedPartThreads'
run "${BWD_TIMEOUT:-100}" '^BM_Scaling(Backward|CeilingBackward)/'
grep -E "^BM_|Model name|^CPU|rc=" "$out/ref_bench.txt"
command -v python3 >/dev/null && python3 ci/gpu/ref_bench_table.py "$out/ref_bench.txt" |
  tee "$out/ref_bench_table.txt"
