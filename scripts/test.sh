#!/usr/bin/env bash
# Builds moe-ep and runs every test. The README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 -j"${JOBS:-$(nproc)}"
