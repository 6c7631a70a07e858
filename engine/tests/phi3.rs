//! Phi-3 from an HF folder: Llama's layers with q/k/v and gate/up stored fused, read as views
//! of the fused matrices. The committed tiny random checkpoint (`tests/data/tiny-phi3`, from
//! `scripts/make_tiny_phi3.py`) against transformers' float32 top-5 logprobs at every position
//! of a fixed prompt, on the CPU and on the GPU decoder (kernels on the emulator).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::device::DTypeRequest;
use engine::model::{ActivationMode, CausalLm, KvBudget, SeqChunk};

mod reference;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-phi3")
}

fn logprobs(m: &mut dyn CausalLm, prompt: &[u32]) -> Vec<Vec<f64>> {
    let block = 16;
    let blocks = prompt.len().div_ceil(block);
    m.allocate_kv(block, &KvBudget::tokens(blocks * block))
        .unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let chunk = |tokens, start_pos| SeqChunk {
        lora: None,
        tokens,
        start_pos,
        block_table: &table,
        want_logits: true,
        media: None,
    };
    // Position by position: every row's logits, through the decode path.
    (0..prompt.len())
        .map(|p| {
            let row = m
                .forward(&[chunk(&prompt[p..p + 1], p)])
                .unwrap()
                .remove(0)
                .unwrap();
            reference::log_softmax(&row)
        })
        .collect()
}

#[test]
fn phi3_matches_transformers_on_the_cpu_and_the_gpu_decoder() {
    let reference = reference::load(&tiny().join("reference.json"));
    let prompt = reference::prompt(&reference);
    let mut cpu = engine::load::load_hf_decoder(&tiny()).unwrap().model;
    cpu.set_activation_mode(ActivationMode::F32);
    let mut gpu = cpu
        .to_gpu(&kernels::gpu::Gpu::emulator(), DTypeRequest::Float32)
        .unwrap();
    let on_cpu =
        reference::largest_difference(&logprobs(cpu.as_mut(), &prompt), &reference["top5"]);
    let on_gpu =
        reference::largest_difference(&logprobs(gpu.as_mut(), &prompt), &reference["top5"]);
    eprintln!(
        "Phi-3: largest top-5 logprob difference {on_cpu:.2e} (CPU), {on_gpu:.2e} (GPU decoder)"
    );
    assert!(on_cpu < 1e-3, "CPU: {on_cpu}");
    assert!(on_gpu < 1e-3, "GPU decoder: {on_gpu}");
}
