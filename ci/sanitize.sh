#!/usr/bin/env bash
# Sanitizer passes (preset asan-ubsan: ASan + UBSan, LibTorch off).
#   ci/sanitize.sh fuzz   bounded pass of the safetensors parser fuzz property (run by `make test`)
#   ci/sanitize.sh all    every CPU test that builds without LibTorch, under the sanitizers
# DSA_FUZZ_CASES sets the fuzz case count of the bounded pass (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-fuzz}
cmake --preset asan-ubsan >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
case "$mode" in
  fuzz)
    # dsa_parser_fuzz_tests: parser_fuzz_prop.cpp alone (fixtures/tests/CMakeLists.txt)
    cmake --build --preset asan-ubsan -j "${JOBS:-2}" --target dsa_parser_fuzz_tests
    RC_PARAMS="max_success=${DSA_FUZZ_CASES:-300} seed=20261130" \
      build/asan-ubsan/fixtures/tests/dsa_parser_fuzz_tests --gtest_filter='ParserFuzz.*'
    ;;
  all)
    cmake --build --preset asan-ubsan -j "${JOBS:-2}"
    ctest --preset asan-ubsan -j "${JOBS:-2}" -LE gpu
    ;;
  *) echo "usage: ci/sanitize.sh [fuzz|all]" >&2; exit 2 ;;
esac
