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
    /// The entry points the file defines (`KERNEL_BOUNDED(name, max_threads)`), in order.
    pub fn kernels(&self) -> Vec<&'static str> {
        self.bounded_kernels().into_iter().map(|(k, _)| k).collect()
    }

    /// Each entry point with the largest block it declares (its `__launch_bounds__`); `None`
    /// where the bound is not a plain number, which the tests refuse.
    pub fn bounded_kernels(&self) -> Vec<(&'static str, Option<u32>)> {
        const MARK: &str = "KERNEL_BOUNDED(";
        let mut out = Vec::new();
        let mut rest = self.code;
        while let Some(i) = rest.find(MARK) {
            let tail = &rest[i + MARK.len()..];
            let end = tail.find(')').unwrap_or(tail.len());
            let inner = &tail[..end];
            rest = &tail[end..];
            // The macro's own definition in a comment or a `#define` has no real name.
            let Some((name, bound)) = inner.split_once(',') else {
                continue;
            };
            let name = name.trim();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            out.push((name, bound.trim().parse().ok()));
        }
        out
    }

    /// The entry points that the machine code `image` does not define (each is a NUL-terminated
    /// name in the ELF string table of a cubin that does).
    pub fn kernels_missing_from(&self, image: &[u8]) -> Vec<&'static str> {
        self.kernels()
            .into_iter()
            .filter(|k| {
                !image
                    .windows(k.len() + 1)
                    .any(|w| w[..k.len()] == *k.as_bytes() && w[k.len()] == 0)
            })
            .collect()
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

/// The largest block `kernel` may be launched with (its `__launch_bounds__`), or `None` for a
/// kernel that is in no source.
pub fn launch_bound(kernel: &str) -> Option<u32> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<&'static str, u32>> =
        std::sync::OnceLock::new();
    TABLE
        .get_or_init(|| {
            SOURCES
                .iter()
                .flat_map(|s| s.bounded_kernels())
                .filter_map(|(k, b)| Some((k, b?)))
                .collect()
        })
        .get(kernel)
        .copied()
}

/// Every entry point of every source, with its file.
pub fn all_kernels() -> Vec<(&'static str, &'static str)> {
    SOURCES
        .iter()
        .flat_map(|s| s.kernels().into_iter().map(move |k| (s.file, k)))
        .collect()
}
