//! Video sampling benchmark: the counterpart of the anchor
//! `anchors/video_sample_bench.py` (vLLM's OpenCV loader).
//!
//! Decodes the file from memory and samples `--frames` (32) frames uniformly
//! with `--threads` (2) decoder threads, once untimed and `--runs` (3) times
//! timed, and prints one JSON line: clips/s from the median run and the
//! indices chosen. `--dump DIR` also writes each kept frame as raw RGB
//! (`frame_<index>.rgb`, width x height x 3 bytes) for pixel comparisons.
//! On Linux it also reports the process CPU time per clip (all threads, from
//! `/proc/self/stat`, 10 ms ticks), steadier than wall time on a busy machine.
//!
//! Run: cargo run --release -p preprocess --example video_bench -- VIDEO.mp4

use std::time::Instant;

use preprocess::video::{decode_video, VideoIoOptions, VideoLimits};

fn usage() -> ! {
    eprintln!("usage: video_bench VIDEO [--frames N] [--runs N] [--threads N] [--dump DIR]");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let (mut frames, mut runs, mut threads) = (32usize, 3usize, 2usize);
    let mut dump = None;
    while let Some(arg) = args.next() {
        let mut number = || -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match arg.as_str() {
            "--frames" => frames = number(),
            "--runs" => runs = number().max(1),
            "--threads" => threads = number(),
            "--dump" => dump = Some(args.next().unwrap_or_else(|| usage())),
            _ if path.is_none() && !arg.starts_with("--") => path = Some(arg),
            _ => usage(),
        }
    }
    let path = path.unwrap_or_else(|| usage());
    let data = match std::fs::read(&path) {
        Ok(data) => data,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1)
        }
    };
    let opts = VideoIoOptions {
        num_frames: frames,
        ..VideoIoOptions::default()
    };
    let limits = VideoLimits {
        decoder_threads: threads,
        ..VideoLimits::default()
    };
    let load = || match decode_video(&data, &opts, &limits) {
        Ok(video) => video,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1)
        }
    };

    let video = load();
    let mut times = Vec::with_capacity(runs);
    let cpu_start = cpu_seconds();
    for _ in 0..runs {
        let start = Instant::now();
        let v = load();
        times.push(start.elapsed().as_secs_f64());
        assert_eq!(v.frame_indices, video.frame_indices);
    }
    let cpu_ms = cpu_start
        .zip(cpu_seconds())
        .map(|(a, b)| ((b - a) / runs as f64 * 10_000.0).round() / 10.0);
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];

    if let Some(dir) = dump {
        for (frame, index) in video.frames.iter().zip(&video.frame_indices) {
            let file = format!("{dir}/frame_{index}.rgb");
            if let Err(e) = std::fs::write(&file, frame.as_raw()) {
                eprintln!("{file}: {e}");
                std::process::exit(1)
            }
        }
    }

    let name = std::path::Path::new(&path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let line = serde_json::json!({
        "bench": "video_sample",
        "impl": "preprocess::video::decode_video",
        "video": {
            "file": name,
            "bytes": data.len(),
            "total_frames": video.total_frames,
            "width": video.width,
            "height": video.height,
            "fps": video.source_fps,
        },
        "frames_sampled": video.frames.len(),
        "output_shape": [video.frames.len(), video.height, video.width, 3],
        "decoder_threads": threads,
        "runs": runs,
        "statistic": format!("median of {runs} after 1 warm-up"),
        "clips_per_s": (1.0 / median * 1000.0).round() / 1000.0,
        "ms_per_clip": (median * 10_000.0).round() / 10.0,
        "cpu_ms_per_clip": cpu_ms,
        "indices": video.frame_indices,
    });
    println!("{line}");
}

/// User + system CPU seconds of this process (all threads), Linux only.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 12th and 13th of those, in USER_HZ ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
