//! `POST /v1/chat/completions`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use engine::api::{ChatTemplateOptions, StepLogprobs, Task};
use engine::handle::{ModelHandle, PromptOptions, PromptSource, SubmitOptions};
use futures::StreamExt;
use serde_json::Value;

use super::generate::{self, token_text};
use super::messages::{parse_messages, ParsedMessages};
use super::{require_task, resolve_model, RequestId};
use crate::error::{ApiError, ApiResult};
use crate::http::auth::PresentedKey;
use crate::http::extract::ValidJson;
use crate::http::request_memory::RequestMemory;
use crate::http::sse;
use crate::parsers::reasoning::{ReasoningParser, StreamSplit};
use crate::parsers::tools::{self, ToolMode, ToolStream};
use crate::policy::{run_policies, MediaCounts, PolicyRequest, RequestKwargs};
use crate::protocol::chat::*;
use crate::protocol::{now_secs, Usage};
use crate::state::AppState;

struct ChatPolicyInput {
    /// Boxed: the request moves through the policy layers and lives in the handler's future.
    req: Box<ChatRequest>,
    parsed: ParsedMessages,
}

impl PolicyRequest for ChatPolicyInput {
    fn mm_processor_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.req.mm_processor_kwargs)
    }
    fn media_io_kwargs(&self) -> Option<RequestKwargs<'_>> {
        RequestKwargs::raw(&self.req.media_io_kwargs)
    }
    fn media_counts(&self) -> MediaCounts {
        self.parsed.counts()
    }
}

/// Chat's own field checks (after the shared sampling ones). Returns the top-logprobs count.
pub fn validate_chat(req: &ChatRequest, state: &AppState) -> ApiResult<Option<usize>> {
    let max_tokens = req.max_completion_tokens.or(req.sampling.max_tokens);
    let field = if req.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    req.sampling.validate(max_tokens, field)?;
    for (name, value) in [
        ("documents", &req.documents),
        ("reasoning_effort", &req.reasoning_effort),
    ] {
        if let Some(value) = value.as_deref() {
            crate::protocol::fields::refuse(name, value, crate::protocol::fields::CHAT)?;
        }
    }
    let top = match req.top_logprobs.as_deref() {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`top_logprobs` must be an integer.",
                Some("top_logprobs"),
            ))
        }
    };
    if let Some(t) = top {
        if t < 0 || t as usize > state.max_logprobs {
            return Err(ApiError::bad_request(
                format!(
                    "`top_logprobs` must be between 0 and {} (--max-logprobs), got {t}.",
                    state.max_logprobs
                ),
                Some("top_logprobs"),
            ));
        }
        if req.logprobs != Some(true) {
            return Err(ApiError::bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                Some("top_logprobs"),
            ));
        }
    }
    check_template_options(
        state,
        req.chat_template.is_some(),
        req.add_generation_prompt,
        req.continue_final_message,
    )?;
    Ok(if req.logprobs == Some(true) {
        Some(top.unwrap_or(0) as usize)
    } else {
        None
    })
}

/// A per-request template needs `--trust-request-chat-template`; `add_generation_prompt`
/// (default true) and `continue_final_message` cannot both be true.
pub fn check_template_options(
    state: &AppState,
    has_template: bool,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> ApiResult<()> {
    if has_template && !state.trust_request_chat_template {
        return Err(ApiError::bad_request(
            "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.",
            Some("chat_template"),
        ));
    }
    if add_generation_prompt.unwrap_or(true) && continue_final_message.unwrap_or(false) {
        return Err(ApiError::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            Some("continue_final_message"),
        ));
    }
    Ok(())
}

/// Routes other than chat completions take text only: their media parts are refused here
/// (chat completions is the route that fetches, decodes and encodes media).
pub fn check_text_only(model: &ModelHandle, parsed: &ParsedMessages, route: &str) -> ApiResult<()> {
    check_modalities(model, parsed)?;
    match parsed.media.first() {
        None => Ok(()),
        Some(item) => Err(ApiError::bad_request(
            format!(
                "{route} takes text only; send {} input to /v1/chat/completions.",
                item.modality
            ),
            Some("messages"),
        )),
    }
}

