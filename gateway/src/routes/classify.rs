//! `POST /classify`: a sequence classifier's probabilities over its labels (softmax or sigmoid
//! as its `problem_type` says; the logits with `use_activation: false`), and the label of the
//! largest. Models without a classification head refuse the task.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use engine::api::Task;
use engine::handle::PoolTask;

use super::pooling_common::{argmax, list_response, pool_input};
use super::{resolve_model, unsupported_task, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::policy::run_policies;
use crate::protocol::pooling::{ClassificationData, ClassifyRequest};
use crate::state::AppState;

crate::pooling_policy_request!(ClassifyRequest);

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<ClassifyRequest>,
) -> ApiResult<Response> {
    req.pooling.validate()?;
    req.pooling.refuse_vector_formats("/classify")?;
    if req.input.is_none() && req.messages.is_none() {
        return Err(ApiError::bad_request(
            "`input` (or `messages`) is required.",
            Some("input"),
        ));
    }
    let req = run_policies(&state, req, key).await?.req;
    let model = match req.model.as_deref() {
        Some(name) => resolve_model(&state, Some(name), Task::Classify)?,
        // With no model named, a classifier if one is served; else the first model, which
        // refuses the task below.
        None => resolve_model(&state, None, Task::Classify)
            .or_else(|_| resolve_model(&state, None, Task::Embed))
            .or_else(|_| resolve_model(&state, None, Task::Generate))?,
    };
    if !model.card().tasks.contains(&Task::Classify) {
        let supported: Vec<&str> = model
            .card()
            .tasks
            .iter()
            .map(|t| super::task_name(*t))
            .collect();
        return Err(unsupported_task("classify", &supported, None));
    }
    let input = pool_input(&state, &model, req.input.as_ref(), req.messages.as_ref())?;
    let opts = req.pooling.pool_options(PoolTask::Classify, "input");
    let pooled = super::pooling_common::pool(&memory, &model, input, opts).await?;
    let labels = model.labels().unwrap_or_default();
    let data = pooled
        .rows
        .iter()
        .enumerate()
        .map(|(index, probs)| ClassificationData {
            index,
            label: labels.get(argmax(probs)).cloned(),
            probs: probs.iter().map(|&p| f64::from(p)).collect(),
            num_classes: probs.len(),
        })
        .collect();
    let id = format!("classify-{}", rid);
    Ok(list_response(id, &model, data, pooled.prompt_tokens))
}
