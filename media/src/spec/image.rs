//! Image processor settings: CLIP/SigLIP-style resize and normalise, and Qwen2-VL's patch
//! processor, read from a checkpoint's `preprocessor_config.json`.

use serde_json::Value;

use super::SpecError;

/// OpenAI CLIP's normalisation (also Qwen2-VL's).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
pub const CLIP_STD: [f32; 3] = [0.268_629_5, 0.261_302_6, 0.275_777_1];
/// SigLIP's normalisation.
pub const SIGLIP_MEAN: [f32; 3] = [0.5, 0.5, 0.5];
pub const SIGLIP_STD: [f32; 3] = [0.5, 0.5, 0.5];

fn bad(key: &str, reason: &str) -> SpecError {
    SpecError::Image {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

/// How a CLIP/SigLIP-style processor sizes the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// Exactly `(height, width)`.
    Exact { height: u32, width: u32 },
    /// The shorter edge to this length, keeping the aspect ratio (HF's `shortest_edge`).
    ShortestEdge(u32),
}

/// A CLIP/SigLIP-style processor: resize, optional center crop, rescale, normalise, CHW.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipConfig {
    pub resize: ResizeTo,
    /// `(height, width)` of the center crop, when cropping.
    pub crop_size: Option<(u32, u32)>,
    pub rescale_factor: f32,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

impl ClipConfig {
    /// CLIP at 448x448, no crop (the anchor benchmark's setting), 14-pixel patches.
    pub fn clip_448() -> ClipConfig {
        ClipConfig {
            resize: ResizeTo::Exact {
                height: 448,
                width: 448,
            },
            crop_size: None,
            rescale_factor: 1.0 / 255.0,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
        }
    }

    /// SigLIP at `size`x`size` with 14-pixel patches.
    pub fn siglip(size: u32) -> ClipConfig {
        ClipConfig {
            resize: ResizeTo::Exact {
                height: size,
                width: size,
            },
            crop_size: None,
            rescale_factor: 1.0 / 255.0,
            image_mean: SIGLIP_MEAN,
            image_std: SIGLIP_STD,
        }
    }

    /// Reads a Hugging Face `preprocessor_config.json` (`size`, `crop_size`,
    /// `do_center_crop`, `rescale_factor`, `image_mean`, `image_std`).
    pub fn from_preprocessor_config(cfg: &Value) -> Result<ClipConfig, SpecError> {
        let dim = |v: &Value, key: &str| -> Result<u32, SpecError> {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=16384).contains(n))
                .ok_or_else(|| bad(key, "must be an integer 1-16384"))
        };
        let hw = |v: &Value, key: &str| -> Result<(u32, u32), SpecError> {
            match v {
                Value::Number(_) => {
                    let n = dim(v, key)?;
                    Ok((n, n))
                }
                Value::Object(m) => match (m.get("height"), m.get("width")) {
                    (Some(h), Some(w)) => Ok((dim(h, key)?, dim(w, key)?)),
                    _ => Err(bad(key, "needs height and width")),
                },
                _ => Err(bad(key, "must be a number or {height, width}")),
            }
        };
        let resize = match cfg.get("size") {
            Some(Value::Object(m)) if m.contains_key("shortest_edge") => {
                ResizeTo::ShortestEdge(dim(&m["shortest_edge"], "size.shortest_edge")?)
            }
            Some(v) => {
                let (height, width) = hw(v, "size")?;
                ResizeTo::Exact { height, width }
            }
            None => return Err(bad("size", "missing")),
        };
        let do_crop = cfg
            .get("do_center_crop")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let crop_size = match (do_crop, cfg.get("crop_size")) {
            (true, Some(v)) => Some(hw(v, "crop_size")?),
            (true, None) => return Err(bad("crop_size", "missing while do_center_crop is true")),
            (false, _) => None,
        };
        let triple = |key: &str, default: [f32; 3]| -> Result<[f32; 3], SpecError> {
            match cfg.get(key) {
                None => Ok(default),
                Some(Value::Array(a)) if a.len() == 3 => {
                    let mut out = [0f32; 3];
                    for (o, v) in out.iter_mut().zip(a) {
                        *o = v.as_f64().ok_or_else(|| bad(key, "must be numbers"))? as f32;
                    }
                    Ok(out)
                }
                Some(_) => Err(bad(key, "must be a list of three numbers")),
            }
        };
        let image_std = triple("image_std", CLIP_STD)?;
        if image_std.iter().any(|s| *s <= 0.0) {
            return Err(bad("image_std", "must be positive"));
        }
        Ok(ClipConfig {
            resize,
            crop_size,
            rescale_factor: cfg
                .get("rescale_factor")
                .and_then(Value::as_f64)
                .map_or(1.0 / 255.0, |f| f as f32),
            image_mean: triple("image_mean", CLIP_MEAN)?,
            image_std,
        })
    }
}

