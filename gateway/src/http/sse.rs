//! Server-sent events framing: `data: <json>\n\n` per event, `data: [DONE]` last. An error
//! after the 200 has been sent goes out as one `data: {error json}` event, then `[DONE]`.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use futures::Stream;

pub fn event(json: &str) -> Bytes {
    let mut s = String::with_capacity(json.len() + 8);
    s.push_str("data: ");
    s.push_str(json);
    s.push_str("\n\n");
    Bytes::from(s)
}

pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

pub fn response<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
