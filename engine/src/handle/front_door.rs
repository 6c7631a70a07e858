//! The front door for generation. A request's prompt comes in as chat messages, text or token
//! ids and leaves as one stream per choice; the template, tokenisation, every check against the
//! context, placeholder expansion and the media encoders happen behind these two calls, so the
//! gateway never handles token ids or engine-internal media types.
//!
//! Two calls, not one, because fetching and decoding media is the gateway's (under its trust
//! policy) and must be bounded by what the text leaves of the context: [`ModelHandle::prompt`]
//! turns the prompt into tokens and says that budget; [`ModelHandle::submit`] takes the prompts
//! and the decoded media and starts the choices.

use std::sync::Arc;

use serde_json::Value;

use super::{GenerationStream, ModelHandle};
use crate::api::{ChatTemplateOptions, GenerateRequest, SamplingParams};
use crate::error::{EngineError, Result};

/// Text above this many bytes is tokenised with the async worker handed over to blocking work,
/// so a large prompt does not stall the other connections that worker serves.
const INLINE_TOKENIZE_BYTES: usize = 16 * 1024;

/// What the client sent as the prompt.
pub enum PromptSource {
    /// Chat messages (already in the template's shape), rendered with the model's template or a
    /// per-request one.
    Chat {
        messages: Value,
        template: Box<ChatTemplateOptions>,
    },
    Text(String),
    /// Token ids as the client sent them: checked against the vocabulary here.
    Ids(Vec<i64>),
}

/// How to turn a [`PromptSource`] into tokens.
#[derive(Debug, Clone, Copy)]
pub struct PromptOptions {
    pub add_special_tokens: bool,
    /// vLLM's `truncate_prompt_tokens`: keep the last k tokens (-1: the model's length).
    pub truncate_prompt_tokens: Option<i64>,
    /// The request field that carried the prompt, named in errors (`messages`, `prompt`).
    pub field: &'static str,
}

/// A prompt in tokens, before its media: what [`ModelHandle::submit`] takes.
#[derive(Debug, Clone)]
pub struct Prompt {
    ids: Vec<u32>,
}

impl Prompt {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// What every choice of a request shares.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub request_id: String,
    /// The sampling parameters; `max_tokens` is set here, per prompt, from `max_tokens`.
    pub params: SamplingParams,
    /// The client's new-token limit; `None`: whatever the context leaves.
    pub max_tokens: Option<i64>,
    /// The field that carried `max_tokens` (`max_tokens`, `max_completion_tokens`).
    pub max_tokens_field: &'static str,
    /// The deployment's new-token limit for a request without one (vLLM's `max_new_tokens`
    /// of the generation config), fitted to the context like the rest.
    pub default_max_tokens: Option<u64>,
    /// The deployment's cap on every request's new tokens.
    pub max_tokens_cap: Option<u64>,
    /// Choices per prompt.
    pub n: usize,
    /// Isolates prefix-cache reuse between tenants.
    pub cache_salt: Option<String>,
}

/// One submitted choice.
pub struct Choice {
    /// Prompt-major: `prompt * n + j`.
    pub index: usize,
    pub prompt_idx: usize,
    pub stream: GenerationStream,
}

/// A started request: its prompts' final lengths (media placeholders included) and its choices.
pub struct Started {
    pub prompt_tokens: Vec<usize>,
    pub choices: Vec<Choice>,
}

impl ModelHandle {
    /// Renders (chat), checks and tokenises a prompt, and applies `truncate_prompt_tokens`. A
    /// text whose byte length alone proves it cannot fit the context is refused before it is
    /// tokenised. Large texts are tokenised with the async worker handed to blocking work.
    pub fn prompt(&self, source: PromptSource, opts: PromptOptions) -> Result<Prompt> {
        let max_len = self.card().max_model_len;
        let truncate_to = match opts.truncate_prompt_tokens {
            None => None,
            Some(-1) => Some(max_len),
            Some(t) if t < 0 || t as u64 > max_len as u64 => {
                return Err(EngineError::invalid(
                    "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
                    Some("truncate_prompt_tokens"),
                ))
            }
            Some(t) => Some(t as usize),
        };
        let mut ids = match source {
            PromptSource::Ids(ids) => self.token_ids(&ids, opts.field)?,
            PromptSource::Text(text) if text.is_empty() => Vec::new(),
            PromptSource::Text(text) => self.tokenize(&text, opts, truncate_to.is_some())?,
            PromptSource::Chat { messages, template } => {
                let text = self.render_chat(&messages, &template)?;
                self.tokenize(&text, opts, truncate_to.is_some())?
            }
        };
        if ids.is_empty() {
            return Err(EngineError::invalid(
                "The prompt cannot be empty.",
                Some(opts.field),
            ));
        }
        if let Some(k) = truncate_to.filter(|&k| ids.len() > k) {
            ids.drain(..ids.len() - k);
        }
        Ok(Prompt { ids })
    }

    /// How many tokens the prompt's media may add: what the text leaves of the context. The
    /// gateway refuses media past it from their headers, before decoding them.
    pub fn media_budget(&self, prompt: &Prompt) -> usize {
        self.card().max_model_len.saturating_sub(prompt.len())
    }

