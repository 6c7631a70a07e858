//! Lists the CUDA kernel sources for the crate (so adding a `.cu` file to `cuda/` is all it
//! takes), and with the `emu` feature compiles them for the CPU emulator. Nothing here looks
//! for a CUDA toolkit: NVRTC compiles the sources at run time.
//!
//! It also sets a `host_<level>` cfg for each CPU kernel level the build machine runs (when it
//! builds for itself), so that a per-level test of a level the CPU lacks shows as ignored, with
//! the reason, instead of passing. Tests run where they are built, so this is the CPU they run
//! on.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    host_cpu_levels();
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let cuda = manifest.join("cuda");
    println!("cargo:rerun-if-changed=cuda");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cuda)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "cu"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());

    let mut list = String::from("pub const SOURCES: &[Source] = &[\n");
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let _ = writeln!(
            list,
            "    Source {{ file: {name:?}, code: include_str!({:?}) }},",
            f.display().to_string()
        );
    }
    list.push_str("];\n");
    let _ = writeln!(
        list,
        "pub const COMMON: &str = include_str!({:?});",
        cuda.join("common.cuh").display().to_string()
    );
    write(&out.join("sources.rs"), &list);

    #[cfg(feature = "emu")]
    emulator(&cuda, &files, &out);
}

/// The `host_*` cfgs: one per CPU kernel level (see `src/cpu/features.rs`) this machine runs.
fn host_cpu_levels() {
    const LEVELS: [&str; 4] = ["avx2", "avxvnni", "avx512", "avx512vnni"];
    for level in LEVELS {
        println!("cargo::rustc-check-cfg=cfg(host_{level})");
    }
    let host = std::env::var("HOST").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    if host != target {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        let runs = [
            avx2,
            avx2 && has!("avxvnni"),
            avx512,
            avx512 && has!("avx512vnni"),
        ];
        for (level, runs) in LEVELS.into_iter().zip(runs) {
            if runs {
                println!("cargo::rustc-cfg=host_{level}");
            }
        }
    }
}

fn write(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        if let Err(e) = std::fs::write(path, text) {
            panic!("cannot write {}: {e}", path.display());
        }
    }
}

/// One translation unit with the runtime and every kernel, so that no kernel's registration
/// is dropped by the linker.
#[cfg(feature = "emu")]
fn emulator(cuda: &Path, files: &[PathBuf], out: &Path) {
    let mut unit = String::new();
    let _ = writeln!(
        unit,
        "#include {:?}",
        cuda.join("emu/runtime.cpp").display().to_string()
    );
    for f in files
        .iter()
        .chain(std::iter::once(&cuda.join("emu/selftest.cu")))
    {
        let _ = writeln!(unit, "#include {:?}", f.display().to_string());
    }
    let path = out.join("emu_all.cpp");
    write(&path, &unit);
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include(cuda)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-function")
        .file(&path)
        .compile("gateway_kernels_emu");
}
