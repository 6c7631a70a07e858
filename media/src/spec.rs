//! What media a model takes and how its processor turns each into tensors: the spec the engine
//! loads with the model (from the checkpoint folder's processor files) and the media pipeline
//! runs with. Only the settings live here; the processing itself is `preprocess`'s.

use std::path::Path;

use serde_json::Value;

use crate::Modality;

mod audio;
mod image;

pub use audio::{WhisperFeatureConfig, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, WHISPER_SAMPLE_RATE};
pub use image::{
    ClipConfig, ImageProcessor, Qwen2VlConfig, ResizeTo, CLIP_MEAN, CLIP_STD, SIGLIP_MEAN,
    SIGLIP_STD,
};

/// A processor setting a checkpoint (or a caller building one) got wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("Invalid image processor setting {key}: {reason}")]
    Image { key: String, reason: String },
    #[error("Invalid audio processing setting {key}: {reason}")]
    Audio { key: String, reason: String },
    /// A processor file that is not JSON, or whose settings are invalid.
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
}

impl SpecError {
    /// What is wrong (the key or file, and why), for an error type that names the setting.
    pub fn into_parts(self) -> (String, String) {
        match self {
            SpecError::Image { key, reason } | SpecError::Audio { key, reason } => (key, reason),
            SpecError::File { file, reason } => (file, reason),
        }
    }
}

/// How a model turns each modality into tensors; `None` where it takes no such input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelMediaSpec {
    pub image: Option<ImageProcessor>,
    /// Video frames go through a patch processor (Qwen2-VL style: temporal patches).
    pub video: Option<Qwen2VlConfig>,
    pub audio: Option<WhisperFeatureConfig>,
}

impl ModelMediaSpec {
    /// What a checkpoint folder's processor files say: a Qwen2-VL image processor
    /// (`preprocessor_config.json`, with `video_preprocessor_config.json` for video when
    /// present), or a Whisper feature extractor for audio. A folder with neither takes no
    /// media.
    pub fn from_model_dir(dir: &Path) -> Result<Self, SpecError> {
        let read = |name: &str| -> Result<Option<Value>, SpecError> {
            let path = dir.join(name);
            let Ok(text) = std::fs::read_to_string(&path) else {
                return Ok(None);
            };
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| SpecError::File {
                    file: path.display().to_string(),
                    reason: format!("invalid JSON: {e}"),
                })
        };
        let in_file = |name: &str| {
            let name = name.to_owned();
            move |e: SpecError| SpecError::File {
                file: name,
                reason: e.to_string(),
            }
        };
        let mut spec = ModelMediaSpec::default();
        let Some(pre) = read("preprocessor_config.json")? else {
            return Ok(spec);
        };
        let kind =
            |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        if kind(&pre, "image_processor_type").starts_with("Qwen2VLImageProcessor") {
            let image = Qwen2VlConfig::from_preprocessor_config(&pre)
                .map_err(in_file("preprocessor_config.json"))?;
            let video = match read("video_preprocessor_config.json")? {
                Some(v) => Qwen2VlConfig::from_preprocessor_config(&v)
                    .map_err(in_file("video_preprocessor_config.json"))?,
                None => image.clone(),
            };
            spec.image = Some(ImageProcessor::Qwen2Vl(image));
            spec.video = Some(video);
        }
        if kind(&pre, "feature_extractor_type") == "WhisperFeatureExtractor" {
            spec.audio = Some(
                WhisperFeatureConfig::from_preprocessor_config(&pre)
                    .map_err(in_file("preprocessor_config.json"))?,
            );
        }
        Ok(spec)
    }

    /// The modalities this spec can process.
    pub fn modalities(&self) -> Vec<Modality> {
        let mut out = Vec::new();
        if self.image.is_some() {
            out.push(Modality::Image);
        }
        if self.audio.is_some() {
            out.push(Modality::Audio);
        }
        if self.video.is_some() {
            out.push(Modality::Video);
        }
        out
    }
}
