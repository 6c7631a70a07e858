//! Shared pieces of the multimodal parity tests.

use serde::Deserialize;

/// The reference's greedy continuation: its tokens and each step's top-1/top-2 margin.
#[derive(Deserialize)]
pub struct Greedy {
    pub new_tokens: Vec<u32>,
    pub margins: Vec<f32>,
}

pub fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .unwrap_or(0)
}

/// The largest absolute difference between two vectors.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// Teacher-forced greedy check after a prompt of `prompt_len` tokens whose last logits are
/// `first`: each step's argmax must be the reference's token where its margin is clear, and
/// the reference token is fed at the next position (with `media` for the position offset).
#[allow(clippy::too_many_arguments)]
pub fn check_greedy(
    model: &mut dyn engine::model::CausalLm,
    table: &[u32],
    prompt_len: usize,
    first: &[f32],
    greedy: &Greedy,
    media: Option<engine::model::ChunkMedia<'_>>,
    name: &str,
) {
    let mut next = argmax(first);
    for (step, (&want, &margin)) in greedy.new_tokens.iter().zip(&greedy.margins).enumerate() {
        if margin > 1e-3 {
            assert_eq!(next, want, "{name}: greedy step {step}");
        }
        let tok = [want];
        let out = model
            .forward(&[engine::model::SeqChunk {
                lora: None,
                tokens: &tok,
                start_pos: prompt_len + step,
                block_table: table,
                want_logits: true,
                media,
            }])
            .expect("decode step");
        next = argmax(&out.into_iter().next().flatten().expect("logits"));
    }
}
