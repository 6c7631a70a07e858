//! Deployment defaults and their merge with per-request kwargs (CONTRACT section 3).
//!
//! * `--mm-processor-kwargs '<json object>'` is flat; `--media-io-kwargs` is keyed
//!   by modality, e.g. `'{"video": {"num_frames": 40}}'`. Both are parsed once at
//!   start-up into [`DeploymentDefaults`] (and validated, so a bad default stops
//!   the server instead of failing every request).
//! * An untrusted request gets exactly the deployment values (the trust gate has
//!   already refused any it sent).
//! * A trusted request: `mm_processor_kwargs` = deployment ∪ request, request
//!   wins (shallow). `media_io_kwargs` merges per modality, request wins, except
//!   for video: a request that sets `num_frames` without `fps` drops a
//!   deployment `fps`, and one that sets `fps` without `num_frames` drops a
//!   deployment `num_frames` (as vLLM's `VideoMediaIO.merge_kwargs` does).
//! * A request key whose value is `null` is ignored (the deployment value, if
//!   any, stays), like vLLM's kwargs merging treats unset values.
//! * [`STARTUP_ONLY_KEYS`] (decoder device, thread and pool sizes, hardware
//!   decoder choice) are never taken from a request, in either field. Like vLLM
//!   ignoring kwargs it does not use, they are dropped silently (logged at debug
//!   and listed in [`MergedKwargs::ignored_request_keys`]), not refused.
//! * The merged result is then type-checked key by key ([`validate_media_io`],
//!   [`validate_mm_processor`]); an invalid value is a 400 naming the key, e.g.
//!   `Invalid value for media_io_kwargs.video.num_frames: expected a positive
//!   integer, got "invalid"` with `param` `media_io_kwargs`. Unknown keys pass
//!   through untouched: they may be model-specific. The checked maps are then typed once
//!   ([`MergedKwargs::media_options`], see [`crate::options`]) for the media pipeline.
//!
//! `num_frames: -1` ("all frames" in some vLLM loaders) is refused: it is an
//! unbounded resource request, and this server always samples a bounded number.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{compact_json, describe_json_type, KwargsField, PolicyError};
use crate::options::MediaOptions;

/// Keys that configure the server's media machinery itself rather than one
/// request's preprocessing. They are honoured in deployment defaults and never
/// taken from a request.
pub const STARTUP_ONLY_KEYS: &[&str] = &[
    "device",
    "decoder_device",
    "hw_decoder",
    "hw_device",
    "hwaccel",
    "threads",
    "thread_count",
    "num_threads",
    "num_workers",
    "max_workers",
    "pool_size",
];

/// Image modes accepted for `media_io_kwargs.image.image_mode` (PIL's mode names).
pub const IMAGE_MODES: &[&str] = &[
    "1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV",
    "I", "F", "I;16", "I;16L", "I;16B", "I;16N",
];

/// True when `key` is in [`STARTUP_ONLY_KEYS`].
pub fn is_startup_only_key(key: &str) -> bool {
    STARTUP_ONLY_KEYS.contains(&key)
}

/// A JSON object (`serde_json` map, insertion order preserved).
pub type KwargsMap = Map<String, Value>;

/// The deployment's kwargs, from `--mm-processor-kwargs` and `--media-io-kwargs`
/// (or the `--config` YAML).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeploymentDefaults {
    /// Flat processor kwargs.
    pub mm_processor_kwargs: KwargsMap,
    /// Media loading kwargs per modality (`image`, `video`, `audio`, ...).
    pub media_io_kwargs: BTreeMap<String, KwargsMap>,
}

