#!/usr/bin/env bash
# Configures and builds moe-ep (Release) into build/. Extra args go to cmake.
# TARGETS="moe-ep" builds only those targets (the demo: the CLI, no tests); default all.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build build -j"$JOBS" "${targets[@]}"
