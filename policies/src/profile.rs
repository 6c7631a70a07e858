//! The trusted-client profile (CONTRACT section 8, beyond vLLM).
//!
//! Instead of trusting every client (`--trust-request-mm-kwargs`, which keeps
//! vLLM's meaning: everyone trusted, no bounds), an operator can name the API
//! keys that may send `mm_processor_kwargs` / `media_io_kwargs`, and bound what
//! they may ask for with JSON Schemas over the *merged* kwargs (deployment
//! defaults plus the request). Other keys keep the default rejection.
//!
//! The policy file (YAML or JSON; see `policies/examples/trusted-clients.yaml`):
//!
//! ```yaml
//! trusted_keys:              # also accepted as `trusted_api_keys`
//!   - "sk-plain-text-key"
//!   - "sha256:<64 hex digits of the key's SHA-256>"
//! bounds:                    # one JSON Schema per modality (merged media_io_kwargs.<modality>)
//!   video:
//!     type: object
//!     properties:
//!       num_frames: {type: integer, minimum: 1, maximum: 64}
//!     additionalProperties: false
//!   mm_processor_kwargs:     # optional: the merged, flat mm_processor_kwargs
//!     type: object
//!     properties:
//!       max_pixels: {type: integer, maximum: 1605632}
//! ```
//!
//! * Keys are compared in constant time: each stored key is kept as its SHA-256
//!   digest, the presented key is hashed, and it is compared with every stored
//!   digest (no early exit) using `subtle`.
//! * Every schema is compiled once at start-up; an invalid one is a start-up
//!   error naming the modality (or `mm_processor_kwargs`).
//! * [`TrustedClientPolicy::check_bounds`] validates each modality that has a
//!   schema against the merged kwargs of that modality (`{}` when none are
//!   set), then `mm_processor_kwargs`; the first violation is a 400 naming the
//!   key and the bound, e.g. `media_io_kwargs.video.num_frames: 128 is greater
//!   than the maximum of 64`, with `param` `media_io_kwargs` or
//!   `mm_processor_kwargs`. A modality (or `mm_processor_kwargs`) without a
//!   schema is not bounded: list every modality the model takes, with
//!   `additionalProperties: false`, to allow only listed keys.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::error::{compact_json, KwargsField, PolicyError};
use crate::merge::{DeploymentDefaults, MergedKwargs};

/// The on-disk shape of the policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(alias = "trusted_api_keys")]
    trusted_keys: Vec<String>,
    /// Modality -> schema, plus the optional `mm_processor_kwargs` schema.
    #[serde(default)]
    bounds: BTreeMap<String, Value>,
}

/// The compiled trusted-client policy.
pub struct TrustedClientPolicy {
    key_digests: Vec<[u8; 32]>,
    media_schemas: BTreeMap<String, Validator>,
    mm_schema: Option<Validator>,
}

impl std::fmt::Debug for TrustedClientPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key digests.
        f.debug_struct("TrustedClientPolicy")
            .field("trusted_keys", &self.key_digests.len())
            .field(
                "media_schemas",
                &self.media_schemas.keys().collect::<Vec<_>>(),
            )
            .field("mm_processor_kwargs_schema", &self.mm_schema.is_some())
            .finish()
    }
}

/// Which syntax a policy text is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syntax {
    Json,
    Yaml,
}