/// Refuse media the model cannot take, naming the model and the modality.
pub fn check_modalities(model: &ModelHandle, parsed: &ParsedMessages) -> ApiResult<()> {
    for item in &parsed.media {
        if !model
            .card()
            .input_modalities
            .iter()
            .any(|m| m == item.modality.as_str())
        {
            return Err(ApiError::bad_request(
                format!(
                    "The model `{}` does not accept {} input (it accepts: {}).",
                    model.card().name,
                    item.modality,
                    model.card().input_modalities.join(", ")
                ),
                Some("messages"),
            ));
        }
    }
    Ok(())
}

/// How to render a chat prompt.
#[derive(Default)]
pub struct RenderOptions<'a> {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub chat_template: Option<&'a str>,
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
    pub tools: Option<&'a Value>,
}

/// The template settings of a request: the request's template kwargs win over the
/// deployment's.
pub fn template_options(state: &AppState, o: &RenderOptions<'_>) -> ChatTemplateOptions {
    let mut template_kwargs = state.default_chat_template_kwargs.clone();
    if let Some(k) = o.kwargs {
        for (key, v) in k {
            template_kwargs.insert(key.clone(), v.clone());
        }
    }
    ChatTemplateOptions {
        add_generation_prompt: o.add_generation_prompt,
        continue_final_message: o.continue_final_message,
        chat_template: o.chat_template.map(str::to_string),
        template_kwargs,
        tools: o.tools.cloned(),
    }
}

/// Render the chat prompt with the model's template (or a trusted per-request one), for the
/// routes that show or pool the rendered text.
pub fn render(
    state: &AppState,
    model: &ModelHandle,
    messages: &[Value],
    o: &RenderOptions<'_>,
) -> ApiResult<String> {
    Ok(model.render_chat(
        &Value::Array(messages.to_vec()),
        &template_options(state, o),
    )?)
}

