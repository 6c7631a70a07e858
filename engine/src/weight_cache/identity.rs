//! What a cached copy of weights is: the identity the daemon and the engine compare before any
//! memory changes hands. Two identities that differ in any field are never a warm cache.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::device::DTypeRequest;
use crate::error::Result;
use crate::gguf::GgufFile;

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
    /// sha256 of the checkpoint's header (metadata and tensor table) and its size.
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
        Ok(CacheIdentity {
            checkpoint_digest: format!("sha256:{}", hex(&h.finalize())),
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
        })
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
