//! A hub id the local Hugging Face cache lacks is downloaded into it from the hub at
//! `HF_ENDPOINT` (here a fake hub the test serves from the committed tiny Llama), then found
//! there by a later start with `HF_HUB_OFFLINE=1` that asks the hub nothing. A gated
//! repository is read with the token from `--hf-token`, `HF_TOKEN` or the token file. Each way a
//! download fails stops the start with one line naming the id, the revision and the folder
//! (exit 2), and leaves nothing in the cache that looks complete.

mod common;
#[path = "hub_download/fake_hub.rs"]
mod fake_hub;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use common::{must, run_to_exit_with_env, workspace_root, Gateway, TempDir};
use fake_hub::{FakeHub, FakeRepo, Mode};

const SHA: &str = "1f0c5e2d3a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9";
const ID: &str = "org/tiny-llama";

async fn hub() -> FakeHub {
    let tiny = workspace_root().join("tests/data/tiny-llama");
    let repo = must(FakeRepo::from_dir(&tiny, SHA, &["v1"]));
    must(FakeHub::start(vec![(ID, repo)]).await)
}

/// The gateway's environment: this hub, this cache, online or not, and no token or proxy
/// from the machine running the tests.
fn env<'a>(hub: &'a FakeHub, cache: &'a str, offline: bool) -> Vec<(&'a str, &'a str)> {
    vec![
        ("HF_ENDPOINT", hub.endpoint.as_str()),
        ("HF_HUB_CACHE", cache),
        ("HF_HOME", cache),
        ("HF_TOKEN", ""),
        ("HF_HUB_OFFLINE", if offline { "1" } else { "0" }),
        ("NO_PROXY", "127.0.0.1"),
        ("no_proxy", "127.0.0.1"),
    ]
}

fn snapshot(cache: &Path) -> PathBuf {
    cache.join("models--org--tiny-llama/snapshots").join(SHA)
}

async fn completes(gateway: &Gateway) {
    completes_as(gateway, ID).await;
}

async fn completes_as(gateway: &Gateway, model: &str) {
    let reply = common::post_json(
        &common::client(),
        &format!("{}/v1/completions", gateway.base_url),
        &serde_json::json!({"model": model, "prompt": "hello", "max_tokens": 4}),
    )
    .await;
    assert_eq!(reply.status().as_u16(), 200);
}

