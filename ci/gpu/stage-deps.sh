#!/usr/bin/env bash
# Run HERE (the Debian machine): copies the Debian-installed build dependencies that the GPU
# machine lacks into .gpu-deps/ (git-ignored), laid out as an install prefix so their CMake
# package files (which compute paths relative to themselves) keep working, and a copy of this
# working tree (tracked and untracked-not-ignored files, without the large peer fixtures) into
# .gpu-deps/wt/ for device calls that carry .gpu-deps from another checkout. Carry .gpu-deps
# in the device call, then run ci/gpu/test.sh there (from the repo root, or from
# .gpu-deps/wt). `--tree-only` refreshes only .gpu-deps/wt. Recipe: shared/GPU.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
dst=.gpu-deps
if [ "${1:-}" != "--tree-only" ]; then
  ci/install-deps.sh
  rm -rf "$dst"
  mkdir -p "$dst/prefix/include" "$dst/prefix/lib/x86_64-linux-gnu/cmake" "$dst/prefix/share/cmake"
  cp -r /usr/src/googletest "$dst/googletest"
  cp -r /usr/include/rapidcheck /usr/include/rapidcheck.h "$dst/prefix/include/"
  cp /usr/lib/x86_64-linux-gnu/librapidcheck.a "$dst/prefix/lib/x86_64-linux-gnu/"
  cp -r /usr/lib/x86_64-linux-gnu/cmake/rapidcheck "$dst/prefix/lib/x86_64-linux-gnu/cmake/"
  cp -r /usr/include/nlohmann "$dst/prefix/include/"
  cp -r /usr/share/cmake/nlohmann_json "$dst/prefix/share/cmake/"
  cp -r /usr/include/CLI "$dst/prefix/include/"
  cp -r /usr/share/cmake/CLI11 "$dst/prefix/share/cmake/"
  cp -r /usr/include/dlpack "$dst/prefix/include/"
  cp -r /usr/lib/x86_64-linux-gnu/cmake/dlpack "$dst/prefix/lib/x86_64-linux-gnu/cmake/"
  # Google Benchmark (the reference's thread-scaling benchmark, issue 13)
  cp -r /usr/include/benchmark "$dst/prefix/include/"
  cp -a /usr/lib/x86_64-linux-gnu/libbenchmark.so* /usr/lib/x86_64-linux-gnu/libbenchmark_main.a \
    "$dst/prefix/lib/x86_64-linux-gnu/"
  cp -r /usr/lib/x86_64-linux-gnu/cmake/benchmark "$dst/prefix/lib/x86_64-linux-gnu/cmake/"
fi
tree=$dst/wt
[ "${1:-}" = "--tree-only" ] && [ -n "${2:-}" ] && tree=$2
rm -rf "$tree"
mkdir -p "$tree"
git ls-files -co --exclude-standard | grep -v '^fixtures/peer/.*\.safetensors$' |
  while read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done |
  tar -cf - -T - | tar -xf - -C "$tree"
echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.gpu-deps' || echo ' plus uncommitted changes')" > "$tree/COMMIT"
du -sh "$dst" "$tree"
