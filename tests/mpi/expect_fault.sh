#!/usr/bin/env bash
# Runs a command that must FAIL: exit non-zero, within <max_seconds>, printing a
# line matching <regex> (extended grep) on stdout or stderr.
# usage: expect_fault.sh <max_seconds> <regex> <command> [args...]
set -u
max=$1
pattern=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%N)
timeout -k 5 "$max" "$@" >"$log" 2>&1
rc=$?
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
if ! grep -Eq -- "$pattern" "$log"; then
  echo "expect_fault: FAIL: the output has no line matching /$pattern/"; exit 1
fi
echo "expect_fault: OK"
