//! `gateway upgrade-check` end to end: it passes against this server's default deployment, and
//! against a fake deployment (a small axum server answering as a correct one would) broken one
//! condition at a time it fails on exactly the row of that condition.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use common::{must, upgrade_check, Gateway};
use contract::expect::GateField;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn passes_against_the_default_deployment() {
    let media = r#"{"video": {"num_frames": 40}}"#;
    let gateway = must(Gateway::start(&["--media-io-kwargs", media]).await);
    let outcome = upgrade_check(vec![
        "--base-url".into(),
        gateway.base_url.clone(),
        "--".into(),
        "vllm".into(),
        "serve".into(),
        "--enable-prefix-caching".into(),
        "--max_num_seqs".into(),
        "64".into(),
        "--media-io-kwargs".into(),
        media.into(),
    ])
    .await;
    assert_eq!(outcome.code, Some(0), "{}", outcome.stdout);
    assert!(outcome.failed().is_empty(), "{}", outcome.stdout);
    for section in [
        "config",
        "contract",
        "trust",
        "weight-cache",
        "router",
        "output",
    ] {
        assert!(
            outcome.rows.iter().any(|(s, _, _, _)| s == section),
            "no {section} row:\n{}",
            outcome.stdout
        );
    }
    let passed_routes = outcome
        .rows
        .iter()
        .filter(|(s, _, status, _)| s == "contract" && status == "pass")
        .count();
    assert_eq!(passed_routes, 8, "{}", outcome.stdout);
    // This server's cards say what it applies and how wide its vectors are.
    let kwargs = outcome.row("trust", "deployment mm_processor_kwargs / media_io_kwargs");
    assert_eq!(kwargs.0, "pass", "{}", outcome.stdout);
    let embed = outcome.row("output", "sentence-transformers/all-MiniLM-L6-v2");
    assert!(embed.1.contains("stated 384"), "{}", outcome.stdout);
}

/// A deployment started with `--trust-request-mm-kwargs` passes when its command line says
/// so (the gate matrix then runs trusted), and fails on the trust row alone when it does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_trusting_deployment_passes_only_with_the_flag_on_its_command_line() {
    let gateway = must(Gateway::start(&["--trust-request-mm-kwargs"]).await);
    let base = gateway.base_url.clone();
    let with_flag = upgrade_check(vec![
        "--base-url".into(),
        base.clone(),
        "--".into(),
        "--trust-request-mm-kwargs".into(),
    ])
    .await;
    assert_eq!(with_flag.code, Some(0), "{}", with_flag.stdout);
    let chat = with_flag.row("contract", "POST /v1/chat/completions");
    assert!(chat.1.contains("(trusted)"), "{}", with_flag.stdout);

    let without = upgrade_check(vec!["--base-url".into(), base]).await;
    assert_eq!(
        without.failed(),
        [("trust", "per-request mm_processor_kwargs / media_io_kwargs")],
        "{}",
        without.stdout
    );
}

/// The one condition a fake deployment gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    Nothing,
    /// `/v1/completions` refuses `{}` as if it were non-empty.
    CompletionsRefusesEmpty,
    /// Every client is trusted, although the command line does not say so.
    TrustsEveryone,
    /// The cards list a deployment `media_io_kwargs` the configuration does not set.
    UnconfiguredKwargs,
    /// The weight-cache daemon answers 503.
    DaemonUnhealthy,
    /// The chat model's weights came from disk.
    WeightsFromDisk,
    /// `vllm:kv_cache_usage_perc` has no TYPE line.
    UntypedUsage,
    /// Chat and completion answer with empty text.
    EmptyText,
    /// The vectors are shorter than the card states.
    WrongEmbeddingSize,
}

const CHAT: &str = "fake-chat";
const EMBED: &str = "fake-embed";
const STATED_SIZE: usize = 4;

fn error(status: StatusCode, kind: &str, param: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

fn non_empty(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_object)
        .is_some_and(|map| !map.is_empty())
}

async fn models(State(broken): State<Arc<Broken>>) -> Response {
    let media = if *broken == Broken::UnconfiguredKwargs {
        json!({"video": {"num_frames": 40}})
    } else {
        json!({})
    };
    axum::Json(json!({"object": "list", "data": [
        {"id": CHAT, "object": "model", "tasks": ["generate"], "max_model_len": 2048,
         "mm_processor_kwargs": {}, "media_io_kwargs": media, "embedding_size": null},
        {"id": EMBED, "object": "model", "tasks": ["embed", "score"], "max_model_len": 256,
         "mm_processor_kwargs": {}, "media_io_kwargs": media, "embedding_size": STATED_SIZE},
    ]}))
    .into_response()
}

async fn metrics(State(broken): State<Arc<Broken>>) -> String {
    let source = if *broken == Broken::WeightsFromDisk {
        "disk"
    } else {
        "ipc_cache"
    };
    let usage_type = if *broken == Broken::UntypedUsage {
        ""
    } else {
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
    };
    format!(
        "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{CHAT}\",engine=\"0\"}} 0\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{CHAT}\",engine=\"0\"}} 0\n\
         {usage_type}vllm:kv_cache_usage_perc{{model_name=\"{CHAT}\",engine=\"0\"}} 0\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{model_name=\"{CHAT}\",engine=\"0\",block_size=\"16\",num_gpu_blocks=\"64\"}} 1\n\
         # TYPE gateway:weights_source gauge\n\
         gateway:weights_source{{model_name=\"{CHAT}\",source=\"{source}\"}} 1\n"
    )
}

