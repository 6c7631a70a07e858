//! What the daemon holds: a checkpoint's weights, processed as the engine processes them at
//! load, in sealed memfds (one per file), with the identity engines compare before mapping;
//! on a GPU also the converted device weights ([`super::device`]).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use memmap2::Mmap;
use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};

use kernels::gpu::Gpu;

use super::device::HeldDevice;
use super::identity::{describe_diffs, stamp_diffs, CacheIdentity, FileStamp, Role};
use super::protocol::{PartInfo, MAX_PARTS};
use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::hf::SafetensorsWeights;
use crate::load::CheckpointKind;

/// Weights held for engines: the identity, one sealed memfd per part, and where they came from
/// (to check the files again and reload them).
pub struct Held {
    pub identity: CacheIdentity,
    pub(super) parts: Vec<(PartInfo, OwnedFd)>,
    /// The device weights, when held for a GPU.
    pub(super) device: Option<HeldDevice>,
    origin: Origin,
}

/// The checkpoint and processing behind held weights.
#[derive(Debug, Clone)]
struct Origin {
    path: PathBuf,
    dtype: DTypeRequest,
    /// `None`: held for the CPU.
    gpu: Option<Gpu>,
}

impl Held {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|(p, _)| p.len).sum()
    }

    /// How the checkpoint's files differ now from the ones these weights were copied from (a
    /// rewrite, a replacement, a `touch`, a file gone), in words; `None` when they are the same
    /// files, unchanged. Costs a `stat` per file.
    pub fn changed_on_disk(&self) -> Option<String> {
        let now = Cacheable::of(&self.origin.path).and_then(|c| c.stamps());
        match now {
            Err(e) => Some(e.to_string()),
            Ok(now) => {
                let diffs = stamp_diffs(&self.identity.files, &now);
                (!diffs.is_empty()).then(|| describe_diffs(&diffs))
            }
        }
    }

    /// Bytes of the device weights (0 when held for the CPU).
    pub fn device_bytes(&self) -> u64 {
        self.device.as_ref().map_or(0, HeldDevice::bytes)
    }

    /// The same checkpoint held again from its files as they are now.
    pub fn reload(&self) -> Result<Held> {
        hold(
            &self.origin.path,
            self.origin.dtype,
            self.origin.gpu.as_ref(),
        )
    }

    /// The same memory under another identity (tests of the mismatch path).
    pub fn with_identity(self, identity: CacheIdentity) -> Held {
        Held { identity, ..self }
    }
}

/// A checkpoint the cache can hold, and where its weight bytes are.
#[derive(Debug, Clone, PartialEq)]
pub enum Cacheable {
    /// A GGUF decoder: the one file.
    Gguf(PathBuf),
    /// An HF safetensors decoder: its folder (the parts are
    /// [`SafetensorsWeights::file_names`]).
    Safetensors(PathBuf),
}

impl Cacheable {
    /// What `path` is to the cache, or the reason it cannot be held (an error even with
    /// `fallback`: the checkpoint will never be served from the cache).
    pub fn of(path: &Path) -> Result<Cacheable> {
        let name = path.display().to_string();
        match crate::load::detect(path) {
            CheckpointKind::Gguf if path.is_dir() => {
                crate::gguf::single_gguf(path).map(Cacheable::Gguf)
            }
            CheckpointKind::Gguf => Ok(Cacheable::Gguf(path.to_path_buf())),
            CheckpointKind::Decoder => Ok(Cacheable::Safetensors(path.to_path_buf())),
            CheckpointKind::Encoder => Err(EngineError::load(
                name,
                "the weight cache cannot hold HF encoder checkpoints (the engine converts all their tensors to f32 buffers of its own at load, so held file bytes would save nothing); serve it with --load-format auto",
            )),
            CheckpointKind::DecoderEmbedder => Err(EngineError::load(
                name,
                "the weight cache holds decoders served for generation; this architecture only embeds (serve it with --load-format auto)",
            )),
            CheckpointKind::Unknown => Err(EngineError::load(
                name,
                "not a recognised model: expected a .gguf file or an HF folder with config.json",
            )),
        }
    }

