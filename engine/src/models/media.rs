//! The encoders a multimodal checkpoint brings beside its decoder, and the step that turns a
//! rendered prompt plus preprocessed media into what the serving engine consumes: each media
//! item's single placeholder token (as the chat template renders it) expanded to the item's
//! token count, the encoders' output for those rows, M-RoPE positions where the model uses
//! them, and the items' content hashes for the prefix cache.

use std::path::Path;

use std::sync::Arc;

use media::spec::ModelMediaSpec;
use media::{MediaTensor, Modality, ProcessedMedia};
use serde_json::Value;

use crate::api::PromptMedia;
use crate::block_manager::MediaSpan;
use crate::error::{EngineError, Result};
use crate::hf::SafetensorsWeights;
use crate::models::qwen2_audio::{AudioConfig, AudioTower};
use crate::models::qwen2_vl::vision::{VisionConfig, VisionTower};
use crate::models::qwen2_vl::{mrope_positions, TokenKind};

/// One media item as the encoders read it: a view of a [`ProcessedMedia`].
#[derive(Debug, Clone)]
enum MediaInput<'a> {
    /// Patches (Qwen2-VL's processor output) with their `(t, h, w)` grid.
    Image {
        pixels: &'a [f32],
        grid: [usize; 3],
        hash: String,
    },
    Video {
        pixels: &'a [f32],
        grid: [usize; 3],
        hash: String,
    },
    /// A log-mel window (`[mel bins][frames]`) of which `valid_frames` are the clip.
    Audio {
        features: &'a [f32],
        valid_frames: usize,
        hash: String,
    },
}

impl<'a> MediaInput<'a> {
    /// The encoders' view of `item`. A patch-based tower needs the processor's grid; an image
    /// resized to a fixed square (CLIP-style) has none, and is refused naming the modality.
    fn of(item: &'a ProcessedMedia) -> Result<Self> {
        let hash = item.hash.to_hex();
        let no_grid = || {
            EngineError::invalid(
                format!(
                    "this model takes {} input as patch grids, and the processed item has none",
                    item.modality()
                ),
                Some("messages"),
            )
        };
        Ok(match &item.tensor {
            MediaTensor::Image(img) => MediaInput::Image {
                pixels: &img.pixel_values.data,
                grid: img.grid_thw.ok_or_else(no_grid)?,
                hash,
            },
            MediaTensor::Video { frames, .. } => MediaInput::Video {
                pixels: &frames.pixel_values.data,
                grid: frames.grid_thw.ok_or_else(no_grid)?,
                hash,
            },
            MediaTensor::Audio(a) => MediaInput::Audio {
                features: &a.data,
                valid_frames: a.valid_frames,
                hash,
            },
        })
    }

    fn modality(&self) -> Modality {
        match self {
            MediaInput::Image { .. } => Modality::Image,
            MediaInput::Video { .. } => Modality::Video,
            MediaInput::Audio { .. } => Modality::Audio,
        }
    }
}

/// A checkpoint's media encoders and placeholder tokens, with the processor spec that shapes
/// their inputs.
#[derive(Debug)]
pub struct MediaEncoders {
    vision: Option<(VisionTower, u32, u32)>,
    audio: Option<(AudioTower, u32)>,
    spec: Arc<ModelMediaSpec>,
}

fn token_id(config: &Value, keys: &[&str]) -> Result<u32> {
    keys.iter()
        .find_map(|k| config.get(*k).and_then(Value::as_u64))
        .map(|n| n as u32)
        .ok_or_else(|| EngineError::load("config.json", format!("`{}` is missing", keys[0])))
}

impl MediaEncoders {
    /// Qwen2-VL's vision tower and image/video tokens, and the folder's processor settings.
    pub fn qwen2_vl(dir: &Path, config: &Value, weights: &SafetensorsWeights) -> Result<Self> {
        let vcfg = VisionConfig::from_json(
            config
                .get("vision_config")
                .ok_or_else(|| EngineError::load("config.json", "`vision_config` is missing"))?,
        )?;
        let vision = (
            VisionTower::load(&vcfg, weights)?,
            token_id(config, &["image_token_id"])?,
            token_id(config, &["video_token_id"])?,
        );
        Self::with_processor(dir, Some(vision), None)
    }

