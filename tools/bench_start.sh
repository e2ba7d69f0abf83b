#!/usr/bin/env bash
# Start-up time of moe-ep on one model: without --weights-cache, the start that writes
# the cache, and the starts that map it; against the time `cat` takes to read the model
# (issue #21's warm-start goal: a second start <= 1.25x cat).
#
#   tools/bench_start.sh MODEL [extra moe-ep generate flags...]
#
# MODEL: a GGUF file or a Hugging Face directory. Every run is `moe-ep generate` of 8
# greedy tokens after a fixed 16-token prompt, in its own process; the page cache is
# warm (the model and the cache file are read once before the timed runs).
# Checked first: every run prints the same tokens (a start from the cache that gave other
# tokens would be a wrong start, not a fast one).
# Reported, medians of R runs (R=5): the load time moe-ep prints ("loaded in"), the
# process's wall time and peak RSS (/usr/bin/time), and cat's wall time for the model's
# bytes. PEER_BENCH=path/to/llama-bench (a llama.cpp or ik_llama.cpp build, built outside
# this repository) adds its wall time for `-p 0 -n 1 -r 1` on a GGUF (it maps the file;
# that time includes one warm-up and one timed decode token, so it bounds its start).
# Environment: R (5), THREADS (2), MOE_EP (default build/moe-ep of this checkout),
# CACHE (the --weights-cache directory; default a new /tmp dir, removed at the end).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
MODEL=$1
shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
R=${R:-5} THREADS=${THREADS:-2} MOE_EP=${MOE_EP:-$REPO/build/moe-ep}
die() { echo "bench_start: $*" >&2; exit 1; }
[ -e "$MODEL" ] || die "no model at $MODEL"
[ -x "$MOE_EP" ] || die "no moe-ep binary at $MOE_EP (set MOE_EP)"
[ -x /usr/bin/time ] || die "/usr/bin/time is needed (apt-get install time)"
[[ $R =~ ^[1-9][0-9]*$ ]] || die "R must be a positive integer, got '$R'"
OWN_CACHE=0
if [ -z "${CACHE:-}" ]; then CACHE=$(mktemp -d /tmp/bench_start.XXXXXX); OWN_CACHE=1; fi
OUT=$(mktemp -d /tmp/bench_start_out.XXXXXX)
trap '[ $OWN_CACHE = 1 ] && rm -rf "$CACHE"; rm -rf "$OUT"' EXIT

if [ -d "$MODEL" ]; then FILES=("$MODEL"/*.safetensors); else FILES=("$MODEL"); fi
cat "${FILES[@]}" >/dev/null  # warm the page cache

median() { python3 -c 'import sys,statistics; v=[float(x) for x in sys.argv[1:]]; print(f"{statistics.median(v):.3f}")' "$@"; }
PROMPT=$(python3 -c 'print(",".join(str((i * 7919 + 11) % 1000 + 10) for i in range(16)))')

# One moe-ep start: prints "tokens load_s wall_s rss_kb".
run_moe() {
  local log=$OUT/log
  OMP_NUM_THREADS=$THREADS /usr/bin/time -f "TIME %e %M" "$MOE_EP" generate --model "$MODEL" --prompt-ids "$PROMPT" \
    --max-new-tokens 8 --ignore-eos "$@" >"$log" 2>&1 || { cat "$log" >&2; die "moe-ep failed"; }
  local tokens load wall rss
  tokens=$(grep -m1 '^prompt 0:' "$log" | cut -d: -f2 | tr -d ' ')
  load=$(grep -o 'loaded in [0-9.]* s' "$log" | awk '{print $3}')
  read -r wall rss < <(grep '^TIME' "$log" | awk '{print $2, $3}')
  echo "$tokens $load $wall $rss"
}

declare -A LOAD WALL RSS
TOKENS=""
check() {  # label, "tokens load wall rss"
  read -r t l w m <<<"$2"
  [ -n "$TOKENS" ] || TOKENS=$t
  [ "$t" = "$TOKENS" ] || die "$1 generated $t, the first run $TOKENS"
  LOAD[$1]+="$l " WALL[$1]+="$w " RSS[$1]+="$m "
}

CATS=""
for _ in $(seq "$R"); do
  s=$(date +%s.%N); cat "${FILES[@]}" >/dev/null; e=$(date +%s.%N)
  CATS+="$(python3 -c "print($e - $s)") "
done
for _ in $(seq "$R"); do check "no cache" "$(run_moe "$@")"; done
for _ in $(seq "$R"); do
  rm -rf "${CACHE:?}"/*
  check "writes the cache" "$(run_moe --weights-cache "$CACHE" "$@")"
done
for _ in $(seq "$R"); do check "maps the cache" "$(run_moe --weights-cache "$CACHE" "$@")"; done
PEER=""
if [ -n "${PEER_BENCH:-}" ] && [ -f "$MODEL" ]; then
  for _ in $(seq "$R"); do
    s=$(date +%s.%N)
    "$PEER_BENCH" -m "$MODEL" -p 0 -n 1 -r 1 -t "$THREADS" >/dev/null 2>&1 || die "$PEER_BENCH failed"
    e=$(date +%s.%N)
    PEER+="$(python3 -c "print($e - $s)") "
  done
fi

CAT=$(median $CATS)
BYTES=$(du -cb "${FILES[@]}" | tail -1 | cut -f1)
CACHE_BYTES=$(du -cb "$CACHE" | tail -1 | cut -f1)
echo "model: $MODEL ($(python3 -c "print(f'{$BYTES/1e9:.2f}')") GB); flags: ${*:-none}; threads $THREADS; R=$R"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; tokens: $TOKENS (the same in every run)"
echo "cache file(s): $(python3 -c "print(f'{$CACHE_BYTES/1e9:.2f} GB = {$CACHE_BYTES/$BYTES:.2f}x the model')")"
echo "cat: $CAT s"
printf '%-18s %9s %9s %11s %12s\n' "moe-ep start" "load s" "wall s" "wall / cat" "peak RSS GB"
for k in "no cache" "writes the cache" "maps the cache"; do
  l=$(median ${LOAD[$k]}) w=$(median ${WALL[$k]}) m=$(median ${RSS[$k]})
  printf '%-18s %9s %9s %11s %12s\n' "$k" "$l" "$w" "$(python3 -c "print(f'{$w/$CAT:.2f}')")" \
    "$(python3 -c "print(f'{$m*1024/1e9:.2f}')")"
done
if [ -n "$PEER" ]; then
  p=$(median $PEER)
  printf '%-18s %9s %9s %11s\n' "peer llama-bench" "-" "$p" "$(python3 -c "print(f'{$p/$CAT:.2f}')")"
fi
