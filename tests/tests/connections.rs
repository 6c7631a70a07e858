//! Connection hygiene: a client that never finishes its headers (slowloris) and an idle
//! keep-alive connection are closed after `--header-read-timeout`, connections past
//! `--max-connections` are closed as they arrive, and the server keeps answering meanwhile.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{must, workspace_root, Gateway};

fn tiny() -> String {
    workspace_root()
        .join("tests/data/tiny-llama")
        .display()
        .to_string()
}

/// How long until the server closes `stream` (reads until EOF); `None` if it is still open
/// after `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap_or_else(|e| panic!("set_read_timeout: {e}"));
    let mut buf = [0u8; 4096];
    while started.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn healthy(base: &str) -> bool {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    client
        .get(format!("{base}/health"))
        .send()
        .await
        .is_ok_and(|r| r.status().as_u16() == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_idle_keep_alive_are_closed() {
    let model = tiny();
    let gateway = must(Gateway::start(&["--model", &model, "--header-read-timeout", "1"]).await);
    // Half a request line, then nothing.
    let mut slow = connect(gateway.port);
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n")
        .unwrap_or_else(|e| panic!("write: {e}"));
    // A complete request on a keep-alive connection, then silence.
    let mut idle = connect(gateway.port);
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap_or_else(|e| panic!("write: {e}"));
    let slow_took = closed_within(&mut slow, Duration::from_secs(5));
    let idle_took = closed_within(&mut idle, Duration::from_secs(5));
    assert!(
        slow_took.is_some_and(|t| t < Duration::from_secs(3)),
        "a connection that never finished its headers was left open: {slow_took:?}"
    );
    assert!(
        idle_took.is_some_and(|t| t < Duration::from_secs(3)),
        "an idle keep-alive connection was left open: {idle_took:?}"
    );
    assert!(healthy(&gateway.base_url).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_and_the_rest_served() {
    let model = tiny();
    let gateway = must(
        Gateway::start(&[
            "--model",
            &model,
            "--max-connections",
            "3",
            "--header-read-timeout",
            "30",
        ])
        .await,
    );
    // Let the start-up health checks' connections go.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect(gateway.port)).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = connect(gateway.port);
    let took = closed_within(&mut extra, Duration::from_secs(3));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "a connection past the cap was kept: {took:?}"
    );
    // Freeing one slot lets the next client in.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(healthy(&gateway.base_url).await);
    assert!(gateway.output().contains("connection limit reached"));
}

/// Tokenising large texts does not stall the server: while two 8 MB `/tokenize` requests (no
/// length limit there, as in vLLM) are being tokenised, `/health` keeps answering within a
/// second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tokenize_requests_do_not_stall_health() {
    let gateway = must(Gateway::start(&["--model", &tiny(), "--served-model-name", "tiny"]).await);
    let base = gateway.base_url.clone();
    let text = "lorem ipsum dolor sit amet ".repeat(300_000);
    let mut big = Vec::new();
    for _ in 0..2 {
        let (base, text) = (base.clone(), text.clone());
        big.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_default();
            client
                .post(format!("{base}/tokenize"))
                .json(&serde_json::json!({"model": "tiny", "prompt": text}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    // Probe while the tokenisers run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        assert!(
            healthy(&base).await,
            "/health failed during large tokenisation"
        );
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    for task in big {
        let status = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status.ok(), Some(200));
    }
}
