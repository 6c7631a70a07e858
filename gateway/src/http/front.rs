//! The front of the stack as one hand-written tower service: request id, catch-panic to a JSON
//! 500, API-key auth, the concurrency limit (503 + Retry-After instead of a queue), the request
//! timeout (504) and the debug access log; and where flags ask for them, the root path and CORS
//! ([`super::options`]).
//!
//! These were tower-http's `SetRequestId`/`PropagateRequestId`/`CatchPanic`/`Timeout` layers
//! plus our guard. Each layer is a service and a future of its own, and the gate's rejection
//! path (a request answered in one poll) paid for every one of them: nested futures moved by
//! value, a header copied back per layer, a timer registered and cancelled per request, an
//! extension map allocated to pass the presented key on. Here the same behaviour costs one
//! future: the timer is armed only if the handler does not finish on its first poll, and the
//! handlers read the key and the request id from the headers themselves.
//! The body-size limit lives in our JSON extractor ([`super::extract`]), the one place a body
//! is read.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::Entry;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use super::auth::AuthConfig;
use super::options::FrontOptions;
use super::overload::{PermitBody, Slot};
use super::request_memory::RequestMemory;
use crate::error::ApiError;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub struct FrontConfig {
    pub auth: Arc<AuthConfig>,
    /// Requests in flight at once; more are shed with 503.
    pub slots: Arc<Semaphore>,
    /// `--max-request-memory`: what requests in flight may hold together.
    pub memory: preprocess::budget::ByteBudget,
    /// Until the response head; a streamed body is not cut off.
    pub timeout: Duration,
    /// CORS, the root path, the access log's settings.
    pub options: FrontOptions,
}

#[derive(Clone)]
pub struct FrontLayer(pub Arc<FrontConfig>);

impl<S> Layer<S> for FrontLayer {
    type Service = Front<S>;
    fn layer(&self, inner: S) -> Front<S> {
        Front {
            inner,
            cfg: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Front<S> {
    inner: S,
    cfg: Arc<FrontConfig>,
}

/// A fresh request id: a UUID v4 (random, so ids from different replicas do not collide),
/// written as 36 lowercase hex-and-hyphen bytes.
///
/// The text lives in one reference-counted allocation (`Bytes::from_owner`), so the copies
/// for the request and the response share it; `HeaderValue::from_str` would copy it into a
/// vector-backed buffer that allocates again on its first clone.
fn fresh_request_id() -> HeaderValue {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
    // SAFETY: a hyphenated UUID is lowercase hex digits and hyphens, all visible ASCII, which
    // is what a header value may hold.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes::Bytes::from_owner(buf)) }
}

/// The request's id: the client's `X-Request-Id` when it sent a usable one (visible ASCII,
/// 1 to 256 bytes), else a fresh one, written into the request for the handlers. One lookup
/// of the header either way.
fn ensure_request_id(req: &mut Request) -> HeaderValue {
    match req.headers_mut().entry(X_REQUEST_ID) {
        Entry::Occupied(mut sent) => {
            let v = sent.get();
            if !v.is_empty() && v.len() <= 256 && v.to_str().is_ok() {
                return v.clone();
            }
            let id = fresh_request_id();
            sent.insert(id.clone());
            id
        }
        Entry::Vacant(slot) => {
            let id = fresh_request_id();
            slot.insert(id.clone());
            id
        }
    }
}

/// Liveness and monitoring probes answer whatever the load: they take no concurrency slot, so
/// a server busy with real work does not fail its health checks (and get restarted for it).
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/ping" | "/metrics" | "/version")
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    metrics::counter!("gateway_handler_panics_total").increment(1);
    tracing::error!(panic = detail, "handler panicked");
    ApiError::Internal("The server hit an internal error while handling this request.".into())
        .into_response()
}

impl<S> Service<Request> for Front<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = FrontFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let request_id = ensure_request_id(&mut req);
        let options = &self.cfg.options;
        options.strip_root(&mut req);
        let log = (tracing::enabled!(tracing::Level::DEBUG) && options.logs(req.uri().path()))
            .then(|| AccessLog {
                method: req.method().clone(),
                path: req.uri().path().to_string(),
                request_id: request_id.to_str().unwrap_or("").to_string(),
                start: std::time::Instant::now(),
            });
        let mut cors = None;
        if let Some(policy) = &options.cors {
            // Preflights carry no credentials: they are answered before auth.
            if let Some(answer) = policy.preflight(&req) {
                return FrontFuture::done(answer, request_id, log, None);
            }
            cors = req
                .headers()
                .get(axum::http::header::ORIGIN)
                .and_then(|origin| policy.response_headers(origin));
        }
        if !self.cfg.auth.allows(req.uri().path(), req.headers()) {
            return FrontFuture::done(
                ApiError::Unauthorized.into_response(),
                request_id,
                log,
                cors,
            );
        }
        let permit = if is_probe(req.uri().path()) {
            None
        } else {
            let Ok(permit) = self.cfg.slots.clone().try_acquire_owned() else {
                metrics::counter!("gateway_requests_shed_total").increment(1);
                let shed = ApiError::Overloaded(
                    "The server is at its concurrent request limit; retry shortly.".into(),
                );
                return FrontFuture::done(shed.into_response(), request_id, log, cors);
            };
            let memory = RequestMemory::open(&self.cfg.memory);
            req.extensions_mut().insert(memory.clone());
            Some(Slot { permit, memory })
        };
        let deadline = Instant::now() + self.cfg.timeout;
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(inner) => FrontFuture {
                state: State::Running {
                    inner,
                    deadline,
                    timer: None,
                    cut: None,
                    permit,
                    timeout: self.cfg.timeout,
                },
                request_id: Some(request_id),
                log,
                cors,
            },
            Err(panic) => FrontFuture::done(panic_response(panic), request_id, log, cors),
        }
    }
}

