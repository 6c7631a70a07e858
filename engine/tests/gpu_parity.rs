//! The GPU decoder against transformers: greedy continuations of fixed prompts, teacher-forced
//! with the reference's tokens. Our greedy token must equal the reference's up to the first
//! step where the reference's top-2 margin is under 0.1, and the reference's top-5 logprobs
//! must match within 0.05 in float32 mode; in bfloat16 mode within a tolerance set from
//! transformers' own bfloat16 against float32 on the same checkpoint (`bf16_vs_float32`).
//!
//! On the emulator this runs the committed tiny checkpoint (`tests/data/tiny-llama`); on a GPU
//! (`scripts/gpu-check.sh`) the full-size folders it makes, named by `GPU_PARITY_DIR` (each
//! with `reference.json`, from `scripts/gpu_reference.py`).
//!
//! The same checkpoints also check batch invariance (`invariance/mod.rs`): on the emulator in
//! `batch_invariance_on_the_emulator`, on a GPU in `batch_invariance_on_the_gpu`, which
//! `scripts/gpu-check.sh` runs in its invariance section.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod invariance;

use std::path::{Path, PathBuf};

use engine::device::DTypeRequest;
use engine::model::{KvBudget, SeqChunk};
use kernels::gpu::Gpu;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
    /// transformers' own bfloat16 run against its float32 one, on the same checkpoint and
    /// tokens (`scripts/gpu_reference.py`).
    bf16_vs_float32: Option<Spread>,
}

#[derive(Deserialize)]
struct Spread {
    worst_top5: f64,
    largest_flip_margin: f64,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    token: u32,
    margin: f64,
    top5: Vec<(u32, f64)>,
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&v| v as f64 - max - lse).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i as u32)
        .unwrap()
}

struct Outcome {
    /// The largest top-5 logprob difference.
    worst: f64,
    /// Steps whose greedy token was compared.
    checked: usize,
    /// Where the greedy token differed.
    mismatches: Vec<String>,
}

/// Runs every case, comparing greedy tokens up to the first step whose reference margin is
/// under `margin_floor`.
fn parity(gpu: &Gpu, dir: &Path, dtype: DTypeRequest, margin_floor: f64) -> Outcome {
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let loaded = engine::load::load_hf_decoder(dir).unwrap();
    let mut model = loaded.model.to_gpu(gpu, dtype).unwrap();
    let block = 16;
    let (mut worst, mut checked) = (0f64, 0usize);
    let mut mismatches = Vec::new();
    for (ci, case) in reference.cases.iter().enumerate() {
        let total = case.prompt_ids.len() + case.steps.len();
        let blocks = total.div_ceil(block);
        model
            .allocate_kv(block, &KvBudget::tokens(blocks * block))
            .unwrap();
        let table: Vec<u32> = (0..blocks as u32).rev().collect();
        let mut logits = model
            .forward(&[SeqChunk {
                lora: None,
                tokens: &case.prompt_ids,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
                media: None,
            }])
            .unwrap()
            .remove(0)
            .unwrap();
        let mut greedy_ok = true;
        for (si, step) in case.steps.iter().enumerate() {
            let lp = log_softmax(&logits);
            for &(id, want) in &step.top5 {
                worst = worst.max((lp[id as usize] - want).abs());
            }
            greedy_ok &= step.margin >= margin_floor;
            if greedy_ok {
                let got = argmax(&logits);
                if got != step.token {
                    mismatches.push(format!(
                        "case {ci} step {si}: token {got}, reference {} (margin {:.3})",
                        step.token, step.margin
                    ));
                }
                checked += 1;
            }
            let tok = [step.token];
            logits = model
                .forward(&[SeqChunk {
                    lora: None,
                    tokens: &tok,
                    start_pos: case.prompt_ids.len() + si,
                    block_table: &table,
                    want_logits: true,
                    media: None,
                }])
                .unwrap()
                .remove(0)
                .unwrap();
        }
    }
    eprintln!(
        "{} ({dtype}): largest top-5 logprob difference {worst:.4}, {checked} greedy steps checked, {} differ",
        dir.display(),
        mismatches.len()
    );
    Outcome {
        worst,
        checked,
        mismatches,
    }
}

