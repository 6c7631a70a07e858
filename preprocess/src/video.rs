//! Video: decoding under caps, and vLLM's uniform frame sampling.
//!
//! * [`VideoIoOptions::new`] takes the typed `video` entry of
//!   `media_io_kwargs` (`num_frames`, `fps`, `max_duration`).
//! * [`sample_indices`] chooses the frames to keep, as vLLM's OpenCV loader
//!   does (`np.linspace(0, total - 1, n, dtype=int)`).
//! * [`decode_video`] decodes a container from memory with FFmpeg (custom
//!   `AVIOContext` over the bytes, no temporary file), checks the stream's
//!   size before any frame is decoded, walks the packets under a frame cap and
//!   a time budget, and converts to RGB only the frames it keeps. Without the
//!   `video` feature it returns [`VideoError::NotCompiled`].
//! * [`decode_jpeg_frames`] handles `data:video/jpeg;base64,<f1>,<f2>,...`
//!   frame lists with the `image` crate (no FFmpeg needed).
//!
//! The first [`decode_video`] call sets three process-wide FFmpeg settings:
//! its error strings, the log level (fatal only: damaged untrusted input
//! would flood stderr) and `av_max_alloc` (512 MiB per allocation).

use std::io::Cursor;
use std::time::{Duration, Instant};

use bytes::Bytes;
use image::codecs::jpeg::JpegDecoder;
use image::{DynamicImage, ImageDecoder, RgbImage};
use policies::VideoLoadOptions;

#[cfg(feature = "video")]
mod decode;
#[cfg(feature = "video")]
mod demux;

/// `num_frames` of vLLM's `VideoMediaIO`.
pub const DEFAULT_NUM_FRAMES: usize = 32;

/// The frame rate assumed for a `video/jpeg` frame list (which carries none).
pub const JPEG_LIST_FPS: f64 = 1.0;

/// Errors of video decoding and sampling; each is a 400 naming the problem.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum VideoError {
    #[error("The video is empty.")]
    Empty,
    #[error("The video is {width}x{height}, over the limit of {max_width}x{max_height}.")]
    TooLarge {
        width: u32,
        height: u32,
        max_width: u32,
        max_height: u32,
    },
    #[error("The video's frames are {width}x{height} ({pixels} pixels), over the limit of {max} pixels per frame.")]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        max: u64,
    },
    #[error("The sampled frames would hold {pixels} pixels, over the limit of {max}.")]
    TooManyTotalPixels { pixels: u64, max: u64 },
    #[error("The video would yield {frames} frames, over the limit of {max}.")]
    TooManyFrames { frames: usize, max: usize },
    #[error("The video has {frames} frames, over the limit of {max} frames scanned.")]
    TooLong { frames: u64, max: u64 },
    #[error("Cannot decode the video: {0}")]
    Decode(String),
    #[error("Frame {index} of the video/jpeg frame list is not a JPEG image.")]
    NotJpeg { index: usize },
    #[error("Frame {index} of the video/jpeg frame list is {width}x{height}, but frame 0 is {first_width}x{first_height}.")]
    FrameSizeMismatch {
        index: usize,
        width: u32,
        height: u32,
        first_width: u32,
        first_height: u32,
    },
    #[error("Decoding the video took longer than {seconds} s.")]
    Timeout { seconds: f64 },
    #[error(
        "Video decoding is not available in this build (compiled without the `video` feature)."
    )]
    NotCompiled,
}

/// How a video is sampled: the `video` entry of `media_io_kwargs`.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoIoOptions {
    /// Frames to keep, sampled uniformly. [`VideoIoOptions::ALL_FRAMES`]
    /// or `0` keeps every frame considered
    /// (still under [`VideoLimits::max_frames`]).
    pub num_frames: usize,
    /// Target sampling rate in frames per second; fewer frames are kept when
    /// the video is short (see [`sample_indices`]).
    pub fps: Option<f64>,
    /// Only the first `max_duration_s` seconds of the video are considered.
    pub max_duration_s: Option<f64>,
}

