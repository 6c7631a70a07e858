//! What a cached copy of weights is: the identity the daemon and the engine compare before any
//! memory changes hands. Two identities that differ in any field are never a warm cache.

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::stored_types::{self, TypeTally};
use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::hf::{HfConfig, SafetensorsWeights};

/// This program's version: weights processed by another build are never reused.
pub const PROGRAM_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Which model of a deployment the weights are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Target,
    Draft,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Target => "target",
            Role::Draft => "draft",
        }
    }
}

/// Everything that decides whether held weights are the ones an engine would load itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheIdentity {
    /// sha256 of the checkpoint's headers (metadata and tensor tables) and sizes: of the GGUF
    /// file, or of each safetensors file of an HF folder with its name.
    pub checkpoint_digest: String,
    pub architecture: String,
    /// The `--dtype` the weights were processed for.
    pub dtype: String,
    /// The stored tensor types, with counts (e.g. `F32:61,Q4_1:211`).
    pub quantization: String,
    /// Device and placement (`cpu`; one daemon per GPU once CUDA is cached).
    pub device: String,
    pub role: Role,
    pub program_version: String,
    /// Each weight file as `stat` sees it when the identity is taken: headers say what a file
    /// claims to be, these say whether it is still the file whose bytes were read.
    #[serde(default)]
    pub files: Vec<FileStamp>,
}

/// One weight file's identity on disk: which file it is (device and inode), its size, and when
/// its bytes or inode last changed (mtime and ctime in ns). Any write, truncation or
/// replacement changes one of them; an operator can set mtime back, but not ctime. Where the
/// file is a Hugging Face cache blob, its name is a digest of the content, kept as `content`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// The part's name (the file name in its checkpoint).
    pub name: String,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// `sha256:<hex>` (an LFS blob) or `git-sha1:<hex>` when the path links into an HF cache's
    /// `blobs/`.
    #[serde(default)]
    pub content: Option<String>,
}

impl FileStamp {
    /// `path`'s stamp now (links followed), as part `name`.
    pub fn of(name: &str, path: &Path) -> Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).map_err(|e| {
            EngineError::load(path.display().to_string(), format!("cannot stat: {e}"))
        })?;
        // i64 nanoseconds reach the year 2262; the wire format (JSON) has no 128-bit integers.
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        Ok(FileStamp {
            name: name.to_string(),
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
            content: hub_blob_digest(path),
        })
    }

    /// What differs from `was` (the same part as loaded, or elsewhere), in words; `None` when
    /// nothing does.
    pub fn change(&self, was: &FileStamp) -> Option<String> {
        let mut what = Vec::new();
        if (self.dev, self.ino) != (was.dev, was.ino) {
            what.push(format!(
                "another file: dev:ino {}:{} (was {}:{})",
                self.dev, self.ino, was.dev, was.ino
            ));
        }
        if self.size != was.size {
            what.push(format!("size {} (was {})", self.size, was.size));
        }
        if self.mtime_ns != was.mtime_ns {
            what.push(format!(
                "modified: mtime {} ns (was {})",
                self.mtime_ns, was.mtime_ns
            ));
        }
        if self.ctime_ns != was.ctime_ns {
            what.push(format!(
                "changed: ctime {} ns (was {})",
                self.ctime_ns, was.ctime_ns
            ));
        }
        if self.content != was.content {
            let show = |c: &Option<String>| c.clone().unwrap_or_else(|| "unknown".into());
            what.push(format!(
                "content {} (was {})",
                show(&self.content),
                show(&was.content)
            ));
        }
        (!what.is_empty()).then(|| what.join(", "))
    }
}

/// The content digest a Hugging Face cache gives a file for free: snapshot files link to
/// `blobs/<digest>`, the sha256 of an LFS file's bytes (or a small file's git blob sha1).
fn hub_blob_digest(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    let resolved = path.parent()?.join(&target);
    if resolved.parent()?.file_name()? != "blobs" {
        return None;
    }
    let name = resolved.file_name()?.to_str()?;
    if !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match name.len() {
        64 => Some(format!("sha256:{name}")),
        40 => Some(format!("git-sha1:{name}")),
        _ => None,
    }
}

/// The stamps' differences, part by part: a part on one side only, or one that changed.
pub fn stamp_diffs(daemon: &[FileStamp], engine: &[FileStamp]) -> Vec<FieldDiff> {
    let mut out = Vec::new();
    for d in daemon {
        match engine.iter().find(|e| e.name == d.name) {
            None => out.push(FieldDiff {
                field: format!("file {}", d.name),
                daemon: "held".into(),
                engine: "not in the checkpoint".into(),
            }),
            Some(e) => {
                if let Some(change) = e.change(d) {
                    out.push(FieldDiff {
                        field: format!("file {}", d.name),
                        daemon: "as loaded".into(),
                        engine: change,
                    });
                }
            }
        }
    }
    for e in engine
        .iter()
        .filter(|e| !daemon.iter().any(|d| d.name == e.name))
    {
        out.push(FieldDiff {
            field: format!("file {}", e.name),
            daemon: "not held".into(),
            engine: "in the checkpoint".into(),
        });
    }
    out
}

