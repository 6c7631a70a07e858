//! A concurrency limit that answers 503 with `Retry-After` instead of queueing without bound.
//! A streamed response holds its permit until the body has been sent.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

pub async fn limit(State(sem): State<Arc<Semaphore>>, req: Request, next: Next) -> Response {
    let Ok(permit) = sem.clone().try_acquire_owned() else {
        metrics::counter!("gateway_requests_shed_total").increment(1);
        return ApiError::Overloaded(
            "The server is at its concurrent request limit; retry shortly.".into(),
        )
        .into_response();
    };
    let resp = next.run(req).await;
    // A buffered body is complete once the handler returns; only a stream keeps its slot.
    if resp.body().size_hint().exact().is_some() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    Response::from_parts(
        parts,
        Body::new(PermitBody {
            inner: body,
            _permit: permit,
        }),
    )
}

pin_project_lite::pin_project! {
    struct PermitBody {
        #[pin]
        inner: Body,
        _permit: OwnedSemaphorePermit,
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
