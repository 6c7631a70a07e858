//! Media items per prompt: `--limit-mm-per-prompt` (CONTRACT section 4).
//!
//! The flag is a JSON object keyed by modality. A value is either a
//! non-negative integer (`'{"image": 2, "video": 0}'`) or, as in newer vLLM, an
//! object of dummy-input options whose `count` is the limit
//! (`'{"video": {"count": 1, "num_frames": 32, "width": 512, "height": 512}}'`;
//! `count` defaults to the per-modality default; the other options, which
//! vLLM uses to size profiling inputs, must be positive integers and are not
//! otherwise used here).
//!
//! Items are counted across all messages of one prompt; too many is a 400
//! `At most 2 image(s) may be provided in one prompt.` with `param` the
//! modality. A limit of 0 refuses any item of that modality (`At most 0 ...`).
//!
//! A modality the flag does not name gets `default_per_modality`: `None` means
//! unlimited. vLLM's V1 engine defaults to [`VLLM_DEFAULT_LIMIT_PER_MODALITY`]
//! (999) per modality the model supports (its legacy V0 engine used 1); the
//! gateway should pass 0 for modalities the model cannot take at all via
//! [`LimitMmPerPrompt::set_limit`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{describe_json_type, PolicyError};

/// vLLM (V1)'s default number of items per modality and prompt.
pub const VLLM_DEFAULT_LIMIT_PER_MODALITY: usize = 999;

/// Dummy-input options accepted next to `count` in the object form.
const DUMMY_OPTION_KEYS: &[&str] = &["num_frames", "width", "height", "length"];

const OPTION: &str = "--limit-mm-per-prompt";

/// Per-modality limits on media items per prompt.
///
/// [`Default`] is vLLM's: no explicit limits, [`VLLM_DEFAULT_LIMIT_PER_MODALITY`]
/// for every modality.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitMmPerPrompt {
    limits: BTreeMap<String, usize>,
    default_per_modality: Option<usize>,
}

impl Default for LimitMmPerPrompt {
    fn default() -> Self {
        LimitMmPerPrompt::new(Some(VLLM_DEFAULT_LIMIT_PER_MODALITY))
    }
}

impl LimitMmPerPrompt {
    /// Parses the `--limit-mm-per-prompt` JSON with vLLM's default
    /// ([`VLLM_DEFAULT_LIMIT_PER_MODALITY`]) for modalities it does not name.
    pub fn from_json(json: &str) -> Result<Self, PolicyError> {
        Self::parse(Some(json), Some(VLLM_DEFAULT_LIMIT_PER_MODALITY))
    }

    /// No explicit limits; every modality gets `default_per_modality`
    /// (`None` = unlimited).
    pub fn new(default_per_modality: Option<usize>) -> Self {
        LimitMmPerPrompt {
            limits: BTreeMap::new(),
            default_per_modality,
        }
    }

    /// Parses the `--limit-mm-per-prompt` JSON (`None` = flag not given).
    pub fn parse(
        json: Option<&str>,
        default_per_modality: Option<usize>,
    ) -> Result<Self, PolicyError> {
        let mut limits = LimitMmPerPrompt::new(default_per_modality);
        let Some(text) = json else {
            return Ok(limits);
        };
        let value: Value = serde_json::from_str(text)
            .map_err(|e| config_error(format!("not valid JSON ({e})")))?;
        limits.apply_value(&value)?;
        Ok(limits)
    }

    /// Builds the limits from an already-parsed value (e.g. from `--config`
    /// YAML). `null` means "not set".
    pub fn from_value(
        value: &Value,
        default_per_modality: Option<usize>,
    ) -> Result<Self, PolicyError> {
        let mut limits = LimitMmPerPrompt::new(default_per_modality);
        limits.apply_value(value)?;
        Ok(limits)
    }

