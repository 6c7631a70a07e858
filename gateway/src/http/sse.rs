//! Server-sent events framing: `data: <json>\n\n` per event, `data: [DONE]` last. An error
//! after the 200 has been sent goes out as one `data: {error json}` event, then `[DONE]`.
//!
//! When a shutdown's drain time runs out ([`install_shutdown`]), every stream still open ends
//! the same way: an error event saying so, then `[DONE]`, so clients see why it stopped.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::sync::watch;

use crate::error::ApiError;

/// Set to true when the drain time of a shutdown has run out.
static CUT: OnceLock<watch::Receiver<bool>> = OnceLock::new();

/// The same moment for requests still waiting for their response head (non-streamed ones):
/// the front service answers them 503 ([`drain_cut`], [`drain_cut_notified`]).
static CUT_FIRED: AtomicBool = AtomicBool::new(false);
static CUT_NOTIFY: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Ends the drain: streams close with an error event, waiting requests get a 503.
pub fn fire_drain_cut() {
    CUT_FIRED.store(true, Ordering::SeqCst);
    CUT_NOTIFY.notify_waiters();
}

/// Whether the drain time has run out.
pub fn drain_cut() -> bool {
    CUT_FIRED.load(Ordering::SeqCst)
}

/// Completes when [`fire_drain_cut`] is called after this future was created.
pub fn drain_cut_notified() -> tokio::sync::futures::Notified<'static> {
    CUT_NOTIFY.notified()
}

/// Streams started from now on end with an error event once `cut` turns true (`serve` calls
/// this once, with the end of the drain).
pub fn install_shutdown(cut: watch::Receiver<bool>) {
    let _ = CUT.set(cut);
}

/// `stream`, ended early by the shutdown's cut with an error event and `[DONE]`.
fn cut_on_shutdown<S>(stream: S) -> impl Stream<Item = Result<Bytes, Infallible>> + Send
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let cut = CUT.get().cloned();
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let until = async move {
        match cut {
            Some(mut rx) => {
                while !*rx.borrow_and_update() {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                flag.store(true, Ordering::SeqCst);
            }
            None => std::future::pending::<()>().await,
        }
    };
    let tail = futures::stream::iter(std::iter::once(())).flat_map(move |()| {
        let events = if fired.load(Ordering::SeqCst) {
            let e = ApiError::Overloaded(
                "The server is shutting down: this stream ended before its last token.".into(),
            );
            vec![Ok(event(&e.to_json())), Ok(done())]
        } else {
            Vec::new()
        };
        futures::stream::iter(events)
    });
    stream.take_until(Box::pin(until)).chain(tail)
}

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
    let mut resp = Response::new(Body::from_stream(cut_on_shutdown(stream)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
