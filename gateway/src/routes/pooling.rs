//! `POST /pooling`: generic pooling; `task` embed on embedding models, classify on classifiers
//! (the probabilities, or the logits with `use_activation: false`). Without `task`, the
//! model's own: classify on a classifier, else embed.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use engine::api::Task;
use engine::handle::PoolTask;

use super::embeddings::pool_and_respond;
use super::pooling_common::pool_input;
use super::{resolve_model, unsupported_task, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::state::AppState;

crate::pooling_policy_request!(PoolingRequest);

const KNOWN_TASKS: [&str; 4] = ["embed", "classify", "token_embed", "token_classify"];

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
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
    let tasks = &model.card().tasks;
    let supported: Vec<&str> = [(Task::Embed, "embed"), (Task::Classify, "classify")]
        .iter()
        .filter(|(t, _)| tasks.contains(t))
        .map(|&(_, name)| name)
        .collect();
    let task = match req.task.as_deref() {
        Some(task) => task,
        None => supported.first().copied().unwrap_or("embed"),
    };
    let pool_task = match task {
        "embed" if supported.contains(&"embed") => PoolTask::Embed,
        "classify" if supported.contains(&"classify") => PoolTask::Classify,
        _ => return Err(unsupported_task(task, &supported, Some("task"))),
    };
    if pool_task == PoolTask::Embed {
        req.pooling.check_dimensions(&model)?;
    } else if req.pooling.dimensions.is_some() {
        return Err(ApiError::bad_request(
            "`dimensions` applies to embeddings; task classify returns one value per label.",
            Some("dimensions"),
        ));
    }
    let input = pool_input(&state, &model, req.input.as_ref(), req.messages.as_ref())?;
    let opts = req.pooling.pool_options(pool_task, "input");
    let id = format!("pool-{}", rid);
    pool_and_respond(&memory, &model, input, opts, fmt, id, |index, data| {
        PoolingData {
            index,
            object: "pooling",
            data,
        }
    })
    .await
}
