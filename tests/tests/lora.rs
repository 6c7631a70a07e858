//! LoRA adapters served by the real binary, as vLLM serves them: `--enable-lora` with
//! `--lora-modules` (both forms), `/v1/models` cards with `parent`, requests routed by the
//! adapter's name (transformers+peft's numbers, `scripts/make_tiny_lora.py`), vLLM's 404 for
//! an unknown name, `vllm:lora_requests_info`, the runtime load and unload routes only with
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, their refusals naming the adapter and the reason, an
//! unload that lets a running request finish, a runtime load attached to the served model its
//! config records as its base, and start-up refusals (exit 2, one line).

mod common;

use std::time::Duration;

use common::{must, post_json, Gateway};
use serde_json::{json, Value};

const ADAPTER_A: &str = "tests/data/tiny-llama-lora-a";
const ADAPTER_B: &str = "tests/data/tiny-llama-lora-b";

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, String) {
    let response = post_json(client, &url, &body).await;
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

fn parse(text: &str) -> Value {
    must(serde_json::from_str(text).map_err(|e| format!("{e}: {text}")))
}

fn reference() -> Value {
    let path = common::workspace_root()
        .join(ADAPTER_A)
        .join("reference.json");
    parse(&std::fs::read_to_string(&path).unwrap_or_default())
}

/// A greedy completion of the reference's first prompt by `model`: its token logprobs.
async fn greedy_logprobs(client: &reqwest::Client, base: &str, model: &str) -> Vec<f64> {
    let prompt = reference()["prompts"][0].clone();
    let (status, text) = post(
        client,
        format!("{base}/v1/completions"),
        json!({"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
               "ignore_eos": true, "logprobs": 1}),
    )
    .await;
    assert_eq!(status, 200, "{model}: {text}");
    let body = parse(&text);
    assert_eq!(body["model"], model, "responses carry the adapter's name");
    body["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The reference's greedy-token logprobs of `model` on its first prompt.
fn reference_logprobs(model: &str) -> Vec<f64> {
    reference()["models"][model]["runs"][0]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| s["top5"][0][1].as_f64())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-3, "{what} step {i}: {g} vs {w}");
    }
}

