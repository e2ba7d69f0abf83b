#!/usr/bin/env bash
# A multi-host test bed on one machine: N "hosts" as network namespaces, each with
# its own hostname (UTS namespace, set by netbed_agent.sh) and address, joined by
# veth pairs on one bridge. OpenMPI runs over TCP between them, started through
# netbed_agent.sh (plm_rsh_agent), exactly as on real hosts over ssh.
#
#   netbed.sh check                      exit 0 if namespaces can be made here, else print why and exit 77
#   netbed.sh up <hosts>                 make a bed; prints its id (a number 1..250) on stdout
#   netbed.sh down <id>                  remove the bed (namespaces, veths, bridge); never fails
#   netbed.sh host <id> <i>              the name of host i (1-based): the namespace and the hostname
#   netbed.sh hostfile <id> <hosts> <slots>   an OpenMPI hostfile on stdout
#   netbed.sh mpirun <id> <hosts> <ranks-per-host> [mpirun args --] prog args...
#                                        mpirun over the bed's TCP network (no -np: hosts * ranks-per-host)
#   netbed.sh ns <id> <i>                the namespace of host i (same as host)
#
# Bed <id> uses the bridge mb<id>, namespaces moe<id>h<i> with interface
# net0 = 10.213.<id>.<i>/24 (h0 = .254: the launch host, where mpirun runs), and
# root-side veths mb<id>h<i>. The id is claimed atomically (creating the bridge fails if it
# exists), so parallel runs (ctest -j, several build trees) never share a bed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

subnet() { echo "10.213.$1"; }
host_name() { echo "moe$1h$2"; }

