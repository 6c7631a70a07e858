//! Images: decoding under a pixel cap, and the model-side processors.
//!
//! * [`decode_image`] sniffs the format (JPEG, PNG, WebP, GIF, BMP), reads the
//!   dimensions from the header and refuses an image over the pixel cap
//!   before a pixel buffer exists, bounds the decoder's allocations
//!   (`image::Limits`), takes a GIF's first frame only, applies the EXIF
//!   orientation and converts to the `image_mode` of media_io_kwargs
//!   (compositing alpha onto `rgba_background_color`, as vLLM does).
//! * [`ClipConfig`]: CLIP/SigLIP-style resize (+ optional center crop),
//!   rescale and normalise into a CHW f32 tensor.
//! * [`Qwen2VlConfig`]: Qwen2-VL's smart resize driven by `min_pixels` /
//!   `max_pixels`, then the flattened patches in the reference processor's
//!   element order, with the grid and the placeholder count.
//!
//! Resizing is `fast_image_resize` (SIMD; Pillow's convolution resampling,
//! so `bicubic` here is Pillow's BICUBIC, a = -0.5). Rescale and normalise are
//! one table lookup per byte.

use std::io::Cursor;

use fast_image_resize::{FilterType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageDecoder, ImageReader, RgbImage};
use policies::{ImageLoadOptions, ProcessorOptions};

/// The most values one processed image or video may hold (512 MiB of f32): with the default
/// 32 frames at Qwen2-VL's largest default size a video needs 96 M.
pub const MAX_PATCH_VALUES: usize = 128 << 20;

/// The pixel cap's default (vLLM / Pillow's `MAX_IMAGE_PIXELS` x 2).
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

pub use media::spec::{
    ClipConfig, ImageProcessor, Qwen2VlConfig, ResizeTo, CLIP_MEAN, CLIP_STD, SIGLIP_MEAN,
    SIGLIP_STD,
};

/// Errors of image decoding and processing; each is a 400 naming the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("The image is {width}x{height} pixels ({pixels}), over the limit of {max}.")]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        max: u64,
    },
    #[error("Cannot decode the image: {0}")]
    Decode(String),
    #[error("The image format is not supported (supported: JPEG, PNG, WebP, GIF, BMP).")]
    UnsupportedFormat,
    #[error("Invalid image processor setting {key}: {reason}")]
    InvalidConfig { key: String, reason: String },
    #[error("The image is {width}x{height}; it cannot be resized for this model ({reason}).")]
    BadSize {
        width: u32,
        height: u32,
        reason: String,
    },
}

pub use policies::ImageMode;

/// How images are read: the `image` entry of media_io_kwargs plus the pixel cap.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageIoOptions {
    pub image_mode: ImageMode,
    pub rgba_background_color: [u8; 3],
    pub max_pixels: u64,
}

