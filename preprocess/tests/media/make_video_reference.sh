#!/usr/bin/env bash
# Reference frames for the video tests from an independent decoder, the ffmpeg CLI: for each
# test video, the frames at the listed indices as RGB24 PNGs in video_reference/ (frame index
# by decode order, `select=eq(n\,N)`, converted to RGB by the CLI's own swscale setup). The
# committed PNGs are what the tests read; rerun only when the videos change.
#
# Usage: bash make_video_reference.sh   (needs the ffmpeg CLI)
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p video_reference
frames() { # video, indices...
  local video=$1; shift
  for n in "$@"; do
    ffmpeg -hide_banner -loglevel error -y -i "$video" -vf "select=eq(n\,$n)" -vsync 0 \
      -frames:v 1 -pix_fmt rgb24 "video_reference/${video%.*}_${video##*.}_$n.png"
  done
}
frames testsrc_h264.mp4 0 6 25 49
for v in testsrc_mpeg4.mp4 testsrc_vp8.webm testsrc_vp9.webm testsrc_hevc.mp4 testsrc_h264.ts; do
  frames "$v" 0 12 24
done
