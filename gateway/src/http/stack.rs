//! The tower stack around the router: request id, catch-panic to a JSON 500, the guard (auth,
//! concurrency limit, debug access log), the body-size limit and the request timeout.
//! tower-http's `TraceLayer` cost about 6 µs per request here (a span and a body wrapper
//! each), so the access log lives in the guard instead.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::sync::Semaphore;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::{RequestBodyLimitLayer, ResponseBody};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;

use super::auth::AuthConfig;
use crate::error::ApiError;

pub struct StackConfig {
    pub auth: Arc<AuthConfig>,
    pub max_concurrent: usize,
    pub max_body_bytes: usize,
    pub timeout: Duration,
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let detail = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(panic = detail, "handler panicked");
    ApiError::Internal("The server hit an internal error while handling this request.".into())
        .into_response()
}

pub fn apply(router: Router, cfg: StackConfig) -> Router {
    let x_request_id = HeaderName::from_static("x-request-id");
    let sem = Arc::new(Semaphore::new(cfg.max_concurrent.max(1)));
    // One composed layer, outermost first: `Router::layer` boxes the stack once per route, so
    // a request pays one boxed service and one boxed future, not one per layer.
    router.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(
                x_request_id.clone(),
                MakeRequestUuid,
            ))
            .layer(PropagateRequestIdLayer::new(x_request_id))
            .layer(CatchPanicLayer::custom(panic_response))
            .layer(super::guard::GuardLayer {
                auth: cfg.auth,
                slots: sem,
            })
            // The guard takes axum's body type; the two tower-http layers below wrap it.
            .map_response(|r: Response<ResponseBody<Body>>| r.map(Body::new))
            .layer(RequestBodyLimitLayer::new(cfg.max_body_bytes))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::GATEWAY_TIMEOUT,
                cfg.timeout,
            )),
    )
}
