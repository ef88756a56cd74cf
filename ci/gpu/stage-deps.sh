#!/usr/bin/env bash
# Run HERE (the Debian machine): copies the Debian-installed build dependencies that the GPU
# machine lacks into .gpu-deps/ (git-ignored), laid out as an install prefix so their CMake
# package files (which compute paths relative to themselves) keep working. Carry .gpu-deps
# in the device call, then run ci/gpu/test.sh there. Recipe: shared/GPU.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ci/install-deps.sh
dst=.gpu-deps
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
du -sh "$dst"
