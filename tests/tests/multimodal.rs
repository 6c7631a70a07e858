//! Media through HTTP on the tiny checkpoints (`tests/data/tiny-qwen2-vl`,
//! `tests/data/tiny-qwen2-audio`): an image, a video (a JPEG frame list) and an audio clip
//! answer 200 with the prompt token counts of the reference processor; `num_frames` from a
//! trusted deployment gives fewer tokens than the default; the same kwargs on a default
//! deployment are the gate's 400, before any media is fetched; a photo whose tokens cannot fit
//! the context is a 400 from its header, before the server decodes or encodes it.

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::{must, workspace_root, Gateway, MediaServer};
use serde_json::{json, Value};

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The 8 PNG frames of the reference video as one `data:video/jpeg` frame list.
fn video_url(dir: &std::path::Path) -> String {
    let frames: Vec<String> = (0..8)
        .map(|i| {
            let img = must(
                image::open(dir.join(format!("media/video_80x60/frame_{i:02}.png")))
                    .map_err(|e| e.to_string()),
            );
            let mut jpeg = Vec::new();
            must(
                img.to_rgb8()
                    .write_to(
                        &mut std::io::Cursor::new(&mut jpeg),
                        image::ImageFormat::Jpeg,
                    )
                    .map_err(|e| e.to_string()),
            );
            base64::engine::general_purpose::STANDARD.encode(jpeg)
        })
        .collect();
    format!("data:video/jpeg;base64,{}", frames.join(","))
}

/// A chat request with one media part followed by `text` (the reference cases' shape).
async fn chat(base: &str, model: &str, part: Value, text: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}],
        "max_tokens": 3,
        "temperature": 0
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let client = must(
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string()),
    );
    let resp = common::post_json(&client, &format!("{base}/v1/chat/completions"), &body).await;
    let status = resp.status().as_u16();
    let json = must(resp.json::<Value>().await.map_err(|e| e.to_string()));
    (status, json)
}