impl Default for ImageIoOptions {
    fn default() -> Self {
        ImageIoOptions {
            image_mode: ImageMode::Rgb,
            rgba_background_color: [255, 255, 255],
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

impl ImageIoOptions {
    /// How a request's images are read: its typed `media_io_kwargs.image` under the server's
    /// pixel cap.
    pub fn new(load: &ImageLoadOptions, max_pixels: u64) -> Self {
        ImageIoOptions {
            image_mode: load.image_mode,
            rgba_background_color: load.rgba_background_color,
            max_pixels,
        }
    }
}

/// A decoded image in the requested mode.
#[derive(Debug, Clone)]
pub struct DecodedImage {
    /// In [`ImageIoOptions::image_mode`].
    pub image: DynamicImage,
    /// Size as stored, before the EXIF orientation.
    pub stored_width: u32,
    pub stored_height: u32,
}

impl DecodedImage {
    /// The image as 8-bit RGB (what the processors take).
    pub fn to_rgb(&self) -> RgbImage {
        match &self.image {
            DynamicImage::ImageRgb8(rgb) => rgb.clone(),
            other => other.to_rgb8(),
        }
    }

    /// The image as 8-bit RGB, without a copy when it already is.
    pub fn into_rgb(self) -> RgbImage {
        match self.image {
            DynamicImage::ImageRgb8(rgb) => rgb,
            other => other.to_rgb8(),
        }
    }
}

/// Decodes an image under the pixel cap (checked from the header, before decoding).
pub fn decode_image(bytes: &[u8], opts: &ImageIoOptions) -> Result<DecodedImage, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    if reader.format().is_none() {
        return Err(ImageError::UnsupportedFormat);
    }
    let mut decoder = reader.into_decoder().map_err(map_image_error)?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > opts.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            pixels,
            max: opts.max_pixels,
        });
    }
    if pixels == 0 {
        return Err(ImageError::Decode("the image has no pixels".to_owned()));
    }
    let mut limits = image::Limits::default();
    // The largest buffer a pixel can need (16-bit RGBA), for the largest image allowed.
    limits.max_alloc = Some(opts.max_pixels.saturating_mul(8).max(64 << 20));
    decoder.set_limits(limits).map_err(map_image_error)?;
    let orientation = decoder.orientation().ok();
    let mut image = DynamicImage::from_decoder(decoder).map_err(map_image_error)?;
    if let Some(orientation) = orientation {
        image.apply_orientation(orientation);
    }
    Ok(DecodedImage {
        image: convert_mode(image, opts.image_mode, opts.rgba_background_color),
        stored_width: width,
        stored_height: height,
    })
}

fn map_image_error(e: image::ImageError) -> ImageError {
    match e {
        image::ImageError::Unsupported(_) => ImageError::UnsupportedFormat,
        other => ImageError::Decode(other.to_string()),
    }
}

/// Converts to `mode`; alpha is composited onto `background` when the target has none.
fn convert_mode(image: DynamicImage, mode: ImageMode, background: [u8; 3]) -> DynamicImage {
    let has_alpha = image.color().has_alpha();
    match mode {
        ImageMode::Rgba => DynamicImage::ImageRgba8(image.into_rgba8()),
        ImageMode::La => DynamicImage::ImageLumaA8(image.into_luma_alpha8()),
        ImageMode::Rgb if has_alpha => DynamicImage::ImageRgb8(composite(&image, background)),
        ImageMode::Rgb => match image {
            DynamicImage::ImageRgb8(rgb) => DynamicImage::ImageRgb8(rgb),
            other => DynamicImage::ImageRgb8(other.into_rgb8()),
        },
        ImageMode::L if has_alpha => DynamicImage::ImageLuma8(
            DynamicImage::ImageRgb8(composite(&image, background)).into_luma8(),
        ),
        ImageMode::L => DynamicImage::ImageLuma8(image.into_luma8()),
    }
}

/// Alpha-composites onto an opaque background colour.
fn composite(image: &DynamicImage, background: [u8; 3]) -> RgbImage {
    let rgba = image.to_rgba8();
    let mut out = RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in out.pixels_mut().zip(rgba.pixels()) {
        let a = u32::from(src.0[3]);
        for ((d, s), bg) in dst.0.iter_mut().zip(src.0).zip(background) {
            let v = u32::from(s) * a + u32::from(bg) * (255 - a);
            *d = ((v + 127) / 255) as u8;
        }
    }
    out
}

pub use media::{PixelValues, ProcessedImage};

/// Per-channel lookup tables: byte -> (byte * rescale - mean) / std.
struct NormTable([[f32; 256]; 3]);

impl NormTable {
    fn new(rescale: f32, mean: [f32; 3], std: [f32; 3]) -> NormTable {
        let mut t = [[0f32; 256]; 3];
        for c in 0..3 {
            for (v, slot) in t[c].iter_mut().enumerate() {
                *slot = (v as f32 * rescale - mean[c]) / std[c];
            }
        }
        NormTable(t)
    }
}

