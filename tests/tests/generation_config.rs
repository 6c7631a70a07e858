//! `--generation-config auto|vllm|FOLDER` and `--override-generation-config`, as vLLM 0.31:
//! under `auto` (the default) the model's generation_config.json sets the defaults of its
//! requests (its temperature, its max_new_tokens as the default max_tokens), `vllm` ignores
//! the file, a folder's file also caps max_tokens, and the override merges on top.
//!
//! The model is a temp copy of the committed tiny Llama with a generation_config.json of the
//! test's own.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{must, run_to_exit, served_as_tiny, workspace_root, Gateway, TempDir};
use serde_json::{json, Value};

/// A copy of tests/data/tiny-llama whose generation_config.json is `config`.
fn tiny_with(config: &Value) -> TempDir {
    let dir = must(TempDir::new("genconfig"));
    let source = workspace_root().join("tests/data/tiny-llama");
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        must(
            std::fs::copy(source.join(file), dir.path.join(file))
                .map(|_| ())
                .map_err(|e| format!("copying {file}: {e}")),
        );
    }
    must(dir.write("generation_config.json", &config.to_string()));
    dir
}

async fn start(model: &Path, extra: &[&str]) -> Gateway {
    let model = model.display().to_string();
    must(Gateway::start(&served_as_tiny(&model, extra)).await)
}

/// A chat reply to a fixed prompt with `fields` added: (content, completion tokens).
async fn chat(gateway: &Gateway, fields: Value) -> (String, u64) {
    let mut body = json!({"model": "tiny", "ignore_eos": true,
                          "messages": [{"role": "user", "content": "hello there"}]});
    if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
        body.extend(fields.clone());
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_default();
    let response = must(
        client
            .post(format!("{}/v1/chat/completions", gateway.base_url))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string()),
    );
    let status = response.status().as_u16();
    let reply: Value = must(response.json().await.map_err(|e| e.to_string()));
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tokens = reply["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    (content, tokens)
}

/// Whether four replies to the same request were all the same text.
async fn repeats(gateway: &Gateway, fields: Value) -> bool {
    let (first, _) = chat(gateway, fields.clone()).await;
    for _ in 0..3 {
        if chat(gateway, fields.clone()).await.0 != first {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_takes_the_defaults_from_the_models_file_and_vllm_does_not() {
    let model = tiny_with(&json!({"temperature": 0, "max_new_tokens": 5, "eos_token_id": 1021}));

    let auto = start(&model.path, &[]).await;
    assert_eq!(
        chat(&auto, json!({})).await.1,
        5,
        "max_new_tokens is the default"
    );
    assert!(
        repeats(&auto, json!({"max_tokens": 20})).await,
        "temperature 0"
    );
    // The request's own fields win, and under `auto` max_new_tokens is no cap.
    assert_eq!(chat(&auto, json!({"max_tokens": 9})).await.1, 9);
    assert!(!repeats(&auto, json!({"max_tokens": 20, "temperature": 1.0})).await);
    assert!(
        auto.output()
            .contains("request defaults: temperature=0 max_tokens=5"),
        "{}",
        auto.output()
    );
    drop(auto);

    let vllm = start(&model.path, &["--generation-config", "vllm"]).await;
    assert!(
        chat(&vllm, json!({})).await.1 > 5,
        "the file's max_new_tokens"
    );
    assert!(
        !repeats(&vllm, json!({"max_tokens": 20})).await,
        "the file's temperature"
    );
    assert!(vllm.output().contains("request defaults: vLLM's own"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_override_merges_on_top_and_caps() {
    let model = tiny_with(&json!({"temperature": 0, "max_new_tokens": 5}));
    let over = start(
        &model.path,
        &["--override-generation-config", r#"{"max_new_tokens": 7}"#],
    )
    .await;
    // The file's temperature stays; the override's max_new_tokens caps the request's.
    assert!(repeats(&over, json!({})).await);
    assert_eq!(chat(&over, json!({"max_tokens": 12})).await.1, 7);
    drop(over);

    let folder = tiny_with(&json!({"max_new_tokens": 4}));
    let folder_arg = folder.path.display().to_string();
    let from_folder = start(
        &model.path,
        &[
            "--generation-config",
            &folder_arg,
            "--override-generation-config",
            r#"{"temperature": 0}"#,
        ],
    )
    .await;
    // A folder's max_new_tokens caps; the model's own file is not read.
    assert_eq!(chat(&from_folder, json!({"max_tokens": 12})).await.1, 4);
    assert!(repeats(&from_folder, json!({})).await);
}

#[test]
fn a_bad_generation_config_stops_the_start_naming_it() {
    let model = tiny_with(&json!({"top_p": 1.5}));
    let path = model.path.display().to_string();
    let base = ["--served-model-name", "tiny", "--device", "cpu"];
    for (extra, named) in [
        (vec![], "top_p"),
        (
            vec![
                "--generation-config",
                "vllm",
                "--override-generation-config",
                "[1]",
            ],
            "--override-generation-config must be a JSON object",
        ),
        (
            vec!["--generation-config", "/nonexistent-folder"],
            "--generation-config /nonexistent-folder",
        ),
    ] {
        let mut args = vec![path.as_str()];
        args.extend(base);
        args.extend(extra);
        let (status, stderr) = must(run_to_exit(&args, Duration::from_secs(60)));
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}