    /// Qwen2-Audio's audio tower and audio token, and the folder's processor settings.
    pub fn qwen2_audio(dir: &Path, config: &Value, weights: &SafetensorsWeights) -> Result<Self> {
        let audio = (
            AudioTower::load(&AudioConfig::from_json(config)?, weights)?,
            token_id(config, &["audio_token_index", "audio_token_id"])?,
        );
        Self::with_processor(dir, None, Some(audio))
    }

    fn with_processor(
        dir: &Path,
        vision: Option<(VisionTower, u32, u32)>,
        audio: Option<(AudioTower, u32)>,
    ) -> Result<Self> {
        // The processor files are read with the encoders, so what media the model takes and
        // how they are shaped have one source: the loaded model.
        let spec = ModelMediaSpec::from_model_dir(dir)
            .map_err(|e| EngineError::load(dir.display().to_string(), e.to_string()))?;
        let encoders = MediaEncoders {
            vision,
            audio,
            spec: Arc::new(spec),
        };
        tracing::info!(dir = %dir.display(), modalities = ?encoders.modalities(), "loaded media encoders");
        Ok(encoders)
    }

    /// How the checkpoint's processor turns each modality into the tensors these encoders take.
    pub fn spec(&self) -> &Arc<ModelMediaSpec> {
        &self.spec
    }

    /// The input modalities besides text.
    pub fn modalities(&self) -> Vec<Modality> {
        let mut m = Vec::new();
        if self.vision.is_some() {
            m.extend([Modality::Image, Modality::Video]);
        }
        if self.audio.is_some() {
            m.push(Modality::Audio);
        }
        m
    }

    /// Host bytes one prompt's encoding may hold, for media of at most `max_tokens`
    /// placeholder tokens (a term of the deployment's memory bound): the tower's activations
    /// row by row, a block of attention scores, and the embeddings of the whole prompt.
    pub fn work_bytes(&self, max_tokens: usize) -> u64 {
        let block = crate::models::layers::QUERY_BLOCK;
        let vision = self.vision.as_ref().map_or(0, |(t, _, _)| {
            let c = t.config();
            let n = max_tokens * c.spatial_merge_size * c.spatial_merge_size;
            let hd = c.embed_dim / c.num_heads.max(1);
            // x, h, qkv, attn, tmp and the merger's rows; ff and its output; cos and sin.
            n * (8 * c.embed_dim + 2 * c.mlp_hidden + 2 * hd) + block * n
        });
        let audio = self.audio.as_ref().map_or(0, |(t, _)| {
            let c = t.config();
            let n = c.max_source_positions;
            // The first convolution's output (twice the positions), then each layer's rows.
            2 * n * c.d_model + n * (6 * c.d_model + 2 * c.ffn) + block * n
        });
        let hidden = self
            .vision
            .as_ref()
            .map_or(0, |(t, _, _)| t.config().hidden_size)
            .max(
                self.audio
                    .as_ref()
                    .map_or(0, |(t, _)| t.config().text_hidden),
            );
        ((vision.max(audio) + max_tokens * hidden) as u64).saturating_mul(4)
    }

    /// Placeholder tokens an item takes: the one count ([`media::tokens`]).
    fn num_tokens(&self, item: &MediaInput<'_>) -> Result<usize> {
        match (item, &self.vision, &self.audio) {
            (
                MediaInput::Image { grid, .. } | MediaInput::Video { grid, .. },
                Some((t, _, _)),
                _,
            ) => Ok(media::tokens::vision(*grid, t.config().spatial_merge_size)),
            (MediaInput::Audio { valid_frames, .. }, _, Some(_)) => {
                Ok(media::tokens::audio(*valid_frames))
            }
            _ => Err(self.refused(item)),
        }
    }