impl DeploymentDefaults {
    /// Parses the two CLI JSON strings (`None` = flag not given).
    ///
    /// Errors ([`PolicyError::InvalidConfig`], one line, naming the flag): bad
    /// JSON, a value that is not an object, a `--media-io-kwargs` modality entry
    /// that is not an object, or a known key with an invalid value.
    pub fn from_json(mm: Option<&str>, media: Option<&str>) -> Result<Self, PolicyError> {
        let mm_value = mm
            .map(|text| parse_json_flag(KwargsField::MmProcessorKwargs, text))
            .transpose()?;
        let media_value = media
            .map(|text| parse_json_flag(KwargsField::MediaIoKwargs, text))
            .transpose()?;
        Self::from_values(mm_value.as_ref(), media_value.as_ref())
    }

    /// Builds the defaults from already-parsed JSON values (e.g. from the
    /// `--config` YAML). `None` and `null` mean "not set".
    pub fn from_values(mm: Option<&Value>, media: Option<&Value>) -> Result<Self, PolicyError> {
        let mm_processor_kwargs = match mm {
            None | Some(Value::Null) => KwargsMap::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(other) => {
                return Err(config_error(
                    KwargsField::MmProcessorKwargs,
                    format!("expected a JSON object, got {}", describe_json_type(other)),
                ))
            }
        };
        let mut media_io_kwargs = BTreeMap::new();
        match media {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (modality, entry) in map {
                    match entry {
                        Value::Object(inner) => {
                            media_io_kwargs.insert(modality.clone(), inner.clone());
                        }
                        other => {
                            return Err(config_error(
                                KwargsField::MediaIoKwargs,
                                format!(
                                    "the entry for modality '{modality}' must be a JSON object, \
                                     got {}",
                                    describe_json_type(other)
                                ),
                            ))
                        }
                    }
                }
            }
            Some(other) => {
                return Err(config_error(
                    KwargsField::MediaIoKwargs,
                    format!(
                        "expected a JSON object keyed by modality, got {}",
                        describe_json_type(other)
                    ),
                ))
            }
        }
        let defaults = DeploymentDefaults {
            mm_processor_kwargs,
            media_io_kwargs,
        };
        validate_mm_processor(&defaults.mm_processor_kwargs)
            .map_err(|e| config_error(KwargsField::MmProcessorKwargs, e.message()))?;
        validate_media_io(&defaults.media_io_kwargs)
            .map_err(|e| config_error(KwargsField::MediaIoKwargs, e.message()))?;
        Ok(defaults)
    }

    /// True when neither field sets anything.
    pub fn is_empty(&self) -> bool {
        self.mm_processor_kwargs.is_empty() && self.media_io_kwargs.values().all(Map::is_empty)
    }
}

fn config_error(field: KwargsField, reason: String) -> PolicyError {
    PolicyError::InvalidConfig {
        option: field.cli_flag().to_owned(),
        reason,
    }
}

fn parse_json_flag(field: KwargsField, text: &str) -> Result<Value, PolicyError> {
    serde_json::from_str(text).map_err(|e| config_error(field, format!("not valid JSON ({e})")))
}

/// The kwargs a request is processed with: deployment defaults merged with what
/// a trusted request sent, validated. Build it with [`merge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MergedKwargs {
    mm_processor_kwargs: KwargsMap,
    media_io_kwargs: BTreeMap<String, KwargsMap>,
    ignored_request_keys: Vec<String>,
    options: MediaOptions,
}

impl MergedKwargs {
    /// The validated maps with their typed options.
    fn new(
        mm_processor_kwargs: KwargsMap,
        media_io_kwargs: BTreeMap<String, KwargsMap>,
        ignored_request_keys: Vec<String>,
    ) -> Self {
        let options = MediaOptions::from_validated(
            &mm_processor_kwargs,
            media_io_kwargs.get("image"),
            media_io_kwargs.get("video"),
            media_io_kwargs.get("audio"),
        );
        MergedKwargs {
            mm_processor_kwargs,
            media_io_kwargs,
            ignored_request_keys,
            options,
        }
    }
}

