//! What an item will cost, from its header alone: the placeholder tokens it will take in the
//! prompt and the bytes its decoding will hold. Both are known before any pixel or sample is
//! decoded, so a limit can refuse the item before the work it protects (CONTRACT section 11).
//!
//! The token count goes through the same steps as the processors (the merged kwargs,
//! `smart_resize`, the video frame sampling, the resampled length and the mel window) and ends
//! in the one count, [`media::tokens`], that the engine expands the prompt with. An item whose
//! header cannot be read has no estimate here and falls through to the decoders, which have
//! their own caps.

use std::io::Cursor;

use bytes::Bytes;
use image::metadata::Orientation;
use image::{ImageDecoder, ImageReader};
use policies::ProcessorOptions;

use crate::audio::{declared_frames, resampled_len, WhisperFeatureConfig};
use crate::image::{ImageProcessor, PatchProcessor, Qwen2VlConfig};
use crate::video::{self, sample_indices, VideoIoOptions, VideoLimits, JPEG_LIST_FPS};

/// An item's cost as its header declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Placeholder tokens; `None` where the processor's output has no patch grid (CLIP).
    pub tokens: Option<usize>,
    /// Bytes the decoded media and its tensor hold while the item is processed.
    pub decoded_bytes: usize,
    /// The size the header declares, for messages (`4000x3000 pixels`, `12.0 s`).
    pub size: String,
}

/// Bytes of an 8-bit RGB buffer.
fn rgb_bytes(width: u32, height: u32) -> usize {
    (width as usize)
        .saturating_mul(height as usize)
        .saturating_mul(3)
}

/// Width and height as the decoder will hand them over: after the EXIF orientation, which
/// swaps the sides of a photo taken upright.
pub fn image_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    reader.format()?;
    let mut decoder = reader.into_decoder().ok()?;
    let (width, height) = decoder.dimensions();
    let turned = matches!(
        decoder.orientation().ok(),
        Some(
            Orientation::Rotate90
                | Orientation::Rotate270
                | Orientation::Rotate90FlipH
                | Orientation::Rotate270FlipH
        )
    );
    Some(if turned {
        (height, width)
    } else {
        (width, height)
    })
}

/// Tokens and tensor bytes of `frames` frames of `width x height` through the Qwen2-VL
/// processor with the request's processor options (the same grid its `process_frames` computes).
fn qwen_frames(
    q: &Qwen2VlConfig,
    options: &ProcessorOptions,
    frames: usize,
    width: u32,
    height: u32,
) -> Option<(usize, usize)> {
    let q = q.clone().with_options(options).ok()?;
    let (rh, rw) = q.smart_resize(height, width).ok()?;
    let p = q.patch_size.max(1);
    let tp = q.temporal_patch_size.max(1);
    let grid = [frames.div_ceil(tp), rh as usize / p, rw as usize / p];
    let tokens = media::tokens::vision(grid, q.merge_size);
    // The float patches hold every temporal slot (the last frame repeated), plus the resized
    // frames of one temporal patch at a time.
    let values = grid[0] * grid[1] * grid[2] * 3 * tp * p * p;
    let bytes = values
        .saturating_mul(4)
        .saturating_add(rgb_bytes(rw, rh).saturating_mul(tp));
    Some((tokens, bytes))
}

/// An image under `processor`; `None` when the header is unreadable or over the pixel cap
/// (the decoder then refuses it with its own message).
pub fn image(
    bytes: &[u8],
    processor: &ImageProcessor,
    options: &ProcessorOptions,
    max_pixels: u64,
) -> Option<Estimate> {
    let (width, height) = image_size(bytes)?;
    if u64::from(width) * u64::from(height) > max_pixels {
        return None;
    }
    // The decoded buffer, then its RGB copy when the source is not 8-bit RGB.
    let decoded = rgb_bytes(width, height).saturating_mul(2);
    let (tokens, tensor) = match processor {
        ImageProcessor::Qwen2Vl(q) => {
            let (tokens, tensor) = qwen_frames(q, options, 1, width, height)?;
            (Some(tokens), tensor)
        }
        ImageProcessor::Clip(_) => (None, 0),
    };
    Some(Estimate {
        tokens,
        decoded_bytes: decoded.saturating_add(tensor),
        size: format!("{width}x{height} pixels"),
    })
}

