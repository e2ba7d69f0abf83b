#!/usr/bin/env bash
# Installs what moe-ep needs to build and test: Debian packages, and xgrammar (the
# structured-output grammar engine of vLLM, SGLang and TensorRT-LLM), which Debian does
# not package: a pinned release built from its source archive on PyPI (checksum
# checked), C++ library only, installed under $MOE_DEPS (default /opt/moe-ep-deps),
# outside the repository. Idempotent: when everything is there it changes nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config             # compilers; pkg-config finds the -dev libraries for CMake
  libfmt-dev nlohmann-json3-dev libcli11-dev   # formatting, JSON, command line
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and micro-benchmarks
  libopenmpi-dev openmpi-bin                   # ranks (expert parallelism)
  libonig-dev libutf8proc-dev                  # tokenizer regexes (as HF tokenizers), Unicode normalisation
  libsentencepiece-dev                         # tokenizer.model (SentencePiece) files
  libre2-dev                                   # quantization_config's module regexes (linear time)
  libcpp-httplib-dev curl jq                   # moe-ep serve (HTTP); the client and JSON tool its tests use
  iproute2 nftables util-linux                 # the multi-host test bed: network namespaces, veths, tc, packet loss
  procps                                       # sysctl (the bed's TCP timeouts), pgrep/pkill (serve tests)
  time                                         # GNU time: peak RSS in tools/bench_model_load.sh
  clang libclang-rt-14-dev                     # libFuzzer targets (text layer, safetensors, shard index, configs)
  python3-pip ca-certificates                  # fetches xgrammar's source archive (below)
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

# xgrammar: pinned version and the SHA-256 of its sdist. The build takes about a minute on
# 2 cores. CMakeLists.txt finds it under $MOE_DEPS/xgrammar-<version>.
XGRAMMAR_VERSION=0.2.8
XGRAMMAR_SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
MOE_DEPS="${MOE_DEPS:-/opt/moe-ep-deps}"
XG_PREFIX="$MOE_DEPS/xgrammar-$XGRAMMAR_VERSION"
if [ -f "$XG_PREFIX/.complete" ]; then
  echo "setup: xgrammar $XGRAMMAR_VERSION present ($XG_PREFIX)"
else
  echo "setup: building xgrammar $XGRAMMAR_VERSION (C++ library) into $XG_PREFIX"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # --no-binary for xgrammar only: the source archive, never a wheel. pip also prepares
  # the archive's metadata, which fetches its build backend as wheels (seconds).
  python3 -m pip download --quiet --no-deps --no-binary xgrammar "xgrammar==$XGRAMMAR_VERSION" -d "$work"
  archive="$work/xgrammar-$XGRAMMAR_VERSION.tar.gz"
  echo "$XGRAMMAR_SHA256  $archive" | sha256sum --check --quiet -
  tar -xzf "$archive" -C "$work"
  src="$work/xgrammar-$XGRAMMAR_VERSION"
  # The release's cmake/config.cmake turns the Python bindings on; a config.cmake in the
  # build directory takes precedence: C++ library only, no tests, no tracing.
  mkdir -p "$work/build"
  printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\nset(XGRAMMAR_ENABLE_CPPTRACE OFF)\nset(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)\nset(XGRAMMAR_ENABLE_COVERAGE OFF)\n' \
    > "$work/build/config.cmake"
  # -fno-lto: a static library of plain objects links into any of our builds (Release,
  # sanitizer, the clang fuzzers); -Wno-error: a newer warning must not stop the build.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$XG_PREFIX" \
    -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" >/dev/null
  cmake --build "$work/build" -j"$(nproc)" >/dev/null
  cmake --install "$work/build" >/dev/null
  cp "$src/LICENSE" "$XG_PREFIX/LICENSE"
  touch "$XG_PREFIX/.complete"
  rm -rf "$work"
  trap - EXIT
  echo "setup: xgrammar $XGRAMMAR_VERSION installed"
fi
