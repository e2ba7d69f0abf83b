#!/usr/bin/env bash
# Runs a command that must FAIL: exit non-zero, within <max_seconds>, printing a
# line matching <regex> (extended grep) on stdout or stderr.
# usage: expect_fault.sh [options] <max_seconds> <regex> <command> [args...]
#   --also REGEX   another pattern the output must match (repeatable: all must match)
#   --absent PATH  a file the failed run must not leave behind, nor PATH.tmp (repeatable)
#   --stamp FILE   also write the output with each line prefixed by "[<epoch seconds>] "
#                  to FILE (when it arrived), for callers that check when a report came
set -u
also=() absent=() stamp=""
while [ $# -gt 0 ]; do
  case "$1" in
    --also) also+=("$2"); shift 2 ;;
    --absent) absent+=("$2"); shift 2 ;;
    --stamp) stamp=$2; shift 2 ;;
    *) break ;;
  esac
done
max=$1
pattern=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%N)
if [ -n "$stamp" ]; then
  timeout -k 5 "$max" "$@" 2>&1 | while IFS= read -r line; do
    printf '[%s] %s\n' "$(date +%s.%3N)" "$line" >>"$stamp"
    printf '%s\n' "$line"
  done >"$log"
  rc=${PIPESTATUS[0]}
else
  timeout -k 5 "$max" "$@" >"$log" 2>&1
  rc=$?
fi
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$log"
echo "expect_fault: exit status $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then
  echo "expect_fault: FAIL: the job exited 0, a failure was expected"; exit 1
fi
# timeout(1) says 124 (or 137 after -k); mpirun itself may say 137 when a rank was
# SIGKILLed, so only a run that lasted the whole limit counts as too slow.
if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ "$elapsed_ms" -ge $(( max * 1000 )) ]; }; then
  echo "expect_fault: FAIL: the job did not end within $max s"; exit 1
fi
for p in "$pattern" ${also[@]+"${also[@]}"}; do
  if ! grep -Eq -- "$p" "$log"; then
    echo "expect_fault: FAIL: the output has no line matching /$p/"; exit 1
  fi
done
for f in ${absent[@]+"${absent[@]}"}; do
  for g in "$f" "$f.tmp"; do
    if [ -e "$g" ]; then echo "expect_fault: FAIL: the failed run left '$g' behind"; exit 1; fi
  done
done
echo "expect_fault: OK"