/// The bar: greedy equal where the margin is at least 0.1, top-5 within 0.05.
fn assert_float32_parity(gpu: &Gpu, dir: &Path) {
    let o = parity(gpu, dir, DTypeRequest::Float32, 0.1);
    assert!(o.mismatches.is_empty(), "{}", o.mismatches.join("\n"));
    assert!(o.worst < 0.05, "top-5 logprobs differ by {}", o.worst);
    assert!(o.checked > 0, "no step had a clear greedy margin");
}

/// The bfloat16 bar, set from transformers' own bfloat16 against float32 on the same
/// checkpoint and tokens: top-5 logprobs within three times its largest difference (at least
/// 0.02), greedy tokens equal wherever the reference's margin is over twice the largest margin
/// at which transformers' own bfloat16 changed the greedy token (at least 0.1).
fn assert_bfloat16_parity(gpu: &Gpu, dir: &Path) {
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let spread = reference.bf16_vs_float32.unwrap_or_else(|| {
        panic!(
            "{}/reference.json has no bf16_vs_float32: run scripts/gpu_reference.py spread",
            dir.display()
        )
    });
    let tolerance = (3.0 * spread.worst_top5).max(0.02);
    let floor = (2.0 * spread.largest_flip_margin).max(0.1);
    let o = parity(gpu, dir, DTypeRequest::BFloat16, floor);
    eprintln!(
        "bfloat16: transformers' own spread {:.4}, tolerance {tolerance:.4}, margin floor {floor:.3}",
        spread.worst_top5
    );
    assert!(o.mismatches.is_empty(), "{}", o.mismatches.join("\n"));
    assert!(
        o.worst < tolerance,
        "top-5 logprobs differ by {} (tolerance {tolerance} from transformers' own bf16 spread {})",
        o.worst,
        spread.worst_top5
    );
    assert!(o.checked > 0, "no step had a clear greedy margin");
}

/// `tests/data/tiny-llama`, under `GATEWAY_TEST_DATA` where the binary runs away from the tree
/// it was built in (`scripts/gpu-check.sh` sets it).
fn tiny() -> PathBuf {
    std::env::var_os("GATEWAY_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data"))
        .join("tiny-llama")
}

#[test]
fn tiny_llama_float32_on_the_emulator() {
    assert_float32_parity(&Gpu::emulator(), &tiny());
}

#[test]
fn tiny_llama_bfloat16_on_the_emulator() {
    assert_bfloat16_parity(&Gpu::emulator(), &tiny());
}

/// Every folder named in `GPU_PARITY_DIR` (colon-separated), float32 then bfloat16.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device and GPU_PARITY_DIR: scripts/gpu-check.sh runs it"]
fn transformers_parity_on_the_gpu() {
    let dirs = std::env::var("GPU_PARITY_DIR").expect("GPU_PARITY_DIR");
    let gpu = Gpu::cuda(0).expect("a CUDA device");
    for dir in dirs.split(':').filter(|d| !d.is_empty()) {
        assert_float32_parity(&gpu, Path::new(dir));
        assert_bfloat16_parity(&gpu, Path::new(dir));
    }
}

/// Batch invariance of `dir`'s checkpoint in bfloat16: its logits bit-identical alone, among
/// other sequences, prefilled in chunks and after a prefix-cache hit.
fn assert_batch_invariant(gpu: &Gpu, dir: &Path) {
    let loaded = engine::load::load_hf_decoder(dir).unwrap();
    let mut model = loaded.model.to_gpu(gpu, DTypeRequest::BFloat16).unwrap();
    let label = format!("{} on {}", dir.display(), gpu.info().label());
    let done = invariance::check(model.as_mut(), &label);
    eprintln!(
        "{label}: {} logits rows bit-identical over {} steps",
        done.rows, done.steps
    );
}

/// Not `tiny_llama_*`: the dry run's parity section runs those, its invariance section this.
#[test]
fn batch_invariance_on_the_emulator() {
    assert_batch_invariant(&Gpu::emulator(), &tiny());
}

/// Every folder named in `GPU_PARITY_DIR` (colon-separated), on the device's cuBLAS kernels.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device and GPU_PARITY_DIR: scripts/gpu-check.sh runs it"]
fn batch_invariance_on_the_gpu() {
    let dirs = std::env::var("GPU_PARITY_DIR").expect("GPU_PARITY_DIR");
    let gpu = Gpu::cuda(0).expect("a CUDA device");
    for dir in dirs.split(':').filter(|d| !d.is_empty()) {
        assert_batch_invariant(&gpu, Path::new(dir));
    }
}
