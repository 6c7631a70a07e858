//! The whole media pipeline: URL -> fetch -> decode on the pool -> model tensor, with merged
//! kwargs, uuid caching (a miss is found before any fetch) and errors of the right kind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::{data_url, media_file, merged, png};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use policies::{MediaOptions, MediaUrlPolicy};
use preprocess::audio::WhisperFeatureConfig;
use preprocess::error::ErrorKind;
use preprocess::image::{ClipConfig, ImageProcessor, Qwen2VlConfig};
use preprocess::pipeline::{
    MediaPipeline, MediaRequestItem, MediaTensor, ModelMediaSpec, PipelineConfig, TokenBudget,
};
use preprocess::{Modality, PreprocessError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `body` as `ty` on every path, counting connections.
async fn serve(ty: &'static str, body: Vec<u8>) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
            });
        }
    });
    (port, hits)
}

fn pipeline(policy: MediaUrlPolicy) -> MediaPipeline {
    MediaPipeline::new(policy, PipelineConfig::default()).unwrap()
}

fn private_ok() -> MediaUrlPolicy {
    MediaUrlPolicy {
        allow_private_hosts: true,
        ..MediaUrlPolicy::default()
    }
}

fn qwen_spec() -> ModelMediaSpec {
    ModelMediaSpec {
        image: Some(ImageProcessor::Qwen2Vl(Qwen2VlConfig::default())),
        video: Some(Qwen2VlConfig::default()),
        audio: Some(WhisperFeatureConfig::whisper(128)),
    }
}