cmd=${1:-}
shift || true
case "$cmd" in
  check)
    if [ "$(id -u)" -ne 0 ]; then
      echo "netbed: skipped: network namespaces need root (CAP_NET_ADMIN); running as uid $(id -u)"; exit 77
    fi
    for t in ip unshare timeout mpirun; do
      command -v "$t" >/dev/null || { echo "netbed: skipped: '$t' is not installed (scripts/setup.sh installs iproute2)"; exit 77; }
    done
    probe="moeprobe$$"
    if ! err=$(ip netns add "$probe" 2>&1); then
      echo "netbed: skipped: cannot create a network namespace here: $err"; exit 77
    fi
    ip netns del "$probe" 2>/dev/null || true
    if ! err=$(ip link add "mbp$$" type bridge 2>&1); then
      echo "netbed: skipped: cannot create a bridge here: $err"; exit 77
    fi
    ip link del "mbp$$" 2>/dev/null || true
    if ! err=$(ip link add "mbv$$" type veth peer name "mbw$$" 2>&1); then
      echo "netbed: skipped: cannot create a veth pair here: $err"; exit 77
    fi
    ip link del "mbv$$" 2>/dev/null || true
    if ! err=$(unshare --uts true 2>&1); then
      echo "netbed: skipped: cannot create a UTS namespace here: $err"; exit 77
    fi
    exit 0 ;;
  up)
    n=$1
    [ "$n" -ge 1 ] && [ "$n" -le 16 ] || { echo "netbed up: 1..16 hosts, got '$n'" >&2; exit 2; }
    id=""
    start=$(( ($$ % 250) + 1 ))
    for k in $(seq 0 249); do
      c=$(( (start + k - 1) % 250 + 1 ))
      if ip link add "mb$c" type bridge 2>/dev/null; then id=$c; break; fi
    done
    [ -n "$id" ] || { echo "netbed up: no free bed id (bridges mb1..mb250 all exist)" >&2; exit 1; }
    # The rest in a child process: there `set -e` stops at the first failing command
    # (in this one it would not, inside an || list), and a partial bed is removed.
    bash "$0" _setup "$id" "$n" >&2 || { bash "$0" down "$id"; exit 1; }
    echo "$id" ;;
  _setup)
    id=$1 n=$2
    s=$(subnet "$id")
    ip link set "mb$id" up
    # The launch host (h0, 10.213.<id>.254): mpirun runs there, as on a login node.
    head=$(host_name "$id" 0)
    ip netns add "$head"
    ip link add "mb${id}h0" type veth peer name net0 netns "$head"
    ip link set "mb${id}h0" master "mb$id" up
    ip -n "$head" addr add "$s.254/24" dev net0
    ip -n "$head" link set net0 up
    ip -n "$head" link set lo up
    # After an abort mpirun waits for every daemon it sent the kill to until TCP gives
    # up on that connection: tcp_retries2 retransmissions (Linux default 15: ~15 min).
    # Measured here with a cut link and --comm-timeout 3 (fault-link test): the job
    # ended 7.8 / 9.5 / 12.8 s after the cut with 1 / 2 / 3. This netns only: see
    # docs/SCALE.md for real hosts.
    ip netns exec "$head" sysctl -q -w net.ipv4.tcp_retries2="${NETBED_TCP_RETRIES2:-2}" ||
      echo "netbed: warning: cannot set tcp_retries2 in the launch namespace: a job that lost a host may end only after TCP gives up (minutes)"
    for i in $(seq 1 "$n"); do
      ns=$(host_name "$id" "$i")
      ip netns add "$ns"
      ip link add "mb${id}h$i" type veth peer name net0 netns "$ns"
      ip link set "mb${id}h$i" master "mb$id" up
      ip -n "$ns" addr add "$s.$i/24" dev net0
      ip -n "$ns" link set net0 up
      ip -n "$ns" link set lo up
    done
    ;;
  down)
    id=$1
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^moe${id}h[0-9]+$" || true); do
      # Processes left in the namespace (a frozen rank) would keep it alive: kill them.
      for p in $(ip netns pids "$ns" 2>/dev/null || true); do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^mb${id}h[0-9]+$" || true); do
      ip link del "$l" 2>/dev/null || true
    done
    ip link del "mb$id" 2>/dev/null || true ;;
  host|ns) host_name "$1" "$2" ;;
  hostfile)
    for i in $(seq 1 "$2"); do echo "$(host_name "$1" "$i") slots=$3"; done ;;
  mpirun)
    id=$1 n=$2 per=$3
    shift 3
    hf=$(mktemp)
    "$0" hostfile "$id" "$n" "$per" >"$hf"
    mpi_args=()
    if printf '%s\n' "$@" | grep -qx -- '--'; then
      while [ "$1" != "--" ]; do mpi_args+=("$1"); shift; done
      shift
    fi
    s=$(subnet "$id")
    # mpirun learns that an idle daemon's host is gone only from TCP keepalive (default:
    # after 300 s idle, 9 probes 20 s apart). Here probes every 2 s, 4 missed: a lost host
    # is declared 8-10 s after it went, later than the ranks' own reports
    # (--comm-timeout + 3 s) in the fault tests. NETBED_KEEPALIVE="time intvl probes".
    read -r ka_time ka_intvl ka_probes <<<"${NETBED_KEEPALIVE:-2 2 4}"
    # tcp between hosts, vader (shared memory) between ranks of one host, as on real hosts.
    # oob/btl_tcp_if_include take the subnet: the interface is net0 in a namespace
    # but mb<id> where mpirun runs. No tree spawn: mpirun starts every daemon itself.
    rc=0
    MOE_NETBED_ID=$id ip netns exec "$(host_name "$id" 0)" mpirun --oversubscribe --allow-run-as-root \
      -np $((n * per)) --hostfile "$hf" --map-by "ppr:$per:node" \
      --mca plm_rsh_agent "$here/netbed_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
      --mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl" \
      --mca oob_tcp_keepalive_probes "$ka_probes" \
      --mca btl tcp,vader,self --mca btl_tcp_if_include "$s.0/24" --mca oob_tcp_if_include "$s.0/24" \
      -x OMP_WAIT_POLICY=PASSIVE -x OMPI_MCA_mpi_yield_when_idle=1 \
      ${mpi_args[@]+"${mpi_args[@]}"} "$@" || rc=$?
    rm -f "$hf"
    exit $rc ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