/// Merges the deployment defaults with a request's kwargs and validates the
/// result (see the module docs for the rules).
///
/// `request_mm` and `request_media` are the request's fields after
/// [`crate::gate::validate_kwargs_shape`]; a `request_media` modality entry that
/// is not an object is refused here too. When `trusted` is false the request's
/// values are not looked at: the result is exactly the deployment's.
pub fn merge(
    defaults: &DeploymentDefaults,
    request_mm: Option<&KwargsMap>,
    request_media: Option<&KwargsMap>,
    trusted: bool,
) -> Result<MergedKwargs, PolicyError> {
    if !trusted {
        return Ok(MergedKwargs::new(
            defaults.mm_processor_kwargs.clone(),
            defaults.media_io_kwargs.clone(),
            Vec::new(),
        ));
    }

    let mut ignored = Vec::new();
    let mut mm = defaults.mm_processor_kwargs.clone();
    if let Some(request) = request_mm {
        overlay(
            &mut mm,
            request,
            KwargsField::MmProcessorKwargs.as_str(),
            &mut ignored,
        );
    }

    let mut media = defaults.media_io_kwargs.clone();
    if let Some(request) = request_media {
        for (modality, entry) in request {
            let path = format!("{}.{modality}", KwargsField::MediaIoKwargs.as_str());
            let entry = match entry {
                Value::Null => continue,
                Value::Object(entry) => entry,
                other => {
                    return Err(PolicyError::KwargsNotObject {
                        field: KwargsField::MediaIoKwargs,
                        path,
                        got: describe_json_type(other).to_owned(),
                    })
                }
            };
            let target = media.entry(modality.clone()).or_default();
            if modality == "video" {
                let sets = |key: &str| entry.get(key).is_some_and(|v| !v.is_null());
                if sets("num_frames") && !sets("fps") {
                    target.remove("fps");
                } else if sets("fps") && !sets("num_frames") {
                    target.remove("num_frames");
                }
            }
            overlay(target, entry, &path, &mut ignored);
        }
    }

    if !ignored.is_empty() {
        tracing::debug!(keys = ?ignored, "ignoring start-up-only kwargs sent in a request");
    }
    validate_mm_processor(&mm)?;
    validate_media_io(&media)?;
    Ok(MergedKwargs::new(mm, media, ignored))
}

/// Copies `request` over `target`: request wins, `null` values and start-up-only
/// keys are skipped (the latter recorded in `ignored` as dotted paths).
fn overlay(target: &mut KwargsMap, request: &KwargsMap, path: &str, ignored: &mut Vec<String>) {
    for (key, value) in request {
        if is_startup_only_key(key) {
            ignored.push(format!("{path}.{key}"));
            continue;
        }
        if value.is_null() {
            continue;
        }
        target.insert(key.clone(), value.clone());
    }
}

impl MergedKwargs {
    /// The merged processor kwargs.
    pub fn mm_processor_kwargs(&self) -> &KwargsMap {
        &self.mm_processor_kwargs
    }

    /// The merged media loading kwargs, per modality.
    pub fn media_io_kwargs(&self) -> &BTreeMap<String, KwargsMap> {
        &self.media_io_kwargs
    }

    /// The media loading kwargs of one modality, if any are set.
    pub fn media_kwargs(&self, modality: &str) -> Option<&KwargsMap> {
        self.media_io_kwargs.get(modality)
    }

    /// Start-up-only keys the request sent and that were dropped, as dotted
    /// paths (`media_io_kwargs.video.threads`).
    pub fn ignored_request_keys(&self) -> &[String] {
        &self.ignored_request_keys
    }

    /// `mm_processor_kwargs` as a JSON object value (for schema checks).
    pub fn mm_processor_kwargs_value(&self) -> Value {
        Value::Object(self.mm_processor_kwargs.clone())
    }

    /// One modality's media kwargs as a JSON object value (`{}` when unset).
    pub fn media_kwargs_value(&self, modality: &str) -> Value {
        Value::Object(self.media_kwargs(modality).cloned().unwrap_or_default())
    }

