//! The media types that cross crates, owned here so each hand-off has one definition:
//! `preprocess` produces [`ProcessedMedia`], the gateway passes it through untouched, and the
//! engine consumes it. The number of placeholder tokens an item takes is counted once, in
//! [`tokens`], by the engine (and by anything that must predict it, with the same functions).
//! What media a model takes and how its processor shapes them is its [`spec::ModelMediaSpec`],
//! loaded by the engine with the model and run by `preprocess`.

mod hash;
pub mod spec;
mod tensor;
pub mod tokens;

pub use hash::ContentHash;
pub use tensor::{AudioFeatures, MediaTensor, PixelValues, ProcessedImage, ProcessedMedia};

/// The three media modalities, as CONTRACT section 4 and `--limit-mm-per-prompt` name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    Image,
    Audio,
    Video,
}

impl Modality {
    pub const ALL: [Modality; 3] = [Modality::Image, Modality::Audio, Modality::Video];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in Modality::ALL {
            assert_eq!(Modality::parse(m.as_str()), Some(m));
            assert_eq!(m.to_string(), m.as_str());
        }
        assert_eq!(Modality::parse("text"), None);
    }
}