/// An audio clip whose container declares its length; the features cover at most the
/// processor's window, so the tokens are those of the window's share of the clip.
pub fn audio(bytes: &[u8], mime: Option<&str>, cfg: &WhisperFeatureConfig) -> Option<Estimate> {
    let (frames, rate) = declared_frames(bytes, mime)?;
    let frames = usize::try_from(frames).ok()?;
    let samples = resampled_len(frames, rate, cfg.sample_rate)?;
    let tokens = media::tokens::audio(cfg.valid_frames(samples));
    // Mono samples as decoded and as resampled, then the features.
    let decoded = frames
        .saturating_add(samples)
        .saturating_add(cfg.n_mels.saturating_mul(cfg.n_frames()))
        .saturating_mul(4);
    Some(Estimate {
        tokens: Some(tokens),
        decoded_bytes: decoded,
        size: format!("{:.1} s", frames as f64 / f64::from(rate)),
    })
}

/// A video of `total` frames of `width x height` at `fps`, sampled as the decoder will.
fn video_frames(
    q: &Qwen2VlConfig,
    options: &ProcessorOptions,
    opts: &VideoIoOptions,
    total: usize,
    fps: f64,
    (width, height): (u32, u32),
) -> Option<Estimate> {
    let kept = sample_indices(total, fps, opts).len();
    let (tokens, tensor) = qwen_frames(q, options, kept, width, height)?;
    Some(Estimate {
        tokens: Some(tokens),
        decoded_bytes: rgb_bytes(width, height)
            .saturating_mul(kept)
            .saturating_add(tensor),
        size: format!("{kept} frames of {width}x{height} pixels"),
    })
}

/// A `data:video/jpeg;base64,...` frame list: its frame count and first frame's header.
pub fn jpeg_frames(
    frames: &[Bytes],
    q: &Qwen2VlConfig,
    options: &ProcessorOptions,
    opts: &VideoIoOptions,
) -> Option<Estimate> {
    let size = video::jpeg_size(frames.first()?, 0).ok()?;
    video_frames(q, options, opts, frames.len(), JPEG_LIST_FPS, size)
}

/// A video container whose header declares its frame count (the decoder counts the packets
/// and may find a few more or fewer; the sampled count is `num_frames` either way once the
/// video is longer than that).
pub fn container(
    bytes: &[u8],
    q: &Qwen2VlConfig,
    options: &ProcessorOptions,
    opts: &VideoIoOptions,
    limits: &VideoLimits,
) -> Option<Estimate> {
    let header = video::probe_video(bytes, limits)?;
    let total = usize::try_from(header.claimed_frames)
        .ok()
        .filter(|n| *n > 0)?;
    video_frames(
        q,
        options,
        opts,
        total,
        header.fps,
        (header.width, header.height),
    )
}

/// The most bytes one request's processed media can hold under `spec`, whatever its items'
/// sizes: the patches `max_tokens` placeholder tokens allow (images and video together share
/// the tokens), `image_items` fixed-size CLIP tensors, and `audio_items` clips' features (a
/// whole window each, however short the clip). A term of the deployment's memory bound.
pub fn request_tensor_bytes(
    spec: &media::spec::ModelMediaSpec,
    max_tokens: usize,
    image_items: usize,
    audio_items: usize,
) -> u64 {
    let patches = |q: &Qwen2VlConfig| {
        let per_token = q.merge_size * q.merge_size;
        let values = 3 * q.temporal_patch_size * q.patch_size * q.patch_size;
        max_tokens as u64 * (per_token * values) as u64 * 4
    };
    let image = match &spec.image {
        Some(ImageProcessor::Qwen2Vl(q)) => patches(q),
        Some(ImageProcessor::Clip(_)) => {
            image_items as u64 * crate::image::MAX_PATCH_VALUES as u64 * 4
        }
        None => 0,
    };
    let video = spec.video.as_ref().map_or(0, patches);
    let audio = spec.audio.as_ref().map_or(0, |a| {
        audio_items.min(max_tokens) as u64 * (a.n_mels * a.n_frames()) as u64 * 4
    });
    image.max(video).saturating_add(audio)
}
