//! An item's cost from its header: the token estimate equals what the processed tensor gives
//! (through the one count, `media::tokens`), and both budgets refuse before decoding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{data_url, media_file, merged, png};

use std::io::Cursor;

use base64::Engine as _;
use bytes::Bytes;
use image::{DynamicImage, ImageFormat, RgbImage};
use policies::{MediaOptions, MediaUrlPolicy, VideoLoadOptions};
use preprocess::audio::WhisperFeatureConfig;
use preprocess::error::ErrorKind;
use preprocess::estimate;
use preprocess::image::{ImageProcessor, Qwen2VlConfig, DEFAULT_MAX_PIXELS};
use preprocess::pipeline::{
    MediaPipeline, MediaRequestItem, MediaTensor, ModelMediaSpec, PipelineConfig, ProcessedMedia,
    TokenBudget,
};
use preprocess::video::VideoIoOptions;
use preprocess::{Modality, PreprocessError};

fn encode(img: RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img)
        .write_to(&mut out, format)
        .unwrap();
    out.into_inner()
}

fn spec() -> ModelMediaSpec {
    ModelMediaSpec {
        image: Some(ImageProcessor::Qwen2Vl(Qwen2VlConfig::default())),
        video: Some(Qwen2VlConfig::default()),
        audio: Some(WhisperFeatureConfig::whisper(128)),
    }
}

fn item(modality: Modality, url: String) -> MediaRequestItem {
    MediaRequestItem {
        modality,
        url: Some(url),
        uuid: None,
    }
}

/// Tokens the engine will expand an item to: from the tensor's grid or valid frames.
fn processed_tokens(p: &ProcessedMedia) -> usize {
    let merge = Qwen2VlConfig::default().merge_size;
    match &p.tensor {
        MediaTensor::Image(img) => media::tokens::vision(img.grid_thw.unwrap(), merge),
        MediaTensor::Video { frames, .. } => media::tokens::vision(frames.grid_thw.unwrap(), merge),
        MediaTensor::Audio(a) => media::tokens::audio(a.valid_frames),
    }
}

async fn process_one(
    p: &MediaPipeline,
    item: MediaRequestItem,
    kw: &MediaOptions,
    budget: TokenBudget,
) -> Result<usize, PreprocessError> {
    let out = p.process(&[item], kw, true, &spec(), budget).await?;
    Ok(processed_tokens(&out[0]))
}

