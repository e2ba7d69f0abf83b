#!/usr/bin/env bash
# Multi-host tests on the network-namespace test bed (scripts/netbed.sh): N hosts,
# OpenMPI over TCP between them, and the one-rank output as the reference.
# usage: netbed_test.sh <moe-ep binary> <case>
#   hosts2|hosts3|hosts4  every --moe-comm strategy on `moe-ep layer`, one rank per host;
#                         alltoall/alltoall-ll bitwise equal to one rank, allreduce/allgather
#                         within 1e-5 (they sum partial outputs in another order); hosts3
#                         also compares `forward` logits bit for bit
#   per-host2             2 hosts x 2 ranks (shared memory inside a host, TCP between)
#   generate              `generate` tokens equal to one rank's, 3 hosts (and --attn-tp on 2)
#   dp                    --dp with uneven and empty replicas (layer and generate)
#   netem                 200 us delay + 0.1 % loss on every link (or tbf + nft drop without
#                         sch_netem): outputs unchanged
#   fault-link|fault-kill|fault-stop
#                         mid-generation, host 2's link goes down / its rank is SIGKILLed /
#                         frozen (SIGSTOP): every survivor reports the lost rank and host
#                         within --comm-timeout + 5 s, the job ends, no output file is left
#   fault-link-default-tcp|fault-kill-default-tcp|fault-stop-default-tcp
#                         the same with the kernel's TCP settings and OpenMPI's keepalive
#                         defaults, the job run under `moe-ep launch`
#   clock <shim.so>       every rank's wall clock jumps 1 h forward, then back, mid-generation
#                         (clock_jump.cpp, LD_PRELOAD): the bounded waits (steady_clock) notice
#                         nothing, --comm-timeout 2 does not fire, the tokens equal one rank's
#   bench-smoke           scripts/bench_net.sh --quick on a tiny layer prints its table row
#   wire <gen_big_checkpoint>
#                         scripts/bench_wire.sh on 2 hosts, a DeepSeek-V3-structured model: the
#                         bytes a decode step sends (net0 counters) within 10 % of `moe-ep
#                         plan`'s, for replicated, moe-tp, attn-tp and dp
#   skip-reason           the bed's check, run as nobody and as root without CAP_NET_ADMIN, says
#                         why and exits 77
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason where namespaces cannot be made.
set -euo pipefail
bin=$(readlink -f "$1")
case_=$2
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
bed="$root/scripts/netbed.sh"
fx="$root/tests/fixtures"

if [ "$case_" = skip-reason ]; then
  # As the nobody user: no root, no namespaces. The check must print why and exit 77.
  set +e
  if [ "$(id -u)" -eq 0 ]; then
    # nobody may not reach the checkout (a clone under root's 0700 home): it runs a copy
    # of the bed's script from a directory it can read, from /.
    pub=$(mktemp -d)
    chmod 755 "$pub"
    install -m 644 "$bed" "$pub/netbed.sh"
    out=$(cd / && setpriv --reuid=65534 --regid=65534 --clear-groups bash "$pub/netbed.sh" check 2>&1)
    rc=$?
    rm -rf "$pub"
  else
    out=$(bash "$bed" check 2>&1)
    rc=$?
  fi
  set -e
  echo "$out"
  [ "$rc" -eq 77 ] && grep -q "skipped: network namespaces need root" <<<"$out" ||
    { echo "netbed_test: FAIL: expected exit 77 with the reason, got $rc"; exit 1; }
  if [ "$(id -u)" -eq 0 ]; then
    # Root without CAP_NET_ADMIN (a container that drops it): the same, with the kernel's answer.
    set +e
    out=$(setpriv --bounding-set -net_admin --inh-caps -net_admin bash "$bed" check 2>&1)
    rc=$?
    set -e
    echo "$out"
    [ "$rc" -eq 77 ] && grep -q "skipped: cannot create" <<<"$out" ||
      { echo "netbed_test: FAIL: without CAP_NET_ADMIN expected exit 77 with the reason, got $rc"; exit 1; }
  fi
  echo "netbed_test: OK"; exit 0
