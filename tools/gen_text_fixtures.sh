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

source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"

# Everything is built locally; never reach for the Hub.  One thread: deterministic and
# gentle on shared machines.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export CUDA_VISIBLE_DEVICES=""
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
"$VENV/bin/python" "$ROOT/tools/gen_text_fixtures.py" "$@"
if [ $# -eq 0 ]; then
    "$VENV/bin/python" "$ROOT/tools/gen_chat_fixtures.py"
fi
