#!/usr/bin/env bash
# Run on the GPU machine (one H200) from the repo root with .gpu-deps carried (made here by
# ci/gpu/stage-deps.sh): configures like ci/gpu/test.sh, builds only dsa_cuda_tests and
# dsa_gpu_bench, runs the cuda backend tests, a compute-sanitizer memcheck pass on the small
# cases, then the benchmark. Everything is written under ${OUT:-out}/ (7 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
torch_dir=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)")/Torch
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv; } | tee "$out/gpu.txt"
# GoogleTest built and installed from the staged sources, then found by find_package (the
# add_subdirectory route of the top-level CMakeLists clashes with googletest's own aliases).
cmake -S .gpu-deps/googletest -B build/gtest -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$PWD/build/gtest-prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$out/configure.txt" 2>&1 \
  && cmake --build build/gtest -j 16 --target install >>"$out/configure.txt" 2>&1 \
  || { tail -30 "$out/configure.txt"; exit 1; }
cmake -S . -B build/gpu-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDSA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DDSA_BUILD_BENCH=OFF \
  -DTorch_DIR="$torch_dir" -DCMAKE_PREFIX_PATH="$PWD/.gpu-deps/prefix;$PWD/build/gtest-prefix" \
  -DDSA_GTEST_SOURCE_DIR= >>"$out/configure.txt" 2>&1 \
  || { tail -30 "$out/configure.txt"; exit 1; }
SECONDS=0
cmake --build build/gpu-cuda -j 16 --target dsa_cuda_tests dsa_gpu_bench >"$out/build.txt" 2>&1 \
  || { grep -v ptxas "$out/build.txt" | tail -40; exit 1; }
echo "build: ${SECONDS}s"
bin=build/gpu-cuda/optimized/cuda
SECONDS=0
timeout 200 "$bin/dsa_cuda_tests" >"$out/tests.txt" 2>&1
echo "tests rc=$? (${SECONDS}s)"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]" "$out/tests.txt" | tail -20
grep -B2 -A12 "Failure" "$out/tests.txt" | head -60
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
  SECONDS=0
  timeout 90 "$san" --tool memcheck --error-exitcode 3 "$bin/dsa_cuda_tests" \
    --gtest_filter='*EmptyRows*:*IndexView3d*:*Unselectable*:*Windows*' >"$out/memcheck.txt" 2>&1
  echo "memcheck rc=$? (${SECONDS}s)"; tail -4 "$out/memcheck.txt"
fi
timeout 150 "$bin/dsa_gpu_bench" 2>&1 | tee "$out/bench.txt"
