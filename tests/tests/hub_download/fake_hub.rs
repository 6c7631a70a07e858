//! A Hugging Face hub on a loopback port, for the download tests: the two endpoints hf-hub
//! calls, answered as huggingface.co answers them, over plain HTTP/1.1 written by hand so a
//! test can also cut a file short or stall it.
//!
//! - `GET /api/models/{org}/{name}/revision/{rev}`: `{"id", "sha", "siblings": [{"rfilename"}]}`;
//! - `GET|HEAD /{org}/{name}/resolve/{rev}/{file}`: the file, with `x-repo-commit`, `etag`,
//!   `accept-ranges` and, for a `Range: bytes=a-b` request, 206 and `content-range`.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One repository: its commit, the refs naming it, its files.
pub struct FakeRepo {
    pub sha: String,
    pub refs: Vec<String>,
    pub files: Vec<(String, Arc<Vec<u8>>)>,
}

impl FakeRepo {
    /// A repository holding every file of `dir`, at `sha`, named by `main` and `refs`.
    pub fn from_dir(dir: &Path, sha: &str, refs: &[&str]) -> Result<Self, String> {
        let mut files = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_file() {
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                files.push((name, Arc::new(bytes)));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self {
            sha: sha.to_string(),
            refs: std::iter::once("main")
                .chain(refs.iter().copied())
                .map(String::from)
                .collect(),
            files,
        })
    }
}

/// How the hub misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Every request: 401, as the hub answers a gated or private repository without a token.
    Unauthorized,
    /// 401 unless the request carries `Authorization: Bearer <this token>`.
    Gated(String),
    /// This file's body stops halfway and the connection closes.
    Cut(String),
    /// This file's body stops halfway and the connection stays open, silent.
    Stall(String),
    /// This file's body is half of it, sent chunked and ended cleanly: nothing on the wire
    /// says it is short.
    Short(String),
}