fi

bash "$bed" check || exit $?

tmp=$(mktemp -d)
ids=()
cleanup() {
  for i in ${ids[@]+"${ids[@]}"}; do bash "$bed" down "$i"; done
  [ -n "${NETBED_KEEP:-}" ] && cp -r "$tmp" "$NETBED_KEEP"; rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

up() {  # up <hosts>: a new bed; its id in $id
  id=$(bash "$bed" up "$1")
  ids+=("$id")
}
fail() { echo "netbed_test: FAIL: $*"; exit 1; }

# Every run is bounded: a hang fails the test instead of blocking ctest.
bed_run() {  # bed_run <hosts> <ranks-per-host> <moe-ep args...>
  local n=$1 per=$2
  shift 2
  timeout -k 5 120 bash "$bed" mpirun "$id" "$n" "$per" "$bin" "$@"
}

model=$fx/deepseek_v3
layer_in=$model/golden/L1_T33_in.safetensors
layer_args=(layer --quiet --model "$model" --layer 1 --input "$layer_in" --dtype f32 --comm-timeout 60)

reference_layer() {
  [ -f "$tmp/one.safetensors" ] || "$bin" "${layer_args[@]}" --output "$tmp/one.safetensors"
}

check_layer() {  # check_layer <hosts> <per> <strategy> [extra flags...]
  local n=$1 per=$2 s=$3
  shift 3
  reference_layer
  local out="$tmp/ep.safetensors"
  rm -f "$out"
  bed_run "$n" "$per" "${layer_args[@]}" --output "$out" --ep $((n * per)) --moe-comm "$s" "$@" ||
    fail "layer --moe-comm $s on $n hosts x $per failed"
  case "$s" in
    alltoall|alltoall-ll)
      cmp -s "$out" "$tmp/one.safetensors" || fail "layer --moe-comm $s $* on $n hosts x $per: not bitwise equal to one rank" ;;
    *)
      "$bin" compare --atol 1e-5 --rtol 1e-5 "$out" "$tmp/one.safetensors" >/dev/null ||
        fail "layer --moe-comm $s on $n hosts x $per: outside 1e-5 of one rank" ;;
  esac
  echo "ok: layer --moe-comm $s $* on $n hosts x $per"
}

gen_model=$fx/qwen3_moe
gen_args=(generate --model "$gen_model" --prompt-ids "1,2,3;4,5,6,7;8" --max-new-tokens 12 --ignore-eos --comm-timeout 60)

tokens() { grep -E '^prompt [0-9]+:' || true; }

check_generate() {  # check_generate <hosts> <per> [flags...]
  local n=$1 per=$2
  shift 2
  [ -f "$tmp/gen_one.txt" ] || "$bin" "${gen_args[@]}" | tokens >"$tmp/gen_one.txt"
  [ -s "$tmp/gen_one.txt" ] || fail "the one-rank generate printed no tokens"
  bed_run "$n" "$per" "${gen_args[@]}" "$@" | tokens >"$tmp/gen_ep.txt" || fail "generate $* failed"
  diff "$tmp/gen_one.txt" "$tmp/gen_ep.txt" || fail "generate $* on $n hosts x $per: tokens differ from one rank"
  echo "ok: generate $* on $n hosts x $per"
}

strategies() {  # strategies <hosts> <per>
  for s in alltoall alltoall-ll allreduce allgather; do check_layer "$1" "$2" "$s"; done
}

