//! The body wrapper that keeps a streamed response's concurrency slot (see [`super::front`])
//! until the stream has been sent.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

pin_project_lite::pin_project! {
    /// A response body that holds a concurrency slot until it has been sent.
    pub struct PermitBody {
        #[pin]
        inner: Body,
        _permit: OwnedSemaphorePermit,
    }
}

impl PermitBody {
    pub fn new(inner: Body, permit: OwnedSemaphorePermit) -> Self {
        PermitBody {
            inner,
            _permit: permit,
        }
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
