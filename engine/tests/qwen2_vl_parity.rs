//! The Qwen2-VL tiny checkpoint (`tests/data/tiny-qwen2-vl`, made by
//! `scripts/make_tiny_mm_models.py` with random weights) against the `transformers` reference:
//! the vision tower on deterministic pixel values (`vision_reference.json`, made by
//! `scripts/tiny_vision_reference.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use engine::hf::SafetensorsWeights;
use engine::models::qwen2_vl::vision::{VisionConfig, VisionTower};
use preprocess::image::PatchProcessor;
use serde::Deserialize;

mod multimodal_data;
use multimodal_data::{check_greedy, max_diff, Greedy};

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
    use engine::model::{ActivationMode, SeqChunk};
    let dir = data_dir();
    assert_eq!(
        engine::load::detect(&dir),
        engine::load::CheckpointKind::Decoder
    );
    let mut loaded = engine::load::load_hf_decoder(&dir).unwrap();
    loaded.model.set_activation_mode(ActivationMode::F32);
    assert!(loaded.chat_template.is_some());
    let reference: TextReference =
        serde_json::from_slice(&std::fs::read(dir.join("text_reference.json")).unwrap()).unwrap();
    let ids = &reference.token_ids;
    let encoded = loaded.tokenizer.encode("The river model", false).unwrap();
    assert_eq!(encoded.get_ids(), &ids[..encoded.get_ids().len()]);

    let block = 16;
    let blocks = ids.len().div_ceil(block);
    loaded
        .model
        .allocate_kv(block, &engine::model::KvBudget::tokens(blocks * block))
        .unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut got = std::collections::BTreeMap::new();
    let first = 4;
    let out = loaded
        .model
        .forward(&[SeqChunk {
            lora: None,
            tokens: &ids[..first],
            start_pos: 0,
            block_table: &table,
            want_logits: true,
            media: None,
        }])
        .unwrap();
    got.insert(first - 1, out.into_iter().next().unwrap().unwrap());
    for pos in first..ids.len() {
        let out = loaded
            .model
            .forward(&[SeqChunk {
                lora: None,
                tokens: &ids[pos..pos + 1],
                start_pos: pos,
                block_table: &table,
                want_logits: true,
                media: None,
            }])
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

#[derive(Deserialize)]
struct MmReference {
    cases: Vec<MmCase>,
}

#[derive(Deserialize)]
struct MmCase {
    name: String,
    input_ids: Vec<u32>,
    placeholders: Vec<Placeholder>,
    position_ids: Vec<Vec<u32>>,
    logits_last: Vec<f32>,
    greedy: Greedy,
    /// Where transformers 5.24 and vLLM / transformers 4 place the text after a long video
    /// differently, the latter's positions and logits (we follow vLLM).
    position_ids_transformers4: Option<Vec<Vec<u32>>>,
    transformers4: Option<Transformers4>,
}

#[derive(Deserialize)]
struct Placeholder {
    kind: String,
    start: usize,
    tokens: usize,
    grid_thw: [usize; 3],
    resized: Resized,
}

#[derive(Deserialize)]
struct Resized {
    height: u64,
    width: u64,
    files: Vec<String>,
}

#[derive(Deserialize)]
struct Transformers4 {
    logits_last: Vec<f32>,
}

/// A case's media as the serving path would build it: the reference's resized frames through
/// our processor (at their own size, so the pixels are the reference's) and the tower, rows in
/// prompt order, M-RoPE positions from the prompt, and one prefix-cache span per item.
struct CaseMedia {
    rows: Vec<u32>,
    embeds: Vec<f32>,
    positions: Vec<[u32; 3]>,
    delta: i64,
    items: Vec<engine::block_manager::MediaSpan>,
}

/// A case's media items through our processor: modality, patches, grid and a hash.
fn case_inputs(
    dir: &std::path::Path,
    case: &MmCase,
) -> Vec<(String, Vec<f32>, [usize; 3], String)> {
    case.placeholders
        .iter()
        .map(|ph| {
            let frames: Vec<image::RgbImage> = ph
                .resized
                .files
                .iter()
                .map(|f| image::open(dir.join(f)).unwrap().to_rgb8())
                .collect();
            let area = ph.resized.height * ph.resized.width;
            let processor = preprocess::image::Qwen2VlConfig {
                min_pixels: area,
                max_pixels: area,
                ..Default::default()
            };
            let processed = processor.process_frames(&frames).unwrap();
            assert_eq!(processed.grid_thw, Some(ph.grid_thw), "{}: grid", case.name);
            assert_eq!(
                media::tokens::vision(ph.grid_thw, processor.merge_size),
                ph.tokens,
                "{}: token count",
                case.name
            );
            (
                ph.kind.clone(),
                processed.pixel_values.data,
                ph.grid_thw,
                media::ContentHash::of_parts([ph.resized.files.join("+").as_bytes()]).to_hex(),
            )
        })
        .collect()
}

fn case_media(
    dir: &std::path::Path,
    tower: &VisionTower,
    case: &MmCase,
    image_id: u32,
    video_id: u32,
) -> CaseMedia {
    use engine::models::qwen2_vl::{mrope_positions, TokenKind};
    let mut rows = Vec::new();
    let mut embeds = Vec::new();
    let mut items = Vec::new();
    let (mut image_grids, mut video_grids) = (Vec::new(), Vec::new());
    for (ph, (kind, pixels, grid, hash)) in case.placeholders.iter().zip(case_inputs(dir, case)) {
        let out = tower.encode(&pixels, &[grid]).unwrap();
        assert_eq!(out.len(), ph.tokens * tower.config().hidden_size);
        rows.extend((ph.start..ph.start + ph.tokens).map(|r| r as u32));
        embeds.extend(out);
        items.push(engine::block_manager::MediaSpan {
            hash,
            start: ph.start,
            len: ph.tokens,
        });
        match kind.as_str() {
            "image" => image_grids.push(grid),
            _ => video_grids.push(grid),
        }
    }
    let kinds: Vec<TokenKind> = case
        .input_ids
        .iter()
        .map(|&t| match t {
            t if t == image_id => TokenKind::Image,
            t if t == video_id => TokenKind::Video,
            _ => TokenKind::Text,
        })
        .collect();
    let (positions, delta) = mrope_positions(&kinds, &image_grids, &video_grids, 2).unwrap();
    CaseMedia {
        rows,
        embeds,
        positions,
        delta,
        items,
    }
}

/// Every image and video case end to end below the HTTP layer: the reference's resized frames
/// through our Qwen2-VL processor (at their own size, so the pixels are the reference's), the
/// vision tower, the placeholder rows replaced by its output, M-RoPE positions, the decoder's
/// last logits, then greedy decode steps with the prompt's position offset.
#[test]
fn images_and_videos_through_processor_tower_and_decoder_match_the_reference() {
    use engine::model::{ActivationMode, ChunkMedia, SeqChunk};
    let dir = data_dir();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let vcfg = VisionConfig::from_json(&config["vision_config"]).unwrap();
    let tower = VisionTower::load(&vcfg, &SafetensorsWeights::open(&dir).unwrap()).unwrap();
    let mut loaded = engine::load::load_hf_decoder(&dir).unwrap();
    loaded.model.set_activation_mode(ActivationMode::F32);
    let image_id = config["image_token_id"].as_u64().unwrap() as u32;
    let video_id = config["video_token_id"].as_u64().unwrap() as u32;
    let reference: MmReference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    assert!(reference.cases.len() >= 10);
    let mut worst = 0.0f32;
    for case in &reference.cases {
        let ids = &case.input_ids;
        let CaseMedia {
            rows,
            embeds,
            positions,
            delta,
            ..
        } = case_media(&dir, &tower, case, image_id, video_id);
        let want_pos = case
            .position_ids_transformers4
            .as_ref()
            .unwrap_or(&case.position_ids);
        for (i, p) in positions.iter().enumerate() {
            assert_eq!(
                *p,
                [want_pos[0][i], want_pos[1][i], want_pos[2][i]],
                "{}: position {i}",
                case.name
            );
        }
        let want_max = want_pos.iter().flatten().copied().max().unwrap() as i64;
        assert_eq!(
            delta,
            want_max + 1 - ids.len() as i64,
            "{}: delta",
            case.name
        );

        let block = 16;
        let total = ids.len() + case.greedy.new_tokens.len();
        let blocks = total.div_ceil(block);
        loaded
            .model
            .allocate_kv(block, &engine::model::KvBudget::tokens(blocks * block))
            .unwrap();
        let table: Vec<u32> = (0..blocks as u32).collect();
        let out = loaded
            .model
            .forward(&[SeqChunk {
                lora: None,
                tokens: ids,
                start_pos: 0,
                block_table: &table,
                want_logits: true,
                media: Some(ChunkMedia {
                    rows: &rows,
                    embeds: &embeds,
                    positions: Some(&positions),
                    position_delta: delta,
                }),
            }])
            .unwrap();
        let logits = out.into_iter().next().unwrap().unwrap();
        let want = case
            .transformers4
            .as_ref()
            .map_or(&case.logits_last, |t| &t.logits_last);
        let diff = max_diff(&logits, want);
        assert!(
            diff < 1e-4,
            "{}: largest logit difference {diff}",
            case.name
        );
        worst = worst.max(diff);
        if case.transformers4.is_some() {
            continue; // its greedy tokens follow 5.24's positions
        }
        // Greedy decode: text positions continue at sequence position + delta.
        let after = ChunkMedia {
            rows: &[],
            embeds: &[],
            positions: None,
            position_delta: delta,
        };
        check_greedy(
            loaded.model.as_mut(),
            &table,
            ids.len(),
            &logits,
            &case.greedy,
            Some(after),
            &case.name,
        );
    }
    eprintln!("image/video cases: largest last-logit difference to the reference {worst:e}");
}

/// The same cases through the serving engine: chunked prefill (8 tokens per step, so images
/// are split across steps), the paged cache, greedy sampling; then the prefix cache keyed by
/// the media: the same request reuses every full block, the same prompt with other media
/// reuses only the blocks before it.
#[tokio::test]
async fn serving_with_media_decodes_as_the_reference_and_keys_the_cache_by_media() {
    use engine::api::{GenerateRequest, PromptMedia, SamplingParams};
    use engine::handle::{EngineConfig, EngineHandle, LoadedModel, ModelSpec};
    use media::{ContentHash, MediaTensor, PixelValues, ProcessedImage, ProcessedMedia};
    use std::sync::Arc;
    let patches = |pixels: &[f32], grid: [usize; 3]| ProcessedImage {
        pixel_values: PixelValues {
            data: pixels.to_vec(),
            shape: vec![
                grid.iter().product(),
                pixels.len() / grid.iter().product::<usize>(),
            ],
        },
        grid_thw: Some(grid),
    };
    let hash_of = |hex: &str| {
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        ContentHash(bytes)
    };
    let dir = data_dir();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let vcfg = VisionConfig::from_json(&config["vision_config"]).unwrap();
    let tower = VisionTower::load(&vcfg, &SafetensorsWeights::open(&dir).unwrap()).unwrap();
    let image_id = config["image_token_id"].as_u64().unwrap() as u32;
    let video_id = config["video_token_id"].as_u64().unwrap() as u32;
    let reference: MmReference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let engine = EngineHandle::from_loaded(
        vec![(
            ModelSpec {
                path: dir.display().to_string(),
                served_name: "tiny-vl".into(),
            },
            LoadedModel::Decoder(engine::load::load_hf_decoder(&dir).unwrap()),
        )],
        &EngineConfig {
            max_model_len: Some(256),
            max_num_batched_tokens: 8,
            kv_cache_tokens: Some(2048),
            block_size: 4,
            activation_mode: engine::model::ActivationMode::F32,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let model = engine.model("tiny-vl").unwrap();
    assert_eq!(
        model.media_modalities(),
        [media::Modality::Image, media::Modality::Video]
    );
    // Mismatched media: more items than placeholders, and a modality the model lacks.
    let one_image = reference
        .cases
        .iter()
        .find(|c| c.name == "image_single")
        .unwrap();
    let px = case_inputs(&dir, one_image);
    let item = Arc::new(ProcessedMedia {
        hash: ContentHash::of_parts([b"h".as_slice()]),
        tensor: MediaTensor::Image(patches(&px[0].1, px[0].2)),
    });
    assert!(model
        .prepare_media(vec![1, 2, 3], vec![item])
        .await
        .is_err());
    let audio = Arc::new(ProcessedMedia {
        hash: ContentHash::of_parts([b"a".as_slice()]),
        tensor: MediaTensor::Audio(media::AudioFeatures {
            data: Vec::new(),
            n_mels: 128,
            n_frames: 3000,
            valid_frames: 10,
        }),
    });
    assert!(model
        .prepare_media(vec![1, image_id], vec![audio])
        .await
        .is_err());
    // An image without a patch grid (a CLIP-style processor's output) is refused by name.
    let square = Arc::new(ProcessedMedia {
        hash: ContentHash::of_parts([b"s".as_slice()]),
        tensor: MediaTensor::Image(ProcessedImage {
            grid_thw: None,
            ..patches(&px[0].1, px[0].2)
        }),
    });
    let err = model
        .prepare_media(vec![1, image_id], vec![square])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("patch grids"), "{err}");
    let run = |case: &MmCase, media: PromptMedia| {
        model
            .generate(GenerateRequest {
                request_id: case.name.clone(),
                prompt_ids: case.input_ids.clone(),
                params: SamplingParams {
                    temperature: 0.0,
                    max_tokens: case.greedy.new_tokens.len(),
                    ignore_eos: true,
                    ..Default::default()
                },
                cache_salt: None,
                media: Some(Arc::new(media)),
            })
            .unwrap()
    };
    // The serving path: the prompt as the template renders it (one placeholder per item),
    // expanded and encoded by the model's own encoders; checked against the reference's ids
    // and against the media built step by step.
    let media_of = async |case: &MmCase| {
        let mut rendered: Vec<u32> = Vec::new();
        for &t in &case.input_ids {
            let placeholder = t == image_id || t == video_id;
            if !(placeholder && rendered.last() == Some(&t)) {
                rendered.push(t);
            }
        }
        let inputs = case_inputs(&dir, case);
        let items: Vec<Arc<ProcessedMedia>> = inputs
            .iter()
            .map(|(kind, pixels, grid, hash)| {
                let frames = patches(pixels, *grid);
                Arc::new(ProcessedMedia {
                    hash: hash_of(hash),
                    tensor: match kind.as_str() {
                        "image" => MediaTensor::Image(frames),
                        _ => MediaTensor::Video {
                            frames,
                            timestamps_s: Vec::new(),
                        },
                    },
                })
            })
            .collect();
        let (ids, media) = model.prepare_media(rendered, items).await.unwrap();
        assert_eq!(ids, case.input_ids, "{}: expanded prompt", case.name);
        let direct = case_media(&dir, &tower, case, image_id, video_id);
        assert_eq!(media.rows, direct.rows, "{}", case.name);
        assert_eq!(
            media.mrope,
            Some((direct.positions, direct.delta)),
            "{}",
            case.name
        );
        assert_eq!(media.embeds, direct.embeds, "{}", case.name);
        assert_eq!(media.items, direct.items, "{}", case.name);
        (*media).clone()
    };
    async fn collect(mut s: engine::handle::GenerationStream) -> (Vec<u32>, usize) {
        let mut ids = Vec::new();
        let mut cached = 0;
        while let Some(d) = s.next().await {
            let d = d.unwrap();
            ids.extend(d.token_ids);
            if let Some(f) = d.finish {
                cached = f.cached_tokens;
            }
        }
        (ids, cached)
    }
    for case in reference.cases.iter().filter(|c| c.transformers4.is_none()) {
        let (ids, _) = collect(run(case, media_of(case).await)).await;
        for (step, ((got, want), margin)) in ids
            .iter()
            .zip(&case.greedy.new_tokens)
            .zip(&case.greedy.margins)
            .enumerate()
        {
            if *margin > 1e-3 {
                assert_eq!(got, want, "{}: served greedy step {step}", case.name);
            }
        }
    }
    // Prefix cache: the image of `image_single` starts at position 20 (block 5 of 4 tokens).
    let case = reference
        .cases
        .iter()
        .find(|c| c.name == "image_single")
        .unwrap();
    assert_eq!(case.placeholders[0].start, 20);
    let (first, _) = collect(run(case, media_of(case).await)).await;
    let (again, cached) = collect(run(case, media_of(case).await)).await;
    assert_eq!(first, again);
    assert_eq!(
        cached,
        case.input_ids.len() / 4 * 4,
        "same media: every full prompt block"
    );
    let mut other = media_of(case).await;
    other.items[0].hash = "another image".into();
    other.embeds.iter_mut().for_each(|v| *v = -*v);
    let (_, cached) = collect(run(case, other)).await;
    assert_eq!(cached, 20, "other media: only the blocks before the image");
    // Media that does not fit the prompt is refused before it reaches the engine.
    let mut bad = media_of(case).await;
    bad.rows.push(10_000);
    let err = model
        .generate(GenerateRequest {
            request_id: "bad".into(),
            prompt_ids: case.input_ids.clone(),
            params: SamplingParams::default(),
            cache_salt: None,
            media: Some(Arc::new(bad)),
        })
        .err();
    assert!(
        matches!(err, Some(engine::EngineError::InvalidRequest { .. })),
        "{err:?}"
    );
}
