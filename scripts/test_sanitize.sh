#!/usr/bin/env bash
# Builds moe-ep and the loader suites' test binary (moe_loader_tests: only the files that
# hold them, tests/CMakeLists.txt) with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DMOE_SANITIZE=ON, in build-sanitize/) and runs the loader suites under them: the
# hostile-checkpoint corpus (which also runs the sanitized moe-ep on every broken
# file), the safetensors/checkpoint validation, the sharding rules, the scale tables,
# the bad-input tests and the FP8 slices, hostile FP8 checkpoints and quantization_config
# parsing, and the GGUF reader, its model mapping and its tokenizer converter. Any
# sanitizer report stops the run and fails it.
# Usage: scripts/test_sanitize.sh [extra gtest filter]   (JOBS=N for the build, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SANITIZE_BUILD_DIR:-build-sanitize}
# -O1 -g1: line tables are all a sanitizer report needs; full debug info and -O2 only
# lengthen this stage's compile (it builds every library once more; moe_core in unity
# batches here, CMakeLists.txt). With the loader suites' files alone, the stage took 407-427 s
# in fresh clones on a 2-vCPU Zen 3 (741 s before the unity batches).
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DMOE_SANITIZE=ON >/dev/null
cmake --build "$BUILD" -j"${JOBS:-2}" --target moe-ep moe_loader_tests
FILTER=${1:-'HostileCorpus.*:Safetensors*.*:Checkpoint.*:BadInput.*:Loader*.*:Placement*.*:Eplb*.*:ExpertPieces.*:Fp8*.*:QuantFp8.*:Gguf*.*:HfInt4*.*'}
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:allocator_may_return_null=0:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export OMP_WAIT_POLICY=PASSIVE
"$BUILD/tests/moe_loader_tests" --gtest_filter="$FILTER" --gtest_brief=1
echo "test_sanitize: ASan+UBSan loader suites passed"
