#!/usr/bin/env bash
# A virtual environment with torch and transformers at the GPU machine's versions (pinned), for
# `scripts/gpu-check.sh --dry-run`: its models, parity and bench sections run
# scripts/gpu_reference.py here on the CPU as they run it there on the GPU. PyPI has no CPU-only
# torch for Linux, so this pulls the CUDA build with its NVIDIA libraries (about 3 GB down,
# 5 GB installed), which import and compute on the CPU without a driver. Idempotent; prints the
# interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
venv="$cache/torch-venv"
torch=2.11.0
transformers=5.17.0
if ! "$venv/bin/python" -c "
import sys, torch, transformers
sys.exit(torch.__version__.split('+')[0] != '$torch' or transformers.__version__ != '$transformers')
" 2>/dev/null; then
  echo "installing torch==$torch transformers==$transformers into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  # No wheel cache: it would keep a second copy of the 3 GB download.
  "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
    "torch==$torch" "transformers==$transformers" >&2
fi
echo "$(cd "$venv/bin" && pwd)/python"
