//! `POST /v1/embeddings`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::api::Task;
use engine::handle::ModelHandle;

use super::pooling_common::{self, Encoding, OutputFormat};
use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::policy::run_policies;
use crate::protocol::pooling::*;
use crate::protocol::{now_secs, Usage};
use crate::state::AppState;

crate::pooling_policy_request!(EmbeddingRequest);

/// Token ids for `input` or chat-style `messages`.
pub fn inputs_of(
    state: &AppState,
    model: &ModelHandle,
    input: Option<&EmbedInput>,
    messages: Option<&Vec<crate::protocol::chat::ChatMessage>>,
    fields: &PoolingFields,
) -> ApiResult<Vec<Vec<u32>>> {
    match (input, messages) {
        (Some(input), None) => pooling_common::tokenize_input(model, input, fields),
        (None, Some(messages)) => {
            let parsed = super::messages::parse_messages(messages)?;
            super::chat::check_text_only(model, &parsed, "This route")?;
            let prompt = super::chat::render(
                state,
                model,
                &parsed.template_messages(messages),
                &super::chat::RenderOptions {
                    add_generation_prompt: false,
                    ..Default::default()
                },
            )?;
            pooling_common::tokenize_texts(model, &[prompt], fields)
        }
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "Give either `input` or `messages`, not both.",
            Some("input"),
        )),
        (None, None) => Err(ApiError::bad_request(
            "`input` (or `messages`) is required.",
            Some("input"),
        )),
    }
}

/// Run the encoder; the usage counts every input token.
pub async fn embed_all(
    model: &ModelHandle,
    inputs: Vec<Vec<u32>>,
) -> ApiResult<(Vec<Vec<f32>>, usize)> {
    let tokens = inputs.iter().map(Vec::len).sum();
    let vectors = model.embed(inputs).await?;
    Ok((vectors, tokens))
}

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
    ValidJson(req): ValidJson<EmbeddingRequest>,
) -> ApiResult<Response> {
    let fmt = req.pooling.validate()?;
    // The pooling family runs the gate before the model check.
    let req = run_policies(&state, req, key).await?.req;
    let model = resolve_model(&state, req.model.as_deref(), Task::Embed)?;
    require_task(&model, Task::Embed, "Embeddings")?;
    req.pooling.check_dimensions(&model)?;
    let inputs = inputs_of(
        &state,
        &model,
        req.input.as_ref(),
        req.messages.as_ref(),
        &req.pooling,
    )?;
    let id = format!("embd-{}", rid);
    embed_and_respond(&model, inputs, fmt, id, |index, embedding| EmbeddingData {
        index,
        object: "embedding",
        embedding,
    })
    .await
}

/// Embed the inputs and answer: raw bytes for `bytes`/`bytes_only`, else a list of
/// `make(index, encoded vector)` with the usage.
pub async fn embed_and_respond<T: serde::Serialize>(
    model: &ModelHandle,
    inputs: Vec<Vec<u32>>,
    fmt: OutputFormat,
    id: String,
    make: fn(usize, serde_json::Value) -> T,
) -> ApiResult<Response> {
    let (vectors, tokens) = embed_all(model, inputs).await?;
    let served = model.card().name.clone();
    if matches!(fmt.encoding, Encoding::Bytes | Encoding::BytesOnly) {
        let meta = serde_json::json!({"model": served, "usage": Usage::new(tokens, 0), "count": vectors.len()});
        return Ok(bytes_response(&vectors, fmt, meta));
    }
    let data = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| make(index, pooling_common::encode_vector(v, fmt)))
        .collect();
    Ok(Json(ListResponse {
        id,
        object: "list",
        created: now_secs(),
        model: served,
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}