fn prompt_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_videos_and_audio_through_http_on_the_tiny_models() {
    let root = workspace_root().join("tests/data");
    let vl_dir = root.join("tiny-qwen2-vl");
    let vl_path = vl_dir.display().to_string();
    let trusted = must(
        Gateway::start(&[
            "--model",
            &vl_path,
            "--served-model-name",
            "tiny-vl",
            "--trust-request-mm-kwargs",
        ])
        .await,
    );
    let models = must(
        reqwest::get(format!("{}/v1/models", trusted.base_url))
            .await
            .map_err(|e| e.to_string()),
    );
    let models: Value = must(models.json().await.map_err(|e| e.to_string()));
    assert!(
        models.to_string().contains("image") && models.to_string().contains("video"),
        "{models}"
    );

    // An image: 64x48 -> 56x56 -> 2x2 merged tokens; 35 prompt tokens as the reference counts.
    let png = must(std::fs::read(vl_dir.join("media/image_64x48.png")).map_err(|e| e.to_string()));
    let image = json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png)}});
    let (status, body) = chat(
        &trusted.base_url,
        "tiny-vl",
        image.clone(),
        "Describe this image.",
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(prompt_tokens(&body), 35, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");

    // A video of 8 frames: by default all of them (24 tokens); num_frames 4 halves that.
    let video = json!({"type": "video_url", "video_url": {"url": video_url(&vl_dir)}});
    let (status, all) = chat(
        &trusted.base_url,
        "tiny-vl",
        video.clone(),
        "What is in the video?",
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(prompt_tokens(&all), 57, "{all}");
    let (status, four) = chat(
        &trusted.base_url,
        "tiny-vl",
        video.clone(),
        "What is in the video?",
        json!({"media_io_kwargs": {"video": {"num_frames": 4}}}),
    )
    .await;
    assert_eq!(status, 200, "{four}");
    assert_eq!(
        prompt_tokens(&all) - prompt_tokens(&four),
        12,
        "{all} {four}"
    );

    drop(trusted);

    // Default deployment: the same kwargs are the gate's 400 and nothing is fetched.
    let default =
        must(Gateway::start(&["--model", &vl_path, "--served-model-name", "tiny-vl"]).await);
    let media = must(MediaServer::start().await);
    let fetched =
        json!({"type": "image_url", "image_url": {"url": format!("{}/a.png", media.base_url)}});
    let (status, body) = chat(
        &default.base_url,
        "tiny-vl",
        fetched,
        "Describe this image.",
        json!({"media_io_kwargs": {"video": {"num_frames": 4}}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "media_io_kwargs", "{body}");
    assert_eq!(media.hits(), 0);
    // Without kwargs the default deployment serves the image too; with a uuid, a later part
    // with that uuid and no data is served from the cache, an unknown one is the contract's
    // cache-miss 400.
    let ask = |part: Value| {
        chat(
            &default.base_url,
            "tiny-vl",
            part,
            "Describe this image.",
            json!({}),
        )
    };
    let mut with_uuid = image.clone();
    with_uuid["uuid"] = json!("img-1");
    let (status, body) = ask(with_uuid).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(prompt_tokens(&body), 35, "{body}");
    let (status, again) = ask(json!({"type": "image_url", "uuid": "img-1"})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(prompt_tokens(&again), 35, "{again}");
    assert_eq!(
        again["choices"][0]["message"],
        body["choices"][0]["message"]
    );
    let (status, body) = ask(json!({"type": "image_url", "uuid": "never-sent"})).await;
    assert_eq!(status, 400, "{body}");
    let msg = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.starts_with("Cache miss for image at index 0"), "{msg}");
    drop(default);

    // Audio: a 2 s clip -> 50 tokens, 89 prompt tokens as the reference counts.
    let au_dir = root.join("tiny-qwen2-audio");
    let au_path = au_dir.display().to_string();
    let audio_gw =
        must(Gateway::start(&["--model", &au_path, "--served-model-name", "tiny-audio"]).await);
    let wav = must(std::fs::read(au_dir.join("media/tone_2s.wav")).map_err(|e| e.to_string()));
    let b64 = base64::engine::general_purpose::STANDARD.encode(&wav);
    let audio = json!({"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}});
    let (status, body) = chat(
        &audio_gw.base_url,
        "tiny-audio",
        audio,
        "What sound is this?",
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(prompt_tokens(&body), 89, "{body}");
    // An image to the audio model is refused, naming the model and modality.
    let png_part = json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png)}});
    let (status, body) = chat(
        &audio_gw.base_url,
        "tiny-audio",
        png_part,
        "What sound is this?",
        json!({}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let msg = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("tiny-audio") && msg.contains("image"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_over_the_context_is_refused_from_its_header() {
    let vl_path = workspace_root()
        .join("tests/data/tiny-qwen2-vl")
        .display()
        .to_string();
    // Images keep their size here: 4000x3000 would be 15,301 tokens (61,204 patches, whose
    // whole attention matrix alone would be 15 GB), against a context of 4096.
    let gw = must(
        Gateway::start(&[
            "--model",
            &vl_path,
            "--served-model-name",
            "tiny-vl",
            "--mm-processor-kwargs",
            r#"{"max_pixels": 40000000}"#,
        ])
        .await,
    );
    let photo = image::RgbImage::from_fn(4000, 3000, |x, y| {
        image::Rgb([(x / 16) as u8, (y / 12) as u8, ((x + y) / 28) as u8])
    });
    let mut png = Vec::new();
    must(
        photo
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| e.to_string()),
    );
    drop(photo);
    let part = json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png)}});
    let (status, body) = chat(&gw.base_url, "tiny-vl", part, "Describe it.", json!({})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("The image at index 0 (4000x3000 pixels) needs 15301 prompt tokens")
            && msg.contains("tokens of the model's context are left for media"),
        "{msg}"
    );
    // Decoding alone would hold 36 MB of RGB and 288 MB of patches.
    if let Some(peak) = gw.peak_rss() {
        eprintln!("gateway peak RSS {} MiB", peak >> 20);
        assert!(
            peak < 256 << 20,
            "the gateway's peak RSS reached {peak} bytes"
        );
    }
}
