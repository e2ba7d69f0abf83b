#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into build-fuzz/ and
# runs each for FUZZ_SECONDS (default 30) from its corpus in fuzz/corpus/<target>/, with
# fuzz/<target without fuzz_>.dict when there is one. The targets: the text layer
# (fuzz_tokenizer_json, fuzz_encode_decode, fuzz_jinja) and the checkpoint's parsers
# (fuzz_safetensors, fuzz_shard_index, fuzz_config, fuzz_gguf: GGUF files) and the server's
# request bodies (fuzz_openai: chat/completions, /tokenize, /detokenize and the response
# builders); fuzz/CMakeLists.txt lists what each compiles. Eight targets at 30 s: about 4
# minutes after the build.
# New inputs the fuzzer finds go to a scratch directory, not into the repo; a crash
# fails the script and leaves its input in build-fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-30}"
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"${JOBS:-$(nproc)}"
mkdir -p build-fuzz/crashes
for bin in build-fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  scratch=$(mktemp -d)
  echo "fuzz: $name for ${SECONDS_EACH} s"
  # -rss_limit_mb: a hostile input must fail cleanly, not by taking the machine's memory.
  rc=0
  dict=()
  [ -f "fuzz/${name#fuzz_}.dict" ] && dict=(-dict="fuzz/${name#fuzz_}.dict")
  ASAN_OPTIONS=detect_leaks=1 "$bin" "${dict[@]}" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix=build-fuzz/crashes/"$name"- -print_final_stats=1 "$scratch" "fuzz/corpus/$name" \
    > build-fuzz/"$name".log 2>&1 || rc=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" build-fuzz/"$name".log || true
  rm -rf "$scratch"
  if [ "$rc" != 0 ] || ls build-fuzz/crashes/"$name"-* >/dev/null 2>&1; then
    tail -40 build-fuzz/"$name".log
    echo "fuzz: $name found a crash: $(ls build-fuzz/crashes/"$name"-*)"
    exit 1
  fi
done
echo "fuzz: every target ran ${SECONDS_EACH} s without a crash"
