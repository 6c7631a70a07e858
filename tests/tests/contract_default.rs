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
    placement_is_visible(&gateway).await;
}

/// With `--device auto` (the default) each decoder runs where the machine allows, and the
/// server says where: the model card's `device`, the `vllm:cache_config_info` series, and one
/// start-up line (the CPU with the reason, or the CUDA device opened).
async fn placement_is_visible(gateway: &Gateway) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = &gateway.base_url;
    let models: serde_json::Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let log = gateway.output();
    let on_cpu = log.contains("--device auto: serving on the CPU");
    assert!(
        on_cpu || log.contains("CUDA device opened"),
        "no start-up line says where the decoders run:\n{log}"
    );
    for card in models["data"].as_array().unwrap() {
        let device = card["device"].as_str().unwrap_or_default();
        let decoder = card["tasks"]
            .as_array()
            .is_some_and(|t| t.iter().any(|x| x == "generate"));
        let want_gpu = decoder && !on_cpu;
        assert!(
            if want_gpu {
                device.starts_with("cuda:")
            } else {
                device == "cpu"
            },
            "{}: device {device:?} (decoders on the CPU: {on_cpu})",
            card["id"]
        );
        if decoder {
            let series = format!("device=\"{device}\"");
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("vllm:cache_config_info")
                        && l.contains(&series)
                        && l.contains(&format!("model_name=\"{}\"", card["id"].as_str().unwrap()))),
                "no vllm:cache_config_info series for {} on {device}:\n{metrics}",
                card["id"]
            );
            assert_eq!(
                metrics.contains("vllm:gpu_cache_usage_perc"),
                want_gpu,
                "vllm:gpu_cache_usage_perc is exported exactly for GPU models"
            );
        }
    }
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
