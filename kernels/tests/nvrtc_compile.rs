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
                let missing = src.kernels_missing_from(&image);
                assert!(
                    missing.is_empty(),
                    "{}: no symbols {missing:?} in the cubin",
                    src.file
                );
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

/// What ptxas reported for one entry point.
#[derive(Debug, Default)]
struct PtxasReport {
    registers: Option<u32>,
    stack: Option<u32>,
    spill_stores: Option<u32>,
    spill_loads: Option<u32>,
}

/// The number before `unit` in `line` (`"... 40 registers"` -> 40).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = &line[..line.find(unit)?];
    head.split_whitespace().last()?.parse().ok()
}

/// Per entry point, what `--ptxas-options=-v` wrote to NVRTC's log: "Compiling entry function
/// 'k'" opens a kernel, "Function properties for k" is followed by its stack frame and
/// spills, "Used N registers" closes it.
fn ptxas_reports(log: &str) -> std::collections::HashMap<String, PtxasReport> {
    let mut out: std::collections::HashMap<String, PtxasReport> = Default::default();
    let mut entry: Option<String> = None;
    let mut props_of: Option<String> = None;
    let quoted = |l: &str| l.split('\'').nth(1).map(str::to_string);
    for line in log.lines() {
        if line.contains("Compiling entry function") {
            entry = quoted(line);
        } else if let Some(i) = line.find("Function properties for ") {
            props_of = Some(
                line[i + "Function properties for ".len()..]
                    .trim()
                    .to_string(),
            );
        } else if line.contains("bytes stack frame") {
            if let Some(name) = props_of.take() {
                let r = out.entry(name).or_default();
                r.stack = number_before(line, "bytes stack frame");
                r.spill_stores = number_before(line, "bytes spill stores");
                r.spill_loads = number_before(line, "bytes spill loads");
            }
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(name) = entry.take() {
                out.entry(name).or_default().registers = number_before(line, " registers");
            }
        }
    }
    out
}

/// Each kernel's registers fit the block it declares (a launch of that block needs registers
/// per thread × threads of the SM's 65536), with no spills to local memory: the
/// `__launch_bounds__` the sources declare are what ptxas compiled for.
#[test]
fn registers_fit_each_kernels_launch_bound_without_spills() {
    need_nvrtc();
    let mut problems = Vec::new();
    for src in sources::SOURCES {
        let (_, log) = nvrtc::compile_with_log(src, "sm_90", &["--ptxas-options=-v"]).unwrap();
        let reports = ptxas_reports(&log);
        for (kernel, bound) in src.bounded_kernels() {
            let Some(bound) = bound else {
                problems.push(format!("{kernel}: its launch bound is not a plain number"));
                continue;
            };
            if bound == 0 || bound % 32 != 0 || bound > 1024 {
                problems.push(format!(
                    "{kernel}: launch bound {bound} is not 32..=1024 in 32s"
                ));
            }
            let Some(r) = reports.get(kernel) else {
                problems.push(format!("{kernel}: no ptxas report in the log:\n{log}"));
                continue;
            };
            let (Some(regs), Some(stack), Some(stores), Some(loads)) =
                (r.registers, r.stack, r.spill_stores, r.spill_loads)
            else {
                problems.push(format!("{kernel}: incomplete ptxas report {r:?}:\n{log}"));
                continue;
            };
            eprintln!(
                "{kernel}: {regs} registers x {bound} threads = {}, stack {stack} B, spills {stores}/{loads} B",
                regs * bound
            );
            if regs * bound > 65536 {
                problems.push(format!(
                    "{kernel}: {regs} registers x {bound} threads exceed the SM's 65536"
                ));
            }
            if stores > 0 || loads > 0 {
                problems.push(format!(
                    "{kernel}: spills {stores} bytes stored, {loads} loaded"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
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
