//! The kernel cache that `scripts/gpu-check.sh` carries to the GPU machine, so that the device
//! compiles nothing: the cubins are made here by NVRTC (no GPU needed) under the names the CUDA
//! backend looks up (`nvrtc::cache_key`), and checked there before anything else runs.
//!
//! ```text
//! kernel_cache fill DIR [--arch sm_90]
//!     compile every source for ARCH into DIR (an entry already there is kept)
//! kernel_cache check DIR [--arch sm_90 | --device N]
//!     every source has its entry for ARCH and this NVRTC in DIR, machine code defining each of
//!     the source's entry points; with --device, ARCH is device N's, and the device is then
//!     opened with GATEWAY_KERNEL_CACHE=DIR: it must take every source from DIR (its "CUDA
//!     kernels ready" event says from_cache == sources) and write no new entry
//! ```
//!
//! NVRTC is loaded by name, so its folder must be on LD_LIBRARY_PATH (`make nvrtc` puts the
//! wheel's in models-cache/nvrtc). Prints one JSON line; exits 1 when a check fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use kernels::gpu::sources::SOURCES;
use kernels::gpu::{nvrtc, probe, Availability, Gpu};
use serde_json::{json, Value};

struct Args {
    mode: String,
    dir: PathBuf,
    arch: String,
    device: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let usage = "usage: kernel_cache fill|check DIR [--arch sm_90] [--device N]";
    let mode = it.next().ok_or(usage)?;
    if mode != "fill" && mode != "check" {
        return Err(usage.into());
    }
    let dir = PathBuf::from(it.next().ok_or(usage)?);
    let mut args = Args {
        mode,
        dir,
        arch: "sm_90".into(),
        device: None,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--arch" => args.arch = value,
            "--device" => {
                args.device = Some(value.parse().map_err(|_| format!("--device {value}"))?)
            }
            _ => return Err(format!("unknown flag {flag}\n{usage}")),
        }
    }
    if args.mode == "fill" && args.device.is_some() {
        return Err("fill takes --arch, not --device: it needs no GPU".into());
    }
    Ok(args)
}

fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn fill(dir: &Path, arch: &str) -> Result<Value, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let mut bytes = 0;
    for src in SOURCES {
        let (image, _) =
            nvrtc::compile_cached_in(src, arch, Some(dir)).map_err(|e| e.to_string())?;
        let key = nvrtc::cache_key(src, arch).map_err(|e| e.to_string())?;
        if !dir.join(&key).is_file() {
            return Err(format!(
                "{key} was compiled but not stored in {}",
                dir.display()
            ));
        }
        let lost = src.kernels_missing_from(&image);
        if !lost.is_empty() {
            return Err(format!("{}: no symbols {lost:?} in the cubin", src.file));
        }
        bytes += image.len();
        files.push(key);
    }
    Ok(json!({
        "filled": dir.display().to_string(),
        "arch": arch,
        "sources": SOURCES.len(),
        "bytes": bytes,
        "entries": files,
    }))
}

/// What the backend's "CUDA kernels ready" event said.
#[derive(Default, Debug, Clone, Copy)]
struct Ready {
    sources: u64,
    from_cache: u64,
}

/// Records the "CUDA kernels ready" event and prints every event to stderr, so the log shows
/// the backend's own words (a cache it could not write, say).
struct Capture(Mutex<Option<Ready>>);

#[derive(Default)]
struct Fields {
    message: String,
    text: String,
    ready: Ready,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "sources" => self.ready.sources = value,
            "from_cache" => self.ready.from_cache = value,
            _ => {}
        }
        self.record_debug(field, &value);
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.record_u64(field, u64::try_from(value).unwrap_or(0));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.text += &format!(" {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        eprintln!(
            "{} {}: {}{}",
            meta.level(),
            meta.target(),
            f.message,
            f.text
        );
        if f.message == "CUDA kernels ready" {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(f.ready);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn check(dir: &Path, arch: &str, device: Option<usize>) -> Result<Value, String> {
    let mut problems = Vec::new();
    let mut checked = 0;
    for src in SOURCES {
        let key = nvrtc::cache_key(src, arch).map_err(|e| e.to_string())?;
        match std::fs::read(dir.join(&key)) {
            Ok(image) if nvrtc::is_elf(&image) => {
                let lost = src.kernels_missing_from(&image);
                if lost.is_empty() {
                    checked += 1;
                } else {
                    problems.push(format!("{key}: no symbols {lost:?}"));
                }
            }
            Ok(_) => problems.push(format!("{key}: not machine code")),
            Err(e) => problems.push(format!("{key}: {e}")),
        }
    }
    if !problems.is_empty() {
        let present: Vec<String> = entries(dir).into_iter().collect();
        return Err(format!(
            "the cache in {} lacks what this machine ({arch}, NVRTC {:?}) looks up: {}; it holds \
             {present:?}",
            dir.display(),
            nvrtc::version().ok(),
            problems.join("; ")
        ));
    }
    let mut out = json!({
        "dir": dir.display().to_string(),
        "arch": arch,
        "sources": SOURCES.len(),
        "entries_checked": checked,
    });
    if let Some(ordinal) = device {
        let before = entries(dir);
        let capture = std::sync::Arc::new(Capture(Mutex::new(None)));
        let gpu = tracing::subscriber::with_default(capture.clone(), || Gpu::cuda(ordinal))
            .map_err(|e| format!("CUDA device {ordinal} did not open: {e}"))?;
        let label = gpu.info().label();
        drop(gpu);
        let ready = capture
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ok_or("the backend opened without its \"CUDA kernels ready\" event")?;
        let written: Vec<String> = entries(dir).difference(&before).cloned().collect();
        if ready.from_cache != ready.sources || !written.is_empty() {
            return Err(format!(
                "the device compiled kernels: {} of {} sources from the cache, new entries \
                 {written:?}",
                ready.from_cache, ready.sources
            ));
        }
        out["device"] = json!(label);
        out["from_cache"] = json!(ready.from_cache);
        out["compiled"] = json!(0);
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let arch = match args.device {
        None => Ok(args.arch.clone()),
        Some(n) => match probe(n) {
            Availability::Ready(info) => Ok(info.arch()),
            Availability::Missing(why) => Err(format!("CUDA device {n}: {why}")),
        },
    };
    let result = arch.and_then(|arch| match args.mode.as_str() {
        "fill" => fill(&args.dir, &arch),
        _ => {
            // The backend finds the cache through this variable, as the server does.
            std::env::set_var("GATEWAY_KERNEL_CACHE", &args.dir);
            check(&args.dir, &arch, args.device)
        }
    });
    match result {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kernel_cache {}: {e}", args.mode);
            ExitCode::FAILURE
        }
    }
}
