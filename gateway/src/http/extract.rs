//! Our JSON extractor: every rejection (content type, syntax, shape, field type) is an
//! [`ApiError`] in the contract's envelope, with `param` naming the field where there is one.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A request body parsed into `T` in one pass, straight from the bytes.
pub struct ValidJson<T>(pub T);

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::bad_request(
                    "The request body is larger than the server's limit (--max-request-body-bytes).",
                    None,
                )
            } else {
                ApiError::bad_request(format!("Could not read the request body: {e}"), None)
            }
        })?;
        parse_body(&bytes).map(ValidJson)
    }
}

fn check_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Err(ApiError::bad_request(
            "Missing Content-Type header: expected application/json.",
            None,
        ));
    };
    let ok = ct
        .to_str()
        .ok()
        .and_then(|s| s.split(';').next())
        .map(|mime| {
            let mime = mime.trim();
            mime.eq_ignore_ascii_case("application/json")
                || (mime.len() > 5 && mime[mime.len() - 5..].eq_ignore_ascii_case("+json"))
        })
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            format!(
                "Unsupported Content-Type {:?}: expected application/json.",
                ct.to_str().unwrap_or("<non-ascii>")
            ),
            None,
        ))
    }
}

/// Parse a JSON object body into `T`. Public for benchmarks and tests.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => {
            return Err(ApiError::bad_request(
                "The request body is empty: expected a JSON object.",
                None,
            ))
        }
        Some(_) => {
            // Tell a syntax error apart from a well-formed non-object.
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    Ok(_) => ApiError::bad_request("The request body must be a JSON object.", None),
                    Err(e) => json_syntax_error(&e),
                },
            );
        }
    }
    // The common case parses once, without tracking paths; only a body that fails is parsed
    // again with `serde_path_to_error` to name the field (it costs about 3x on every parse).
    if let Ok(value) = serde_json::from_slice::<T>(bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            json_syntax_error(&inner)
        } else if path.is_empty() || path == "." {
            // Fields of flattened sub-structs lose their path; find the culprit by elimination.
            field_error(&find_bad_field::<T>(bytes).unwrap_or_default(), &inner)
        } else {
            field_error(&path, &inner)
        }
    })?;
    de.end().map_err(|e| json_syntax_error(&e))?;
    Ok(value)
}

/// The top-level key without which the body parses (error path only: one parse per key).
fn find_bad_field<T: DeserializeOwned>(bytes: &[u8]) -> Option<String> {
    let serde_json::Value::Object(map) = serde_json::from_slice(bytes).ok()? else {
        return None;
    };
    map.keys().find_map(|key| {
        let mut rest = map.clone();
        rest.remove(key);
        serde_json::from_value::<T>(serde_json::Value::Object(rest))
            .is_ok()
            .then(|| key.clone())
    })
}

fn json_syntax_error(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("The request body is not valid JSON: {e}"), None)
}

fn field_error(path: &str, e: &serde_json::Error) -> ApiError {
    // serde's messages end with " at line L column C"; keep the useful part.
    let msg = e.to_string();
    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
    if path.is_empty() || path == "." {
        return ApiError::bad_request(format!("Invalid request: {msg}."), None);
    }
    let top = path.split(['.', '[']).next().unwrap_or(path);
    ApiError::bad_request(format!("Invalid value for `{path}`: {msg}."), Some(top))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct T {
        a: Option<f32>,
        b: Option<Vec<String>>,
        #[serde(flatten)]
        inner: Inner,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        c: Option<i64>,
    }

    #[test]
    fn flattened_field_errors_name_the_field() {
        let err = parse_body::<T>(br#"{"a": 1, "c": "ten"}"#).err();
        assert!(
            matches!(&err, Some(ApiError::BadRequest { param: Some(p), .. }) if p == "c"),
            "{err:?}"
        );
    }

    #[test]
    fn non_objects_and_syntax_are_bad_requests() {
        for body in [
            &b"\"s\""[..],
            b"[1]",
            b"3",
            b"null",
            b"",
            b"{",
            b"{\"a\":}",
            b"{} x",
        ] {
            let err = parse_body::<T>(body).err();
            assert!(
                matches!(err, Some(ApiError::BadRequest { .. })),
                "{:?} -> {err:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn wrong_field_type_names_the_field() {
        let err = parse_body::<T>(br#"{"a": "hot"}"#).err();
        match err {
            Some(ApiError::BadRequest { param, message }) => {
                assert_eq!(param.as_deref(), Some("a"));
                assert!(message.starts_with("Invalid value for `a`"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = parse_body::<T>(br#"{"b": ["x", 1]}"#).err();
        assert!(matches!(err, Some(ApiError::BadRequest { param: Some(p), .. }) if p == "b"));
    }

    #[test]
    fn unknown_fields_are_accepted() {
        let t: T = parse_body(br#"{"a": 1.5, "zzz": {"deep": [1]}}"#).unwrap();
        assert_eq!(t.a, Some(1.5));
    }
}
