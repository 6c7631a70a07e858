//! Parity of the image processors with Pillow and the Hugging Face processors (PIL backend).
//!
//! `tests/media/image_reference.json` is made by `tests/media/gen_image_reference.py` from a
//! picture computed by formula (the same one as [`picture`] here). Tolerances:
//! - resizes: Pillow and `fast_image_resize` both run the bicubic (a = -0.5) convolution in
//!   fixed point on 8-bit data, one pass per axis. They round and clip the intermediate pass a
//!   little differently: at most 1 level apart except next to the test picture's 240 -> 0
//!   sawtooth edges (measured: max 5 levels on 0.2 % of values; mean difference 0.06), so at
//!   least 99.5 % within 1 level, none over 8, mean under 0.1;
//! - normalised tensors: one 8-bit level is 1 / 255 / std (about 0.015 for CLIP's std), so the
//!   same bound; the grid, the shapes and smart resize are exact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use image::{Rgb, RgbImage};
use preprocess::image::{
    ClipConfig, PatchProcessor, ProcessImage, Qwen2VlConfig, ResizeTo, CLIP_MEAN, CLIP_STD,
};
use serde_json::Value;

fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let checker = if (x / 4 + y / 4) % 2 == 0 { 40 } else { 0 };
        Rgb([
            ((x * 255) / w) as u8,
            ((y * 255) / h) as u8,
            (((x + y) * 3) % 200 + checker) as u8,
        ])
    })
}

fn reference() -> Value {
    let text = include_str!("media/image_reference.json");
    serde_json::from_str(text).unwrap()
}

/// Max and mean absolute difference of two byte buffers.
fn byte_diff(a: &[u8], b: &[u8]) -> (u8, f64) {
    assert_eq!(a.len(), b.len());
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0);
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    (max, sum as f64 / a.len() as f64)
}

/// Compares sampled values of a flat tensor; returns the max abs difference.
fn sampled_diff(ours: &[f32], reference: &Value) -> f32 {
    let idx = reference["index"].as_array().unwrap();
    let val = reference["value"].as_array().unwrap();
    idx.iter()
        .zip(val)
        .map(|(i, v)| {
            let i = i.as_u64().unwrap() as usize;
            (ours[i] - v.as_f64().unwrap() as f32).abs()
        })
        .fold(0.0, f32::max)
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// One 8-bit level after CLIP normalisation, plus float slack.
fn one_level() -> f32 {
    let min_std = CLIP_STD.iter().copied().fold(f32::MAX, f32::min);
    1.0 / 255.0 / min_std + 1e-4
}

#[test]
fn bicubic_resize_matches_pillow() {
    let reference = reference();
    for case in reference["cases"].as_array().unwrap() {
        let (w, h) = (
            case["width"].as_u64().unwrap() as u32,
            case["height"].as_u64().unwrap() as u32,
        );
        let pic = picture(w, h);
        for (rw, rh) in [(100u32, 80u32), (56, 42)] {
            let key = format!("pil_bicubic_{rw}x{rh}");
            let want = base64::engine::general_purpose::STANDARD
                .decode(case[&key].as_str().unwrap())
                .unwrap();
            // Exact resize with rescale 1, mean 0, std 1/255 gives the bytes back as floats.
            let cfg = ClipConfig {
                resize: ResizeTo::Exact {
                    height: rh,
                    width: rw,
                },
                crop_size: None,
                rescale_factor: 1.0,
                image_mean: [0.0; 3],
                image_std: [1.0; 3],
            };
            let out = cfg.process(&pic).unwrap();
            let plane = (rw * rh) as usize;
            let mut ours = vec![0u8; plane * 3];
            for c in 0..3 {
                for p in 0..plane {
                    ours[p * 3 + c] = out.pixel_values.data[c * plane + p] as u8;
                }
            }
            let (max, mean) = byte_diff(&ours, &want);
            let off = ours
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.abs_diff(**b) > 1)
                .count();
            assert!(max <= 8, "{w}x{h} -> {rw}x{rh}: max diff {max}");
            assert!(
                off * 200 <= ours.len(),
                "{w}x{h} -> {rw}x{rh}: {off} of {} values more than 1 level off",
                ours.len()
            );
            assert!(mean < 0.1, "{w}x{h} -> {rw}x{rh}: mean diff {mean}");
        }
    }
}

#[test]
fn clip_tensor_matches_the_hf_processor() {
    let reference = reference();
    for case in reference["cases"].as_array().unwrap() {
        let pic = picture(
            case["width"].as_u64().unwrap() as u32,
            case["height"].as_u64().unwrap() as u32,
        );
        let cfg = ClipConfig {
            resize: ResizeTo::Exact {
                height: 56,
                width: 56,
            },
            crop_size: None,
            rescale_factor: 1.0 / 255.0,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
        };
        let out = cfg.process(&pic).unwrap();
        let want_shape = usizes(&case["clip_56"]["shape"]);
        assert_eq!(out.pixel_values.shape, want_shape);
        let d = sampled_diff(&out.pixel_values.data, &case["clip_56"]);
        assert!(d <= one_level(), "clip max diff {d}");
    }
}

#[test]
fn qwen2vl_patches_match_the_hf_processor() {
    let reference = reference();
    for case in reference["cases"].as_array().unwrap() {
        let pic = picture(
            case["width"].as_u64().unwrap() as u32,
            case["height"].as_u64().unwrap() as u32,
        );
        let r = &case["qwen2vl"];
        let q = Qwen2VlConfig {
            min_pixels: r["min_pixels"].as_u64().unwrap(),
            max_pixels: r["max_pixels"].as_u64().unwrap(),
            ..Qwen2VlConfig::default()
        };
        let out = q.process(&pic).unwrap();
        let grid = usizes(&r["grid_thw"]);
        assert_eq!(out.grid_thw.map(|g| g.to_vec()), Some(grid));
        let shape = usizes(&r["shape"]);
        assert_eq!(out.pixel_values.shape, shape);
        let d = sampled_diff(&out.pixel_values.data, r);
        assert!(d <= one_level(), "qwen2vl max diff {d}");
    }
}

#[test]
fn smart_resize_matches_the_reference() {
    let reference = reference();
    for c in reference["smart_resize"].as_array().unwrap() {
        let q = Qwen2VlConfig {
            min_pixels: c["min_pixels"].as_u64().unwrap(),
            max_pixels: c["max_pixels"].as_u64().unwrap(),
            ..Qwen2VlConfig::default()
        };
        let (h, w) = (
            c["height"].as_u64().unwrap() as u32,
            c["width"].as_u64().unwrap() as u32,
        );
        let want = (
            c["resized"][0].as_u64().unwrap() as u32,
            c["resized"][1].as_u64().unwrap() as u32,
        );
        assert_eq!(q.smart_resize(h, w).unwrap(), want, "{h}x{w}");
    }
}
