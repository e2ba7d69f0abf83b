#!/usr/bin/env bash
# Regenerate the golden MoE fixtures in tests/fixtures/ from Hugging Face transformers.
#
# Developers only: the engine and its tests never need Python.  Creates (once) a venv at
# tools/.venv with pinned versions, then runs tools/gen_fixtures.py.  Safe to rerun: the
# venv is reused when the pinned versions are already installed, and each fixture
# directory is rewritten from scratch.  Extra arguments go to gen_fixtures.py
# (e.g. --only qwen3_moe while iterating; then the FP8 copies are left as they are).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

# Everything is built from configs; never reach for the Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export CUDA_VISIBLE_DEVICES=""
"$VENV/bin/python" "$ROOT/tools/gen_fixtures.py" "$@"
# The FP8 block-quantised copies (tools/gen_fp8_fixtures.py) are made from the float
# fixtures just written and appended to the manifest, which gen_fixtures.py rewrote.
if [ $# -eq 0 ]; then
    "$VENV/bin/python" "$ROOT/tools/gen_fp8_fixtures.py"
fi
