//! The Qwen2-Audio tiny checkpoint (`tests/data/tiny-qwen2-audio`, made by
//! `scripts/make_tiny_mm_models.py` with random weights) against the `transformers` reference:
//! each case's WAV clips through our decoder and log-mel features, the audio tower and
//! projector, the placeholder rows replaced by its output, the decoder's last logits and
//! greedy decode steps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::hf::SafetensorsWeights;
use engine::model::{ActivationMode, ChunkMedia, SeqChunk};
use engine::models::qwen2_audio::{AudioConfig, AudioTower};
use serde::Deserialize;

mod multimodal_data;
use multimodal_data::{check_greedy, max_diff, Greedy};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-qwen2-audio")
}

#[derive(Deserialize)]
struct Reference {
    media: std::collections::BTreeMap<String, Media>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Media {
    file: String,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    input_ids: Vec<u32>,
    placeholders: Vec<Placeholder>,
    logits_last: Vec<f32>,
    greedy: Greedy,
}

#[derive(Deserialize)]
struct Placeholder {
    media: String,
    start: usize,
    tokens: usize,
}

#[test]
fn audio_through_features_tower_and_decoder_matches_the_reference() {
    let dir = data_dir();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let acfg = AudioConfig::from_json(&config).unwrap();
    let tower = AudioTower::load(&acfg, &SafetensorsWeights::open(&dir).unwrap()).unwrap();
    assert_eq!(
        engine::load::detect(&dir),
        engine::load::CheckpointKind::Decoder
    );
    let mut loaded = engine::load::load_hf_decoder(&dir).unwrap();
    loaded.model.set_activation_mode(ActivationMode::F32);
    let features_cfg = preprocess::audio::WhisperFeatureConfig::whisper(acfg.num_mel_bins);
    let reference: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    assert_eq!(reference.cases.len(), 3);
    let mut worst = 0.0f32;
    for case in &reference.cases {
        let ids = &case.input_ids;
        let mut rows = Vec::new();
        let mut embeds = Vec::new();
        let mut all_feats = Vec::new();
        for ph in &case.placeholders {
            let bytes = std::fs::read(dir.join(&reference.media[&ph.media].file)).unwrap();
            let feats = preprocess::audio::audio_to_features(
                &bytes,
                Some("audio/wav"),
                &preprocess::audio::AudioIoOptions::default(),
                &features_cfg,
            )
            .unwrap();
            assert_eq!(
                media::tokens::audio(feats.valid_frames),
                ph.tokens,
                "{}",
                case.name
            );
            let out = tower.encode(&feats.data, feats.valid_frames).unwrap();
            assert_eq!(out.len(), ph.tokens * 64);
            rows.extend((ph.start..ph.start + ph.tokens).map(|r| r as u32));
            embeds.extend(out);
            all_feats.push(feats);
        }
        // The serving path: one <|AUDIO|> per clip as rendered, expanded and encoded by the
        // checkpoint's own encoders.
        let encoders = loaded.media.as_ref().unwrap();
        assert_eq!(encoders.modalities(), [media::Modality::Audio]);
        let audio_id = config["audio_token_index"].as_u64().unwrap() as u32;
        let mut rendered: Vec<u32> = Vec::new();
        for &t in ids {
            if !(t == audio_id && rendered.last() == Some(&t)) {
                rendered.push(t);
            }
        }
        let items: Vec<std::sync::Arc<media::ProcessedMedia>> = all_feats
            .into_iter()
            .map(|f| {
                std::sync::Arc::new(media::ProcessedMedia {
                    hash: media::ContentHash::of_parts([b"clip".as_slice()]),
                    tensor: media::MediaTensor::Audio(f),
                })
            })
            .collect();
        let (expanded, media) = encoders.prepare(&rendered, &items).unwrap();
        assert_eq!(&expanded, ids, "{}: expanded prompt", case.name);
        assert_eq!(media.rows, rows);
        assert_eq!(media.embeds, embeds);
        assert!(media.mrope.is_none());
        let block = 16;
        let blocks = (ids.len() + case.greedy.new_tokens.len()).div_ceil(block);
        loaded
            .model
            .allocate_kv(block, &engine::model::KvBudget::tokens(blocks * block))
            .unwrap();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let media = ChunkMedia {
            rows: &rows,
            embeds: &embeds,
            positions: None,
            position_delta: 0,
        };
        let out = loaded
            .model
            .forward(&[SeqChunk {
                lora: None,
                tokens: ids,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
                media: Some(media),
            }])
            .unwrap();
        let logits = out.into_iter().next().unwrap().unwrap();
        let diff = max_diff(&logits, &case.logits_last);
        assert!(
            diff < 1e-4,
            "{}: largest logit difference {diff}",
            case.name
        );
        worst = worst.max(diff);
        check_greedy(
            loaded.model.as_mut(),
            &table,
            ids.len(),
            &logits,
            &case.greedy,
            None,
            &case.name,
        );
    }
    eprintln!("audio cases: largest last-logit difference to the reference {worst:e}");
    // Inputs the tower cannot take are errors, not panics.
    assert!(tower.encode(&[0.0; 10], 5).is_err());
    let window = vec![0.0; acfg.num_mel_bins * acfg.window_frames()];
    assert!(tower.encode(&window, 2).is_err());
    assert!(tower.encode(&window, 3001).is_err());
}