impl TrustedClientPolicy {
    /// Loads a policy file: JSON for a `.json` extension, YAML for `.yaml` /
    /// `.yml`, otherwise by content (JSON when it starts with `{`).
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let source_name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::InvalidPolicyFile {
            source_name: source_name.clone(),
            reason: e.to_string(),
        })?;
        let syntax = match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("json") => Syntax::Json,
            Some("yaml" | "yml") => Syntax::Yaml,
            _ => sniff(&text),
        };
        Self::parse(&text, syntax, &source_name)
    }

    fn parse(text: &str, syntax: Syntax, source_name: &str) -> Result<Self, PolicyError> {
        let file_error = |reason: String| PolicyError::InvalidPolicyFile {
            source_name: source_name.to_owned(),
            reason,
        };
        let file: PolicyFile = match syntax {
            Syntax::Json => serde_json::from_str(text).map_err(|e| file_error(e.to_string()))?,
            Syntax::Yaml => serde_yaml::from_str(text).map_err(|e| file_error(e.to_string()))?,
        };
        if file.trusted_keys.is_empty() {
            return Err(file_error("trusted_keys lists no keys".to_owned()));
        }
        let key_digests = file
            .trusted_keys
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                key_digest(entry)
                    .map_err(|reason| file_error(format!("trusted_keys[{i}]: {reason}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mm_key = KwargsField::MmProcessorKwargs.as_str();
        let mut media_schemas = BTreeMap::new();
        let mut mm_schema = None;
        for (target, schema) in &file.bounds {
            let validator = compile(target, schema)?;
            if target == mm_key {
                mm_schema = Some(validator);
            } else {
                media_schemas.insert(target.clone(), validator);
            }
        }
        Ok(TrustedClientPolicy {
            key_digests,
            media_schemas,
            mm_schema,
        })
    }

    /// Whether the presented API key (the `Authorization: Bearer` token) is
    /// trusted. `None` is never trusted. Constant time in the key's content.
    pub fn is_trusted(&self, api_key: Option<&str>) -> bool {
        let Some(key) = api_key else {
            return false;
        };
        let presented: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = Choice::from(0);
        for stored in &self.key_digests {
            found |= stored.ct_eq(&presented);
        }
        found.into()
    }

    /// How many keys the policy trusts.
    pub fn trusted_key_count(&self) -> usize {
        self.key_digests.len()
    }

    /// The modalities that have a schema.
    pub fn bounded_modalities(&self) -> impl Iterator<Item = &str> {
        self.media_schemas.keys().map(String::as_str)
    }

    /// Whether `mm_processor_kwargs` has a schema.
    pub fn bounds_mm_processor_kwargs(&self) -> bool {
        self.mm_schema.is_some()
    }

    /// Checks the merged kwargs of a trusted request against the schemas.
    pub fn check_bounds(&self, merged: &MergedKwargs) -> Result<(), PolicyError> {
        for (modality, validator) in &self.media_schemas {
            let instance = merged.media_kwargs_value(modality);
            let prefix = format!("{}.{modality}", KwargsField::MediaIoKwargs.as_str());
            check_one(validator, &instance, KwargsField::MediaIoKwargs, &prefix)?;
        }
        if let Some(validator) = &self.mm_schema {
            let instance = merged.mm_processor_kwargs_value();
            let field = KwargsField::MmProcessorKwargs;
            check_one(validator, &instance, field, field.as_str())?;
        }
        Ok(())
    }

    /// Start-up check that the deployment defaults on their own satisfy the
    /// schemas (otherwise every trusted request would be refused).
    pub fn check_deployment_defaults(
        &self,
        defaults: &DeploymentDefaults,
    ) -> Result<(), PolicyError> {
        let merged = crate::merge::merge(defaults, None, None, false)?;
        self.check_bounds(&merged)
            .map_err(|e| PolicyError::InvalidPolicyFile {
                source_name: "bounds".to_owned(),
                reason: format!("the deployment defaults break the policy: {}", e.message()),
            })
    }
}

impl FromStr for TrustedClientPolicy {
    type Err = PolicyError;

    /// Parses a policy from text (JSON when it starts with `{`, else YAML).
    fn from_str(text: &str) -> Result<Self, PolicyError> {
        Self::parse(text, sniff(text), "<string>")
    }
}

fn sniff(text: &str) -> Syntax {
    if text.trim_start().starts_with('{') {
        Syntax::Json
    } else {
        Syntax::Yaml
    }
}

/// A stored key's digest: `sha256:<hex>` as given, a plain key hashed.
fn key_digest(entry: &str) -> Result<[u8; 32], String> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err("an empty key".to_owned());
    }
    let hashed = entry
        .get(..7)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("sha256:"));
    if !hashed {
        return Ok(Sha256::digest(entry.as_bytes()).into());
    }
    let hex_digits = &entry[7..];
    let bytes = hex::decode(hex_digits)
        .map_err(|e| format!("'sha256:' must be followed by 64 hex digits ({e})"))?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        format!(
            "'sha256:' must be followed by 64 hex digits, got {}",
            hex_digits.len()
        )
    })
}

