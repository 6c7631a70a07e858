//! SIGTERM drains and exits 0 within `--shutdown-timeout`: a request in flight finishes, and a
//! client that never finishes sending its request does not hold the process.
//!
//! No assert here is a latency a loaded machine could miss: a 1 s drain is checked against a
//! bound 30 times longer, with every other timer that could end the process (header and request
//! timeouts) set past it, and "did not wait for the drain" against a 600 s drain.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{must, workspace_root, Gateway};

fn tiny() -> String {
    workspace_root()
        .join("tests/data/tiny-llama")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_does_not_hold_the_shutdown() {
    let model = tiny();
    let mut gateway = must(
        Gateway::start(&[
            "--model",
            &model,
            "--shutdown-timeout",
            "1",
            "--header-read-timeout",
            "600",
        ])
        .await,
    );
    // Headers promising a body that never comes.
    let mut stuck = std::net::TcpStream::connect(("127.0.0.1", gateway.port))
        .unwrap_or_else(|e| panic!("connect: {e}"));
    stuck
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .unwrap_or_else(|e| panic!("write: {e}"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    // `None` unless it exits by itself within 30 s: 30 drains, and nothing else (the request
    // timeout is 600 s) would end the stuck request before then.
    let status = gateway.terminate(Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?} after {took:?} with a 1 s drain; output:\n{}",
        gateway.output()
    );
    assert!(gateway.output().contains("drain timeout passed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_finishes_during_the_drain() {
    let model = tiny();
    let mut gateway = must(Gateway::start(&["--model", &model, "--shutdown-timeout", "600"]).await);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let mut resp = client
        .post(format!("{}/v1/completions", gateway.base_url))
        .json(&serde_json::json!({
            "model": model, "prompt": "Once", "max_tokens": 1500, "ignore_eos": true,
            "stream": true, "temperature": 0
        }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("request: {e}"));
    assert_eq!(resp.status().as_u16(), 200);
    let first = resp.chunk().await.unwrap_or_default();
    assert!(first.is_some(), "no first chunk");
    let term = tokio::spawn(async move {
        let started = Instant::now();
        // Well short of the 600 s drain, and far past the stream's own length.
        let status = gateway.terminate(Duration::from_secs(120)).await;
        (status, started.elapsed(), gateway.output())
    });
    let mut body = String::from_utf8_lossy(&first.unwrap_or_default()).into_owned();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        body.trim_end().ends_with("data: [DONE]"),
        "the stream did not finish: ...{}",
        &body[body.len().saturating_sub(300)..]
    );
    let (status, took, output) = term.await.unwrap_or_else(|e| panic!("join: {e}"));
    // The process left as soon as its last request ended, not when the drain ran out.
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?} after {took:?}; output:\n{output}"
    );
    assert!(!output.contains("drain timeout passed"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_drain_ends_with_an_error_event() {
    // The default SmolLM2 on the CPU takes over a minute for 8000 tokens: far past a 1 s drain,
    // and past the 30 s the process is given to exit, so a shutdown that waited for the
    // generation fails.
    let mut gateway = must(Gateway::start(&["--shutdown-timeout", "1"]).await);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let mut resp = client
        .post(format!("{}/v1/completions", gateway.base_url))
        .json(&serde_json::json!({
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "Once upon a time",
            "max_tokens": 8000, "ignore_eos": true, "stream": true
        }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("request: {e}"));
    assert_eq!(resp.status().as_u16(), 200);
    let first = resp.chunk().await.unwrap_or_default().unwrap_or_default();
    let term = tokio::spawn(async move {
        let started = Instant::now();
        let status = gateway.terminate(Duration::from_secs(30)).await;
        (status, started.elapsed(), gateway.output())
    });
    let mut body = String::from_utf8_lossy(&first).into_owned();
    while let Ok(Some(chunk)) = resp.chunk().await {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events: Vec<&str> = body
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(events.last().copied(), Some("data: [DONE]"), "{body:.300}");
    let error = events[events.len() - 2];
    assert!(
        error.contains("\"error\"") && error.contains("shutting down"),
        "the last event before [DONE] should say why the stream ended: {error}"
    );
    let (status, took, output) = term.await.unwrap_or_else(|e| panic!("join: {e}"));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?} after {took:?} with a 1 s drain; output:\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_reply_longer_than_the_drain_is_a_503() {
    // As above, but not streamed: the reply's head has not gone out when the drain ends, so the
    // client gets a 503 in the error envelope rather than a cut connection.
    let mut gateway = must(Gateway::start(&["--shutdown-timeout", "1"]).await);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let url = format!("{}/v1/completions", gateway.base_url);
    let request = tokio::spawn(async move {
        let resp = client
            .post(url)
            .json(&serde_json::json!({
                "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "prompt": "Once upon a time",
                "max_tokens": 8000, "ignore_eos": true
            }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("request: {e}"));
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let status = gateway.terminate(Duration::from_secs(30)).await;
    let took = started.elapsed();
    let (code, body) = request.await.unwrap_or_else(|e| panic!("join: {e}"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?} after {took:?} with a 1 s drain; output:\n{}",
        gateway.output()
    );
}