/// Qwen2-VL / Qwen2.5-VL's image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlConfig {
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

impl Default for Qwen2VlConfig {
    /// The reference processor's defaults.
    fn default() -> Self {
        Qwen2VlConfig {
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
        }
    }
}

impl Qwen2VlConfig {
    /// From a checkpoint's `preprocessor_config.json` (or `video_preprocessor_config.json`):
    /// `patch_size`, `merge_size`, `temporal_patch_size`, `min_pixels` / `max_pixels` (or
    /// `size`), `image_mean`, `image_std`; missing keys keep the reference's defaults.
    pub fn from_preprocessor_config(cfg: &Value) -> Result<Self, SpecError> {
        let map = cfg
            .as_object()
            .ok_or_else(|| bad("preprocessor_config", "must be a JSON object"))?;
        let mut out = Qwen2VlConfig::default();
        for (key, slot) in [
            ("patch_size", &mut out.patch_size),
            ("merge_size", &mut out.merge_size),
            ("temporal_patch_size", &mut out.temporal_patch_size),
        ] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
                *slot = v
                    .as_u64()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| bad(key, "must be an integer from 1 to 1024"))?
                    as usize;
            }
        }
        for (key, slot) in [
            ("image_mean", &mut out.image_mean),
            ("image_std", &mut out.image_std),
        ] {
            if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
                let values: Option<Vec<f32>> = v
                    .as_array()
                    .map(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
                    .unwrap_or(None);
                match values.as_deref() {
                    Some(&[a, b, c]) if key == "image_mean" || (a > 0.0 && b > 0.0 && c > 0.0) => {
                        *slot = [a, b, c]
                    }
                    _ => return Err(bad(key, "must be three numbers (std positive)")),
                }
            }
        }
        let num = |v: &Value, key: &str| -> Result<u64, SpecError> {
            v.as_u64()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(key, "must be a positive integer"))
        };
        if let Some(Value::Object(size)) = map.get("size") {
            if let Some(v) = size.get("shortest_edge") {
                out.min_pixels = num(v, "size.shortest_edge")?;
            }
            if let Some(v) = size.get("longest_edge") {
                out.max_pixels = num(v, "size.longest_edge")?;
            }
        }
        if let Some(v) = map.get("min_pixels") {
            out.min_pixels = num(v, "min_pixels")?;
        }
        if let Some(v) = map.get("max_pixels") {
            out.max_pixels = num(v, "max_pixels")?;
        }
        out.check_pixel_bounds()?;
        Ok(out)
    }

    /// `min_pixels` must not exceed `max_pixels` (the smart resize has no answer otherwise).
    pub fn check_pixel_bounds(&self) -> Result<(), SpecError> {
        if self.min_pixels > self.max_pixels {
            return Err(SpecError::Image {
                key: "min_pixels".to_owned(),
                reason: format!(
                    "{} is larger than max_pixels {}",
                    self.min_pixels, self.max_pixels
                ),
            });
        }
        Ok(())
    }
}

/// The processors a model may use for images.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageProcessor {
    Clip(ClipConfig),
    Qwen2Vl(Qwen2VlConfig),
}