/// What the debug access log line says about a request.
struct AccessLog {
    method: axum::http::Method,
    path: String,
    request_id: String,
    start: std::time::Instant,
}

impl AccessLog {
    fn emit(&self, status: u16) {
        tracing::debug!(
            method = %self.method,
            path = %self.path,
            request_id = %self.request_id,
            status,
            latency_ms = self.start.elapsed().as_secs_f64() * 1000.0,
            "request"
        );
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        Done { response: Option<Response> },
        Running {
            #[pin]
            inner: F,
            deadline: Instant,
            // Armed on the first `Pending`: a request answered in one poll never touches the
            // timer wheel.
            timer: Option<Pin<Box<Sleep>>>,
            // Armed with the timer: the end of a shutdown's drain.
            cut: Option<Pin<Box<tokio::sync::futures::Notified<'static>>>>,
            permit: Option<Slot>,
            timeout: Duration,
        },
    }
}

pin_project_lite::pin_project! {
    pub struct FrontFuture<F> {
        #[pin]
        state: State<F>,
        request_id: Option<HeaderValue>,
        log: Option<AccessLog>,
        // CORS headers for the response, when the request came from an allowed origin.
        cors: Option<Vec<(HeaderName, HeaderValue)>>,
    }
}

impl<F> FrontFuture<F> {
    fn done(
        response: Response,
        request_id: HeaderValue,
        log: Option<AccessLog>,
        cors: Option<Vec<(HeaderName, HeaderValue)>>,
    ) -> Self {
        FrontFuture {
            state: State::Done {
                response: Some(response),
            },
            request_id: Some(request_id),
            log,
            cors,
        }
    }
}

impl<F> Future for FrontFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = match this.state.project() {
            StateProj::Done { response } => response.take().unwrap_or_else(|| {
                ApiError::Internal("response polled twice".into()).into_response()
            }),
            StateProj::Running {
                inner,
                deadline,
                timer,
                cut,
                permit,
                timeout,
            } => match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Err(panic) => panic_response(panic),
                Ok(Poll::Ready(Ok(resp))) => hold_permit_while_streaming(resp, permit.take()),
                Ok(Poll::Pending) => {
                    let cut =
                        cut.get_or_insert_with(|| Box::pin(crate::http::sse::drain_cut_notified()));
                    if cut.as_mut().poll(cx).is_ready() || crate::http::sse::drain_cut() {
                        ApiError::Unavailable(
                            "The server is shutting down: the request did not complete within --shutdown-timeout.".into(),
                        )
                        .into_response()
                    } else {
                        let timer = timer
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(*deadline)));
                        if timer.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        ApiError::Timeout(format!(
                        "The request did not complete within the server's timeout ({} s, --request-timeout).",
                        timeout.as_secs()
                    ))
                    .into_response()
                    }
                }
            },
        };
        if let Some(id) = this.request_id.take() {
            response.headers_mut().entry(X_REQUEST_ID).or_insert(id);
        }
        for (name, value) in this.cors.take().into_iter().flatten() {
            response.headers_mut().insert(name, value);
        }
        if let Some(log) = this.log.take() {
            log.emit(response.status().as_u16());
        }
        Poll::Ready(Ok(response))
    }
}

