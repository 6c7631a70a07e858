//! The merged kwargs as the media pipeline uses them: typed once here, so nothing after the
//! policy layers reads a JSON value.
//!
//! [`merge`](crate::merge::merge) validates the known keys of the merged maps (a 400 before
//! anything is fetched) and then builds [`MediaOptions`]. What only a modality's loader can
//! refuse (an unknown `media_io_kwargs.<modality>` key, an image mode the decoder cannot
//! produce, a bad `size` for a patch processor) is kept per modality as an [`OptionError`] and
//! refused when an item of that modality is loaded, so a request without such media is not
//! refused for options it does not use. Start-up-only keys are server settings and never
//! shape a load.

use serde_json::Value;

use crate::merge::{is_startup_only_key, KwargsMap};

/// Lowest `media_io_kwargs.audio.target_sample_rate` accepted (as the audio decoder's range).
pub const MIN_TARGET_SAMPLE_RATE: u32 = 1_000;
/// Highest `media_io_kwargs.audio.target_sample_rate` accepted.
pub const MAX_TARGET_SAMPLE_RATE: u32 = 384_000;

/// An option the media loader or processor cannot honour; a 400 naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionError {
    #[error("Invalid media_io_kwargs.{modality}.{key}: {reason}")]
    Loader {
        modality: &'static str,
        key: String,
        reason: String,
    },
    #[error("Invalid image processor setting {key}: {reason}")]
    Processor { key: String, reason: String },
}

/// `image_mode` of media_io_kwargs (Pillow's mode names) that the decoder produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageMode {
    Rgb,
    Rgba,
    L,
    La,
}

impl ImageMode {
    pub fn parse(name: &str) -> Option<ImageMode> {
        match name {
            "RGB" => Some(ImageMode::Rgb),
            "RGBA" => Some(ImageMode::Rgba),
            "L" => Some(ImageMode::L),
            "LA" => Some(ImageMode::La),
            _ => None,
        }
    }
}

/// How images are read (`media_io_kwargs.image`).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageLoadOptions {
    pub image_mode: ImageMode,
    /// What transparent pixels are composited onto when the mode has no alpha.
    pub rgba_background_color: [u8; 3],
}

impl Default for ImageLoadOptions {
    fn default() -> Self {
        ImageLoadOptions {
            image_mode: ImageMode::Rgb,
            rgba_background_color: [255, 255, 255],
        }
    }
}

/// How videos are sampled (`media_io_kwargs.video`); `None` leaves the loader's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VideoLoadOptions {
    pub num_frames: Option<u32>,
    pub fps: Option<f64>,
    pub max_duration_s: Option<f64>,
}

/// How audio is read (`media_io_kwargs.audio`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AudioLoadOptions {
    /// `target_sample_rate` (or its alias `sample_rate`).
    pub target_sample_rate: Option<u32>,
}

/// The processor kwargs (`mm_processor_kwargs`) the media processors read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessorOptions {
    /// `min_pixels`, or HF's `size.shortest_edge` when only that is set.
    pub min_pixels: Option<u64>,
    /// `max_pixels`, or HF's `size.longest_edge` when only that is set.
    pub max_pixels: Option<u64>,
    pub num_crops: Option<u32>,
    pub fps: Option<f64>,
    pub num_frames: Option<u32>,
}

/// The typed options of one request's media (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MediaOptions {
    processor: Result<ProcessorOptions, OptionError>,
    image: Result<ImageLoadOptions, OptionError>,
    video: Result<VideoLoadOptions, OptionError>,
    audio: Result<AudioLoadOptions, OptionError>,
}

impl Default for MediaOptions {
    fn default() -> Self {
        MediaOptions {
            processor: Ok(ProcessorOptions::default()),
            image: Ok(ImageLoadOptions::default()),
            video: Ok(VideoLoadOptions::default()),
            audio: Ok(AudioLoadOptions::default()),
        }
    }
}

impl MediaOptions {
    /// From merged maps whose known keys [`crate::merge`] has validated.
    pub(crate) fn from_validated(
        mm: &KwargsMap,
        image: Option<&KwargsMap>,
        video: Option<&KwargsMap>,
        audio: Option<&KwargsMap>,
    ) -> Self {
        let empty = KwargsMap::new();
        MediaOptions {
            processor: processor_options(mm),
            image: image_options(image.unwrap_or(&empty)),
            video: video_options(video.unwrap_or(&empty)),
            audio: audio_options(audio.unwrap_or(&empty)),
        }
    }

    /// The processor options; an error for a `size` a patch processor cannot use.
    pub fn processor(&self) -> Result<&ProcessorOptions, OptionError> {
        self.processor.as_ref().map_err(Clone::clone)
    }

