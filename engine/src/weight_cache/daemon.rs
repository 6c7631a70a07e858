//! The daemon side: hand the weights [`super::hold`] loaded once to engines of the same user
//! over a Unix socket. The gateway's `preload` command drives it (signals, health).

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::hold::Held;
use super::identity::describe_diffs;
use super::protocol::{self, check_peer, Reply, Request};

/// Where the daemon stands, for the health endpoint and the shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Loading,
    /// The checkpoint's files changed since they were held (the reason says how): the daemon
    /// is loading them again and hands nothing out meanwhile.
    Reloading(String),
    Ready,
    /// A part stopped (the load failed, the socket went away, or shutdown began).
    Exited(String),
}

struct Shared {
    held: RwLock<Option<Arc<Held>>>,
    /// Set when the held files changed on disk, until a reload succeeds.
    stale: Mutex<Option<String>>,
    reloading: AtomicBool,
    exited: Mutex<Option<String>>,
    stopping: AtomicBool,
    attached: AtomicUsize,
    own_uid: u32,
}

impl Shared {
    fn exit(&self, why: String) {
        if let Ok(mut e) = self.exited.lock() {
            e.get_or_insert(why);
        }
    }
}

/// A bound daemon socket and the weights behind it.
pub struct Daemon {
    shared: Arc<Shared>,
    socket: PathBuf,
    inode: u64,
}

