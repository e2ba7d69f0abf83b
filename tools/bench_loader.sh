#!/usr/bin/env bash
# Loader benchmark: `moe-ep inspect --load` on a generated >= 2 GB checkpoint against
# `cat > /dev/null` of the same files, warm page cache (and cold when the kernel lets
# us drop caches). The checkpoint lives in $DIR (default /tmp/moe_big) and is deleted
# at the end unless KEEP=1.
# Usage: tools/bench_loader.sh [build dir, default build] [extra inspect flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
DIR=${DIR:-/tmp/moe_big}
BIN="$BUILD/moe-ep"
g++ -O2 -std=c++20 -o /tmp/gen_big_checkpoint tools/gen_big_checkpoint.cpp
[ -f "$DIR/config.json" ] || /tmp/gen_big_checkpoint "$DIR" ${GEN_ARGS:-}
BYTES=$(cat "$DIR"/*.safetensors | wc -c)
echo "checkpoint: $DIR, $BYTES bytes in $(ls "$DIR"/*.safetensors | wc -l) files"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
run_pair() {
  local label=$1
  shift
  local cat_s io pack
  [ "$label" = cold ] && drop
  cat_s=$(secs cat "$DIR"/*.safetensors)
  [ "$label" = cold ] && drop
  io=$("$BIN" inspect --model "$DIR" --load --no-pack "$@" 2>/dev/null | grep "load rank" | sed 's/.*in //')
  [ "$label" = cold ] && drop
  pack=$("$BIN" inspect --model "$DIR" --load "$@" 2>/dev/null | grep "load rank" | sed 's/.*in //')
  echo "$label: cat $(echo "$BYTES / $cat_s / 1000000000" | bc -l | cut -c1-5) GB/s ($(echo "$cat_s" | cut -c1-5) s) | inspect --load --no-pack: $io | inspect --load (packed, --dtype bf16): $pack"
}
export OMP_WAIT_POLICY=PASSIVE
cat "$DIR"/*.safetensors > /dev/null  # warm the page cache
for i in 1 2 3; do run_pair warm "$@"; done
if drop; then run_pair cold "$@"; else echo "cold: cannot drop caches here (echo 3 > /proc/sys/vm/drop_caches not permitted)"; fi
[ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
