//! Helpers the pipeline test binaries share.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Cursor;

use base64::Engine as _;
use image::{DynamicImage, ImageFormat, Rgb, RgbImage};
use policies::{DeploymentDefaults, MediaOptions};

/// A gradient PNG of `w x h`.
pub fn png(w: u32, h: u32) -> Vec<u8> {
    let img = RgbImage::from_fn(w, h, |x, y| Rgb([(x * 3) as u8, (y * 5) as u8, 77]));
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img)
        .write_to(&mut out, ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

pub fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// A file of `tests/media`.
pub fn media_file(name: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/media")
            .join(name),
    )
    .unwrap()
}

/// The options of a deployment with these defaults and a request with no kwargs.
pub fn merged(mm: Option<&str>, media: Option<&str>) -> MediaOptions {
    let defaults = DeploymentDefaults::from_json(mm, media).unwrap();
    policies::merge(&defaults, None, None, false)
        .unwrap()
        .media_options()
        .clone()
}