    /// The typed options the media pipeline runs with.
    pub fn media_options(&self) -> &MediaOptions {
        &self.options
    }
}

// ---------------------------------------------------------------------------
// Typed validation of known keys.

/// The typed checks a known key gets.
#[derive(Clone, Copy)]
enum Check {
    /// An integer in `1..=u32::MAX`.
    PositiveU32,
    /// An integer >= 1 (u64).
    PositiveInt,
    /// A finite number > 0.
    PositiveNumber,
    /// One of [`IMAGE_MODES`].
    ImageMode,
    /// A list of three integers in 0..=255.
    Rgb,
}

impl Check {
    /// What a valid value looks like, worded for the value that was sent.
    fn expected(self, sent: &Value) -> String {
        match self {
            // Name the bound only when it is what the value broke.
            Check::PositiveU32 if sent.as_u64().is_some_and(|n| n > u64::from(u32::MAX)) => {
                format!("a positive integer (at most {})", u32::MAX)
            }
            Check::PositiveU32 | Check::PositiveInt => "a positive integer".to_owned(),
            Check::PositiveNumber => "a positive number".to_owned(),
            Check::ImageMode => format!("one of the image modes {}", IMAGE_MODES.join(", ")),
            Check::Rgb => "a list of three integers from 0 to 255".to_owned(),
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            Check::PositiveU32 => value
                .as_u64()
                .is_some_and(|n| n >= 1 && u32::try_from(n).is_ok()),
            Check::PositiveInt => value.as_u64().is_some_and(|n| n >= 1),
            Check::PositiveNumber => value.as_f64().is_some_and(|x| x.is_finite() && x > 0.0),
            Check::ImageMode => value.as_str().is_some_and(|m| IMAGE_MODES.contains(&m)),
            Check::Rgb => as_rgb(value).is_some(),
        }
    }
}

pub(crate) fn as_rgb(value: &Value) -> Option<[u8; 3]> {
    let items = value.as_array()?;
    if items.len() != 3 {
        return None;
    }
    let mut rgb = [0u8; 3];
    for (slot, item) in rgb.iter_mut().zip(items) {
        *slot = u8::try_from(item.as_u64()?).ok()?;
    }
    Some(rgb)
}

const MM_PROCESSOR_CHECKS: &[(&str, Check)] = &[
    ("min_pixels", Check::PositiveInt),
    ("max_pixels", Check::PositiveInt),
    ("num_crops", Check::PositiveU32),
    ("fps", Check::PositiveNumber),
    ("num_frames", Check::PositiveU32),
];

const VIDEO_CHECKS: &[(&str, Check)] = &[
    ("num_frames", Check::PositiveU32),
    ("fps", Check::PositiveNumber),
    ("max_duration", Check::PositiveNumber),
];

const IMAGE_CHECKS: &[(&str, Check)] = &[
    ("image_mode", Check::ImageMode),
    ("rgba_background_color", Check::Rgb),
];

fn run_checks(
    field: KwargsField,
    prefix: &str,
    map: &KwargsMap,
    checks: &[(&str, Check)],
) -> Result<(), PolicyError> {
    for (key, check) in checks {
        if let Some(value) = map.get(*key) {
            if !check.accepts(value) {
                return Err(PolicyError::InvalidKwarg {
                    field,
                    path: format!("{prefix}.{key}"),
                    expected: check.expected(value),
                    got: compact_json(value),
                });
            }
        }
    }
    Ok(())
}

/// Type-checks the known keys of a (merged) `mm_processor_kwargs`:
/// `min_pixels`, `max_pixels` (positive integers, `min_pixels <= max_pixels`),
/// `num_crops`, `num_frames` (positive integers), `fps` (positive number).
pub fn validate_mm_processor(map: &KwargsMap) -> Result<(), PolicyError> {
    let field = KwargsField::MmProcessorKwargs;
    run_checks(field, field.as_str(), map, MM_PROCESSOR_CHECKS)?;
    let min = map.get("min_pixels").and_then(Value::as_u64);
    let max = map.get("max_pixels").and_then(Value::as_u64);
    if let (Some(min), Some(max)) = (min, max) {
        if min > max {
            return Err(PolicyError::InconsistentKwargs {
                field,
                reason: format!("min_pixels ({min}) must not be greater than max_pixels ({max})"),
            });
        }
    }
    Ok(())
}

