//! `POST /rerank`, `/v1/rerank`, `/v2/rerank`: documents sorted by relevance to the query,
//! scored as `/score` scores (a cross-encoder's head, or an embedding model's cosine).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::api::Task;
use engine::handle::{PoolInput, PoolTask};

use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::state::AppState;

crate::pooling_policy_request!(RerankRequest);

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<RerankRequest>,
) -> ApiResult<Response> {
    req.pooling.validate()?;
    req.pooling.refuse_vector_formats("/rerank")?;
    let Some(query) = req.query.clone() else {
        return Err(ApiError::bad_request("`query` is required.", Some("query")));
    };
    let Some(documents) = req.documents.clone() else {
        return Err(ApiError::bad_request(
            "`documents` is required.",
            Some("documents"),
        ));
    };
    if let Some(t) = req.top_n {
        if t < 0 {
            return Err(ApiError::bad_request(
                format!("top_n must be at least 0, got {t}."),
                Some("top_n"),
            ));
        }
    }
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Score)?;
    require_task(&model, Task::Score, "Rerank")?;
    if documents.is_empty() {
        return Err(ApiError::bad_request(
            "`documents` must not be empty.",
            Some("documents"),
        ));
    }
    let pooled = super::pooling_common::pool(
        &memory,
        &model,
        PoolInput::Pairs {
            queries: vec![query],
            documents: documents.iter().map(|d| d.text().to_string()).collect(),
        },
        req.pooling.pool_options(PoolTask::Score, "documents"),
    )
    .await?;
    let mut results: Vec<RerankResult> = documents
        .iter()
        .zip(&pooled.rows)
        .enumerate()
        .map(|(index, (d, row))| RerankResult {
            index,
            document: (req.return_documents != Some(false)).then(|| RerankDocOut {
                text: d.text().to_string(),
            }),
            relevance_score: row.first().copied().map_or(0.0, f64::from),
        })
        .collect();
    // Stable: equal scores keep the documents' order.
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    let top_n = req.top_n.unwrap_or(0) as usize;
    if top_n > 0 {
        results.truncate(top_n);
    }
    Ok(Json(RerankResponse {
        id: format!("rerank-{}", rid),
        model: model.card().name.clone(),
        usage: RerankUsage {
            prompt_tokens: pooled.prompt_tokens,
            total_tokens: pooled.prompt_tokens,
        },
        results,
    })
    .into_response())
}
