//! The daemon's wire protocol over a Unix stream socket: length-prefixed JSON frames, with the
//! weights' memfds passed as `SCM_RIGHTS` on the daemon's `Ready` frame. Also the socket's
//! place (a per-user folder, mode 0700; the socket itself 0600) and the peer check.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::CacheMode;
use super::identity::{CacheIdentity, FieldDiff};

/// Frames larger than this are refused (the largest real one is a `Ready` with a few parts).
const MAX_FRAME: usize = 1 << 20;
/// The most fds one `Ready` carries (a checkpoint's files and the device weights).
pub const MAX_PARTS: usize = 16;

/// Engine to daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// "Give me these weights": the daemon answers with one [`Reply`].
    Attach {
        identity: CacheIdentity,
        mode: CacheMode,
    },
    /// The engine no longer uses the memory (copy mode, after copying).
    Detach,
}

/// One held memory region, in the order of the passed fds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartInfo {
    /// What it holds (the checkpoint file's name).
    pub name: String,
    pub len: u64,
}

/// Device weights a GPU daemon holds (`preload --device cuda`): one shared region, passed as
/// the last fd of the `Ready` frame, and where each buffer lies in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceWeights {
    /// The region's size (rounded up to the device's granularity).
    pub bytes: u64,
    pub slots: Vec<DeviceSlot>,
}

/// One buffer of [`DeviceWeights`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSlot {
    pub name: String,
    pub offset: u64,
    pub bytes: u64,
}

/// Daemon to engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The daemon is up but its weights are not ready yet.
    Loading,
    /// The checkpoint's files changed since the daemon loaded them: it is loading them again.
    Reloading { reason: String },
    /// The daemon holds other weights: every differing field.
    Mismatch { fields: Vec<FieldDiff> },
    /// The weights, one memfd per part attached to this frame, then the device weights'
    /// handle where the daemon holds them on a GPU.
    Ready {
        pid: u32,
        identity: CacheIdentity,
        parts: Vec<PartInfo>,
        #[serde(default)]
        device: Option<Box<DeviceWeights>>,
    },
    /// The daemon failed to load or is shutting down.
    Unavailable { reason: String },
}

/// Sends one frame, with `fds` attached to it.
pub fn send<T: Serialize>(stream: &UnixStream, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME || fds.len() > MAX_PARTS {
        return Err(io::Error::other("frame too large"));
    }
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PARTS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many fds for one frame"));
    }
    let sent = sendmsg(
        stream,
        &[IoSlice::new(&frame)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // The fds went with the first byte; the rest of a partly sent frame is plain data.
    (&*stream).write_all(&frame[sent..])
}

/// Receives one frame and the fds attached to it. An orderly close before any byte is
/// `UnexpectedEof`.
pub fn recv<T: DeserializeOwned>(stream: &UnixStream) -> io::Result<(T, Vec<OwnedFd>)> {
    let mut first = vec![0u8; 64 * 1024];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_PARTS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut first)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    let n = got.bytes;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed"));
    }
    let mut buf = first[..n].to_vec();
    while buf.len() < 4 {
        read_more(stream, &mut buf, 4)?;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!("frame of {len} bytes refused")));
    }
    read_more(stream, &mut buf, 4 + len)?;
    let msg = serde_json::from_slice(&buf[4..4 + len])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((msg, fds))
}

fn read_more(stream: &UnixStream, buf: &mut Vec<u8>, want: usize) -> io::Result<()> {
    if buf.len() < want {
        let had = buf.len();
        buf.resize(want, 0);
        (&*stream).read_exact(&mut buf[had..])?;
    }
    Ok(())
}

/// The default socket folder: `$XDG_RUNTIME_DIR/gateway-weight-cache` when set (already
/// private to the user), else `gateway-weight-cache-<uid>` in the temp folder.
pub fn default_socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(run) => PathBuf::from(run).join("gateway-weight-cache"),
        None => std::env::temp_dir().join(format!(
            "gateway-weight-cache-{}",
            rustix::process::getuid().as_raw()
        )),
    }
}

/// The socket of the daemon serving `served_name` in `dir`: a hash of the name, so any name
/// fits the socket path limit.
pub fn socket_path(dir: &Path, served_name: &str) -> PathBuf {
    let h = Sha256::digest(served_name.as_bytes());
    let tag: String = h[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{tag}.sock"))
}

/// Creates the socket folder (mode 0700) or checks an existing one: it must be ours and
/// closed to others, since anyone who can write it could put a socket of their own there.
pub fn prepare_socket_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::metadata(dir)?;
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid {
        return Err(io::Error::other(format!(
            "socket folder {} belongs to uid {}, not to this user (uid {uid})",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Whether a peer may use the cache: only the daemon's own user.
pub fn check_peer(peer_uid: u32, own_uid: u32) -> Result<(), String> {
    if peer_uid == own_uid {
        Ok(())
    } else {
        Err(format!(
            "uid {peer_uid} is not this daemon's user (uid {own_uid})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn other_users_are_refused() {
        assert!(check_peer(1000, 1000).is_ok());
        let e = check_peer(1001, 1000).unwrap_err();
        assert!(e.contains("uid 1001"), "{e}");
    }

    #[test]
    fn frames_carry_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send(&a, &Reply::Loading, &[f.as_fd()]).unwrap();
        let (msg, fds): (Reply, _) = recv(&b).unwrap();
        assert!(matches!(msg, Reply::Loading));
        assert_eq!(fds.len(), 1);
        send(&a, &Request::Detach, &[]).unwrap();
        let (msg, fds): (Request, _) = recv(&b).unwrap();
        assert!(matches!(msg, Request::Detach));
        assert!(fds.is_empty());
        drop(a);
        assert_eq!(
            recv::<Reply>(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn socket_names_fit_and_differ() {
        let a = socket_path(Path::new("/d"), &"m".repeat(500));
        assert!(a.as_os_str().len() < 40);
        assert_ne!(a, socket_path(Path::new("/d"), "n"));
    }
}