fn compile(target: &str, schema: &Value) -> Result<Validator, PolicyError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(PolicyError::InvalidSchema {
            target: target.to_owned(),
            reason: format!(
                "a schema must be an object or a boolean, got {}",
                compact_json(schema)
            ),
        });
    }
    jsonschema::validator_for(schema).map_err(|e| PolicyError::InvalidSchema {
        target: target.to_owned(),
        reason: e.to_string(),
    })
}

fn check_one(
    validator: &Validator,
    instance: &Value,
    field: KwargsField,
    prefix: &str,
) -> Result<(), PolicyError> {
    match validator.iter_errors(instance).next() {
        None => Ok(()),
        Some(error) => Err(PolicyError::KwargsOutOfBounds {
            field,
            detail: describe_violation(&error, prefix),
        }),
    }
}

/// `prefix` plus the instance path, dotted (`media_io_kwargs.video.num_frames`,
/// list items as `[i]`).
fn dotted_path(error: &ValidationError<'_>, prefix: &str) -> String {
    let mut path = prefix.to_owned();
    for segment in error.instance_path().segments() {
        match segment {
            LocationSegment::Property(name) => {
                path.push('.');
                path.push_str(&name);
            }
            LocationSegment::Index(index) => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// One violation as a message naming the key and the bound.
fn describe_violation(error: &ValidationError<'_>, prefix: &str) -> String {
    let path = dotted_path(error, prefix);
    let value = compact_json(error.instance());
    match error.kind() {
        ValidationErrorKind::Maximum { limit } => {
            format!("{path}: {value} is greater than the maximum of {limit}")
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("{path}: {value} is not less than the exclusive maximum of {limit}")
        }
        ValidationErrorKind::Minimum { limit } => {
            format!("{path}: {value} is less than the minimum of {limit}")
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("{path}: {value} is not greater than the exclusive minimum of {limit}")
        }
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            let keys: Vec<String> = unexpected.iter().map(|k| format!("{path}.{k}")).collect();
            let (noun, verb) = if keys.len() == 1 {
                ("key", "is")
            } else {
                ("keys", "are")
            };
            format!(
                "{}: {noun} {verb} not allowed by the trusted-client policy",
                keys.join(", ")
            )
        }
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            format!("{path}.{name}: is required by the trusted-client policy")
        }
        ValidationErrorKind::MaxItems { limit } => {
            format!("{path}: has more than {limit} items")
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!("{path}: is longer than {limit} characters")
        }
        _ => format!("{path}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::{merge, KwargsMap};
    use serde_json::json;

    const POLICY: &str = r#"
trusted_keys:
  - "sk-trusted"
  - "sha256:4f39e3c6c9ec5d4f3e1c2ba9b55c1bb4d4a9f71b5c0a3d1f0e5c1b5e2f0d8a11"
bounds:
  video:
    type: object
    properties:
      num_frames: {type: integer, minimum: 1, maximum: 64}
      fps: {type: number, exclusiveMinimum: 0, maximum: 4}
    additionalProperties: false
  image:
    type: object
    properties:
      image_mode: {enum: ["RGB", "L"]}
  mm_processor_kwargs:
    type: object
    properties:
      max_pixels: {type: integer, maximum: 1605632}
      min_pixels: {type: integer, minimum: 3136}
"#;

    fn policy() -> TrustedClientPolicy {
        TrustedClientPolicy::from_str(POLICY).expect("policy")
    }

    fn obj(value: Value) -> KwargsMap {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn merged(mm: Value, media: Value) -> MergedKwargs {
        let (mm, media) = (obj(mm), obj(media));
        merge(
            &DeploymentDefaults::default(),
            Some(&mm),
            Some(&media),
            true,
        )
        .expect("merge")
    }

    #[test]
    fn trusted_and_untrusted_keys() {
        let p = policy();
        assert!(p.is_trusted(Some("sk-trusted")));
        assert!(!p.is_trusted(Some("sk-trusted ")));
        assert!(!p.is_trusted(Some("sk-other")));
        assert!(!p.is_trusted(Some("")));
        assert!(!p.is_trusted(None));
        assert_eq!(p.trusted_key_count(), 2);
    }

    #[test]
    fn hashed_keys() {
        let digest = hex::encode(Sha256::digest(b"sk-hashed-secret"));
        let text = format!(
            "{{\"trusted_keys\": [\"sha256:{}\"]}}",
            digest.to_uppercase()
        );
        let p = TrustedClientPolicy::from_str(&text).expect("json policy");
        assert!(p.is_trusted(Some("sk-hashed-secret")));
        // The hash itself is not a key.
        assert!(!p.is_trusted(Some(&format!("sha256:{digest}"))));
        assert!(!p.is_trusted(Some(&digest)));
        assert!(!p.is_trusted(Some("sk-hashed-secre")));
    }

    #[test]
    fn bad_key_entries_are_startup_errors() {
        for text in [
            r#"{"trusted_keys": []}"#,
            r#"{"trusted_keys": [""]}"#,
            r#"{"trusted_keys": ["sha256:abcd"]}"#,
            r#"{"trusted_keys": ["sha256:zz"]}"#,
            r#"{"trusted_keys": ["k"], "unknown": 1}"#,
            r#"{"trusted_keys": ["k"], "media_io_kwargs": {}}"#,
            r#"{"bounds": {}}"#,
            "trusted_keys: [\"k\"\n",
        ] {
            let err = TrustedClientPolicy::from_str(text).expect_err(text);
            assert!(err.is_startup_error(), "{text}");
            assert!(
                err.message()
                    .starts_with("Invalid trusted-client policy <string>: "),
                "{}",
                err.message()
            );
        }
    }

    #[test]
    fn bound_violation_names_key_and_bound() {
        let p = policy();
        let m = merged(json!({}), json!({"video": {"num_frames": 128}}));
        let err = p.check_bounds(&m).expect_err("over");
        assert_eq!(
            err.message(),
            "media_io_kwargs.video.num_frames: 128 is greater than the maximum of 64"
        );
        assert_eq!(err.param(), Some("media_io_kwargs"));
        assert_eq!(err.status(), 400);
        assert_eq!(err.error_type(), "BadRequestError");
    }

    #[test]
    fn other_violations() {
        let p = policy();
        let cases = [
            (
                json!({"max_pixels": 2_000_000}),
                json!({}),
                "mm_processor_kwargs.max_pixels: 2000000 is greater than the maximum of 1605632",
                "mm_processor_kwargs",
            ),
            (
                json!({"min_pixels": 100}),
                json!({}),
                "mm_processor_kwargs.min_pixels: 100 is less than the minimum of 3136",
                "mm_processor_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"max_duration": 10}}),
                "media_io_kwargs.video.max_duration: key is not allowed by the trusted-client policy",
                "media_io_kwargs",
            ),
            (
                json!({}),
                json!({"video": {"fps": 8}}),
                "media_io_kwargs.video.fps: 8 is greater than the maximum of 4",
                "media_io_kwargs",
            ),
        ];
        for (mm, media, message, param) in cases {
            let err = p.check_bounds(&merged(mm, media)).expect_err(message);
            assert_eq!(err.message(), message);
            assert_eq!(err.param(), Some(param));
        }
        let err = p
            .check_bounds(&merged(json!({}), json!({"image": {"image_mode": "CMYK"}})))
            .expect_err("enum");
        assert!(
            err.message()
                .starts_with("media_io_kwargs.image.image_mode: "),
            "{}",
            err.message()
        );
    }

    #[test]
    fn within_bounds_passes() {
        let p = policy();
        let m = merged(
            json!({"max_pixels": 1_000_000}),
            json!({"video": {"num_frames": 64}, "image": {"image_mode": "L"}, "audio": {"x": 1}}),
        );
        assert_eq!(p.check_bounds(&m), Ok(()));
        assert_eq!(p.check_bounds(&MergedKwargs::default()), Ok(()));
        assert_eq!(
            p.bounded_modalities().collect::<Vec<_>>(),
            ["image", "video"]
        );
        assert!(p.bounds_mm_processor_kwargs());
    }

    #[test]
    fn invalid_schema_names_the_modality() {
        let text = r#"{"trusted_keys": ["k"], "bounds": {"video": {"type": "integr"}}}"#;
        let err = TrustedClientPolicy::from_str(text).expect_err("bad schema");
        assert!(matches!(err, PolicyError::InvalidSchema { ref target, .. } if target == "video"));
        assert!(
            err.message()
                .starts_with("Invalid JSON Schema for video in the trusted-client policy: "),
            "{}",
            err.message()
        );
        let text =
            r#"{"trusted_keys": ["k"], "bounds": {"mm_processor_kwargs": {"maximum": "x"}}}"#;
        let err = TrustedClientPolicy::from_str(text).expect_err("bad schema");
        assert!(
            matches!(err, PolicyError::InvalidSchema { ref target, .. } if target == "mm_processor_kwargs")
        );
        let text = r#"{"trusted_keys": ["k"], "bounds": {"image": 5}}"#;
        let err = TrustedClientPolicy::from_str(text).expect_err("not a schema");
        assert!(err.is_startup_error());
    }

    #[test]
    fn deployment_defaults_must_fit_the_bounds() {
        let p = policy();
        let ok = DeploymentDefaults::from_json(None, Some(r#"{"video": {"num_frames": 32}}"#))
            .expect("defaults");
        assert_eq!(p.check_deployment_defaults(&ok), Ok(()));
        let bad = DeploymentDefaults::from_json(None, Some(r#"{"video": {"num_frames": 100}}"#))
            .expect("defaults");
        let err = p.check_deployment_defaults(&bad).expect_err("breaks");
        assert!(err.is_startup_error());
        assert!(err
            .message()
            .contains("num_frames: 100 is greater than the maximum of 64"));
    }

    #[test]
    fn from_file_yaml_json_and_example() {
        let dir = std::env::temp_dir().join(format!("policies-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let yaml = dir.join("p.yaml");
        std::fs::write(&yaml, POLICY).expect("write");
        assert!(TrustedClientPolicy::from_file(&yaml)
            .expect("yaml")
            .is_trusted(Some("sk-trusted")));
        let json_path = dir.join("p.json");
        // `trusted_api_keys` is accepted as an alias of `trusted_keys`.
        std::fs::write(&json_path, r#"{"trusted_api_keys": ["a"]}"#).expect("write");
        assert!(TrustedClientPolicy::from_file(&json_path)
            .expect("json")
            .is_trusted(Some("a")));
        let err = TrustedClientPolicy::from_file(&dir.join("missing.yaml")).expect_err("missing");
        assert!(err.message().contains("missing.yaml"), "{}", err.message());
        let _ = std::fs::remove_dir_all(&dir);

        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/trusted-clients.yaml");
        let p = TrustedClientPolicy::from_file(&example).expect("example policy");
        assert!(p.is_trusted(Some("sk-example-trusted-client")));
        assert!(p.is_trusted(Some("sk-example-hashed-client")));
        let m = merged(json!({}), json!({"video": {"num_frames": 65}}));
        assert!(p.check_bounds(&m).is_err());
    }

    #[test]
    fn debug_does_not_print_digests() {
        let text = format!("{:?}", policy());
        assert!(text.contains("trusted_keys: 2"), "{text}");
        assert!(!text.contains("4f39e3"), "{text}");
    }
}