# Fault cases: a long generation (it would run for minutes), the fault at 2 s.
timeout_s=3
fault_case() {  # fault_case link|kill|stop [default-tcp]
  local kind=$1 defaults=${2:-}
  # default-tcp: the kernel's TCP settings (tcp_retries2 15) and OpenMPI's keepalive
  # defaults, as on hosts nobody tuned, with the job run under `moe-ep launch`.
  local launch=()
  if [ -n "$defaults" ]; then
    export NETBED_TCP_RETRIES2=15 NETBED_KEEPALIVE="300 20 9"
    launch=("$bin" launch --grace 5 --)
  fi
  up 3
  local h2 out="$tmp/out.json" stamps="$tmp/stamps" faultt="$tmp/fault_time"
  h2=$(bash "$bed" host "$id" 2)
  local args=(generate --model "$gen_model" --prompt-ids "1,2,3;4,5,6;7,8" --max-new-tokens 100000 --ignore-eos
              --ep 3 --dp 3 --comm-timeout "$timeout_s" --quiet --output-json "$out")
  (
    sleep 2
    pid=""
    for p in $(ip netns pids "$h2"); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = moe-ep ] && pid=$p; done
    [ -n "$pid" ] || { echo "netbed_test: no moe-ep process on $h2 at the fault time (did the run end early?)"; exit 0; }
    date +%s.%3N >"$faultt"
    case "$kind" in
      link) ip link set "mb${id}h2" down ;;
      kill) kill -KILL "$pid" ;;
      stop) kill -STOP "$pid" ;;
    esac
    echo "netbed_test: fault '$kind' on $h2 (pid $pid) at $(cat "$faultt")"
  ) &
  local injector=$!
  local lost="rank 1 \\(host $h2\\)"
  local also=()
  case "$kind" in
    # mpirun sees the process die and ends the job at once, before the survivors' waits
    # time out: its message names the rank and the host.
    kill) pattern="rank 1 with PID [0-9]+ on node $h2 exited on signal 9" ;;
    # Every survivor reports the rank that does not answer.
    *) pattern="moe-ep: rank 0: .*Lost: $lost"; also=(--also "moe-ep: rank 2: .*Lost: $lost") ;;
  esac
  local limit=$((2 + timeout_s + 5 + 15))
  bash "$here/expect_fault.sh" --stamp "$stamps" --absent "$out" ${also[@]+"${also[@]}"} "$limit" "$pattern" \
    ${launch[@]+"${launch[@]}"} bash "$bed" mpirun "$id" 3 1 "$bin" "${args[@]}" || fail "fault '$kind'"
  wait "$injector" || true
  [ -f "$faultt" ] || fail "the fault was not injected (the run ended before it)"
  local tf end
  tf=$(cat "$faultt")
  # Reports within --comm-timeout + 5 s of the fault; the job ended (mpirun returned) within
  # --comm-timeout + 15 s (it must first learn over TCP that host 2's daemon is gone:
  # tcp_retries2 in scripts/netbed.sh; 6.5 s after --comm-timeout measured, margin for a loaded CI;
  # with default TCP settings, `moe-ep launch` ends it 5 s after the first report).
  if [ "$kind" != kill ]; then
    grep -E "moe-ep: rank [02]: .*Lost" "$stamps" | while read -r st _; do
      st=${st#[}; st=${st%]}
      awk -v a="$st" -v b="$tf" -v l="$timeout_s" 'BEGIN { exit !(a - b <= l + 5) }' ||
        { echo "netbed_test: FAIL: a report came $(awk -v a="$st" -v b="$tf" 'BEGIN{print a-b}') s after the fault"; exit 1; }
    done || exit 1
  fi
  end=$(date +%s.%3N)
  awk -v a="$end" -v b="$tf" -v l="$timeout_s" 'BEGIN { exit !(a - b <= l + 15) }' ||
    fail "the job ended $(awk -v a="$end" -v b="$tf" 'BEGIN{print a-b}') s after the fault"
  # No rank of the job may be left (a frozen or cut-off rank must end too).
  sleep 1
  for i in 1 2 3; do
    for p in $(ip netns pids "$(bash "$bed" host "$id" "$i")"); do
      [ "$(cat /proc/"$p"/comm 2>/dev/null)" = moe-ep ] && fail "a moe-ep rank (pid $p) is still running on host $i"
    done
  done
  echo "ok: fault '$kind'${defaults:+ ($defaults, under moe-ep launch)}: reports and end $(awk -v a="$end" -v b="$tf" 'BEGIN{print a-b}') s after the fault"
}

