//! The weight cache on a GPU, on the kernels' emulator: a daemon holding a checkpoint for a
//! device converts and uploads its weights once and exports them (a memfd here, a CUDA VMM
//! handle on a GPU); an engine on that device maps them at its bring-up instead of uploading,
//! and must then answer bit for bit as a cold start does. Identity and fallback as on the CPU:
//! another device or dtype, or changed files, never attach (a touched checkpoint is held again,
//! on the device too); the GPU bring-up's fail-safe and self-test still run over mapped
//! weights; the mapping goes with the engine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use engine::api::{GenerateRequest, SamplingParams};
use engine::device::{DTypeRequest, DeviceRequest};
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::weight_cache::daemon::Daemon;
use engine::weight_cache::hold::hold_on_gpu;
use engine::weight_cache::{CacheMode, LoadFormat, LoaderConfig};
use kernels::gpu::inject::FaultyOpener;
use kernels::gpu::{EmuOpener, Gpu, Opener, Step};

/// The engine's own log capture (what a closure logs on this thread).
#[path = "../src/test_log.rs"]
mod test_log;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tiny_llama() -> PathBuf {
    root().join("tests/data/tiny-llama")
}

/// A copy of the tiny Llama's folder at `to` (other files, the same bytes).
fn copy_of_tiny_llama(to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(tiny_llama()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
    to.to_path_buf()
}

fn tiny_gguf() -> PathBuf {
    root().join("tests/data/tiny-gguf/llama3.gguf")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wc-gpu-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(device: DeviceRequest, cache: Option<(&Path, bool)>) -> EngineConfig {
    EngineConfig {
        device,
        max_model_len: Some(256),
        kv_cache_tokens: Some(256),
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        load_format: if cache.is_some() {
            LoadFormat::IpcCache
        } else {
            LoadFormat::Auto
        },
        loader: cache.map_or_else(LoaderConfig::default, |(dir, fallback)| LoaderConfig {
            mode: CacheMode::ZeroCopy,
            fallback,
            socket_dir: Some(dir.to_path_buf()),
            connect_timeout: Duration::from_secs(60),
            state_timeout: Duration::from_millis(300),
        }),
        ..Default::default()
    }
}

/// Starts `path` as `name` under `cfg` with GPUs opened by `opener`, and what the start
/// logged on this thread.
fn start_with(
    cfg: &EngineConfig,
    path: &Path,
    name: &str,
    opener: &dyn Opener,
) -> (engine::error::Result<EngineHandle>, String) {
    let spec = ModelSpec {
        path: path.display().to_string(),
        served_name: name.into(),
    };
    test_log::capture(|| EngineHandle::start_with(&[spec], cfg, opener))
}

/// The error of a start that must fail.
fn start_err(cfg: &EngineConfig, path: &Path, name: &str, opener: &dyn Opener) -> String {
    match start_with(cfg, path, name, opener) {
        (Err(e), _) => e.to_string(),
        (Ok(_), log) => panic!("the start should have failed: {log}"),
    }
}

fn start(cfg: &EngineConfig, path: &Path, name: &str) -> (EngineHandle, String) {
    let (engine, log) = start_with(cfg, path, name, &EmuOpener);
    (engine.unwrap_or_else(|e| panic!("{e}\n{log}")), log)
}

/// Greedy tokens and each step's top-5 logprobs, as f32 bits (bit-for-bit comparisons).
fn greedy(engine: &EngineHandle, name: &str) -> Vec<(u32, Vec<(u32, u32)>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = engine.model(name).unwrap();
        let mut stream = m
            .generate(GenerateRequest {
                request_id: "g".into(),
                prompt_ids: (0..9).map(|j| (j * 37 + 11) % 200).collect(),
                params: SamplingParams {
                    temperature: 0.0,
                    max_tokens: 6,
                    ignore_eos: true,
                    logprobs: Some(5),
                    ..Default::default()
                },
                cache_salt: None,
                media: None,
            })
            .unwrap();
        let mut out = Vec::new();
        while let Some(d) = stream.next().await {
            let d = d.unwrap();
            for (id, lp) in d.token_ids.iter().zip(d.logprobs) {
                let top = lp
                    .top
                    .into_iter()
                    .map(|t| (t.id, t.logprob.to_bits()))
                    .collect();
                out.push((*id, top));
            }
        }
        assert_eq!(out.len(), 6);
        out
    })
}

/// Read-only shared mappings of the emulator's exported memory in this process: the engines'
/// imports (the daemon's own export is mapped read-write).
fn imported_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("gateway-device-weights") && l.contains(" r--s "))
        .count()
}

const MAPPED: &str = "device weights mapped from the weight cache";
/// The upload's own log line: a warm start never has it.
const UPLOADED: &str = "weights on the GPU";

