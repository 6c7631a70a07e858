//! What chat and completions share: fitting the token budget into the context, submitting
//! `n` sequences per prompt, collecting or streaming their output.

use engine::api::{
    Delta, Finish, FinishReason, GenerateRequest, PromptLogprob, SamplingParams, StepLogprobs,
    StopReason,
};
use engine::handle::{GenerationStream, ModelHandle};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::protocol::sampling::SamplingFields;

/// Apply `truncate_prompt_tokens` (keep the last k tokens; -1 = the model's length).
pub fn truncate_prompt(
    ids: &mut Vec<u32>,
    truncate: Option<i64>,
    max_model_len: usize,
) -> ApiResult<()> {
    let Some(t) = truncate else { return Ok(()) };
    let k = if t == -1 { max_model_len } else { t as usize };
    if k > max_model_len {
        return Err(ApiError::bad_request(
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
            Some("truncate_prompt_tokens"),
        ));
    }
    if ids.len() > k {
        ids.drain(..ids.len() - k);
    }
    Ok(())
}

/// Refuse a prompt of `bytes` bytes that cannot fit the context whatever its tokens, before
/// tokenising it (a megabytes-long prompt would otherwise be tokenised in full first). With
/// `truncate_prompt_tokens` the prompt is cut to fit, so nothing is refused here.
/// Text above this many bytes is tokenised with the async worker handed over to the blocking
/// work, so a large prompt does not stall the other connections that worker serves.
const INLINE_TOKENIZE_BYTES: usize = 16 * 1024;

/// Runs `work` (tokenising `bytes` of text) off the reactor when it is large: tokio moves this
/// worker's other tasks to another thread while it blocks. On a single-threaded runtime (some
/// tests) it runs inline.
pub fn off_reactor<T>(bytes: usize, work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if bytes > INLINE_TOKENIZE_BYTES && multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

pub fn refuse_oversized_text(
    model: &ModelHandle,
    bytes: usize,
    truncate: Option<i64>,
    param: &str,
) -> ApiResult<()> {
    let max_model_len = model.card().max_model_len;
    let at_least = model.min_tokens_for(bytes);
    if truncate.is_none() && at_least >= max_model_len {
        return Err(ApiError::bad_request(
            format!("This model's maximum context length is {max_model_len} tokens. However, your request has at least {at_least} input tokens ({bytes} bytes of text). Please reduce the length of the input messages."),
            Some(param),
        ));
    }
    Ok(())
}

/// The new-token budget: the request's, checked against the context; else what is left of it.
pub fn resolve_max_tokens(
    prompt_len: usize,
    requested: Option<i64>,
    max_model_len: usize,
    field: &str,
) -> ApiResult<usize> {
    if prompt_len >= max_model_len {
        return Err(ApiError::bad_request(
            format!("This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages."),
            Some("messages"),
        ));
    }
    let room = max_model_len - prompt_len;
    match requested {
        None => Ok(room),
        Some(m) if (m as usize) <= room => Ok(m as usize),
        Some(m) => Err(ApiError::bad_request(
            format!("'{field}' is too large: {m}. This model's maximum context length is {max_model_len} tokens and your request has {prompt_len} input tokens ({m} > {max_model_len} - {prompt_len})."),
            Some(field),
        )),
    }
}

/// Check completion prompt token ids against the vocabulary.
pub fn check_token_ids(ids: &[i64], vocab_size: usize, param: &str) -> ApiResult<Vec<u32>> {
    ids.iter()
        .map(|&id| {
            if id < 0 || id as u64 >= vocab_size as u64 {
                Err(ApiError::bad_request(
                    format!("Token id {id} is out of vocabulary"),
                    Some(param),
                ))
            } else {
                Ok(id as u32)
            }
        })
        .collect()
}

/// One choice's submitted sequence.
pub struct Choice {
    pub index: usize,
    pub prompt_idx: usize,
    pub stream: GenerationStream,
}

/// Submit `n` sequences for each prompt. Choice indices run prompt-major (`prompt * n + j`).
pub fn submit(
    model: &ModelHandle,
    request_id: &str,
    prompts: &[Vec<u32>],
    params: &[SamplingParams],
    n: usize,
    cache_salt: Option<&str>,
    media: Option<&std::sync::Arc<engine::api::PromptMedia>>,
) -> ApiResult<Vec<Choice>> {
    // More sequences than the engine can ever hold would never run: a 400, not a 503 to retry.
    let wanted = prompts.len().saturating_mul(n);
    if let Some(cap) = model.max_num_seqs().filter(|&cap| wanted > cap) {
        return Err(ApiError::bad_request(
            format!(
                "This request asks for {wanted} sequences at once ({} prompt(s) with n = {n}), but the server runs at most {cap} (--max-num-seqs).",
                prompts.len()
            ),
            Some(if prompts.len() > 1 { "prompt" } else { "n" }),
        ));
    }
    let mut out = Vec::with_capacity(wanted);
    for (p, (ids, base)) in prompts.iter().zip(params).enumerate() {
        for j in 0..n {
            let mut params = base.clone();
            // Distinct but reproducible samples per choice when seeded.
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            let stream = model.generate(GenerateRequest {
                request_id: format!("{request_id}-{}", p * n + j),
                prompt_ids: ids.clone(),
                params,
                cache_salt: cache_salt.map(str::to_string),
                media: media.cloned(),
            })?;
            out.push(Choice {
                index: p * n + j,
                prompt_idx: p,
                stream,
            });
        }
    }
    Ok(out)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget() {
        assert_eq!(resolve_max_tokens(10, None, 100, "max_tokens").unwrap(), 90);
        assert_eq!(
            resolve_max_tokens(10, Some(90), 100, "max_tokens").unwrap(),
            90
        );
        assert!(matches!(
            resolve_max_tokens(10, Some(91), 100, "max_tokens"),
            Err(ApiError::BadRequest { param: Some(p), .. }) if p == "max_tokens"
        ));
        assert!(resolve_max_tokens(100, None, 100, "max_tokens").is_err());
    }

    #[test]
    fn truncation_keeps_the_tail() {
        let mut ids = vec![1, 2, 3, 4, 5];
        truncate_prompt(&mut ids, Some(2), 10).unwrap();
        assert_eq!(ids, vec![4, 5]);
        assert!(truncate_prompt(&mut ids, Some(11), 10).is_err());
    }

    #[test]
    fn token_ids_checked() {
        assert_eq!(check_token_ids(&[0, 5], 10, "prompt").unwrap(), vec![0, 5]);
        assert!(check_token_ids(&[10], 10, "prompt").is_err());
        assert!(check_token_ids(&[-1], 10, "prompt").is_err());
    }
}