pub async fn handler(
    State(state): State<Arc<AppState>>,
    RequestId(rid): RequestId,
    PresentedKey(key): PresentedKey,
    memory: RequestMemory,
    ValidJson(req): ValidJson<Box<ChatRequest>>,
) -> ApiResult<Response> {
    // (1) fields
    let logprobs = validate_chat(&req, &state)?;
    let parsed = parse_messages(&req.messages)?;
    // (2) model (chat checks the model before the gate)
    let model = resolve_model(&state, req.model.as_deref(), Task::Generate)?;
    require_task(&model, Task::Generate, "Chat Completions")?;
    // (3) policy layers
    let policed = run_policies(&state, ChatPolicyInput { req, parsed }, key).await?;
    let (merged, trusted) = (policed.merged, policed.trusted);
    let ChatPolicyInput { req, parsed } = policed.req;
    check_modalities(&model, &parsed)?;
    if !parsed.media.is_empty() && req.sampling.truncate_prompt_tokens.is_some() {
        return Err(ApiError::bad_request(
            "`truncate_prompt_tokens` cannot be combined with media parts (it would cut through them).",
            Some("truncate_prompt_tokens"),
        ));
    }
    let prompt_logprobs =
        generate::resolve_prompt_logprobs(&req.sampling, &model, state.max_logprobs)?;
    generate::hold_sequences(
        &memory,
        &model,
        req.sampling.n(),
        logprobs.max(prompt_logprobs),
    )?;
    // (4) render and tokenize (the engine's front door)
    let template_messages = if parsed.media.is_empty() {
        parsed.template_messages(&req.messages)
    } else {
        parsed.template_messages_with_media(&req.messages)
    };
    let prompt = model.prompt(
        PromptSource::Chat {
            messages: Value::Array(template_messages),
            template: Box::new(template_options(
                &state,
                &RenderOptions {
                    add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                    continue_final_message: req.continue_final_message.unwrap_or(false),
                    chat_template: req.chat_template.as_deref(),
                    kwargs: req.chat_template_kwargs.as_deref(),
                    tools: req.tools.as_deref(),
                },
            )),
        },
        PromptOptions {
            add_special_tokens: req.add_special_tokens.unwrap_or(false),
            truncate_prompt_tokens: req.sampling.truncate_prompt_tokens,
            field: "messages",
        },
    )?;
    // (5) media: fetched and decoded under the merged kwargs, refused from their headers past
    // what the text leaves of the context
    let media = if parsed.media.is_empty() {
        Vec::new()
    } else {
        fetch_media(
            &state,
            &model,
            &parsed,
            MediaRun {
                merged: &merged,
                trusted,
                available: model.media_budget(&prompt),
                memory: &memory,
            },
        )
        .await?
    };
    // (6) structured outputs, checked before any work starts
    let defaults = state.generation_defaults(model.base_name());
    let mut params = req.sampling.to_params(logprobs, defaults)?;
    params.prompt_logprobs = prompt_logprobs;
    generate::check_constraint(&model, &req.sampling).await?;
    let tool_mode = tools::mode(
        req.tool_choice.as_deref(),
        req.tools.as_deref(),
        state.tool_parser,
    )?;
    if let Some(c) = tools::constraint(&tool_mode, req.tools.as_deref()) {
        if params.constraint.is_some() {
            return Err(ApiError::bad_request(
                "A required or named tool_choice cannot be combined with another structured-output constraint.",
                Some("tool_choice"),
            ));
        }
        generate::check_one(&model, c.clone(), "tool_choice").await?;
        params.constraint = Some(c);
    }
    // (7) model work: placeholders expanded, encoders run, choices started
    if let Some(log) = &state.log_requests {
        log.log(&rid, "chat", &model, prompt.ids(), &params);
    }
    let started = model
        .submit(
            vec![prompt],
            media,
            SubmitOptions {
                request_id: rid.to_string(),
                params,
                max_tokens: req.max_completion_tokens.or(req.sampling.max_tokens),
                max_tokens_field: if req.max_completion_tokens.is_some() {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                },
                default_max_tokens: defaults.max_tokens,
                max_tokens_cap: defaults.max_tokens_cap,
                n: req.sampling.n(),
                cache_salt: req.sampling.cache_salt.clone(),
            },
        )
        .await?;
    let prompt_len = started.prompt_tokens.iter().sum();
    let choices = started.choices;

    let id = format!("chatcmpl-{rid}");
    // `include_reasoning: false` drops the reasoning the parser splits off.
    let include_reasoning = req.include_reasoning.as_deref() != Some(&Value::Bool(false));
    let echo = if req.echo == Some(true) {
        echoed_text(&parsed, &req.messages)
    } else {
        String::new()
    };
    let served = model.card().name.clone();
    if req.sampling.stream == Some(true) {
        return Ok(stream_response(
            model,
            StreamHead {
                id,
                served,
                echo,
                tools: tool_mode,
                call_ids: rid.to_string(),
                reasoning: state.reasoning_parser,
                include_reasoning,
                role: state.response_role.clone(),
                prompt_tokens_details: state.prompt_tokens_details,
            },
            choices,
            prompt_len,
            req.sampling.include_usage(),
            logprobs.is_some(),
        ));
    }
    let done = generate::collect_all(choices).await?;
    let completion_tokens: usize = done.iter().map(|c| c.finish.completion_tokens).sum();
    let cached = done.first().map(|c| c.finish.cached_tokens).unwrap_or(0);
    let prompt_logprobs = done
        .first()
        .and_then(|c| c.prompt_logprobs.as_deref())
        .map(|e| generate::prompt_logprobs_json(&model, e));
    let choices = done
        .into_iter()
        .map(|c| {
            let text = format!("{echo}{}", c.text);
            let (reasoning_content, text) = match state.reasoning_parser {
                Some(parser) => parser.split(&text),
                None => (None, Some(text)),
            };
            let reasoning_content = reasoning_content.filter(|_| include_reasoning);
            let (content, tool_calls) = tools::extract(
                &tool_mode,
                text.as_deref().unwrap_or_default(),
                &format!("{rid}-{}", c.index),
            );
            ChatChoice {
                index: c.index,
                logprobs: logprobs.map(|_| chat_logprobs(&model, &c.logprobs)),
                finish_reason: Some(tools::finish_reason(
                    &tool_mode,
                    &tool_calls,
                    generate::finish_reason(&c.finish),
                )),
                stop_reason: generate::stop_reason(&c.finish),
                message: ChatMessageOut {
                    role: state.response_role.clone(),
                    reasoning_content,
                    content,
                    tool_calls,
                },
            }
        })
        .collect();
    let usage =
        Usage::new(prompt_len, completion_tokens).with_cached(cached, state.prompt_tokens_details);
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created: now_secs(),
        model: served,
        choices,
        usage,
        prompt_logprobs,
    })
    .into_response())
}

