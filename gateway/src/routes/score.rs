//! `POST /score`, `/v1/score`: pair scores. A cross-encoder scores each pair with its
//! classification head; an embedding model by the cosine of the two sides' vectors (the
//! engine decides which).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use engine::api::Task;
use engine::handle::{PoolInput, PoolTask};

use super::pooling_common::list_response;
use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::state::AppState;

crate::pooling_policy_request!(ScoreRequest);

/// The two sides, whichever spelling the client used, and the name of the second (named in
/// errors about the inputs).
fn sides(req: &ScoreRequest) -> ApiResult<(Vec<String>, Vec<String>, &'static str)> {
    let pairs = [
        (&req.queries, &req.documents, "documents"),
        (&req.queries, &req.items, "items"),
        (&req.data_1, &req.data_2, "data_2"),
        (&req.text_1, &req.text_2, "text_2"),
    ];
    for (a, b, name) in pairs {
        if let (Some(a), Some(b)) = (a, b) {
            return Ok((a.clone().into_vec(), b.clone().into_vec(), name));
        }
    }
    Err(ApiError::bad_request(
        "Give the two sides to score as `queries` and `documents` (or `queries`+`items`, `data_1`+`data_2`, `text_1`+`text_2`).",
        Some("queries"),
    ))
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<ScoreRequest>,
) -> ApiResult<Response> {
    req.pooling.validate()?;
    req.pooling.refuse_vector_formats("/score")?;
    let (queries, documents, field) = sides(&req)?;
    // The shape is checked before the gate, like the other field checks.
    engine::handle::pair_indices(queries.len(), documents.len(), field)?;
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Score)?;
    require_task(&model, Task::Score, "Score")?;
    let pooled = super::pooling_common::pool(
        &memory,
        &model,
        PoolInput::Pairs { queries, documents },
        req.pooling.pool_options(PoolTask::Score, field),
    )
    .await?;
    let data = pooled
        .rows
        .iter()
        .enumerate()
        .map(|(index, row)| ScoreData {
            index,
            object: "score",
            score: row.first().copied().map_or(0.0, f64::from),
        })
        .collect();
    let id = format!("score-{}", rid);
    Ok(list_response(id, &model, data, pooled.prompt_tokens))
}