/// Type-checks the known keys of a (merged) `media_io_kwargs`: video
/// `num_frames` (positive integer), `fps`, `max_duration` (positive numbers);
/// image `image_mode` (one of [`IMAGE_MODES`]), `rgba_background_color` (three
/// integers 0..=255).
pub fn validate_media_io(media: &BTreeMap<String, KwargsMap>) -> Result<(), PolicyError> {
    let field = KwargsField::MediaIoKwargs;
    for (modality, map) in media {
        let checks = match modality.as_str() {
            "video" => VIDEO_CHECKS,
            "image" => IMAGE_CHECKS,
            _ => continue,
        };
        run_checks(
            field,
            &format!("{}.{modality}", field.as_str()),
            map,
            checks,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn video(merged: &MergedKwargs) -> crate::options::VideoLoadOptions {
        merged.media_options().video().unwrap().clone()
    }

    fn processor(merged: &MergedKwargs) -> crate::options::ProcessorOptions {
        merged.media_options().processor().unwrap().clone()
    }

    fn obj(value: Value) -> KwargsMap {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn defaults() -> DeploymentDefaults {
        DeploymentDefaults::from_json(
            Some(r#"{"max_pixels": 1000000, "num_crops": 4}"#),
            Some(r#"{"video": {"num_frames": 40, "fps": 2, "threads": 4}, "image": {"image_mode": "RGB"}}"#),
        )
        .expect("valid defaults")
    }

    #[test]
    fn from_json_parses_both_flags() {
        let d = defaults();
        assert_eq!(d.mm_processor_kwargs.get("num_crops"), Some(&json!(4)));
        assert_eq!(
            d.media_io_kwargs
                .get("video")
                .and_then(|v| v.get("num_frames")),
            Some(&json!(40))
        );
        assert!(!d.is_empty());
        let empty = DeploymentDefaults::from_json(None, None).expect("empty");
        assert!(empty.is_empty());
        assert_eq!(empty, DeploymentDefaults::default());
    }

    #[test]
    fn from_json_errors_are_one_line_and_name_the_flag() {
        let cases = [
            (
                Some("{not json"),
                None,
                "--mm-processor-kwargs",
                "not valid JSON",
            ),
            (
                Some("[1]"),
                None,
                "--mm-processor-kwargs",
                "expected a JSON object, got a list",
            ),
            (
                None,
                Some("\"video\""),
                "--media-io-kwargs",
                "keyed by modality, got a string",
            ),
            (
                None,
                Some(r#"{"video": 32}"#),
                "--media-io-kwargs",
                "the entry for modality 'video' must be a JSON object, got a number",
            ),
            (
                None,
                Some(r#"{"video": {"num_frames": 0}}"#),
                "--media-io-kwargs",
                "media_io_kwargs.video.num_frames",
            ),
            (
                Some(r#"{"min_pixels": 10, "max_pixels": 5}"#),
                None,
                "--mm-processor-kwargs",
                "min_pixels (10) must not be greater than max_pixels (5)",
            ),
        ];
        for (mm, media, flag, needle) in cases {
            let err = DeploymentDefaults::from_json(mm, media).expect_err(needle);
            let msg = err.message();
            assert!(msg.starts_with(&format!("Invalid {flag}: ")), "{msg}");
            assert!(msg.contains(needle), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
            assert!(err.is_startup_error());
        }
    }

    #[test]
    fn untrusted_gets_exactly_the_deployment_values() {
        let d = defaults();
        let req = obj(json!({"num_crops": 9}));
        let media = obj(json!({"video": {"num_frames": 2}}));
        let merged = merge(&d, Some(&req), Some(&media), false).expect("merge");
        assert_eq!(merged.mm_processor_kwargs(), &d.mm_processor_kwargs);
        assert_eq!(merged.media_io_kwargs(), &d.media_io_kwargs);
        assert_eq!(video(&merged).num_frames, Some(40));
        assert_eq!(video(&merged).fps, Some(2.0));
        assert!(merged.ignored_request_keys().is_empty());
    }

    #[test]
    fn trusted_mm_is_a_shallow_union_request_wins() {
        let d = defaults();
        let req = obj(json!({"num_crops": 9, "size": {"shortest_edge": 10}}));
        let merged = merge(&d, Some(&req), None, true).expect("merge");
        assert_eq!(processor(&merged).num_crops, Some(9));
        assert_eq!(processor(&merged).max_pixels, Some(1_000_000));
        assert_eq!(
            merged.mm_processor_kwargs().get("size"),
            Some(&json!({"shortest_edge": 10}))
        );
    }

    #[test]
    fn trusted_num_frames_alone_drops_deployment_fps() {
        let d = defaults();
        let media = obj(json!({"video": {"num_frames": 8}}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        assert_eq!(video(&merged).num_frames, Some(8));
        assert_eq!(video(&merged).fps, None);
    }

    #[test]
    fn trusted_fps_alone_drops_deployment_num_frames() {
        let d = defaults();
        let media = obj(json!({"video": {"fps": 0.5}}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        assert_eq!(video(&merged).fps, Some(0.5));
        assert_eq!(video(&merged).num_frames, None);
    }

    #[test]
    fn trusted_both_video_keys_take_both() {
        let d = defaults();
        let media = obj(json!({"video": {"fps": 1, "num_frames": 4}}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        assert_eq!(video(&merged).fps, Some(1.0));
        assert_eq!(video(&merged).num_frames, Some(4));
    }

    #[test]
    fn trusted_other_video_key_keeps_both_defaults() {
        let d = defaults();
        let media = obj(json!({"video": {"max_duration": 10}}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        assert_eq!(video(&merged).fps, Some(2.0));
        assert_eq!(video(&merged).num_frames, Some(40));
        assert_eq!(video(&merged).max_duration_s, Some(10.0));
    }

    #[test]
    fn per_modality_merge_keeps_other_modalities() {
        let d = defaults();
        let media = obj(json!({"image": {"rgba_background_color": [0, 0, 0]}, "audio": {"x": 1}}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        let image = merged.media_options().image().unwrap();
        assert_eq!(image.image_mode, crate::options::ImageMode::Rgb);
        assert_eq!(image.rgba_background_color, [0, 0, 0]);
        assert_eq!(video(&merged).num_frames, Some(40));
        assert_eq!(
            merged.media_kwargs("audio").and_then(|a| a.get("x")),
            Some(&json!(1))
        );
    }

    #[test]
    fn startup_only_keys_are_never_taken_from_a_request() {
        let d = defaults();
        let req = obj(json!({"device": "cuda", "num_crops": 2}));
        let media = obj(json!({"video": {"threads": 64, "hwaccel": "cuda", "num_frames": 8}}));
        let merged = merge(&d, Some(&req), Some(&media), true).expect("merge");
        // The deployment's own start-up value is kept, the request's is dropped.
        assert_eq!(
            merged.media_kwargs("video").and_then(|v| v.get("threads")),
            Some(&json!(4))
        );
        assert!(merged
            .media_kwargs("video")
            .is_some_and(|v| !v.contains_key("hwaccel")));
        assert!(!merged.mm_processor_kwargs().contains_key("device"));
        assert_eq!(processor(&merged).num_crops, Some(2));
        assert_eq!(video(&merged).num_frames, Some(8));
        assert_eq!(
            merged.ignored_request_keys(),
            &[
                "mm_processor_kwargs.device".to_owned(),
                "media_io_kwargs.video.threads".to_owned(),
                "media_io_kwargs.video.hwaccel".to_owned(),
            ]
        );
        for key in STARTUP_ONLY_KEYS {
            assert!(is_startup_only_key(key));
        }
        assert!(!is_startup_only_key("num_frames"));
    }

    #[test]
    fn null_request_values_are_ignored() {
        let d = defaults();
        let media = obj(json!({"video": {"num_frames": null}, "image": null}));
        let merged = merge(&d, None, Some(&media), true).expect("merge");
        assert_eq!(video(&merged).num_frames, Some(40));
        assert_eq!(video(&merged).fps, Some(2.0));
        assert_eq!(
            merged.media_options().image().unwrap().image_mode,
            crate::options::ImageMode::Rgb
        );
    }

    #[test]
    fn invalid_values_name_the_key() {
        let d = DeploymentDefaults::default();
        let media = obj(json!({"video": {"num_frames": "invalid"}}));
        let err = merge(&d, None, Some(&media), true).expect_err("invalid");
        assert_eq!(
            err.message(),
            "Invalid value for media_io_kwargs.video.num_frames: expected a positive integer, \
             got \"invalid\""
        );
        assert_eq!(err.param(), Some("media_io_kwargs"));
        assert_eq!(err.status(), 400);

        let cases: Vec<(Value, Value, &str, &str)> = vec![
            (
                json!({}),
                json!({"video": {"num_frames": -3}}),
                "media_io_kwargs.video.num_frames",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"num_frames": 2.5}}),
                "media_io_kwargs.video.num_frames",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"num_frames": true}}),
                "media_io_kwargs.video.num_frames",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"num_frames": 5_000_000_000u64}}),
                "media_io_kwargs.video.num_frames",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"fps": 0}}),
                "media_io_kwargs.video.fps",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"fps": "2"}}),
                "media_io_kwargs.video.fps",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"max_duration": -1}}),
                "media_io_kwargs.video.max_duration",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"image": {"image_mode": "RGBZ"}}),
                "media_io_kwargs.image.image_mode",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"image": {"rgba_background_color": [0, 0]}}),
                "media_io_kwargs.image.rgba_background_color",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"image": {"rgba_background_color": [0, 0, 256]}}),
                "media_io_kwargs.image.rgba_background_color",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"image": {"rgba_background_color": "#ffffff"}}),
                "media_io_kwargs.image.rgba_background_color",
                "media_io_kwargs",
            ),
            (
                json!({"min_pixels": -1}),
                json!({}),
                "mm_processor_kwargs.min_pixels",
                "mm_processor_kwargs",
            ),
            (
                json!({"max_pixels": 0}),
                json!({}),
                "mm_processor_kwargs.max_pixels",
                "mm_processor_kwargs",
            ),
            (
                json!({"num_crops": "4"}),
                json!({}),
                "mm_processor_kwargs.num_crops",
                "mm_processor_kwargs",
            ),
            (
                json!({"fps": -2.0}),
                json!({}),
                "mm_processor_kwargs.fps",
                "mm_processor_kwargs",
            ),
            (
                json!({"num_frames": 0}),
                json!({}),
                "mm_processor_kwargs.num_frames",
                "mm_processor_kwargs",
            ),
        ];
        for (mm, media, path, param) in cases {
            let (mm, media) = (obj(mm), obj(media));
            let err = merge(&d, Some(&mm), Some(&media), true).expect_err(path);
            assert!(
                err.message()
                    .starts_with(&format!("Invalid value for {path}: expected ")),
                "{}",
                err.message()
            );
            assert_eq!(err.param(), Some(param), "{path}");
            assert_eq!(err.status(), 400);
        }
    }

    #[test]
    fn too_large_frame_count_says_the_bound() {
        let media = obj(json!({"video": {"num_frames": 5_000_000_000u64}}));
        let err =
            merge(&DeploymentDefaults::default(), None, Some(&media), true).expect_err("too large");
        assert_eq!(
            err.message(),
            "Invalid value for media_io_kwargs.video.num_frames: expected a positive integer \
             (at most 4294967295), got 5000000000"
        );
    }

    #[test]
    fn min_pixels_above_max_pixels_after_merge() {
        // The deployment sets max_pixels; a trusted request raises min_pixels above it.
        let d = defaults();
        let req = obj(json!({"min_pixels": 2_000_000}));
        let err = merge(&d, Some(&req), None, true).expect_err("inconsistent");
        assert_eq!(
            err.message(),
            "Invalid mm_processor_kwargs: min_pixels (2000000) must not be greater than \
             max_pixels (1000000)"
        );
        assert_eq!(err.param(), Some("mm_processor_kwargs"));
        let req = obj(json!({"min_pixels": 1000, "max_pixels": 2_000_000}));
        let merged = merge(&d, Some(&req), None, true).expect("consistent");
        assert_eq!(processor(&merged).min_pixels, Some(1000));
        assert_eq!(processor(&merged).max_pixels, Some(2_000_000));
    }

    #[test]
    fn unknown_keys_and_modalities_pass_through() {
        let req = obj(json!({"do_pan_and_scan": true}));
        let media = obj(json!({"video": {"custom": [1, 2]}, "point_cloud": {"density": "high"}}));
        let merged = merge(
            &DeploymentDefaults::default(),
            Some(&req),
            Some(&media),
            true,
        )
        .expect("merge");
        assert_eq!(
            merged.mm_processor_kwargs().get("do_pan_and_scan"),
            Some(&json!(true))
        );
        assert_eq!(
            merged
                .media_kwargs("point_cloud")
                .and_then(|m| m.get("density")),
            Some(&json!("high"))
        );
        assert_eq!(
            merged.media_kwargs_value("video"),
            json!({"custom": [1, 2]})
        );
        assert_eq!(merged.media_kwargs_value("audio"), json!({}));
    }

    #[test]
    fn non_object_modality_entry_in_request_is_refused() {
        let media = obj(json!({"video": [8]}));
        let err = merge(&DeploymentDefaults::default(), None, Some(&media), true)
            .expect_err("list entry");
        assert_eq!(
            err.message(),
            "Invalid value for media_io_kwargs.video: expected a JSON object, got a list"
        );
        assert_eq!(err.param(), Some("media_io_kwargs"));
    }

    #[test]
    fn image_modes_and_mm_options() {
        // Every PIL mode passes validation; the loader takes the four it decodes to and
        // refuses the others when an image is loaded.
        for (mode, decoded) in [
            ("RGB", true),
            ("RGBA", true),
            ("L", true),
            ("1", false),
            ("CMYK", false),
            ("I;16", false),
        ] {
            let media = obj(json!({"image": {"image_mode": mode}}));
            let merged =
                merge(&DeploymentDefaults::default(), None, Some(&media), true).expect(mode);
            let image = merged.media_options().image();
            assert_eq!(image.is_ok(), decoded, "{mode}");
            if let Err(e) = image {
                assert_eq!(
                    e.to_string(),
                    "Invalid media_io_kwargs.image.image_mode: must be one of RGB, RGBA, L, LA"
                );
            }
        }
        let req = obj(json!({"fps": 1.5, "num_frames": 16, "num_crops": 3}));
        let merged = merge(&DeploymentDefaults::default(), Some(&req), None, true).expect("ok");
        assert_eq!(processor(&merged).fps, Some(1.5));
        assert_eq!(processor(&merged).num_frames, Some(16));
        assert_eq!(processor(&merged).num_crops, Some(3));
        assert_eq!(
            merged.mm_processor_kwargs_value(),
            json!({"fps": 1.5, "num_frames": 16, "num_crops": 3})
        );
    }
}