/// How a request's media are processed: under the gate's merged kwargs and decision, within
/// the prompt tokens the text leaves, held on the request's account.
struct MediaRun<'a> {
    merged: &'a policies::MergedKwargs,
    trusted: bool,
    available: usize,
    memory: &'a RequestMemory,
}

/// Fetches and decodes the request's media with the model's processors, refusing items whose
/// headers show more tokens than `available`. The tensors move from the decoded-media budget
/// to the request's account, which holds them until the response has been sent.
async fn fetch_media(
    state: &AppState,
    model: &ModelHandle,
    parsed: &ParsedMessages,
    run: MediaRun<'_>,
) -> ApiResult<Vec<Arc<media::ProcessedMedia>>> {
    use preprocess::cache::Weigh;
    use preprocess::pipeline::MediaRequestItem;
    let (Some(pipeline), Some(spec)) = (&state.media, model.media_spec()) else {
        return Err(ApiError::bad_request(
            format!("The model `{}` accepts text input only.", model.card().name),
            Some("messages"),
        ));
    };
    let items: Vec<MediaRequestItem> = parsed
        .media
        .iter()
        .map(|m| MediaRequestItem {
            modality: m.modality,
            url: m.url.clone(),
            uuid: m.uuid.clone(),
        })
        .collect();
    let budget = preprocess::budget::TokenBudget {
        available: run.available,
    };
    let processed = pipeline
        .process(
            &items,
            run.merged.media_options(),
            run.trusted,
            spec,
            budget,
        )
        .await?;
    let tensors = processed.iter().map(|m| m.weight_bytes() as u64).sum();
    run.memory.hold(tensors, "its media tensors")?;
    Ok(processed.media)
}

