//! Every kernel source compiles with NVRTC for the H200's architecture (`sm_90`), to machine
//! code that defines each of its entry points. No GPU is needed.
//!
//! NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc==13.0.88` (the CUDA of the GPU machine),
//! which `make nvrtc` (part of `make test`) unpacks into `models-cache/nvrtc`; the test loads
//! it from there when it is not on the library path. Without it the test fails, saying how to
//! get it: a kernel that does not compile must never pass unseen.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kernels::gpu::{nvrtc, sources};

#[test]
fn every_source_compiles_for_sm_90() {
    if !nvrtc::available() {
        preload_fetched_nvrtc();
    }
    assert!(
        nvrtc::available(),
        "NVRTC (libnvrtc.so.13) could not be loaded: run `make nvrtc` (or scripts/fetch-nvrtc.sh) \
         first; `make test` does"
    );
    let (major, minor) = nvrtc::version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    assert!(!sources::SOURCES.is_empty());
    let mut failures = Vec::new();
    for src in sources::SOURCES {
        match nvrtc::compile(src, "sm_90") {
            Ok(image) => {
                for k in src.kernels() {
                    // The entry point's name is in the ELF symbol table.
                    assert!(
                        image
                            .windows(k.len() + 1)
                            .any(|w| w[..k.len()] == *k.as_bytes() && w[k.len()] == 0),
                        "{}: no symbol `{k}` in the cubin",
                        src.file
                    );
                }
                eprintln!(
                    "{}: {} bytes, kernels {:?}",
                    src.file,
                    image.len(),
                    src.kernels()
                );
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Loads the NVRTC that `make nvrtc` unpacked, by path: once a library of that name is loaded,
/// cudarc's lookup by name finds it.
fn preload_fetched_nvrtc() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/nvrtc/nvidia/cu13/lib");
    for lib in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        // SAFETY: loading NVRTC runs no initialiser with preconditions; the handle is kept for
        // the life of the test process.
        if let Ok(l) = unsafe { libloading::Library::new(dir.join(lib)) } {
            std::mem::forget(l);
        }
    }
}
