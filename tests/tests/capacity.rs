//! Requests the engine can never run at once are refused as client errors: `n` (times the
//! prompts) above `--max-num-seqs` is a 400 naming the field, not a 503 to retry forever.

mod common;

use common::{must, Gateway};

async fn completion(base: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_default();
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /v1/completions: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_sequences_than_the_engine_holds_is_a_400() {
    let gateway = must(Gateway::start(&["--max-num-seqs", "4"]).await);
    let base = &gateway.base_url;
    let model = "HuggingFaceTB/SmolLM2-135M-Instruct";
    let (status, body) = completion(
        base,
        serde_json::json!({"model": model, "prompt": "Hi", "n": 5, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "n", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("at most 4"),
        "{body}"
    );
    let (status, body) = completion(
        base,
        serde_json::json!({"model": model, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "prompt", "{body}");
    // Exactly the limit runs.
    let (status, body) = completion(
        base,
        serde_json::json!({"model": model, "prompt": "Hi", "n": 4, "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(4));
}
