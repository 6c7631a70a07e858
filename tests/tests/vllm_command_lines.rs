//! `vllm serve` command lines and config files, as operators write them for vLLM 0.31, start
//! this server and serve; or stop it with exit 2 and one line naming the flag and why.

mod common;

use std::time::Duration;

use common::{must, run_to_exit, run_to_exit_with_env, tiny_args, Gateway, TempDir};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);
const TINY: &str = "tests/data/tiny-llama";

fn client() -> reqwest::Client {
    must(
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string()),
    )
}

async fn post(gateway: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = must(
        client()
            .post(format!("{}{path}", gateway.base_url))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    let status = response.status().as_u16();
    let body = must(response.json::<Value>().await.map_err(|e| e.to_string()));
    (status, body)
}

/// The server must exit 2, printing one line that names `flag` (and `why`, when given).
fn refuses_with(args: &[&str], env: &[(&str, &str)], flag: &str, why: &str) {
    let (status, stderr) = must(run_to_exit_with_env(args, env, LIMIT));
    assert_eq!(
        status.code(),
        Some(2),
        "gateway serve {args:?} should exit 2; stderr:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "gateway serve {args:?} should print one line, printed:\n{stderr}"
    );
    assert!(
        lines[0].contains(flag) && lines[0].contains(why),
        "the line for {args:?} should name {flag:?} and {why:?}: {:?}",
        lines[0]
    );
}

fn refuses(args: &[&str], flag: &str, why: &str) {
    refuses_with(args, &[], flag, why);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_command_line_starts_and_serves() {
    let template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let gateway = must(
        Gateway::start(&[
            TINY,
            "--served-model-name",
            "tiny",
            "--tensor-parallel-size",
            "1",
            "--max_model_len",
            "256",
            "--gpu-memory-utilization",
            "0.9",
            "--enable-prefix-caching",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens=2k",
            "--block-size",
            "16",
            "--dtype",
            "auto",
            "--seed",
            "0",
            "--trust-remote-code",
            "--disable-log-stats",
            "--enforce-eager",
            "--compilation-config",
            r#"{"level": 3}"#,
            "--enable-chunked-prefill",
            "--chat-template",
            template,
            "--response-role",
            "bot",
            "--enable-prompt-tokens-details",
            "--enable-log-requests",
            "--uvicorn-log-level",
            "info",
            "--log-config-file",
            "logging.json",
            "--device",
            "cpu",
        ])
        .await,
    );
    // Long enough to fill KV blocks, so that the second time its prefix comes from the cache.
    let long = "the quick brown fox jumps over the lazy dog ".repeat(2);
    let chat =
        json!({"model": "tiny", "messages": [{"role": "user", "content": long}], "max_tokens": 3});
    let (status, first) = post(&gateway, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["choices"][0]["message"]["role"], "bot", "{first}");
    assert!(
        first["usage"].get("prompt_tokens_details").is_none(),
        "nothing cached yet: {first}"
    );
    let (_, again) = post(&gateway, "/v1/chat/completions", chat).await;
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "--enable-prompt-tokens-details: {again}"
    );
    let streamed = must(
        client()
            .post(format!("{}/v1/chat/completions", gateway.base_url))
            .json(&json!({
                "model": "tiny",
                "messages": [{"role": "user", "content": long}],
                "max_tokens": 2,
                "stream": true,
                "stream_options": {"include_usage": true},
            }))
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    let events = must(streamed.text().await.map_err(|e| e.to_string()));
    assert!(events.contains(r#""role":"bot""#), "{events}");
    assert!(events.contains(r#""prompt_tokens_details""#), "{events}");
    // The template renders the content alone: as many tokens as the text.
    let (_, chat) = post(
        &gateway,
        "/tokenize",
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hello world"}], "add_special_tokens": false}),
    )
    .await;
    let (_, text) = post(
        &gateway,
        "/tokenize",
        json!({"model": "tiny", "prompt": "hello world", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(chat["count"], text["count"], "{chat} {text}");
    let log = gateway.output();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("accepted with no effect"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning line:\n{log}");
    assert!(
        warnings[0].contains("--enforce-eager, --compilation-config"),
        "{}",
        warnings[0]
    );
    assert!(
        log.contains("--log-config-file: deprecated in vLLM 0.31"),
        "{log}"
    );
    assert!(
        log.contains("--trust-remote-code has no effect here"),
        "{log}"
    );
    assert!(
        log.contains("received request"),
        "--enable-log-requests:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_makes_unseeded_sampling_repeat_across_starts() {
    let mut texts = Vec::new();
    for _ in 0..2 {
        let gateway = must(Gateway::start(&tiny_args(&["--seed", "1234"])).await);
        let (status, reply) = post(
            &gateway,
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hello", "max_tokens": 12, "temperature": 1.0}),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
        texts.push(reply["choices"][0]["text"].clone());
    }
    assert_eq!(texts[0], texts[1], "--seed 1234 twice: the same draws");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_config_file_starts_and_serves() {
    let dir = must(TempDir::new("vllm-config"));
    // The shape of the example in vLLM's documentation (`vllm serve --config config.yaml`);
    // the harness's own --host and --port on the command line win over the file's.
    let config = must(dir.write(
        "config.yaml",
        &format!(
            "model: {TINY}\nhost: \"127.0.0.1\"\nport: 6379\nuvicorn-log-level: \"info\"\n\
             served_model_name: tiny\nmax-model-len: 256\ntensor_parallel_size: 1\n\
             enable-prefix-caching: false\ndevice: cpu\n"
        ),
    ));
    let config = config.display().to_string();
    let gateway = must(Gateway::start(&["--config", &config]).await);
    let models: Value = must(
        client()
            .get(format!("{}/v1/models", gateway.base_url))
            .send()
            .await
            .map_err(|e| e.to_string())
            .map(|r| r.json()),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(models["data"][0]["id"], "tiny", "{models}");
    assert_eq!(models["data"][0]["max_model_len"], 256, "{models}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_path_and_cors_are_served() {
    let gateway = must(
        Gateway::start(&tiny_args(&[
            "--root-path",
            "/llm",
            "--allowed-origins",
            r#"["https://app.example"]"#,
            "--allow-credentials",
        ]))
        .await,
    );
    let http = client();
    let prefixed = must(
        http.get(format!("{}/llm/v1/models", gateway.base_url))
            .header("Origin", "https://app.example")
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    assert_eq!(prefixed.status().as_u16(), 200);
    assert_eq!(
        prefixed.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(
        prefixed.headers()["access-control-allow-credentials"],
        "true"
    );
    let preflight = must(
        http.request(
            reqwest::Method::OPTIONS,
            format!("{}/v1/chat/completions", gateway.base_url),
        )
        .header("Origin", "https://app.example")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type",
        )
        .send()
        .await
        .map_err(|e| e.to_string()),
    );
    assert_eq!(preflight.status().as_u16(), 200);
    let other = must(
        http.get(format!("{}/v1/models", gateway.base_url))
            .header("Origin", "https://elsewhere.example")
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    assert!(
        !other.headers().contains_key("access-control-allow-origin"),
        "an origin not listed gets no CORS headers"
    );
    // Without --enable-prompt-tokens-details, no details, cached prefix or not (as vLLM).
    let long = "the quick brown fox jumps over the lazy dog ".repeat(2);
    let completion = json!({"model": "tiny", "prompt": long, "max_tokens": 2});
    for _ in 0..2 {
        let (status, reply) = post(&gateway, "/v1/completions", completion.clone()).await;
        assert_eq!(status, 200, "{reply}");
        assert!(
            reply["usage"].get("prompt_tokens_details").is_none(),
            "{reply}"
        );
    }
}

#[test]
fn parallelism_beyond_one_device_is_refused() {
    refuses(&["-tp", "2"], "--tensor-parallel-size 2", "one device");
    refuses(
        &["--pipeline-parallel-size", "2"],
        "--pipeline-parallel-size 2",
        "one device",
    );
    refuses(
        &["--data_parallel_size=4"],
        "--data-parallel-size 4",
        "one device",
    );
}

#[test]
fn features_not_built_are_refused_by_name() {
    refuses(
        &[
            "--speculative-config",
            r#"{"model": "m", "num_speculative_tokens": 3}"#,
        ],
        "--speculative-config",
        "speculative decoding is not built",
    );
    refuses(
        &["--lora-target-modules", "q_proj"],
        "--lora-target-modules",
        "not built",
    );
    refuses(
        &["--ssl-ciphers", "HIGH"],
        "--ssl-ciphers",
        "OpenSSL cipher strings",
    );
    refuses(
        &["--tokenizer", "other/tokenizer", TINY],
        "--tokenizer other/tokenizer",
        "not built",
    );
    refuses(
        &["--chat-template", "missing-template.jinja"],
        "--chat-template",
        "no such file",
    );
}

#[test]
fn the_upgrade_review_refuses_removed_and_renamed_flags_naming_the_replacement() {
    refuses(
        &["--tokenizer-mode", "slow"],
        "--tokenizer-mode slow",
        "use auto or hf",
    );
    refuses(
        &["--enable-mamba-fine-grained-prefix-cache"],
        "--enable-mamba-fine-grained-prefix-cache",
        "renamed --enable-mamba-shared-prefix-checkpoint",
    );
    refuses(
        &["--disable-log-requests"],
        "--disable-log-requests",
        "--enable-log-requests",
    );
    refuses(&["--swap-space", "4"], "--swap-space", "drop it");
    refuses(
        &["--num-scheduler-steps", "8"],
        "--num-scheduler-steps",
        "drop it",
    );
    refuses(
        &["--speculative-model", "m"],
        "--speculative-model",
        "--speculative-config",
    );
    refuses(&["--rope-theta", "1e6"], "--rope-theta", "--hf-overrides");
}

#[test]
fn a_config_file_gets_the_same_answers() {
    let dir = must(TempDir::new("vllm-config"));
    let config = must(dir.write(
        "config.yaml",
        "tensor_parallel_size: 2\nmax-model-len: 256\n",
    ));
    let config = config.display().to_string();
    refuses(
        &["--config", &config],
        "--tensor-parallel-size 2",
        "one device",
    );
    let removed = must(dir.write("removed.yaml", "swap_space: 4\n"));
    let removed = removed.display().to_string();
    refuses(&["--config", &removed], "--swap-space", "drop it");
}

#[test]
fn a_runner_or_convert_the_model_cannot_take_is_refused() {
    // `--runner pooling` alone converts the decoder into an embedding model, as vLLM does
    // (tests/tests/decoder_embeddings.rs); without the conversion it cannot pool.
    refuses_with(
        &tiny_args(&["--runner", "pooling", "--convert", "none"]),
        &[("RUST_LOG", "off")],
        "--convert none",
        "is a generative model",
    );
    refuses_with(
        &tiny_args(&["--convert", "classify"]),
        &[("RUST_LOG", "off")],
        "--convert classify",
        "not built",
    );
    refuses_with(
        &tiny_args(&["--runner", "generate", "--convert", "embed"]),
        &[("RUST_LOG", "off")],
        "--convert embed",
        "--runner generate",
    );
}

#[test]
fn an_unknown_flag_is_one_line_too() {
    let (status, stderr) = must(run_to_exit(&["--not-a-flag-anywhere"], LIMIT));
    assert_eq!(status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("--not-a-flag-anywhere"), "{stderr}");
}
