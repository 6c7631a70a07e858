//! Downloading a checkpoint the cache lacks, through `hf-hub` (which neither reads
//! `HF_HUB_OFFLINE` nor bounds its requests in time: both are done here).
//!
//! The revision is pinned to its commit first, so a branch that moves mid-download cannot mix
//! two commits' files, and `refs/<revision>` is written only once every file is in the
//! snapshot: an interrupted download is never found by a later offline start as if complete.
//! A file is in the snapshot only once it arrived whole (hf-hub writes into
//! `blobs/<etag>.sync.part` and links it in after), and is not fetched again.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::tokio::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};

use super::progress::FileProgress;
use super::{files, Failure, HubSpec};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the hub, from the environment as `huggingface_hub` reads it.
#[derive(Clone)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    /// `HF_HUB_ETAG_TIMEOUT`: the repository listing.
    metadata_timeout: Duration,
    /// `HF_HUB_DOWNLOAD_TIMEOUT`: the longest a file (its headers, then its body) may go
    /// without a byte arriving.
    read_timeout: Duration,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl Hub {
    /// `HF_ENDPOINT`, the token (`token` if given, else `HF_TOKEN`, else the token file), and
    /// the two timeouts (10 s each by default, as `huggingface_hub`'s).
    pub fn from_env(token: Option<String>) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let secs = |k: &str| {
            let s = var(k).and_then(|v| v.trim().parse::<f64>().ok());
            Duration::from_secs_f64(s.filter(|s| *s > 0.0 && s.is_finite()).unwrap_or(10.0))
        };
        Self {
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: token
                .filter(|t| !t.is_empty())
                .or_else(|| var("HF_TOKEN"))
                .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
                .or_else(token_file),
            metadata_timeout: secs("HF_HUB_ETAG_TIMEOUT"),
            read_timeout: secs("HF_HUB_DOWNLOAD_TIMEOUT"),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Downloads `spec` at `revision` into the hub cache at `cache`; the path to load. Runs on
    /// a thread and runtime of its own, so it may be called from anywhere, and whatever hf-hub
    /// left running when a download is abandoned ends with that runtime.
    pub fn fetch(
        &self,
        cache: &Path,
        spec: &HubSpec<'_>,
        revision: &str,
    ) -> Result<PathBuf, Failure> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| Failure::Cache(format!("cannot start a runtime: {e}")))?;
                    let fetched = rt.block_on(self.fetch_async(cache, spec, revision));
                    // Chunk tasks of an abandoned download are dropped, not waited for.
                    rt.shutdown_timeout(Duration::from_secs(1));
                    fetched
                })
                .join()
                .unwrap_or(Err(Failure::Crashed))
        })
    }

    async fn fetch_async(
        &self,
        cache: &Path,
        spec: &HubSpec<'_>,
        revision: &str,
    ) -> Result<PathBuf, Failure> {
        let api = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_user_agent("gateway", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| Failure::BadAnswer(chain(&e)))?;
        let model = |rev: &str| {
            api.repo(Repo::with_revision(
                spec.id.to_string(),
                RepoType::Model,
                rev.to_string(),
            ))
        };
        let info = tokio::time::timeout(self.metadata_timeout, model(revision).info())
            .await
            .map_err(|_| Failure::Unreachable {
                endpoint: self.endpoint.clone(),
                why: format!("no answer in {} s", self.metadata_timeout.as_secs_f64()),
            })?
            .map_err(|e| self.classify(e, None))?;
        let commit = info.sha;
        if !engine::hf::hub::is_commit(&commit) {
            return Err(Failure::BadAnswer(format!(
                "{commit:?} is not a commit hash"
            )));
        }
        let siblings: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let pinned = model(&commit);
        let repo_dir = engine::hf::hub::repo_dir(cache, spec.id);
        let snapshot = repo_dir.join("snapshots").join(&commit);
        let first = files::first(&siblings, spec.id, spec.quant).map_err(Failure::Files)?;
        let mark = incomplete_mark(&repo_dir, &commit);
        mark.parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| std::fs::write(&mark, b""))
            .map_err(|e| Failure::Cache(format!("{}: {e}", mark.display())))?;
        for file in &first {
            self.file(&pinned, &snapshot, file).await?;
        }
        let path = match spec.quant {
            Some(_) => first
                .first()
                .map(|gguf| snapshot.join(gguf))
                .ok_or_else(|| Failure::Files(String::from("no GGUF file")))?,
            None => {
                for file in files::weights(&snapshot, &siblings).map_err(Failure::Files)? {
                    self.file(&pinned, &snapshot, &file).await?;
                }
                snapshot.clone()
            }
        };
        finish(&repo_dir, revision, &commit)
            .map_err(|e| Failure::Cache(format!("{}: {e}", repo_dir.display())))?;
        tracing::info!(
            model = spec.id,
            revision,
            commit,
            "in the local Hugging Face cache"
        );
        Ok(path)
    }

    /// One file into the snapshot, unless an earlier start already put it there.
    async fn file(&self, repo: &ApiRepo, snapshot: &Path, file: &str) -> Result<(), Failure> {
        let pointer = snapshot.join(file);
        if pointer.exists() {
            return Ok(());
        }
        let progress = FileProgress::new(file, std::io::stderr().is_terminal());
        let outcome = tokio::select! {
            outcome = repo.download_with_progress(file, progress.clone()) => outcome,
            () = progress.stalled(self.read_timeout) => {
                progress.abandon();
                return Err(Failure::Stalled {
                    file: file.to_string(),
                    secs: self.read_timeout.as_secs(),
                });
            }
        };
        if let Err(e) = outcome {
            progress.abandon();
            return Err(self.classify(e, Some(file)));
        }
        let (size, received) = progress.counts();
        if received != size {
            // hf-hub sizes the file from the announced length before writing it, so a body
            // that ended early would otherwise sit in the cache, padded, looking whole.
            if let Ok(blob) = std::fs::canonicalize(&pointer) {
                let _ = std::fs::remove_file(blob);
            }
            let _ = std::fs::remove_file(&pointer);
            return Err(Failure::Download {
                file: file.to_string(),
                why: format!("{received} of {size} bytes arrived"),
            });
        }
        progress.done();
        Ok(())
    }

    /// An hf-hub error as one of ours: about `file`, or the repository listing when `None`.
    fn classify(&self, e: ApiError, file: Option<&str>) -> Failure {
        let endpoint = self.endpoint.clone();
        if let ApiError::RequestError(req) = &e {
            match (req.status().map(|s| s.as_u16()), file) {
                (Some(status @ (401 | 403)), _) => {
                    return Failure::Unauthorized { endpoint, status }
                }
                (Some(404), None) => return Failure::NotFound { endpoint },
                (Some(status), _) => {
                    return Failure::Status {
                        endpoint,
                        status,
                        what: file.unwrap_or("the repository listing").to_string(),
                    }
                }
                (None, _) if req.is_connect() => {
                    return Failure::Unreachable {
                        endpoint,
                        why: chain(req),
                    }
                }
                (None, _) => {}
            }
        }
        match file {
            None => Failure::BadAnswer(chain(&e)),
            Some(file) => Failure::Download {
                file: file.to_string(),
                why: chain(&e),
            },
        }
    }
}

