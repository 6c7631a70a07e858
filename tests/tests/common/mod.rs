//! Shared harness for the integration tests: find and start the real `gateway` binary on
//! a loopback port, wait for `/health`, stop it on drop; a counting media server; temp dirs.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::fs::File;
use std::io::Read;
use std::net::TcpListener as StdListener;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How long a server may take to answer `/health`.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// The gateway binary: `$GATEWAY_BIN`, else `gateway` next to this test's profile folder
/// (`target/<profile>/deps/<test>` -> `target/<profile>/gateway`), else the workspace's
/// default `target/<profile>/gateway`.
pub fn gateway_bin() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("GATEWAY_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("GATEWAY_BIN={} is not a file", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("unexpected test binary path {}", exe.display()))?;
    let mut tried = vec![profile_dir.join("gateway")];
    if let Some(profile) = profile_dir.file_name() {
        tried.push(
            workspace_root()
                .join("target")
                .join(profile)
                .join("gateway"),
        );
    }
    for candidate in &tried {
        if candidate.is_file() {
            return Ok(candidate.clone());
        }
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "the gateway binary was not found (looked at {}); run `cargo build -p gateway` first \
         (same profile and target dir as the tests), or set GATEWAY_BIN",
        tried.join(", ")
    ))
}

/// Unwraps a harness result or fails the test with the error.
pub fn must<T>(result: Result<T, String>) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{err}"),
    }
}

/// POSTs `body` as JSON to `url`; a transport failure fails the test.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> reqwest::Response {
    must(
        client
            .post(url)
            .json(body)
            .send()
            .await
            .map_err(|e| e.to_string()),
    )
}

/// A client for the server under test (no proxy, whatever the environment says).
pub fn client() -> reqwest::Client {
    must(
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| e.to_string()),
    )
}

/// GETs `url` and returns its body as text; a transport failure fails the test.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    must(
        async {
            client
                .get(url)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())
        }
        .await,
    )
}

