#!/usr/bin/env bash
# One MoE layer and whole-model decode across N test hosts (scripts/netbed.sh) under
# shaped links, per --moe-comm strategy: a markdown table of ms per call, time blocked
# in communication, and decode tokens/s vs link latency and bandwidth. Needs root.
#
#   scripts/bench_net.sh [options]
#     --hosts N            hosts (ranks), default 2
#     --shape S            `moe-ep bench` layer shape, default qwen3-30b-a3b
#     --bench-args "..."   more `moe-ep bench` flags (e.g. --shape custom --hidden 64 ...)
#     --tokens LIST        tokens per call, default 1,16
#     --seconds S          time budget per token count (moe-ep bench --seconds), default 2
#     --strategies LIST    default "alltoall alltoall-ll allgather allreduce"
#     --delays LIST        one-way delay added per link (netem), default "0 50us 200us 1ms"
#     --rates LIST         link rate (tbf), default "none 1gbit 10gbit 25gbit"
#     --no-model           skip the whole-model decode (moe-ep bench-model)
#     --model-layers N     bench-model --layers, default 4
#     --quick              one delay and one rate (a functional check: 0 and 1gbit)
#     --out FILE           also write the table here
# Delays sweep at unshaped rate, rates sweep at no added delay. Kernels without
# sch_netem (CONFIG_NET_SCH_NETEM) skip the delay rows and say so.
#
# Measure on a quiet machine: every host here shares the same cores, so a number is an
# upper bound on what the network alone costs only when nothing else runs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
bin="${MOE_EP:-$root/build/moe-ep}"
bed="$here/netbed.sh"
hosts=2 shape=qwen3-30b-a3b tokens=1,16 seconds=2 strategies="alltoall alltoall-ll allgather allreduce"
delays="0 50us 200us 1ms" rates="none 1gbit 10gbit 25gbit" model=1 layers=4 out="" bench_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --strategies) strategies=$2; shift 2 ;;
    --delays) delays=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --no-model) model=0; shift ;;
    --model-layers) layers=$2; shift 2 ;;
    --quick) delays=0 rates="1gbit"; shift ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '2,23p' "$0"; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "bench_net: no moe-ep binary at $bin (build first, or set MOE_EP)"; exit 1; }
command -v jq >/dev/null || { echo "bench_net: needs jq"; exit 1; }
bash "$bed" check || exit $?

tmp=$(mktemp -d)
id=$(bash "$bed" up "$hosts")
trap 'bash "$bed" down "$id"; rm -rf "$tmp"' EXIT

has_netem=1
tc qdisc add dev "mb${id}h1" root netem delay 1us 2>/dev/null && tc qdisc del dev "mb${id}h1" root || has_netem=0

shape_links() {  # shape_links <delay> <rate>: every test host's link, both directions
  for i in $(seq 1 "$hosts"); do
    local ns
    ns=$(bash "$bed" host "$id" "$i")
    tc qdisc del dev "mb${id}h$i" root 2>/dev/null || true
    ip netns exec "$ns" tc qdisc del dev net0 root 2>/dev/null || true
    # A packet from host A to host B leaves through A's net0 and enters B through B's
    # root-side veth: two shaped queues per one-way trip, so each adds half the delay.
    # (The launch host h0 carries only mpirun's control traffic: left unshaped.)
    if [ "$1" != 0 ]; then
      local half
      half=$(awk -v d="$1" 'BEGIN { u = d; if (u ~ /ms$/) { sub(/ms$/, "", u); u *= 1000 } else sub(/us$/, "", u); printf "%gus", u / 2 }')
      tc qdisc add dev "mb${id}h$i" root netem delay "$half"
      ip netns exec "$ns" tc qdisc add dev net0 root netem delay "$half"
    elif [ "$2" != none ]; then
      tc qdisc add dev "mb${id}h$i" root tbf rate "$2" burst 256kb latency 50ms
      ip netns exec "$ns" tc qdisc add dev net0 root tbf rate "$2" burst 256kb latency 50ms
    fi
  done
}

conditions=()
for d in $delays; do
  if [ "$d" != 0 ] && [ "$has_netem" = 0 ]; then echo "bench_net: no sch_netem in this kernel: skipping delay $d"; continue; fi
  conditions+=("$d none")
done
for r in $rates; do [ "$r" != none ] && conditions+=("0 $r"); done

failed=0
table="$tmp/table.md"
{
  echo "| delay | rate | strategy | tokens | ms/call | comm ms | comm share | MB/rank | decode tok/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
} >"$table"
for c in "${conditions[@]}"; do
  read -r d r <<<"$c"
  shape_links "$d" "$r"
  for s in $strategies; do
    j="$tmp/layer.json"
    rm -f "$j"
    timeout -k 5 600 bash "$bed" mpirun "$id" "$hosts" 1 "$bin" bench --shape "$shape" --tokens "$tokens" \
      --seconds "$seconds" --ep "$hosts" --moe-comm "$s" --comm-timeout 120 --json "$j" $bench_args >"$tmp/layer.log" 2>&1 ||
      { echo "bench_net: bench failed ($d $r $s):"; tail -5 "$tmp/layer.log"; failed=1; continue; }
    dec="-"
    if [ "$model" = 1 ]; then
      mj="$tmp/model.json"
      rm -f "$mj"
      if timeout -k 5 600 bash "$bed" mpirun "$id" "$hosts" 1 "$bin" bench-model --layers "$layers" --vocab 32000 \
        --decode-batch 1 --decode-steps 16 --repeats 3 --prefill 64 --ep "$hosts" --moe-comm "$s" \
        --comm-timeout 120 --json "$mj" >"$tmp/model.log" 2>&1; then
        dec=$(jq -r '.decode[0].tokens_per_s | . * 10 | round / 10' "$mj")
      else
        dec="failed"; failed=1; echo "bench_net: bench-model failed ($d $r $s):" >&2; tail -5 "$tmp/model.log" >&2
      fi
    fi
    jq -r --arg d "$d" --arg r "$r" --arg s "$s" --arg dec "$dec" '.[] |
      "| \($d) | \($r) | \($s) | \(.tokens) | \(.ms_per_call * 1000 | round / 1000) | \(.comm_ms * 1000 | round / 1000) | \(if .ms_per_call > 0 then (.comm_ms / .ms_per_call * 100 | round | tostring) + " %" else "-" end) | \(.bytes_per_rank / 1e6 * 1000 | round / 1000) | \($dec) |"' \
      "$j" >>"$table"
  done
done
shape_links 0 none
echo
echo "moe-ep bench --shape $shape on $hosts netns hosts (one rank each, TCP), $(nproc) cores shared by all; decode: bench-model --layers $layers, batch 1, attention replicated (bench-model runs pure EP)"
cat "$table"
[ -n "$out" ] && cp "$table" "$out"
exit $failed
