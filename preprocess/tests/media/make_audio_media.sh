#!/usr/bin/env bash
# Makes the tiny audio files the decode tests read (sine tones, a few KB each).
# Run from anywhere; writes next to this script. Needs the ffmpeg CLI (with libmp3lame and
# libvorbis). The outputs are committed, so this only needs re-running to change them.
#
# Every file holds a sine at a known frequency so tests can check what decoded, not only
# that something did:
#   tone_440hz_16k_mono.wav      0.5 s, 16 kHz,   mono,   PCM s16le
#   tone_1khz_8k_stereo.wav      0.5 s, 8 kHz,    stereo, PCM s16le (right channel silent)
#   tone_440hz_44k1_stereo.mp3   1.0 s, 44.1 kHz, stereo, MP3 48 kbit/s
#   tone_440hz_22k05_mono.flac   0.5 s, 22.05 kHz, mono,  FLAC
#   tone_440hz_44k1_stereo.ogg   1.0 s, 44.1 kHz, stereo, Vorbis q0
#   tone_440hz_24k_mono.m4a      1.0 s, 24 kHz,   mono,   AAC-LC 32 kbit/s in MP4
#   tone_440hz_16k_noxing.mp3    1.0 s, 16 kHz,   mono,   MP3 32 kbit/s without a Xing/Info
#                                header, so the stream declares no length (the decode-time cap)
set -euo pipefail
cd "$(dirname "$0")"

ff() { ffmpeg -hide_banner -loglevel error -y "$@"; }
common=(-map_metadata -1 -fflags +bitexact -flags:a +bitexact)

ff -f lavfi -i "sine=frequency=440:sample_rate=16000:duration=0.5" \
   "${common[@]}" -c:a pcm_s16le tone_440hz_16k_mono.wav
# Left: 1 kHz sine; right: silence, so the mean of the channels is half the left channel.
ff -f lavfi -i "sine=frequency=1000:sample_rate=8000:duration=0.5" \
   -f lavfi -i "anullsrc=channel_layout=mono:sample_rate=8000" \
   -filter_complex "[0:a][1:a]amerge=inputs=2,atrim=duration=0.5[a]" -map "[a]" \
   "${common[@]}" -c:a pcm_s16le -ac 2 tone_1khz_8k_stereo.wav
ff -f lavfi -i "sine=frequency=440:sample_rate=44100:duration=1" -ac 2 \
   "${common[@]}" -c:a libmp3lame -b:a 48k tone_440hz_44k1_stereo.mp3
ff -f lavfi -i "sine=frequency=440:sample_rate=22050:duration=0.5" \
   "${common[@]}" -c:a flac tone_440hz_22k05_mono.flac
ff -f lavfi -i "sine=frequency=440:sample_rate=44100:duration=1" -ac 2 \
   "${common[@]}" -c:a libvorbis -q:a 0 tone_440hz_44k1_stereo.ogg
ff -f lavfi -i "sine=frequency=440:sample_rate=24000:duration=1" \
   "${common[@]}" -c:a aac -b:a 32k tone_440hz_24k_mono.m4a
ff -f lavfi -i "sine=frequency=440:sample_rate=16000:duration=1" \
   "${common[@]}" -c:a libmp3lame -b:a 32k -write_xing 0 tone_440hz_16k_noxing.mp3

ls -l tone_*
