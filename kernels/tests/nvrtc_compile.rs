//! Every kernel source compiles with NVRTC for the H200's architecture (`sm_90`), to machine
//! code that defines each of its entry points. No GPU is needed.
//!
//! `make test` provides NVRTC (the PyPI wheel `nvidia-cuda-nvrtc==13.0.88`, the CUDA of the
//! GPU machine) and sets `KERNELS_REQUIRE_NVRTC=1`, so there a missing library fails the test.
//! Elsewhere (a plain `cargo test` without the library) the test says it was skipped and why.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kernels::gpu::{nvrtc, sources};

#[test]
fn every_source_compiles_for_sm_90() {
    if !nvrtc::available() {
        let required = std::env::var("KERNELS_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "NVRTC (libnvrtc.so.13) could not be loaded, and KERNELS_REQUIRE_NVRTC=1"
        );
        eprintln!("skipped: NVRTC (libnvrtc.so.13) is not on the library path");
        return;
    }
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