impl Default for VideoIoOptions {
    fn default() -> Self {
        VideoIoOptions {
            num_frames: DEFAULT_NUM_FRAMES,
            fps: None,
            max_duration_s: None,
        }
    }
}

impl VideoIoOptions {
    /// Every frame (for callers; a request's `num_frames` is a positive count).
    pub const ALL_FRAMES: usize = usize::MAX;

    /// How a request's video is sampled: its typed `media_io_kwargs.video`.
    pub fn new(load: &VideoLoadOptions) -> Self {
        VideoIoOptions {
            num_frames: load.num_frames.map_or(DEFAULT_NUM_FRAMES, |n| n as usize),
            fps: load.fps,
            max_duration_s: load.max_duration_s,
        }
    }
}

/// Caps on what one video may cost; all are checked before the work they protect.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoLimits {
    /// Frames returned, at most.
    pub max_frames: usize,
    pub max_width: u32,
    pub max_height: u32,
    /// Pixels in one frame, at most (also handed to the decoder, so a stream
    /// that changes size mid-way cannot allocate more).
    pub max_pixels_per_frame: u64,
    /// Pixels over all returned frames, at most (bounds the output's memory).
    pub max_total_pixels: u64,
    /// Packets or frames walked, at most (also the largest frame count a
    /// video may have).
    pub max_total_frames_scanned: u64,
    /// Wall time for one decode, checked while reading and between packets.
    pub time_budget: Duration,
    /// FFmpeg decoder threads (0: FFmpeg chooses).
    pub decoder_threads: usize,
}

impl Default for VideoLimits {
    /// 1024 frames, 8192x8192, 8K UHD pixels per frame, 2^29 pixels in all
    /// (1.5 GiB of RGB), 100,000 frames scanned, 30 s, 2 threads.
    fn default() -> Self {
        VideoLimits {
            max_frames: 1024,
            max_width: 8192,
            max_height: 8192,
            max_pixels_per_frame: 8192 * 4320,
            max_total_pixels: 1 << 29,
            max_total_frames_scanned: 100_000,
            time_budget: Duration::from_secs(30),
            decoder_threads: 2,
        }
    }
}

/// The frames kept from one video, with where they came from.
#[derive(Debug, Clone)]
pub struct DecodedVideo {
    /// Packed RGB, all `width` x `height`, in presentation order.
    pub frames: Vec<RgbImage>,
    /// Presentation time of each frame in seconds, from the stream's start
    /// (index / fps when the stream's timestamps are missing or damaged).
    pub timestamps_s: Vec<f64>,
    /// Index of each frame among all the video's frames.
    pub frame_indices: Vec<usize>,
    /// The stream's frame rate (FFmpeg's guess from the container and codec).
    pub source_fps: f64,
    /// Frames in the video: the container's count, else the packets counted.
    pub total_frames: usize,
    pub duration_s: f64,
    pub width: u32,
    pub height: u32,
}

/// The frame indices to keep out of `total_frames`, following vLLM's
/// `OpenCVVideoBackend.load_bytes` (v0.11 and later):
///
/// 1. `max_duration_s` (ours; vLLM's base OpenCV backend ignores it) limits
///    the frames considered to the first `ceil(max_duration_s * source_fps)`;
/// 2. `n` = the frames considered, capped by `num_frames` when positive, and
///    by `floor(duration * fps)` when `fps` is set (the smaller wins; the
///    duration is that of the frames considered, and `fps` is ignored when
///    `source_fps` is not positive), and at least 1;
/// 3. if `n` equals the frames considered, all of them; else
///    `np.linspace(0, considered - 1, n)` truncated to integers (numpy's
///    float64 arithmetic, the last index exactly `considered - 1`).
///
/// The result is strictly increasing; empty only when `total_frames` is 0.
pub fn sample_indices(total_frames: usize, source_fps: f64, opts: &VideoIoOptions) -> Vec<usize> {
    if total_frames == 0 {
        return Vec::new();
    }
    let fps_known = source_fps.is_finite() && source_fps > 0.0;
    let mut considered = total_frames;
    if let (Some(max_s), true) = (opts.max_duration_s, fps_known) {
        let cap = (max_s * source_fps).ceil();
        if cap.is_finite() && cap >= 1.0 && cap < total_frames as f64 {
            // In range: cap < total_frames, so the cast cannot truncate.
            considered = cap as usize;
        } else if cap < 1.0 {
            considered = 1;
        }
    }
    let mut n = considered;
    if opts.num_frames > 0 {
        n = n.min(opts.num_frames);
    }
    if let (Some(fps), true) = (opts.fps, fps_known) {
        let by_rate = (considered as f64 / source_fps * fps).floor();
        if by_rate.is_finite() && by_rate < n as f64 {
            n = if by_rate < 0.0 { 0 } else { by_rate as usize };
        }
    }
    let n = n.max(1);
    if n >= considered {
        return (0..considered).collect();
    }
    if n == 1 {
        return vec![0];
    }
    let stop = (considered - 1) as f64;
    let step = stop / (n - 1) as f64;
    (0..n)
        .map(|i| {
            if i + 1 == n {
                considered - 1
            } else {
                // 0 <= i * step < stop, so the cast is exact truncation.
                (i as f64 * step) as usize
            }
        })
        .collect()
}

