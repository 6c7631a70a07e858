//! `--max-request-memory`: what requests in flight hold is reserved before the work, so a
//! request that does not fit beside the others gets a 503 and one that could never fit a 400
//! naming the flag, and a request's account is released when it ends. Each step waits for an
//! event (the budget's gauge on `/metrics`), never for a length of time.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{client, get_text, must, post_json, tiny_args, Gateway};
use serde_json::json;

/// 20 MiB for all requests together.
const BUDGET: &str = "20M";
/// A body the stalled request declares: held as 17 bytes a body byte (what a body grows into
/// while parsed and served, README: the memory bound) before a byte of it is read.
const DECLARED: u64 = 1_000_000;

/// The requests' budget in use, from `/metrics`.
async fn in_use(client: &reqwest::Client, base: &str) -> Option<f64> {
    let text = get_text(client, &format!("{base}/metrics")).await;
    text.lines()
        .find(|l| l.starts_with("gateway_memory_budget_in_use_bytes{budget=\"requests\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until the gauge satisfies `ok` (the deadline only ends a test that is failing).
async fn wait_for(client: &reqwest::Client, base: &str, what: &str, ok: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = in_use(client, base).await;
        if now.is_some_and(&ok) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: the gauge reads {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status_and_message(response: reqwest::Response) -> (u16, Option<String>, String) {
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: serde_json::Value = must(response.json().await.map_err(|e| e.to_string()));
    let message = body["error"]["message"].as_str().unwrap_or("").to_owned();
    (status, retry, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hold_their_memory_on_one_budget_until_they_end() {
    let gateway = must(
        Gateway::start(&tiny_args(&[
            "--max-request-memory",
            BUDGET,
            "--max-num-seqs",
            "256",
        ]))
        .await,
    );
    let base = gateway.base_url.clone();
    let client = client();
    let completions = format!("{base}/v1/completions");
    wait_for(&client, &base, "idle", |v| v == 0.0).await;

    // A request that can never fit: its 128 choices with 20 logprobs a token over the whole
    // context, more than the budget alone.
    let (status, _, message) = status_and_message(
        post_json(
            &client,
            &completions,
            &json!({"model": "tiny", "prompt": "hi", "n": 128, "logprobs": 20, "max_tokens": 4}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("--max-request-memory"), "{message}");
    assert!(
        message.contains("128 sequences with 20 logprobs"),
        "{message}"
    );

    // A request that stalls in its body holds what that body will grow into from the start.
    let address = base.trim_start_matches("http://").to_owned();
    let mut stalled = must(TcpStream::connect(&address).map_err(|e| e.to_string()));
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {DECLARED}\r\n\r\n{{\"model\": \"tiny\", \"prompt\": \""
    );
    must(
        stalled
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string()),
    );
    let held = (DECLARED * 17) as f64;
    wait_for(&client, &base, "the stalled body is held", |v| v >= held).await;

    // Beside it, a body of 300 kB (5.1 MB held) does not fit in what is left: 503, retry.
    let padded = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2,
        "user": "u".repeat(300_000)});
    let (status, retry, message) =
        status_and_message(post_json(&client, &completions, &padded).await).await;
    assert_eq!(status, 503, "{message}");
    assert!(retry.is_some(), "a 503 for load says when to retry");
    assert!(message.contains("request memory"), "{message}");
    // A small request still fits, is served, and gives back what it held.
    let small = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2});
    let (status, _, message) =
        status_and_message(post_json(&client, &completions, &small).await).await;
    assert_eq!(status, 200, "{message}");
    wait_for(&client, &base, "the small request's share is back", |v| {
        v == held
    })
    .await;

    // The stalled client goes: its account is released, and the 300 kB request is served.
    drop(stalled);
    wait_for(&client, &base, "released", |v| v == 0.0).await;
    let (status, _, message) =
        status_and_message(post_json(&client, &completions, &padded).await).await;
    assert_eq!(status, 200, "{message}");

    // A streamed answer holds its account until its last byte, then gives it back.
    let streamed = post_json(
        &client,
        &completions,
        &json!({"model": "tiny", "prompt": "hi", "max_tokens": 8, "logprobs": 3, "stream": true}),
    )
    .await;
    assert_eq!(streamed.status().as_u16(), 200);
    let text = must(streamed.text().await.map_err(|e| e.to_string()));
    assert!(text.contains("[DONE]"), "{text}");
    wait_for(&client, &base, "the stream's share is back", |v| v == 0.0).await;
    let shown = get_text(&client, &format!("{base}/metrics")).await;
    assert!(
        shown.contains(&format!(
            "gateway_memory_budget_capacity_bytes{{budget=\"requests\"}} {}",
            20u64 << 20
        )),
        "{shown}"
    );
}
