//! Reading the transformers references of the tiny HF checkpoints (`reference.json`,
//! `rope_reference.json`): a prompt, and transformers' top-5 logprobs at each of its positions.
#![allow(dead_code, clippy::unwrap_used)]

use engine::model::{CausalLm, KvBudget, SeqChunk};
use serde_json::Value;

/// The reference file at `path`, parsed.
pub fn load(path: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Its `prompt_ids`.
pub fn prompt(reference: &Value) -> Vec<u32> {
    reference["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// `log_softmax` of a row of logits, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// The largest difference between `ours` (logprobs per position) and the top-5 entries of
/// `top5` (per position, `[id, logprob]` pairs).
pub fn largest_difference(ours: &[Vec<f64>], top5: &Value) -> f64 {
    let mut worst = 0f64;
    for (pos, top) in top5.as_array().unwrap().iter().enumerate() {
        for pair in top.as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            worst = worst.max((ours[pos][id] - pair[1].as_f64().unwrap()).abs());
        }
    }
    worst
}

/// Logits of every position of `prompt`, fed in chunks of `chunk` tokens (each chunk asking
/// for all its rows), on a fresh cache.
pub fn logits_by_chunks(m: &mut dyn CausalLm, prompt: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let block = 16;
    let blocks = prompt.len().div_ceil(block);
    m.allocate_kv(block, &KvBudget::tokens(blocks * block))
        .unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut rows = Vec::new();
    for (i, tokens) in prompt.chunks(chunk).enumerate() {
        let out = m
            .forward_rows(
                &[SeqChunk {
                    lora: None,
                    tokens,
                    start_pos: i * chunk,
                    block_table: &table,
                    want_logits: true,
                    media: None,
                }],
                &[true],
            )
            .unwrap()
            .remove(0)
            .unwrap();
        let vocab = out.len() / tokens.len();
        rows.extend(out.chunks(vocab).map(<[f32]>::to_vec));
    }
    rows
}
