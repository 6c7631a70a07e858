//! `POST /classify`: needs a classifier checkpoint; on other models a 400 unsupported task.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use engine::api::Task;

use super::resolve_model;
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::policy::run_policies;
use crate::protocol::pooling::ClassifyRequest;
use crate::state::AppState;

crate::pooling_policy_request!(ClassifyRequest);

pub async fn handler(
    State(state): State<Arc<AppState>>,
    PresentedKey(key): PresentedKey,
    ValidJson(req): ValidJson<ClassifyRequest>,
) -> ApiResult<Response> {
    req.pooling.validate()?;
    if req.input.is_none() && req.messages.is_none() {
        return Err(ApiError::bad_request(
            "`input` (or `messages`) is required.",
            Some("input"),
        ));
    }
    let req = run_policies(&state, req, key).await?.req;
    let model = match req.model.as_deref() {
        Some(name) => resolve_model(&state, Some(name), Task::Classify)?,
        // With no model named, answer for the first served one (none has a classifier head).
        None => resolve_model(&state, None, Task::Classify)
            .or_else(|_| resolve_model(&state, None, Task::Embed))
            .or_else(|_| resolve_model(&state, None, Task::Generate))?,
    };
    // No served architecture has a classification head yet: every model refuses the task.
    let supported: Vec<&str> = model
        .card()
        .tasks
        .iter()
        .map(|t| super::task_name(*t))
        .collect();
    Err(ApiError::bad_request(
        format!("Unsupported task: 'classify' Supported tasks: {supported:?}"),
        None,
    ))
}