    pub fn image(&self) -> Result<&ImageLoadOptions, OptionError> {
        self.image.as_ref().map_err(Clone::clone)
    }

    pub fn video(&self) -> Result<&VideoLoadOptions, OptionError> {
        self.video.as_ref().map_err(Clone::clone)
    }

    pub fn audio(&self) -> Result<&AudioLoadOptions, OptionError> {
        self.audio.as_ref().map_err(Clone::clone)
    }
}

fn positive_u64(v: &Value) -> Option<u64> {
    v.as_u64().filter(|n| *n > 0)
}

fn positive_u32(v: &Value) -> Option<u32> {
    positive_u64(v).and_then(|n| u32::try_from(n).ok())
}

fn positive_number(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite() && *x > 0.0)
}

fn processor_options(mm: &KwargsMap) -> Result<ProcessorOptions, OptionError> {
    let edge = |size: &KwargsMap, key: &str| -> Result<Option<u64>, OptionError> {
        size.get(key)
            .map(|v| {
                positive_u64(v).ok_or_else(|| OptionError::Processor {
                    key: format!("size.{key}"),
                    reason: "must be a positive integer".to_owned(),
                })
            })
            .transpose()
    };
    let (mut shortest, mut longest) = (None, None);
    if let Some(Value::Object(size)) = mm.get("size") {
        shortest = edge(size, "shortest_edge")?;
        longest = edge(size, "longest_edge")?;
    }
    let get = |key: &str| mm.get(key);
    Ok(ProcessorOptions {
        min_pixels: get("min_pixels").and_then(positive_u64).or(shortest),
        max_pixels: get("max_pixels").and_then(positive_u64).or(longest),
        num_crops: get("num_crops").and_then(positive_u32),
        fps: get("fps").and_then(positive_number),
        num_frames: get("num_frames").and_then(positive_u32),
    })
}

/// The loader keys of one modality's map, start-up-only keys left out.
fn loader_keys(map: &KwargsMap) -> impl Iterator<Item = (&String, &Value)> {
    map.iter().filter(|(k, _)| !is_startup_only_key(k))
}