async fn daemon_health(State(broken): State<Arc<Broken>>) -> StatusCode {
    if *broken == Broken::DaemonUnhealthy {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// Every POST route: the gate as vLLM 0.31 applies it, then a well-formed answer.
async fn post(State(broken): State<Arc<Broken>>, uri: Uri, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "body",
            "bad JSON",
        );
    };
    let path = uri.path();
    let trusted = *broken == Broken::TrustsEveryone;
    for field in [GateField::MmProcessorKwargs, GateField::MediaIoKwargs] {
        let value = body.get(field.name());
        let refuse_empty = *broken == Broken::CompletionsRefusesEmpty
            && path == "/v1/completions"
            && value.is_some_and(|v| v == &json!({}));
        if !trusted && (non_empty(value) || refuse_empty) {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                field.name(),
                field.message(),
            );
        }
    }
    let text = if *broken == Broken::EmptyText {
        ""
    } else {
        "Blue"
    };
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4});
    let size = if *broken == Broken::WrongEmbeddingSize {
        STATED_SIZE - 1
    } else {
        STATED_SIZE
    };
    let vector: Vec<f32> = (1..=size).map(|i| i as f32 / 10.0).collect();
    let answer = match path {
        "/v1/chat/completions" => json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": CHAT,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length"}],
            "usage": usage,
        }),
        "/v1/completions" => json!({
            "id": "cmpl-1", "object": "text_completion", "model": CHAT,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": usage,
        }),
        "/tokenize" => json!({"count": 2, "max_model_len": 2048, "tokens": [1, 2]}),
        "/v1/embeddings" => {
            let inputs = body["input"].as_array().map_or(1, Vec::len);
            let data: Vec<Value> = (0..inputs)
                .map(|i| json!({"object": "embedding", "index": i, "embedding": vector}))
                .collect();
            json!({"id": "embd-1", "object": "list", "model": EMBED, "data": data, "usage": usage})
        }
        "/pooling" => {
            json!({"id": "pool-1", "object": "list", "data": [{"index": 0, "data": vector}]})
        }
        "/score" => json!({"id": "score-1", "object": "list", "data": [
            {"index": 0, "score": 0.9}, {"index": 1, "score": 0.1}]}),
        "/rerank" => json!({"id": "rerank-1", "results": [
            {"index": 0, "relevance_score": 0.9}, {"index": 1, "relevance_score": 0.1}]}),
        "/classify" => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "task",
                "Unsupported task: 'classify' Supported tasks: ['embed', 'score']",
            )
        }
        _ => return error(StatusCode::NOT_FOUND, "NotFoundError", "path", "no route"),
    };
    axum::Json(answer).into_response()
}

/// Serves the fake deployment; its base URL.
async fn fake(broken: Broken) -> String {
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/daemon-health", get(daemon_health))
        .fallback(post)
        .with_state(Arc::new(broken));
    let listener = must(
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string()),
    );
    let addr = must(listener.local_addr().map_err(|e| e.to_string()));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fake_deployment_fails_on_exactly_the_row_it_breaks() {
    let cases: [(Broken, &[&str], (&str, &str)); 10] = [
        (Broken::Nothing, &[], ("", "")),
        (
            Broken::CompletionsRefusesEmpty,
            &[],
            ("contract", "POST /v1/completions"),
        ),
        (
            Broken::TrustsEveryone,
            &[],
            ("trust", "per-request mm_processor_kwargs / media_io_kwargs"),
        ),
        (
            Broken::UnconfiguredKwargs,
            &[],
            ("trust", "deployment mm_processor_kwargs / media_io_kwargs"),
        ),
        (
            Broken::Nothing,
            &["--swap-space", "4"],
            ("config", "--swap-space"),
        ),
        (
            Broken::DaemonUnhealthy,
            &[],
            ("weight-cache", "daemon health"),
        ),
        (
            Broken::WeightsFromDisk,
            &[],
            ("weight-cache", "fake-chat weights from ipc_cache"),
        ),
        (
            Broken::UntypedUsage,
            &[],
            ("router", "GET /metrics router gauges"),
        ),
        (Broken::EmptyText, &[], ("output", CHAT)),
        (Broken::WrongEmbeddingSize, &[], ("output", EMBED)),
    ];
    for (broken, extra, row) in cases {
        let base = fake(broken).await;
        let mut args = vec![
            "--base-url".to_string(),
            base.clone(),
            "--weight-cache-health".into(),
            format!("{base}/daemon-health"),
            "--".into(),
            "--load-format".into(),
            "ipc_cache".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let outcome = upgrade_check(args).await;
        let want: Vec<(&str, &str)> = if broken == Broken::Nothing && extra.is_empty() {
            Vec::new()
        } else {
            vec![row]
        };
        assert_eq!(
            outcome.failed(),
            want,
            "{broken:?} {extra:?}:\n{}",
            outcome.stdout
        );
        assert_eq!(
            outcome.code,
            Some(if want.is_empty() { 0 } else { 1 }),
            "{broken:?} {extra:?}:\n{}",
            outcome.stdout
        );
    }
}

#[test]
fn a_missing_base_url_is_one_line_naming_it() {
    let output = must(
        std::process::Command::new(must(common::gateway_bin()))
            .arg("upgrade-check")
            .output()
            .map_err(|e| e.to_string()),
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--base-url"), "{stderr}");
}

/// The README shows the table of a run against the default deployment; keep the binary's
/// notion of the sections in step with it.
#[test]
fn the_readme_shows_the_table() {
    let readme = must(
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .map_err(|e| e.to_string()),
    );
    for needle in [
        "gateway upgrade-check --base-url",
        "RESULT SECTION",
        "PASS   contract     POST /v1/chat/completions",
        "SKIP   weight-cache",
        "PASS   router",
        "PASS   output",
    ] {
        assert!(readme.contains(needle), "README lacks {needle:?}");
    }
}
