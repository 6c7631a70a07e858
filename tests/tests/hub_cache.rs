//! `gateway serve MODEL` as `vllm serve MODEL`: the model positional, and a Hugging Face hub id
//! served from the local hub cache (`HF_HUB_CACHE`), under the id as its name and root. An id the cache
//! lacks when offline (`HF_HUB_OFFLINE=1`), and a `--revision` with no hub id to apply to, stop the
//! start with one line.

mod common;

use std::time::Duration;

use common::{must, run_to_exit, run_to_exit_with_env, workspace_root, Gateway, TempDir};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A hub cache holding the tiny Llama as `org/tiny-llama` at `main`.
fn hub_cache() -> TempDir {
    let dir = must(TempDir::new("hub"));
    let repo = dir.path.join("models--org--tiny-llama");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(repo.join("refs")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap_or_else(|e| panic!("{e}"));
    let tiny = workspace_root().join("tests/data/tiny-llama");
    for entry in std::fs::read_dir(&tiny).unwrap_or_else(|e| panic!("{e}")) {
        let entry = entry.unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(entry.path(), snapshot.join(entry.file_name()))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_id_is_served_from_the_local_cache_under_its_id() {
    let cache = hub_cache();
    let cache_path = cache.path.display().to_string();
    let gateway = must(
        Gateway::start_with_env(
            &["org/tiny-llama", "--max-model-len", "256"],
            &[
                ("HF_HUB_CACHE", cache_path.as_str()),
                ("HF_HUB_OFFLINE", "1"),
            ],
        )
        .await,
    );
    let models: serde_json::Value = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .get(format!("{}/v1/models", gateway.base_url))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = models["data"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["org/tiny-llama"], "{models}");
    // The root is the model as given, as vLLM shows it, not the snapshot folder.
    assert_eq!(models["data"][0]["root"], "org/tiny-llama", "{models}");
}

#[test]
fn an_id_the_cache_lacks_and_a_revision_with_nothing_to_apply_to_are_refused() {
    let cache = hub_cache();
    let missing = ["no-such-org/no-such-model"];
    let (status, stderr) = must(run_to_exit_with_cache(&missing, &cache));
    assert!(!status.success());
    assert!(
        stderr.contains("no-such-org/no-such-model (revision main)")
            && stderr.contains("models--no-such-org--no-such-model"),
        "{stderr}"
    );
    let (status, stderr) = must(run_to_exit_with_cache(
        &["org/tiny-llama", "--revision", "v9"],
        &cache,
    ));
    assert!(!status.success());
    assert!(
        stderr.contains("(revision v9)") && stderr.contains("no refs/v9"),
        "{stderr}"
    );
    let tiny = workspace_root().join("tests/data/tiny-llama");
    let tiny = tiny.display().to_string();
    let (status, stderr) = must(run_to_exit(
        &[&tiny, "--revision", "v1"],
        Duration::from_secs(30),
    ));
    assert!(!status.success());
    assert!(
        stderr.contains("--revision v1 applies to hub ids"),
        "{stderr}"
    );
}

/// `gateway serve args` with `HF_HUB_CACHE` set to `cache`, offline (the hub is never asked
/// here; tests/tests/hub_download.rs downloads from a fake one), to its exit.
fn run_to_exit_with_cache(
    args: &[&str],
    cache: &TempDir,
) -> Result<(std::process::ExitStatus, String), String> {
    let path = cache.path.display().to_string();
    let env = [("HF_HUB_CACHE", path.as_str()), ("HF_HUB_OFFLINE", "1")];
    run_to_exit_with_env(args, &env, Duration::from_secs(30))
}