/// The start's error line, after checking it exited 2.
fn error_line(outcome: Result<(ExitStatus, String), String>) -> String {
    let (status, stderr) = must(outcome);
    assert_eq!(status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default()
        .to_string();
    assert!(!line.is_empty(), "{stderr}");
    line
}

fn start_to_exit(args: &[&str], env: &[(&str, &str)]) -> Result<(ExitStatus, String), String> {
    run_to_exit_with_env(args, env, Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_id_is_downloaded_then_found_offline_without_asking_the_hub() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-download"));
    let path = cache.path.display().to_string();
    let args = [ID, "--max-model-len", "256"];
    let gateway = must(Gateway::start_with_env(&args, &env(&hub, &path, false)).await);
    completes(&gateway).await;
    drop(gateway);
    let asked = hub.requests();
    assert!(
        asked.contains(&format!("GET /api/models/{ID}/revision/main")),
        "{asked:?}"
    );
    // Only what the loader reads; the files are fetched at the commit the listing named.
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let want = format!("GET /{ID}/resolve/{SHA}/{file}");
        assert!(asked.contains(&want), "{want} not in {asked:?}");
    }
    assert!(
        !asked.iter().any(|r| r.contains("reference.json")),
        "{asked:?}"
    );
    let refs = std::fs::read_to_string(cache.path.join("models--org--tiny-llama/refs/main"));
    assert_eq!(refs.unwrap_or_default(), SHA);
    assert!(snapshot(&cache.path).join("model.safetensors").is_file());

    hub.clear();
    let gateway = must(Gateway::start_with_env(&args, &env(&hub, &path, true)).await);
    completes(&gateway).await;
    assert_eq!(hub.requests(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_resolves_to_its_commit_and_is_kept_for_offline_starts() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-tag"));
    let path = cache.path.display().to_string();
    let args = [ID, "--revision", "v1", "--max-model-len", "256"];
    let gateway = must(Gateway::start_with_env(&args, &env(&hub, &path, false)).await);
    completes(&gateway).await;
    drop(gateway);
    assert!(hub
        .requests()
        .contains(&format!("GET /api/models/{ID}/revision/v1")));
    let refs = cache.path.join("models--org--tiny-llama/refs");
    assert_eq!(
        std::fs::read_to_string(refs.join("v1")).unwrap_or_default(),
        SHA
    );
    // Only the revision asked for is named: main was never looked at.
    assert!(!refs.join("main").exists() && !refs.join(SHA).exists());

    hub.clear();
    let offline = env(&hub, &path, true);
    let gateway = must(Gateway::start_with_env(&args, &offline).await);
    completes(&gateway).await;
    assert_eq!(hub.requests(), Vec::<String>::new());
    drop(gateway);
    let line = error_line(start_to_exit(&[ID, "--revision", "v2"], &offline));
    assert!(
        line.contains("(revision v2)") && line.contains("HF_HUB_OFFLINE"),
        "{line}"
    );
    assert!(line.contains("models--org--tiny-llama"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_revision_needs_no_ref_and_is_found_offline() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-commit"));
    let path = cache.path.display().to_string();
    let args = [ID, "--revision", SHA, "--max-model-len", "256"];
    let gateway = must(Gateway::start_with_env(&args, &env(&hub, &path, false)).await);
    completes(&gateway).await;
    drop(gateway);
    // As huggingface_hub keeps it: the snapshot, and no ref named after the commit.
    let refs = cache.path.join("models--org--tiny-llama/refs");
    assert!(!refs.join(SHA).exists() && !refs.join("main").exists());
    hub.clear();
    let gateway = must(Gateway::start_with_env(&args, &env(&hub, &path, true)).await);
    completes(&gateway).await;
    assert_eq!(hub.requests(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_refusals_stop_the_start_with_one_line_naming_id_revision_and_folder() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-refusals"));
    let path = cache.path.display().to_string();
    let online = env(&hub, &path, false);

    // Every flag is judged before anything is downloaded.
    let line = error_line(start_to_exit(&[ID, "--max-num-seqs", "0"], &online));
    assert!(line.contains("--max-num-seqs"), "{line}");
    assert_eq!(hub.requests(), Vec::<String>::new());

    let line = error_line(start_to_exit(&["org/no-such-model"], &online));
    assert!(
        line.contains("org/no-such-model (revision main)")
            && line.contains("404")
            && line.contains(&format!("{path}/models--org--no-such-model")),
        "{line}"
    );
    let line = error_line(start_to_exit(&[ID, "--revision", "v9"], &online));
    assert!(
        line.contains("(revision v9)") && line.contains("404"),
        "{line}"
    );

    hub.set_mode(Mode::Unauthorized);
    let line = error_line(start_to_exit(&[ID], &online));
    assert!(line.contains("401") && line.contains("HF_TOKEN"), "{line}");

    let closed = common::free_port().map(|p| format!("http://127.0.0.1:{p}"));
    let closed = must(closed);
    let mut unreachable = online.clone();
    unreachable[0] = ("HF_ENDPOINT", closed.as_str());
    let line = error_line(start_to_exit(&[ID], &unreachable));
    assert!(line.contains("cannot be reached"), "{line}");
    // Nothing was named as if it were there.
    assert!(!cache.path.join("models--org--tiny-llama/refs").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_or_stalled_mid_file_leaves_nothing_complete_looking() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-cut"));
    let path = cache.path.display().to_string();
    let online = env(&hub, &path, false);
    let blob = hub
        .etag(ID, "model.safetensors")
        .map(|etag| cache.path.join("models--org--tiny-llama/blobs").join(etag));
    let blob = blob.unwrap_or_default();
    let repo = cache.path.join("models--org--tiny-llama");

    hub.set_mode(Mode::Cut("model.safetensors".into()));
    let line = error_line(start_to_exit(&[ID], &online));
    assert!(
        line.contains("downloading model.safetensors failed")
            && line.contains("(revision main)")
            && line.contains(&repo.display().to_string()),
        "{line}"
    );
    assert!(!blob.exists() && !snapshot(&cache.path).join("model.safetensors").exists());
    assert!(!repo.join("refs/main").exists());

    // A body that ends cleanly but short is caught by its length, and taken out again.
    hub.set_mode(Mode::Short("model.safetensors".into()));
    let line = error_line(start_to_exit(&[ID], &online));
    assert!(line.contains("bytes arrived"), "{line}");
    assert!(!blob.exists() && !snapshot(&cache.path).join("model.safetensors").exists());
    assert!(!repo.join("refs/main").exists());

    hub.set_mode(Mode::Stall("model.safetensors".into()));
    let started = std::time::Instant::now();
    let mut impatient = online.clone();
    impatient.push(("HF_HUB_DOWNLOAD_TIMEOUT", "2"));
    let line = error_line(start_to_exit(&[ID], &impatient));
    assert!(line.contains("stalled"), "{line}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!blob.exists() && !repo.join("refs/main").exists());

    // An offline start does not take the partial download for the model, by branch or by
    // commit (which no ref guards: the snapshot folder is there, with the small files in it).
    let line = error_line(start_to_exit(&[ID], &env(&hub, &path, true)));
    assert!(line.contains("HF_HUB_OFFLINE"), "{line}");
    assert!(snapshot(&cache.path).join("config.json").exists());
    let by_commit = [ID, "--revision", SHA];
    let line = error_line(start_to_exit(&by_commit, &env(&hub, &path, true)));
    assert!(line.contains("interrupted download"), "{line}");

    // Once the hub behaves, a new start completes the download and serves.
    hub.set_mode(Mode::Normal);
    let args = [ID, "--max-model-len", "256"];
    let gateway = must(Gateway::start_with_env(&args, &online).await);
    completes(&gateway).await;
    assert!(blob.is_file() && !repo.join(".incomplete").join(SHA).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_repository_serves_the_one_file_of_the_quantisation_named() {
    let gguf = std::fs::read(workspace_root().join("tests/data/tiny-gguf/llama3.gguf"));
    let gguf = std::sync::Arc::new(must(gguf.map_err(|e| e.to_string())));
    let files = ["tiny-Q8_0.gguf", "tiny-F16.gguf"].map(|name| (name.to_string(), gguf.clone()));
    let repo = FakeRepo {
        sha: SHA.to_string(),
        refs: vec!["main".to_string()],
        files: files.to_vec(),
    };
    let hub = must(FakeHub::start(vec![("org/tiny-GGUF", repo)]).await);
    let cache = must(TempDir::new("hub-gguf"));
    let path = cache.path.display().to_string();
    let online = env(&hub, &path, false);

    let line = error_line(start_to_exit(&["org/tiny-GGUF"], &online));
    assert!(
        line.contains("`org/tiny-GGUF:Q4_K_M`") && line.contains("tiny-Q8_0.gguf"),
        "{line}"
    );
    // --download-dir is the cache, over HF_HUB_CACHE.
    let dir = must(TempDir::new("hub-download-dir"));
    let dir_arg = dir.path.display().to_string();
    let model = "org/tiny-GGUF:Q8_0";
    let args = [model, "--download-dir", dir_arg.as_str()];
    let gateway = must(Gateway::start_with_env(&args, &online).await);
    completes_as(&gateway, model).await;
    let repo = "models--org--tiny-GGUF";
    let file = dir
        .path
        .join(repo)
        .join("snapshots")
        .join(SHA)
        .join("tiny-Q8_0.gguf");
    assert!(file.is_file() && !cache.path.join(repo).exists());
    let fetched: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.contains("/resolve/"))
        .collect();
    // The metadata request and the body, of that one file only.
    let want = format!("GET /org/tiny-GGUF/resolve/{SHA}/tiny-Q8_0.gguf");
    assert!(
        !fetched.is_empty() && fetched.iter().all(|r| *r == want),
        "{fetched:?}"
    );
}

/// Serves `ID` downloaded into `cache` with `token` as `HF_TOKEN` and `args` added.
async fn start_with_token(
    hub: &FakeHub,
    cache: &TempDir,
    args: &[&str],
    token: &str,
) -> Result<Gateway, String> {
    let path = cache.path.display().to_string();
    let mut env = env(hub, &path, false);
    env.retain(|(k, _)| *k != "HF_TOKEN");
    env.push(("HF_TOKEN", token));
    let mut all = vec![ID, "--max-model-len", "256"];
    all.extend_from_slice(args);
    Gateway::start_with_env(&all, &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_repository_is_read_with_the_token_from_the_flag_the_variable_or_the_file() {
    let hub = hub().await;
    hub.set_mode(Mode::Gated("hf_secret".into()));
    let wrong = must(TempDir::new("hub-gated-wrong"));
    let outcome = start_with_token(&hub, &wrong, &[], "hf_wrong").await;
    assert!(outcome.is_err_and(|e| e.contains("HF_TOKEN")));

    let from_env = must(TempDir::new("hub-gated-env"));
    completes(&must(
        start_with_token(&hub, &from_env, &[], "hf_secret").await,
    ))
    .await;

    // The flag wins over the variable.
    let from_flag = must(TempDir::new("hub-gated-flag"));
    let flag = ["--hf-token", "hf_secret"];
    completes(&must(
        start_with_token(&hub, &from_flag, &flag, "hf_wrong").await,
    ))
    .await;

    // `huggingface-cli login`'s file under HF_HOME, when nothing else names a token.
    let from_file = must(TempDir::new("hub-gated-file"));
    must(from_file.write("token", "hf_secret\n").map(|_| ()));
    completes(&must(start_with_token(&hub, &from_file, &[], "").await)).await;
}

/// `gateway preload --model ID` resolves a hub id as `serve` does: downloaded into the cache
/// from the hub when missing, found there offline, and refused in one line naming the id when
/// it is neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_takes_a_hub_id_as_serve_does() {
    let hub = hub().await;
    let cache = must(TempDir::new("hub-preload"));
    let path = cache.path.display().to_string();
    let sockets = must(TempDir::new("hub-preload-sockets"));
    let log = cache.path.join("preload.log");
    let mut child = std::process::Command::new(must(common::gateway_bin()))
        .args(["preload", "--model", ID, "--weight-cache-socket-dir"])
        .arg(&sockets.path)
        .envs(env(&hub, &path, false))
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(must(std::fs::File::create(&log).map_err(|e| e.to_string())))
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Waits for the daemon's own line (the deadline only ends a failing test).
    let started = std::time::Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("weight cache listening") {
            break text;
        }
        let exited = child.try_wait().ok().flatten();
        assert!(
            exited.is_none() && started.elapsed() < Duration::from_secs(120),
            "{exited:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        snapshot(&cache.path).join("model.safetensors").is_file(),
        "{text}"
    );
    assert!(hub.requests().len() > 1, "it downloaded from the hub");

    // Offline, an id the cache lacks is one line naming it, the revision and the folder.
    let asked = hub.requests().len();
    let mut absent = std::process::Command::new(must(common::gateway_bin()))
        .args([
            "preload",
            "--model",
            "org/absent",
            "--weight-cache-socket-dir",
        ])
        .arg(&sockets.path)
        .envs(env(&hub, &path, true))
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = absent.try_wait().ok().flatten() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = absent.kill();
            panic!("preload of an absent id offline did not stop");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = absent.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    let line = error_line(Ok((status, stderr)));
    for part in ["org/absent", "main", path.as_str()] {
        assert!(line.contains(part), "{line}");
    }
    assert_eq!(hub.requests().len(), asked, "offline asks the hub nothing");
}
