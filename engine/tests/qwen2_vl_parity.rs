//! The Qwen2-VL tiny checkpoint (`tests/data/tiny-qwen2-vl`, made by
//! `scripts/make_tiny_mm_models.py` with random weights) against the `transformers` reference:
//! the vision tower on deterministic pixel values (`vision_reference.json`, made by
//! `scripts/tiny_vision_reference.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::hf::SafetensorsWeights;
use engine::models::qwen2_vl::vision::{VisionConfig, VisionTower};
use serde::Deserialize;

fn data_dir() -> PathBuf {
    std::env::var_os("TINY_QWEN2_VL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-qwen2-vl")
        })
}

#[derive(Deserialize)]
struct VisionReference {
    grids: Vec<[usize; 3]>,
    shape: [usize; 2],
    values: Vec<f32>,
}

/// The pixel values the reference used: `sin(0.37 i) * 0.8 + cos(0.011 i) * 0.3`, in f64, as
/// f32.
fn pixels(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f64 * 0.37).sin() * 0.8 + (i as f64 * 0.011).cos() * 0.3) as f32)
        .collect()
}

#[test]
fn vision_tower_matches_the_reference() {
    let dir = data_dir();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let cfg = VisionConfig::from_json(&config["vision_config"]).unwrap();
    let weights = SafetensorsWeights::open(&dir).unwrap();
    let tower = VisionTower::load(&cfg, &weights).unwrap();
    let reference: VisionReference =
        serde_json::from_slice(&std::fs::read(dir.join("vision_reference.json")).unwrap()).unwrap();
    let n: usize = reference.grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
    let out = tower
        .encode(&pixels(n * cfg.patch_dim()), &reference.grids)
        .unwrap();
    assert_eq!(out.len(), reference.shape[0] * reference.shape[1]);
    let worst = out
        .iter()
        .zip(&reference.values)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("vision tower: largest difference to the reference {worst:e}");
    // f32 throughout on both sides; the difference is summation order.
    assert!(worst < 1e-4, "largest difference to the reference {worst}");
    // Wrong inputs are refused, not read out of bounds.
    assert!(tower.encode(&pixels(10), &reference.grids).is_err());
    assert!(tower
        .encode(&pixels(cfg.patch_dim() * 6), &[[1, 2, 3]])
        .is_err());
}

#[derive(Deserialize)]
struct TextReference {
    token_ids: Vec<u32>,
    /// Position -> logits of the next token there.
    logits: std::collections::BTreeMap<usize, Vec<f32>>,
}

/// The text half loads as an HF decoder folder and, on a text-only prompt (where M-RoPE's
/// three positions are equal, i.e. plain RoPE), gives the reference's logits: a prefill of
/// the first 4 tokens, then one token per step through the paged cache.
#[test]
fn text_decoder_loads_from_the_folder_and_matches_the_reference() {
    use engine::model::{ActivationMode, PagedKvCache, SeqChunk};
    let dir = data_dir();
    assert_eq!(
        engine::hf::detect(&dir),
        engine::hf::CheckpointKind::Decoder
    );
    let mut loaded = engine::hf::load_decoder(&dir).unwrap();
    loaded.model.set_activation_mode(ActivationMode::F32);
    assert!(loaded.chat_template.is_some());
    let reference: TextReference =
        serde_json::from_slice(&std::fs::read(dir.join("text_reference.json")).unwrap()).unwrap();
    let ids = &reference.token_ids;
    let encoded = loaded.tokenizer.encode("The river model", false).unwrap();
    assert_eq!(encoded.get_ids(), &ids[..encoded.get_ids().len()]);

    let info = loaded.model.info().clone();
    let block = 16;
    let blocks = ids.len().div_ceil(block);
    let mut kv = PagedKvCache::new(&info, block, blocks);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut got = std::collections::BTreeMap::new();
    let first = 4;
    let out = loaded
        .model
        .forward(
            &[SeqChunk {
                tokens: &ids[..first],
                start_pos: 0,
                block_table: &table,
                want_logits: true,
            }],
            &mut kv,
        )
        .unwrap();
    got.insert(first - 1, out.into_iter().next().unwrap().unwrap());
    for pos in first..ids.len() {
        let out = loaded
            .model
            .forward(
                &[SeqChunk {
                    tokens: &ids[pos..pos + 1],
                    start_pos: pos,
                    block_table: &table,
                    want_logits: true,
                }],
                &mut kv,
            )
            .unwrap();
        got.insert(pos, out.into_iter().next().unwrap().unwrap());
    }
    let mut worst = 0.0f32;
    for (pos, want) in &reference.logits {
        let have = &got[pos];
        assert_eq!(have.len(), want.len());
        for (a, b) in have.iter().zip(want) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("text decoder: largest logit difference to the reference {worst:e}");
    assert!(worst < 1e-3, "largest logit difference {worst}");
}
