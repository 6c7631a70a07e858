#!/usr/bin/env python3
"""Writes audio_reference.json: reference numbers for the Whisper log-mel tests in
preprocess/tests/audio.rs.

Needs numpy and librosa; transformers (WhisperFeatureExtractor, numpy backend) is used when it
is importable. Run: python3 gen_audio_reference.py   (writes next to this script)

The input is a deterministic synthetic signal the Rust test rebuilds from the same formula
(computed in float64, then rounded to float32), 1.5 s at 16 kHz, so the 30 s window is mostly
zero padding as in real requests:
    x[n] = 0.5 sin(2 pi 440 t) + 0.25 sin(2 pi 2500 t + 0.3)
         + 0.1 sin(2 pi (200 t + (6000 - 200) / (2 * 1.5) t^2)),   t = n / 16000

Recorded for n_mels 80 and 128:
  filterbank: librosa.filters.mel(sr=16000, n_fft=400, n_mels, htk=False, norm="slaney"):
              each row's sum, maximum and argmax, and a few sampled entries;
  log_mel:    the WhisperFeatureExtractor features (80 or 128 x 3000): the global maximum,
              a grid of (mel bin, frame) values, every row's mean and the first 200 frames'
              column means; also the max abs difference between the feature extractor and an
              independent numpy implementation of openai-whisper's log_mel_spectrogram.
"""
import json
import os

import numpy as np
import librosa

SR, N_FFT, HOP, CHUNK = 16000, 400, 160, 30
N_SAMPLES = SR * CHUNK
SECONDS = 1.5


def signal():
    n = np.arange(int(SR * SECONDS), dtype=np.float64)
    t = n / SR
    chirp_phase = 2 * np.pi * (200.0 * t + (6000.0 - 200.0) / (2 * SECONDS) * t * t)
    x = (0.5 * np.sin(2 * np.pi * 440.0 * t) + 0.25 * np.sin(2 * np.pi * 2500.0 * t + 0.3)
         + 0.1 * np.sin(chirp_phase))
    return x.astype(np.float32)


def numpy_log_mel(audio, filters):
    """openai-whisper's log_mel_spectrogram, written with numpy (float64 STFT)."""
    x = np.zeros(N_SAMPLES, dtype=np.float64)
    n = min(len(audio), N_SAMPLES)
    x[:n] = audio[:n]
    xp = np.pad(x, (N_FFT // 2, N_FFT // 2), mode="reflect")
    n_frames = 1 + (len(xp) - N_FFT) // HOP
    frames = np.stack([xp[i * HOP:i * HOP + N_FFT] for i in range(n_frames)])
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    spec = np.fft.rfft(frames * window, axis=1)
    power = (np.abs(spec) ** 2)[:-1]
    mel = filters.astype(np.float64) @ power.T
    ls = np.log10(np.maximum(mel, 1e-10))
    ls = np.maximum(ls, ls.max() - 8.0)
    return (ls + 4.0) / 4.0


def r(v):
    return float(np.round(float(v), 8))


def main():
    x = signal()
    out = {
        "generator": "gen_audio_reference.py",
        "versions": {"numpy": np.__version__, "librosa": librosa.__version__},
        "signal": {"sample_rate": SR, "seconds": SECONDS, "samples": len(x)},
        "filterbank": {},
        "log_mel": {},
    }
    try:
        import transformers
        from transformers import WhisperFeatureExtractor
        out["versions"]["transformers"] = transformers.__version__
    except ImportError:
        WhisperFeatureExtractor = None

    for n_mels in (80, 128):
        fb = librosa.filters.mel(sr=SR, n_fft=N_FFT, n_mels=n_mels, htk=False, norm="slaney")
        samples = []
        for m in range(0, n_mels, 7):
            nz = np.nonzero(fb[m])[0]
            for k in (nz[0], nz[len(nz) // 2], nz[-1]) if len(nz) else ():
                samples.append([m, int(k), r(fb[m, k])])
        out["filterbank"][str(n_mels)] = {
            "shape": list(fb.shape),
            "row_sums": [r(s) for s in fb.sum(axis=1)],
            "row_max": [r(s) for s in fb.max(axis=1)],
            "row_argmax": [int(a) for a in fb.argmax(axis=1)],
            "samples": samples,
        }

        ours = numpy_log_mel(x, fb)
        if WhisperFeatureExtractor is not None:
            fe = WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=SR, hop_length=HOP,
                                         chunk_length=CHUNK, n_fft=N_FFT)
            feats = fe(x, sampling_rate=SR, return_tensors="np")["input_features"][0]
            source = "transformers WhisperFeatureExtractor (numpy backend)"
        else:
            feats = ours.astype(np.float32)
            source = "numpy_log_mel in this script"
        bins = [b for b in (0, 1, 5, 17, 33, 40, 57, 79, 100, 127) if b < n_mels]
        frames = [0, 1, 2, 50, 99, 100, 148, 149, 150, 151, 152, 160, 1000, 2998, 2999]
        out["log_mel"][str(n_mels)] = {
            "source": source,
            "shape": list(feats.shape),
            "numpy_vs_source_max_abs_diff": float(np.abs(ours - feats).max()),
            "global_max": r(feats.max()),
            "mel_bins": bins,
            "frames": frames,
            "values": [[r(feats[b, f]) for f in frames] for b in bins],
            "row_means": [r(v) for v in feats.mean(axis=1, dtype=np.float64)],
            "frame_means_first_200": [r(v) for v in feats[:, :200].mean(axis=0, dtype=np.float64)],
        }

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "audio_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