pub struct FakeHub {
    pub endpoint: String,
    repos: Arc<HashMap<String, FakeRepo>>,
    mode: Arc<Mutex<Mode>>,
    log: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeHub {
    pub async fn start(repos: Vec<(&str, FakeRepo)>) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("binding the fake hub: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let repos: Arc<HashMap<String, FakeRepo>> = Arc::new(
            repos
                .into_iter()
                .map(|(id, repo)| (id.to_string(), repo))
                .collect(),
        );
        let mode = Arc::new(Mutex::new(Mode::Normal));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (r, m, l) = (repos.clone(), mode.clone(), log.clone());
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (r, m, l) = (r.clone(), m.clone(), l.clone());
                tokio::spawn(async move { serve(socket, &r, &m, &l).await });
            }
        });
        Ok(Self {
            endpoint: format!("http://{addr}"),
            repos,
            mode,
            log,
            task,
        })
    }

    pub fn set_mode(&self, mode: Mode) {
        if let Ok(mut m) = self.mode.lock() {
            *m = mode;
        }
    }

    /// The requests so far, `METHOD /path` each.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn clear(&self) {
        if let Ok(mut l) = self.log.lock() {
            l.clear();
        }
    }

    /// The etag the hub gives `file` of `repo` (and so the name of its blob in the cache).
    pub fn etag(&self, repo: &str, file: &str) -> Option<String> {
        let repo = self.repos.get(repo)?;
        let (_, bytes) = repo.files.iter().find(|(n, _)| n == file)?;
        Some(etag(bytes))
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn etag(bytes: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    format!("{:016x}{:08x}", h.finish(), bytes.len())
}

/// One request per connection (each answer closes it).
async fn serve(
    mut socket: TcpStream,
    repos: &HashMap<String, FakeRepo>,
    mode: &Mutex<Mode>,
    log: &Mutex<Vec<String>>,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split_whitespace();
    let (method, target) = (
        words.next().unwrap_or_default().to_string(),
        words.next().unwrap_or_default().to_string(),
    );
    if let Ok(mut l) = log.lock() {
        l.push(format!("{method} {target}"));
    }
    let header = |want: &str| {
        head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case(want)
                .then(|| value.trim().to_string())
        })
    };
    let range = header("range");
    let mode = mode.lock().map(|m| m.clone()).unwrap_or(Mode::Normal);
    let authorized = match &mode {
        Mode::Unauthorized => false,
        Mode::Gated(token) => header("authorization") == Some(format!("Bearer {token}")),
        _ => true,
    };
    if !authorized {
        let body = r#"{"error":"Invalid credentials in Authorization header"}"#;
        return reply(&mut socket, "401 Unauthorized", &[], body.as_bytes()).await;
    }
    let not_found = |what: &str| format!(r#"{{"error":"{what} not found"}}"#);
    if let Some(rest) = target.strip_prefix("/api/models/") {
        let Some((id, rev)) = rest.split_once("/revision/") else {
            return reply(
                &mut socket,
                "404 Not Found",
                &[],
                not_found("route").as_bytes(),
            )
            .await;
        };
        let Some(repo) = lookup(repos, id, rev) else {
            let body = not_found("Repository");
            return reply(&mut socket, "404 Not Found", &[], body.as_bytes()).await;
        };
        let siblings: Vec<serde_json::Value> = repo
            .files
            .iter()
            .map(|(name, _)| serde_json::json!({"rfilename": name}))
            .collect();
        let body = serde_json::json!({"id": id, "sha": repo.sha, "siblings": siblings});
        let headers = [("content-type", "application/json".to_string())];
        return reply(&mut socket, "200 OK", &headers, body.to_string().as_bytes()).await;
    }
    let resolved = target.strip_prefix('/').and_then(|t| {
        let (id, rest) = t.split_once("/resolve/")?;
        let (rev, file) = rest.split_once('/')?;
        let repo = lookup(repos, id, rev)?;
        let (name, bytes) = repo.files.iter().find(|(n, _)| n == file)?;
        Some((repo, name.clone(), bytes.clone()))
    });
    let Some((repo, name, bytes)) = resolved else {
        let body = not_found("Entry");
        return reply(&mut socket, "404 Not Found", &[], body.as_bytes()).await;
    };
    let len = bytes.len();
    let (start, end) = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .map(|(a, b)| (a, b.min(len.saturating_sub(1))))
        .unwrap_or((0, len.saturating_sub(1)));
    let mut headers = vec![
        ("x-repo-commit", repo.sha.clone()),
        ("etag", format!("\"{}\"", etag(&bytes))),
        ("accept-ranges", "bytes".to_string()),
    ];
    let status = if range.is_some() {
        headers.push(("content-range", format!("bytes {start}-{end}/{len}")));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    let body = bytes.get(start..=end).unwrap_or_default();
    let whole_body = (start, end) != (0, 0);
    match mode {
        Mode::Cut(ref f) | Mode::Stall(ref f) if *f == name && whole_body && method == "GET" => {
            headers.push(("content-length", body.len().to_string()));
            let _ = socket
                .write_all(head_text(status, &headers).as_bytes())
                .await;
            let _ = socket.write_all(&body[..body.len() / 2]).await;
            let _ = socket.flush().await;
            if matches!(mode, Mode::Stall(_)) {
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
        }
        Mode::Short(ref f) if *f == name && whole_body && method == "GET" => {
            headers.push(("transfer-encoding", "chunked".to_string()));
            let half = &body[..body.len() / 2];
            let _ = socket
                .write_all(head_text(status, &headers).as_bytes())
                .await;
            let _ = socket
                .write_all(format!("{:x}\r\n", half.len()).as_bytes())
                .await;
            let _ = socket.write_all(half).await;
            let _ = socket.write_all(b"\r\n0\r\n\r\n").await;
            let _ = socket.shutdown().await;
        }
        _ if method == "HEAD" => {
            headers.push(("content-length", body.len().to_string()));
            let _ = socket
                .write_all(head_text(status, &headers).as_bytes())
                .await;
        }
        _ => reply(&mut socket, status, &headers, body).await,
    }
}

/// The repository `id` when `rev` is its commit or one of its refs.
fn lookup<'a>(repos: &'a HashMap<String, FakeRepo>, id: &str, rev: &str) -> Option<&'a FakeRepo> {
    repos
        .get(id)
        .filter(|repo| repo.sha == rev || repo.refs.iter().any(|r| r == rev))
}

fn head_text(status: &str, headers: &[(&str, String)]) -> String {
    let mut text = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text
}

async fn reply(socket: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut headers = headers.to_vec();
    headers.push(("content-length", body.len().to_string()));
    let _ = socket
        .write_all(head_text(status, &headers).as_bytes())
        .await;
    let _ = socket.write_all(body).await;
    let _ = socket.shutdown().await;
}
