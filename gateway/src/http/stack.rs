//! The stack: one composed layer, [`super::front::FrontLayer`] (request id, catch-panic to a
//! JSON 500, auth, the concurrency limit, the request timeout, the debug access log). The
//! server puts it once around its dispatcher ([`crate::app::app`]), so a request pays one
//! future for the whole stack; [`apply`] puts it around a bare router (the stack's tests). The
//! body-size limit is applied where bodies are read ([`super::extract::ValidJson`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::Semaphore;

use super::auth::AuthConfig;
use super::front::{FrontConfig, FrontLayer};
use super::options::FrontOptions;

pub struct StackConfig {
    pub auth: Arc<AuthConfig>,
    pub max_concurrent: usize,
    /// `--max-request-memory`: what requests in flight may hold together.
    pub request_memory: preprocess::budget::ByteBudget,
    pub timeout: Duration,
    pub options: FrontOptions,
}

pub fn front_layer(cfg: StackConfig) -> FrontLayer {
    FrontLayer(Arc::new(FrontConfig {
        auth: cfg.auth,
        slots: Arc::new(Semaphore::new(cfg.max_concurrent.max(1))),
        memory: cfg.request_memory,
        timeout: cfg.timeout,
        options: cfg.options,
    }))
}

/// The stack around a router (the server itself puts it around [`crate::app::Dispatch`]).
pub fn apply(router: Router, cfg: StackConfig) -> Router {
    router.layer(front_layer(cfg))
}