/// What a container's header says about its video stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoHeader {
    pub width: u32,
    pub height: u32,
    /// The stream's frame rate (FFmpeg's guess), 0 when unknown.
    pub fps: f64,
    /// The container's frame count, 0 when it has none.
    pub claimed_frames: u64,
}

/// Reads a container's header (no frame is decoded); `None` when it cannot be read or
/// FFmpeg is not compiled in.
pub fn probe_video(bytes: &[u8], limits: &VideoLimits) -> Option<VideoHeader> {
    #[cfg(feature = "video")]
    {
        decode::probe(bytes, limits).ok()
    }
    #[cfg(not(feature = "video"))]
    {
        let _ = (bytes, limits);
        None
    }
}

/// Decodes a video container (mp4, webm, mkv, avi, ...) from memory and keeps
/// the frames [`sample_indices`] chooses. See the module doc for the caps.
pub fn decode_video(
    bytes: &[u8],
    opts: &VideoIoOptions,
    limits: &VideoLimits,
) -> Result<DecodedVideo, VideoError> {
    if bytes.is_empty() {
        return Err(VideoError::Empty);
    }
    #[cfg(feature = "video")]
    {
        decode::decode(bytes, opts, limits)
    }
    #[cfg(not(feature = "video"))]
    {
        let _ = (opts, limits);
        Err(VideoError::NotCompiled)
    }
}

/// Decodes a `data:video/jpeg;base64,<f1>,<f2>,...` frame list.
///
/// Every frame's header is read first (it must be a JPEG, within the size
/// caps, and the same size as frame 0), then only the frames
/// [`sample_indices`] keeps are decoded.
///
/// The list carries no frame rate. vLLM (0.11+) decodes the list and reports
/// `fps` from `media_io_kwargs.video.fps`, else 1, and keeps the first
/// `num_frames` frames rather than sampling; older vLLM kept every frame. Here
/// the list is taken as a clip at [`JPEG_LIST_FPS`] (1 fps, so timestamps are
/// the frame indices in seconds) and sampled like any video: `num_frames`
/// uniformly, `fps` and `max_duration` relative to that 1 fps.
pub fn decode_jpeg_frames(
    frames: &[Bytes],
    opts: &VideoIoOptions,
    limits: &VideoLimits,
) -> Result<DecodedVideo, VideoError> {
    let deadline = Deadline::new(limits.time_budget);
    if frames.is_empty() {
        return Err(VideoError::Empty);
    }
    let total = frames.len();
    if total as u64 > limits.max_total_frames_scanned {
        return Err(VideoError::TooLong {
            frames: total as u64,
            max: limits.max_total_frames_scanned,
        });
    }
    let mut size = None;
    for (index, frame) in frames.iter().enumerate() {
        let (width, height) = jpeg_size(frame, index)?;
        match size {
            None => {
                check_size(width, height, limits)?;
                size = Some((width, height));
            }
            Some((first_width, first_height)) if (width, height) != (first_width, first_height) => {
                return Err(VideoError::FrameSizeMismatch {
                    index,
                    width,
                    height,
                    first_width,
                    first_height,
                });
            }
            Some(_) => {}
        }
        deadline.check()?;
    }
    let Some((width, height)) = size else {
        return Err(VideoError::Empty);
    };
    let indices = sample_indices(total, JPEG_LIST_FPS, opts);
    check_output(indices.len(), width, height, limits)?;
    let mut out = Vec::with_capacity(indices.len());
    for &index in &indices {
        let data = frames.get(index).ok_or(VideoError::Empty)?;
        out.push(decode_jpeg(data, index, limits)?);
        deadline.check()?;
    }
    Ok(DecodedVideo {
        frames: out,
        timestamps_s: indices.iter().map(|&i| i as f64 / JPEG_LIST_FPS).collect(),
        frame_indices: indices,
        source_fps: JPEG_LIST_FPS,
        total_frames: total,
        duration_s: total as f64 / JPEG_LIST_FPS,
        width,
        height,
    })
}

