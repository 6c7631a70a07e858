//! The routes, one file each. Every handler follows CONTRACT section 2's order: parse and
//! validate, then the model check and the policy layers (in the route family's order), then
//! rendering and tokenization, then media, then model work.

pub mod chat;
pub mod classify;
pub mod completions;
pub mod embeddings;
pub mod generate;
pub mod info;
pub mod log;
pub mod lora;
pub mod messages;
pub mod pooling;
pub mod pooling_common;
pub mod rerank;
pub mod score;
pub mod tokenize;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderValue;
use engine::api::Task;
use engine::handle::ModelHandle;

use crate::error::{ApiError, ApiResult};
use crate::http::front::X_REQUEST_ID;
use crate::state::AppState;

pub type AppStateRef = axum::extract::State<Arc<AppState>>;

/// The request id: `X-Request-Id` as the front service left it (the client's, or a fresh
/// uuid it wrote in). Holds the header value (a reference count, no copy) until a handler
/// needs the text.
pub struct RequestId(pub RequestIdValue);

pub struct RequestIdValue(Option<HeaderValue>);

impl std::fmt::Display for RequestIdValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_ref().and_then(|v| v.to_str().ok()) {
            Some(id) => f.write_str(id),
            // Only without the front service (tests of a bare router).
            None => write!(f, "{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(RequestId(RequestIdValue(
            parts
                .headers
                .get(X_REQUEST_ID)
                .filter(|v| !v.is_empty())
                .cloned(),
        )))
    }
}

/// The served model a request names (a LoRA adapter's name gives its base bound to it), or the
/// first model that can do `task` when it names none.
pub fn resolve_model(state: &AppState, name: Option<&str>, task: Task) -> ApiResult<ModelHandle> {
    match name {
        Some(name) => state
            .served
            .primary(name)
            .and_then(|primary| state.engine.model(primary))
            .or_else(|| state.engine.adapter(name))
            .ok_or_else(|| ApiError::ModelNotFound(name.to_string())),
        None => state
            .engine
            .models()
            .iter()
            .find(|c| c.tasks.contains(&task))
            .and_then(|c| state.engine.model(&c.name))
            .ok_or_else(|| {
                ApiError::bad_request(
                    format!(
                        "No served model supports the task '{}'; name one with `model`.",
                        task_name(task)
                    ),
                    Some("model"),
                )
            }),
    }
}

pub fn task_name(task: Task) -> &'static str {
    match task {
        Task::Generate => "generate",
        Task::Embed => "embed",
        Task::Score => "score",
        Task::Classify => "classify",
    }
}

/// vLLM's refusal of a pooling task the model cannot do, listing those it can.
pub fn unsupported_task(task: &str, supported: &[&str], param: Option<&str>) -> ApiError {
    ApiError::bad_request(
        format!("Unsupported task: '{task}' Supported tasks: {supported:?}"),
        param,
    )
}

/// 400 when the model cannot do the task the route needs.
pub fn require_task(model: &ModelHandle, task: Task, api: &str) -> ApiResult<()> {
    if model.card().tasks.contains(&task) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            format!(
                "Unsupported task: '{}'. The model `{}` does not support the {api} API (its tasks: {}).",
                task_name(task),
                model.card().name,
                model
                    .card()
                    .tasks
                    .iter()
                    .map(|t| task_name(*t))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        ))
    }
}
