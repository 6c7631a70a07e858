//! Media in, tensors out.
//!
//! Everything between a content part's URL and the tensor a model consumes:
//!
//! * [`fetch`]: `data:`, `http(s)` and `file:` URLs under the rules of
//!   CONTRACT section 4 (SSRF refusal, pinned addresses, hand-followed
//!   redirects, size caps while streaming, per-modality timeouts);
//! * [`image`], [`audio`], [`video`]: decoding with caps checked before the
//!   work they protect, and the model-side processors (CLIP/SigLIP resize and
//!   normalise, Qwen2-VL smart resize into patches, Whisper log-mel, uniform
//!   frame sampling);
//! * [`pool`]: the bounded blocking pool all decoding runs on, so the async
//!   reactor never decodes and a flood of media gets a 503, not unbounded
//!   memory.

pub mod audio;
pub mod cache;
pub mod error;
pub mod fetch;
pub mod hash;
pub mod image;
pub mod pipeline;
pub mod pool;
pub mod video;

pub use error::PreprocessError;
pub use hash::ContentHash;

/// The three media modalities, as CONTRACT section 4 and `--limit-mm-per-prompt` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    Image,
    Audio,
    Video,
}

impl Modality {
    /// The name used in kwargs, limits and messages (`image`, `audio`, `video`).
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
            Modality::Video => "video",
        }
    }

    /// Parses `image` / `audio` / `video`.
    pub fn parse(name: &str) -> Option<Modality> {
        match name {
            "image" => Some(Modality::Image),
            "audio" => Some(Modality::Audio),
            "video" => Some(Modality::Video),
            _ => None,
        }
    }
}

impl std::fmt::Display for Modality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
