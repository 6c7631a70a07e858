//! `POST /tokenize` and `POST /detokenize`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::api::Task;

use super::chat::{check_template_options, render, RenderOptions};
use super::messages::{parse_messages, ParsedMessages};
use super::resolve_model;
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::policy::{run_policies, MediaCounts, PolicyRequest, RequestKwargs};
use crate::protocol::tokenize::*;
use crate::state::AppState;

struct TokenizeInput {
    req: TokenizeRequest,
    parsed: Option<ParsedMessages>,
}

impl PolicyRequest for TokenizeInput {
    fn mm_processor_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.req.mm_processor_kwargs)
    }
    fn media_io_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.req.media_io_kwargs)
    }
    fn media_counts(&self) -> MediaCounts {
        self.parsed
            .as_ref()
            .map(ParsedMessages::counts)
            .unwrap_or_default()
    }
}

pub async fn tokenize_handler(
    State(state): State<Arc<AppState>>,
    PresentedKey(key): PresentedKey,
    ValidJson(req): ValidJson<TokenizeRequest>,
) -> ApiResult<Response> {
    let parsed = match (&req.prompt, &req.messages) {
        (Some(_), None) => None,
        (None, Some(m)) => Some(parse_messages(m)?),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "Give either `prompt` or `messages`, not both.",
                Some("prompt"),
            ))
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "`prompt` or `messages` is required.",
                Some("prompt"),
            ))
        }
    };
    check_template_options(
        &state,
        req.chat_template.is_some(),
        req.add_generation_prompt,
        req.continue_final_message,
    )?;
    // Tokenize checks the model before the gate, as chat does.
    let model = match req.model.as_deref() {
        Some(name) => resolve_model(&state, Some(name), Task::Generate)?,
        None => resolve_model(&state, None, Task::Generate)
            .or_else(|_| resolve_model(&state, None, Task::Embed))?,
    };
    let TokenizeInput { req, parsed } = run_policies(&state, TokenizeInput { req, parsed }, key)
        .await?
        .req;
    let ids = match parsed {
        None => {
            let prompt = req.prompt.as_deref().unwrap_or_default();
            engine::handle::off_reactor(prompt.len(), || {
                model.encode(prompt, req.add_special_tokens.unwrap_or(true))
            })?
        }
        Some(parsed) => {
            super::chat::check_text_only(&model, &parsed, "/tokenize")?;
            let text = render(
                &state,
                &model,
                &parsed.template_messages(req.messages.as_deref().unwrap_or_default()),
                &RenderOptions {
                    add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                    continue_final_message: req.continue_final_message.unwrap_or(false),
                    chat_template: req.chat_template.as_deref(),
                    kwargs: req.chat_template_kwargs.as_ref(),
                    tools: req.tools.as_ref(),
                },
            )?;
            engine::handle::off_reactor(text.len(), || {
                model.encode(&text, req.add_special_tokens.unwrap_or(false))
            })?
        }
    };
    let token_strs = req.return_token_strs.unwrap_or(false).then(|| {
        ids.iter()
            .map(|&id| model.token_str(id).unwrap_or_default())
            .collect()
    });
    Ok(Json(TokenizeResponse {
        count: ids.len(),
        max_model_len: model.card().max_model_len,
        tokens: ids,
        token_strs,
    })
    .into_response())
}

pub async fn detokenize_handler(
    State(state): State<Arc<AppState>>,
    ValidJson(req): ValidJson<DetokenizeRequest>,
) -> ApiResult<Response> {
    detokenize(state, req)
}

fn detokenize(state: Arc<AppState>, req: DetokenizeRequest) -> ApiResult<Response> {
    let model = match req.model.as_deref() {
        Some(name) => resolve_model(&state, Some(name), Task::Generate)?,
        None => resolve_model(&state, None, Task::Generate)
            .or_else(|_| resolve_model(&state, None, Task::Embed))?,
    };
    let ids = model.token_ids(&req.tokens, "tokens")?;
    let prompt = model.decode(&ids, false)?;
    Ok(Json(DetokenizeResponse { prompt }).into_response())
}
