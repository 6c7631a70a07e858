//! An engine thread that dies fails its requests and then takes the process down with a
//! non-zero status, so a supervisor restarts it instead of leaving a server that looks alive
//! but cannot serve. The fault is injected with `ENGINE_FAULT_INJECT=scheduler-panic`, which
//! only a binary built with the `fault-inject` feature reads (`make test` builds it so).

mod common;

use std::time::Duration;

use common::{must, workspace_root, Gateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_fails_its_requests_and_exits_non_zero() {
    let model = workspace_root()
        .join("tests/data/tiny-llama")
        .display()
        .to_string();
    let mut gateway = must(
        Gateway::start_with_env(
            &["--model", &model],
            &[("ENGINE_FAULT_INJECT", "scheduler-panic")],
        )
        .await,
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_else(|e| panic!("client: {e}"));
    let reply = client
        .post(format!("{}/v1/completions", gateway.base_url))
        .json(&serde_json::json!({"model": model, "prompt": "Hi", "max_tokens": 4}))
        .send()
        .await;
    // The request fails (an error answer, or the connection closing as the process exits);
    // it never hangs and never succeeds.
    if let Ok(resp) = reply {
        assert!(
            !resp.status().is_success(),
            "a request to a dead engine succeeded: {}",
            resp.status()
        );
    }
    let status = gateway.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(70),
        "exit status {status:?} (a gateway built without `--features fault-inject` ignores \
         ENGINE_FAULT_INJECT: `make test` builds it with the feature); output:\n{}",
        gateway.output()
    );
    assert!(gateway.output().contains("an engine thread stopped"));
}
