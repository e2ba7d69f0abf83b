# Sourced by the fixture generators (tools/gen_fixtures.sh, tools/gen_text_fixtures.sh):
# creates (once) the venv at tools/.venv with the pinned versions the committed fixtures
# were generated and verified with, and sets ROOT, VENV. Developers only: the engine and
# its tests never need Python.
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

