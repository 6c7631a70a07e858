//! Connection hygiene: a client that never finishes its headers (slowloris) and an idle
//! keep-alive connection are closed after `--header-read-timeout`, connections past
//! `--max-connections` are closed as they arrive, and the server keeps answering meanwhile.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::{closed_within, must, workspace_root, Gateway};

fn tiny() -> String {
    workspace_root()
        .join("tests/data/tiny-llama")
        .display()
        .to_string()
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn healthy(base: &str) -> bool {
    let client = reqwest::Client::builder()
        .no_proxy()
        // Long enough that load cannot time a probe out; what the tests check is whether and
        // in which order it is answered.
        .timeout(Duration::from_secs(60))
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
    // 20 times the 1 s timeout, and short of hyper's 30 s default.
    let slow_took = closed_within(&mut slow, Duration::from_secs(20));
    let idle_took = closed_within(&mut idle, Duration::from_secs(20));
    assert!(
        slow_took.is_some(),
        "a connection that never finished its headers was left open"
    );
    assert!(
        idle_took.is_some(),
        "an idle keep-alive connection was left open"
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
            "600",
        ])
        .await,
    );
    // Let the start-up health checks' connections go.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect(gateway.port)).collect();
    let mut extra = connect(gateway.port);
    // The held connections send nothing and are not closed for 600 s: the one past the cap is
    // closed long before that, and a server that kept it would not close it in this minute.
    let took = closed_within(&mut extra, Duration::from_secs(60));
    assert!(took.is_some(), "a connection past the cap was kept");
    // Freeing one slot lets the next client in, once the server has seen it go.
    drop(held.pop());
    let mut served = false;
    for _ in 0..60 {
        served = healthy(&gateway.base_url).await;
        if served {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(served, "a freed slot did not let a client in");
    assert!(gateway.output().contains("connection limit reached"));
}

/// Tokenising large texts does not stall the server: while two 8 MB `/tokenize` requests (no
/// length limit there, as in vLLM) are being tokenised, `/health` keeps answering. Told by
/// order, not by latency: every probe is answered before either large request's answer
/// arrives, which a server that tokenised on its reactor threads could not do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tokenize_requests_do_not_stall_health() {
    let gateway = must(Gateway::start(&["--model", &tiny(), "--served-model-name", "tiny"]).await);
    let base = gateway.base_url.clone();
    let text = "lorem ipsum dolor sit amet ".repeat(300_000);
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut big = Vec::new();
    for _ in 0..2 {
        let (base, text, answered) = (base.clone(), text.clone(), answered.clone());
        big.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap_or_default();
            let resp = client
                .post(format!("{base}/tokenize"))
                .json(&serde_json::json!({"model": "tiny", "prompt": text}))
                .send()
                .await;
            answered.store(true, std::sync::atomic::Ordering::SeqCst);
            resp.map(|r| r.status().as_u16())
        }));
    }
    // Probe while the tokenisers run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for probe in 0..5 {
        assert!(
            healthy(&base).await,
            "/health failed during large tokenisation"
        );
        assert!(
            !answered.load(std::sync::atomic::Ordering::SeqCst),
            "/health probe {probe} was answered only after a large tokenisation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in big {
        let status = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status.ok(), Some(200));
    }
}