case "$case_" in
  hosts2) up 2; strategies 2 1 ;;
  hosts3)
    up 3; strategies 3 1
    f_args=(forward --quiet --model "$model" --prompt-ids "1,2,3,4,5;6,7,8" --comm-timeout 60)
    "$bin" "${f_args[@]}" --logits "$tmp/f_one.safetensors"
    for s in alltoall alltoall-ll; do
      bed_run 3 1 "${f_args[@]}" --logits "$tmp/f_ep.safetensors" --ep 3 --moe-comm "$s" || fail "forward $s"
      cmp -s "$tmp/f_one.safetensors" "$tmp/f_ep.safetensors" || fail "forward --moe-comm $s: logits not bitwise equal"
      echo "ok: forward --moe-comm $s logits bitwise equal on 3 hosts"
    done ;;
  hosts4) up 4; strategies 4 1 ;;
  per-host2)
    up 2
    for s in alltoall alltoall-ll allgather; do check_layer 2 2 "$s"; done
    check_generate 2 2 --ep 4 --moe-comm alltoall ;;
  generate)
    up 3
    check_generate 3 1 --ep 3 --moe-comm alltoall
    check_generate 3 1 --ep 3 --dp 3 --moe-comm auto
    # Attention TP over the EP group across hosts, and inside each of 2 hosts' replicas.
    check_generate 2 1 --ep 2 --attn-tp 2
    check_generate 2 2 --ep 4 --dp 2 --attn-tp 2 --moe-comm alltoall ;;
  dp)
    up 4
    check_layer 3 1 alltoall --dp 3 --dp-tokens 0,30,3
    check_layer 4 1 alltoall-ll --dp 4 --dp-tokens 5,0,28,0
    check_layer 4 1 allgather --dp 2 --dp-tokens 33,0
    # 3 prompts over 4 replicas: one replica holds none.
    check_generate 4 1 --ep 4 --dp 4 --moe-comm alltoall ;;
  netem)
    up 3
    # 200 us each way and 0.1 % loss with netem; kernels without sch_netem (CONFIG_NET_SCH_NETEM)
    # get what they have: a 1 Gbit/s token bucket (tbf) on every link and 0.1 % of each host's
    # packets dropped by nftables in its namespace (no added delay then).
    if tc qdisc add dev "mb${id}h1" root netem delay 200us loss 0.1% 2>/dev/null; then
      for i in 2 3; do tc qdisc add dev "mb${id}h$i" root netem delay 200us loss 0.1%; done
      echo "netbed_test: netem delay 200us loss 0.1% on every link"
    else
      command -v nft >/dev/null || { echo "netbed: skipped: no sch_netem in this kernel and no nft (nftables)"; exit 77; }
      for i in 1 2 3; do
        ns=$(bash "$bed" host "$id" "$i")
        { tc qdisc add dev "mb${id}h$i" root tbf rate 1gbit burst 64kb latency 5ms &&
          ip netns exec "$ns" nft add table inet moe &&
          ip netns exec "$ns" nft add chain inet moe out '{ type filter hook output priority 0; }' &&
          ip netns exec "$ns" nft add rule inet moe out numgen random mod 1000 0 drop; } ||
          { echo "netbed: skipped: no sch_netem in this kernel, and tbf or nftables failed too"; exit 77; }
      done
      echo "netbed_test: no sch_netem here: tbf 1gbit on every link and 0.1% random drop (nftables), no delay"
    fi
    check_layer 3 1 alltoall
    check_layer 3 1 allgather
    check_generate 3 1 --ep 3 --dp 3 --moe-comm alltoall-ll ;;
  clock)
    so=$(readlink -f "$3")
    up 3
    # The jumps come 0.3 s and 0.6 s after a rank's first clock read: the run must outlast
    # them. How long a run of n tokens takes depends on the machine, so a run that ends
    # within 1 s is repeated with twice the tokens (not a bet on this machine's speed).
    n=3000
    while :; do
      c_args=(generate --model "$gen_model" --prompt-ids "1,2,3;4,5,6;7,8" --max-new-tokens "$n" --ignore-eos)
      "$bin" "${c_args[@]}" | tokens >"$tmp/clock_one.txt"
      t0=$(date +%s%N)
      timeout -k 5 120 bash "$bed" mpirun "$id" 3 1 -x LD_PRELOAD="$so" -x CLOCK_JUMP_AT_S=0.3 -x CLOCK_JUMP_S=3600 -- \
        "$bin" "${c_args[@]}" --ep 3 --dp 3 --comm-timeout 2 | tokens >"$tmp/clock_ep.txt" ||
        fail "generate under clock jumps failed"
      ms=$(( ($(date +%s%N) - t0) / 1000000 ))
      [ "$ms" -ge 1000 ] && break
      [ "$n" -lt 48000 ] || fail "the run of $n tokens took $ms ms, too short to span both clock jumps"
      echo "netbed_test: $n tokens took $ms ms, under the 1 s the clock jumps need: again with $((2 * n))"
      n=$((2 * n))
    done
    diff -q "$tmp/clock_one.txt" "$tmp/clock_ep.txt" >/dev/null || fail "tokens differ from one rank under clock jumps"
    echo "ok: generate on 3 hosts across +1 h and -1 h wall-clock jumps ($ms ms), tokens equal one rank's" ;;
  bench-smoke)
    out=$(MOE_EP="$bin" bash "$root/scripts/bench_net.sh" --quick --no-model --strategies alltoall --tokens 1 \
            --seconds 0.05 --shape custom --bench-args "--hidden 64 --inter 32 --experts 8 --topk 2") ||
      fail "bench_net.sh failed: $out"
    echo "$out"
    grep -Eq '^\| 0 \| 1gbit \| alltoall \| 1 \| [0-9.]+ \| [0-9.]+ \|' <<<"$out" || fail "bench_net.sh printed no 1gbit alltoall row" ;;
  wire)
    # Bytes a decode step puts on the wire (each host's net0 counter, headers and ACKs
    # included) against `moe-ep plan`'s payload figure on 2 hosts, every layout: within
    # 10 % (measured 0.4-3.0 % over on this bed; docs/SCALE.md). The model: DeepSeek-V3's
    # structure (MLA, a dense first layer, grouped sigmoid routing, a shared expert) at
    # H 2048 with 16 small experts, written by tools/gen_big_checkpoint.cpp ($3).
    "$(readlink -f "$3")" --deepseek-v3 "$tmp/m" 3 16 2048 64 0 8000 16 >/dev/null
    out=$(MOE_EP="$bin" bash "$root/scripts/bench_wire.sh" --model "$tmp/m" --hosts 2 --steps "2 8" \
            --layouts "replicated moe-tp attn-tp dp") || fail "bench_wire.sh failed: $out"
    echo "$out"
    for layout in replicated moe-tp attn-tp dp; do
      r=$(awk -F'|' -v l="$layout" '$3 ~ " "l" " {gsub(/ /, "", $6); print $6}' <<<"$out")
      [ -n "$r" ] || fail "bench_wire.sh printed no $layout row"
      awk -v r="$r" 'BEGIN { exit !(r >= 0.9 && r <= 1.1) }' || fail "$layout: measured / plan = $r, outside [0.9, 1.1]"
    done ;;
  fault-link) fault_case link ;;
  fault-kill) fault_case kill ;;
  fault-stop) fault_case stop ;;
  fault-link-default-tcp) fault_case link default-tcp ;;
  fault-kill-default-tcp) fault_case kill default-tcp ;;
  fault-stop-default-tcp) fault_case stop default-tcp ;;
  *) echo "netbed_test: unknown case '$case_'"; exit 2 ;;
esac
echo "netbed_test: OK"