fn base_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = common::tiny_args(&["--enable-lora", "--activation-precision", "f32"]);
    args.extend_from_slice(extra);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_listed_with_their_base_and_served_by_name() {
    let module_b = format!(r#"{{"name": "b", "path": "{ADAPTER_B}", "base_model_name": "tiny"}}"#);
    let args = base_args(&[
        "--lora-modules",
        "sql=tests/data/tiny-llama-lora-a",
        &module_b,
        "--max-loras",
        "2",
    ]);
    let gateway = must(Gateway::start(&args).await);
    let base = &gateway.base_url;
    let client = common::client();

    let models = parse(&common::get_text(&client, &format!("{base}/v1/models")).await);
    let cards = models["data"].as_array().cloned().unwrap_or_default();
    let card = |id: &str| {
        cards
            .iter()
            .find(|c| c["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no card {id}: {models}"))
    };
    assert_eq!(card("tiny")["parent"], Value::Null);
    assert_eq!(card("sql")["parent"], "tiny");
    assert_eq!(card("sql")["root"], ADAPTER_A);
    assert_eq!(card("sql")["object"], "model");
    assert_eq!(card("b")["parent"], "tiny");
    assert_eq!(card("b")["root"], ADAPTER_B);

    // The base and both adapters at once: each gets its own numbers.
    let (tiny, sql, b) = tokio::join!(
        greedy_logprobs(&client, base, "tiny"),
        greedy_logprobs(&client, base, "sql"),
        greedy_logprobs(&client, base, "b"),
    );
    assert_close(&tiny, &reference_logprobs("tiny-llama"), "base");
    assert_close(&sql, &reference_logprobs("tiny-llama-lora-a"), "sql");
    assert_close(&b, &reference_logprobs("tiny-llama-lora-b"), "b");

    let (status, text) = post(
        &client,
        format!("{base}/v1/chat/completions"),
        json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 404, "{text}");
    let error = &parse(&text)["error"];
    assert_eq!(error["message"], "The model `nope` does not exist.");
    assert_eq!(error["type"], "NotFoundError");
    assert_eq!(error["param"], "model");

    // Without the variable the runtime routes are unknown routes.
    for route in ["load_lora_adapter", "unload_lora_adapter"] {
        let (status, text) = post(
            &client,
            format!("{base}/v1/{route}"),
            json!({"lora_name": "x", "lora_path": ADAPTER_A}),
        )
        .await;
        assert_eq!(status, 404, "{route}: {text}");
    }

    let metrics = common::get_text(&client, &format!("{base}/metrics")).await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap_or_else(|| panic!("no vllm:lora_requests_info in:\n{metrics}"));
    assert!(line.contains(r#"max_lora="2""#), "{line}");
    assert!(line.contains("running_lora_adapters="), "{line}");
    assert!(line.contains("waiting_lora_adapters="), "{line}");
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(value > 1.7e9, "the value is the update time: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_routes_load_refuse_and_unload_as_vllm_does() {
    let dir = must(common::TempDir::new("lora"));
    let dora = dir.path.join("dora");
    must(std::fs::create_dir_all(&dora).map_err(|e| e.to_string()));
    let config = json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_dora": true,
                        "target_modules": ["q_proj"]});
    must(
        std::fs::write(dora.join("adapter_config.json"), config.to_string())
            .map_err(|e| e.to_string()),
    );
    let args = base_args(&["--max-lora-rank", "8", "--max-cpu-loras", "2"]);
    let gateway =
        must(Gateway::start_with_env(&args, &[("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")]).await);
    let base = &gateway.base_url;
    let client = common::client();
    let load = |name: &str, path: &str| {
        post(
            &client,
            format!("{base}/v1/load_lora_adapter"),
            json!({"lora_name": name, "lora_path": path}),
        )
    };

    let (status, text) = load("a", ADAPTER_A).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, "Success: LoRA adapter 'a' added successfully.");
    let models = common::get_text(&client, &format!("{base}/v1/models")).await;
    assert!(models.contains(r#""parent":"tiny""#), "{models}");
    assert_close(
        &greedy_logprobs(&client, base, "a").await,
        &reference_logprobs("tiny-llama-lora-a"),
        "a loaded at run time",
    );

    let refusals = [
        ("a", ADAPTER_A, "has already been loaded"),
        ("big", ADAPTER_B, "r = 16 is over --max-lora-rank 8"),
        ("gone", "tests/data/no-such-adapter", "no such directory"),
        ("dora", dora.to_str().unwrap_or_default(), "DoRA"),
        (
            "",
            ADAPTER_A,
            "Both 'lora_name' and 'lora_path' must be provided.",
        ),
        ("tiny", ADAPTER_A, "a served model has that name"),
    ];
    for (name, path, why) in refusals {
        let (status, text) = load(name, path).await;
        assert_eq!(status, 400, "{name}: {text}");
        let error = &parse(&text)["error"];
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{name}: {message}");
        assert!(
            message.contains(&format!("'{name}'")) || name.is_empty() || name == "tiny",
            "{message}"
        );
        assert_eq!(error["type"], "BadRequestError");
    }

    // Unloading while a request runs: it finishes; new requests are vLLM's 404.
    let mut stream = must(
        client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "a", "prompt": "Once", "max_tokens": 200,
                          "ignore_eos": true, "stream": true, "temperature": 0}))
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    assert_eq!(stream.status().as_u16(), 200);
    let mut body = String::new();
    if let Ok(Some(first)) = stream.chunk().await {
        body.push_str(&String::from_utf8_lossy(&first));
    }
    let (status, text) = post(
        &client,
        format!("{base}/v1/unload_lora_adapter"),
        json!({"lora_name": "a"}),
    )
    .await;
    assert_eq!(
        (status, text.as_str()),
        (200, "Success: LoRA adapter 'a' removed successfully.")
    );
    while let Ok(Some(chunk)) = stream.chunk().await {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(
        body.contains(r#""finish_reason":"length""#),
        "ran to its length: {body}"
    );
    let (status, text) = post(
        &client,
        format!("{base}/v1/completions"),
        json!({"model": "a", "prompt": "Once", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 404, "{text}");
    let (status, text) = post(
        &client,
        format!("{base}/v1/unload_lora_adapter"),
        json!({"lora_name": "a"}),
    )
    .await;
    assert_eq!(status, 404, "{text}");
    assert!(
        text.contains("The lora adapter 'a' cannot be found."),
        "{text}"
    );

    // --max-cpu-loras 2: a third adapter is served too; the least recently used one's
    // factors make room, and a request for it reads them again, with the same numbers.
    assert_eq!(load("x", ADAPTER_A).await.0, 200);
    // (--max-lora-rank 8 here: adapter B's rank 16 is refused, so all three are A.)
    assert_eq!(load("y", ADAPTER_A).await.0, 200);
    let (status, text) = load("z", ADAPTER_A).await;
    assert_eq!(status, 200, "{text}");
    assert_close(
        &greedy_logprobs(&client, base, "x").await,
        &reference_logprobs("tiny-llama-lora-a"),
        "x, evicted by z's load, read again",
    );
    assert_close(
        &greedy_logprobs(&client, base, "y").await,
        &reference_logprobs("tiny-llama-lora-a"),
        "y, evicted by x's return",
    );
    let metrics = common::get_text(&client, &format!("{base}/metrics")).await;
    let counter = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(r#"model_name="tiny""#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
    };
    // z's load evicted x, x's return y, y's return z.
    assert_eq!(counter("gateway:lora_adapter_evictions_total"), 3.0);
    // a, x, y, z at their loads, then x and y again.
    assert_eq!(counter("gateway:lora_adapter_loads_total"), 6.0);
}

/// A copy of the adapter folder `from` whose config records `base` as its base model.
fn rebased(dir: &common::TempDir, from: &str, base: &str) -> String {
    let to = dir.path.join(format!("rebased-{}", base.replace('/', "-")));
    must(std::fs::create_dir_all(&to).map_err(|e| e.to_string()));
    let from = common::workspace_root().join(from);
    let mut config =
        parse(&std::fs::read_to_string(from.join("adapter_config.json")).unwrap_or_default());
    config["base_model_name_or_path"] = json!(base);
    must(
        std::fs::write(to.join("adapter_config.json"), config.to_string())
            .map_err(|e| e.to_string()),
    );
    must(
        std::fs::copy(
            from.join("adapter_model.safetensors"),
            to.join("adapter_model.safetensors"),
        )
        .map(drop)
        .map_err(|e| e.to_string()),
    );
    to.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_decoders_a_runtime_load_attaches_to_the_base_it_records() {
    let dir = must(common::TempDir::new("lora-bases"));
    let args = [
        "--model",
        "tests/data/tiny-llama",
        "--model",
        "tests/data/tiny-phi3",
        "--served-model-name",
        "tiny",
        "phi3",
        "--max-model-len",
        "256",
        "--device",
        "cpu",
        "--activation-precision",
        "f32",
        "--enable-lora",
        "--max-cpu-loras",
        "4",
    ];
    let gateway =
        must(Gateway::start_with_env(&args, &[("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")]).await);
    let base = &gateway.base_url;
    let client = common::client();
    let load = |body: Value| post(&client, format!("{base}/v1/load_lora_adapter"), body);

    // Phi-3's adapter records tests/data/tiny-phi3: it goes to the second model, not the first.
    let phi3_lora = "tests/data/tiny-phi3-lora";
    let (status, text) = load(json!({"lora_name": "p", "lora_path": phi3_lora})).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = load(json!({"lora_name": "a", "lora_path": ADAPTER_A})).await;
    assert_eq!(status, 200, "{text}");
    // Recording a served name works as well as recording the checkpoint.
    let by_name = rebased(&dir, ADAPTER_B, "tiny");
    let (status, text) = load(json!({"lora_name": "b", "lora_path": by_name})).await;
    assert_eq!(status, 200, "{text}");
    let models = parse(&common::get_text(&client, &format!("{base}/v1/models")).await);
    let parent = |id: &str| {
        models["data"]
            .as_array()
            .and_then(|cards| cards.iter().find(|c| c["id"] == id))
            .map(|c| c["parent"].clone())
            .unwrap_or_default()
    };
    assert_eq!(parent("p"), "phi3", "{models}");
    assert_eq!(parent("a"), "tiny", "{models}");
    assert_eq!(parent("b"), "tiny", "{models}");
    assert_close(
        &greedy_logprobs(&client, base, "p").await,
        &reference_logprobs("tiny-phi3-lora"),
        "phi3's adapter on phi3",
    );
    assert_close(
        &greedy_logprobs(&client, base, "a").await,
        &reference_logprobs("tiny-llama-lora-a"),
        "llama's adapter on tiny",
    );

    // A base that names neither model: both could take it, so the load names lora_path and
    // lists them.
    let elsewhere = rebased(&dir, ADAPTER_A, "org/elsewhere");
    let (status, text) = load(json!({"lora_name": "e", "lora_path": elsewhere})).await;
    assert_eq!(status, 400, "{text}");
    let error = &parse(&text)["error"];
    assert_eq!(error["param"], "lora_path", "{text}");
    assert_eq!(error["type"], "BadRequestError");
    let message = error["message"].as_str().unwrap_or_default();
    for want in ["'e'", "\"org/elsewhere\"", "tiny, phi3"] {
        assert!(message.contains(want), "{want}: {message}");
    }

    // vLLM's other load fields: refused by name where this server cannot do what they ask.
    for (field, why) in [
        ("is_3d_lora_weight", "MoE experts"),
        ("load_inplace", "load_inplace is not supported"),
    ] {
        let mut body = json!({"lora_name": "c", "lora_path": ADAPTER_A});
        body[field] = json!(true);
        let (status, text) = load(body).await;
        assert_eq!(status, 400, "{field}: {text}");
        let error = &parse(&text)["error"];
        assert_eq!(error["param"], field, "{text}");
        assert!(
            error["message"].as_str().unwrap_or_default().contains(why),
            "{text}"
        );
    }
    let (status, text) = load(
        json!({"lora_name": "c", "lora_path": ADAPTER_A, "is_3d_lora_weight": false,
                    "load_inplace": false}),
    )
    .await;
    assert_eq!(status, 200, "their defaults load: {text}");
}

#[test]
fn bad_lora_flags_and_adapters_stop_the_start_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--lora-modules", "a=tests/data/tiny-llama-lora-a"],
            "--lora-modules needs --enable-lora",
        ),
        (
            &[
                "--enable-lora",
                "--max-lora-rank",
                "8",
                "--lora-modules",
                "b=tests/data/tiny-llama-lora-b",
            ],
            "LoRA adapter 'b'",
        ),
        (
            &[
                "--enable-lora",
                "--lora-modules",
                "m=tests/data/no-such-adapter",
            ],
            "no such directory",
        ),
        (
            &["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1"],
            "--max-cpu-loras (1) must be >= --max-loras (2)",
        ),
        (
            &["--enable-lora", "--max-lora-rank", "12"],
            "--max-lora-rank 12 is not one of",
        ),
        (
            &["--enable-lora", "--lora-modules", "bad"],
            "--lora-modules bad",
        ),
        (
            &["--lora-target-modules", "q_proj"],
            "--lora-target-modules",
        ),
        (
            &[
                "--enable-lora",
                "--lora-modules",
                "tiny=tests/data/tiny-llama-lora-a",
            ],
            "the adapter name tiny is a served model's name",
        ),
    ];
    for (extra, want) in cases {
        let args = common::tiny_args(extra);
        let (status, stderr) = must(common::run_to_exit(&args, Duration::from_secs(60)));
        assert_eq!(status.code(), Some(2), "{extra:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{extra:?}: {stderr}");
        assert!(errors[0].contains(want), "{extra:?}: {}", errors[0]);
    }
}
