#!/usr/bin/env bash
# Installs the Debian packages dsa-verify needs, only those missing. Idempotent; uses sudo
# only when not root. Usage: ci/install-deps.sh
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                 # compiler cache: a later build on the same machine reuses objects
  libeigen3-dev          # reference maths
  libtorch-dev           # LibTorch ops (optimized/)
  libopenblas0-openmp    # LibTorch's CPU BLAS: without it libblas.so.3 is the netlib reference (issue 13)
  librapidcheck-dev      # property tests
  libgtest-dev libgmock-dev
  libbenchmark-dev       # bench/
  libcli11-dev           # dsa-verify command line
  nlohmann-json3-dev     # safetensors headers, reports
  libdlpack-dev          # plugin ABI
  libssl-dev             # sha256 for fixture MANIFESTs (libcrypto)
  python3-numpy          # docs/examples helpers
  python3                # report checks in the CLI tests
  libxml2-utils          # xmllint: JUnit report validation in the CLI tests
  python3-dev pybind11-dev  # the dsa_verify Python module (python/)
  python3-torch python3-pytest  # its tests and example backends (CPU PyTorch 1.13)
  python3-pytest-xdist   # python.pytest_plugin checks that the plugin refuses -n N (xdist)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
