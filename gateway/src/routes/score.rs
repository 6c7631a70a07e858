//! `POST /score`, `/v1/score`: pair scores with an embedding model (cosine similarity).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::api::Task;

use super::embeddings::embed_all;
use super::pooling_common::{cosine, tokenize_texts};
use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::protocol::{now_secs, Usage};
use crate::state::AppState;

crate::pooling_policy_request!(ScoreRequest);

/// The two sides, whichever spelling the client used.
fn sides(req: &ScoreRequest) -> ApiResult<(Vec<String>, Vec<String>)> {
    let pairs = [
        (&req.queries, &req.documents, "queries", "documents"),
        (&req.queries, &req.items, "queries", "items"),
        (&req.data_1, &req.data_2, "data_1", "data_2"),
        (&req.text_1, &req.text_2, "text_1", "text_2"),
    ];
    for (a, b, _, _) in pairs {
        if let (Some(a), Some(b)) = (a, b) {
            return Ok((a.clone().into_vec(), b.clone().into_vec()));
        }
    }
    Err(ApiError::bad_request(
        "Give the two sides to score as `queries` and `documents` (or `queries`+`items`, `data_1`+`data_2`, `text_1`+`text_2`).",
        Some("queries"),
    ))
}

/// Index pairs for 1:1, 1:N and N:N (zip).
pub fn pairs(n_left: usize, n_right: usize) -> ApiResult<Vec<(usize, usize)>> {
    if n_left == 0 || n_right == 0 {
        return Err(ApiError::bad_request(
            "Both sides to score must be non-empty.",
            Some("documents"),
        ));
    }
    if n_left == 1 {
        Ok((0..n_right).map(|j| (0, j)).collect())
    } else if n_left == n_right {
        Ok((0..n_left).map(|i| (i, i)).collect())
    } else {
        Err(ApiError::bad_request(
            format!("The two sides must have the same length for N:N scoring, or the first side a single item (got {n_left} and {n_right})."),
            Some("documents"),
        ))
    }
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    ValidJson(req): ValidJson<ScoreRequest>,
) -> ApiResult<Response> {
    req.pooling.validate()?;
    let (left, right) = sides(&req)?;
    let index_pairs = pairs(left.len(), right.len())?;
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Score)?;
    require_task(&model, Task::Score, "Score")?;
    let n_left = left.len();
    let mut texts = left;
    texts.extend(right);
    let ids = tokenize_texts(&model, &texts, &req.pooling)?;
    let (vectors, tokens) = embed_all(&model, ids).await?;
    let data = index_pairs
        .iter()
        .enumerate()
        .map(|(index, &(i, j))| ScoreData {
            index,
            object: "score",
            score: cosine(&vectors[i], &vectors[n_left + j]),
        })
        .collect();
    Ok(Json(ListResponse {
        id: format!("score-{}", rid),
        object: "list",
        created: now_secs(),
        model: model.card().name.clone(),
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_shapes() {
        assert_eq!(pairs(1, 3).unwrap(), vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!(pairs(2, 2).unwrap(), vec![(0, 0), (1, 1)]);
        assert!(pairs(2, 3).is_err());
        assert!(pairs(0, 1).is_err());
    }
}
