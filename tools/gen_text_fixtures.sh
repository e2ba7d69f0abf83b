#!/usr/bin/env bash
# Regenerate the text fixtures in tests/fixtures/text/ (tokenizers, chat templates) and the
# talking model fixtures tests/fixtures/chat_qwen3/ and chat_deepseek_v3/.
#
# Developers only: the engine and its tests never need Python.  Creates (once) a venv at
# tools/.venv with pinned versions (shared with tools/gen_fixtures.sh), then runs
# tools/gen_text_fixtures.py and tools/gen_chat_fixtures.py.  Nothing is downloaded from
# the Hugging Face Hub: every tokenizer is trained here, every model is built from a config.
# Safe to rerun; the output is deterministic.  Extra arguments go to gen_text_fixtures.py
# only (e.g. --only qwen3 unigram while iterating; the chat models are then not rebuilt).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/tools/.venv"
PYTHON="${PYTHON:-python3}"

# Pinned: the versions the committed fixtures were generated and verified with.
TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.24.0
SAFETENSORS_VERSION=0.8.0
NUMPY_VERSION=2.4.6
TOKENIZERS_VERSION=0.23.3
JINJA2_VERSION=3.1.6
SENTENCEPIECE_VERSION=0.2.3
PROTOBUF_VERSION=7.36.2

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
fi

if ! "$VENV/bin/python" - "$TORCH_VERSION" "$TRANSFORMERS_VERSION" "$SAFETENSORS_VERSION" "$NUMPY_VERSION" \
        "$TOKENIZERS_VERSION" "$JINJA2_VERSION" "$SENTENCEPIECE_VERSION" "$PROTOBUF_VERSION" <<'PY' 2>/dev/null
import sys
import google.protobuf, jinja2, numpy, safetensors, sentencepiece, tokenizers, torch, transformers
want = sys.argv[1:]
have = [torch.__version__.split("+")[0], transformers.__version__, safetensors.__version__, numpy.__version__,
        tokenizers.__version__, jinja2.__version__, sentencepiece.__version__, google.protobuf.__version__]
sys.exit(0 if have == want else 1)
PY
then
    echo "installing pinned packages into $VENV"
    # The default PyPI torch wheel (CUDA build) is fine: the generators only use the CPU.
    "$VENV/bin/python" -m pip install --disable-pip-version-check \
        "torch==$TORCH_VERSION" \
        "transformers==$TRANSFORMERS_VERSION" \
        "safetensors==$SAFETENSORS_VERSION" \
        "numpy==$NUMPY_VERSION" \
        "tokenizers==$TOKENIZERS_VERSION" \
        "jinja2==$JINJA2_VERSION" \
        "sentencepiece==$SENTENCEPIECE_VERSION" \
        "protobuf==$PROTOBUF_VERSION"
fi

# Everything is built locally; never reach for the Hub.  One thread: deterministic and
# gentle on shared machines.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export CUDA_VISIBLE_DEVICES=""
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
"$VENV/bin/python" "$ROOT/tools/gen_text_fixtures.py" "$@"
if [ $# -eq 0 ]; then
    "$VENV/bin/python" "$ROOT/tools/gen_chat_fixtures.py"
fi