    fn apply_value(&mut self, value: &Value) -> Result<(), PolicyError> {
        let map = match value {
            Value::Null => return Ok(()),
            Value::Object(map) => map,
            other => {
                return Err(config_error(format!(
                    "expected a JSON object keyed by modality, got {}",
                    describe_json_type(other)
                )))
            }
        };
        for (modality, entry) in map {
            if modality.is_empty() {
                return Err(config_error("a modality name must not be empty".to_owned()));
            }
            let limit = match entry {
                Value::Object(options) => self.parse_options(modality, options)?,
                other => as_count(other).ok_or_else(|| {
                    config_error(format!(
                        "the limit for '{modality}' must be a non-negative integer or an object \
                         with a 'count', got {other}"
                    ))
                })?,
            };
            self.limits.insert(modality.clone(), limit);
        }
        Ok(())
    }

    fn parse_options(
        &self,
        modality: &str,
        options: &serde_json::Map<String, Value>,
    ) -> Result<usize, PolicyError> {
        for (key, value) in options {
            if key == "count" {
                continue;
            }
            if !DUMMY_OPTION_KEYS.contains(&key.as_str()) {
                return Err(config_error(format!(
                    "unknown option '{key}' for '{modality}' (expected count, {})",
                    DUMMY_OPTION_KEYS.join(", ")
                )));
            }
            if value.as_u64().is_none_or(|n| n == 0) {
                return Err(config_error(format!(
                    "'{modality}.{key}' must be a positive integer, got {value}"
                )));
            }
        }
        match options.get("count") {
            None => Ok(self
                .default_per_modality
                .unwrap_or(VLLM_DEFAULT_LIMIT_PER_MODALITY)),
            Some(count) => as_count(count).ok_or_else(|| {
                config_error(format!(
                    "'{modality}.count' must be a non-negative integer, got {count}"
                ))
            }),
        }
    }

    /// Sets (or overrides) one modality's limit.
    pub fn set_limit(&mut self, modality: impl Into<String>, limit: usize) {
        self.limits.insert(modality.into(), limit);
    }

    /// The limit for a modality: the configured one, else the default; `None`
    /// means unlimited.
    pub fn limit_for(&self, modality: &str) -> Option<usize> {
        self.limits
            .get(modality)
            .copied()
            .or(self.default_per_modality)
    }

    /// The explicitly configured limits (for `/v1/models`' `limit_mm_per_prompt`).
    pub fn configured(&self) -> &BTreeMap<String, usize> {
        &self.limits
    }

    /// The default for modalities not configured (`None` = unlimited).
    pub fn default_per_modality(&self) -> Option<usize> {
        self.default_per_modality
    }

