#!/usr/bin/env bash
# Media preprocessing benchmark: ours against the Python pipelines a vLLM deployment runs, same
# machine, same run, back to back, on the anchor inputs in ../shared/anchors/data/:
#   image  image_preprocess_bench.py (Pillow, HF processors; 1 thread)  vs  image_bench (1 thread)
#   video  video_sample_bench.py (vLLM's OpenCV loader; 2 threads)      vs  video_bench (2 threads)
#   audio  audio_mel_bench.py (soundfile + soxr + numpy; 1 thread)      vs  audio_bench (1 thread)
# Needs the anchors' venvs (../shared/anchors/setup_venvs.sh; paths overridable as there).
#   bench/media.sh [passes, default 2] > results.jsonl      (progress on stderr)
set -euo pipefail
cd "$(dirname "$0")/.."
passes="${1:-2}"
anchors="../shared/anchors"
ANCHORS_VENV="${ANCHORS_VENV:-${TMPDIR:-/tmp}/anchors-venv}"
TORCH_VENV="${TORCH_VENV:-${TMPDIR:-/tmp}/anchors-torch-venv}"
scripts/install-deps.sh
cargo build --release -q -p preprocess --example image_bench --example video_bench --example audio_bench
t="${CARGO_TARGET_DIR:-target}/release/examples"
data="$anchors/data"
for pass in $(seq 1 "$passes"); do
  echo "pass $pass: image" >&2
  "$TORCH_VENV/bin/python" "$anchors/image_preprocess_bench.py" --image "$data/photo_1280x960_q90.jpg"
  "$t/image_bench" "$data/photo_1280x960_q90.jpg" --images 50 --runs 5
  echo "pass $pass: video" >&2
  "$ANCHORS_VENV/bin/python" "$anchors/video_sample_bench.py" --video "$data/video_720p30_10s.mp4"
  "$t/video_bench" "$data/video_720p30_10s.mp4"
  echo "pass $pass: audio" >&2
  "$ANCHORS_VENV/bin/python" "$anchors/audio_mel_bench.py" --audio "$data/audio_30s_44k1_stereo.mp3"
  "$t/audio_bench" "$data/audio_30s_44k1_stereo.mp3"
done
