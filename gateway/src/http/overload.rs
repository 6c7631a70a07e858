//! The body wrapper that keeps a streamed response's concurrency slot and its request-memory
//! account (see [`super::front`]) until the stream has been sent.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

use super::request_memory::RequestMemory;

/// What a request holds while it runs: one of `--max-concurrent-requests` and its account on
/// `--max-request-memory`.
#[derive(Debug)]
pub struct Slot {
    pub permit: OwnedSemaphorePermit,
    pub memory: RequestMemory,
}

pin_project_lite::pin_project! {
    /// A response body that holds a request's slot until it has been sent.
    pub struct PermitBody {
        #[pin]
        inner: Body,
        _slot: Slot,
    }
}

impl PermitBody {
    pub fn new(inner: Body, slot: Slot) -> Self {
        PermitBody { inner, _slot: slot }
    }
}

impl HttpBody for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