fn bicubic_resize(src: &RgbImage, width: u32, height: u32) -> Result<RgbImage, ImageError> {
    if src.width() == width && src.height() == height {
        return Ok(src.clone());
    }
    let mut dst = RgbImage::new(width, height);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom));
    Resizer::new()
        .resize(src, &mut dst, &options)
        .map_err(|e| ImageError::BadSize {
            width: src.width(),
            height: src.height(),
            reason: e.to_string(),
        })?;
    Ok(dst)
}

/// What a model's image processor does with an image (its settings are the model's spec).
pub trait ProcessImage {
    /// The processor's tensor for one RGB image.
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage, ImageError>;
}

impl ProcessImage for ClipConfig {
    /// Resize (+ crop), rescale, normalise: a `[3, H, W]` tensor.
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage, ImageError> {
        let (w, h) = (image.width(), image.height());
        let (rh, rw) = match self.resize {
            ResizeTo::Exact { height, width } => (height, width),
            ResizeTo::ShortestEdge(s) => {
                let (short, long) = if w <= h { (w, h) } else { (h, w) };
                let other = (u64::from(s) * u64::from(long) / u64::from(short.max(1))) as u32;
                if w <= h {
                    (other.max(1), s)
                } else {
                    (s, other.max(1))
                }
            }
        };
        let resized = bicubic_resize(image, rw, rh)?;
        let (top, left, ch, cw) = match self.crop_size {
            Some((ch, cw)) if ch <= rh && cw <= rw => ((rh - ch) / 2, (rw - cw) / 2, ch, cw),
            Some((ch, cw)) => {
                return Err(ImageError::BadSize {
                    width: w,
                    height: h,
                    reason: format!("the crop {cw}x{ch} is larger than the resized {rw}x{rh}"),
                })
            }
            None => (0, 0, rh, rw),
        };
        let table = NormTable::new(self.rescale_factor, self.image_mean, self.image_std);
        let plane = (ch * cw) as usize;
        let mut data = vec![0f32; 3 * plane];
        let (r, rest) = data.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        let raw = resized.as_raw();
        let stride = rw as usize * 3;
        for y in 0..ch as usize {
            let row = &raw[(top as usize + y) * stride + left as usize * 3..][..cw as usize * 3];
            let base = y * cw as usize;
            for (x, px) in row.chunks_exact(3).enumerate() {
                r[base + x] = table.0[0][px[0] as usize];
                g[base + x] = table.0[1][px[1] as usize];
                b[base + x] = table.0[2][px[2] as usize];
            }
        }
        Ok(ProcessedImage {
            pixel_values: PixelValues {
                data,
                shape: vec![3, ch as usize, cw as usize],
            },
            grid_thw: None,
        })
    }
}

/// Qwen2-VL's patch processor: the pixel bounds a request may set, the reference smart resize,
/// and images or video frames into flattened patches.
pub trait PatchProcessor: Sized {
    /// Applies the request's `min_pixels` / `max_pixels` (merged mm_processor_kwargs) over
    /// the model's.
    fn with_options(self, options: &ProcessorOptions) -> Result<Self, ImageError>;
    /// The reference `smart_resize`: both sides multiples of patch*merge, the area within
    /// `[min_pixels, max_pixels]`, the aspect ratio kept as closely as possible.
    fn smart_resize(&self, height: u32, width: u32) -> Result<(u32, u32), ImageError>;
    /// Video frames (or one image): every frame resized to the first frame's smart size;
    /// the frame count padded to a multiple of `temporal_patch_size` by repeating the last.
    fn process_frames(&self, frames: &[RgbImage]) -> Result<ProcessedImage, ImageError>;
}

impl From<media::spec::SpecError> for ImageError {
    fn from(e: media::spec::SpecError) -> Self {
        let (key, reason) = e.into_parts();
        ImageError::InvalidConfig { key, reason }
    }
}

/// One image is a video of one frame.
impl ProcessImage for Qwen2VlConfig {
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage, ImageError> {
        self.process_frames(std::slice::from_ref(image))
    }
}