pub(crate) fn jpeg_size(data: &[u8], index: usize) -> Result<(u32, u32), VideoError> {
    if image::guess_format(data).ok() != Some(image::ImageFormat::Jpeg) {
        return Err(VideoError::NotJpeg { index });
    }
    let decoder = JpegDecoder::new(Cursor::new(data))
        .map_err(|e| VideoError::Decode(format!("frame {index}: {e}")))?;
    Ok(decoder.dimensions())
}

fn decode_jpeg(data: &[u8], index: usize, limits: &VideoLimits) -> Result<RgbImage, VideoError> {
    let mut decoder = JpegDecoder::new(Cursor::new(data))
        .map_err(|e| VideoError::Decode(format!("frame {index}: {e}")))?;
    let mut image_limits = image::Limits::default();
    // The largest buffer a pixel may need (CMYK in, RGB out), with headroom.
    image_limits.max_alloc = Some(limits.max_pixels_per_frame.saturating_mul(8).max(1 << 20));
    decoder
        .set_limits(image_limits)
        .map_err(|e| VideoError::Decode(format!("frame {index}: {e}")))?;
    let image = DynamicImage::from_decoder(decoder)
        .map_err(|e| VideoError::Decode(format!("frame {index}: {e}")))?;
    Ok(match image {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    })
}

/// The per-frame caps: width, height and pixels.
pub(crate) fn check_size(width: u32, height: u32, limits: &VideoLimits) -> Result<(), VideoError> {
    if width > limits.max_width || height > limits.max_height {
        return Err(VideoError::TooLarge {
            width,
            height,
            max_width: limits.max_width,
            max_height: limits.max_height,
        });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels_per_frame {
        return Err(VideoError::TooManyPixels {
            width,
            height,
            pixels,
            max: limits.max_pixels_per_frame,
        });
    }
    if pixels == 0 {
        return Err(VideoError::Decode("the video has no pixels".to_owned()));
    }
    Ok(())
}

/// The output caps: frames kept and their pixels in all.
pub(crate) fn check_output(
    frames: usize,
    width: u32,
    height: u32,
    limits: &VideoLimits,
) -> Result<(), VideoError> {
    if frames > limits.max_frames {
        return Err(VideoError::TooManyFrames {
            frames,
            max: limits.max_frames,
        });
    }
    let pixels = (frames as u64).saturating_mul(u64::from(width) * u64::from(height));
    if pixels > limits.max_total_pixels {
        return Err(VideoError::TooManyTotalPixels {
            pixels,
            max: limits.max_total_pixels,
        });
    }
    Ok(())
}

/// When a decode must be done by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Option<Instant>,
    budget: Duration,
}

