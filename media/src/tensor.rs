//! Owned tensors of processed media, with what the encoders need beside the numbers (patch
//! grids, valid audio frames).

use crate::{ContentHash, Modality};

/// A float tensor with its shape (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

/// What an image processor gives the model for one image (or one video's frames).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    pub pixel_values: PixelValues,
    /// `[t, h, w]` in patches, for patch-based processors (Qwen2-VL); `None` for processors
    /// that resize to a fixed square (CLIP, SigLIP).
    pub grid_thw: Option<[usize; 3]>,
}

impl ProcessedImage {
    /// Bytes held (for cache budgets).
    pub fn weight_bytes(&self) -> usize {
        std::mem::size_of_val(self.pixel_values.data.as_slice())
    }
}

/// Log-mel features.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioFeatures {
    /// `[n_mels, n_frames]`, row-major.
    pub data: Vec<f32>,
    pub n_mels: usize,
    /// 3000 for Whisper's 30 s window.
    pub n_frames: usize,
    /// Frames covering real audio before the padding: `ceil(len / hop)`, at most `n_frames`.
    pub valid_frames: usize,
}

impl AudioFeatures {
    /// Bytes the feature tensor occupies.
    pub fn weight_bytes(&self) -> usize {
        std::mem::size_of_val(self.data.as_slice())
    }
}

/// The tensor of one processed item.
#[derive(Debug, Clone, PartialEq)]
pub enum MediaTensor {
    Image(ProcessedImage),
    Video {
        frames: ProcessedImage,
        /// Seconds from the start of the video, one per sampled frame.
        timestamps_s: Vec<f64>,
    },
    Audio(AudioFeatures),
}

impl MediaTensor {
    pub fn modality(&self) -> Modality {
        match self {
            MediaTensor::Image(_) => Modality::Image,
            MediaTensor::Video { .. } => Modality::Video,
            MediaTensor::Audio(_) => Modality::Audio,
        }
    }

    /// Bytes held (for cache and in-flight budgets).
    pub fn weight_bytes(&self) -> usize {
        match self {
            MediaTensor::Image(p) => p.weight_bytes(),
            MediaTensor::Video {
                frames,
                timestamps_s,
            } => frames.weight_bytes() + std::mem::size_of_val(timestamps_s.as_slice()),
            MediaTensor::Audio(a) => a.weight_bytes(),
        }
    }
}

/// One processed media item, in prompt order.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedMedia {
    /// Over the item's bytes and the options that shaped its tensor: the prefix cache's key.
    pub hash: ContentHash,
    pub tensor: MediaTensor,
}

impl ProcessedMedia {
    pub fn modality(&self) -> Modality {
        self.tensor.modality()
    }
}
