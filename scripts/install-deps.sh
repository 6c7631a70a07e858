#!/usr/bin/env bash
# Install the system packages the build needs, where missing (Debian). Idempotent and quiet.
set -euo pipefail
need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need+=(python3 python3-pip)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# Virtual environments (the OpenAI SDK for its test): Debian splits ensurepip out.
python3 -c "import ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# Video decoding (preprocess's default `video` feature): FFmpeg's libraries, and libclang for
# ffmpeg-sys-next's bindgen.
for pc in libavcodec libavformat libavutil libswscale libswresample; do
  pkg-config --exists "$pc" 2>/dev/null || need+=("$pc-dev")
done
# libclang itself (libclang.so / libclang-N.so), not libclang-cpp, which other packages pull in.
[ -n "$(ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* 2>/dev/null | head -1)" ] || need+=(libclang-dev clang)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (install them, then retry)" >&2
    exit 1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
