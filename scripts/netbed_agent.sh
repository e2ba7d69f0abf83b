#!/usr/bin/env bash
# OpenMPI's plm_rsh_agent for the netbed.sh test bed: called as ssh would be,
#   netbed_agent.sh <host> <command words...>
# it runs the command (an orted start, in shell syntax, as ssh would hand it to the
# remote shell) inside the host's network namespace, with its own hostname.
set -eu
host=$1
shift
# Options OpenMPI may put before the host for ssh-like agents are not used: plain agent.
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
