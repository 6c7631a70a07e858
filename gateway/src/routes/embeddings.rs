//! `POST /v1/embeddings`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use engine::api::Task;
use engine::handle::{ModelHandle, PoolInput, PoolOptions};

use super::pooling_common::{self, pool_input, Encoding, OutputFormat};
use super::{require_task, resolve_model, RequestId};
use crate::error::ApiResult;
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::protocol::Usage;
use crate::state::AppState;

crate::pooling_policy_request!(EmbeddingRequest);

/// The `bytes` / `bytes_only` answer: raw vectors, metadata in a header (or none).
pub fn bytes_response(
    vectors: &[Vec<f32>],
    fmt: OutputFormat,
    meta: serde_json::Value,
) -> Response {
    let mut resp = pooling_common::raw_bytes(vectors, fmt).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if fmt.encoding == Encoding::Bytes {
        if let Ok(v) = HeaderValue::from_str(&meta.to_string()) {
            resp.headers_mut().insert("metadata", v);
        }
    }
    resp
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<EmbeddingRequest>,
) -> ApiResult<Response> {
    let fmt = req.pooling.validate()?;
    // The pooling family runs the gate before the model check.
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Embed)?;
    require_task(&model, Task::Embed, "Embeddings")?;
    req.pooling.check_dimensions(&model)?;
    let input = pool_input(&state, &model, req.input.as_ref(), req.messages.as_ref())?;
    let opts = req
        .pooling
        .pool_options(engine::handle::PoolTask::Embed, "input");
    let id = format!("embd-{}", rid);
    pool_and_respond(&memory, &model, input, opts, fmt, id, |index, embedding| {
        EmbeddingData {
            index,
            object: "embedding",
            embedding,
        }
    })
    .await
}

/// Pool the input and answer: raw bytes for `bytes`/`bytes_only`, else a list of
/// `make(index, encoded row)` with the usage.
pub async fn pool_and_respond<T: serde::Serialize>(
    memory: &RequestMemory,
    model: &ModelHandle,
    input: PoolInput,
    opts: PoolOptions,
    fmt: OutputFormat,
    id: String,
    make: fn(usize, serde_json::Value) -> T,
) -> ApiResult<Response> {
    let pooled = pooling_common::pool(memory, model, input, opts).await?;
    let (rows, tokens) = (pooled.rows, pooled.prompt_tokens);
    let served = model.card().name.clone();
    if matches!(fmt.encoding, Encoding::Bytes | Encoding::BytesOnly) {
        let meta = serde_json::json!({"model": served, "usage": Usage::new(tokens, 0), "count": rows.len()});
        return Ok(bytes_response(&rows, fmt, meta));
    }
    let data = rows
        .iter()
        .enumerate()
        .map(|(index, v)| make(index, pooling_common::encode_vector(v, fmt)))
        .collect();
    Ok(pooling_common::list_response(id, model, data, tokens))
}