    /// Starts `n` choices for each prompt. With media (one prompt only), the placeholders are
    /// expanded and the encoders run on the model's media worker first. Refused before any
    /// work: more sequences than the engine can ever hold (never a 503 a retry cannot cure), a
    /// prompt that leaves no room in the context, a `max_tokens` past what it leaves.
    pub async fn submit(
        &self,
        prompts: Vec<Prompt>,
        media: Vec<Arc<::media::ProcessedMedia>>,
        opts: SubmitOptions,
    ) -> Result<Started> {
        let n = opts.n.max(1);
        let wanted = prompts.len().saturating_mul(n);
        if let Some(cap) = self.max_num_seqs().filter(|&cap| wanted > cap) {
            return Err(EngineError::invalid(
                format!(
                    "This request asks for {wanted} sequences at once ({} prompt(s) with n = {n}), but the server runs at most {cap} (--max-num-seqs).",
                    prompts.len()
                ),
                Some(if prompts.len() > 1 { "prompt" } else { "n" }),
            ));
        }
        let (prompts, media) = match (media.is_empty(), <[Prompt; 1]>::try_from(prompts)) {
            (true, Ok([p])) => (vec![p.ids], None),
            (true, Err(prompts)) => (prompts.into_iter().map(|p| p.ids).collect(), None),
            (false, Ok([p])) => {
                let (ids, media) = self.prepare_media(p.ids, media).await?;
                (vec![ids], Some(media))
            }
            (false, Err(_)) => {
                return Err(EngineError::Internal(
                    "media were submitted with more than one prompt".into(),
                ))
            }
        };
        // Every prompt is checked before the first choice starts, so a refusal leaves nothing
        // running.
        let mut budgets = Vec::with_capacity(prompts.len());
        for ids in &prompts {
            budgets.push(self.fit_max_tokens(ids.len(), &opts)?);
        }
        let mut choices = Vec::with_capacity(wanted);
        let mut reserved = self.reserve(wanted)?;
        let mut prompt_tokens = Vec::with_capacity(prompts.len());
        for (p, (ids, max_tokens)) in prompts.into_iter().zip(budgets).enumerate() {
            prompt_tokens.push(ids.len());
            for j in 0..n {
                let mut params = opts.params.clone();
                params.max_tokens = max_tokens;
                // Distinct but reproducible samples per choice when seeded.
                params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
                let stream = self.generate_in(
                    GenerateRequest {
                        request_id: format!("{}-{}", opts.request_id, p * n + j),
                        prompt_ids: ids.clone(),
                        params,
                        cache_salt: opts.cache_salt.clone(),
                        media: media.clone(),
                    },
                    Some(&mut reserved),
                )?;
                choices.push(Choice {
                    index: p * n + j,
                    prompt_idx: p,
                    stream,
                });
            }
        }
        Ok(Started {
            prompt_tokens,
            choices,
        })
    }

    fn tokenize(&self, text: &str, opts: PromptOptions, truncating: bool) -> Result<Vec<u32>> {
        let max_len = self.card().max_model_len;
        let at_least = self.min_tokens_for(text.len());
        // With truncation the prompt is cut to fit, so its length alone refuses nothing.
        if !truncating && at_least >= max_len {
            return Err(EngineError::invalid(
                format!("This model's maximum context length is {max_len} tokens. However, your request has at least {at_least} input tokens ({} bytes of text). Please reduce the length of the input messages.", text.len()),
                Some(opts.field),
            ));
        }
        off_reactor(text.len(), || self.encode(text, opts.add_special_tokens))
    }

    /// Client-sent token ids, checked against the vocabulary; `field` is named in the error.
    pub fn token_ids(&self, ids: &[i64], field: &str) -> Result<Vec<u32>> {
        let vocab = self.vocab_size() as u64;
        ids.iter()
            .map(|&id| match u32::try_from(id) {
                Ok(id) if (id as u64) < vocab => Ok(id),
                _ => Err(EngineError::invalid(
                    format!("Token id {id} is out of vocabulary"),
                    Some(field),
                )),
            })
            .collect()
    }

    /// The new-token budget of a prompt of `prompt_len` tokens: the request's, checked against
    /// the context, else the deployment's default, else what the context leaves; then at most
    /// the deployment's cap (vLLM's `get_max_tokens`: the least of them).
    /// A prompt that fills the context is vLLM's 400 naming `messages` on every route.
    fn fit_max_tokens(&self, prompt_len: usize, opts: &SubmitOptions) -> Result<usize> {
        let max_len = self.card().max_model_len;
        if prompt_len >= max_len {
            return Err(EngineError::invalid(
                format!("This model's maximum context length is {max_len} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages."),
                Some("messages"),
            ));
        }
        let room = max_len - prompt_len;
        let cap = |n: u64| {
            let n = opts.max_tokens_cap.map_or(n, |cap| n.min(cap));
            usize::try_from(n).unwrap_or(usize::MAX)
        };
        match opts.max_tokens {
            None => Ok(cap(opts.default_max_tokens.map_or(room as u64, |d| d.min(room as u64)))),
            Some(m) if m >= 0 && (m as u64) <= room as u64 => Ok(cap(m as u64)),
            Some(m) => Err(EngineError::invalid(
                format!("'{}' is too large: {m}. This model's maximum context length is {max_len} tokens and your request has {prompt_len} input tokens ({m} > {max_len} - {prompt_len}).", opts.max_tokens_field),
                Some(opts.max_tokens_field),
            )),
        }
    }
}

/// Runs `work` (tokenising `bytes` of text) off the reactor when it is large: tokio moves this
/// worker's other tasks to another thread while it blocks. Outside a multi-threaded runtime
/// (some tests, blocking callers) it runs inline.
pub fn off_reactor<T>(bytes: usize, work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if bytes > INLINE_TOKENIZE_BYTES && multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}
