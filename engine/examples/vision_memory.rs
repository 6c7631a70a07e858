//! Peak memory of the vision tower on one large image: the tiny Qwen2-VL checkpoint
//! (`tests/data/tiny-qwen2-vl`, random weights) encodes a `1 x SIDE x SIDE` patch grid, and the
//! process's peak resident set (VmHWM) is read before and after. With attention in blocks of
//! query rows the growth is linear in the patches; a whole `patches x patches` score matrix
//! would be `4 * patches^2` bytes (1 GiB at a 128 x 128 grid). Prints one JSON line.
//!
//! Run: `cargo run --release -p engine --example vision_memory -- [SIDE] [MODEL_DIR]`

use std::path::PathBuf;
use std::time::Instant;

use engine::hf::SafetensorsWeights;
use engine::models::qwen2_vl::vision::{VisionConfig, VisionTower};

/// The process's peak resident set in KiB.
fn peak_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let side: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(128);
    let dir = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-qwen2-vl")
    });
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
    let cfg = VisionConfig::from_json(&config["vision_config"])?;
    let tower = VisionTower::load(&cfg, &SafetensorsWeights::open(&dir)?)?;
    let patches = side * side;
    let pixels: Vec<f32> = (0..patches * cfg.patch_dim())
        .map(|i| ((i as f64 * 0.37).sin() * 0.8) as f32)
        .collect();
    let before = peak_kib().unwrap_or(0);
    let start = Instant::now();
    let out = tower.encode(&pixels, &[[1, side, side]])?;
    let seconds = start.elapsed().as_secs_f64();
    let after = peak_kib().unwrap_or(0);
    println!(
        "{}",
        serde_json::json!({
            "patches": patches,
            "output_values": out.len(),
            "peak_before_kib": before,
            "peak_after_kib": after,
            "peak_growth_kib": after.saturating_sub(before),
            "whole_score_matrix_kib": patches * patches * 4 / 1024,
            "seconds": seconds,
        })
    );
    Ok(())
}