    /// Checks one modality's item count.
    pub fn check_count(&self, modality: &str, count: usize) -> Result<(), PolicyError> {
        match self.limit_for(modality) {
            Some(limit) if count > limit => Err(PolicyError::TooManyMediaItems {
                modality: modality.to_owned(),
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// Checks the item counts of one prompt (modality -> items across all
    /// messages). The first modality over its limit, in key order, is reported.
    pub fn check_counts(&self, counts: &BTreeMap<String, usize>) -> Result<(), PolicyError> {
        counts
            .iter()
            .try_for_each(|(modality, count)| self.check_count(modality, *count))
    }
}

fn as_count(value: &Value) -> Option<usize> {
    value.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn config_error(reason: String) -> PolicyError {
    PolicyError::InvalidConfig {
        option: OPTION.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(items: &[(&str, usize)]) -> BTreeMap<String, usize> {
        items.iter().map(|(m, c)| ((*m).to_owned(), *c)).collect()
    }

    #[test]
    fn over_the_limit_is_a_400_naming_the_modality() {
        let limits = LimitMmPerPrompt::parse(Some(r#"{"image": 2}"#), Some(1)).expect("parse");
        assert_eq!(limits.check_counts(&counts(&[("image", 2)])), Ok(()));
        let err = limits
            .check_counts(&counts(&[("image", 3)]))
            .expect_err("too many");
        assert_eq!(
            err.message(),
            "At most 2 image(s) may be provided in one prompt."
        );
        assert_eq!(err.param(), Some("image"));
        assert_eq!(err.status(), 400);
        assert_eq!(err.error_type(), "BadRequestError");
    }

    #[test]
    fn zero_limit_refuses_any_item() {
        let limits = LimitMmPerPrompt::parse(Some(r#"{"video": 0}"#), None).expect("parse");
        assert_eq!(limits.check_counts(&counts(&[("video", 0)])), Ok(()));
        let err = limits
            .check_counts(&counts(&[("video", 1)]))
            .expect_err("zero");
        assert_eq!(
            err.message(),
            "At most 0 video(s) may be provided in one prompt."
        );
        assert_eq!(err.param(), Some("video"));
    }

    #[test]
    fn unset_modalities_get_the_default() {
        let limits = LimitMmPerPrompt::parse(Some(r#"{"image": 2}"#), Some(1)).expect("parse");
        assert_eq!(limits.limit_for("audio"), Some(1));
        let err = limits
            .check_counts(&counts(&[("audio", 2), ("image", 1)]))
            .expect_err("audio");
        assert_eq!(
            err.message(),
            "At most 1 audio(s) may be provided in one prompt."
        );

        let unlimited = LimitMmPerPrompt::parse(None, None).expect("parse");
        assert_eq!(unlimited.limit_for("image"), None);
        assert_eq!(
            unlimited.check_counts(&counts(&[("image", 10_000)])),
            Ok(())
        );

        let vllm = LimitMmPerPrompt::default();
        assert_eq!(vllm.check_count("image", 999), Ok(()));
        assert!(vllm.check_count("image", 1000).is_err());
    }

    #[test]
    fn object_form_takes_count() {
        let limits = LimitMmPerPrompt::parse(
            Some(r#"{"video": {"count": 1, "num_frames": 32, "width": 512, "height": 512}, "image": 3}"#),
            None,
        )
        .expect("parse");
        assert_eq!(limits.limit_for("video"), Some(1));
        assert_eq!(limits.limit_for("image"), Some(3));
        assert_eq!(limits.configured().len(), 2);
        let no_count =
            LimitMmPerPrompt::parse(Some(r#"{"image": {"width": 64}}"#), Some(4)).expect("parse");
        assert_eq!(no_count.limit_for("image"), Some(4));
        let no_count = LimitMmPerPrompt::parse(Some(r#"{"image": {}}"#), None).expect("parse");
        assert_eq!(
            no_count.limit_for("image"),
            Some(VLLM_DEFAULT_LIMIT_PER_MODALITY)
        );
    }

    #[test]
    fn bad_flags_are_startup_errors() {
        for bad in [
            "{",
            "[1]",
            r#"{"image": -1}"#,
            r#"{"image": 1.5}"#,
            r#"{"image": "2"}"#,
            r#"{"video": {"count": -1}}"#,
            r#"{"video": {"count": 1, "num_frames": 0}}"#,
            r#"{"video": {"count": 1, "fps": 2}}"#,
            r#"{"": 1}"#,
        ] {
            let err = LimitMmPerPrompt::parse(Some(bad), None).expect_err(bad);
            assert!(err.is_startup_error(), "{bad}");
            assert!(
                err.message().starts_with("Invalid --limit-mm-per-prompt: "),
                "{}",
                err.message()
            );
        }
    }

    #[test]
    fn set_limit_overrides() {
        let mut limits = LimitMmPerPrompt::parse(Some(r#"{"image": 5}"#), None).expect("parse");
        limits.set_limit("image", 0);
        limits.set_limit("audio", 0);
        assert_eq!(limits.limit_for("image"), Some(0));
        assert!(limits.check_count("audio", 1).is_err());
        assert_eq!(limits.default_per_modality(), None);
        let from_json = LimitMmPerPrompt::from_json(r#"{"image": 2}"#).expect("json");
        assert_eq!(from_json.limit_for("image"), Some(2));
        assert_eq!(
            from_json.limit_for("video"),
            Some(VLLM_DEFAULT_LIMIT_PER_MODALITY)
        );
        let from_value =
            LimitMmPerPrompt::from_value(&serde_json::json!({"image": 2}), Some(1)).expect("value");
        assert_eq!(from_value.limit_for("image"), Some(2));
    }
}
