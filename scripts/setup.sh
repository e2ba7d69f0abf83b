#!/usr/bin/env bash
# Installs what moe-ep needs to build and test, from Debian packages only.
# Idempotent: when every package is already there it changes nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake
  libfmt-dev nlohmann-json3-dev libcli11-dev   # formatting, JSON, command line
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and micro-benchmarks
  libopenmpi-dev openmpi-bin                   # ranks (expert parallelism)
  libonig-dev libutf8proc-dev                  # tokenizer regexes (as HF tokenizers), Unicode normalisation
  libsentencepiece-dev                         # tokenizer.model (SentencePiece) files
  libcpp-httplib-dev curl jq                   # moe-ep serve (HTTP); the client and JSON tool its tests use
  iproute2 nftables util-linux                 # the multi-host test bed: network namespaces, veths, tc, packet loss
  procps                                       # sysctl (the bed's TCP timeouts), pgrep/pkill (serve tests)
  time                                         # GNU time: peak RSS in tools/bench_model_load.sh
  clang libclang-rt-14-dev                     # libFuzzer targets (text layer, safetensors, shard index, configs)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
