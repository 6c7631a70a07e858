//! The contract suite against a default deployment (no trust flags), with a counting
//! media server the gateway may reach: refused kwargs must never cause a fetch.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{assert_report, must, Gateway, MediaServer};
use contract::{ServerMode, SuiteConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_deployment_meets_the_contract() {
    let media = must(MediaServer::start().await);
    let gateway = must(Gateway::start(&["--allowed-media-domains", "127.0.0.1"]).await);
    let mut cfg = SuiteConfig::new(&gateway.base_url);
    cfg.mode = ServerMode::Default;
    cfg.media_base_url = Some(media.base_url.clone());
    let report = contract::run(&cfg).await;
    assert!(
        report
            .cases
            .iter()
            .any(|case| case.name.starts_with("media[")),
        "the media cases did not run"
    );
    assert_eq!(
        media.hits(),
        0,
        "the media server was fetched although every media request carried refused kwargs"
    );
    assert_report(&report, "default");
    routes_outside_the_post_table(&gateway.base_url).await;
}

/// The server sends POSTs to its fixed routes straight to their handlers and everything else
/// through the router: a GET on a POST route, a POST the router serves (`/ping`), a path that
/// is almost a route, and a GET route still get their own answers.
async fn routes_outside_the_post_table(base: &str) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let chat = format!("{base}/v1/chat/completions");
    let get_chat = client.get(&chat).send().await.unwrap();
    assert_eq!(get_chat.status().as_u16(), 400, "GET on a POST route");
    let body: serde_json::Value = get_chat.json().await.unwrap();
    assert_eq!(
        body["error"]["message"], "Method Not Allowed for this route.",
        "{body}"
    );
    let ping = client.post(format!("{base}/ping")).send().await.unwrap();
    assert_eq!(ping.status().as_u16(), 200, "POST /ping");
    for path in [
        "/v1/chat/completions/",
        "/v1/chat/completion",
        "/V1/completions",
    ] {
        let reply = client
            .post(format!("{base}{path}"))
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 404, "POST {path}");
        let body: serde_json::Value = reply.json().await.unwrap();
        assert_eq!(body["error"]["code"], 404, "POST {path}: {body}");
    }
    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
}
