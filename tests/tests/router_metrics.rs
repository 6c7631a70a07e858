//! `/metrics` scraped as the Gateway API Inference Extension's endpoint picker scrapes a vLLM
//! server: the router gauges are found by vLLM's names, typed gauge, labelled `model_name` and
//! `engine`, and their values follow the load (a streaming request is running, one held back
//! by `--max-num-active-seqs 1` is waiting, both are gone once their clients hang up).

mod common;

use std::time::{Duration, Instant};

use common::{must, post_json, Gateway};
use contract::cases::router::{router_problems, Scrape, KV_USAGE, RUNNING, WAITING};

const CHAT_MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
const EMBED_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// How long the gauges may take to reach the expected load on a loaded machine.
const SETTLE: Duration = Duration::from_secs(90);

async fn scrape(client: &reqwest::Client, base: &str) -> Scrape {
    let text = common::get_text(client, &format!("{base}/metrics")).await;
    must(Scrape::parse(&text).map_err(|e| format!("{e}\n{text}")))
}

/// The chat model's (running, waiting) as the picker reads them, filtered by `model_name`.
fn load(scrape: &Scrape) -> (f64, f64) {
    let of = [("model_name", CHAT_MODEL)];
    (
        must(scrape.picked(RUNNING, &of)),
        must(scrape.picked(WAITING, &of)),
    )
}

/// Polls `/metrics` until `want` holds; the last scrape either way.
async fn until(
    client: &reqwest::Client,
    base: &str,
    what: &str,
    want: impl Fn(&Scrape) -> bool,
) -> Scrape {
    let started = Instant::now();
    loop {
        let now = scrape(client, base).await;
        if want(&now) {
            return now;
        }
        assert!(
            started.elapsed() < SETTLE,
            "{what}: (running, waiting) still {:?} after {}s",
            load(&now),
            SETTLE.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A streaming chat that would run for thousands of tokens; the response, once its first
/// bytes arrived.
async fn long_stream(client: &reqwest::Client, base: &str) -> reqwest::Response {
    let body = serde_json::json!({
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Count from one to a million."}],
        "max_tokens": 4000,
        "ignore_eos": true,
        "stream": true,
    });
    let response = post_json(client, &format!("{base}/v1/chat/completions"), &body).await;
    assert_eq!(response.status(), 200);
    response
}

#[tokio::test]
async fn the_endpoint_picker_reads_vllm_router_gauges_that_follow_the_load() {
    let gateway = must(Gateway::start(&["--max-num-active-seqs", "1"]).await);
    let base = gateway.base_url.clone();
    let client = common::client();

    let idle = scrape(&client, &base).await;
    for model in [CHAT_MODEL, EMBED_MODEL] {
        let problems = router_problems(&idle, Some(model));
        // The embedding model has no KV cache, so no cache_config_info of its own.
        let problems: Vec<&String> = problems
            .iter()
            .filter(|p| model == CHAT_MODEL || !p.contains("cache_config_info"))
            .collect();
        assert!(problems.is_empty(), "{model}: {problems:?}");
    }
    assert_eq!(load(&idle), (0.0, 0.0));

    let mut first = long_stream(&client, &base).await;
    must(first.chunk().await.map_err(|e| e.to_string()));
    let running = until(&client, &base, "one stream running", |s| {
        load(s) == (1.0, 0.0)
    })
    .await;
    let usage = must(running.picked(KV_USAGE, &[("model_name", CHAT_MODEL)]));
    assert!(
        usage > 0.0 && usage <= 1.0,
        "{KV_USAGE} = {usage} while a sequence holds KV blocks"
    );

    // The second is admitted into the engine but not into the running batch.
    let second = {
        let client = client.clone();
        let base = base.clone();
        tokio::spawn(async move { long_stream(&client, &base).await })
    };
    until(&client, &base, "one running, one waiting", |s| {
        load(s) == (1.0, 1.0)
    })
    .await;

    second.abort();
    drop(second);
    drop(first);
    until(&client, &base, "both cancelled", |s| load(s) == (0.0, 0.0)).await;

    // The embedding model's requests count as running while its worker has them in hand.
    let inputs: Vec<String> = (0..256)
        .map(|i| format!("Sentence number {i} about the weather, the sea and the mountains."))
        .collect();
    let batch = {
        let client = client.clone();
        let url = format!("{base}/v1/embeddings");
        let body = serde_json::json!({"model": EMBED_MODEL, "input": inputs});
        tokio::spawn(async move { post_json(&client, &url, &body).await.status().as_u16() })
    };
    let of = [("model_name", EMBED_MODEL)];
    let mut seen = false;
    while !batch.is_finished() && !seen {
        seen = must(scrape(&client, &base).await.picked(RUNNING, &of)) == 1.0;
    }
    assert_eq!(must(batch.await.map_err(|e| e.to_string())), 200);
    assert!(
        seen,
        "{RUNNING} of {EMBED_MODEL} never showed the batch in hand"
    );
    until(&client, &base, "the batch answered", |s| {
        s.picked(RUNNING, &of).is_ok_and(|running| running == 0.0)
    })
    .await;
}
