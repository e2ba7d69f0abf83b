#!/usr/bin/env bash
# Whole-model load as a user meets it: peak RSS and warm load time of
# `moe-ep generate --max-new-tokens 1` on a generated 4.9 GiB bf16 checkpoint of 4
# Qwen3-30B-A3B-shaped layers (E = 128, H = 2048, I = 768, 32 query / 4 KV heads of 128,
# vocab 32768: 5.25 GB), against `cat` of the same files, warm page cache. Needs GNU
# time (/usr/bin/time, Debian package `time`, in scripts/setup.sh).
# The checkpoint lives in $DIR (default /tmp/moe_qwen3_4l) and is deleted at the end
# unless KEEP=1. MODES (default "bf16 w8a8 w8a8-linears f32") picks the loads.
# Usage: tools/bench_model_load.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DIR=${DIR:-/tmp/moe_qwen3_4l}
BIN="$BUILD/moe-ep"
g++ -O2 -std=c++20 -o /tmp/gen_big_checkpoint tools/gen_big_checkpoint.cpp
[ -f "$DIR/config.json" ] || /tmp/gen_big_checkpoint "$DIR" 4 128 2048 768 0 32768 32 4 128
BYTES=$(cat "$DIR"/*.safetensors | wc -c)
echo "checkpoint: $DIR, $BYTES bytes in $(ls "$DIR"/*.safetensors | wc -l) files; load average $(cut -d' ' -f1 /proc/loadavg)"
export OMP_WAIT_POLICY=PASSIVE
cat "$DIR"/*.safetensors > /dev/null  # warm the page cache
for i in 1 2; do
  /usr/bin/time -f "cat: %e s" cat "$DIR"/*.safetensors 2>&1 >/dev/null
done
for mode in ${MODES:-bf16 w8a8 w8a8-linears f32}; do
  case $mode in
    bf16) flags="--dtype bf16" ;;
    f32) flags="--dtype f32" ;;
    w8a8) flags="--dtype bf16 --quantize w8a8" ;;
    w8a8-linears) flags="--dtype bf16 --quantize w8a8 --quantize-linears w8a8" ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
  out=$(/usr/bin/time -f "TIME wall %e s, user %U s, sys %S s, peak RSS %M KB" \
        "$BIN" generate --model "$DIR" --prompt-ids 1,2,3 --max-new-tokens 1 $flags 2>&1)
  echo "$mode ($flags): $(echo "$out" | grep -o 'done, .*' | tail -1) | $(echo "$out" | grep -o 'loaded in [0-9.]* s') | $(echo "$out" | grep TIME | sed 's/TIME //'); load average $(cut -d' ' -f1 /proc/loadavg)"
done
[ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
