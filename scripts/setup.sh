#!/usr/bin/env bash
# One command for a fresh machine (Debian 12 / Ubuntu): installs the build dependencies with
# apt-get, configures and builds replayssm (with the CUDA backend when nvcc is on PATH), and runs
# the main job on its built-in default: text generation with speculative decoding by the built-in
# model, then the demo table of every checkpoint mode. Extra CMake arguments:
# REPLAYSSM_CMAKE_ARGS="...".
set -euo pipefail
cd "$(dirname "$0")/.."

# The Python module (pybind11, python3-dev) and its tests (python3-numpy) are part of the build;
# xz-utils for the test of scripts/gpu_ab_programs.sh.
packages=(g++ cmake ninja-build libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev
          libfmt-dev pybind11-dev python3-dev python3-numpy xz-utils)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# numpy for the Python module's tests, in the python3 that CMake finds first on PATH (a pyenv or
# virtualenv interpreter does not see Debian's python3-numpy; Debian's own python3 does).
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
  echo "installing: numpy (pip)" >&2
  python3 -m pip install --quiet numpy
fi

# nvcc lives outside PATH in a default toolkit install.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${REPLAYSSM_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
./build/bin/replayssm generate -n 160 -p 'def fibonacci(n):
    """Return the n-th Fibonacci number."""
    '
./build/bin/replayssm demo --no-progress
