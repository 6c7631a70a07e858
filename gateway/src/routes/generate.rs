//! What chat and completions share: collecting or streaming the output of the choices the
//! engine's front door started, and checking a structured-output constraint up front.

use engine::api::{Delta, Finish, FinishReason, PromptLogprob, StepLogprobs, StopReason};
use engine::handle::ModelHandle;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::http::request_memory::RequestMemory;
use crate::protocol::sampling::SamplingFields;

pub use engine::handle::Choice;

/// A finished choice.
pub struct Collected {
    pub index: usize,
    pub prompt_idx: usize,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<StepLogprobs>,
    pub prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
    pub finish: Finish,
}

pub async fn collect(mut c: Choice) -> ApiResult<Collected> {
    let mut text = String::new();
    let mut token_ids = Vec::new();
    let mut logprobs = Vec::new();
    let mut prompt_logprobs = None;
    while let Some(delta) = c.stream.next().await {
        let delta = delta?;
        if delta.prompt_logprobs.is_some() {
            prompt_logprobs = delta.prompt_logprobs;
        }
        text.push_str(&delta.text);
        token_ids.extend_from_slice(&delta.token_ids);
        logprobs.extend(delta.logprobs);
        if let Some(finish) = delta.finish {
            return Ok(Collected {
                index: c.index,
                prompt_idx: c.prompt_idx,
                text,
                token_ids,
                logprobs,
                prompt_logprobs,
                finish,
            });
        }
    }
    Err(ApiError::Internal(
        "the engine ended a sequence without finishing it".into(),
    ))
}

pub async fn collect_all(choices: Vec<Choice>) -> ApiResult<Vec<Collected>> {
    let mut done = futures::future::try_join_all(choices.into_iter().map(collect)).await?;
    done.sort_by_key(|c| c.index);
    Ok(done)
}

/// All choices' deltas, interleaved as they come: `(choice index, delta)`.
pub fn merged_stream(choices: Vec<Choice>) -> BoxStream<'static, (usize, ApiResult<Delta>)> {
    let per_choice = choices.into_iter().map(|c| {
        stream::unfold(Some(c), |state| async move {
            let mut c = state?;
            match c.stream.next().await {
                None => None,
                Some(Ok(delta)) => {
                    let finished = delta.finish.is_some();
                    let idx = c.index;
                    Some(((idx, Ok(delta)), if finished { None } else { Some(c) }))
                }
                Some(Err(e)) => Some(((c.index, Err(ApiError::from(e))), None)),
            }
        })
        .boxed()
    });
    stream::select_all(per_choice).boxed()
}

pub fn finish_reason(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// vLLM's `stop_reason`: null for EOS or length, the token id or the stop string otherwise.
pub fn stop_reason(f: &Finish) -> Option<Value> {
    match &f.stop_reason {
        None | Some(StopReason::Eos) => None,
        Some(StopReason::TokenId(id)) => Some(Value::from(*id)),
        Some(StopReason::String(s)) => Some(Value::from(s.clone())),
    }
}

/// `prompt_logprobs` for `model`, as vLLM's engine checks it (the request's range and stream
/// checks ran with the other fields): `-1` is the whole vocabulary, and more alternatives than
/// `--max-logprobs` is vLLM's 400. Only the CPU decoder computes every prompt row's logits.
/// A stream (which may only ask for 0) carries none, as vLLM's, so none are computed.
/// Holds what a generation request's `seqs` sequences (its prompts times its choices) will
/// hold, with `logprobs` alternatives a token where it asks for token or prompt logprobs, on
/// its account, before any of them starts.
pub fn hold_sequences(
    memory: &RequestMemory,
    model: &ModelHandle,
    seqs: usize,
    logprobs: Option<usize>,
) -> ApiResult<()> {
    let bytes = crate::memory::generation_bytes(model.card(), seqs, logprobs);
    let what = match logprobs {
        Some(k) => format!("{seqs} sequences with {k} logprobs a token"),
        None => format!("{seqs} sequences"),
    };
    memory.hold(bytes, &what)
}

pub fn resolve_prompt_logprobs(
    sampling: &SamplingFields,
    model: &ModelHandle,
    max_logprobs: usize,
) -> ApiResult<Option<usize>> {
    let Some(k) = sampling.prompt_logprobs() else {
        return Ok(None);
    };
    let k = if k == -1 {
        model.vocab_size()
    } else {
        k.max(0) as usize
    };
    if k > max_logprobs {
        return Err(ApiError::bad_request(
            format!("Requested prompt logprobs of {k}, which is greater than max allowed: {max_logprobs}"),
            Some("prompt_logprobs"),
        ));
    }
    if sampling.stream == Some(true) {
        return Ok(None);
    }
    let device = &model.card().device;
    if device != "cpu" {
        return Err(ApiError::bad_request(
            format!("`prompt_logprobs` is not supported for a model on {device}: the GPU decoder computes logits only for the rows it samples."),
            Some("prompt_logprobs"),
        ));
    }
    Ok(Some(k))
}

/// Prompt logprobs as vLLM writes them: per prompt token `null` (the first) or a map from
/// token id to `{logprob, rank, decoded_token}` holding the prompt token, then its top-k
/// alternatives (ranks 1..=k). A `-inf` logprob is written as -9999.0, as vLLM clamps it.
pub fn prompt_logprobs_json(model: &ModelHandle, entries: &[Option<PromptLogprob>]) -> Value {
    let entry = |id: u32, logprob: f32, rank: usize| {
        let logprob = if logprob == f32::NEG_INFINITY {
            -9999.0
        } else {
            logprob
        };
        serde_json::json!({
            "logprob": logprob,
            "rank": rank,
            "decoded_token": token_text(model, id),
        })
    };
    Value::Array(
        entries
            .iter()
            .map(|e| match e {
                None => Value::Null,
                Some(e) => {
                    let mut map = serde_json::Map::new();
                    map.insert(e.token_id.to_string(), entry(e.token_id, e.logprob, e.rank));
                    for (r, t) in e.top.iter().enumerate() {
                        map.entry(t.id.to_string())
                            .or_insert_with(|| entry(t.id, t.logprob, r + 1));
                    }
                    Value::Object(map)
                }
            })
            .collect(),
    )
}

/// The text a single token decodes to, for logprobs.
pub fn token_text(model: &ModelHandle, id: u32) -> String {
    model
        .decode(&[id], false)
        .ok()
        .or_else(|| model.token_str(id))
        .unwrap_or_default()
}

/// Compiles the request's structured-output constraint before any work is submitted, so a
/// schema or grammar the engine cannot take is a 400 naming the field that carried it. The
/// compile (and, on a model's first constrained request, building its token trie) is CPU work
/// and runs on the blocking pool.
pub async fn check_constraint(
    model: &ModelHandle,
    sampling: &crate::protocol::sampling::SamplingFields,
) -> ApiResult<()> {
    match crate::protocol::structured::constraint(sampling)? {
        Some((constraint, field)) => check_one(model, constraint, field).await,
        None => Ok(()),
    }
}

/// [`check_constraint`] for one constraint that `field` asked for.
pub async fn check_one(
    model: &ModelHandle,
    constraint: engine::api::Constraint,
    field: &'static str,
) -> ApiResult<()> {
    let model = model.clone();
    tokio::task::spawn_blocking(move || model.check_constraint(&constraint))
        .await
        .map_err(|e| ApiError::Internal(format!("the constraint check stopped: {e}")))?
        .map_err(|e| match e {
            engine::EngineError::InvalidRequest { message, .. } => {
                ApiError::bad_request(message, Some(field))
            }
            other => other.into(),
        })
}
