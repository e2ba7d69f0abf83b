#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into build-fuzz/ and
# runs each for FUZZ_SECONDS (default 30) from its corpus in fuzz/corpus/<target>/, with
# fuzz/<target without fuzz_>.dict when there is one. The targets: the text layer
# (fuzz_tokenizer_json, fuzz_encode_decode, fuzz_jinja) and the checkpoint's parsers
# (fuzz_safetensors, fuzz_shard_index, fuzz_config, fuzz_gguf: GGUF files) and the server's
# request bodies (fuzz_openai: chat/completions, /tokenize, /detokenize and the response
# builders); fuzz/CMakeLists.txt lists what each compiles.
# Targets run side by side, one per core (FUZZ_JOBS, default nproc): each is a single
# process, so every target still gets FUZZ_SECONDS of a whole core, and the stage takes
# about 8 x 30 s / cores after the build.
# New inputs the fuzzer finds go to a scratch directory, not into the repo; a crash
# fails the script and leaves its input in build-fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-30}"
PARALLEL="${FUZZ_JOBS:-$(nproc)}"
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"${JOBS:-$(nproc)}"
mkdir -p build-fuzz/crashes
rm -f build-fuzz/crashes/* build-fuzz/fuzz_*.rc

# One target for SECONDS_EACH; its exit status goes to build-fuzz/<name>.rc.
fuzz_one() {
  local bin=$1 name scratch rc=0
  name=$(basename "$bin")
  scratch=$(mktemp -d)
  local dict=()
  [ -f "fuzz/${name#fuzz_}.dict" ] && dict=(-dict="fuzz/${name#fuzz_}.dict")
  # -rss_limit_mb: a hostile input must fail cleanly, not by taking the machine's memory.
  ASAN_OPTIONS=detect_leaks=1 "$bin" "${dict[@]}" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix=build-fuzz/crashes/"$name"- -print_final_stats=1 "$scratch" "fuzz/corpus/$name" \
    > build-fuzz/"$name".log 2>&1 || rc=$?
  rm -rf "$scratch"
  echo "$rc" > build-fuzz/"$name".rc
}

names=()
for bin in build-fuzz/fuzz_*; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || true; done
  echo "fuzz: $(basename "$bin") for ${SECONDS_EACH} s"
  names+=("$(basename "$bin")")
  fuzz_one "$bin" &
done
wait

failed=0
for name in "${names[@]}"; do
  echo "fuzz: $name"
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" build-fuzz/"$name".log || true
  rc=$(cat build-fuzz/"$name".rc 2>/dev/null || echo missing)
  if [ "$rc" != 0 ] || ls build-fuzz/crashes/"$name"-* >/dev/null 2>&1; then
    tail -40 build-fuzz/"$name".log
    echo "fuzz: $name failed (exit status $rc): $(ls build-fuzz/crashes/"$name"-* 2>/dev/null || echo 'no crash input saved')"
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz: every target ran ${SECONDS_EACH} s without a crash"
