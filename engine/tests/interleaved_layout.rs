//! The interleaved copy of the quantised matrices (made at load where the kernels read it
//! faster) changes nothing in the answers: SmolLM2 requantised by llama.cpp's
//! `llama-quantize` (its Q4_K_M, Q5_K_M, Q6_K and IQ4_XS mixes) gives the same logits, bit for
//! bit, loaded with every matrix as the file stores it and with the layout forced on (on a CPU
//! without AVX-512 VNNI the K-quants are brought back to rows per use), over a chunked prefill
//! and decode steps; switching to f32 activations returns to the file's bytes, and back to q8
//! interleaves again.
//!
//! One test in this file: it sets `KERNELS_INTERLEAVE` for the process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use engine::load::{load_gguf_decoder, LoadedDecoder};
use engine::model::{ActivationMode, KvBudget, SeqChunk};

const BLOCK: usize = 16;

fn file(ty: &str) -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/llamacpp-quants")
        .join(format!("SmolLM2-135M-Instruct.{ty}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run scripts/make-llamacpp-quants.sh",
        p.display()
    );
    p
}

fn load(ty: &str, interleave: &str) -> LoadedDecoder {
    std::env::set_var(kernels::INTERLEAVE_VAR, interleave);
    let m = load_gguf_decoder(&file(ty)).unwrap();
    std::env::remove_var(kernels::INTERLEAVE_VAR);
    m
}

/// The logits' bits of a 21-token prompt in two prefill chunks (every position's logits),
/// then four decode steps.
fn logits(m: &mut LoadedDecoder) -> Vec<u32> {
    let prompt: Vec<u32> = (0..21).map(|i| 17 + 997 * i % 40_000).collect();
    let steps = [123u32, 4567, 89, 10_111];
    let total = prompt.len() + steps.len();
    let per = total.div_ceil(BLOCK);
    let blocks = m
        .model
        .allocate_kv(BLOCK, &KvBudget::tokens(per * BLOCK))
        .unwrap();
    assert_eq!(blocks, per);
    let table: Vec<u32> = (0..per as u32).collect();
    let mut bits = Vec::new();
    let mut pos = 0;
    let chunks: Vec<&[u32]> = vec![&prompt[..13], &prompt[13..]]
        .into_iter()
        .chain(steps.chunks(1))
        .collect();
    for tokens in chunks {
        let out = m
            .model
            .forward(&[SeqChunk {
                lora: None,
                tokens,
                start_pos: pos,
                block_table: &table,
                want_logits: true,
                media: None,
            }])
            .unwrap();
        let l = out.into_iter().next().unwrap().unwrap();
        assert!(l.iter().all(|v| v.is_finite()));
        bits.extend(l.iter().map(|v| v.to_bits()));
        pos += tokens.len();
    }
    bits
}

#[test]
fn interleaved_matrices_give_the_same_logits() {
    for ty in ["Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS"] {
        let mut rows = load(ty, "never");
        assert_eq!(rows.model.weight_summary().interleaved(), 0, "{ty}");
        let want_q8 = logits(&mut rows);

        let mut inter = load(ty, "always");
        let copied = inter.model.weight_summary().interleaved();
        let held = inter.model.weight_summary();
        let quantised = held.total()
            - ["F32", "F16", "BF16"]
                .iter()
                .map(|t| held.bytes_of(t))
                .sum::<u64>();
        assert!(
            copied > 0 && copied <= quantised,
            "{ty}: {copied} bytes interleaved of {held}"
        );
        assert!(logits(&mut inter) == want_q8, "{ty}: q8 logits differ");

        // f32 activations read the file's bytes: the copy goes, the answers are unchanged.
        rows.model.set_activation_mode(ActivationMode::F32);
        let want_f32 = logits(&mut rows);
        inter.model.set_activation_mode(ActivationMode::F32);
        assert_eq!(inter.model.weight_summary().interleaved(), 0, "{ty}");
        assert!(logits(&mut inter) == want_f32, "{ty}: f32 logits differ");
        assert!(
            want_f32 != want_q8,
            "{ty}: the two modes should differ somewhere"
        );

        std::env::set_var(kernels::INTERLEAVE_VAR, "always");
        inter.model.set_activation_mode(ActivationMode::Q8);
        std::env::remove_var(kernels::INTERLEAVE_VAR);
        assert_eq!(inter.model.weight_summary().interleaved(), copied, "{ty}");
        assert!(
            logits(&mut inter) == want_q8,
            "{ty}: q8 logits differ after f32"
        );
    }
}
