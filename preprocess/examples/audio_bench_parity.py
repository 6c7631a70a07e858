#!/usr/bin/env python3
"""Compares audio_bench's features with the Python anchor's numpy pipeline on the same file.

    cargo run --release -p preprocess --example audio_bench -- AUDIO.mp3 \
        --dump-features feats.f32 --dump-audio mono16k.f32
    python preprocess/examples/audio_bench_parity.py ../shared/anchors AUDIO.mp3 feats.f32 mono16k.f32

Needs numpy, soundfile and soxr (the anchor's own requirements). Reports, as one JSON line:
  features_max_abs_diff / features_mean_abs_diff: our 80x3000 log-mel against the anchor's numpy_ref
      pipeline (soundfile decode, channel mean, soxr HQ, numpy log-mel) end to end;
  mel_only_max_abs_diff: the anchor's numpy log-mel of OUR 16 kHz audio against our log-mel, which
      isolates the log-mel from decoder and resampler differences;
  audio_rms_diff / audio_rms: our 16 kHz samples against soundfile + soxr HQ (same length).
"""
import json
import sys

import numpy as np


def main():
    anchors, audio_path, feats_path, mono_path = sys.argv[1:5]
    sys.path.insert(0, anchors)
    import audio_mel_bench as anchor  # noqa: E402
    import soundfile as sf
    import soxr

    a, sr = sf.read(audio_path, dtype="float32", always_2d=True)
    ref_audio = soxr.resample(a.mean(axis=1), sr, anchor.SR, quality="HQ").astype(np.float32)
    ref = anchor.log_mel(ref_audio)
    ours = np.fromfile(feats_path, dtype="<f4").reshape(ref.shape)
    our_audio = np.fromfile(mono_path, dtype="<f4")
    mel_only = anchor.log_mel(our_audio)
    n = min(len(our_audio), len(ref_audio))
    d = np.abs(ours - ref)
    print(json.dumps({
        "shape": list(ref.shape),
        "features_max_abs_diff": float(d.max()),
        "features_mean_abs_diff": float(d.mean()),
        "features_p99_abs_diff": float(np.percentile(d, 99)),
        "mel_only_max_abs_diff": float(np.abs(mel_only - ours).max()),
        "audio_samples": [len(our_audio), len(ref_audio)],
        "audio_rms_diff": float(np.sqrt(np.mean((our_audio[:n] - ref_audio[:n]) ** 2))),
        "audio_rms": float(np.sqrt(np.mean(ref_audio ** 2))),
    }))


if __name__ == "__main__":
    main()
