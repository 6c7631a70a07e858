#!/usr/bin/env bash
# Regenerates the tiny test videos next to this script with the ffmpeg CLI.
# The committed files are what the tests read; rerun only to change them.
#
#   testsrc_h264.mp4   160x120, 2 s at 25 fps (50 frames), H.264 (libx264, B-frames, GOP 12)
#   testsrc_mpeg4.mp4  64x48, 1 s at 25 fps (25 frames), MPEG-4 part 2
#   testsrc_vp8.webm   64x48, 1 s at 25 fps (25 frames), VP8
#   testsrc_vp9.webm   64x48, 1 s at 25 fps (25 frames), VP9
#   testsrc_hevc.mp4   64x48, 1 s at 25 fps (25 frames), HEVC (libx265, B-frames, closed GOP 10)
#   testsrc_h264.ts    64x48, 1 s at 25 fps (25 frames), H.264 Annex B in MPEG-TS (GOP 10)
#
# Usage: bash make_video_media.sh   (needs ffmpeg with libx264, libx265 and libvpx)
set -euo pipefail
cd "$(dirname "$0")"

common=(-hide_banner -loglevel error -y)
out=(-map_metadata -1 -fflags +bitexact -flags:v +bitexact)

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=160x120:rate=25:duration=2 \
    -c:v libx264 -preset medium -crf 30 -g 12 -bf 3 -pix_fmt yuv420p "${out[@]}" \
    -movflags +faststart testsrc_h264.mp4

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=64x48:rate=25:duration=1 \
    -c:v mpeg4 -q:v 8 -g 10 -bf 2 -pix_fmt yuv420p "${out[@]}" testsrc_mpeg4.mp4

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=64x48:rate=25:duration=1 \
    -c:v libvpx -b:v 200k -g 10 -pix_fmt yuv420p "${out[@]}" testsrc_vp8.webm

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=64x48:rate=25:duration=1 \
    -c:v libvpx-vp9 -b:v 200k -g 10 -pix_fmt yuv420p "${out[@]}" testsrc_vp9.webm

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=64x48:rate=25:duration=1 \
    -c:v libx265 -preset fast -crf 30 -g 10 -bf 3 -x265-params log-level=error:open-gop=0 \
    -pix_fmt yuv420p -tag:v hvc1 "${out[@]}" testsrc_hevc.mp4

ffmpeg "${common[@]}" -f lavfi -i testsrc=size=64x48:rate=25:duration=1 \
    -c:v libx264 -preset medium -crf 30 -g 10 -bf 2 -pix_fmt yuv420p "${out[@]}" testsrc_h264.ts

ls -l testsrc_*