impl PatchProcessor for Qwen2VlConfig {
    fn with_options(mut self, options: &ProcessorOptions) -> Result<Self, ImageError> {
        self.min_pixels = options.min_pixels.unwrap_or(self.min_pixels);
        self.max_pixels = options.max_pixels.unwrap_or(self.max_pixels);
        self.check_pixel_bounds()?;
        Ok(self)
    }

    fn smart_resize(&self, height: u32, width: u32) -> Result<(u32, u32), ImageError> {
        let bad = |reason: String| ImageError::BadSize {
            width,
            height,
            reason,
        };
        let factor = (self.patch_size * self.merge_size) as u64;
        if factor == 0 {
            return Err(bad("the patch size is zero".to_owned()));
        }
        let (h, w) = (u64::from(height), u64::from(width));
        if h == 0 || w == 0 {
            return Err(bad("it has no pixels".to_owned()));
        }
        if h.max(w) / h.min(w) > 200 {
            return Err(bad("the aspect ratio is over 200".to_owned()));
        }
        // As the reference: a side of 14 px or less rounds to 0 here, and the area check
        // below (under `min_pixels`) scales it back up together with the other side.
        let round = |x: u64| (x as f64 / factor as f64).round_ties_even() as u64 * factor;
        let (mut hb, mut wb) = (round(h), round(w));
        let (hf, wf, ff) = (h as f64, w as f64, factor as f64);
        if hb * wb > self.max_pixels {
            let beta = ((hf * wf) / self.max_pixels as f64).sqrt();
            hb = (((hf / beta) / ff).floor() as u64 * factor).max(factor);
            wb = (((wf / beta) / ff).floor() as u64 * factor).max(factor);
        } else if hb * wb < self.min_pixels {
            let beta = (self.min_pixels as f64 / (hf * wf)).sqrt();
            hb = ((hf * beta) / ff).ceil() as u64 * factor;
            wb = ((wf * beta) / ff).ceil() as u64 * factor;
        }
        // Only a `min_pixels` of 0 can leave a side at 0; the reference would fail later.
        let (hb, wb) = (hb.max(factor), wb.max(factor));
        let fits = |v: u64| u32::try_from(v).ok().filter(|v| *v <= 32768);
        match (fits(hb), fits(wb)) {
            (Some(hb), Some(wb)) => Ok((hb, wb)),
            _ => Err(bad("the resized image would be too large".to_owned())),
        }
    }

