//! `--generation-config auto|vllm|FOLDER` and `--override-generation-config`, as vLLM 0.31:
//! under `auto` (the default) the model's generation_config.json sets the defaults of its
//! requests (its temperature, its max_new_tokens as the default max_tokens), `vllm` ignores
//! the file, a folder's file also caps max_tokens, and the override merges on top. The file's
//! `eos_token_id`s stop generation in every mode, unless a request sets `ignore_eos`.
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

/// A greedy completion of the token ids `prompt`: (generated token count, finish_reason,
/// stop_reason).
async fn complete(gateway: &Gateway, prompt: &[u32], fields: Value) -> (u64, Value, Value) {
    let mut body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0});
    if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
        body.extend(fields.clone());
    }
    let url = format!("{}/v1/completions", gateway.base_url);
    let response = common::post_json(&common::client(), &url, &body).await;
    let reply: Value = must(response.json().await.map_err(|e| e.to_string()));
    let choice = &reply["choices"][0];
    let tokens = reply["usage"]["completion_tokens"].as_u64();
    let tokens = tokens.unwrap_or_else(|| panic!("{reply}"));
    (
        tokens,
        choice["finish_reason"].clone(),
        choice["stop_reason"].clone(),
    )
}

/// The next greedy token after `prompt`: every id is a stop token, so the first one generated
/// stops the request and comes back as its stop_reason.
async fn next_token(gateway: &Gateway, prompt: &[u32]) -> u32 {
    let every: Vec<u32> = (0..1020).collect();
    let (_, _, stop) = complete(gateway, prompt, json!({"stop_token_ids": every})).await;
    let id = stop
        .as_u64()
        .unwrap_or_else(|| panic!("no stop_reason: {stop}"));
    id as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_eos_token_ids_stop_generation_in_every_mode() {
    // The committed file names only the model's own EOS (1021).
    let plain = tiny_with(&json!({"eos_token_id": 1021}));
    let gateway = start(&plain.path, &[]).await;
    // A prompt whose greedy continuation has a token that first appears after the first one,
    // so that a stop there is told from an earlier one: (prompt, stop position, token).
    let mut found = None;
    for start_ids in [
        [5u32, 17, 42],
        [100, 200, 300],
        [7, 7, 7],
        [512, 3, 99],
        [900, 1, 64],
    ] {
        let mut prompt = start_ids.to_vec();
        for at in 0..4 {
            let next = next_token(&gateway, &prompt).await;
            if at > 0 && !prompt[3..].contains(&next) {
                found = Some((start_ids, at + 1, next));
                break;
            }
            prompt.push(next);
        }
        if found.is_some() {
            break;
        }
    }
    let (prompt, stop_at, target) = found.unwrap_or_else(|| panic!("no varied continuation"));
    let (tokens, finish, _) = complete(&gateway, &prompt, json!({})).await;
    assert!(
        tokens > stop_at,
        "without the id in the file generation goes on: {finish}"
    );
    drop(gateway);

    let extra = tiny_with(&json!({"eos_token_id": [1021, target]}));
    for mode in ["auto", "vllm"] {
        let gateway = start(&extra.path, &["--generation-config", mode]).await;
        let (tokens, finish, stop) = complete(&gateway, &prompt, json!({})).await;
        assert_eq!(
            tokens, stop_at,
            "{mode}: stops at the file's extra eos id {target}"
        );
        assert_eq!(finish, "stop", "{mode}");
        assert_eq!(stop, json!(target), "{mode}");
        let (tokens, ..) = complete(&gateway, &prompt, json!({"ignore_eos": true})).await;
        assert_eq!(
            tokens, 6,
            "{mode}: ignore_eos ignores the file's eos ids too"
        );
    }
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
