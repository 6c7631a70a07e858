//! The multimodal trust gate (CONTRACT section 2).
//!
//! Unless the client is trusted (`--trust-request-mm-kwargs`, or a trusted key in
//! the trusted-client profile), a request whose `mm_processor_kwargs` or
//! `media_io_kwargs` is *non-empty* is refused with a 400. Non-empty means a JSON
//! object with at least one key: an omitted field, `null` and `{}` pass, while
//! `{"video": {}}` is refused (the outer object has a key). `mm_processor_kwargs`
//! is checked first, so when both are set the error names it.
//!
//! # Values that are not objects
//!
//! In vLLM both fields are typed (`dict[str, Any] | None` and
//! `dict[str, dict[str, Any]] | None`), so a string, list, number or boolean, or a
//! `media_io_kwargs` modality entry that is not an object, fails request
//! validation with a 400 *before* the gate runs, whether or not the client is
//! trusted. [`validate_kwargs_shape`] is that check; [`check_trust_gate`] runs it
//! on both fields first, so no non-object value ever passes the gate and the
//! order matches vLLM's (type errors, then the gate).

use serde_json::{Map, Value};

use crate::error::{describe_json_type, KwargsField, PolicyError};

/// Checks that a kwargs field has the shape vLLM's request model requires.
///
/// * `None` and `null` mean "not set": `Ok(None)`.
/// * An object: `Ok(Some(map))`. For `media_io_kwargs` every modality entry must
///   itself be an object (`{"video": 5}` or `{"video": null}` is refused).
/// * Anything else: [`PolicyError::KwargsNotObject`] (400, `param` = the field),
///   e.g. `Invalid value for mm_processor_kwargs: expected a JSON object, got a string`.
pub fn validate_kwargs_shape(
    field: KwargsField,
    value: Option<&Value>,
) -> Result<Option<&Map<String, Value>>, PolicyError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(PolicyError::KwargsNotObject {
                field,
                path: field.as_str().to_owned(),
                got: describe_json_type(other).to_owned(),
            })
        }
    };
    if field == KwargsField::MediaIoKwargs {
        for (modality, entry) in map {
            if !entry.is_object() {
                return Err(PolicyError::KwargsNotObject {
                    field,
                    path: format!("{}.{modality}", field.as_str()),
                    got: describe_json_type(entry).to_owned(),
                });
            }
        }
    }
    Ok(Some(map))
}

/// True when the value is a JSON object with at least one key.
pub fn is_non_empty_kwargs(value: Option<&Value>) -> bool {
    matches!(value, Some(Value::Object(map)) if !map.is_empty())
}

