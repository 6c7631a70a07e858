//! Audio front-end benchmark: the Whisper pipeline on one MP3, single-threaded.
//!
//! decode (symphonia) -> mono (channel mean) -> 16 kHz (rubato FFT resampler)
//! -> 80 x 3000 log-mel, the same work as the Python anchor
//! `anchors/audio_mel_bench.py` (its `numpy_ref` pipeline: soundfile, soxr HQ,
//! numpy log-mel).
//!
//! ```text
//! cargo run --release -p preprocess --example audio_bench -- \
//!     ../shared/anchors/data/audio_30s_44k1_stereo.mp3 [--files 10] [--runs 3] \
//!     [--n-mels 80] [--dump-features feats.f32] [--dump-audio mono16k.f32]
//! ```
//!
//! Prints one JSON line: files/s = files per run / the median run's wall time
//! (after one warm-up file), and per-stage milliseconds (medians over all
//! timed files). `--dump-features` writes the last features as raw
//! little-endian f32, `[n_mels, n_frames]` row-major, and `--dump-audio` the
//! decoded 16 kHz mono samples, for `audio_bench_parity.py` to compare with
//! the anchor's numpy pipeline.

use std::error::Error;
use std::time::{Duration, Instant};

use preprocess::audio::{
    decode_audio, resample, AudioFeatures, AudioIoOptions, LogMel, WhisperFeatureConfig,
    WHISPER_SAMPLE_RATE,
};
use serde_json::json;

struct Args {
    path: String,
    files: usize,
    runs: usize,
    n_mels: usize,
    dump: Option<String>,
    dump_audio: Option<String>,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        path: String::new(),
        files: 10,
        runs: 3,
        n_mels: 80,
        dump: None,
        dump_audio: None,
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--files" => args.files = value("--files")?.parse()?,
            "--runs" => args.runs = value("--runs")?.parse()?,
            "--n-mels" => args.n_mels = value("--n-mels")?.parse()?,
            "--dump-features" => args.dump = Some(value("--dump-features")?),
            "--dump-audio" => args.dump_audio = Some(value("--dump-audio")?),
            "-h" | "--help" => {
                return Err("usage: audio_bench <file.mp3> [--files N] [--runs N] \
                            [--n-mels 80|128] [--dump-features PATH] [--dump-audio PATH]"
                    .into())
            }
            _ if args.path.is_empty() => args.path = a,
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    if args.path.is_empty() {
        return Err("usage: audio_bench <file.mp3> (e.g. \
                    ../shared/anchors/data/audio_30s_44k1_stereo.mp3)"
            .into());
    }
    if args.files == 0 || args.runs == 0 {
        return Err("--files and --runs must be at least 1".into());
    }
    Ok(args)
}

struct Timing {
    decode: Duration,
    resample: Duration,
    mel: Duration,
}

fn one_file(
    bytes: &[u8],
    cfg: &WhisperFeatureConfig,
) -> Result<(AudioFeatures, Timing), Box<dyn Error>> {
    let t0 = Instant::now();
    let decoded = decode_audio(bytes, Some("audio/mpeg"), &AudioIoOptions::default())?;
    let t1 = Instant::now();
    let mono16k = resample(&decoded.samples, decoded.sample_rate, cfg.sample_rate)?;
    let t2 = Instant::now();
    let features = cfg.log_mel(&mono16k)?;
    let t3 = Instant::now();
    Ok((
        features,
        Timing {
            decode: t1 - t0,
            resample: t2 - t1,
            mel: t3 - t2,
        },
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let bytes = std::fs::read(&args.path)?;
    let cfg = WhisperFeatureConfig::whisper(args.n_mels);
    let decoded = decode_audio(&bytes, Some("audio/mpeg"), &AudioIoOptions::default())?;

    // Warm-up: builds the mel plan and touches the allocator.
    let (mut features, _) = one_file(&bytes, &cfg)?;

    let mut run_s = Vec::new();
    let (mut dec, mut res, mut mel) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.runs {
        let start = Instant::now();
        for _ in 0..args.files {
            let (f, t) = one_file(&bytes, &cfg)?;
            features = f;
            dec.push(ms(t.decode));
            res.push(ms(t.resample));
            mel.push(ms(t.mel));
        }
        run_s.push(start.elapsed().as_secs_f64());
    }
    let run = median(run_s.clone());

    let write_f32 = |path: &str, data: &[f32]| {
        let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, raw)
    };
    if let Some(path) = &args.dump {
        write_f32(path, &features.data)?;
    }
    if let Some(path) = &args.dump_audio {
        let mono16k = resample(&decoded.samples, decoded.sample_rate, cfg.sample_rate)?;
        write_f32(path, &mono16k)?;
    }

    let file = std::path::Path::new(&args.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = json!({
        "bench": "audio_mel_rust",
        "audio": {
            "file": file,
            "bytes": bytes.len(),
            "sample_rate": decoded.sample_rate,
            "channels": decoded.source_channels,
            "decoded_samples": decoded.samples.len(),
        },
        "pipeline": format!(
            "symphonia decode -> mean of channels -> rubato Fft to {WHISPER_SAMPLE_RATE} Hz -> \
             {}x{} log-mel",
            features.n_mels, features.n_frames
        ),
        "threads": 1,
        "files_per_run": args.files,
        "runs": args.runs,
        "statistic": format!(
            "files/s from the median of {} runs of {} files after 1 warm-up; stage ms are \
             medians over all files",
            args.runs, args.files
        ),
        "files_per_s": round2(args.files as f64 / run),
        "run_s": run_s.iter().map(|s| (s * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        "ms": {
            "decode": round2(median(dec.clone())),
            "resample": round2(median(res.clone())),
            "mel": round2(median(mel.clone())),
            "pipeline": round2(1000.0 * run / args.files as f64),
        },
        "mel_shape": [features.n_mels, features.n_frames],
        "valid_frames": features.valid_frames,
    });
    println!("{out}");
    Ok(())
}