/// Marks a download under way, or interrupted: `<repo>/.incomplete/<commit>` (beside
/// `snapshots/`, where `huggingface_hub` expects only folders). A snapshot so marked is not
/// served as it is: a start fetches what it lacks, an offline one refuses it. This matters for
/// a commit revision, which no ref guards.
fn incomplete_mark(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join(".incomplete").join(commit)
}

/// Whether the snapshot folder `snapshot` (`<repo>/snapshots/<commit>`) is a download that did
/// not finish.
pub fn interrupted(snapshot: &Path) -> bool {
    match (
        snapshot.parent().and_then(Path::parent),
        snapshot.file_name(),
    ) {
        (Some(repo_dir), Some(commit)) => repo_dir.join(".incomplete").join(commit).exists(),
        _ => false,
    }
}

/// Every file is in: `refs/<revision>` names the commit, hf-hub's own `refs/<commit>` (it was
/// handed the commit as the revision) goes, as `huggingface_hub` keeps no such ref, and the
/// snapshot loses its incomplete mark.
fn finish(repo_dir: &Path, revision: &str, commit: &str) -> std::io::Result<()> {
    let refs = repo_dir.join("refs");
    if revision != commit {
        std::fs::create_dir_all(&refs)?;
        std::fs::write(refs.join(revision), commit)?;
    }
    for done in [refs.join(commit), incomplete_mark(repo_dir, commit)] {
        match std::fs::remove_file(done) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The token file `huggingface-cli login` writes: `HF_TOKEN_PATH`, else `$HF_HOME/token`,
/// else `~/.cache/huggingface/token`.
fn token_file() -> Option<String> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let path = var("HF_TOKEN_PATH")
        .or_else(|| var("HF_HOME").map(|h| h.join("token")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/token")))?;
    let token = std::fs::read_to_string(path).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text.replace(['\n', '\r'], " ")
}
