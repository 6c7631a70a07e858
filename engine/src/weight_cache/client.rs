//! The engine side: ask the daemon for weights, check them, and map (zero_copy) or copy them.

use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapMut};
use rustix::fs::{fcntl_get_seals, SealFlags};
use thiserror::Error;

use super::config::{CacheMode, LoaderConfig};
use super::device::CachedDevice;
use super::identity::{describe_diffs, CacheIdentity, FieldDiff};
use super::protocol::{self, PartInfo, Reply, Request};

/// Why the cache could not serve.
#[derive(Debug, Error)]
pub enum AttachError {
    /// The daemon holds other weights: never waited for.
    #[error("the weight cache holds other weights: {}", describe_diffs(.0))]
    Mismatch(Vec<FieldDiff>),
    /// No daemon, or not ready (yet); `fallback: false` waits on this.
    #[error("{0}")]
    Unavailable(String),
    /// `fallback: false` waited `state_timeout_s` and the daemon never became ready.
    #[error("no weight-cache daemon was ready at {socket} within state_timeout_s={waited_s}s (last: {last})")]
    TimedOut {
        socket: PathBuf,
        waited_s: f64,
        last: String,
    },
    /// The daemon answered something this engine cannot use.
    #[error("weight-cache protocol error: {0}")]
    Protocol(String),
}

/// Weights received from the daemon, ready for the loader.
#[derive(Debug)]
pub struct Attachment {
    pub pid: u32,
    pub identity: CacheIdentity,
    pub parts: Vec<PartInfo>,
    pub maps: Vec<Arc<Mmap>>,
    pub mode: CacheMode,
    /// The device weights of a daemon holding them on a GPU, mapped at the bring-up.
    pub device: Option<CachedDevice>,
}

impl Attachment {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.len).sum()
    }
}

/// Zero-copy attachments: the connection stays open for the process's life, which is how the
/// daemon knows the memory is still in use.
static HELD_CONNECTIONS: Mutex<Vec<UnixStream>> = Mutex::new(Vec::new());

/// Attaches to the daemon at `socket` for weights of identity `want`. A mismatch returns at
/// once; an absent or loading daemon is waited for up to `state_timeout` when `fallback` is
/// off, and reported at once when it is on (the caller then loads from disk).
pub fn attach(
    socket: &Path,
    want: &CacheIdentity,
    cfg: &LoaderConfig,
) -> Result<Attachment, AttachError> {
    let started = Instant::now();
    let mut said = false;
    loop {
        match attach_once(socket, want, cfg) {
            Err(AttachError::Unavailable(why)) if !cfg.fallback => {
                if started.elapsed() >= cfg.state_timeout {
                    return Err(AttachError::TimedOut {
                        socket: socket.to_path_buf(),
                        waited_s: cfg.state_timeout.as_secs_f64(),
                        last: why,
                    });
                }
                if !said {
                    tracing::info!(
                        socket = %socket.display(),
                        state_timeout_s = cfg.state_timeout.as_secs_f64(),
                        "waiting for the weight-cache daemon: {why}"
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn attach_once(
    socket: &Path,
    want: &CacheIdentity,
    cfg: &LoaderConfig,
) -> Result<Attachment, AttachError> {
    let unavailable = |what: &str, e: io::Error| {
        AttachError::Unavailable(format!("{what} {}: {e}", socket.display()))
    };
    let conn = UnixStream::connect(socket).map_err(|e| unavailable("no daemon at", e))?;
    let timeout = Some(cfg.connect_timeout.max(Duration::from_millis(1)));
    conn.set_read_timeout(timeout)
        .and_then(|()| conn.set_write_timeout(timeout))
        .map_err(|e| unavailable("cannot configure", e))?;
    let request = Request::Attach {
        identity: want.clone(),
        mode: cfg.mode,
    };
    protocol::send(&conn, &request, &[]).map_err(|e| unavailable("cannot write to", e))?;
    let (reply, fds) = protocol::recv::<Reply>(&conn).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => AttachError::Unavailable(format!(
            "the daemon at {} closed the connection without answering (it refuses processes of other users)",
            socket.display()
        )),
        _ => unavailable("no answer within connect_timeout_s from", e),
    })?;
    let (pid, identity, parts, device) = match reply {
        Reply::Ready {
            pid,
            identity,
            parts,
            device,
        } => (pid, identity, parts, device),
        Reply::Loading => {
            return Err(AttachError::Unavailable(
                "the daemon is still loading".into(),
            ))
        }
        Reply::Unavailable { reason } => {
            return Err(AttachError::Unavailable(format!(
                "the daemon cannot serve: {reason}"
            )))
        }
        Reply::Reloading { reason } => {
            return Err(AttachError::Unavailable(format!(
                "the daemon is loading the checkpoint again, which changed on disk since it was held: {reason}"
            )))
        }
        Reply::Mismatch { fields } => return Err(AttachError::Mismatch(fields)),
    };
    let diffs = identity.diff(want);
    if !diffs.is_empty() {
        return Err(AttachError::Mismatch(diffs));
    }
    let mut fds = fds;
    let expected = parts.len() + usize::from(device.is_some());
    if fds.len() != expected {
        return Err(AttachError::Protocol(format!(
            "{expected} memory handles announced, {} received",
            fds.len()
        )));
    }
    // `copy` leaves the daemon free to release right after the answer, so the device weights
    // are only mapped in `zero_copy`; a copying engine uploads them from its copy of the files.
    let device = match (device, fds.len() > parts.len()) {
        (Some(d), true) => fds
            .pop()
            .filter(|_| cfg.mode == CacheMode::ZeroCopy)
            .map(|fd| CachedDevice::new(*d, fd, cfg.fallback)),
        _ => None,
    };
    let mut maps = Vec::with_capacity(parts.len());
    for (part, fd) in parts.iter().zip(fds) {
        let seals = fcntl_get_seals(&fd)
            .map_err(|e| AttachError::Protocol(format!("part {}: {e}", part.name)))?;
        if !seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW) {
            return Err(AttachError::Protocol(format!(
                "part {} is not sealed against writes and resizing",
                part.name
            )));
        }
        let file = File::from(fd);
        // SAFETY: the memfd is sealed against writes, shrinking and growing (checked above),
        // so the bytes under the map can neither change nor disappear.
        let shared = unsafe { Mmap::map(&file) }
            .map_err(|e| AttachError::Protocol(format!("cannot map part {}: {e}", part.name)))?;
        if shared.len() as u64 != part.len {
            return Err(AttachError::Protocol(format!(
                "part {} is {} bytes, announced {}",
                part.name,
                shared.len(),
                part.len
            )));
        }
        let map = match cfg.mode {
            CacheMode::ZeroCopy => shared,
            CacheMode::Copy => copy_out(&shared).map_err(|e| {
                AttachError::Protocol(format!("cannot copy part {}: {e}", part.name))
            })?,
        };
        maps.push(Arc::new(map));
    }
    match cfg.mode {
        CacheMode::Copy => {
            let _ = protocol::send(&conn, &Request::Detach, &[]);
        }
        CacheMode::ZeroCopy => {
            if let Ok(mut held) = HELD_CONNECTIONS.lock() {
                held.push(conn);
            }
        }
    }
    Ok(Attachment {
        pid,
        identity,
        parts,
        maps,
        mode: cfg.mode,
        device,
    })
}

/// The engine's own read-only copy of a part.
fn copy_out(src: &[u8]) -> io::Result<Mmap> {
    let mut own = MmapMut::map_anon(src.len().max(1))?;
    own[..src.len()].copy_from_slice(src);
    own.make_read_only()
}
