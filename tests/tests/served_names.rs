//! `--served-model-name a b` for one model, as vLLM serves it: every name is accepted in
//! requests, the first is the `model` of every response, `/v1/models` lists a card per name,
//! and each card's `root` is the model as given (here the relative path as written).

mod common;

use std::time::Duration;

use common::{must, served_as_tiny, Gateway};
use serde_json::{json, Value};

const GIVEN: &str = "tests/data/tiny-llama";

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = must(request.send().await.map_err(|e| e.to_string()));
    let status = response.status().as_u16();
    (
        status,
        must(response.json().await.map_err(|e| e.to_string())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_is_served_and_the_first_answers() {
    let mut args = served_as_tiny(GIVEN, &[]);
    // `tiny` from the helper, then two aliases: three names for one model.
    let at = args.iter().position(|a| *a == "tiny").unwrap_or(0);
    args.splice(at + 1..at + 1, ["tiny-alias", "third"]);
    let gateway = must(Gateway::start(&args).await);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap_or_default();

    let (_, models) = send(client.get(format!("{}/v1/models", gateway.base_url))).await;
    let cards = models["data"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = cards.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, ["tiny", "tiny-alias", "third"], "{models}");
    assert!(cards.iter().all(|c| c["root"] == GIVEN), "{models}");

    for (route, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 2})),
    ] {
        for name in ["tiny-alias", "third", "tiny"] {
            let mut body = body.clone();
            body["model"] = json!(name);
            let url = format!("{}{route}", gateway.base_url);
            let (status, reply) = send(client.post(url).json(&body)).await;
            assert_eq!(status, 200, "{route} as {name}: {reply}");
            assert_eq!(reply["model"], "tiny", "{route} as {name}: {reply}");
        }
    }
    let (status, reply) = send(
        client
            .post(format!("{}/v1/completions", gateway.base_url))
            .json(&json!({"model": "other", "prompt": "hi", "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, 404, "{reply}");
}
