//! A decoder embedding model served by the real binary: `tests/data/tiny-qwen3-embedding`
//! (the Qwen3-Embedding layout: `Qwen3ForCausalLM` with a sentence-transformers Pooling
//! module, so `--runner auto` pools) beside a generative decoder. `/v1/embeddings`,
//! `/pooling` and `/score` answer sentence-transformers' vectors (its `reference.json`) in
//! vLLM's shapes; an embedding request to the generative model and generation on the
//! embedding model are refused as vLLM refuses them; `--runner pooling` converts a plain
//! decoder folder.

mod common;

use common::{must, post_json, Gateway};
use serde_json::{json, Value};

const EMBEDDING: &str = "tests/data/tiny-qwen3-embedding";
const TOL: f64 = 1e-4;

fn reference() -> Value {
    let path = common::workspace_root()
        .join(EMBEDDING)
        .join("reference.json");
    must(
        std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string())),
    )
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let response = post_json(client, &url, &body).await;
    let status = response.status().as_u16();
    let body = must(response.json::<Value>().await.map_err(|e| e.to_string()));
    (status, body)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// `got` is the reference vector `want`: same length, every value within [`TOL`].
fn assert_vector(got: &Value, want: &Value, what: &str) {
    let (got, want) = (floats(got), floats(want));
    assert_eq!(got.len(), want.len(), "{what}: dimension");
    assert_eq!(got.len(), 64, "{what}: the model's hidden size");
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst <= TOL, "{what}: max |diff| {worst}");
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_embedding_model_serves_the_reference_vectors() {
    let gateway = must(
        Gateway::start(&[
            "--model",
            EMBEDDING,
            "--model",
            "tests/data/tiny-llama",
            "--served-model-name",
            "qwen3-embedding",
            "tiny",
            "--device",
            "cpu",
            "--max-model-len",
            "256",
            "--kv-cache-tokens",
            "1024",
        ])
        .await,
    );
    let base = &gateway.base_url;
    let client = common::client();
    let r = reference();
    let texts = r["texts"].as_array().unwrap().clone();
    let vectors = r["lasttoken_batch"].as_array().unwrap();
    let tokens: u64 = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ids| ids.as_array().map_or(0, |a| a.len() as u64))
        .sum();

    let text = common::get_text(&client, &format!("{base}/v1/models")).await;
    let models: Value = must(serde_json::from_str(&text).map_err(|e| format!("{e}: {text}")));
    let card = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "qwen3-embedding")
        .cloned()
        .unwrap_or_default();
    assert_eq!(card["tasks"], json!(["embed", "score"]), "{models}");
    assert_eq!(card["max_model_len"], 256, "{card}");

    let (status, body) = post(
        &client,
        format!("{base}/v1/embeddings"),
        json!({"model": "qwen3-embedding", "input": texts}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), vectors.len(), "{body}");
    for (i, (row, want)) in data.iter().zip(vectors).enumerate() {
        assert_eq!(row["index"], i as u64);
        assert_eq!(row["object"], "embedding");
        assert_vector(&row["embedding"], want, &format!("/v1/embeddings {i}"));
    }
    assert_eq!(body["usage"]["prompt_tokens"], tokens, "{body}");

    let (status, body) = post(
        &client,
        format!("{base}/pooling"),
        json!({"model": "qwen3-embedding", "input": texts[1], "task": "embed"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_vector(&body["data"][0]["data"], &vectors[1], "/pooling");

    // A score is the cosine of the two sides' vectors.
    let (status, body) = post(
        &client,
        format!("{base}/score"),
        json!({"model": "qwen3-embedding", "text_1": texts[1], "text_2": [texts[2], texts[3]]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (k, row) in body["data"].as_array().unwrap().iter().enumerate() {
        let want = cosine(&floats(&vectors[1]), &floats(&vectors[2 + k]));
        let got = row["score"].as_f64().unwrap();
        assert!((got - want).abs() <= TOL, "score {k}: {got} vs {want}");
    }

    // An embedding request to the generative model, and generation on the embedding model:
    // vLLM's 400s.
    let (status, body) = post(
        &client,
        format!("{base}/v1/embeddings"),
        json!({"model": "tiny", "input": "hello"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("Unsupported task: 'embed'"), "{body}");
    for (path, request) in [
        (
            "/v1/chat/completions",
            json!({"model": "qwen3-embedding", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "qwen3-embedding", "prompt": "hi"}),
        ),
    ] {
        let (status, body) = post(&client, format!("{base}{path}"), request).await;
        assert_eq!(status, 400, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Unsupported task: 'generate'"),
            "{path}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_pooling_converts_a_plain_decoder_folder() {
    // tiny-llama has no sentence-transformers files: `--runner pooling` serves it as vLLM's
    // `--convert embed` does, the last token's state normalised.
    let gateway = must(
        Gateway::start(&[
            "tests/data/tiny-llama",
            "--served-model-name",
            "tiny",
            "--runner",
            "pooling",
            "--device",
            "cpu",
        ])
        .await,
    );
    let client = common::client();
    let (status, body) = post(
        &client,
        format!("{}/v1/embeddings", gateway.base_url),
        json!({"model": "tiny", "input": ["one", "two words"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for row in body["data"].as_array().unwrap() {
        let v = floats(&row["embedding"]);
        assert_eq!(v.len(), 64, "{body}");
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "unit vectors: {norm}");
    }
    let (status, body) = post(
        &client,
        format!("{}/v1/completions", gateway.base_url),
        json!({"model": "tiny", "prompt": "hi"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
}
