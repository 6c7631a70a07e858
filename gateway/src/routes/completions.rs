//! `POST /v1/completions`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use engine::api::{SamplingParams, StepLogprobs, Task};
use engine::handle::{ModelHandle, PromptOptions, PromptSource, SubmitOptions};
use futures::StreamExt;
use serde_json::{Map, Value};

use super::generate::{self, token_text};
use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::http::sse;
use crate::policy::{run_policies, PolicyRequest, RequestKwargs};
use crate::protocol::completion::*;
use crate::protocol::{now_secs, Usage};
use crate::state::AppState;

impl PolicyRequest for CompletionRequest {
    fn mm_processor_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.mm_processor_kwargs)
    }
    fn media_io_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.media_io_kwargs)
    }
}

fn validate(req: &CompletionRequest, state: &AppState) -> ApiResult<Option<usize>> {
    req.sampling.validate(req.max_tokens(), "max_tokens")?;
    if req.suffix.is_some() {
        // vLLM's answer, word for word.
        return Err(ApiError::bad_request(
            "suffix is not currently supported",
            Some("suffix"),
        ));
    }
    if let Some(embeds) = req.prompt_embeds.as_deref() {
        crate::protocol::fields::refuse(
            "prompt_embeds",
            embeds,
            crate::protocol::fields::COMPLETION,
        )?;
    }
    if req.prompt.is_none() {
        return Err(ApiError::bad_request(
            "Either `prompt` or `prompt_embeds` must be provided.",
            Some("prompt"),
        ));
    }
    match req.logprobs {
        None => Ok(None),
        Some(-1) => Ok(Some(state.max_logprobs)),
        Some(k) if k < -1 => Err(ApiError::bad_request(
            format!("`logprobs` must be -1 or a non-negative integer, got {k}."),
            Some("logprobs"),
        )),
        Some(k) if k as usize > state.max_logprobs => Err(ApiError::bad_request(
            format!(
                "Requested sample logprobs of {k}, which is greater than max allowed: {}",
                state.max_logprobs
            ),
            Some("logprobs"),
        )),
        Some(k) => Ok(Some(k as usize)),
    }
}

impl CompletionRequest {
    fn max_tokens(&self) -> Option<i64> {
        self.sampling.max_tokens
    }
}