fn item(modality: Modality, url: Option<String>, uuid: Option<&str>) -> MediaRequestItem {
    MediaRequestItem {
        modality,
        url,
        uuid: uuid.map(str::to_owned),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_from_data_and_http_urls_become_patches() {
    let body = png(120, 90);
    let (port, hits) = serve("image/png", body.clone()).await;
    let p = pipeline(private_ok());
    let items = [
        item(Modality::Image, Some(data_url("image/png", &body)), None),
        item(
            Modality::Image,
            Some(format!("http://127.0.0.1:{port}/a.png")),
            None,
        ),
    ];
    let out = p
        .process(
            &items,
            &merged(None, None),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(out.len(), 2);
    // Same bytes, same options: same hash and tensor.
    assert_eq!(out[0].hash, out[1].hash);
    let MediaTensor::Image(img) = &out[0].tensor else {
        panic!("image tensor")
    };
    // 120x90 -> smart resize 112x84 -> grid 6x8 ... whatever the grid, tokens = patches / 4.
    let [t, h, w] = img.grid_thw.unwrap();
    assert_eq!(t, 1);
    assert_eq!(img.pixel_values.shape[0], h * w);
    assert_eq!(img.pixel_values.shape, vec![h * w, 1176]);
    // The decoded items stay on the decoded-media budget until the caller lets them go.
    assert!(out.decoded.bytes() > 0);
    assert_eq!(p.decoded_bytes().in_use(), out.decoded.bytes());
    drop(out);
    assert_eq!(p.decoded_bytes().in_use(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mm_processor_kwargs_change_the_token_count_and_the_hash() {
    let url = data_url("image/png", &png(640, 480));
    let p = pipeline(MediaUrlPolicy::default());
    let items = [item(Modality::Image, Some(url), None)];
    let big = p
        .process(
            &items,
            &merged(None, None),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let small = p
        .process(
            &items,
            &merged(Some(r#"{"max_pixels": 50176}"#), None),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let patches = |m: &preprocess::pipeline::ProcessedMedia| match &m.tensor {
        MediaTensor::Image(img) => img.pixel_values.shape[0],
        other => panic!("{other:?}"),
    };
    assert!(patches(&small[0]) < patches(&big[0]) / 4);
    assert_ne!(small[0].hash, big[0].hash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uuid_parts_are_cached_and_a_miss_is_found_before_any_fetch() {
    let (port, hits) = serve("image/png", png(64, 64)).await;
    let p = pipeline(private_ok());
    let url = format!("http://127.0.0.1:{port}/x.png");
    let kw = merged(None, None);
    // A miss among the items: the contract's 400, and nothing fetched.
    let err = p
        .process(
            &[
                item(Modality::Image, Some(url.clone()), None),
                item(Modality::Image, None, Some("never-seen")),
            ],
            &kw,
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cache miss for image at index 1 but data is not provided"
    );
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // Data with a uuid is cached; the uuid alone then reuses it without a fetch.
    let first = p
        .process(
            &[item(Modality::Image, Some(url), Some("cat"))],
            &kw,
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let again = p
        .process(
            &[item(Modality::Image, None, Some("cat"))],
            &kw,
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(Arc::ptr_eq(&first[0], &again[0]));
    // The cache is per modality.
    let err = p
        .process(
            &[item(Modality::Video, None, Some("cat"))],
            &kw,
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cache miss for video at index 0 but data is not provided"
    );
}

/// One image URL through the pipeline; the error it gives.
async fn image_error(
    p: &MediaPipeline,
    url: String,
    kw: &MediaOptions,
    spec: &ModelMediaSpec,
) -> PreprocessError {
    p.process(
        &[item(Modality::Image, Some(url), None)],
        kw,
        false,
        spec,
        TokenBudget::UNLIMITED,
    )
    .await
    .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_classified() {
    let p = pipeline(MediaUrlPolicy::default());
    let kw = merged(None, None);
    let small = data_url("image/png", &png(8, 8));
    // Undecodable media: 400.
    let err = image_error(&p, data_url("image/png", b"not a png"), &kw, &qwen_spec()).await;
    assert_eq!(err.kind(), ErrorKind::BadRequest, "{err}");
    // SSRF: a loopback URL is refused (400) when private hosts are not allowed.
    let err = image_error(&p, "http://127.0.0.1:9/x.png".into(), &kw, &qwen_spec()).await;
    assert!(matches!(err, PreprocessError::Policy(_)), "{err}");
    assert_eq!(err.kind(), ErrorKind::BadRequest);
    // A modality the model has no processor for.
    let err = image_error(&p, small.clone(), &kw, &ModelMediaSpec::default()).await;
    assert_eq!(err.to_string(), "The model does not accept image input.");
    // A bad media_io_kwargs value for the loader names the key.
    let cmyk = merged(None, Some(r#"{"image": {"image_mode": "CMYK"}}"#));
    let err = image_error(&p, small, &cmyk, &qwen_spec()).await;
    assert!(err.to_string().contains("image_mode"), "{err}");
    assert_eq!(err.kind(), ErrorKind::BadRequest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clip_models_get_fixed_size_tensors() {
    let p = pipeline(MediaUrlPolicy::default());
    let spec = ModelMediaSpec {
        image: Some(ImageProcessor::Clip(ClipConfig::clip_448())),
        ..ModelMediaSpec::default()
    };
    let out = p
        .process(
            &[item(
                Modality::Image,
                Some(data_url("image/png", &png(300, 200))),
                None,
            )],
            &merged(
                None,
                Some(r#"{"image": {"image_mode": "RGB", "threads": 4}}"#),
            ),
            false,
            &spec,
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let MediaTensor::Image(img) = &out[0].tensor else {
        panic!("image")
    };
    assert_eq!(img.pixel_values.shape, vec![3, 448, 448]);
    assert_eq!(img.grid_thw, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_num_frames_changes_the_token_count() {
    let clip = media_file("testsrc_h264.mp4");
    let p = pipeline(MediaUrlPolicy::default());
    let items = [item(
        Modality::Video,
        Some(data_url("video/mp4", &clip)),
        None,
    )];
    let four = p
        .process(
            &items,
            &merged(None, Some(r#"{"video": {"num_frames": 4}}"#)),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let eight = p
        .process(
            &items,
            &merged(None, Some(r#"{"video": {"num_frames": 8}}"#)),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let MediaTensor::Video {
        frames,
        timestamps_s,
    } = &four[0].tensor
    else {
        panic!("video")
    };
    assert_eq!(timestamps_s.len(), 4);
    assert_eq!(
        frames.grid_thw.unwrap()[0],
        2,
        "4 frames = 2 temporal patches"
    );
    let grid = |m: &preprocess::pipeline::ProcessedMedia| match &m.tensor {
        MediaTensor::Video { frames, .. } => frames.grid_thw.unwrap(),
        other => panic!("{other:?}"),
    };
    let (g4, g8) = (grid(&four[0]), grid(&eight[0]));
    assert_eq!((g8[0], g8[1], g8[2]), (2 * g4[0], g4[1], g4[2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_becomes_log_mel_features() {
    let wav = media_file("tone_440hz_16k_mono.wav");
    let p = pipeline(MediaUrlPolicy::default());
    let out = p
        .process(
            &[item(
                Modality::Audio,
                Some(data_url("audio/wav", &wav)),
                None,
            )],
            &merged(None, None),
            false,
            &qwen_spec(),
            TokenBudget::UNLIMITED,
        )
        .await
        .unwrap();
    let MediaTensor::Audio(f) = &out[0].tensor else {
        panic!("audio")
    };
    assert_eq!((f.n_mels, f.n_frames), (128, 3000));
    // 0.5 s at 16 kHz: 8000 samples, 50 frames of 160.
    assert_eq!(f.valid_frames, 50);
    // 50 frames -> 25 after the stride-2 conv -> 12 after pooling (Qwen2-Audio's lengths).
    assert_eq!(media::tokens::audio(f.valid_frames), 12);
}
