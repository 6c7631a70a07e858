//! The router: every route of CONTRACT section 1, wrapped in the tower stack.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::http::auth::AuthConfig;
use crate::http::stack::{self, StackConfig};
use crate::routes;
use crate::state::AppState;

pub struct HttpLimits {
    pub max_concurrent: usize,
    pub timeout: Duration,
}

pub fn router(state: Arc<AppState>, limits: HttpLimits) -> Router {
    let keys: Vec<Vec<u8>> = state
        .api_keys
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
    // Clients the trusted-client profile names are valid clients too.
    let also_accept = state.profile.as_ref().map(|_| {
        let s = state.clone();
        Box::new(move |k: &str| s.profile.as_ref().is_some_and(|p| p.is_trusted(Some(k))))
            as crate::http::auth::KeyCheck
    });
    let auth = Arc::new(AuthConfig { keys, also_accept });
    let app = Router::new()
        .route("/v1/chat/completions", post(routes::chat::handler))
        .route("/v1/completions", post(routes::completions::handler))
        .route("/v1/embeddings", post(routes::embeddings::handler))
        .route("/pooling", post(routes::pooling::handler))
        .route("/score", post(routes::score::handler))
        .route("/v1/score", post(routes::score::handler))
        .route("/rerank", post(routes::rerank::handler))
        .route("/v1/rerank", post(routes::rerank::handler))
        .route("/v2/rerank", post(routes::rerank::handler))
        .route("/classify", post(routes::classify::handler))
        .route("/tokenize", post(routes::tokenize::tokenize_handler))
        .route("/detokenize", post(routes::tokenize::detokenize_handler))
        .route("/v1/models", get(routes::info::models))
        .route("/health", get(routes::info::health))
        .route(
            "/ping",
            get(routes::info::health).post(routes::info::health),
        )
        .route("/version", get(routes::info::version))
        .route("/metrics", get(routes::info::metrics))
        .fallback(|| async { ApiError::NotFound("Not Found".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::bad_request("Method Not Allowed for this route.", None)
        })
        .with_state(state);
    stack::apply(
        app,
        StackConfig {
            auth,
            max_concurrent: limits.max_concurrent,
            timeout: limits.timeout,
        },
    )
}