/// One field that differs between the daemon's identity and the engine's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldDiff {
    pub field: String,
    pub daemon: String,
    pub engine: String,
}

impl fmt::Display for FieldDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (daemon: {}, engine: {})",
            self.field, self.daemon, self.engine
        )
    }
}

/// The differing fields as one phrase for a log line or an error.
pub fn describe_diffs(diffs: &[FieldDiff]) -> String {
    diffs
        .iter()
        .map(FieldDiff::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl CacheIdentity {
    /// The identity of a parsed GGUF checkpoint, processed for `dtype` on `device`.
    pub fn of_gguf(g: &GgufFile, dtype: DTypeRequest, device: &str, role: Role) -> Result<Self> {
        let architecture = g
            .get_str("general.architecture")?
            .unwrap_or("unknown")
            .to_string();
        let map = g.mmap();
        // The header is everything before the first tensor's data: metadata (tokenizer and
        // hyper-parameters included) and the tensor table with names, types, shapes, offsets.
        let header_end = g
            .tensors()
            .iter()
            .map(|t| t.start)
            .min()
            .unwrap_or(map.len())
            .min(map.len());
        let mut h = Sha256::new();
        h.update(b"gguf\0");
        h.update((map.len() as u64).to_le_bytes());
        h.update(&map[..header_end]);
        let types = stored_types::of_gguf(g);
        Ok(Self::new(h, architecture, dtype, &types, device, role))
    }

    /// The identity of an HF safetensors folder, processed for `dtype` on `device`. Reads only
    /// `config.json` and each weight file's header, never the tensor data, so it costs the
    /// same with the files out of the page cache.
    pub fn of_safetensors(
        dir: &Path,
        dtype: DTypeRequest,
        device: &str,
        role: Role,
    ) -> Result<Self> {
        let architecture = match HfConfig::from_dir(dir)?.architecture() {
            "" => "unknown".to_string(),
            a => a.to_string(),
        };
        let mut h = Sha256::new();
        h.update(b"safetensors\0");
        let mut types = TypeTally::new();
        for name in SafetensorsWeights::file_names(dir)? {
            let path = dir.join(&name);
            let (size, header) = safetensors_header(&path)?;
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(size.to_le_bytes());
            h.update((header.len() as u64).to_le_bytes());
            h.update(&header);
            stored_types::add_safetensors_header(
                &mut types,
                &stored_types::parse_header(&path, &header)?,
            );
        }
        Ok(Self::new(h, architecture, dtype, &types, device, role))
    }

    fn new(
        digest: Sha256,
        architecture: String,
        dtype: DTypeRequest,
        types: &TypeTally,
        device: &str,
        role: Role,
    ) -> Self {
        CacheIdentity {
            checkpoint_digest: format!("sha256:{}", hex(&digest.finalize())),
            architecture,
            dtype: dtype.to_string(),
            quantization: types
                .iter()
                .map(|(t, (n, _))| format!("{t}:{n}"))
                .collect::<Vec<_>>()
                .join(","),
            device: device.to_string(),
            role,
            program_version: PROGRAM_VERSION.to_string(),
            files: Vec::new(),
        }
    }

    /// Every field where `self` (the daemon's) and `engine` differ.
    pub fn diff(&self, engine: &CacheIdentity) -> Vec<FieldDiff> {
        let pairs = [
            (
                "checkpoint_digest",
                &self.checkpoint_digest,
                &engine.checkpoint_digest,
            ),
            ("architecture", &self.architecture, &engine.architecture),
            ("dtype", &self.dtype, &engine.dtype),
            ("quantization", &self.quantization, &engine.quantization),
            ("device", &self.device, &engine.device),
            (
                "program_version",
                &self.program_version,
                &engine.program_version,
            ),
        ];
        let mut out: Vec<FieldDiff> = pairs
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .map(|(field, a, b)| FieldDiff {
                field: field.to_string(),
                daemon: a.clone(),
                engine: b.clone(),
            })
            .collect();
        if self.role != engine.role {
            out.push(FieldDiff {
                field: "role".into(),
                daemon: self.role.as_str().into(),
                engine: engine.role.as_str().into(),
            });
        }
        out.extend(stamp_diffs(&self.files, &engine.files));
        out
    }
}

impl fmt::Display for CacheIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = self
            .checkpoint_digest
            .get(..self.checkpoint_digest.len().min(19))
            .unwrap_or(&self.checkpoint_digest);
        write!(
            f,
            "{digest} {} dtype={} {} device={} role={} v{}",
            self.architecture,
            self.dtype,
            self.quantization,
            self.device,
            self.role.as_str(),
            self.program_version
        )
    }
}