/// A buffered response frees its slot now; a streamed one keeps it until its body has been
/// sent.
fn hold_permit_while_streaming(resp: Response, permit: Option<Slot>) -> Response {
    if resp.body().size_hint().exact().is_some() {
        return resp;
    }
    let Some(permit) = permit else {
        return resp;
    };
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, Body::new(PermitBody::new(body, permit)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn slow() -> &'static str {
        tokio::time::sleep(Duration::from_secs(30)).await;
        "late"
    }

    async fn boom() -> &'static str {
        panic!("handler bug")
    }

    fn app(slots: usize, keys: Vec<Vec<u8>>) -> Router {
        let router = Router::new()
            .route("/slow", post(slow))
            .route("/boom", post(boom))
            .route("/ok", post(|| async { "ok" }))
            .route("/health", axum::routing::get(|| async { "healthy" }))
            .route("/metrics", axum::routing::get(|| async { "# metrics" }));
        super::super::stack::apply(
            router,
            super::super::stack::StackConfig {
                auth: Arc::new(AuthConfig {
                    keys,
                    also_accept: None,
                }),
                max_concurrent: slots,
                request_memory: preprocess::budget::ByteBudget::new(usize::MAX),
                timeout: Duration::from_millis(200),
                options: FrontOptions::default(),
            },
        )
    }

    async fn send(app: Router, path: &str, auth: Option<&str>) -> (u16, Option<String>, String) {
        let mut req = Request::post(path).body(Body::empty()).unwrap_or_default();
        if let Some(key) = auth {
            req.headers_mut().insert(
                axum::http::header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
            );
        }
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let id = resp
            .headers()
            .get(X_REQUEST_ID)
            .map(|v| v.to_str().unwrap().to_string());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, id, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_panic_is_a_json_500_with_the_request_id() {
        let (status, id, body) = send(app(4, vec![]), "/boom", None).await;
        assert_eq!(status, 500);
        assert!(id.is_some_and(|i| i.len() == 36));
        assert!(
            body.starts_with("{\"error\":{\"message\":\"The server hit an internal error"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_slow_handler_is_a_json_504() {
        let (status, _, body) = send(app(4, vec![]), "/slow", None).await;
        assert_eq!(status, 504);
        assert!(body.contains("\"type\":\"GatewayTimeoutError\""), "{body}");
    }

    #[tokio::test]
    async fn auth_comes_first_and_the_slots_are_freed() {
        let (status, id, _) = send(app(1, vec![b"k".to_vec()]), "/ok", None).await;
        assert_eq!(status, 401);
        assert!(id.is_some());
        let app = app(1, vec![b"k".to_vec()]);
        for _ in 0..3 {
            // One slot: each buffered response must give it back.
            let (status, _, body) = send(app.clone(), "/ok", Some("k")).await;
            assert_eq!((status, body.as_str()), (200, "ok"));
        }
    }

    #[tokio::test]
    async fn requests_over_the_limit_are_shed_with_retry_after() {
        let app = app(1, vec![]);
        let busy = tokio::spawn(send(app.clone(), "/slow", None));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let resp = app
            .clone()
            .oneshot(Request::post("/ok").body(Body::empty()).unwrap_or_default())
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 503);
        assert_eq!(
            resp.headers()
                .get(axum::http::header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        // The probes answer while the only slot is taken.
        for path in ["/health", "/metrics"] {
            let resp = app
                .clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap_or_default())
                .await
                .unwrap();
            assert_eq!(
                resp.status().as_u16(),
                200,
                "{path} while every slot is busy"
            );
        }
        assert_eq!(busy.await.unwrap().0, 504);
    }

    #[test]
    fn fresh_ids_are_uuids_and_differ() {
        let a = fresh_request_id();
        let b = fresh_request_id();
        assert_ne!(a, b);
        let text = a.to_str().unwrap_or_default();
        assert!(uuid::Uuid::parse_str(text).is_ok(), "{text}");
        assert_eq!(text.len(), 36);
    }

    #[test]
    fn client_ids_are_kept_when_usable() {
        let mut req = Request::new(Body::empty());
        req.headers_mut()
            .insert(X_REQUEST_ID, HeaderValue::from_static("client-7"));
        assert_eq!(ensure_request_id(&mut req), "client-7");
        let mut req = Request::new(Body::empty());
        req.headers_mut()
            .insert(X_REQUEST_ID, HeaderValue::from_static(""));
        let id = ensure_request_id(&mut req);
        assert_eq!(id.len(), 36);
        assert_eq!(req.headers().get(X_REQUEST_ID), Some(&id));
    }
}