    /// The identity an engine loading this checkpoint for `dtype` on `device` asks for, with
    /// each file's stamp as it is now.
    pub fn identity(&self, dtype: DTypeRequest, device: &str, role: Role) -> Result<CacheIdentity> {
        let files = self.stamps()?;
        let mut id = match self {
            Cacheable::Gguf(file) => {
                CacheIdentity::of_gguf(&GgufFile::open(file)?, dtype, device, role)
            }
            Cacheable::Safetensors(dir) => CacheIdentity::of_safetensors(dir, dtype, device, role),
        }?;
        id.files = files;
        Ok(id)
    }

    /// Each weight file's stamp now.
    pub fn stamps(&self) -> Result<Vec<FileStamp>> {
        self.files()?
            .iter()
            .map(|(name, path)| FileStamp::of(name, path))
            .collect()
    }

    /// The decoder built from the parts' maps, in the order [`hold_checkpoint`] holds them:
    /// the engine's own loader, reading the mapped bytes where it would read the files.
    pub fn decoder(&self, parts: Vec<(String, Arc<Mmap>)>) -> Result<crate::load::LoadedDecoder> {
        match self {
            Cacheable::Gguf(file) => {
                let map = parts.into_iter().next().map(|(_, m)| m).ok_or_else(|| {
                    EngineError::load(file.display().to_string(), "no weights were handed over")
                })?;
                crate::load::gguf_decoder(GgufFile::from_map(file.display().to_string(), map)?)
            }
            Cacheable::Safetensors(dir) => crate::load::hf_decoder_from_weights(
                dir,
                &SafetensorsWeights::from_maps(dir, parts)?,
            ),
        }
    }

    /// The files to hold, as (part name, path).
    fn files(&self) -> Result<Vec<(String, PathBuf)>> {
        match self {
            Cacheable::Gguf(file) => Ok(vec![(
                file.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                file.clone(),
            )]),
            Cacheable::Safetensors(dir) => Ok(SafetensorsWeights::file_names(dir)?
                .into_iter()
                .map(|n| (n.clone(), dir.join(n)))
                .collect()),
        }
    }
}

/// What the engine does to a checkpoint at load, done once here. For the decoders the cache
/// holds, that is nothing to the matrices: the CPU engine serves them in place, in their
/// stored types (GGUF's quantised blocks; safetensors' F32, F16 or BF16), from the mapped
/// bytes. What it does convert at every start is small and built from those same bytes: the
/// f32 norm and bias vectors (kilobytes per layer), the tokenizer from GGUF metadata, and the
/// f32 copies of a Qwen2-VL or Qwen2-Audio media tower. Holding those processed would need a
/// second format the engine reads only on this path, for a share of the load that the
/// benchmark shows is not where a restart spends its time; so the held result is the files'
/// bytes, one sealed memfd per file, which the engine maps where it would have mapped the
/// files. Before holding, the decoder is built once from the memfds, so a checkpoint the
/// engine would refuse is refused here.
pub fn hold_checkpoint(path: &Path, dtype: DTypeRequest, device: &str) -> Result<Held> {
    if device != "cpu" {
        return Err(EngineError::BackendUnavailable(format!(
            "{device}: weights are held for a GPU once it is opened (hold_on_gpu)"
        )));
    }
    if dtype != DTypeRequest::Auto {
        return Err(EngineError::BackendUnavailable(format!(
            "--dtype {dtype} applies to GPU models; the CPU engine serves the checkpoint's stored types (use --dtype auto)"
        )));
    }
    hold(path, dtype, None)
}

/// [`hold_checkpoint`] for engines on `gpu`: the files' bytes as on the CPU (the engine's host
/// model maps them, for its self-test and a CPU fallback), and the device weights converted as
/// `dtype` (`--dtype`), uploaded once and packed in one region engines map.
pub fn hold_on_gpu(path: &Path, dtype: DTypeRequest, gpu: &Gpu) -> Result<Held> {
    hold(path, dtype, Some(gpu))
}