/// The safetensors format's own bound on a header (its reader refuses larger ones).
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// A safetensors file's size and JSON header (the bytes after the 8-byte length).
pub(super) fn safetensors_header(path: &Path) -> Result<(u64, Vec<u8>)> {
    let name = path.display().to_string();
    let fail = |what: String| EngineError::load(&name, what);
    let mut file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    let size = file
        .metadata()
        .map_err(|e| fail(format!("cannot stat: {e}")))?
        .len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|e| fail(format!("corrupt safetensors file: {e}")))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_SAFETENSORS_HEADER || len.saturating_add(8) > size {
        return Err(fail(format!(
            "corrupt safetensors file: a {len}-byte header in a {size}-byte file"
        )));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header)
        .map_err(|e| fail(format!("corrupt safetensors file: {e}")))?;
    Ok((size, header))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> CacheIdentity {
        CacheIdentity {
            checkpoint_digest: "sha256:aa".into(),
            architecture: "llama".into(),
            dtype: "auto".into(),
            quantization: "Q4_1:1".into(),
            device: "cpu".into(),
            role: Role::Target,
            program_version: "1.0.0".into(),
            files: Vec::new(),
        }
    }

    /// A folder with `config.json` and a `model.safetensors` of `header` and `data`.
    fn folder(tag: &str, header: &str, data: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("wc-identity-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["LlamaForCausalLM"]}"#,
        )
        .unwrap();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        dir
    }

    #[test]
    fn the_safetensors_digest_covers_headers_and_sizes_not_data() {
        let one = r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let of = |dir: &Path| {
            CacheIdentity::of_safetensors(dir, DTypeRequest::Auto, "cpu", Role::Target).unwrap()
        };
        let base = of(&folder("base", one, &[1, 2, 3, 4]));
        assert_eq!(base.architecture, "LlamaForCausalLM");
        assert_eq!(base.quantization, "BF16:1");
        assert!(base.checkpoint_digest.starts_with("sha256:"));
        // Other values under the same header: the same digest, which never reads the data; the
        // file stamps that `hold::Cacheable::identity` adds are what tell the files apart.
        assert_eq!(of(&folder("data", one, &[9, 9, 9, 9])), base);
        let two = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let d = base.diff(&of(&folder("dtype", two, &[0, 0, 0, 0])));
        let fields: Vec<&str> = d.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["checkpoint_digest", "quantization"]);
        let dir = folder("short", one, &[]);
        std::fs::write(dir.join("model.safetensors"), 1000u64.to_le_bytes()).unwrap();
        let err = CacheIdentity::of_safetensors(&dir, DTypeRequest::Auto, "cpu", Role::Target)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.safetensors") && err.contains("1000-byte header"),
            "{err}"
        );
        for tag in ["base", "data", "dtype", "short"] {
            let _ = std::fs::remove_dir_all(
                std::env::temp_dir().join(format!("wc-identity-{tag}-{}", std::process::id())),
            );
        }
    }

    #[test]
    fn diff_names_every_differing_field() {
        assert!(id().diff(&id()).is_empty());
        let mut other = id();
        other.dtype = "bfloat16".into();
        other.program_version = "9.9.9".into();
        other.role = Role::Draft;
        let d = id().diff(&other);
        let fields: Vec<&str> = d.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["dtype", "program_version", "role"]);
        let text = describe_diffs(&d);
        assert!(
            text.contains("dtype (daemon: auto, engine: bfloat16)"),
            "{text}"
        );
    }

    #[test]
    fn a_hub_cache_file_carries_its_blob_digest_and_stamps_name_what_changed() {
        let dir = std::env::temp_dir().join(format!("wc-stamp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let blobs = dir.join("blobs");
        let snap = dir.join("snapshots/abc");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        let digest = "ab".repeat(32);
        std::fs::write(blobs.join(&digest), b"weights").unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{digest}"),
            snap.join("model.safetensors"),
        )
        .unwrap();
        let linked = FileStamp::of("model.safetensors", &snap.join("model.safetensors")).unwrap();
        assert_eq!(linked.content, Some(format!("sha256:{digest}")));
        assert_eq!(linked.size, 7);
        let plain = FileStamp::of("model.safetensors", &blobs.join(&digest)).unwrap();
        assert_eq!(plain.content, None);
        assert_eq!((plain.dev, plain.ino), (linked.dev, linked.ino));

        let mut later = plain.clone();
        later.size = 9;
        later.ctime_ns += 1;
        let said = later.change(&plain).unwrap();
        assert!(
            said.contains("size 9 (was 7)") && said.contains("ctime"),
            "{said}"
        );
        assert!(plain.change(&plain).is_none());
        let diffs = stamp_diffs(
            std::slice::from_ref(&plain),
            &[
                later,
                FileStamp {
                    name: "extra".into(),
                    ..plain.clone()
                },
            ],
        );
        let fields: Vec<&str> = diffs.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, ["file model.safetensors", "file extra"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