impl Deadline {
    pub(crate) fn new(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(budget),
            budget,
        }
    }

    pub(crate) fn passed(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    pub(crate) fn error(&self) -> VideoError {
        VideoError::Timeout {
            seconds: self.budget.as_secs_f64(),
        }
    }

    pub(crate) fn check(&self) -> Result<(), VideoError> {
        if self.passed() {
            Err(self.error())
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(num_frames: usize, fps: Option<f64>, max_duration_s: Option<f64>) -> VideoIoOptions {
        VideoIoOptions {
            num_frames,
            fps,
            max_duration_s,
        }
    }

    #[test]
    fn linspace_matches_numpy() {
        // np.linspace(0, 299, 32, dtype=int)[:6] (the anchor's first indices).
        let idx = sample_indices(300, 30.0, &VideoIoOptions::default());
        assert_eq!(idx.len(), 32);
        assert_eq!(&idx[..6], &[0, 9, 19, 28, 38, 48]);
        assert_eq!(idx.last(), Some(&299));
        // np.linspace(0, 49, 8, dtype=int)
        assert_eq!(
            sample_indices(50, 25.0, &opts(8, None, None)),
            vec![0, 7, 14, 21, 28, 35, 42, 49]
        );
        // np.linspace(0, 9, 4, dtype=int)
        assert_eq!(
            sample_indices(10, 25.0, &opts(4, None, None)),
            vec![0, 3, 6, 9]
        );
        assert!(idx.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn all_frames_when_fewer_than_wanted() {
        assert_eq!(
            sample_indices(5, 25.0, &opts(32, None, None)),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(
            sample_indices(5, 25.0, &opts(VideoIoOptions::ALL_FRAMES, None, None)),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(sample_indices(3, 25.0, &opts(0, None, None)), vec![0, 1, 2]);
        assert_eq!(sample_indices(7, 25.0, &opts(1, None, None)), vec![0]);
        assert!(sample_indices(0, 25.0, &VideoIoOptions::default()).is_empty());
    }

    #[test]
    fn fps_caps_the_count() {
        // 50 frames at 25 fps = 2 s; 2 fps -> floor(2 * 2) = 4 frames.
        assert_eq!(
            sample_indices(50, 25.0, &opts(32, Some(2.0), None)),
            vec![0, 16, 32, 49]
        );
        // num_frames smaller than the rate's count wins.
        assert_eq!(
            sample_indices(50, 25.0, &opts(2, Some(10.0), None)),
            vec![0, 49]
        );
        // A very low rate still keeps one frame.
        assert_eq!(
            sample_indices(50, 25.0, &opts(32, Some(0.01), None)),
            vec![0]
        );
        // Unknown source rate: fps is ignored.
        assert_eq!(sample_indices(4, 0.0, &opts(32, Some(0.01), None)).len(), 4);
    }

    #[test]
    fn max_duration_limits_the_frames_considered() {
        // 1 s of a 25 fps video: frames 0..=24.
        let idx = sample_indices(50, 25.0, &opts(32, None, Some(1.0)));
        assert_eq!(idx, (0..25).collect::<Vec<_>>());
        let idx = sample_indices(300, 30.0, &opts(4, None, Some(2.0)));
        assert_eq!(idx, vec![0, 19, 39, 59]);
        // Longer than the video: no effect.
        assert_eq!(
            sample_indices(10, 25.0, &opts(32, None, Some(100.0))).len(),
            10
        );
    }

    #[test]
    fn request_options_set_the_sampling() {
        assert_eq!(
            VideoIoOptions::new(&VideoLoadOptions::default()),
            VideoIoOptions::default()
        );
        let o = VideoIoOptions::new(&VideoLoadOptions {
            num_frames: Some(8),
            fps: Some(2.0),
            max_duration_s: Some(1.5),
        });
        assert_eq!(o, opts(8, Some(2.0), Some(1.5)));
    }

    #[test]
    fn messages() {
        let e = VideoError::TooLarge {
            width: 40000,
            height: 40000,
            max_width: 8192,
            max_height: 8192,
        };
        assert_eq!(
            e.to_string(),
            "The video is 40000x40000, over the limit of 8192x8192."
        );
        let e = VideoError::Timeout { seconds: 10.0 };
        assert_eq!(e.to_string(), "Decoding the video took longer than 10 s.");
    }

    #[test]
    fn deadline_of_zero_has_passed() {
        let d = Deadline::new(Duration::ZERO);
        assert!(d.passed());
        assert_eq!(d.check(), Err(VideoError::Timeout { seconds: 0.0 }));
        assert!(Deadline::new(Duration::from_secs(60)).check().is_ok());
    }
}