pub fn chat_logprobs(model: &ModelHandle, steps: &[StepLogprobs]) -> ChatLogprobs {
    ChatLogprobs {
        content: steps
            .iter()
            .map(|s| {
                let token = token_text(model, s.token_id);
                ChatTokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: s.logprob,
                    top_logprobs: s
                        .top
                        .iter()
                        .map(|t| {
                            let token = token_text(model, t.id);
                            ChatTopLogprob {
                                bytes: token.as_bytes().to_vec(),
                                token,
                                logprob: t.logprob,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// `echo`: the reply is prefixed with the last message when that message is the assistant's
/// (a continued reply), as vLLM does; otherwise nothing is echoed.
fn echoed_text(parsed: &ParsedMessages, messages: &[crate::protocol::chat::ChatMessage]) -> String {
    parsed
        .template_messages(messages)
        .last()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .and_then(|m| m.get("content").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// What every chunk of a streamed reply repeats, and the echoed text its first chunk carries.
struct StreamHead {
    id: String,
    served: String,
    echo: String,
    /// When calls may be made, each choice's content goes out until a call may start; the
    /// rest is held and sent, as calls or content, with the finish.
    tools: ToolMode,
    call_ids: String,
    reasoning: Option<ReasoningParser>,
    include_reasoning: bool,
    /// `--response-role`.
    role: String,
    /// `--enable-prompt-tokens-details`.
    prompt_tokens_details: bool,
}

fn stream_response(
    model: ModelHandle,
    head: StreamHead,
    choices: Vec<generate::Choice>,
    prompt_len: usize,
    include_usage: bool,
    want_logprobs: bool,
) -> Response {
    let StreamHead {
        id,
        served,
        echo,
        tools: tool_mode,
        call_ids,
        reasoning,
        include_reasoning,
        role,
        prompt_tokens_details,
    } = head;
    let mut splits: Vec<StreamSplit> = match reasoning {
        Some(parser) => (0..choices.len())
            .map(|_| StreamSplit::new(parser))
            .collect(),
        None => Vec::new(),
    };
    // With a reasoning split the echo goes through it, ahead of the choice's first delta.
    let mut echo_due = vec![!splits.is_empty(); choices.len()];
    let created = now_secs();
    let n = choices.len();
    let mut tool_streams: Vec<ToolStream> = if tool_mode == ToolMode::Off {
        Vec::new()
    } else {
        (0..n).map(|_| ToolStream::new(tool_mode.clone())).collect()
    };
    let first: Vec<Bytes> = (0..n)
        .map(|index| {
            let chunk = ChatChunk {
                id: &id,
                object: "chat.completion.chunk",
                created,
                model: &served,
                choices: vec![ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some(role.clone()),
                        reasoning_content: None,
                        content: Some(if !splits.is_empty() {
                            String::new()
                        } else if let Some(ts) = tool_streams.get_mut(index) {
                            ts.push(&echo)
                        } else {
                            echo.clone()
                        }),
                        tool_calls: None,
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                usage: None,
            };
            sse::event(&serde_json::to_string(&chunk).unwrap_or_default())
        })
        .collect();
    let mut completion_tokens = 0usize;
    // The choices share one prompt, and so its cached prefix.
    let mut cached = 0usize;
    let mut remaining = n;
    let mut failed = false;
    let merged = generate::merged_stream(choices);
    let body = futures::stream::iter(first.into_iter().map(Ok::<_, Infallible>)).chain(
        merged
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
                        let finish = d.finish.as_ref();
                        if let Some(f) = finish {
                            completion_tokens += f.completion_tokens;
                            cached = cached.max(f.cached_tokens);
                            remaining -= 1;
                        }
                        let mut tool_calls = None;
                        let mut text = d.text.clone();
                        let mut reasoning_text = String::new();
                        let mut finish_reason = finish.map(generate::finish_reason);
                        if let Some(split) = splits.get_mut(index) {
                            let first = if std::mem::take(&mut echo_due[index]) {
                                echo.as_str()
                            } else {
                                ""
                            };
                            let (mut r, mut c) = split.push(&format!("{first}{}", d.text));
                            if finish.is_some() {
                                let (r2, c2) = split.finish();
                                r += &r2;
                                c += &c2;
                            }
                            if include_reasoning {
                                reasoning_text = r;
                            }
                            text = c;
                        }
                        if let Some(ts) = tool_streams.get_mut(index) {
                            let mut out = ts.push(&text);
                            if let Some(f) = finish_reason {
                                let (rest, calls) = ts.finish(&format!("{call_ids}-{index}"));
                                out += &rest;
                                finish_reason = Some(tools::finish_reason(&tool_mode, &calls, f));
                                tool_calls = (!calls.is_empty()).then(|| tools::deltas(&calls));
                            }
                            text = out;
                        }
                        if !text.is_empty()
                            || !reasoning_text.is_empty()
                            || finish.is_some()
                            || (!d.token_ids.is_empty()
                                && tool_streams.is_empty()
                                && splits.is_empty())
                        {
                            let chunk = ChatChunk {
                                id: &id,
                                object: "chat.completion.chunk",
                                created,
                                model: &served,
                                choices: vec![ChatChunkChoice {
                                    index,
                                    delta: ChatDelta {
                                        role: None,
                                        reasoning_content: (!reasoning_text.is_empty())
                                            .then_some(reasoning_text),
                                        content: if text.is_empty()
                                            && (finish.is_some() || splits.get(index).is_some())
                                        {
                                            None
                                        } else {
                                            Some(text)
                                        },
                                        tool_calls,
                                    },
                                    logprobs: want_logprobs
                                        .then(|| chat_logprobs(&model, &d.logprobs)),
                                    finish_reason,
                                    stop_reason: finish.and_then(generate::stop_reason),
                                }],
                                usage: None,
                            };
                            out.push(sse::event(
                                &serde_json::to_string(&chunk).unwrap_or_default(),
                            ));
                        }
                        if remaining == 0 {
                            if include_usage {
                                let chunk = ChatChunk {
                                    id: &id,
                                    object: "chat.completion.chunk",
                                    created,
                                    model: &served,
                                    choices: Vec::new(),
                                    usage: Some(
                                        Usage::new(prompt_len, completion_tokens)
                                            .with_cached(cached, prompt_tokens_details),
                                    ),
                                };
                                out.push(sse::event(
                                    &serde_json::to_string(&chunk).unwrap_or_default(),
                                ));
                            }
                            out.push(sse::done());
                        }
                    }
                }
                futures::stream::iter(out.into_iter().map(Ok::<_, Infallible>))
            })
            .flatten(),
    );
    sse::response(body)
}
