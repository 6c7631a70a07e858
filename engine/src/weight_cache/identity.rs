//! What a cached copy of weights is: the identity the daemon and the engine compare before any
//! memory changes hands. Two identities that differ in any field are never a warm cache.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
        let mut types: BTreeMap<String, usize> = BTreeMap::new();
        for t in g.tensors() {
            *types.entry(t.ggml_type.name()).or_default() += 1;
        }
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
        let mut types: BTreeMap<String, usize> = BTreeMap::new();
        for name in SafetensorsWeights::file_names(dir)? {
            let path = dir.join(&name);
            let (size, header) = safetensors_header(&path)?;
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(size.to_le_bytes());
            h.update((header.len() as u64).to_le_bytes());
            h.update(&header);
            let table: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
                .map_err(|e| {
                    EngineError::load(
                        path.display().to_string(),
                        format!("corrupt safetensors header: {e}"),
                    )
                })?;
            for (tensor, entry) in table {
                if tensor == "__metadata__" {
                    continue;
                }
                let t = entry.get("dtype").and_then(|d| d.as_str()).unwrap_or("?");
                *types.entry(t.to_string()).or_default() += 1;
            }
        }
        Ok(Self::new(h, architecture, dtype, &types, device, role))
    }

    fn new(
        digest: Sha256,
        architecture: String,
        dtype: DTypeRequest,
        types: &BTreeMap<String, usize>,
        device: &str,
        role: Role,
    ) -> Self {
        CacheIdentity {
            checkpoint_digest: format!("sha256:{}", hex(&digest.finalize())),
            architecture,
            dtype: dtype.to_string(),
            quantization: types
                .iter()
                .map(|(t, n)| format!("{t}:{n}"))
                .collect::<Vec<_>>()
                .join(","),
            device: device.to_string(),
            role,
            program_version: PROGRAM_VERSION.to_string(),
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
fn safetensors_header(path: &Path) -> Result<(u64, Vec<u8>)> {
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
    fn a_safetensors_identity_covers_headers_and_sizes_not_data() {
        let one = r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let of = |dir: &Path| {
            CacheIdentity::of_safetensors(dir, DTypeRequest::Auto, "cpu", Role::Target).unwrap()
        };
        let base = of(&folder("base", one, &[1, 2, 3, 4]));
        assert_eq!(base.architecture, "LlamaForCausalLM");
        assert_eq!(base.quantization, "BF16:1");
        assert!(base.checkpoint_digest.starts_with("sha256:"));
        // Other values under the same header: the same checkpoint as far as the cache can tell
        // without reading the data (as for GGUF).
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
}
