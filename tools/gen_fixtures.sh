#!/usr/bin/env bash
# Regenerate the golden MoE fixtures in tests/fixtures/ from Hugging Face transformers.
#
# Developers only: the engine and its tests never need Python.  Creates (once) a venv at
# tools/.venv with pinned versions, then runs tools/gen_fixtures.py.  Safe to rerun: the
# venv is reused when the pinned versions are already installed, and each fixture
# directory is rewritten from scratch.  Extra arguments go to gen_fixtures.py
# (e.g. --only qwen3_moe while iterating).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/tools/.venv"
PYTHON="${PYTHON:-python3}"

# Pinned: the versions the committed fixtures were generated and verified with.
TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.24.0
SAFETENSORS_VERSION=0.8.0
NUMPY_VERSION=2.4.6

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
fi

if ! "$VENV/bin/python" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$SAFETENSORS_VERSION" "$NUMPY_VERSION" <<'PY' 2>/dev/null
import sys
import numpy, safetensors, torch, transformers
want = sys.argv[1:]
have = [torch.__version__.split("+")[0], transformers.__version__, safetensors.__version__, numpy.__version__]
sys.exit(0 if have == want else 1)
PY
then
    echo "installing pinned packages into $VENV"
    # The default PyPI torch wheel (CUDA build) is fine: the generator only uses the CPU.
    "$VENV/bin/python" -m pip install --disable-pip-version-check \
        "torch==$TORCH_VERSION" \
        "transformers==$TRANSFORMERS_VERSION" \
        "safetensors==$SAFETENSORS_VERSION" \
        "numpy==$NUMPY_VERSION"
fi

# Everything is built from configs; never reach for the Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export CUDA_VISIBLE_DEVICES=""
exec "$VENV/bin/python" "$ROOT/tools/gen_fixtures.py" "$@"
