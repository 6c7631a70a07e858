//! Image preprocessing benchmark, the counterpart of `../shared/anchors/image_preprocess_bench.py`.
//!
//! One thread, the JPEG's bytes held in memory, each pipeline timed end to end (decode included):
//!   decode       JPEG -> RGB
//!   clip_448     decode -> 448x448 bicubic -> 1/255 -> CLIP mean/std -> CHW f32
//!   qwen2vl      decode -> Qwen2-VL smart resize (max_pixels 1003520) -> normalise -> patches
//! Figure: images/s = images / median wall time of `--runs` runs over `--images` images, after a
//! warm-up run (the anchor's statistic).
//!
//! Run: cargo run --release -p preprocess --example image_bench -- IMAGE.jpg [--images 50] [--runs 5]
//! Output: one JSON line on stdout.

use std::time::Instant;

use preprocess::image::{
    decode_image, ClipConfig, ImageIoOptions, PatchProcessor, ProcessImage, Qwen2VlConfig,
};

fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let (mut images, mut runs) = (50usize, 5usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--images" => images = args.next().ok_or("--images N")?.parse()?,
            "--runs" => runs = args.next().ok_or("--runs N")?.parse()?,
            other => path = Some(other.to_owned()),
        }
    }
    let path = path.ok_or("usage: image_bench IMAGE.jpg [--images N] [--runs N]")?;
    let bytes = std::fs::read(&path)?;
    let io = ImageIoOptions::default();
    let clip = ClipConfig::clip_448();
    let qwen = Qwen2VlConfig {
        max_pixels: 1_003_520,
        ..Qwen2VlConfig::default()
    };
    let first = decode_image(&bytes, &io)?.into_rgb();
    let (w, h) = (first.width(), first.height());
    let smart = qwen.smart_resize(h, w)?;
    let q = qwen.process(&first)?;

    let mut failed = None;
    let mut run = |name: &str, f: &dyn Fn() -> Result<(), Box<dyn std::error::Error>>| {
        let med = median_secs(runs, || {
            for _ in 0..images {
                if let Err(e) = f() {
                    failed = Some(format!("{name}: {e}"));
                }
            }
        });
        (images as f64 / med, 1000.0 * med / images as f64)
    };
    let decode = run("decode", &|| {
        std::hint::black_box(decode_image(&bytes, &io)?.into_rgb());
        Ok(())
    });
    let clip448 = run("clip_448", &|| {
        let rgb = decode_image(&bytes, &io)?.into_rgb();
        std::hint::black_box(clip.process(&rgb)?);
        Ok(())
    });
    let qwen2vl = run("qwen2vl", &|| {
        let rgb = decode_image(&bytes, &io)?.into_rgb();
        std::hint::black_box(qwen.process(&rgb)?);
        Ok(())
    });
    // Stages alone, on an already decoded image.
    let stage_clip = run("stage_clip", &|| {
        std::hint::black_box(clip.process(&first)?);
        Ok(())
    });
    let stage_qwen = run("stage_qwen", &|| {
        std::hint::black_box(qwen.process(&first)?);
        Ok(())
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "bench": "image_preprocess_rust",
            "image": {"bytes": bytes.len(), "w": w, "h": h},
            "smart_resize_hw": [smart.0, smart.1],
            "qwen2vl_grid_thw": q.grid_thw,
            "qwen2vl_pixel_values_shape": q.pixel_values.shape,
            "threads": 1,
            "images_per_run": images,
            "runs": runs,
            "statistic": format!("median of {runs} runs over {images} images after 1 warm-up run"),
            "images_per_s": {"decode": r2(decode.0), "clip_448": r2(clip448.0), "qwen2vl": r2(qwen2vl.0)},
            "ms_per_image": {"decode": r3(decode.1), "clip_448": r3(clip448.1), "qwen2vl": r3(qwen2vl.1)},
            "stage_ms": {"clip_448_after_decode": r3(stage_clip.1), "qwen2vl_after_decode": r3(stage_qwen.1)},
        })
    );
    Ok(())
}