/// The request's prompts, as the engine's front door takes them. An empty prompt (or list)
/// is refused here; the engine checks ids against the vocabulary and tokenises the texts.
fn prompt_sources(prompt: &PromptField) -> ApiResult<Vec<PromptSource>> {
    let empty = || ApiError::bad_request("The prompt cannot be empty.", Some("prompt"));
    match prompt {
        PromptField::Text(t) if t.is_empty() => Err(empty()),
        PromptField::Text(t) => Ok(vec![PromptSource::Text(t.clone())]),
        PromptField::Texts(ts) if ts.is_empty() || ts.iter().any(String::is_empty) => Err(empty()),
        PromptField::Texts(ts) => Ok(ts.iter().cloned().map(PromptSource::Text).collect()),
        PromptField::Ids(ids) if ids.is_empty() => Err(empty()),
        PromptField::Ids(ids) => Ok(vec![PromptSource::Ids(ids.clone())]),
        PromptField::IdLists(lists) if lists.is_empty() || lists.iter().any(Vec::is_empty) => {
            Err(empty())
        }
        PromptField::IdLists(lists) => Ok(lists.iter().cloned().map(PromptSource::Ids).collect()),
    }
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<CompletionRequest>,
) -> ApiResult<Response> {
    let logprobs = validate(&req, &state)?;
    let model = resolve_model(&state, req.model.as_deref(), Task::Generate)?;
    require_task(&model, Task::Generate, "Completions")?;
    let policed = run_policies(&state, req, key).await?;
    let req = policed.req;
    let prompt_logprobs =
        generate::resolve_prompt_logprobs(&req.sampling, &model, state.max_logprobs)?;
    let echo = req.echo.unwrap_or(false);
    // With `echo`, `logprobs` covers the prompt's tokens too (as vLLM): the engine computes
    // the prompt's logprobs with at least as many alternatives.
    let echo_logprobs = match (echo, logprobs) {
        (true, Some(k)) => {
            let device = &model.card().device;
            if device != "cpu" {
                return Err(ApiError::bad_request(
                    format!("`echo` with `logprobs` needs the prompt's logprobs, which a model on {device} does not compute."),
                    Some("echo"),
                ));
            }
            Some(k)
        }
        _ => None,
    };
    let prompt_logprobs = match (prompt_logprobs, echo_logprobs) {
        (Some(p), Some(k)) => Some(p.max(k)),
        (p, k) => p.or(k),
    };
    let Some(prompt) = &req.prompt else {
        return Err(ApiError::bad_request(
            "`prompt` must be provided.",
            Some("prompt"),
        ));
    };
    let opts = PromptOptions {
        add_special_tokens: req.add_special_tokens.unwrap_or(true),
        truncate_prompt_tokens: req.sampling.truncate_prompt_tokens,
        field: "prompt",
    };
    let sources = prompt_sources(prompt)?;
    generate::hold_sequences(
        &memory,
        &model,
        sources.len().saturating_mul(req.sampling.n()),
        logprobs.max(prompt_logprobs),
    )?;
    let prompts = sources
        .into_iter()
        .map(|source| model.prompt(source, opts))
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = state.generation_defaults(model.base_name());
    let params = SamplingParams {
        prompt_logprobs,
        ..req.sampling.to_params(logprobs, defaults)?
    };
    generate::check_constraint(&model, &req.sampling).await?;

    let id = format!("cmpl-{rid}");
    let echo_ids: Vec<Vec<u32>> = if echo_logprobs.is_some() {
        prompts.iter().map(|p| p.ids().to_vec()).collect()
    } else {
        Vec::new()
    };
    let echo_texts: Vec<String> = if echo {
        prompts
            .iter()
            .map(|p| model.decode(p.ids(), false))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    if let Some(log) = &state.log_requests {
        for prompt in &prompts {
            log.log(&rid, "completions", &model, prompt.ids(), &params);
        }
    }
    let started = model
        .submit(
            prompts,
            Vec::new(),
            SubmitOptions {
                request_id: rid.to_string(),
                params,
                // vLLM's completion requests default to 16 tokens, so the generation
                // config's max_new_tokens only caps them.
                max_tokens: req.sampling.max_tokens.or(Some(16)),
                max_tokens_field: "max_tokens",
                default_max_tokens: defaults.max_tokens,
                max_tokens_cap: defaults.max_tokens_cap,
                n: req.sampling.n(),
                cache_salt: req.sampling.cache_salt.clone(),
            },
        )
        .await?;
    let prompt_tokens: usize = started.prompt_tokens.iter().sum();
    let choices = started.choices;
    let served = model.card().name.clone();
    if req.sampling.stream == Some(true) {
        return Ok(stream_response(
            model,
            id,
            served,
            choices,
            Echo {
                texts: echo_texts,
                ids: echo_ids,
            },
            prompt_tokens,
            req.sampling.include_usage(),
            state.prompt_tokens_details,
            logprobs.is_some(),
        ));
    }
    let done = generate::collect_all(choices).await?;
    let completion_tokens: usize = done.iter().map(|c| c.finish.completion_tokens).sum();
    // Choices of one prompt share its cached prefix: count it once per prompt.
    let mut counted = std::collections::HashSet::new();
    let cached: usize = done
        .iter()
        .filter(|c| counted.insert(c.prompt_idx))
        .map(|c| c.finish.cached_tokens)
        .sum();
    let usage = Usage::new(prompt_tokens, completion_tokens)
        .with_cached(cached, state.prompt_tokens_details);
    let choices = done
        .into_iter()
        .map(|c| {
            let mut text = echo_texts.get(c.prompt_idx).cloned().unwrap_or_default();
            let offset = text.len();
            text.push_str(&c.text);
            let mut lp = logprobs.map(|_| CompletionLogprobs::default());
            if let (Some(lp), Some(ids), Some(entries)) = (
                lp.as_mut(),
                echo_ids.get(c.prompt_idx),
                c.prompt_logprobs.as_deref(),
            ) {
                echoed_logprobs(&model, ids, entries, lp);
            }
            if let Some(lp) = lp.as_mut() {
                append_logprobs(&model, &c.logprobs, offset, lp);
            }
            CompletionChoice {
                index: c.index,
                logprobs: lp,
                finish_reason: Some(generate::finish_reason(&c.finish)),
                stop_reason: generate::stop_reason(&c.finish),
                prompt_logprobs: c
                    .prompt_logprobs
                    .as_deref()
                    .map(|e| generate::prompt_logprobs_json(&model, e)),
                text,
            }
        })
        .collect();
    Ok(Json(Completion {
        id,
        object: "text_completion",
        created: now_secs(),
        model: served,
        choices,
        usage: Some(usage),
    })
    .into_response())
}

/// The echoed prompt's tokens at the head of `out` (offsets from 0): the first has no
/// logprob, as in vLLM; each other lists itself and its alternatives.
fn echoed_logprobs(
    model: &ModelHandle,
    ids: &[u32],
    entries: &[Option<engine::api::PromptLogprob>],
    out: &mut CompletionLogprobs,
) {
    let mut offset = 0;
    for (i, &id) in ids.iter().enumerate() {
        let token = token_text(model, id);
        out.text_offset.push(offset);
        offset += token.len();
        match entries.get(i).and_then(Option::as_ref) {
            Some(e) => {
                out.token_logprobs.push(Some(e.logprob.max(-9999.0)));
                let mut top = Map::new();
                top.insert(token.clone(), Value::from(e.logprob.max(-9999.0)));
                for t in &e.top {
                    top.entry(token_text(model, t.id))
                        .or_insert_with(|| Value::from(t.logprob.max(-9999.0)));
                }
                out.top_logprobs.push(Some(top));
            }
            None => {
                out.token_logprobs.push(None);
                out.top_logprobs.push(None);
            }
        }
        out.tokens.push(token);
    }
}

/// Generated steps appended to `out`, their offsets counted from `start_offset`.
fn append_logprobs(
    model: &ModelHandle,
    steps: &[StepLogprobs],
    start_offset: usize,
    out: &mut CompletionLogprobs,
) {
    let mut offset = start_offset;
    for s in steps {
        let token = token_text(model, s.token_id);
        out.text_offset.push(offset);
        offset += token.len();
        out.token_logprobs.push(Some(s.logprob));
        let mut top = Map::new();
        for t in &s.top {
            top.insert(token_text(model, t.id), Value::from(t.logprob));
        }
        out.top_logprobs.push(Some(top));
        out.tokens.push(token);
    }
}

/// What a stream echoes before each prompt's first choice delta: the prompt's text and, with
/// `logprobs`, its ids (whose logprobs come with the first delta).
struct Echo {
    texts: Vec<String>,
    ids: Vec<Vec<u32>>,
}

#[allow(clippy::too_many_arguments)]
fn stream_response(
    model: ModelHandle,
    id: String,
    served: String,
    choices: Vec<generate::Choice>,
    echo: Echo,
    prompt_tokens: usize,
    include_usage: bool,
    prompt_tokens_details: bool,
    want_logprobs: bool,
) -> Response {
    let created = now_secs();
    let n = choices.len();
    // Choices of one prompt share its cached prefix: counted once per prompt.
    let prompt_of: std::collections::HashMap<usize, usize> =
        choices.iter().map(|c| (c.index, c.prompt_idx)).collect();
    let mut cached_by_prompt = std::collections::HashMap::new();
    let per_prompt = if echo.texts.is_empty() {
        1
    } else {
        n / echo.texts.len().max(1)
    };
    let mut echoed = vec![echo.texts.is_empty(); n];
    let mut remaining = n;
    let mut completion_tokens = 0usize;
    let mut failed = false;
    let usage_id = id.clone();
    let usage_model = served.clone();
    let chunk_json = move |index: usize,
                           text: String,
                           lp: Option<CompletionLogprobs>,
                           finish: Option<&engine::api::Finish>| {
        let c = Completion {
            id: id.clone(),
            object: "text_completion",
            created,
            model: served.clone(),
            choices: vec![CompletionChoice {
                index,
                text,
                logprobs: lp,
                finish_reason: finish.map(generate::finish_reason),
                stop_reason: finish.and_then(generate::stop_reason),
                prompt_logprobs: None,
            }],
            usage: None,
        };
        serde_json::to_string(&c).unwrap_or_default()
    };
    let usage_json = move |completion_tokens: usize, cached: usize| {
        let c = Completion {
            id: usage_id.clone(),
            object: "text_completion",
            created,
            model: usage_model.clone(),
            choices: Vec::new(),
            usage: Some(
                Usage::new(prompt_tokens, completion_tokens)
                    .with_cached(cached, prompt_tokens_details),
            ),
        };
        serde_json::to_string(&c).unwrap_or_default()
    };
    let merged = generate::merged_stream(choices);
    let body = merged
        .map(move |(index, delta)| {
            let mut out: Vec<Bytes> = Vec::new();
            match delta {
                Err(e) => {
                    if !failed {
                        failed = true;
                        out.push(sse::event(&e.to_json()));
                        out.push(sse::done());
                    }
                }
                Ok(_) if failed => {}
                Ok(d) => {
                    let mut text = String::new();
                    let mut lp = want_logprobs.then(CompletionLogprobs::default);
                    if !echoed[index] {
                        echoed[index] = true;
                        let p = index / per_prompt.max(1);
                        text.push_str(&echo.texts[p]);
                        if let (Some(lp), Some(ids), Some(entries)) =
                            (lp.as_mut(), echo.ids.get(p), d.prompt_logprobs.as_deref())
                        {
                            echoed_logprobs(&model, ids, entries, lp);
                        }
                    }
                    let offset = text.len();
                    text.push_str(&d.text);
                    if let Some(f) = &d.finish {
                        completion_tokens += f.completion_tokens;
                        let prompt = prompt_of.get(&index).copied().unwrap_or(0);
                        cached_by_prompt.entry(prompt).or_insert(f.cached_tokens);
                        remaining -= 1;
                    }
                    if !text.is_empty() || d.finish.is_some() || !d.token_ids.is_empty() {
                        if let Some(lp) = lp.as_mut() {
                            append_logprobs(&model, &d.logprobs, offset, lp);
                        }
                        out.push(sse::event(&chunk_json(index, text, lp, d.finish.as_ref())));
                    }
                    if remaining == 0 {
                        if include_usage {
                            let cached = cached_by_prompt.values().sum();
                            out.push(sse::event(&usage_json(completion_tokens, cached)));
                        }
                        out.push(sse::done());
                    }
                }
            }
            futures::stream::iter(out.into_iter().map(Ok::<_, Infallible>))
        })
        .flatten();
    sse::response(body)
}
