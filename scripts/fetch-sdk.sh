#!/usr/bin/env bash
# A virtual environment with the OpenAI Python SDK (pinned), for the test that checks what the
# SDK assembles from this server's streams (tool calls). Idempotent; prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
venv="$cache/sdk-venv"
version=3.51.0
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$version')" 2>/dev/null; then
  echo "installing openai==$version into $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$version" >&2
fi
echo "$(cd "$venv/bin" && pwd)/python"
