//! `POST /pooling`: generic pooling; `task` embed is supported on embedding models.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use engine::api::Task;

use super::embeddings::{embed_and_respond, inputs_of};
use super::{resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::state::AppState;

crate::pooling_policy_request!(PoolingRequest);

const KNOWN_TASKS: [&str; 4] = ["embed", "classify", "token_embed", "token_classify"];

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    ValidJson(req): ValidJson<PoolingRequest>,
) -> ApiResult<Response> {
    let fmt = req.pooling.validate()?;
    if let Some(task) = req.task.as_deref() {
        if !KNOWN_TASKS.contains(&task) {
            return Err(ApiError::bad_request(
                format!(
                    "task must be one of {}, got '{task}'.",
                    KNOWN_TASKS.join(", ")
                ),
                Some("task"),
            ));
        }
    }
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Embed)?;
    let task = req.task.as_deref().unwrap_or("embed");
    if task != "embed" || !model.card().tasks.contains(&Task::Embed) {
        let supported: Vec<&str> = if model.card().tasks.contains(&Task::Embed) {
            vec!["embed"]
        } else {
            vec![]
        };
        return Err(ApiError::bad_request(
            format!("Unsupported task: '{task}' Supported tasks: {supported:?}"),
            Some("task"),
        ));
    }
    req.pooling.check_dimensions(&model)?;
    let inputs = inputs_of(
        &state,
        &model,
        req.input.as_ref(),
        req.messages.as_ref(),
        &req.pooling,
    )?;
    let id = format!("pool-{}", rid);
    embed_and_respond(&model, inputs, fmt, id, |index, data| PoolingData {
        index,
        object: "pooling",
        data,
    })
    .await
}