impl Daemon {
    /// Binds the socket for `served_name` in `dir` (mode 0600 in a 0700 folder) and starts
    /// answering: `Loading` until [`Daemon::set_ready`].
    pub fn bind(dir: &Path, served_name: &str) -> io::Result<Daemon> {
        protocol::prepare_socket_dir(dir)?;
        let socket = protocol::socket_path(dir, served_name);
        if socket.exists() {
            if UnixStream::connect(&socket).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another daemon already serves '{served_name}' at {}",
                        socket.display()
                    ),
                ));
            }
            std::fs::remove_file(&socket)?;
        }
        let listener = UnixListener::bind(&socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        let inode = std::fs::metadata(&socket)?.ino();
        let shared = Arc::new(Shared {
            held: RwLock::new(None),
            stale: Mutex::new(None),
            reloading: AtomicBool::new(false),
            exited: Mutex::new(None),
            stopping: AtomicBool::new(false),
            attached: AtomicUsize::new(0),
            own_uid: rustix::process::getuid().as_raw(),
        });
        let accept_shared = shared.clone();
        std::thread::Builder::new()
            .name("weight-cache-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))?;
        let watch_shared = shared.clone();
        let watch_path = socket.clone();
        std::thread::Builder::new()
            .name("weight-cache-watch".into())
            .spawn(move || watch(&watch_path, inode, &watch_shared))?;
        tracing::info!(socket = %socket.display(), model = served_name, "weight cache listening");
        Ok(Daemon {
            shared,
            socket,
            inode,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn set_ready(&self, held: Held) {
        if let Ok(mut h) = self.shared.held.write() {
            *h = Some(Arc::new(held));
        }
    }

    /// The load failed: engines are told why, health goes 503.
    pub fn set_failed(&self, why: String) {
        self.shared.exit(format!("loading failed: {why}"));
    }

    pub fn status(&self) -> Status {
        if let Some(why) = self.shared.exited.lock().ok().and_then(|e| e.clone()) {
            return Status::Exited(why);
        }
        if let Some(why) = self.shared.stale.lock().ok().and_then(|e| e.clone()) {
            return Status::Reloading(why);
        }
        match self.shared.held.read() {
            Ok(h) if h.is_some() => Status::Ready,
            _ => Status::Loading,
        }
    }

    /// Engines holding an attachment now.
    pub fn attached(&self) -> usize {
        self.shared.attached.load(Ordering::SeqCst)
    }

    /// Stops taking engines (health turns 503, the socket is removed), then keeps the memory
    /// until every attached engine detached, or `force` passed. Says which in the log.
    pub fn shutdown(&self, force: Option<Duration>) -> usize {
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.shared.exit("shutting down".into());
        if std::fs::metadata(&self.socket).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.socket);
        }
        let started = Instant::now();
        let mut said = false;
        loop {
            let n = self.attached();
            if n == 0 {
                tracing::info!("no engine attached: releasing the weights");
                return 0;
            }
            if !said {
                tracing::warn!(
                    attached = n,
                    force_s = force.map(|f| f.as_secs_f64()),
                    "engines still map the weights (zero_copy): keeping them until they detach{}",
                    if force.is_some() {
                        " or the --force timeout passes"
                    } else {
                        " (set --force SECONDS to bound the wait)"
                    }
                );
                said = true;
            }
            if force.is_some_and(|f| started.elapsed() >= f) {
                tracing::warn!(
                    attached = n,
                    "--force timeout passed: releasing the weights with engines still attached (their own maps stay valid until they exit)"
                );
                return n;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("weight-cache-conn".into())
            .spawn(move || serve_engine(conn, &s));
        if let Err(e) = spawned {
            tracing::error!("cannot start a connection thread: {e}");
        }
    }
}

/// Every 200 ms: a socket file removed (a temp cleaner, an operator) leaves the daemon
/// unreachable while it looks alive, which is a part that exited, and health says so; every
/// second, the held files are checked against the disk, so health turns 503 as soon as a
/// change is seen, not only when an engine asks.
fn watch(path: &Path, inode: u64, shared: &Arc<Shared>) {
    let mut tick = 0u32;
    while !shared.stopping.load(Ordering::SeqCst) {
        if !std::fs::metadata(path).is_ok_and(|m| m.ino() == inode) {
            tracing::error!(socket = %path.display(), "the socket file is gone: engines can no longer reach this cache");
            shared.exit(format!("socket {} removed", path.display()));
            return;
        }
        tick = tick.wrapping_add(1);
        if tick.is_multiple_of(5) {
            revalidate(shared);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the held weights are still the checkpoint's files as they are on disk. When they
/// are not, a reload starts (one at a time, on its own thread) and this says no until it has
/// replaced them; a failed reload is tried again at the next check.
fn revalidate(shared: &Arc<Shared>) -> bool {
    let Some(held) = shared.held.read().ok().and_then(|h| h.clone()) else {
        return false;
    };
    let Some(why) = held.changed_on_disk() else {
        return true;
    };
    if let Ok(mut stale) = shared.stale.lock() {
        stale.get_or_insert_with(|| why.clone());
    }
    if shared.reloading.swap(true, Ordering::SeqCst) {
        return false;
    }
    tracing::warn!("the checkpoint changed on disk since it was held ({why}): loading it again; engines are told to wait or load from disk");
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("weight-cache-reload".into())
        .spawn(move || {
            let started = Instant::now();
            match held.reload() {
                Ok(new) => {
                    tracing::info!(
                        identity = %new.identity,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "weights reloaded from the changed checkpoint"
                    );
                    if let Ok(mut h) = s.held.write() {
                        *h = Some(Arc::new(new));
                    }
                    if let Ok(mut stale) = s.stale.lock() {
                        *stale = None;
                    }
                }
                Err(e) => {
                    tracing::error!("reloading the changed checkpoint failed (tried again at the next check): {e}");
                    if let Ok(mut stale) = s.stale.lock() {
                        *stale = Some(format!("{why}; the reload failed: {e}"));
                    }
                }
            }
            s.reloading.store(false, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the reload: {e}");
        shared.reloading.store(false, Ordering::SeqCst);
    }
    false
}

fn serve_engine(conn: UnixStream, shared: &Arc<Shared>) {
    let peer = match rustix::net::sockopt::socket_peercred(&conn) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("refused a connection whose peer cannot be identified: {e}");
            return;
        }
    };
    if let Err(why) = check_peer(peer.uid.as_raw(), shared.own_uid) {
        tracing::warn!(
            peer_pid = peer.pid.as_raw_nonzero().get(),
            "refused a connection: {why}"
        );
        return;
    }
    let peer_pid = peer.pid.as_raw_nonzero().get();
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let (identity, mode) = match protocol::recv::<Request>(&conn) {
        Ok((Request::Attach { identity, mode }, _)) => (identity, mode),
        Ok((other, _)) => {
            tracing::debug!(peer_pid, ?other, "unexpected first request");
            return;
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            // Say why, rather than close: an engine would read a silent close as a refusal.
            tracing::warn!(
                peer_pid,
                "an engine sent a request this daemon cannot read: {e}"
            );
            let reason = format!("the daemon cannot read the engine's request: {e}");
            let _ = protocol::send(&conn, &Reply::Unavailable { reason }, &[]);
            return;
        }
        Err(e) => {
            tracing::debug!(peer_pid, "no request: {e}");
            return;
        }
    };
    let held = shared.held.read().ok().and_then(|h| h.clone());
    let exited = shared.exited.lock().ok().and_then(|e| e.clone());
    let reply_only = |reply: Reply| {
        let _ = protocol::send(&conn, &reply, &[]);
    };
    let held = match (exited, held) {
        (Some(reason), _) => return reply_only(Reply::Unavailable { reason }),
        (None, None) => return reply_only(Reply::Loading),
        (None, Some(h)) => h,
    };
    // Nothing is handed out before the held files are checked against the disk.
    if !revalidate(shared) {
        let reason = shared
            .stale
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .unwrap_or_else(|| "the checkpoint changed on disk".into());
        return reply_only(Reply::Reloading { reason });
    }
    let held = shared
        .held
        .read()
        .ok()
        .and_then(|h| h.clone())
        .unwrap_or(held);
    let diffs = held.identity.diff(&identity);
    if !diffs.is_empty() {
        tracing::info!(
            peer_pid,
            "an engine asked for other weights: {}",
            describe_diffs(&diffs)
        );
        return reply_only(Reply::Mismatch { fields: diffs });
    }
    let mut fds: Vec<_> = held.parts.iter().map(|(_, fd)| fd.as_fd()).collect();
    if let Some(d) = &held.device {
        match d.handle() {
            Ok(h) => fds.push(h),
            Err(e) => {
                return reply_only(Reply::Unavailable {
                    reason: e.to_string(),
                })
            }
        }
    }
    let reply = Reply::Ready {
        pid: std::process::id(),
        identity: held.identity.clone(),
        parts: held.parts.iter().map(|(p, _)| p.clone()).collect(),
        device: held.device.as_ref().map(|d| Box::new(d.wire())),
    };
    shared.attached.fetch_add(1, Ordering::SeqCst);
    if let Err(e) = protocol::send(&conn, &reply, &fds) {
        tracing::warn!(peer_pid, "cannot send the weights: {e}");
    } else {
        tracing::info!(peer_pid, mode = mode.as_str(), "engine attached");
        // Attached until the engine detaches (copy mode, after copying) or its process ends.
        let _ = conn.set_read_timeout(None);
        loop {
            match protocol::recv::<Request>(&conn) {
                Ok((Request::Detach, _)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        tracing::info!(peer_pid, mode = mode.as_str(), "engine detached");
    }
    drop(held);
    shared.attached.fetch_sub(1, Ordering::SeqCst);
}
