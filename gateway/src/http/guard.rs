//! Auth, the concurrency limit and the access log as one hand-written tower service: no boxed
//! middleware and no span per request on the hot path (the log line is built only when debug
//! logging is on). Auth runs first (a 401 beats everything, CONTRACT section 5); then a slot is
//! taken or the request is shed with 503 + Retry-After. A buffered response frees its slot
//! when the handler returns; a streamed one holds it until its body has been sent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use super::auth::{AuthConfig, PresentedKey};
use super::overload::PermitBody;
use crate::error::ApiError;

#[derive(Clone)]
pub struct GuardLayer {
    pub auth: Arc<AuthConfig>,
    pub slots: Arc<Semaphore>,
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;
    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            auth: self.auth.clone(),
            slots: self.slots.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    auth: Arc<AuthConfig>,
    slots: Arc<Semaphore>,
}

impl<S> Service<Request> for Guard<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = GuardFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let log = tracing::enabled!(tracing::Level::DEBUG).then(|| AccessLog {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            request_id: req
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            start: std::time::Instant::now(),
        });
        let presented = super::auth::bearer(&req).map(str::to_string);
        if !self.auth.allows(req.uri().path(), presented.as_deref()) {
            return GuardFuture::Done(Some(ApiError::Unauthorized.into_response()));
        }
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            metrics::counter!("gateway_requests_shed_total").increment(1);
            return GuardFuture::Done(Some(
                ApiError::Overloaded(
                    "The server is at its concurrent request limit; retry shortly.".into(),
                )
                .into_response(),
            ));
        };
        req.extensions_mut().insert(PresentedKey(presented));
        GuardFuture::Running {
            inner: Box::pin(self.inner.call(req)),
            permit: Some(permit),
            log,
        }
    }
}

/// What the debug access log line says about a request.
pub struct AccessLog {
    method: axum::http::Method,
    path: String,
    request_id: Option<String>,
    start: std::time::Instant,
}

impl AccessLog {
    fn emit(&self, status: u16) {
        tracing::debug!(
            method = %self.method,
            path = %self.path,
            request_id = self.request_id.as_deref().unwrap_or(""),
            status,
            latency_ms = self.start.elapsed().as_secs_f64() * 1000.0,
            "request"
        );
    }
}

pub enum GuardFuture<F> {
    Done(Option<Response>),
    Running {
        inner: Pin<Box<F>>,
        permit: Option<OwnedSemaphorePermit>,
        log: Option<AccessLog>,
    },
}

impl<F> Future for GuardFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both variants are Unpin (the inner future is boxed).
        let this = self.get_mut();
        match this {
            GuardFuture::Done(resp) => Poll::Ready(Ok(resp.take().unwrap_or_else(|| {
                ApiError::Internal("response polled twice".into()).into_response()
            }))),
            GuardFuture::Running { inner, permit, log } => {
                let Poll::Ready(Ok(resp)) = inner.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                if let Some(log) = log.take() {
                    log.emit(resp.status().as_u16());
                }
                if resp.body().size_hint().exact().is_some() {
                    return Poll::Ready(Ok(resp));
                }
                let Some(permit) = permit.take() else {
                    return Poll::Ready(Ok(resp));
                };
                let (parts, body) = resp.into_parts();
                Poll::Ready(Ok(Response::from_parts(
                    parts,
                    Body::new(PermitBody::new(body, permit)),
                )))
            }
        }
    }
}
