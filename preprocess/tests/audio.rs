//! Audio: decoding every supported format, refusing bad input without a panic,
//! resampling, and the Whisper log-mel against a numpy/librosa reference.
//!
//! The media under tests/media/ come from `make_audio_media.sh`; the reference
//! numbers in `audio_reference.json` from `gen_audio_reference.py`.
// Test helpers (outside #[test] functions) unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use preprocess::audio::{
    audio_to_features, decode_audio, resample, AudioError, AudioIoOptions, DecodedAudio, LogMel,
    WhisperFeatureConfig, WHISPER_SAMPLE_RATE,
};
use serde_json::Value;

/// Log-mel values are log10(power) / 4; 1e-4 is a relative power error of about 0.1 %.
const LOG_MEL_TOL: f64 = 1e-4;
/// Filterbank weights (librosa computes them in f64 and stores f32).
const FILTER_TOL: f64 = 1e-6;

fn media(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/media")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn reference() -> Value {
    serde_json::from_slice(&media("audio_reference.json")).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// The generator script's signal, rebuilt from the same formula.
fn reference_signal() -> Vec<f32> {
    let (sr, seconds) = (16_000.0f64, 1.5f64);
    let pi = std::f64::consts::PI;
    (0..24_000)
        .map(|n| {
            let t = n as f64 / sr;
            let chirp = 2.0 * pi * (200.0 * t + (6000.0 - 200.0) / (2.0 * seconds) * t * t);
            (0.5 * (2.0 * pi * 440.0 * t).sin()
                + 0.25 * (2.0 * pi * 2500.0 * t + 0.3).sin()
                + 0.1 * chirp.sin()) as f32
        })
        .collect()
}

fn decode(name: &str) -> DecodedAudio {
    decode_audio(&media(name), None, &AudioIoOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Frequency from upward zero crossings over the middle of the signal.
fn frequency(samples: &[f32], rate: u32) -> f64 {
    let mid = &samples[samples.len() / 5..samples.len() * 4 / 5];
    let ups: Vec<usize> = mid
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] < 0.0 && w[1] >= 0.0)
        .map(|(i, _)| i)
        .collect();
    let (first, last) = (ups[0], *ups.last().unwrap());
    (ups.len() - 1) as f64 * f64::from(rate) / (last - first) as f64
}

fn rms(samples: &[f32]) -> f64 {
    (samples.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / samples.len() as f64).sqrt()
}

// ---- numeric parity -------------------------------------------------------------------------

#[test]
fn filterbank_matches_librosa() {
    let reference = reference();
    for n_mels in [80usize, 128] {
        let r = &reference["filterbank"][n_mels.to_string()];
        let fb = WhisperFeatureConfig::whisper(n_mels).mel_filters().unwrap();
        let n_bins = 201;
        assert_eq!(usizes(&r["shape"]), vec![n_mels, n_bins]);
        assert_eq!(fb.len(), n_mels * n_bins);
        let rows: Vec<&[f32]> = fb.chunks(n_bins).collect();
        for (m, (sum, max)) in f64s(&r["row_sums"])
            .into_iter()
            .zip(f64s(&r["row_max"]))
            .enumerate()
        {
            let ours: f64 = rows[m].iter().map(|v| f64::from(*v)).sum();
            assert!(
                (ours - sum).abs() < FILTER_TOL,
                "row {m} sum {ours} vs {sum}"
            );
            let our_max = rows[m].iter().fold(0.0f32, |a, v| a.max(*v));
            assert!((f64::from(our_max) - max).abs() < FILTER_TOL, "row {m} max");
        }
        for (m, arg) in usizes(&r["row_argmax"]).into_iter().enumerate() {
            let ours = rows[m]
                .iter()
                .enumerate()
                .fold(
                    (0, f32::MIN),
                    |a, (i, v)| if *v > a.1 { (i, *v) } else { a },
                )
                .0;
            assert_eq!(ours, arg, "row {m} argmax");
        }
        let samples = r["samples"].as_array().unwrap();
        assert!(samples.len() > 20);
        for s in samples {
            let (m, k, v) = (
                s[0].as_u64().unwrap() as usize,
                s[1].as_u64().unwrap() as usize,
                s[2].as_f64().unwrap(),
            );
            assert!(
                (f64::from(rows[m][k]) - v).abs() < FILTER_TOL,
                "w[{m}][{k}] = {} vs {v}",
                rows[m][k]
            );
        }
    }
}

#[test]
fn log_mel_matches_whisper_feature_extractor() {
    let reference = reference();
    let x = reference_signal();
    for n_mels in [80usize, 128] {
        let r = &reference["log_mel"][n_mels.to_string()];
        let f = WhisperFeatureConfig::whisper(n_mels).log_mel(&x).unwrap();
        assert_eq!(usizes(&r["shape"]), vec![n_mels, 3000]);
        assert_eq!((f.n_mels, f.n_frames, f.valid_frames), (n_mels, 3000, 150));
        let at = |m: usize, t: usize| f64::from(f.data[m * f.n_frames + t]);

        let max = f.data.iter().fold(f32::MIN, |a, v| a.max(*v));
        let ref_max = r["global_max"].as_f64().unwrap();
        assert!(
            (f64::from(max) - ref_max).abs() < LOG_MEL_TOL,
            "max {max} vs {ref_max}"
        );

        let bins = usizes(&r["mel_bins"]);
        let frames = usizes(&r["frames"]);
        let mut worst = 0.0f64;
        for (bi, &m) in bins.iter().enumerate() {
            for (fi, &t) in frames.iter().enumerate() {
                let want = r["values"][bi][fi].as_f64().unwrap();
                worst = worst.max((at(m, t) - want).abs());
            }
        }
        let row_means = f64s(&r["row_means"]);
        for (m, want) in row_means.iter().enumerate() {
            let ours = (0..f.n_frames).map(|t| at(m, t)).sum::<f64>() / f.n_frames as f64;
            worst = worst.max((ours - want).abs());
        }
        for (t, want) in f64s(&r["frame_means_first_200"]).iter().enumerate() {
            let ours = (0..n_mels).map(|m| at(m, t)).sum::<f64>() / n_mels as f64;
            worst = worst.max((ours - want).abs());
        }
        assert!(
            worst < LOG_MEL_TOL,
            "{n_mels} bins: max abs diff {worst} (tolerance {LOG_MEL_TOL})"
        );
    }
}

// ---- decoding each format -------------------------------------------------------------------

#[test]
fn decodes_wav_mono() {
    let d = decode("tone_440hz_16k_mono.wav");
    assert_eq!(
        (d.sample_rate, d.source_channels, d.samples.len()),
        (16_000, 1, 8_000)
    );
    assert_eq!(d.duration_s, 0.5);
    assert!((frequency(&d.samples, d.sample_rate) - 440.0).abs() < 1.0);
    // ffmpeg's sine source has amplitude 1/8: rms = 0.125 / sqrt(2).
    assert!((rms(&d.samples) - 0.125 / 2f64.sqrt()).abs() < 1e-3);
}

#[test]
fn decodes_wav_stereo_as_the_channel_mean() {
    let d = decode("tone_1khz_8k_stereo.wav");
    assert_eq!(
        (d.sample_rate, d.source_channels, d.samples.len()),
        (8_000, 2, 4_000)
    );
    assert!((frequency(&d.samples, d.sample_rate) - 1000.0).abs() < 2.0);
    // Left a 1/8 sine, right silent: the mean has half the amplitude.
    let peak = d.samples.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    assert!((peak - 0.0625).abs() < 1e-3, "{peak}");
}

#[test]
fn decodes_mp3() {
    let d = decode("tone_440hz_44k1_stereo.mp3");
    assert_eq!((d.sample_rate, d.source_channels), (44_100, 2));
    // Gapless trimming (the LAME header) gives back exactly the encoded second.
    assert_eq!(d.samples.len(), 44_100);
    assert!((frequency(&d.samples, d.sample_rate) - 440.0).abs() < 2.0);
    // ffmpeg upmixed the mono sine at -3 dB per channel: rms 0.125 * 0.707 / sqrt(2).
    assert!(
        (rms(&d.samples) - 0.0625).abs() < 5e-3,
        "{}",
        rms(&d.samples)
    );
}

#[test]
fn decodes_flac() {
    let d = decode("tone_440hz_22k05_mono.flac");
    assert_eq!(
        (d.sample_rate, d.source_channels, d.samples.len()),
        (22_050, 1, 11_025)
    );
    assert!((frequency(&d.samples, d.sample_rate) - 440.0).abs() < 1.0);
    // Lossless: the same samples as the WAV source would have (a 1/8 sine).
    assert!((rms(&d.samples) - 0.125 / 2f64.sqrt()).abs() < 1e-3);
}

#[test]
fn decodes_ogg_vorbis() {
    let d = decode("tone_440hz_44k1_stereo.ogg");
    assert_eq!(
        (d.sample_rate, d.source_channels, d.samples.len()),
        (44_100, 2, 44_100)
    );
    assert!((frequency(&d.samples, d.sample_rate) - 440.0).abs() < 2.0);
}

#[test]
fn decodes_aac_in_m4a() {
    let d = decode("tone_440hz_24k_mono.m4a");
    assert_eq!((d.sample_rate, d.source_channels), (24_000, 1));
    // symphonia's MP4 reader does not trim the AAC priming frames: about 1 s plus 1-2 frames.
    assert!((1.0..1.1).contains(&d.duration_s), "{}", d.duration_s);
    assert!((frequency(&d.samples, d.sample_rate) - 440.0).abs() < 2.0);
}

#[test]
fn mime_hint_is_only_a_hint() {
    let wav = media("tone_440hz_16k_mono.wav");
    let right = decode_audio(&wav, Some("audio/wav"), &AudioIoOptions::default()).unwrap();
    let wrong = decode_audio(&wav, Some("audio/mpeg"), &AudioIoOptions::default()).unwrap();
    assert_eq!(right, wrong);
    let mp3 = media("tone_440hz_44k1_stereo.mp3");
    let d = decode_audio(
        &mp3,
        Some("audio/ogg; codecs=vorbis"),
        &AudioIoOptions::default(),
    );
    assert_eq!(d.unwrap().sample_rate, 44_100);
}

#[test]
fn target_sample_rate_resamples_the_decoded_audio() {
    let opts = AudioIoOptions {
        target_sample_rate: Some(16_000),
        ..AudioIoOptions::default()
    };
    let d = decode_audio(&media("tone_440hz_44k1_stereo.mp3"), None, &opts).unwrap();
    assert_eq!(
        (d.sample_rate, d.samples.len(), d.source_channels),
        (16_000, 16_000, 2)
    );
    assert!((d.duration_s - 1.0).abs() < 1e-9);
    assert!((frequency(&d.samples, 16_000) - 440.0).abs() < 2.0);
}

// ---- caps -----------------------------------------------------------------------------------

fn wav_header(riff_size: u32, data_size: u32, channels: u16, rate: u32) -> Vec<u8> {
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&riff_size.to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes()); // PCM
    w.extend_from_slice(&channels.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    let block = u32::from(channels) * 2;
    w.extend_from_slice(&(rate.wrapping_mul(block)).to_le_bytes());
    w.extend_from_slice(&(block as u16).to_le_bytes());
    w.extend_from_slice(&16u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&data_size.to_le_bytes());
    w
}

#[test]
fn wav_header_claiming_hours_is_refused_before_decoding() {
    // 16 kHz mono s16 with a data chunk of 4 GB - 256: 37.3 hours. Only 1 s follows.
    let mut w = wav_header(0xFFFF_FFF0, 0xFFFF_FF00, 1, 16_000);
    w.extend(std::iter::repeat_n(0u8, 32_000));
    let err = decode_audio(&w, Some("audio/wav"), &AudioIoOptions::default()).unwrap_err();
    match &err {
        AudioError::TooLong { seconds, max } => {
            assert!((seconds - 134_217.72).abs() < 0.01, "{seconds}");
            assert_eq!(*max, 600.0);
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "The audio is 134217.7 s long, over the limit of 600 s."
    );
}

#[test]
fn declared_duration_over_a_small_cap_is_refused() {
    let opts = AudioIoOptions {
        max_duration_s: 0.3,
        target_sample_rate: None,
    };
    for name in [
        "tone_440hz_16k_mono.wav",
        "tone_1khz_8k_stereo.wav",
        "tone_440hz_44k1_stereo.mp3",
        "tone_440hz_22k05_mono.flac",
        "tone_440hz_44k1_stereo.ogg",
        "tone_440hz_24k_mono.m4a",
    ] {
        let err = decode_audio(&media(name), None, &opts).unwrap_err();
        assert!(
            matches!(err, AudioError::TooLong { max, .. } if max == 0.3),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn stream_without_a_length_stops_at_the_cap_while_decoding() {
    // A FLAC whose STREAMINFO says "total samples unknown" (0), as streaming encoders
    // write it: the 36-bit count is the low nibble of byte 21 and bytes 22-25.
    let mut flac = media("tone_440hz_22k05_mono.flac");
    assert_eq!(&flac[..4], b"fLaC");
    flac[21] &= 0xF0;
    flac[22..26].fill(0);
    // It decodes in full under the default cap ...
    let d = decode_audio(&flac, None, &AudioIoOptions::default()).unwrap();
    assert_eq!(d.samples.len(), 11_025);
    // ... and stops once past a smaller one.
    let opts = AudioIoOptions {
        max_duration_s: 0.25,
        target_sample_rate: None,
    };
    let err = decode_audio(&flac, None, &opts).unwrap_err();
    assert_eq!(err, AudioError::TooLongWhileDecoding { max: 0.25 });
    assert!(err.to_string().contains("longer than the limit of 0.25 s"));
}

#[test]
fn mp3_without_a_length_header_is_capped_by_its_estimate() {
    // No Xing/Info header: symphonia estimates the length from the size and bit rate.
    let mp3 = media("tone_440hz_16k_noxing.mp3");
    let d = decode_audio(&mp3, None, &AudioIoOptions::default()).unwrap();
    assert!((0.95..1.1).contains(&d.duration_s), "{}", d.duration_s);
    let opts = AudioIoOptions {
        max_duration_s: 0.5,
        target_sample_rate: None,
    };
    let err = decode_audio(&mp3, None, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            AudioError::TooLong { .. } | AudioError::TooLongWhileDecoding { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn absurd_rates_and_channel_counts_are_refused() {
    for rate in [0u32, 50, 999, 1_000_000] {
        let mut w = wav_header(36 + 8_000, 8_000, 1, rate);
        w.extend(std::iter::repeat_n(0u8, 8_000));
        let err = decode_audio(&w, None, &AudioIoOptions::default()).unwrap_err();
        assert_eq!(err, AudioError::BadSampleRate { rate: rate.into() });
    }
    // symphonia's WAV reader refuses 0 and 100 channels itself; our own check
    // (BadChannels) covers the other formats.
    for channels in [0u16, 100] {
        let mut w = wav_header(36 + 8_000, 8_000, channels, 16_000);
        w.extend(std::iter::repeat_n(0u8, 8_000));
        let err = decode_audio(&w, None, &AudioIoOptions::default()).unwrap_err();
        assert!(
            matches!(&err, AudioError::Decode(m) if m.contains("channel"))
                || matches!(err, AudioError::BadChannels { .. }),
            "{channels}: {err:?}"
        );
    }
}

// ---- bad input: always an error, never a panic -----------------------------------------------

const ALL_MEDIA: [&str; 7] = [
    "tone_440hz_16k_mono.wav",
    "tone_1khz_8k_stereo.wav",
    "tone_440hz_44k1_stereo.mp3",
    "tone_440hz_16k_noxing.mp3",
    "tone_440hz_22k05_mono.flac",
    "tone_440hz_44k1_stereo.ogg",
    "tone_440hz_24k_mono.m4a",
];

fn xorshift_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

#[test]
fn truncated_files_give_what_decoded_or_an_error() {
    for name in ALL_MEDIA {
        let bytes = media(name);
        let full = decode(name).duration_s;
        // A few header bytes only: nothing can decode.
        for n in [1, 12, 40] {
            let r = decode_audio(&bytes[..n], None, &AudioIoOptions::default());
            assert!(r.is_err(), "{name} cut to {n} bytes: {r:?}");
        }
        // Cut mid-stream: either the part before the cut, or an error naming the problem.
        for frac in [0.3, 0.6, 0.95] {
            let n = (bytes.len() as f64 * frac) as usize;
            match decode_audio(&bytes[..n], None, &AudioIoOptions::default()) {
                Ok(d) => {
                    assert!(d.duration_s < full, "{name} at {frac}");
                    assert!(!d.samples.is_empty());
                }
                Err(e) => assert!(
                    matches!(e, AudioError::Decode(_) | AudioError::NoSamples),
                    "{name} at {frac}: {e:?}"
                ),
            }
        }
    }
}

#[test]
fn truncated_lengths_are_what_came_before_the_cut() {
    // WAV and MP3 cut in half decode their first half (as ffmpeg would).
    let wav = media("tone_440hz_16k_mono.wav");
    let d = decode_audio(&wav[..wav.len() / 2], None, &AudioIoOptions::default()).unwrap();
    assert!((0.2..0.26).contains(&d.duration_s), "{}", d.duration_s);
    let mp3 = media("tone_440hz_44k1_stereo.mp3");
    let d = decode_audio(&mp3[..mp3.len() / 2], None, &AudioIoOptions::default()).unwrap();
    assert!((0.3..0.6).contains(&d.duration_s), "{}", d.duration_s);
}

#[test]
fn corrupt_files_are_errors() {
    // The container header overwritten: no format is recognised (or, for MP3, whose
    // frames carry their own sync words, the rest still decodes: a valid outcome).
    for name in ALL_MEDIA {
        let mut bytes = media(name);
        let noise = xorshift_bytes(7, 64);
        bytes[..64].copy_from_slice(&noise);
        match decode_audio(&bytes, None, &AudioIoOptions::default()) {
            Err(e) => assert!(matches!(e, AudioError::Decode(_)), "{name}: {e:?}"),
            Ok(d) => assert!(name.ends_with(".mp3") && d.duration_s > 0.5, "{name}"),
        }
    }
    // The header intact and everything after it noise: no decodable audio.
    for name in [
        "tone_440hz_44k1_stereo.mp3",
        "tone_440hz_22k05_mono.flac",
        "tone_440hz_44k1_stereo.ogg",
        "tone_440hz_24k_mono.m4a",
    ] {
        let mut bytes = media(name);
        let len = bytes.len();
        let noise = xorshift_bytes(11, len - 200);
        bytes[200..].copy_from_slice(&noise);
        let r = decode_audio(&bytes, None, &AudioIoOptions::default());
        assert!(
            matches!(r, Err(AudioError::Decode(_)) | Err(AudioError::NoSamples)),
            "{name}: {r:?}"
        );
    }
}

#[test]
fn text_pretending_to_be_mp3_is_an_error() {
    let text = b"This is a plain text file, not an MP3. ".repeat(100);
    for hint in [Some("audio/mpeg"), Some("audio/mp3"), None] {
        let err = decode_audio(&text, hint, &AudioIoOptions::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("Cannot decode the audio: "),
            "{err}"
        );
    }
    // With an ID3 tag in front (a common disguise).
    let mut tagged = b"ID3\x03\x00\x00\x00\x00\x00\x10".to_vec();
    tagged.extend(b"hello ".repeat(200));
    assert!(decode_audio(&tagged, Some("audio/mpeg"), &AudioIoOptions::default()).is_err());
}

#[test]
fn random_garbage_is_an_error() {
    for seed in 1..=8u64 {
        let bytes = xorshift_bytes(seed, 8_192);
        for hint in [
            None,
            Some("audio/mpeg"),
            Some("audio/wav"),
            Some("audio/ogg"),
        ] {
            let r = decode_audio(&bytes, hint, &AudioIoOptions::default());
            assert!(
                matches!(r, Err(AudioError::Decode(_))),
                "seed {seed}: {r:?}"
            );
        }
    }
}

#[test]
fn zero_length_and_zero_samples_are_errors() {
    let err = decode_audio(&[], Some("audio/wav"), &AudioIoOptions::default()).unwrap_err();
    assert_eq!(err, AudioError::EmptyInput);
    assert_eq!(err.to_string(), "The audio data is empty (0 bytes).");
    // A valid WAV header with an empty data chunk.
    let w = wav_header(36, 0, 1, 16_000);
    let err = decode_audio(&w, None, &AudioIoOptions::default()).unwrap_err();
    assert_eq!(err, AudioError::NoSamples);
}

// ---- resampling and the whole pipeline --------------------------------------------------------

#[test]
fn resampling_keeps_a_1khz_sine_at_1khz() {
    let x: Vec<f32> = (0..44_100)
        .map(|n| (2.0 * std::f64::consts::PI * 1000.0 * n as f64 / 44_100.0).sin() as f32)
        .collect();
    let y = resample(&x, 44_100, 16_000).unwrap();
    assert_eq!(y.len(), 16_000);
    // A DFT at 1 kHz and at 1.5 kHz over the middle 0.5 s (8000 samples: whole periods).
    let mid = &y[4_000..12_000];
    let bin = |hz: f64| {
        let (mut re, mut im) = (0.0f64, 0.0f64);
        for (n, v) in mid.iter().enumerate() {
            let ph = 2.0 * std::f64::consts::PI * hz * n as f64 / 16_000.0;
            re += f64::from(*v) * ph.cos();
            im -= f64::from(*v) * ph.sin();
        }
        (re * re + im * im).sqrt() * 2.0 / mid.len() as f64
    };
    let at_1k = bin(1000.0);
    assert!((at_1k - 1.0).abs() < 1e-3, "amplitude at 1 kHz {at_1k}");
    assert!(bin(1500.0) < 1e-3);
    assert!((frequency(&y, 16_000) - 1000.0).abs() < 0.5);
    // The phase lines up: output sample i is input time i / 16000.
    for (i, v) in y.iter().enumerate().skip(4_000).take(100) {
        let want = (2.0 * std::f64::consts::PI * 1000.0 * i as f64 / 16_000.0).sin();
        assert!(
            (f64::from(*v) - want).abs() < 1e-2,
            "sample {i}: {v} vs {want}"
        );
    }
}

#[test]
fn resampling_removes_content_above_the_new_nyquist() {
    // 10 kHz cannot exist at 16 kHz; it must not alias down to 6 kHz.
    let x: Vec<f32> = (0..44_100)
        .map(|n| (2.0 * std::f64::consts::PI * 10_000.0 * n as f64 / 44_100.0).sin() as f32)
        .collect();
    let y = resample(&x, 44_100, 16_000).unwrap();
    assert!(rms(&y[2_000..14_000]) < 1e-3, "{}", rms(&y[2_000..14_000]));
}

#[test]
fn features_with_80_and_128_bins() {
    let mp3 = media("tone_440hz_44k1_stereo.mp3");
    for n_mels in [80, 128] {
        let cfg = WhisperFeatureConfig::whisper(n_mels);
        let f =
            audio_to_features(&mp3, Some("audio/mpeg"), &AudioIoOptions::default(), &cfg).unwrap();
        assert_eq!((f.n_mels, f.n_frames), (n_mels, 3000));
        assert_eq!(f.data.len(), n_mels * 3000);
        // 1 s at 16 kHz: 16000 / 160 frames hold audio.
        assert_eq!(f.valid_frames, 100);
        assert_eq!(f.weight_bytes(), n_mels * 3000 * 4);
        // The 440 Hz tone is loudest in the mel bin whose centre is nearest 440 Hz, and
        // the padding is at the floor (max - 8, scaled).
        let frame = 50;
        let loudest = (0..n_mels)
            .max_by(|a, b| f.data[a * 3000 + frame].total_cmp(&f.data[b * 3000 + frame]))
            .unwrap();
        let fb = cfg.mel_filters().unwrap();
        let peak_bin = fb[loudest * 201..(loudest + 1) * 201]
            .iter()
            .enumerate()
            .fold((0, 0.0f32), |a, (i, v)| if *v > a.1 { (i, *v) } else { a })
            .0;
        let centre_hz = peak_bin as f64 * 40.0;
        assert!(
            (centre_hz - 440.0).abs() <= 80.0,
            "{n_mels}: bin {loudest} at {centre_hz} Hz"
        );
        let max = f.data.iter().fold(f32::MIN, |a, v| a.max(*v));
        assert!((f.data[2_000] - (max - 2.0)).abs() < 1e-6);
    }
    assert_eq!(WHISPER_SAMPLE_RATE, 16_000);
}

#[test]
fn pipeline_errors_pass_through() {
    let cfg = WhisperFeatureConfig::whisper(80);
    let opts = AudioIoOptions {
        max_duration_s: 0.1,
        target_sample_rate: None,
    };
    let err = audio_to_features(&media("tone_440hz_16k_mono.wav"), None, &opts, &cfg).unwrap_err();
    assert!(matches!(err, AudioError::TooLong { .. }));
    let err = audio_to_features(b"nope", None, &AudioIoOptions::default(), &cfg).unwrap_err();
    assert!(matches!(err, AudioError::Decode(_)));
}
