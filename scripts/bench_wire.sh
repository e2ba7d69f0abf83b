#!/usr/bin/env bash
# Bytes on the wire per decode step, measured on the multi-host test bed
# (scripts/netbed.sh), against `moe-ep plan`'s figure for the same model and layout.
# Needs root (network namespaces) and jq.
#
#   scripts/bench_wire.sh [options]
#     --hosts LIST     host counts, default "2 4" (one rank each)
#     --layers N       bench-model --layers (every layer MoE), default 2
#     --vocab V        bench-model --vocab, default 32000
#     --steps "A B"    two --decode-steps values, default "4 20"
#     --layouts LIST   default "replicated moe-tp attn-tp" (--ep N; --tp N; --ep N --attn-tp N);
#                      "dp" (--ep N --dp N, one conversation per host) needs --model
#     --top-k K        plan --top-k (both runs below decode greedily: 1), default 1
#     --model DIR      run `moe-ep generate` on this checkpoint instead of bench-model's
#                      generated model (e.g. a DeepSeek-V3-structured one from
#                      tools/gen_big_checkpoint.cpp --deepseek-v3); --layers/--vocab unused
#     --out FILE       also write the table here
#
# What is measured: every test host's net0 transmit counter (bytes leaving the host:
# payload, MPI's headers, TCP/IP/Ethernet headers, TCP ACKs) around two `moe-ep
# bench-model` runs that differ only in --decode-steps. Each run decodes its steps twice
# (one untimed pass, --repeats 1), so the difference of the two runs' counters over
# 2 x (B - A) steps is what one decode step sends: model load, checks, prefill and
# MPI's start-up cancel out. The plan counts the payload of the collectives the engine
# runs (plan_cmd.cpp, "wire"); bench-model also broadcasts each step's token from rank
# 0 (4 bytes), which the plan does not count.
#
# bench-model builds a Qwen3-30B-A3B-shaped model (H 2048, 128 experts, top-8) with
# random bf16 weights; the plan reads docs/examples/qwen3_30b_a3b with the same layers
# and vocabulary. With --model, `generate --max-new-tokens A+1` and `B+1` (A and B
# decode steps after the prefill) run on the checkpoint, and the plan reads its
# config.json; generate also all-reduces one float (are any sequences left?) and
# broadcasts the step's tokens each step, which the plan does not count.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
bin="${MOE_EP:-$root/build/moe-ep}"
bed="$here/netbed.sh"
hosts_list="2 4" layers=2 vocab=32000 steps="4 20" top_k=1 out="" model="" layouts="replicated moe-tp attn-tp"
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts_list=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --top-k) top_k=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --model) model=$(readlink -f "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n "2,33p" "$0"; exit 2 ;;
  esac
done
read -r s1 s2 <<<"$steps"
[ -n "${s2:-}" ] && [ "$s2" -gt "$s1" ] || { echo "bench_wire: --steps needs two counts, the second larger"; exit 2; }
[ -x "$bin" ] || { echo "bench_wire: no moe-ep binary at $bin (build first, or set MOE_EP)"; exit 1; }
command -v jq >/dev/null || { echo "bench_wire: needs jq"; exit 1; }
bash "$bed" check || exit $?

tmp=$(mktemp -d)
id=""
trap '[ -n "$id" ] && bash "$bed" down "$id"; rm -rf "$tmp"' EXIT
if [ -n "$model" ]; then
  [ -f "$model/config.json" ] || { echo "bench_wire: --model $model has no config.json"; exit 1; }
  plan_model=$model
else
  plan_model=$tmp/model
  mkdir "$plan_model"
  jq --argjson l "$layers" --argjson v "$vocab" '.num_hidden_layers = $l | .vocab_size = $v' \
    "$root/docs/examples/qwen3_30b_a3b/config.json" >"$plan_model/config.json"
fi
# Decode steps per run of `steps` (bench-model: its untimed pass and one timed pass).
per_run=2
[ -n "$model" ] && per_run=1

tx() {  # tx <hosts>: every test host's net0 transmit bytes, one line
  local i
  for i in $(seq 1 "$1"); do ip netns exec "$(bash "$bed" host "$id" "$i")" cat /sys/class/net/net0/statistics/tx_bytes; done | paste -sd' '
}

# run <hosts> <decode steps> <layout flags...>: the per-host transmit bytes of one run
run() {
  local n=$1 st=$2
  shift 2
  local before after
  before=$(tx "$n")
  rm -f "$tmp/run.json"
  local cmd=("$bin" bench-model --layers "$layers" --vocab "$vocab" --prefill 8 --decode-batch 1 --decode-context 16
             --decode-steps "$st" --repeats 1 --skip-check --json "$tmp/run.json")
  local prompts=1,2,3,4,5,6,7,8
  if [[ " $* " == *" --dp "* ]]; then  # one prompt per replica
    prompts=$(for i in $(seq "$n"); do printf '%d,2,3,4,5,6,7,8;' "$i"; done)
    prompts=${prompts%;}
  fi
  [ -n "$model" ] && cmd=("$bin" generate --model "$model" --prompt-ids "$prompts" --max-new-tokens $((st + 1))
                          --ignore-eos --quiet --output-json "$tmp/run.json")
  OMP_NUM_THREADS=1 timeout -k 5 900 bash "$bed" mpirun "$id" "$n" 1 -x OMP_NUM_THREADS -- "${cmd[@]}" \
    --comm-timeout 300 "$@" >"$tmp/run.log" 2>&1 ||
    { echo "bench_wire: ${cmd[1]} failed ($n hosts, $*):" >&2; tail -5 "$tmp/run.log" >&2; return 1; }
  after=$(tx "$n")
  paste -d' ' <(tr ' ' '\n' <<<"$before") <(tr ' ' '\n' <<<"$after") | awk '{print $2 - $1}' | paste -sd' '
}

table="$tmp/table.md"
{
  echo "| hosts | layout | measured bytes/step/host: mean (min-max) | plan | measured / plan | ms/step on the bed |"
  echo "|---|---|---|---|---|---|"
} >"$table"
for n in $hosts_list; do
  id=$(bash "$bed" up "$n")
  "$bin" plan --model "$plan_model" --nodes "$n" --batch 1 --context 64 --mem-per-node 1000 --mem-bw 100 \
    --net-gbps 10 --net-latency-us 10 --top-k "$top_k" --json >"$tmp/plan.json"
  for layout in $layouts; do
    case "$layout" in
      replicated) flags=(--ep "$n") ;;
      attn-tp) flags=(--ep "$n" --attn-tp "$n") ;;
      moe-tp) flags=(--tp "$n") ;;
      dp) flags=(--ep "$n" --dp "$n") ;;
      *) echo "bench_wire: unknown layout $layout (replicated, moe-tp, attn-tp, dp)"; exit 2 ;;
    esac
    # dp: one conversation per host (the plan's cluster figure at --batch 1); generate only.
    if [ "$layout" = dp ] && [ -z "$model" ]; then echo "bench_wire: dp needs --model (bench-model has no --dp)"; continue; fi
    scope=one_conversation
    [ "$layout" = dp ] && scope=cluster
    a=$(run "$n" "$s1" "${flags[@]}")
    b=$(run "$n" "$s2" "${flags[@]}")
    # The longer run's decode time per step (the hosts share this machine's cores).
    ms=$(jq -r 'if .decode then .decode[0].ms_per_step else .timings.decode_s / .timings.decode_steps * 1000 end' \
      "$tmp/run.json")
    per=$(paste -d' ' <(tr ' ' '\n' <<<"$a") <(tr ' ' '\n' <<<"$b") |
      awk -v d=$((per_run * (s2 - s1))) '{print ($2 - $1) / d}' | paste -sd' ')
    plan=$(jq -r --arg l "$layout" --arg s "$scope" '.layouts[] | select(.layout == $l) | .[$s].wire_bytes_per_step' \
      "$tmp/plan.json")
    awk -v per="$per" -v plan="$plan" -v n="$n" -v l="$layout" -v ms="$ms" 'BEGIN {
      k = split(per, v, " "); s = 0; lo = v[1]; hi = v[1]
      for (i = 1; i <= k; ++i) { s += v[i]; if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i] }
      m = s / k
      printf "| %d | %s | %.0f (%.0f-%.0f) | %.0f | %.3f | %.1f |\n", n, l, m, lo, hi, plan, m / plan, ms }' >>"$table"
  done
  bash "$bed" down "$id"
  id=""
done
cat "$table"
[ -z "$out" ] || cp "$table" "$out"