/// A free loopback port (bound, read, released).
pub fn free_port() -> Result<u16, String> {
    let listener =
        StdListener::bind("127.0.0.1:0").map_err(|err| format!("binding port 0: {err}"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|err| format!("local_addr: {err}"))
}

/// A fresh temporary folder, removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(label: &str) -> Result<Self, String> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "contract-{label}-{}-{nanos}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)
            .map_err(|err| format!("creating {}: {err}", path.display()))?;
        Ok(Self { path })
    }

    pub fn write(&self, name: &str, text: &str) -> Result<PathBuf, String> {
        let path = self.path.join(name);
        std::fs::write(&path, text).map_err(|err| format!("writing {}: {err}", path.display()))?;
        Ok(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The `gateway serve` command with our loopback defaults and a clean environment.
pub fn serve_command(bin: &Path, port: u16, args: &[String]) -> Command {
    let root = workspace_root();
    let mut command = Command::new(bin);
    command
        .current_dir(&root)
        .arg("serve")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--models-cache")
        .arg(root.join("models-cache"))
        .args(args)
        .env_remove("VLLM_API_KEY")
        .env_remove("MODELS_CACHE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

/// A running gateway, killed on drop.
pub struct Gateway {
    child: Child,
    pub port: u16,
    pub base_url: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Gateway {
    /// Starts `gateway serve` with `args` and waits for `/health` to answer 200.
    pub async fn start(args: &[&str]) -> Result<Self, String> {
        Self::start_with_env(args, &[]).await
    }

    /// [`Gateway::start`] with extra environment variables.
    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|err| err.to_string())?;
        Self::start_with_client(args, env, "http", &client).await
    }

    /// [`Gateway::start`] served as `scheme` (`http` or `https`), probed with `client`.
    pub async fn start_with_client(
        args: &[&str],
        env: &[(&str, &str)],
        scheme: &str,
        client: &reqwest::Client,
    ) -> Result<Self, String> {
        let bin = gateway_bin()?;
        let port = free_port()?;
        let dir = TempDir::new("gateway")?;
        let log = dir.path.join("stderr.log");
        let stderr = File::create(&log).map_err(|err| format!("creating log: {err}"))?;
        let stdout = stderr
            .try_clone()
            .map_err(|err| format!("cloning log handle: {err}"))?;
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        let child = serve_command(&bin, port, &args)
            .envs(env.iter().copied())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|err| format!("spawning {}: {err}", bin.display()))?;
        let mut gateway = Self {
            child,
            port,
            base_url: format!("{scheme}://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        gateway.wait_healthy(&args, client).await?;
        Ok(gateway)
    }

    async fn wait_healthy(
        &mut self,
        args: &[String],
        client: &reqwest::Client,
    ) -> Result<(), String> {
        let url = format!("{}/health", self.base_url);
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "gateway serve {args:?} exited with {status} before /health answered; output:\n{}",
                    self.output()
                ));
            }
            if let Ok(response) = client.get(&url).send().await {
                if response.status().as_u16() == 200 {
                    return Ok(());
                }
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "gateway serve {args:?} did not answer /health with 200 within {}s; output:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.output()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The server process's peak resident set (VmHWM), in bytes; `None` off Linux.
    pub fn peak_rss(&self) -> Option<u64> {
        proc_status_bytes(self.child.id(), "VmHWM:")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send SIGTERM and wait up to `limit` for the process to exit; its status, or `None`
    /// when it is still running at `limit`.
    pub async fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.wait_exit(limit).await
    }

    /// Wait up to `limit` for the process to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// What the process wrote so far.
    pub fn output(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `kB` field (`VmRSS:`, `VmHWM:`) of process `pid`'s `/proc` status, in bytes; `None` off
/// Linux or once the process is gone.
pub fn proc_status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `gateway serve` with `args`, expecting it to exit by itself within `limit`;
/// returns its exit status and stderr. A process still running at `limit` is killed and
/// reported as an error.
pub fn run_to_exit(args: &[&str], limit: Duration) -> Result<(ExitStatus, String), String> {
    run_to_exit_with_env(args, &[], limit)
}

/// [`run_to_exit`] with extra environment variables for the gateway.
pub fn run_to_exit_with_env(
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Result<(ExitStatus, String), String> {
    let bin = gateway_bin()?;
    let port = free_port()?;
    let dir = TempDir::new("startup")?;
    let log = dir.path.join("stderr.log");
    let stderr = File::create(&log).map_err(|err| format!("creating log: {err}"))?;
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let mut child = serve_command(&bin, port, &args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .spawn()
        .map_err(|err| format!("spawning {}: {err}", bin.display()))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "gateway serve {args:?} was still running after {}s (it should refuse to start)",
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(err) => return Err(format!("waiting for the gateway: {err}")),
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    Ok((status, text))
}

/// How long until the server closes `stream` (reads until EOF); `None` if it is still open
/// after `limit`.
///
/// The limits these tests pass are many times the timeouts they check, so a loaded machine
/// cannot reach them, and below every other timer that would close the connection anyway
/// (hyper's own 30 s header timeout), so a server without the behaviour still fails.
pub fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap_or_else(|e| panic!("set_read_timeout: {e}"));
    let mut buf = [0u8; 4096];
    while started.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

/// The tiny Llama checkpoint served as `tiny` on the CPU, then `extra`.
pub fn tiny_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    served_as_tiny("tests/data/tiny-llama", extra)
}

/// `model` served as `tiny` on the CPU with a 256-token context, then `extra`.
pub fn served_as_tiny<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        model,
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "256",
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    args
}

/// A 1x1 PNG.
pub const PNG_1X1: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4,
    0x89, 0x00, 0x00, 0x00, 0x0A, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE,
    0x42, 0x60, 0x82,
];

/// A loopback HTTP/1.1 server that answers every request with a PNG and counts requests.
pub struct MediaServer {
    pub base_url: String,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// A file [`MediaServer::with_files`] answers at a path: its content type and bytes.
pub type MediaFile = (String, &'static str, Arc<Vec<u8>>);

impl MediaServer {
    pub async fn start() -> Result<Self, String> {
        Self::with_files(Vec::new()).await
    }

    /// As [`MediaServer::start`], answering each of `files`' paths with that file.
    pub async fn with_files(files: Vec<MediaFile>) -> Result<Self, String> {
        let files = Arc::new(files);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| format!("binding the media server: {err}"))?;
        let addr = listener.local_addr().map_err(|err| err.to_string())?;
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                let files = Arc::clone(&files);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if head.is_empty() {
                        return;
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let path = String::from_utf8_lossy(&head)
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_string();
                    let (mime, body): (&str, &[u8]) = files
                        .iter()
                        .find(|(p, _, _)| *p == path)
                        .map_or(("image/png", PNG_1X1), |(_, m, b)| (*m, b.as_slice()));
                    let header = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {mime}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(header.as_bytes()).await;
                    let _ = socket.write_all(body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}"),
            hits,
            task,
        })
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for MediaServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The rows of one run: (section, check, status, detail) each, and the exit code.
pub struct Outcome {
    pub code: Option<i32>,
    pub rows: Vec<(String, String, String, String)>,
    pub stdout: String,
}

impl Outcome {
    pub fn failed(&self) -> Vec<(&str, &str)> {
        self.rows
            .iter()
            .filter(|(_, _, status, _)| status == "fail")
            .map(|(section, check, _, _)| (section.as_str(), check.as_str()))
            .collect()
    }

    /// The status and detail of the row `check` of `section`.
    pub fn row(&self, section: &str, check: &str) -> (&str, &str) {
        self.rows
            .iter()
            .find(|(s, c, _, _)| s == section && c == check)
            .map(|(_, _, status, detail)| (status.as_str(), detail.as_str()))
            .unwrap_or_else(|| panic!("no row {section} {check}:\n{}", self.stdout))
    }
}

/// Runs `gateway upgrade-check` with `args` (blocking: the caller's runtime keeps serving).
pub async fn upgrade_check(args: Vec<String>) -> Outcome {
    let dir = must(TempDir::new("upgrade-check"));
    let json_path = dir.path.join("rows.json");
    let bin = must(gateway_bin());
    let mut full = vec![
        "upgrade-check".to_string(),
        "--json".into(),
        json_path.display().to_string(),
    ];
    full.extend(args);
    let output = must(
        tokio::task::spawn_blocking(move || Command::new(bin).args(full).output())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string())),
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let text = must(std::fs::read_to_string(&json_path).map_err(|e| {
        format!(
            "no JSON rows ({e}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    }));
    let json: serde_json::Value = must(serde_json::from_str(&text).map_err(|e| e.to_string()));
    let rows = json["rows"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let field = |k: &str| r[k].as_str().unwrap_or_default().to_string();
                    (
                        field("section"),
                        field("check"),
                        field("status"),
                        field("detail"),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Outcome {
        code: output.status.code(),
        rows,
        stdout,
    }
}

/// Fails the test with the report's table unless every case passed.
pub fn assert_report(report: &contract::Report, label: &str) {
    assert!(
        report.all_passed(),
        "contract suite against the {label} server: {} of {} cases failed\n{}",
        report.cases.len() - report.passed_count(),
        report.cases.len(),
        report.render_table()
    );
}

/// A 4000x3000 JPEG (a gradient: it decodes to the full 36 MB of RGB).
pub fn large_photo() -> Vec<u8> {
    let img = image::RgbImage::from_fn(4000, 3000, |x, y| {
        image::Rgb([(x / 16) as u8, (y / 12) as u8, ((x + y) / 28) as u8])
    });
    let mut jpeg = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut jpeg),
        image::ImageFormat::Jpeg,
    )
    .unwrap_or_else(|e| panic!("encoding the photo: {e}"));
    jpeg
}

/// A 10-minute 16 kHz mono 16-bit WAV of a slowly rising tone (19.2 MB).
pub fn ten_minute_recording() -> Vec<u8> {
    const RATE: u32 = 16_000;
    let samples = RATE as usize * 600;
    let data = (samples * 2) as u32;
    let mut wav = Vec::with_capacity(44 + data as usize);
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + data).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&RATE.to_le_bytes());
    wav.extend_from_slice(&(RATE * 2).to_le_bytes());
    wav.extend_from_slice(&2u16.to_le_bytes());
    wav.extend_from_slice(&16u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&data.to_le_bytes());
    for n in 0..samples {
        let t = n as f64 / f64::from(RATE);
        let v = (t * (200.0 + t) * std::f64::consts::TAU).sin() * 8000.0;
        wav.extend_from_slice(&(v as i16).to_le_bytes());
    }
    wav
}

/// The memory bound the server printed at start-up (`bound_bytes=N` on its `memory bound`
/// line), in bytes, with the line.
pub fn printed_bound(log: &str) -> Option<(u64, String)> {
    let plain = regex::Regex::new("\x1b\\[[0-9;]*m")
        .ok()?
        .replace_all(log, "");
    let line = plain.lines().find(|l| l.contains("memory bound"))?;
    let figure = line.split("bound_bytes=").nth(1)?;
    let bytes = figure.split_whitespace().next()?.parse().ok()?;
    Some((bytes, line.to_string()))
}

/// Samples `pid`'s resident set every 200 ms until `stop`; the largest sample.
pub async fn sample_rss(pid: u32, stop: Arc<std::sync::atomic::AtomicBool>) -> u64 {
    let mut peak = 0;
    while !stop.load(Ordering::SeqCst) {
        peak = peak.max(proc_status_bytes(pid, "VmRSS:").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    peak
}