fn hold(path: &Path, dtype: DTypeRequest, gpu: Option<&Gpu>) -> Result<Held> {
    let device = gpu.map_or_else(|| "cpu".to_string(), |g| g.info().label());
    let device = device.as_str();
    let name = path.display().to_string();
    let started = Instant::now();
    let what = Cacheable::of(path)?;
    // The files are stamped before the identity is read and again after their bytes are
    // copied: equal stamps mean the held bytes are the stamped files' (a write between the two
    // would have moved ctime). A checkpoint still being written is tried again, then refused.
    let mut attempt = 0;
    let (identity, parts, maps) = loop {
        attempt += 1;
        let identity = what.identity(dtype, device, Role::Target)?;
        let mut parts = Vec::new();
        let mut maps = Vec::new();
        for (part, file) in what.files()? {
            let (fd, map) = sealed_copy(&file)?;
            parts.push((
                PartInfo {
                    name: part.clone(),
                    len: map.len() as u64,
                },
                fd,
            ));
            maps.push((part, Arc::new(map)));
        }
        let after = what.stamps()?;
        let diffs = stamp_diffs(&identity.files, &after);
        if diffs.is_empty() {
            break (identity, parts, maps);
        }
        if attempt == COPY_ATTEMPTS {
            return Err(EngineError::load(
                &name,
                format!(
                    "the checkpoint kept changing while it was copied ({COPY_ATTEMPTS} tries; last: {})",
                    describe_diffs(&diffs)
                ),
            ));
        }
        tracing::warn!(model = %name, "the checkpoint changed while it was copied ({}); copying again", describe_diffs(&diffs));
    };
    let decoder = what.decoder(maps)?;
    let device_weights = match gpu {
        None => None,
        Some(_) if parts.len() >= MAX_PARTS => {
            return Err(EngineError::load(
                &name,
                format!(
                    "{} weight files and the device weights pass the {MAX_PARTS} handles one answer carries",
                    parts.len()
                ),
            ))
        }
        Some(g) => Some(HeldDevice::convert(&decoder, g, dtype)?),
    };
    drop(decoder);
    let held = Held {
        identity,
        parts,
        device: device_weights,
        origin: Origin {
            path: path.to_path_buf(),
            dtype,
            gpu: gpu.cloned(),
        },
    };
    tracing::info!(
        model = %name,
        parts = held.parts.len(),
        bytes = held.bytes(),
        device_bytes = held.device_bytes(),
        identity = %held.identity,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "weights held in shared memory"
    );
    Ok(held)
}

/// How often a checkpoint that changes under the copy is copied before it is refused.
const COPY_ATTEMPTS: usize = 3;

/// `path`'s bytes in a new sealed memfd, and a read-only map of it.
fn sealed_copy(path: &Path) -> Result<(OwnedFd, Mmap)> {
    let name = path.display().to_string();
    let fd = memfd_create(
        "gateway-weights",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| EngineError::load(&name, format!("memfd_create: {e}")))?;
    let mut dst = File::from(fd);
    let mut src =
        File::open(path).map_err(|e| EngineError::load(&name, format!("cannot open: {e}")))?;
    io::copy(&mut src, &mut dst)
        .map_err(|e| EngineError::load(&name, format!("cannot copy into shared memory: {e}")))?;
    // Sealed: no one, the daemon included, can change or resize the bytes an engine maps.
    fcntl_add_seals(
        &dst,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )
    .map_err(|e| EngineError::load(&name, format!("cannot seal the shared memory: {e}")))?;
    // SAFETY: the memfd is sealed against writes and resizing, so the map cannot change.
    let map = unsafe { Mmap::map(&dst) }
        .map_err(|e| EngineError::load(&name, format!("cannot map the shared memory: {e}")))?;
    Ok((OwnedFd::from(dst), map))
}
