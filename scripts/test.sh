#!/usr/bin/env bash
# Builds moe-ep and runs every test. The README's test command; .ci/run calls it.
#   1. Release build, then ctest: unit and fixture tests, the multi-rank suites under
#      mpirun with 1-4 ranks, and the fault tests.
#      As root also the multi-host bed (ctest -R netbed; docs/SCALE.md): hosts as network
#      namespaces, OpenMPI over TCP, faults mid-run; skipped with the reason elsewhere.
#      Among them: the tokenizer and chat-template suites against HF tokenizers /
#      transformers / jinja2 goldens, and `moe-ep serve` end to end under curl (1 and 2 ranks).
#   2. The loader suites (hostile-checkpoint corpus, safetensors validation, sharding,
#      scales, bad input, the GGUF reader, model mapping and tokenizer) once more under
#      AddressSanitizer + UndefinedBehaviorSanitizer.
#   3. The libFuzzer targets (fuzz/), each for FUZZ_SECONDS (default 30): the text layer
#      (tokenizer.json, encode/decode, chat templates) and the checkpoint's parsers
#      (safetensors header, model.safetensors.index.json, config.json + quantization_config),
#      the GGUF reader and the server's request parser (OpenAI bodies).
# Each stage prints its wall time (CI's budget is 30 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
stage() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "test.sh: stage '$name' took $((SECONDS - t0)) s (total $SECONDS s)"
}
stage setup bash scripts/setup.sh
stage build bash scripts/build.sh
stage ctest bash -c 'cd build && ctest --output-on-failure --timeout 900 -j"${JOBS:-$(nproc)}"'
stage sanitize bash scripts/test_sanitize.sh
stage fuzz env FUZZ_SECONDS="${FUZZ_SECONDS:-30}" bash scripts/fuzz.sh
