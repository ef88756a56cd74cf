#!/usr/bin/env bash
# Run on the GPU machine (one H200), from the repo root, with .gpu-deps carried:
# configures with the LibTorch inside PyTorch and the staged deps, builds, runs the `gpu`
# label (and, with RUN_ALL=1, the CPU labels too), then the GPU benchmarks. Everything it
# reports is written under ${OUT:-out}/.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
torch_dir=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)")/Torch
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDSA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DDSA_BUILD_BENCH=OFF \
  -DTorch_DIR="$torch_dir" -DCMAKE_PREFIX_PATH="$PWD/.gpu-deps/prefix" \
  -DDSA_GTEST_SOURCE_DIR="$PWD/.gpu-deps/googletest" 2>&1 | tail -5 | tee "$out/configure.txt"
time cmake --build build/gpu -j 16 2>&1 | tail -30 | tee "$out/build.txt"
labels=${LABELS:-gpu}
ctest --test-dir build/gpu -L "$labels" --output-on-failure -j 4 2>&1 | tee "$out/ctest.txt" | tail -40
for b in build/gpu/bench/dsa_gpu_bench build/gpu/optimized/cuda/dsa_gpu_bench; do
  [ -x "$b" ] && "$b" 2>&1 | tee "$out/bench.txt"
done