/// The tests of this file one at a time: they count this process's mappings.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits (a minute at most) until `cond` holds: an engine's thread ends after its handle goes.
fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn warm_matches_cold(path: &Path, name: &str) {
    let _serial = serial();
    let dir = tmpdir(name);
    let (cold, log) = start(&config(DeviceRequest::Cuda(0), None), path, name);
    assert_eq!(cold.models()[0].device, "emu:0");
    assert!(log.contains(UPLOADED), "{log}");
    let expected = greedy(&cold, name);
    drop(cold);

    let daemon = Daemon::bind(&dir, name).unwrap();
    let held = hold_on_gpu(path, DTypeRequest::Auto, &Gpu::emulator()).unwrap();
    assert!(held.device_bytes() > 0);
    assert_eq!(held.identity.device, "emu:0");
    daemon.set_ready(held);

    let before = imported_maps();
    let (warm, log) = start(
        &config(DeviceRequest::Cuda(0), Some((&dir, false))),
        path,
        name,
    );
    assert!(log.contains("weights from ipc_cache"), "{log}");
    assert!(log.contains(MAPPED), "{log}");
    assert!(!log.contains(UPLOADED), "a warm start uploaded: {log}");
    assert_eq!(warm.models()[0].device, "emu:0");
    assert_eq!(daemon.attached(), 1);
    assert_eq!(
        imported_maps(),
        before + 1,
        "the engine maps the region once"
    );
    assert_eq!(greedy(&warm, name), expected, "warm and cold differ");
    drop(warm);
    assert!(
        eventually(|| imported_maps() == before),
        "the mapping goes with the engine: {} left",
        imported_maps() - before
    );
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_warm_hf_start_maps_the_device_weights_and_answers_as_a_cold_one() {
    warm_matches_cold(&tiny_llama(), "gpu-hf");
}

#[test]
fn a_warm_gguf_start_maps_the_device_weights_and_answers_as_a_cold_one() {
    warm_matches_cold(&tiny_gguf(), "gpu-gguf");
}

/// Another device or dtype never attaches: without fallback the start fails naming the field,
/// with it the engine loads from disk saying why. A file of the same name elsewhere is not the
/// held file either.
#[test]
fn another_device_dtype_or_file_does_not_attach() {
    let _serial = serial();
    let dir = tmpdir("mismatch");
    let name = "gpu-mismatch";
    let daemon = Daemon::bind(&dir, name).unwrap();
    daemon.set_ready(hold_on_gpu(&tiny_llama(), DTypeRequest::Auto, &Gpu::emulator()).unwrap());

    let mut cpu = config(DeviceRequest::Cpu, Some((&dir, false)));
    let e = start_err(&cpu, &tiny_llama(), name, &EmuOpener);
    assert!(e.contains("device (daemon: emu:0, engine: cpu)"), "{e}");
    cpu.loader.fallback = true;
    let (engine, log) = start(&cpu, &tiny_llama(), name);
    assert_eq!(engine.models()[0].device, "cpu");
    assert!(
        log.contains("weights from disk (ipc_cache unavailable"),
        "{log}"
    );
    assert!(log.contains("device (daemon: emu:0, engine: cpu)"), "{log}");
    drop(engine);

    let mut f32 = config(DeviceRequest::Cuda(0), Some((&dir, false)));
    f32.dtype = DTypeRequest::Float32;
    let e = start_err(&f32, &tiny_llama(), name, &EmuOpener);
    assert!(e.contains("dtype (daemon: auto, engine: float32)"), "{e}");

    let other = copy_of_tiny_llama(&dir.join("elsewhere"));
    let gpu = config(DeviceRequest::Cuda(0), Some((&dir, false)));
    let e = start_err(&gpu, &other, name, &EmuOpener);
    assert!(
        e.contains("file model.safetensors") && e.contains("another file"),
        "{e}"
    );
    let with_fallback = config(DeviceRequest::Cuda(0), Some((&dir, true)));
    let (engine, log) = start(&with_fallback, &other, name);
    assert!(log.contains("weights from disk"), "{log}");
    assert!(log.contains(UPLOADED) && !log.contains(MAPPED), "{log}");
    assert_eq!(engine.models()[0].device, "emu:0");
    assert_eq!(daemon.attached(), 0, "nothing attached");
    drop(engine);
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bring-up's fail-safe holds over mapped weights: a failed mapping (the weights step) or a
/// failed self-test serves on the CPU under `auto` with one line, and fails `cuda` naming the
/// step; with `fallback`, a mapping that fails uploads from the checkpoint instead.
#[test]
fn the_bring_up_fail_safe_and_self_test_hold_over_mapped_weights() {
    let _serial = serial();
    let dir = tmpdir("failsafe");
    let name = "gpu-failsafe";
    let daemon = Daemon::bind(&dir, name).unwrap();
    daemon.set_ready(hold_on_gpu(&tiny_llama(), DTypeRequest::Auto, &Gpu::emulator()).unwrap());
    for step in [Step::Weights, Step::SelfTest] {
        let opener = FaultyOpener::new(EmuOpener, step);
        let auto = config(DeviceRequest::Auto, Some((&dir, false)));
        let (engine, log) = start_with(&auto, &tiny_llama(), name, &opener);
        let engine = engine.unwrap_or_else(|e| panic!("{step}: {e}"));
        assert_eq!(engine.models()[0].device, "cpu", "{step}");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("on the CPU")).collect();
        assert_eq!(lines.len(), 1, "{step}: {log}");
        assert!(
            lines[0].contains(&format!("emu:0 {step} failed")),
            "{}",
            lines[0]
        );
        drop(engine);
        let cuda = config(DeviceRequest::Cuda(0), Some((&dir, false)));
        let e = start_err(&cuda, &tiny_llama(), name, &opener);
        assert!(e.contains(&format!("emu:0 {step} failed")), "{e}");
    }
    // With fallback a refused mapping is not the end: the weights are uploaded instead (here
    // that fails in the same faulty step, so the start names it); the log says why.
    let opener = FaultyOpener::new(EmuOpener, Step::Weights);
    let cuda = config(DeviceRequest::Cuda(0), Some((&dir, true)));
    let (e, log) = start_with(&cuda, &tiny_llama(), name, &opener);
    assert!(e.is_err_and(|e| e.to_string().contains("emu:0 weights failed")));
    assert!(
        log.contains("the weight cache's device weights cannot be used")
            && log.contains("cannot map the cached device weights"),
        "{log}"
    );
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon that goes while an engine maps its weights leaves the engine serving (the mapping
/// is the engine's); a socket left behind by a dead daemon is a disk load with fallback and a
/// clear error without.
#[test]
fn a_gone_daemon_or_a_stale_socket_is_clear() {
    let _serial = serial();
    let dir = tmpdir("gone");
    let name = "gpu-gone";
    let (cold, _) = start(&config(DeviceRequest::Cuda(0), None), &tiny_llama(), name);
    let expected = greedy(&cold, name);
    drop(cold);
    let daemon = Daemon::bind(&dir, name).unwrap();
    daemon.set_ready(hold_on_gpu(&tiny_llama(), DTypeRequest::Auto, &Gpu::emulator()).unwrap());
    let (warm, log) = start(
        &config(DeviceRequest::Cuda(0), Some((&dir, false))),
        &tiny_llama(),
        name,
    );
    assert!(log.contains(MAPPED), "{log}");
    assert_eq!(daemon.shutdown(Some(Duration::ZERO)), 1);
    let socket = daemon.socket().to_path_buf();
    drop(daemon);
    assert_eq!(
        greedy(&warm, name),
        expected,
        "served after the daemon went"
    );
    drop(warm);

    // A socket file with no daemon behind it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let e = start_err(
        &config(DeviceRequest::Cuda(0), Some((&dir, false))),
        &tiny_llama(),
        name,
        &EmuOpener,
    );
    assert!(e.contains("no weight-cache daemon was ready"), "{e}");
    let (engine, log) = start(
        &config(DeviceRequest::Cuda(0), Some((&dir, true))),
        &tiny_llama(),
        name,
    );
    assert!(
        log.contains("weights from disk (ipc_cache unavailable: no daemon at"),
        "{log}"
    );
    assert_eq!(greedy(&engine, name), expected);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint touched under a GPU daemon is held again, device weights included, before any
/// engine gets it: an engine without fallback waits for that and then maps the new copy.
#[test]
fn a_touched_checkpoint_is_held_again_on_the_device() {
    let _serial = serial();
    let dir = tmpdir("touched");
    let name = "gpu-touched";
    let model = copy_of_tiny_llama(&dir.join("tiny-llama"));
    let (cold, _) = start(&config(DeviceRequest::Cuda(0), None), &model, name);
    let expected = greedy(&cold, name);
    drop(cold);
    let daemon = Daemon::bind(&dir, name).unwrap();
    daemon.set_ready(hold_on_gpu(&model, DTypeRequest::Auto, &Gpu::emulator()).unwrap());
    let f = std::fs::File::options()
        .write(true)
        .open(model.join("model.safetensors"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(3))
        .unwrap();
    drop(f);
    let mut cfg = config(DeviceRequest::Cuda(0), Some((&dir, false)));
    cfg.loader.state_timeout = Duration::from_secs(120);
    let (engine, log) = start(&cfg, &model, name);
    assert!(log.contains(MAPPED), "{log}");
    assert_eq!(greedy(&engine, name), expected);
    drop(engine);
    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}
