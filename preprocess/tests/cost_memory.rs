//! A huge image over the token budget is refused from its header: the process's peak memory
//! grows by far less than the decoded image would take. Alone in its test binary so no other
//! test's allocations move the peak.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Cursor;

use base64::Engine as _;
use image::{DynamicImage, GrayImage, ImageFormat, Luma};
use policies::{DeploymentDefaults, MediaUrlPolicy};
use preprocess::error::ErrorKind;
use preprocess::image::{ImageProcessor, Qwen2VlConfig};
use preprocess::pipeline::{
    MediaPipeline, MediaRequestItem, ModelMediaSpec, PipelineConfig, TokenBudget,
};
use preprocess::{Modality, PreprocessError};

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_6000x6000_png_over_the_budget_is_refused_before_decoding() {
    let png = {
        let grey = GrayImage::from_pixel(6000, 6000, Luma([128]));
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageLuma8(grey)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        out.into_inner()
    };
    assert!(png.len() < 1 << 20, "a grey PNG compresses: {}", png.len());
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    // A deployment that lets images keep their size: 6000x6000 is 45,796 tokens.
    let defaults =
        DeploymentDefaults::from_json(Some(r#"{"max_pixels": 40000000}"#), None).unwrap();
    let kw = policies::merge(&defaults, None, None, false).unwrap();
    let spec = ModelMediaSpec {
        image: Some(ImageProcessor::Qwen2Vl(Qwen2VlConfig::default())),
        ..ModelMediaSpec::default()
    };
    let p = MediaPipeline::new(MediaUrlPolicy::default(), PipelineConfig::default()).unwrap();
    let items = [MediaRequestItem {
        modality: Modality::Image,
        url: Some(url),
        uuid: None,
    }];

    let before = peak_rss();
    let err = p
        .process(
            &items,
            kw.media_options(),
            true,
            &spec,
            TokenBudget { available: 32_000 },
        )
        .await
        .unwrap_err();
    let grown = peak_rss().saturating_sub(before);

    assert_eq!(err.kind(), ErrorKind::BadRequest);
    let PreprocessError::OverTokenBudget {
        tokens, available, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*tokens, *available), (45_796, 32_000));
    assert!(err.to_string().contains("6000x6000 pixels"), "{err}");
    // Decoding would hold 108 MB of RGB and then 865 MB of float patches.
    let decoded = 6000 * 6000 * 3;
    eprintln!("peak RSS grew by {} KiB", grown >> 10);
    assert!(grown < decoded / 10, "peak grew by {grown} bytes");
}
