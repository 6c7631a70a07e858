//! The weight cache: a `gateway preload` daemon keeps a checkpoint's processed weights in
//! sealed shared memory (memfds) and hands them to engines of the same user over a Unix
//! socket (`SCM_RIGHTS`); `serve --load-format ipc_cache` maps them read-only (`zero_copy`)
//! or copies them (`copy`) instead of loading from disk.
//!
//! One owner per hand-off: [`config`] (the engine's flags), [`identity`] (what the memory
//! is), [`hold`] (what is held, and how it is built), [`protocol`] (the wire and the socket's
//! place), [`daemon`] (the holder) and [`client`] (the engine side). [`load_decoder`] is what the engine's loader calls.

pub mod client;
pub mod config;
pub mod daemon;
pub mod device;
pub mod hold;
pub mod identity;
pub mod protocol;
pub mod stored_types;

use std::path::Path;

pub use config::{CacheMode, LoadFormat, LoaderConfig};
pub use device::CachedDevice;
pub use identity::{CacheIdentity, Role};

use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::load::LoadedDecoder;

/// Which path loaded a model's weights (the start-up log line and the metrics label).
#[derive(Debug, Clone, PartialEq)]
pub enum WeightsSource {
    Disk {
        reason: String,
    },
    IpcCache {
        pid: u32,
        bytes: u64,
        /// Bytes of device weights handed over to be mapped (0: none).
        device_bytes: u64,
        identity: String,
    },
}

impl WeightsSource {
    pub fn label(&self) -> &'static str {
        match self {
            WeightsSource::Disk { .. } => "disk",
            WeightsSource::IpcCache { .. } => "ipc_cache",
        }
    }

    /// The start-up log line.
    pub fn log(&self, model: &str) {
        match self {
            WeightsSource::Disk { reason } => {
                tracing::info!(model, "weights from disk ({reason})");
            }
            WeightsSource::IpcCache {
                pid,
                bytes,
                device_bytes,
                identity,
            } => {
                let device = match device_bytes {
                    0 => String::new(),
                    n => format!("; {n} bytes of device weights to map"),
                };
                tracing::info!(
                    model,
                    "weights from ipc_cache (daemon pid {pid}, {bytes} bytes, identity {identity}{device})"
                )
            }
        }
    }
}

/// What the engine's `ipc_cache` load needs besides the model path.
#[derive(Debug, Clone)]
pub struct CacheRequest<'a> {
    pub served_name: &'a str,
    pub config: &'a LoaderConfig,
    pub dtype: DTypeRequest,
    /// Where the engine will run the model (`cpu`, `cuda:0`): part of the identity.
    pub device: &'a str,
}

/// A decoder loaded through the cache: its host model over the daemon's memory, where its
/// weights came from, and the device weights to map when the daemon holds them on a GPU.
pub type CachedDecoder = (LoadedDecoder, WeightsSource, Option<CachedDevice>);

/// Loads a decoder (GGUF, or an HF safetensors folder) through the cache. `Ok(Err(reason))`
/// means "load from disk" (only with `fallback`); a checkpoint the cache cannot hold is an
/// error either way.
pub fn load_decoder(
    path: &Path,
    req: &CacheRequest<'_>,
) -> Result<std::result::Result<CachedDecoder, String>> {
    let what = hold::Cacheable::of(path)?;
    let want = what.identity(req.dtype, req.device, Role::Target)?;
    let dir = req
        .config
        .socket_dir
        .clone()
        .unwrap_or_else(protocol::default_socket_dir);
    let socket = protocol::socket_path(&dir, req.served_name);
    let att = match client::attach(&socket, &want, req.config) {
        Ok(a) => a,
        Err(e) if req.config.fallback && !matches!(e, client::AttachError::Protocol(_)) => {
            return Ok(Err(format!("ipc_cache unavailable: {e}")));
        }
        Err(e) => return Err(EngineError::load(path.display().to_string(), e.to_string())),
    };
    let source = WeightsSource::IpcCache {
        pid: att.pid,
        bytes: att.bytes(),
        device_bytes: att.device.as_ref().map_or(0, CachedDevice::bytes),
        identity: att.identity.to_string(),
    };
    let parts = att
        .parts
        .into_iter()
        .map(|p| p.name)
        .zip(att.maps)
        .collect();
    Ok(Ok((what.decoder(parts)?, source, att.device)))
}