fn image_options(map: &KwargsMap) -> Result<ImageLoadOptions, OptionError> {
    let bad = |key: &str, reason: &str| OptionError::Loader {
        modality: "image",
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    let mut out = ImageLoadOptions::default();
    for (key, v) in loader_keys(map) {
        match key.as_str() {
            "image_mode" => {
                let name = v.as_str().ok_or_else(|| bad(key, "must be a string"))?;
                out.image_mode = ImageMode::parse(name)
                    .ok_or_else(|| bad(key, "must be one of RGB, RGBA, L, LA"))?;
            }
            "rgba_background_color" => {
                out.rgba_background_color = crate::merge::as_rgb(v)
                    .ok_or_else(|| bad(key, "must be a list of three integers 0-255"))?;
            }
            _ => return Err(bad(key, "unknown option")),
        }
    }
    Ok(out)
}

fn video_options(map: &KwargsMap) -> Result<VideoLoadOptions, OptionError> {
    let bad = |key: &str, reason: &str| OptionError::Loader {
        modality: "video",
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    let mut out = VideoLoadOptions::default();
    for (key, v) in loader_keys(map) {
        let number = || positive_number(v).ok_or_else(|| bad(key, "must be a positive number"));
        match key.as_str() {
            "num_frames" => {
                out.num_frames =
                    Some(positive_u32(v).ok_or_else(|| bad(key, "must be a positive integer"))?)
            }
            "fps" => out.fps = Some(number()?),
            "max_duration" => out.max_duration_s = Some(number()?),
            _ => return Err(bad(key, "unknown option")),
        }
    }
    Ok(out)
}

fn audio_options(map: &KwargsMap) -> Result<AudioLoadOptions, OptionError> {
    let bad = |key: &str, reason: String| OptionError::Loader {
        modality: "audio",
        key: key.to_owned(),
        reason,
    };
    let mut out = AudioLoadOptions::default();
    for (key, v) in loader_keys(map) {
        match key.as_str() {
            "target_sample_rate" | "sample_rate" => {
                let rate = v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|r| (MIN_TARGET_SAMPLE_RATE..=MAX_TARGET_SAMPLE_RATE).contains(r))
                    .ok_or_else(|| {
                        bad(
                            key,
                            format!(
                                "must be an integer from {MIN_TARGET_SAMPLE_RATE} to \
                                 {MAX_TARGET_SAMPLE_RATE}"
                            ),
                        )
                    })?;
                if out.target_sample_rate.is_some_and(|r| r != rate) {
                    return Err(bad(
                        key,
                        "conflicts with the other sample rate given".to_owned(),
                    ));
                }
                out.target_sample_rate = Some(rate);
            }
            _ => {
                return Err(bad(
                    key,
                    "unknown option (known: target_sample_rate, sample_rate)".to_owned(),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::{merge, DeploymentDefaults};
    use serde_json::json;

    /// The options a trusted request with these kwargs is processed with.
    fn options(mm: Value, media: Value) -> MediaOptions {
        let as_map = |v: Value| match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        };
        let (mm, media) = (as_map(mm), as_map(media));
        merge(
            &DeploymentDefaults::default(),
            Some(&mm),
            Some(&media),
            true,
        )
        .unwrap()
        .media_options()
        .clone()
    }

    fn loader_key(e: OptionError) -> String {
        match e {
            OptionError::Loader { key, .. } => key,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_kwargs_give_the_loaders_defaults() {
        assert_eq!(options(json!({}), json!({})), MediaOptions::default());
        let image = MediaOptions::default().image().unwrap().clone();
        assert_eq!(image.image_mode, ImageMode::Rgb);
        assert_eq!(image.rgba_background_color, [255, 255, 255]);
    }

    #[test]
    fn image_options_parse_and_refuse_unknown_keys() {
        let o = options(
            json!({}),
            json!({"image": {"image_mode": "L", "rgba_background_color": [0, 10, 20]}}),
        );
        let image = o.image().unwrap();
        assert_eq!(image.image_mode, ImageMode::L);
        assert_eq!(image.rgba_background_color, [0, 10, 20]);
        for (bad, key) in [
            (json!({"image_mode": "CMYK"}), "image_mode"),
            (json!({"colour": 1}), "colour"),
        ] {
            let err = options(json!({}), json!({ "image": bad }))
                .image()
                .unwrap_err();
            assert!(
                err.to_string()
                    .starts_with(&format!("Invalid media_io_kwargs.image.{key}: ")),
                "{err}"
            );
            // Only the image loader refuses it.
            let o = options(json!({}), json!({ "image": bad }));
            assert!(o.video().is_ok() && o.audio().is_ok() && o.processor().is_ok());
        }
    }

    #[test]
    fn video_options_parse_and_refuse_unknown_keys() {
        let o = options(
            json!({}),
            json!({"video": {"num_frames": 8, "fps": 2, "max_duration": 1.5, "threads": 4}}),
        );
        assert_eq!(
            o.video().unwrap(),
            &VideoLoadOptions {
                num_frames: Some(8),
                fps: Some(2.0),
                max_duration_s: Some(1.5),
            }
        );
        let err = options(json!({}), json!({"video": {"frames": 3}}))
            .video()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Invalid media_io_kwargs.video.frames: unknown option"
        );
    }

    #[test]
    fn audio_options_parse_and_name_the_key() {
        for key in ["target_sample_rate", "sample_rate"] {
            let o = options(json!({}), json!({"audio": { key: 8000 }}));
            assert_eq!(o.audio().unwrap().target_sample_rate, Some(8_000));
        }
        let err = options(json!({}), json!({"audio": {"volume": 2}}))
            .audio()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Invalid media_io_kwargs.audio.volume: unknown option (known: target_sample_rate, \
             sample_rate)"
        );
        for bad in [
            json!(0),
            json!(-16000),
            json!(16000.5),
            json!("16000"),
            json!(999_999),
        ] {
            let err = options(json!({}), json!({"audio": {"target_sample_rate": bad}}))
                .audio()
                .unwrap_err();
            assert_eq!(loader_key(err), "target_sample_rate");
        }
        let err = options(
            json!({}),
            json!({"audio": {"target_sample_rate": 16000, "sample_rate": 8000}}),
        )
        .audio()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Invalid media_io_kwargs.audio.sample_rate: conflicts with the other sample rate \
             given"
        );
    }

    #[test]
    fn processor_options_take_pixels_or_size() {
        let o = options(json!({"max_pixels": 200704, "min_pixels": 3136}), json!({}));
        let p = o.processor().unwrap();
        assert_eq!((p.min_pixels, p.max_pixels), (Some(3136), Some(200_704)));
        let o = options(
            json!({"size": {"shortest_edge": 100, "longest_edge": 5000}}),
            json!({}),
        );
        let p = o.processor().unwrap();
        assert_eq!((p.min_pixels, p.max_pixels), (Some(100), Some(5000)));
        // The flat keys win over `size`.
        let o = options(
            json!({"size": {"shortest_edge": 100}, "min_pixels": 200}),
            json!({}),
        );
        assert_eq!(o.processor().unwrap().min_pixels, Some(200));
        let err = options(json!({"size": {"longest_edge": -1}}), json!({}))
            .processor()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Invalid image processor setting size.longest_edge: must be a positive integer"
        );
    }
}