/// The trust gate.
///
/// First validates the shape of both fields ([`validate_kwargs_shape`],
/// `mm_processor_kwargs` first), then, when `trusted` is false, refuses a
/// non-empty `mm_processor_kwargs` and then a non-empty `media_io_kwargs` with
/// [`PolicyError::KwargsNotTrusted`]. A trusted client always passes (after the
/// shape check).
pub fn check_trust_gate(
    mm_processor_kwargs: Option<&Value>,
    media_io_kwargs: Option<&Value>,
    trusted: bool,
) -> Result<(), PolicyError> {
    validate_kwargs_shape(KwargsField::MmProcessorKwargs, mm_processor_kwargs)?;
    validate_kwargs_shape(KwargsField::MediaIoKwargs, media_io_kwargs)?;
    if trusted {
        return Ok(());
    }
    if is_non_empty_kwargs(mm_processor_kwargs) {
        return Err(PolicyError::KwargsNotTrusted {
            field: KwargsField::MmProcessorKwargs,
        });
    }
    if is_non_empty_kwargs(media_io_kwargs) {
        return Err(PolicyError::KwargsNotTrusted {
            field: KwargsField::MediaIoKwargs,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MM_MESSAGE: &str = "Per-request mm_processor_kwargs are disabled by default because \
        they can change multimodal preprocessing resource usage. Start the server with \
        --trust-request-mm-kwargs only when clients are trusted. (parameter=mm_processor_kwargs)";
    const MEDIA_MESSAGE: &str = "Per-request media_io_kwargs are disabled by default because \
        they can change multimodal media loading resource usage. Start the server with \
        --trust-request-mm-kwargs only when clients are trusted. (parameter=media_io_kwargs)";

    /// The value matrix: (label, value, non-empty?).
    fn matrix() -> Vec<(&'static str, Option<Value>, bool)> {
        vec![
            ("omitted", None, false),
            ("null", Some(Value::Null), false),
            ("empty", Some(json!({})), false),
            ("empty-modality", Some(json!({"video": {}})), true),
            ("benign", Some(json!({"video": {"num_frames": 8}})), true),
        ]
    }

    #[test]
    fn full_matrix_untrusted() {
        for (mm_label, mm, mm_set) in matrix() {
            for (media_label, media, media_set) in matrix() {
                let result = check_trust_gate(mm.as_ref(), media.as_ref(), false);
                let case = format!("mm={mm_label} media={media_label}");
                match (mm_set, media_set) {
                    (false, false) => assert_eq!(result, Ok(()), "{case}"),
                    (true, _) => {
                        let err = result.expect_err(&case);
                        assert_eq!(err.message(), MM_MESSAGE, "{case}");
                        assert_eq!(err.param(), Some("mm_processor_kwargs"), "{case}");
                        assert_eq!(err.status(), 400, "{case}");
                    }
                    (false, true) => {
                        let err = result.expect_err(&case);
                        assert_eq!(err.message(), MEDIA_MESSAGE, "{case}");
                        assert_eq!(err.param(), Some("media_io_kwargs"), "{case}");
                        assert_eq!(err.error_type(), "BadRequestError", "{case}");
                    }
                }
            }
        }
    }

    #[test]
    fn full_matrix_trusted_passes() {
        for (mm_label, mm, _) in matrix() {
            for (media_label, media, _) in matrix() {
                assert_eq!(
                    check_trust_gate(mm.as_ref(), media.as_ref(), true),
                    Ok(()),
                    "mm={mm_label} media={media_label}"
                );
            }
        }
    }

    #[test]
    fn mm_processor_kwargs_is_checked_first() {
        let mm = json!({"num_crops": 4});
        let media = json!({"image": {"image_mode": "L"}});
        let err = check_trust_gate(Some(&mm), Some(&media), false).expect_err("gated");
        assert_eq!(err.param(), Some("mm_processor_kwargs"));
    }

    #[test]
    fn non_object_values_fail_shape_validation_in_both_modes() {
        for bad in [json!("x"), json!([1, 2]), json!(3), json!(true), json!([])] {
            for trusted in [false, true] {
                let err = check_trust_gate(Some(&bad), None, trusted).expect_err("bad mm");
                assert_eq!(err.param(), Some("mm_processor_kwargs"));
                assert!(
                    err.message().starts_with(
                        "Invalid value for mm_processor_kwargs: expected a JSON object, got "
                    ),
                    "{}",
                    err.message()
                );
                let err = check_trust_gate(None, Some(&bad), trusted).expect_err("bad media");
                assert_eq!(err.param(), Some("media_io_kwargs"));
                assert_eq!(err.status(), 400);
            }
        }
        let err = check_trust_gate(Some(&json!("x")), None, false).expect_err("string");
        assert_eq!(
            err.message(),
            "Invalid value for mm_processor_kwargs: expected a JSON object, got a string"
        );
    }

    #[test]
    fn media_modality_entries_must_be_objects() {
        let media = json!({"video": 5});
        let err = check_trust_gate(None, Some(&media), true).expect_err("bad entry");
        assert_eq!(
            err.message(),
            "Invalid value for media_io_kwargs.video: expected a JSON object, got a number"
        );
        assert_eq!(err.param(), Some("media_io_kwargs"));
        let media = json!({"video": null});
        assert!(check_trust_gate(None, Some(&media), true).is_err());
    }

    #[test]
    fn shape_errors_come_before_the_gate() {
        // A valid, gated mm_processor_kwargs and a malformed media_io_kwargs: the
        // type error wins, as in vLLM where request validation runs first.
        let mm = json!({"num_crops": 4});
        let media = json!("video");
        let err = check_trust_gate(Some(&mm), Some(&media), false).expect_err("bad");
        assert!(matches!(err, PolicyError::KwargsNotObject { .. }));
        assert_eq!(err.param(), Some("media_io_kwargs"));
    }

    #[test]
    fn validate_shape_returns_the_map() {
        let v = json!({"a": 1});
        let map = validate_kwargs_shape(KwargsField::MmProcessorKwargs, Some(&v))
            .expect("object")
            .expect("some");
        assert_eq!(map.get("a"), Some(&json!(1)));
        assert_eq!(
            validate_kwargs_shape(KwargsField::MediaIoKwargs, Some(&Value::Null)),
            Ok(None)
        );
        assert_eq!(
            validate_kwargs_shape(KwargsField::MediaIoKwargs, None),
            Ok(None)
        );
    }
}
