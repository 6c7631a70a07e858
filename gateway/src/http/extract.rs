//! Our JSON extractor: every rejection (content type, syntax, shape, field type) is an
//! [`ApiError`] in the contract's envelope, with `param` naming the field where there is one.

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::http::header;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use super::request_memory::RequestMemory;
use crate::error::ApiError;
use crate::state::AppState;

/// A request body parsed into `T` in one pass, straight from the bytes.
pub struct ValidJson<T>(pub T);

/// Where the extractor finds `--max-request-body-bytes`.
pub trait BodyLimit {
    fn max_body_bytes(&self) -> usize;
}

impl BodyLimit for Arc<AppState> {
    fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "The request body is larger than the server's limit of {limit} bytes (--max-request-body-bytes)."
    ))
}

const BODY: &str = "its body as read and parsed";

/// The body, at most `limit` bytes: a `Content-Length` over the limit is refused before
/// anything is read, a body that streams past it as soon as it does. What the body grows into
/// while it is parsed and served (`crate::memory::body_bytes`) is held on the request's
/// account before each part of it is read.
pub async fn read_body(
    req: Request,
    limit: usize,
    memory: &RequestMemory,
) -> Result<bytes::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let mut body = req.into_body();
    if let Some(n) = declared {
        if let Err(refused) = memory.hold_total(crate::memory::body_bytes(n), BODY) {
            return Err(discard(body, limit, refused).await);
        }
    }
    // Most bodies arrive as one frame: return it as is, copying only when there are more.
    let mut first: Option<bytes::Bytes> = None;
    let mut rest: Option<bytes::BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::bad_request(format!("Could not read the request body: {e}"), None)
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(too_large(limit));
        }
        if let Err(refused) = memory.hold_total(crate::memory::body_bytes(total as u64), BODY) {
            return Err(discard(body, limit - total, refused).await);
        }
        match (&mut first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut buf =
                    bytes::BytesMut::with_capacity(declared.map_or(0, |n| n as usize).max(total));
                buf.extend_from_slice(head);
                buf.extend_from_slice(&data);
                rest = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match rest {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// Reads and drops the rest of a refused body (at most `limit` more bytes, one frame held at
/// a time), then gives the refusal: a client still sending gets its answer, not a reset
/// connection.
async fn discard(mut body: axum::body::Body, limit: usize, refused: ApiError) -> ApiError {
    let mut seen = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        seen = seen.saturating_add(frame.data_ref().map_or(0, |d| d.len()));
        if seen > limit {
            break;
        }
    }
    refused
}

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: BodyLimit + Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let memory = req
            .extensions()
            .get::<RequestMemory>()
            .cloned()
            .unwrap_or_else(RequestMemory::unbounded);
        let bytes = read_body(req, state.max_body_bytes(), &memory).await?;
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
    // On the bytes: `application/json` or any `+json` type, parameters after `;` ignored.
    let raw = ct.as_bytes();
    let mime = raw
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let ok = mime.eq_ignore_ascii_case(b"application/json")
        || (mime.len() > 5 && mime[mime.len() - 5..].eq_ignore_ascii_case(b"+json"));
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
    // Checking the UTF-8 of the whole body once is cheaper than serde_json checking each
    // string on its own; a body that is not UTF-8 takes the slow path for its message.
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(value) = serde_json::from_str::<T>(text) {
            return Ok(value);
        }
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

    fn status_of(r: Result<bytes::Bytes, ApiError>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(e) => e.status().as_u16(),
        }
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_413_declared_or_streamed() {
        let ok = Request::new(axum::body::Body::from("x".repeat(100)));
        assert_eq!(
            status_of(read_body(ok, 100, &RequestMemory::unbounded()).await),
            200
        );
        // Declared too large: refused before reading.
        let mut declared = Request::new(axum::body::Body::from("{}"));
        declared
            .headers_mut()
            .insert(header::CONTENT_LENGTH, "5000000".parse().unwrap());
        assert_eq!(
            status_of(read_body(declared, 100, &RequestMemory::unbounded()).await),
            413
        );
        // No length given, streamed past the limit in chunks.
        let chunks = futures::stream::iter(
            (0..10).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 50]))),
        );
        let streamed = Request::new(axum::body::Body::from_stream(chunks));
        let err = read_body(streamed, 100, &RequestMemory::unbounded())
            .await
            .err();
        assert!(
            matches!(&err, Some(ApiError::PayloadTooLarge(m)) if m.contains("--max-request-body-bytes")),
            "{err:?}"
        );
        // Bigger than axum's own 2 MB default: our limit is the one that counts.
        let big = Request::new(axum::body::Body::from(vec![b' '; 3 << 20]));
        assert_eq!(
            status_of(read_body(big, 4 << 20, &RequestMemory::unbounded()).await),
            200
        );
    }

    #[tokio::test]
    async fn a_body_is_held_on_its_account_before_it_is_read() {
        let budget = preprocess::budget::ByteBudget::new(10_000);
        let body = |n: usize| Request::new(axum::body::Body::from(vec![b' '; n]));
        // Declared: held from the length, before a byte is read.
        let memory = RequestMemory::open(&budget);
        let mut declared = body(100);
        declared
            .headers_mut()
            .insert(header::CONTENT_LENGTH, "100".parse().unwrap());
        assert_eq!(status_of(read_body(declared, 1000, &memory).await), 200);
        assert_eq!(memory.held(), crate::memory::body_bytes(100));
        // Streamed: held as it arrives; past the budget beside the first, 503.
        let chunks = futures::stream::iter(
            (0..10).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 50]))),
        );
        let streamed = Request::new(axum::body::Body::from_stream(chunks));
        let other = RequestMemory::open(&budget);
        assert_eq!(status_of(read_body(streamed, 1000, &other).await), 503);
        // Alone, a body whose parsed form can never fit is the client's: 400.
        drop(memory);
        drop(other);
        let alone = RequestMemory::open(&budget);
        assert_eq!(status_of(read_body(body(900), 1000, &alone).await), 400);
        drop(alone);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn content_types() {
        let check = |v: &'static str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(
                header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static(v),
            );
            check_content_type(&h).is_ok()
        };
        assert!(check("application/json"));
        assert!(check("Application/JSON; charset=utf-8"));
        assert!(check(" application/json ;x=y"));
        assert!(check("application/vnd.api+json"));
        assert!(!check("text/plain"));
        assert!(!check("application/jsonx"));
        assert!(!check("+json"));
        assert!(check_content_type(&axum::http::HeaderMap::new()).is_err());
    }

    #[test]
    fn unknown_fields_are_accepted() {
        let t: T = parse_body(br#"{"a": 1.5, "zzz": {"deep": [1]}}"#).unwrap();
        assert_eq!(t.a, Some(1.5));
    }
}
