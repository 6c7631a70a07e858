//! The CUDA C++ sources of the kernels (`kernels/cuda/*.cu`, one file per job) and the header
//! they share, embedded in the binary so that NVRTC can compile them wherever it runs.

use sha2::{Digest, Sha256};

/// One kernel source file.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub file: &'static str,
    pub code: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/sources.rs"));

/// The name under which sources include the shared header.
pub const COMMON_NAME: &str = "common.cuh";

impl Source {
    /// The entry points the file defines (`KERNEL void name(`), in order.
    pub fn kernels(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        let mut rest = self.code;
        while let Some(i) = rest.find("KERNEL void ") {
            let tail = &rest[i + "KERNEL void ".len()..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if end > 0 {
                names.push(&tail[..end]);
            }
            rest = &tail[end..];
        }
        names
    }

    /// A digest of everything that decides the compiled code: this file, the shared header and
    /// the compile options.
    pub fn digest(&self, options: &[String]) -> String {
        let mut h = Sha256::new();
        h.update(self.code.as_bytes());
        h.update([0]);
        h.update(COMMON.as_bytes());
        for o in options {
            h.update([0]);
            h.update(o.as_bytes());
        }
        hex::encode(&h.finalize()[..12])
    }
}

/// Every entry point of every source, with its file.
pub fn all_kernels() -> Vec<(&'static str, &'static str)> {
    SOURCES
        .iter()
        .flat_map(|s| s.kernels().into_iter().map(move |k| (s.file, k)))
        .collect()
}
