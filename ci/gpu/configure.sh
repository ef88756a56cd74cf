#!/usr/bin/env bash
# Sourced (not run) by ci/gpu/test.sh and ci/gpu/python_audit.sh on the GPU machine: defines
# gpu_configure, which builds and installs GoogleTest from the carried sources, then configures
# the project for CUDA (sm_90) with the LibTorch inside the pip PyTorch of the interpreter that
# imports torch and the staged deps. Needs the repo root as the working directory.
#   gpu_configure BUILD_ROOT LOG [extra cmake args...]
#     BUILD_ROOT: GoogleTest goes to BUILD_ROOT/gtest(-prefix), the project to BUILD_ROOT/main.
#     LOG: every configure and build line is appended there.
#     GPU_DEPS (env): the carried .gpu-deps (default ./.gpu-deps, or .. when run from .gpu-deps/wt).
#   Returns non-zero when a step fails (its output is in LOG).
# GoogleTest is installed and found by find_package: the add_subdirectory route of the
# top-level CMakeLists clashes with googletest's own aliases. PyTorch may live in a venv (it does
# on the H200 machine), so the Python module is configured for that interpreter, not
# /usr/bin/python3 (python/CMakeLists.txt's default).
gpu_configure() {
  local root=$1 log=$2; shift 2
  local deps=${GPU_DEPS:-$PWD/.gpu-deps}
  [ -d "$deps/googletest" ] || deps=$(cd .. && pwd)  # run from .gpu-deps/wt
  local py torch_dir
  py=$(python3 -c 'import sys; print(sys.executable)')
  torch_dir=$("$py" -c "import torch;print(torch.utils.cmake_prefix_path)")/Torch
  cmake -S "$deps/googletest" -B "$root/gtest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$root/gtest-prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >>"$log" 2>&1 \
    && cmake --build "$root/gtest" -j 16 --target install >>"$log" 2>&1 \
    && cmake -S . -B "$root/main" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSA_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DTorch_DIR="$torch_dir" \
      -DCMAKE_PREFIX_PATH="$deps/prefix;$root/gtest-prefix" -DDSA_GTEST_SOURCE_DIR= \
      -DPython3_EXECUTABLE="$py" "$@" >>"$log" 2>&1
}
