#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds examples/consumer against it with
# find_package(replayssm), and runs the program: the package is complete and usable.
#   tests/install_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$source/examples/consumer" -B "$scratch/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" >/dev/null
"$scratch/build/embed_cache" separate-fp8
