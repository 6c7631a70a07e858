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

fn need_nvrtc() {
    if !nvrtc::available() {
        preload_fetched_nvrtc();
    }
    assert!(
        nvrtc::available(),
        "NVRTC (libnvrtc.so.13) could not be loaded: run `make nvrtc` (or scripts/fetch-nvrtc.sh) \
         first; `make test` does"
    );
}

#[test]
fn compiled_kernels_are_cached_by_source_arch_and_version() {
    need_nvrtc();
    let dir = std::env::temp_dir().join(format!("gateway-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = sources::SOURCES
        .iter()
        .min_by_key(|s| s.code.len())
        .unwrap();
    let (first, hit) = nvrtc::compile_cached_in(src, "sm_90", Some(&dir)).unwrap();
    assert!(!hit, "an empty cache has no entry");
    let (again, hit) = nvrtc::compile_cached_in(src, "sm_90", Some(&dir)).unwrap();
    assert!(hit, "the second compile comes from the cache");
    assert_eq!(first, again);
    let (_, hit) = nvrtc::compile_cached_in(src, "sm_80", Some(&dir)).unwrap();
    assert!(!hit, "another architecture is another entry");
    let (major, minor) = nvrtc::version().unwrap();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names
        .iter()
        .all(|n| n.contains(&format!("-nvrtc{major}.{minor}.cubin"))));
    // A damaged entry is compiled again, not loaded.
    let sm90 = names.iter().find(|n| n.contains("sm_90")).unwrap();
    std::fs::write(dir.join(sm90), b"not a cubin").unwrap();
    let (_, hit) = nvrtc::compile_cached_in(src, "sm_90", Some(&dir)).unwrap();
    assert!(!hit);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_source_compiles_for_sm_90() {
    need_nvrtc();
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
