//! The same request gives the same answer under any load. On the default chat model, a set of
//! prompts (chat and completion, one long enough that its prefill is chunked at
//! `--max-num-batched-tokens 64`), greedy and seeded, each with logprobs: sent one at a time,
//! then all at once among noise requests of random lengths, then one at a time again (each now
//! a prefix-cache hit). Every reply's text and logprobs, as serialised, must be identical in
//! the three runs; in the default mode (q8 activations) and in `--activation-precision f32`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{must, Gateway};
use serde_json::{json, Value};

const MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
/// Small enough that the long prompt is prefilled in several chunks, and that the crowd's
/// prefills and decodes share steps.
const STEP_TOKENS: &str = "64";
const MAX_TOKENS: u64 = 10;

/// (route, body) of every request whose reply is compared.
fn probes() -> Vec<(&'static str, Value)> {
    let long = "The history of the river valley is long and varied. ".repeat(16);
    let chats = [
        "Name three colours.",
        "What is the capital of France? Answer in one word.",
        "Write a haiku about the sea.",
    ];
    let completions = [
        "Once upon a time".to_string(),
        "def fibonacci(n):".to_string(),
        format!("{long}In summary,"),
    ];
    let mut out = Vec::new();
    for sampling in [
        json!({"temperature": 0.0}),
        json!({"temperature": 0.9, "seed": 7}),
    ] {
        for c in chats {
            let mut body = json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": c}],
                "max_tokens": MAX_TOKENS,
                "logprobs": true,
                "top_logprobs": 3,
            });
            merge(&mut body, &sampling);
            out.push(("/v1/chat/completions", body));
        }
        for p in &completions {
            let mut body = json!({
                "model": MODEL,
                "prompt": p,
                "max_tokens": MAX_TOKENS,
                "logprobs": 3,
            });
            merge(&mut body, &sampling);
            out.push(("/v1/completions", body));
        }
    }
    out
}

fn merge(body: &mut Value, extra: &Value) {
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
}

/// Noise: completions of pseudo-random prompt lengths and budgets (xorshift from `seed`).
fn noise(seed: u64, n: usize) -> Vec<Value> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|_| {
            let words = 1 + (next() % 120) as usize;
            json!({
                "model": MODEL,
                "prompt": "noise words ".repeat(words),
                "max_tokens": 1 + next() % 24,
                "temperature": 1.0,
            })
        })
        .collect()
}

/// What is compared of a reply: the text and the logprobs, as the server serialised them.
fn answer(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let choice = &v["choices"][0];
    let text = choice["message"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {body}"));
    assert!(!choice["logprobs"].is_null(), "no logprobs in {body}");
    format!("{text:?} {}", choice["logprobs"])
}

async fn send(client: &reqwest::Client, base: &str, route: &str, body: &Value) -> String {
    let reply = client
        .post(format!("{base}{route}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    assert_eq!(status, 200, "{route}: {text}");
    text
}

async fn one_at_a_time(client: &reqwest::Client, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (route, body) in probes() {
        out.push(answer(&send(client, base, route, &body).await));
    }
    out
}

async fn in_a_crowd(client: &reqwest::Client, base: &str, seed: u64) -> Vec<String> {
    let mut noise_tasks = Vec::new();
    for body in noise(seed, 12) {
        let (client, base) = (client.clone(), base.to_string());
        noise_tasks.push(tokio::spawn(async move {
            send(&client, &base, "/v1/completions", &body).await
        }));
    }
    let mut probe_tasks = Vec::new();
    for (route, body) in probes() {
        let (client, base) = (client.clone(), base.to_string());
        probe_tasks.push(tokio::spawn(async move {
            answer(&send(&client, &base, route, &body).await)
        }));
    }
    let mut out = Vec::new();
    for t in probe_tasks {
        out.push(t.await.unwrap());
    }
    for t in noise_tasks {
        t.await.unwrap();
    }
    out
}

async fn check_mode(extra: &[&str]) {
    let mut args = vec!["--max-num-batched-tokens", STEP_TOKENS];
    args.extend_from_slice(extra);
    let gateway = must(Gateway::start(&args).await);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = gateway.base_url.clone();
    let alone = one_at_a_time(&client, &base).await;
    let seed = 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id());
    eprintln!("noise seed {seed:#x} ({extra:?})");
    let crowd = in_a_crowd(&client, &base, seed).await;
    let again = one_at_a_time(&client, &base).await;
    let names: Vec<String> = probes()
        .iter()
        .map(|(route, body)| {
            format!(
                "{route} {}",
                body.get("seed")
                    .map_or("greedy".into(), |s| format!("seed {s}"))
            )
        })
        .collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(
            alone[i], crowd[i],
            "{extra:?} {name} #{i}: alone and in a crowd (noise seed {seed:#x}) differ"
        );
        assert_eq!(
            alone[i], again[i],
            "{extra:?} {name} #{i}: alone and again after a prefix-cache hit differ"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replies_are_identical_alone_in_a_crowd_and_after_a_cache_hit() {
    check_mode(&[]).await;
    check_mode(&["--activation-precision", "f32"]).await;
}