    fn refused(&self, item: &MediaInput<'_>) -> EngineError {
        EngineError::invalid(
            format!(
                "this model does not accept {} input (it accepts: text, {})",
                item.modality(),
                self.modalities()
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("messages"),
        )
    }

    fn placeholder(&self, item: &MediaInput<'_>) -> Result<u32> {
        match (item, &self.vision, &self.audio) {
            (MediaInput::Image { .. }, Some((_, image, _)), _) => Ok(*image),
            (MediaInput::Video { .. }, Some((_, _, video)), _) => Ok(*video),
            (MediaInput::Audio { .. }, _, Some((_, audio))) => Ok(*audio),
            _ => Err(self.refused(item)),
        }
    }

    /// Expands the prompt's placeholders and encodes the media. `ids` holds one placeholder
    /// token per item (as the chat template renders them); the k-th placeholder of a modality
    /// takes the k-th item of that modality. Returns the expanded ids and the prompt media.
    pub fn prepare(
        &self,
        ids: &[u32],
        items: &[std::sync::Arc<ProcessedMedia>],
    ) -> Result<(Vec<u32>, PromptMedia)> {
        let items: Vec<MediaInput<'_>> = items
            .iter()
            .map(|item| MediaInput::of(item))
            .collect::<Result<_>>()?;
        let placeholders: Vec<u32> = items
            .iter()
            .map(|i| self.placeholder(i))
            .collect::<Result<_>>()?;
        let mut out = Vec::with_capacity(ids.len());
        let mut media = PromptMedia::default();
        let mut used = vec![false; items.len()];
        let (mut image_grids, mut video_grids) = (Vec::new(), Vec::new());
        for &tok in ids {
            let Some(k) = (0..items.len()).find(|&k| !used[k] && placeholders[k] == tok) else {
                if placeholders.contains(&tok) {
                    return Err(EngineError::invalid(
                        "the prompt has more media placeholders than media items",
                        Some("messages"),
                    ));
                }
                out.push(tok);
                continue;
            };
            used[k] = true;
            let item = &items[k];
            let n = self.num_tokens(item)?;
            if n == 0 {
                return Err(EngineError::invalid(
                    format!(
                        "the {} item {} is too short to give any token",
                        item.modality(),
                        k + 1
                    ),
                    Some("messages"),
                ));
            }
            let start = out.len();
            out.extend(std::iter::repeat_n(tok, n));
            let (embeds, hash) = match (item, &self.vision, &self.audio) {
                (MediaInput::Image { pixels, grid, hash }, Some((t, _, _)), _) => {
                    image_grids.push(*grid);
                    (t.encode(pixels, &[*grid])?, hash)
                }
                (MediaInput::Video { pixels, grid, hash }, Some((t, _, _)), _) => {
                    video_grids.push(*grid);
                    (t.encode(pixels, &[*grid])?, hash)
                }
                (
                    MediaInput::Audio {
                        features,
                        valid_frames,
                        hash,
                    },
                    _,
                    Some((a, _)),
                ) => (a.encode(features, *valid_frames)?, hash),
                _ => return Err(self.refused(item)),
            };
            media.rows.extend((start..start + n).map(|r| r as u32));
            media.embeds.extend(embeds);
            media.items.push(MediaSpan {
                hash: hash.clone(),
                start,
                len: n,
            });
        }
        if used.iter().any(|u| !u) {
            return Err(EngineError::invalid(
                "the prompt has fewer media placeholders than media items",
                Some("messages"),
            ));
        }
        if let Some((tower, image, video)) = &self.vision {
            let kinds: Vec<TokenKind> = out
                .iter()
                .map(|&t| match t {
                    t if t == *image => TokenKind::Image,
                    t if t == *video => TokenKind::Video,
                    _ => TokenKind::Text,
                })
                .collect();
            media.mrope = Some(mrope_positions(
                &kinds,
                &image_grids,
                &video_grids,
                tower.config().spatial_merge_size,
            )?);
        }
        Ok((out, media))
    }
}
