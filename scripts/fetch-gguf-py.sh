#!/usr/bin/env bash
# A virtual environment with the `gguf` package (llama.cpp's Python reader and reference
# quantisers, on numpy) at a pinned version, for scripts/make_quant_fixtures.py. Small (numpy
# and gguf, about 40 MB installed). Idempotent; prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
venv="$cache/gguf-venv"
gguf=0.19.0
numpy=2.4.6
if ! "$venv/bin/python" -c "
import sys, gguf, numpy
from importlib.metadata import version
sys.exit(version('gguf') != '$gguf' or numpy.__version__ != '$numpy')
" 2>/dev/null; then
  echo "installing gguf==$gguf numpy==$numpy into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "gguf==$gguf" "numpy==$numpy" >&2
fi
echo "$(cd "$venv/bin" && pwd)/python"