fn pipeline(config: PipelineConfig) -> MediaPipeline {
    MediaPipeline::new(MediaUrlPolicy::default(), config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_estimate_equals_the_processed_count() {
    let p = pipeline(PipelineConfig::default());
    let processor = ImageProcessor::Qwen2Vl(Qwen2VlConfig::default());
    let sizes = [(120, 90), (640, 480), (33, 1000), (1000, 33), (1500, 1125)];
    let kwargs = [
        None,
        Some(r#"{"max_pixels": 50176}"#),
        Some(r#"{"min_pixels": 200704, "max_pixels": 401408}"#),
        Some(r#"{"size": {"shortest_edge": 3136, "longest_edge": 12845056}}"#),
    ];
    for (w, h) in sizes {
        let bytes = png(w, h);
        for mm in kwargs {
            let kw = merged(mm, None);
            let estimated = estimate::image(
                &bytes,
                &processor,
                kw.processor().unwrap(),
                DEFAULT_MAX_PIXELS,
            )
            .unwrap()
            .tokens
            .unwrap();
            let url = data_url("image/png", &bytes);
            let processed =
                process_one(&p, item(Modality::Image, url), &kw, TokenBudget::UNLIMITED)
                    .await
                    .unwrap();
            assert_eq!(estimated, processed, "{w}x{h} with {mm:?}");
        }
    }
}

#[test]
fn exif_orientation_swaps_the_sides() {
    // A JPEG stored 40x20 whose EXIF says "rotate 90": the decoder hands over 20x40.
    let jpeg = encode(RgbImage::new(40, 20), ImageFormat::Jpeg);
    let exif: &[u8] = &[
        0xFF, 0xE1, 0x00, 0x22, b'E', b'x', b'i', b'f', 0, 0, b'M', b'M', 0, 0x2A, 0, 0, 0, 8, 0,
        1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0,
    ];
    let mut rotated = jpeg[..2].to_vec();
    rotated.extend_from_slice(exif);
    rotated.extend_from_slice(&jpeg[2..]);
    assert_eq!(estimate::image_size(&jpeg), Some((40, 20)));
    assert_eq!(estimate::image_size(&rotated), Some((20, 40)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_estimate_equals_the_processed_count() {
    let p = pipeline(PipelineConfig::default());
    let cfg = WhisperFeatureConfig::whisper(128);
    let mut checked = 0;
    for (name, mime) in [
        ("tone_440hz_16k_mono.wav", "audio/wav"),
        ("tone_1khz_8k_stereo.wav", "audio/wav"),
        ("tone_440hz_22k05_mono.flac", "audio/flac"),
    ] {
        let bytes = media_file(name);
        let estimated = estimate::audio(&bytes, Some(mime), &cfg)
            .unwrap_or_else(|| panic!("{name}: the header declares its length"))
            .tokens
            .unwrap();
        let url = data_url(mime, &bytes);
        let processed = process_one(
            &p,
            item(Modality::Audio, url),
            &merged(None, None),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
        assert_eq!(estimated, processed, "{name}");
        checked += 1;
    }
    assert_eq!(checked, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_estimate_equals_the_processed_count() {
    let p = pipeline(PipelineConfig::default());
    let q = Qwen2VlConfig::default();
    let mm = policies::ProcessorOptions::default();
    let frame = encode(RgbImage::new(64, 48), ImageFormat::Jpeg);
    let frames: Vec<Bytes> = (0..7).map(|_| Bytes::from(frame.clone())).collect();
    for num_frames in [2, 4, 32] {
        let media = format!(r#"{{"video": {{"num_frames": {num_frames}}}}}"#);
        let kw = merged(None, Some(&media));
        let opts = VideoIoOptions::new(&VideoLoadOptions {
            num_frames: Some(num_frames),
            ..VideoLoadOptions::default()
        });
        let estimated = estimate::jpeg_frames(&frames, &q, &mm, &opts)
            .unwrap()
            .tokens
            .unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        let list: Vec<String> = frames.iter().map(|f| b64.encode(f)).collect();
        let url = format!("data:video/jpeg;base64,{}", list.join(","));
        let processed = process_one(&p, item(Modality::Video, url), &kw, TokenBudget::UNLIMITED)
            .await
            .unwrap();
        assert_eq!(estimated, processed, "jpeg list, num_frames {num_frames}");

        if cfg!(feature = "video") {
            let mp4 = media_file("testsrc_h264.mp4");
            let limits = PipelineConfig::default().video;
            let estimated = estimate::container(&mp4, &q, &mm, &opts, &limits)
                .unwrap()
                .tokens
                .unwrap();
            let url = data_url("video/mp4", &mp4);
            let processed =
                process_one(&p, item(Modality::Video, url), &kw, TokenBudget::UNLIMITED)
                    .await
                    .unwrap();
            assert_eq!(estimated, processed, "mp4, num_frames {num_frames}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_token_budget_is_a_400_naming_the_item_and_the_budget() {
    let p = pipeline(PipelineConfig::default());
    let kw = merged(None, None);
    let small = data_url("image/png", &png(640, 480));
    let big = data_url("image/png", &png(1500, 1125));
    let one = process_one(
        &p,
        item(Modality::Image, small.clone()),
        &kw,
        TokenBudget::UNLIMITED,
    )
    .await
    .unwrap();
    let two = process_one(
        &p,
        item(Modality::Image, big.clone()),
        &kw,
        TokenBudget::UNLIMITED,
    )
    .await
    .unwrap();
    // Exactly enough passes; one token less is refused, naming the larger image.
    let items = [item(Modality::Image, small), item(Modality::Image, big)];
    let fits = TokenBudget {
        available: one + two,
    };
    p.process(&items, &kw, true, &spec(), fits).await.unwrap();
    let short = TokenBudget {
        available: one + two - 1,
    };
    let err = p
        .process(&items, &kw, true, &spec(), short)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert!(
        matches!(err, PreprocessError::OverTokenBudget { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("The image at index 1 (1500x1125 pixels) needs"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("need {} tokens in all", one + two)),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("only {} tokens", one + two - 1)),
        "{msg}"
    );
    assert_eq!(p.decoded_bytes().in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decoded_bytes_budget_refuses_with_the_overloaded_kind_and_is_released() {
    let config = PipelineConfig {
        max_decoded_bytes: 16 << 20,
        ..PipelineConfig::default()
    };
    let p = pipeline(config);
    let kw = merged(None, None);
    let url = data_url("image/png", &png(640, 480));
    let held = p.decoded_bytes().try_reserve(15 << 20).unwrap();
    let err = process_one(
        &p,
        item(Modality::Image, url.clone()),
        &kw,
        TokenBudget::UNLIMITED,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded, "{err:?}");
    assert!(err.to_string().contains("retry later"), "{err}");
    drop(held);
    process_one(&p, item(Modality::Image, url), &kw, TokenBudget::UNLIMITED)
        .await
        .unwrap();
    assert_eq!(p.decoded_bytes().in_use(), 0, "released after the tensor");

    // An item that could never fit is a 400, not a 503 a retry cannot cure.
    let huge = data_url("image/png", &png(2000, 2000));
    let err = process_one(&p, item(Modality::Image, huge), &kw, TokenBudget::UNLIMITED)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRequest, "{err:?}");
    assert!(
        err.to_string()
            .starts_with("The image at index 0 (2000x2000 pixels) would hold"),
        "{err}"
    );
    // A failed decode releases too.
    let broken = data_url("image/png", &png(64, 64)[..100]);
    process_one(
        &p,
        item(Modality::Image, broken),
        &kw,
        TokenBudget::UNLIMITED,
    )
    .await
    .unwrap_err();
    assert_eq!(p.decoded_bytes().in_use(), 0, "released after a failure");
}
