#!/usr/bin/env bash
# Fetch NVRTC (the CUDA 13.0 runtime compiler, the version the GPU machines run) from its PyPI
# wheel, pinned by sha256, into models-cache/nvrtc/. The tests compile every CUDA kernel with it
# for sm_90, so a kernel that does not compile fails the test run; no GPU is needed for that.
# Idempotent. Prints the library folder to put on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MODELS_CACHE:-models-cache}"
wheel=nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
sum=ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
lib="$cache/nvrtc/nvidia/cu13/lib"
if [ ! -e "$lib/libnvrtc.so.13" ]; then
  mkdir -p "$cache/wheels"
  if [ ! -f "$cache/wheels/$wheel" ] || ! echo "$sum  $cache/wheels/$wheel" | sha256sum -c --quiet - 2>/dev/null; then
    echo "fetching nvidia-cuda-nvrtc==13.0.88" >&2
    rm -f "$cache/wheels/$wheel"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --platform manylinux_2_12_x86_64 -d "$cache/wheels" nvidia-cuda-nvrtc==13.0.88
  fi
  echo "$sum  $cache/wheels/$wheel" | sha256sum -c --quiet - || { echo "sha256 mismatch for $wheel" >&2; exit 1; }
  python3 - "$cache/wheels/$wheel" "$cache/nvrtc" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nvidia/cu13/lib/lib") and ".alt." not in n])
PY
  test -e "$lib/libnvrtc.so.13" || { echo "the wheel did not contain libnvrtc.so.13" >&2; exit 1; }
fi
cd "$lib" && pwd