    fn process_frames(&self, frames: &[RgbImage]) -> Result<ProcessedImage, ImageError> {
        let first = frames.first().ok_or_else(|| ImageError::BadSize {
            width: 0,
            height: 0,
            reason: "no frames".to_owned(),
        })?;
        let (rh, rw) = self.smart_resize(first.height(), first.width())?;
        let table = NormTable::new(1.0 / 255.0, self.image_mean, self.image_std);
        let tp = self.temporal_patch_size.max(1);
        let p = self.patch_size;
        let m = self.merge_size.max(1);
        let grid_t = frames.len().div_ceil(tp);
        let (gh, gw) = (rh as usize / p, rw as usize / p);
        let patch_len = 3 * tp * p * p;
        let num_patches = grid_t * (gh / m * m) * (gw / m * m);
        // Checked before the output exists: many frames at a large smart size would otherwise
        // ask for gigabytes of floats.
        let values = num_patches.saturating_mul(patch_len);
        if values > MAX_PATCH_VALUES {
            return Err(ImageError::BadSize {
                width: first.width(),
                height: first.height(),
                reason: format!(
                    "{} frame(s) at {rw}x{rh} make {values} values, over the limit of {MAX_PATCH_VALUES}",
                    frames.len()
                ),
            });
        }
        let stride = rw as usize * 3;
        let pp = p * p;
        // Filled in order by `extend`, so the buffer is never zeroed first.
        let mut data = Vec::with_capacity(values);
        // Patch order: t, block row, block column, row in block, column in block;
        // within a patch: channel, frame, y, x (the reference processor's transpose).
        for t in 0..grid_t {
            // This temporal patch's frames, resized (packed RGB bytes); each patch's values are
            // then normalised straight out of them into place, so no float copy of a whole frame
            // exists. The last frame repeats to fill the group: its values are copied, not
            // computed again.
            let last = ((t + 1) * tp).min(frames.len());
            let resized: Vec<RgbImage> = frames[t * tp..last]
                .iter()
                .map(|f| bicubic_resize(f, rw, rh))
                .collect::<Result<_, _>>()?;
            let kept = resized.len();
            for bh in 0..gh / m {
                for bw in 0..gw / m {
                    for mh in 0..m {
                        for mw in 0..m {
                            let (py0, px0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                            for (c, lut) in table.0.iter().enumerate() {
                                for frame in &resized {
                                    let raw = frame.as_raw();
                                    for y in 0..p {
                                        let row = &raw[(py0 + y) * stride + px0 * 3..][..p * 3];
                                        data.extend(
                                            row.chunks_exact(3).map(|px| lut[px[c] as usize]),
                                        );
                                    }
                                }
                                let repeated = data.len() - pp;
                                for _ in kept..tp {
                                    data.extend_from_within(repeated..repeated + pp);
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(ProcessedImage {
            pixel_values: PixelValues {
                data,
                shape: vec![num_patches, patch_len],
            },
            grid_thw: Some([grid_t, gh, gw]),
        })
    }
}

impl ProcessImage for ImageProcessor {
    fn process(&self, image: &RgbImage) -> Result<ProcessedImage, ImageError> {
        match self {
            ImageProcessor::Clip(c) => c.process(image),
            ImageProcessor::Qwen2Vl(q) => q.process(image),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_the_reference_formula() {
        let q = Qwen2VlConfig {
            max_pixels: 1_003_520,
            ..Qwen2VlConfig::default()
        };
        assert_eq!(q.smart_resize(960, 1280).unwrap(), (840, 1148));
        let d = Qwen2VlConfig::default();
        // Small image: scaled up to min_pixels.
        assert_eq!(d.smart_resize(20, 20).unwrap(), (56, 56));
        // Rounds to multiples of 28.
        assert_eq!(d.smart_resize(100, 150).unwrap(), (112, 140));
        assert!(d.smart_resize(1, 1000).is_err());
        assert!(d.smart_resize(0, 10).is_err());
        // A side of 14 px or less rounds to 0 and comes back through the min_pixels branch
        // with the other side (the tiny checkpoint's `image_thin` case: grid 2 x 26).
        assert_eq!(d.smart_resize(10, 400).unwrap(), (28, 364));
    }

    #[test]
    fn options_change_the_pixel_bounds() {
        let options = |min: Option<u64>, max: Option<u64>| ProcessorOptions {
            min_pixels: min,
            max_pixels: max,
            ..ProcessorOptions::default()
        };
        let q = Qwen2VlConfig::default()
            .with_options(&options(Some(3136), Some(200_704)))
            .unwrap();
        assert_eq!((q.min_pixels, q.max_pixels), (3136, 200_704));
        // Unset bounds keep the model's.
        let q = Qwen2VlConfig::default()
            .with_options(&options(None, Some(5000)))
            .unwrap();
        assert_eq!((q.min_pixels, q.max_pixels), (56 * 56, 5000));
        // A request's bound may cross the model's other one.
        let err = Qwen2VlConfig::default()
            .with_options(&options(None, Some(100)))
            .unwrap_err();
        assert!(
            matches!(&err, ImageError::InvalidConfig { key, .. } if key == "min_pixels"),
            "{err}"
        );
    }

    #[test]
    fn patches_follow_the_reference_order() {
        // A 56x56 image whose pixel value encodes its position: check where pixels land.
        let img = RgbImage::from_fn(56, 56, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, 0]));
        let q = Qwen2VlConfig {
            min_pixels: 56 * 56,
            max_pixels: 56 * 56,
            image_mean: [0.0; 3],
            image_std: [1.0 / 255.0; 3],
            ..Qwen2VlConfig::default()
        };
        let out = q.process(&img).unwrap();
        assert_eq!(out.grid_thw, Some([1, 4, 4]));
        assert_eq!(out.pixel_values.shape, vec![16, 3 * 2 * 14 * 14]);
        assert_eq!(media::tokens::vision([1, 4, 4], q.merge_size), 4);
        // With std = 1/255 and mean 0 the value is the byte itself.
        let v = |patch: usize, c: usize, t: usize, y: usize, x: usize| {
            out.pixel_values.data[patch * 1176 + (c * 2 + t) * 196 + y * 14 + x]
        };
        // Patch 1 is block (0,0), row 0 in block, column 1: x from 14.
        assert_eq!(v(1, 0, 0, 0, 0), 56.0);
        assert_eq!(v(1, 1, 1, 3, 0), 12.0);
        // Patch 2 is block (0,0), row 1, column 0: y from 14.
        assert_eq!(v(2, 1, 0, 0, 0), 56.0);
        // Patch 4 is block (0,1): x from 28.
        assert_eq!(v(4, 0, 0, 0, 0), 112.0);
        // Patch 8 is block (1,0): y from 28.
        assert_eq!(v(8, 1, 0, 0, 0), 112.0);
    }

    #[test]
    fn video_patches_hold_each_frame_and_repeat_the_last() {
        // Three 28x28 frames of constant colours: with temporal_patch_size 2 they make two
        // temporal patches, the second holding frame 2 twice.
        let frames: Vec<RgbImage> = (0..3u8)
            .map(|i| RgbImage::from_pixel(28, 28, image::Rgb([10 + i, 20 + i, 30 + i])))
            .collect();
        let q = Qwen2VlConfig {
            min_pixels: 28 * 28,
            max_pixels: 28 * 28,
            image_mean: [0.0; 3],
            image_std: [1.0 / 255.0; 3],
            ..Qwen2VlConfig::default()
        };
        let out = q.process_frames(&frames).unwrap();
        assert_eq!(out.grid_thw, Some([2, 2, 2]));
        assert_eq!(out.pixel_values.shape, vec![8, 1176]);
        assert_eq!(media::tokens::vision([2, 2, 2], q.merge_size), 2);
        let d = &out.pixel_values.data;
        for patch in 0..8 {
            let (first, second) = if patch < 4 { (0.0, 1.0) } else { (2.0, 2.0) };
            for c in 0..3 {
                let base = 10.0 * (c as f32 + 1.0);
                let at = |t: usize| &d[patch * 1176 + (c * 2 + t) * 196..][..196];
                assert!(
                    at(0).iter().all(|v| (*v - base - first).abs() < 1e-3),
                    "patch {patch} c {c} t 0"
                );
                assert!(
                    at(1).iter().all(|v| (*v - base - second).abs() < 1e-3),
                    "patch {patch} c {c} t 1"
                );
            }
        }
    }

    #[test]
    fn clip_output_is_chw_and_normalised() {
        let img = RgbImage::from_pixel(64, 32, image::Rgb([255, 0, 128]));
        let out = ClipConfig::clip_448().process(&img).unwrap();
        assert_eq!(out.pixel_values.shape, vec![3, 448, 448]);
        let plane = 448 * 448;
        let r = (1.0 - CLIP_MEAN[0]) / CLIP_STD[0];
        let g = (0.0 - CLIP_MEAN[1]) / CLIP_STD[1];
        assert!((out.pixel_values.data[10] - r).abs() < 1e-5);
        assert!((out.pixel_values.data[plane + 10] - g).abs() < 1e-5);
        let crop = ClipConfig {
            resize: ResizeTo::ShortestEdge(32),
            crop_size: Some((32, 32)),
            ..ClipConfig::clip_448()
        };
        assert_eq!(
            crop.process(&img).unwrap().pixel_values.shape,
            vec![3, 32, 32]
        );
    }
}
